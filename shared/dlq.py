"""Bounded redelivery and the dead-letter drain (the FM-3 fix).

The topology is plain RabbitMQ, declared where the reader sees it (``fm3``):

- the task queue is a quorum queue with ``x-delivery-limit``: when a message has
  been returned to the queue more often than the limit (a worker died holding
  it), RabbitMQ dead-letters it instead of delivering it again;
- ``x-dead-letter-exchange`` and ``x-dead-letter-routing-key`` route it to a
  dead-letter queue that no worker consumes as a task queue. That queue must
  exist before any message dies: RabbitMQ drops a dead letter whose exchange does
  not exist or routes it nowhere. ``DeadLetteringQueue`` is a kombu ``Queue`` that
  declares its ``dead_letters`` queue whenever it is declared itself (by the
  worker at start, by a publisher, by the lab's reset), so the two cannot part.

How many deliveries: RabbitMQ 3.x counts every return of the message to the
queue (Celery returns a lost worker's message with ``basic.reject(requeue=True)``:
``Request.on_failure`` with ``task_reject_on_worker_lost``, Celery 5.5.3 to 5.7.0);
with ``x-delivery-limit = L`` the message is delivered ``L + 1`` times, then
dead-lettered (G3 measures it on the broker you run: 3 deliveries for L = 2).
RabbitMQ 4.0 changes the default: every quorum queue gets a delivery limit of 20
when none is set; ``x-delivery-limit: -1`` at declaration removes it, and so does a
``delivery-limit`` policy of -1 (from 4.1 a policy change applies to queues that
already exist). So on 4.x a queue without this fix still dead-letters (or drops,
without a dead-letter exchange) a poison message after 20 deliveries. Later 4.x
releases also changed which returns count (4.3 counts only failed returns:
``basic.reject``, which kombu sends, still counts; ``basic.nack`` and consumer
timeouts do not), so measure the bound again when you upgrade. (Stated from
RabbitMQ's documentation; the lab runs 3.x only.)

What RabbitMQ 3.x hands the DLQ: the message with its Celery headers, plus
``x-death`` (newest death first), ``x-first-death-queue`` and
``x-first-death-reason``; it does not carry ``x-delivery-count`` over, so the
envelope states the source queue's bound (its ``x-delivery-limit`` + 1, read
from the app's ``task_queues``). The drain reads the newest ``x-death`` entry:
the *first* death of a retry that waited in a delay queue
(``shared.retry.DelayQueues``) is its expiry there, not its delivery limit.

The drain (``drain``): a beat task reads the DLQ with ``basic_get``, at most
``DRAIN_BATCH`` letters a pass, and finds, for each message, the chord member it
stands for:

- the message itself, when it is a chord member (its ``chord`` is set);
- else the last task of its ``chain``: a header chain ``fetch | parse`` makes
  ``parse`` the member, and a poison ``fetch`` (the chain's *head*) dies before
  ``parse`` is ever sent. The head's message carries the rest of its chain, last
  task first, each with its options; the last one holds the member's ``task_id``,
  ``group_id``, ``group_index`` and ``chord``.

It writes a SUCCESS-state ``Result`` (reason ``dead_lettered``) for the member
through ``backend.mark_as_done`` with a request rebuilt from those fields;
``celery.backends.base.Backend.mark_as_done`` then calls the backend's
``on_chord_part_return`` (the Redis backend reads the request's ``id``,
``group``, ``group_index`` and ``chord``; Celery 5.5 to 5.7), the member counts,
and the chord body fires. A dead head gets the same envelope as its own result. Then the message
is acked and the ``dead_lettered`` signal sent (``sender`` the app, ``letter`` a
``DeadLetter``): attach an alert or a metric there.

A dead letter finalised twice (the drain's ack lost, the message drained
again) counts once. Celery 5.7's join records a result per task id and group
index and ignores a second one (``CHORD_PART_RETURN_LUA`` of
``RedisBackend.on_chord_part_return``). Celery 5.5 and 5.6 add each encoded
result to a sorted set (``result_chord_ordered``, the default): a second
result counts once only when it is byte for byte the first, and a different one
counts as another member (``tests/test_celery_claims.py``, C11). The drain's
envelope for one dead letter is the same each time (the bound, the starts count,
no clock), so it holds there too; keep it so.

A task message that leads to no chord member (the chord body itself, a plain
task) gets the same envelope as its own result (``role == "task"``): the chord's
``AsyncResult``, which is its body's, is then ready and says the body was
dead-lettered and why. Attach what else a dead body must undo to
``dead_lettered`` (FM-4 releases its claim there, ``shared.claim``).

Nothing is acked unless it was finalised or parked. A message the drain cannot
place (not a Celery task message, no task id, not JSON, or one whose finalising
raised) is moved to the parking queue ``<dlq>.parked`` (``parked_queue``; published
there first, then acked, so a crash between leaves a copy in each, never none),
logged and announced on ``dead_letter_parked``: it never goes back to the head
of the DLQ, where the next pass would read it first, and a pass's worth of them
would keep every newer letter waiting for ever. Only a backend that does not
answer (``BackendUnavailable``: a Redis connection or timeout error) stops a pass:
that letter and those behind it stay in the DLQ for the next pass, announced
once per process on ``dead_letter_kept`` (the process remembers the last ``TOLD_LIMIT``
letters it announced: one kept longer than that many others is announced again).

The drain as fm3 first had it is still here, for ``--prove``:
``chains=False`` finalises chord members only (a poison chain head waits in the
DLQ and its chord never completes); ``bodies=False`` keeps a task message that
leads to no member (a poison chord body: its chord PENDING, in silence);
``park=False`` puts what it cannot place back in the DLQ (``basic.reject`` with
requeue, after the batch), so that ``batch`` of them block every letter behind.

Deliveries are not attempts. The broker counts deliveries: a worker that dies
(or loses its connection) returns every message it held, prefetched or waiting
for its ETA, run or not. ``count_starts(app)`` counts, per task id, the bodies
that really started (``task_prerun``, in the result backend's Redis), and the
envelope of a dead letter says both: ``attempts`` (starts) and ``deliveries``.
A document dead-lettered with fewer starts than deliveries was innocent.
Choose ``x-delivery-limit`` above the number of whole-worker losses one message
may live through while prefetched, and keep the prefetch small
(``worker_prefetch_multiplier``): every prefetched message pays one delivery per
lost worker.

Deliveries are not attempts, and a body that ended is no crash (FM-7). A poison
message kills the process that runs it: no ``task_postrun`` follows its start. A
body that ended (``task_postrun`` fired, whatever the state) and whose message came
back all the same was not the message's fault: a worker's shutdown cut it (the cold
shutdown cancels what runs: ``celery.worker.consumer.consumer.Consumer.cancel_all_unacked_requests``
in Celery 5.5.3, ``Consumer.cancel_active_requests`` in 5.6.3 and 5.7.0, each through
``Request.cancel``, which sends the pool process billiard's ``TERM_SIGNAME``: SIGTERM, or the
signal ``REMAP_SIGTERM`` names, SIGQUIT in the lab's workers; ``SystemExit`` in the body,
``task_postrun`` with ``state=None``; ``Request._announce_cancelled`` also stores RETRY and
calls ``Task.on_retry``, on 5.5.3 always, on 5.6.3 and 5.7.0 unless called with
``emit_retry=False``; the functions read, the RETRY not proven by a run), or it finished and its ack was never
sent (the main process sleeps through the soft wait, then is killed). ``count_starts``
counts those ends as well (``ends``). With ``send_back=True`` (FM-7) the drain tells an
innocent letter from a poison one: a letter dead-lettered at its delivery limit
whose crashes (starts less ends) are below its queue's bound did not use up its
attempts; deploys and returns of prefetched messages did. It is published again to
the queue it died in (a new message, so the broker counts its deliveries afresh; same
task id, headers and body, the ``x-death`` headers dropped and ``x-rcl-sent-back``
counting the sends), then acked, and announced on ``dead_letter_sent_back``. At most
``SEND_BACK_LIMIT`` times per message: past that it is finalised as dead-lettered
like any other, its error saying how often it was sent back. The counters are per
task id and carry over a send-back, so a message cut twice and then killed by its
own fault once is sent back, and is dead-lettered for good once its crashes reach
the bound. A drain that dies between the publish and the ack leaves a copy in each
queue (the next pass sends the DLQ's copy back too: the document then runs twice,
one copy after the other, as any redelivery may).

Celery 5.5 to 5.7: a quorum queue in ``task_queues`` makes the worker include the
``DelayedDelivery`` bootstep (``celery.worker.consumer.delayed_delivery``, see
its ``include_if``), which declares broker-wide ``celery_delayed_*`` exchanges
and queues and binds every app queue to them. The lab never touches names
outside its namespace, so its apps run without that step (``lab.app``).

One piece: the topology (quorum queue, delivery limit, dead-letter exchange) and the drain that empties it are
one primitive a production codebase takes whole; the drain's decisions read the topology's names.
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from celery import Celery
from celery.app.task import Context
from celery.signals import task_postrun, task_prerun
from celery.utils.dispatch import Signal
import redis
from kombu import Producer, Queue
from kombu.exceptions import OperationalError
from kombu.message import Message

from shared.backend import backend_redis
from shared.envelope import Result

log = logging.getLogger(__name__)

dead_lettered = Signal(name="dead_lettered", providing_args=["letter"])
"""Sent by ``drain`` for each chord member it finalised (``sender=app, letter=DeadLetter``)."""
dead_letter_kept = Signal(name="dead_letter_kept", providing_args=["headers", "args", "why"])
"""Sent by ``drain``, once per process, for a message it put back in the DLQ (``sender=app``): the
backend did not answer (with ``park=True``), or a letter it cannot place (``park=False``)."""
dead_letter_parked = Signal(name="dead_letter_parked", providing_args=["headers", "args", "why"])
"""Sent by ``drain`` for each message it moved to the parking queue (``sender=app``)."""
dead_letter_sent_back = Signal(name="dead_letter_sent_back", providing_args=["headers", "args", "why"])
"""Sent by ``drain(send_back=True)`` for each innocent letter it published again to its queue (``sender=app``)."""

Role = Literal["member", "head", "task"]

STARTS_TTL_SECONDS = 7 * 86_400
"""How long ``count_starts`` remembers a task id's starts and ends after the last start, end or read by the
drain. ``drain(send_back=True)`` reads them for each letter dead-lettered at its delivery limit
(``send_back_rejected=True``: for each one rejected) and renews the time. The limit: a letter that waits in the DLQ longer than this with no such read
reads 0 starts and 0 ends, so it is sent back as innocent, up to ``SEND_BACK_LIMIT`` times; run the drain
more often than this."""
_starts_ttl: dict[int, int] = {}
"""Per app (``id``), the TTL ``count_starts`` was given."""


class DeadLetteringQueue(Queue):
    """A task queue that declares its dead-letter queue (``dead_letters``) with itself."""

    attrs = (*Queue.attrs, ("dead_letters", None))

    def __init__(self, *args: Any, dead_letters: Queue | None = None, **kwargs: Any) -> None:
        self.dead_letters = dead_letters
        super().__init__(*args, **kwargs)

    def declare(self, nowait: bool = False, channel: Any = None) -> str | None:
        if self.dead_letters is not None and not getattr(self, "no_declare", False):
            self.dead_letters.bind(channel or self.channel).declare(nowait=nowait)
        return super().declare(nowait=nowait, channel=channel)


def bound_of(queue: Queue) -> int | None:
    """Deliveries before RabbitMQ 3.x dead-letters a message of ``queue``: its
    ``x-delivery-limit + 1`` (None when it has no limit)."""
    limit = (queue.queue_arguments or {}).get("x-delivery-limit")
    return limit + 1 if isinstance(limit, int) else None


def delivery_bound(app: Celery, queue_name: str) -> int | None:
    """``bound_of`` the app's task queue named ``queue_name``."""
    found = [q for q in cast(list[Queue], list(app.conf.task_queues or [])) if q.name == queue_name]
    return bound_of(found[0]) if found else None


def count_starts(app: Celery, ttl_seconds: int = STARTS_TTL_SECONDS) -> None:
    """Count each start of a task body of ``app``, per task id (what ``drain`` reports as attempts),
    and each end (``task_postrun``: the body's process lived on; a crash sends none); each count kept
    ``ttl_seconds`` (``STARTS_TTL_SECONDS`` says the limit)."""
    _starts_ttl[id(app)] = ttl_seconds

    def count(kind: str, task_id: str) -> None:
        r, prefix = backend_redis(app)
        key = f"{prefix}{kind}:{task_id}"
        pipe = cast(Any, r).pipeline(transaction=False)  # one round trip for both
        pipe.incr(key)
        pipe.expire(key, ttl_seconds)
        pipe.execute()

    def on_prerun(sender: object = None, task_id: str = "", task: object = None, **_: object) -> None:
        if getattr(task or sender, "app", None) is app and task_id:
            count("starts", task_id)

    def on_postrun(sender: object = None, task_id: str = "", task: object = None, **_: object) -> None:
        if getattr(task or sender, "app", None) is app and task_id:
            count("ends", task_id)

    task_prerun.connect(on_prerun, weak=False)
    task_postrun.connect(on_postrun, weak=False)


def _counted(app: Celery, kind: str, task_id: str) -> int:
    r, prefix = backend_redis(app)
    raw = cast(str | None, r.get(f"{prefix}{kind}:{task_id}"))
    return int(raw) if raw is not None else 0


def _read_and_renew(app: Celery, task_id: str) -> tuple[int, int]:
    """(starts, ends) of ``task_id``, their TTL renewed (one round trip): a letter the drain reads keeps them."""
    r, prefix = backend_redis(app)
    ttl = _starts_ttl.get(id(app), STARTS_TTL_SECONDS)
    keys = (f"{prefix}starts:{task_id}", f"{prefix}ends:{task_id}")
    pipe = cast(Any, r).pipeline(transaction=False)
    for key in keys:
        pipe.get(key)
    for key in keys:
        pipe.expire(key, ttl)  # a key that does not exist stays absent
    raw = cast(list[Any], pipe.execute())
    return (int(raw[0]) if raw[0] is not None else 0), (int(raw[1]) if raw[1] is not None else 0)


def starts_of(app: Celery, task_id: str) -> int:
    """How often a body of ``task_id`` started, as ``count_starts`` counted (0 when not counted)."""
    return _counted(app, "starts", task_id)


def ends_of(app: Celery, task_id: str) -> int:
    """How many of those bodies ended, their process alive (a cut, a lost ack): the rest were crashes."""
    return _counted(app, "ends", task_id)


@dataclass(frozen=True)
class DeadLetter:
    """One dead-lettered message, and the chord member the drain finalised for it."""

    task_id: str  # the message that died (a chain head, or the member itself)
    task_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    death_reason: str  # the newest x-death's reason: "delivery_limit" for a poison message
    member_id: str  # the chord member finalised for it
    deliveries: int | None  # the source queue's bound, for delivery_limit; else unknown
    started: int  # bodies that really started (count_starts)
    role: Role = "member"  # what the letter was: the chord member, a chain head before one, or a task on its own
    ended: int = 0  # of those starts, the bodies that ended and still came back (count_starts)
    sent_back: int = 0  # how often drain(send_back=True) had published it again before


PARKED_SUFFIX = ".parked"
"""``drain`` parks what it cannot place in ``<dlq>.parked`` (declared by the drain; no worker consumes it)."""


def parked_queue(dlq: Queue) -> Queue:
    """Where ``drain`` parks the letters of ``dlq`` that it cannot place: a queue of its own on the same exchange."""
    name = f"{dlq.name}{PARKED_SUFFIX}"
    return Queue(name, dlq.exchange, routing_key=name)


class BackendUnavailable(Exception):
    """The result backend did not answer while the drain finalised a letter: the pass stops, nothing is parked."""


DRAIN_BATCH = 100
"""How many letters one pass of ``drain`` reads at the most."""


SEND_BACK_LIMIT = 5
"""How often ``drain(send_back=True)`` publishes one message again at the most (``x-rcl-sent-back``)."""
SENT_BACK_HEADER = "x-rcl-sent-back"


def drain(app: Celery, dlq: Queue, batch: int = DRAIN_BATCH, *, chains: bool = True, bodies: bool = True,
          park: bool = True, send_back: bool = False, send_back_rejected: bool = False) -> int:
    """Finalise what sits in ``dlq``; return how many letters it finalised (see the module docstring).

    ``chains``, ``bodies`` and ``park`` are the drain's three hard fixes; each False is the drain
    as it stood before (what ``--prove`` runs to show the fix is needed). ``send_back`` (FM-7)
    publishes an innocent letter again to its queue instead of finalising it; ``send_back_rejected``
    (FM-8) does the same for a letter the worker rejected because its outcome could not be stored."""
    finalised = 0
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        queue = dlq.bind(channel)
        queue.declare()
        parking = parked_queue(dlq).bind(channel)
        if park:
            parking.declare()
        kept: list[Message] = []
        parked: Counter[str] = Counter()
        for _ in range(batch):
            message = queue.get(no_ack=False, accept=["json"])
            if message is None:
                break
            try:
                reasons = ("delivery_limit",) * send_back + ("rejected",) * send_back_rejected
                if reasons and (innocent := _innocent(app, message, reasons)) is not None:
                    _send_back(app, channel, message, innocent)
                    continue
                letter, why = _finalise(app, message, chains, bodies)
            except BackendUnavailable as exc:  # nothing can be finalised now: stop, keep this one, try next pass
                kept.append(message)
                _tell_kept(app, message, str(exc))
                break
            except Exception as exc:  # this letter cannot be finalised, whatever the next pass does
                letter, why = None, f"could not be finalised: {type(exc).__name__}: {exc}"
            if letter is None:
                if park:
                    _park(app, channel, parking, message, why)
                    parked[why] += 1
                else:
                    kept.append(message)
                    _tell_kept(app, message, why)
                continue
            message.ack()
            finalised += 1
            dead_lettered.send(sender=app, letter=letter)
        for message in kept:  # back where they were, once the batch no longer reads the queue
            message.reject(requeue=True)
    if parked:  # one line a pass, not one a letter
        said = "; ".join(f"{n} {why}" for why, n in parked.most_common())
        log.warning("parked %d dead letters in %s, which no drain can place: %s", parked.total(), parking.name, said)
    return finalised


def _park(app: Celery, channel: Any, parking: Queue, message: Message, why: str) -> None:
    """Move ``message`` to the parking queue and announce it on ``dead_letter_parked``."""
    headers = dict(cast(Mapping[str, Any], message.headers or {}))
    _move(channel, message, parking.exchange.name, str(parking.routing_key), {**headers, "x-rcl-parked-why": why})
    dead_letter_parked.send(sender=app, headers=headers, args=_args_of(message), why=why)


def _move(channel: Any, message: Message, exchange: str, routing_key: str, headers: Mapping[str, Any],
          **properties: Any) -> None:
    """Publish ``message`` with ``headers`` to ``exchange``, then ack it: a crash between the two leaves a
    copy in each queue, never none."""
    delivery_mode = cast(Mapping[str, Any], message.properties or {}).get("delivery_mode", 2)
    Producer(channel).publish(message.body, exchange=exchange, routing_key=routing_key, headers=dict(headers),
                              content_type=message.content_type, content_encoding=message.content_encoding,
                              delivery_mode=delivery_mode, serializer=None, retry=True, **properties)
    message.ack()


def _sent_back(headers: Mapping[str, Any]) -> int:
    """How often ``drain(send_back=True)`` has published this message again (its ``x-rcl-sent-back``)."""
    return int(headers.get(SENT_BACK_HEADER) or 0)


def _innocent(app: Celery, message: Message, reasons: tuple[str, ...] = ("delivery_limit",)) -> str | None:
    """Why ``message``, dead-lettered for one of ``reasons``, did not use up its own attempts (None: it
    did, or it died for another reason, or it cannot be told)."""
    headers = cast(Mapping[str, Any], message.headers or {})
    task_id = str(headers.get("id") or "")
    death, source = newest_death(headers)
    bound = delivery_bound(app, source)
    if not task_id or death not in reasons or bound is None or _sent_back(headers) >= SEND_BACK_LIMIT:
        return None
    try:
        started, ended = _read_and_renew(app, task_id)
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise BackendUnavailable(f"the result backend did not answer: {type(exc).__name__}: {exc}") from exc
    if started - ended >= bound:
        return None
    if death == "rejected":  # FM-8: Celery's on_failure rejected it (task_acks_on_failure False): its store failed
        return f"rejected with its outcome unstored, {started} started, {ended} ended in a live process"
    return f"{bound} deliveries, {started} started, {ended} ended in a live process"


def _send_back(app: Celery, channel: Any, message: Message, why: str) -> None:
    """Publish ``message`` again where it died (a new message: its deliveries counted afresh), then ack it."""
    all_headers = cast(Mapping[str, Any], message.headers or {})
    headers = {k: v for k, v in all_headers.items() if not k.startswith(("x-death", "x-first-death", "x-last-death"))}
    newest = _newest_death_entry(all_headers) or {}
    keys = cast(list[Any], newest.get("routing-keys") or [])
    properties = cast(Mapping[str, Any], message.properties or {})
    kept = {k: properties[k] for k in ("correlation_id", "reply_to", "priority") if properties.get(k) is not None}
    _move(channel, message, str(newest.get("exchange") or ""), str(keys[0]) if keys else str(newest.get("queue") or ""),
          {**headers, SENT_BACK_HEADER: _sent_back(headers) + 1}, **kept)
    log.warning("dead letter %s (%s) sent back to its queue: %s", headers.get("id"), headers.get("task"), why)
    dead_letter_sent_back.send(sender=app, headers=headers, args=_args_of(message), why=why)


def _args_of(message: Message) -> list[Any]:
    if message.content_type != "application/json":
        return []
    try:
        body = message.decode()
    except Exception:  # what cannot be decoded is announced without its arguments
        return []
    first = cast(list[Any], body)[0] if isinstance(body, list) and body else None
    return cast(list[Any], first) if isinstance(first, list) else []


TOLD_LIMIT = 10_000
"""How many kept letters ``_told`` remembers (the oldest forgotten first): a letter kept while more than this
many others were told about since is logged and announced (``dead_letter_kept``) once more."""
_told: OrderedDict[str, None] = OrderedDict()


def _tell_kept(app: Celery, message: Message, why: str) -> None:
    headers = cast(Mapping[str, Any], message.headers or {})
    ident = str(headers.get("id") or message.body)
    if ident in _told:
        _told.move_to_end(ident)
        return
    _told[ident] = None
    while len(_told) > TOLD_LIMIT:
        _told.popitem(last=False)
    log.warning("dead letter %s (%s) kept in the DLQ: %s", headers.get("id"), headers.get("task"), why)
    dead_letter_kept.send(sender=app, headers=dict(headers), args=_args_of(message), why=why)


def _newest_death_entry(headers: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The newest ``x-death`` entry (RabbitMQ lists the newest first); None when there is none."""
    deaths = cast(list[Any], headers.get("x-death") or [])
    return cast(Mapping[str, Any], deaths[0]) if deaths and isinstance(deaths[0], Mapping) else None


def newest_death(headers: Mapping[str, Any]) -> tuple[str, str]:
    """``(reason, queue)`` of a dead letter's latest death. ``x-death`` lists the newest
    first; ``x-first-death-*`` name the first one, which for a retry that waited in a
    delay queue (``shared.retry.DelayQueues``) is its expiry there, not its delivery limit."""
    if (newest := _newest_death_entry(headers)) is not None:
        return str(newest.get("reason") or "unknown"), str(newest.get("queue") or "")
    return str(headers.get("x-first-death-reason") or "unknown"), str(headers.get("x-first-death-queue") or "")


def _member(embed: Mapping[str, Any], chains: bool) -> Mapping[str, Any] | None:
    """The options of the chord member a dead chain head stands for (None: no member)."""
    rest = cast(list[Any], embed.get("chain") or []) if chains else []
    last: Mapping[str, Any] = cast(Mapping[str, Any], rest[0]) if rest and isinstance(rest[0], Mapping) else {}
    options = cast(Mapping[str, Any], last.get("options") or {})
    return {**options, "task": last.get("task")} if options.get("chord") and options.get("task_id") else None


def _finalise(app: Celery, message: Message, chains: bool, bodies: bool) -> tuple[DeadLetter | None, str]:
    headers = cast(Mapping[str, Any], message.headers or {})
    if message.content_type != "application/json":  # JSON only: say so without asking kombu to refuse it
        return None, f"not JSON ({message.content_type})"
    body = message.decode()
    if not (isinstance(body, list) and len(cast(list[Any], body)) == 3):
        return None, "not a Celery task message"
    args, kwargs, embed = cast(tuple[list[Any], dict[str, Any], dict[str, Any]], tuple(cast(list[Any], body)))
    task_id, task_name = str(headers.get("id") or ""), str(headers.get("task"))
    if not task_id:
        return None, "no task id"
    role: Role = "member"
    if embed.get("chord"):
        member: Mapping[str, Any] = {"task_id": task_id, "task": task_name, "group_id": headers.get("group"),
                                     "group_index": headers.get("group_index"), "chord": embed["chord"]}
    elif (found := _member(embed, chains)) is not None:
        member, role = found, "head"
    elif bodies:  # no chord member behind it (a chord body, a plain task): its own result says it died
        member, role = {"task_id": task_id, "task": task_name, "chord": None}, "task"
    else:
        return None, "not a chord member, and no chain leads to one" if chains else "not a chord member"
    death, source = newest_death(headers)
    # RabbitMQ 3.x does not carry x-delivery-count into the dead letter; when the reason is
    # delivery_limit, the message was delivered exactly its source queue's bound.
    bound = delivery_bound(app, source)
    deliveries = bound if death == "delivery_limit" else None
    try:
        started, ended, sent = starts_of(app, task_id), ends_of(app, task_id), _sent_back(headers)
        said = f"{deliveries} deliveries" if deliveries is not None else "an unknown number of deliveries"
        error = f"{task_name.rsplit('.', 1)[-1]} dead-lettered by the broker ({death}) after {said}, {started} started"
        error += f", {ended} ended in a live process" if ended else ""
        error += f", sent back {sent} times before" if sent else ""
        envelope = Result[Any].failure(error, "dead_lettered", started, deliveries).to_wire()
        member_id = str(member["task_id"])
        if member_id != task_id:  # the dead head's own result, outside the chord
            app.backend.mark_as_done(task_id, envelope, request=Context(id=task_id, task=task_name, chord=None))
        request = Context(
            id=member_id,
            task=member.get("task"),
            group=member.get("group_id"),
            group_index=member.get("group_index"),
            root_id=headers.get("root_id"),
            parent_id=headers.get("parent_id") if member_id == task_id else task_id,
            chord=member["chord"],
            args=args if member_id == task_id else [],
            kwargs=kwargs if member_id == task_id else {},
        )
        app.backend.mark_as_done(member_id, envelope, request=request)
    except (redis.ConnectionError, redis.TimeoutError, OperationalError) as exc:
        raise BackendUnavailable(f"the result backend did not answer: {type(exc).__name__}: {exc}") from exc
    return DeadLetter(task_id, task_name, args, kwargs, death, member_id, deliveries, started, role, ended, sent), ""
