"""A chord member whose result was stored but never counted is counted when its message comes back.

The window. With acks late, a chord member's success is two writes before its ack: the result backend
stores SUCCESS (``Backend.mark_as_done`` -> ``store_result``), then counts the member into the chord's
join (``on_chord_part_return``; the Redis backend's ``.j`` key). A process that dies between the two (a
deploy's SIGKILL, FM-9's connection-loss cancel, FM-7's cold-shutdown cancel) leaves the message unacked,
so the broker delivers it again. Its redelivery finds SUCCESS stored, and
``worker_deduplicate_successful_tasks`` (Celery 5.1+, ``celery.app.trace.build_tracer``) acks it without
running it, and without counting it: the chord waits for a member that will never report, in silence
(nothing fails, nothing is dead-lettered). Turning the deduplication off closes the window at the cost of
running the member's work a second time.

``count_stored_members(app)`` keeps the deduplication and closes the window, in the worker's main process,
on the two ways a stored-but-uncounted member shows itself there:

- the member's pool process is lost (``WorkerLostError``: a SIGKILL, a cancel). Celery 5.7.0
  (``Request.on_failure``, ``_success_was_stored``) then finds SUCCESS stored, logs "succeeded before the
  worker was lost" and acks the message, taking the member for counted; 5.5 and 5.6 requeue it (reject
  on worker lost). Before either, the stored result is counted;
- a redelivered message of a chord member arrives (Celery's ``task_received`` signal, before the pool
  runs anything: the whole worker was killed, or the connection was lost and RabbitMQ requeued it). If
  the member's stored state is SUCCESS, the stored result is counted before the deduplication acks it.

Counting is idempotent, so a member that was counted before it died is not counted twice:

- Celery 5.7 (``CHORD_PART_RETURN_LUA``) keeps a set of the members it counted, by task id and header
  index, and ignores a second report;
- Celery 5.5 and 5.6 add the encoded ``[1, task id, state, result]`` to a sorted set
  (``RedisBackend.on_chord_part_return``, ``result_chord_ordered``, on by default); the stored result
  decodes and encodes again to the same JSON, so the member is the one already there. A member found
  there is not reported again at all: 5.5 and 5.6 send the body whenever the count equals the chord's
  size, so a second report landing between the last member's count and the deletion of the join's keys
  would send it twice (a run showed it).

The last member to count may be ended after its count and before it sent the body (fm9's connloss chord stayed
PENDING in about one run in twenty on 5.7.0; its logs: the last member's time-limit kill, then no body). Two ways:

- a signal Celery turns into an exception in the pool process (billiard's ``SIGTERM`` for a time limit's kill
  and for Celery's cancels, ``SystemExit``; ``SIGUSR1``, the soft limit) raised inside the body's publish:
  ``RedisBackend.on_chord_part_return``'s ``finally`` then deletes the join's keys (5.7 also marks the chord
  ``done``), the body unsent and nothing left to send it with (seen on 5.7.0 by tests/test_stored_members.py).
  ``count_stored_members`` makes Celery's count whole in pool processes: those signals are held while it runs
  and delivered once it returned (``_whole``), so the process ends right after its count and its send;
- a ``SIGKILL`` (billiard's follows its ``SIGTERM`` by 0.1 s: ``Pool._trywaitkill``, read) between the count
  and the send. The join is then complete and no one sends the body: 5.7's ``CHORD_PART_RETURN_LUA`` gave the
  dispatch to the dead process (its claim key ``.c``, ``SET NX`` for ``max(5, 2 x result_chord_join_timeout)`` s,
  extended before the publish to about 21 s with the default publish retries: ``_chord_publish_claim_expires``,
  read), and a second report finds it claimed; 5.5 and 5.6 keep the join's keys until the body is sent, and a
  second report is not made (above).

So when a count in the main process leaves a complete join unsent behind, a thread of that process watches it
(``finish_dispatch``), once per chord (a ``.resend`` key):

- 5.7: once the claim is gone (expired) with the chord's keys still there, it reports the member again: the
  script claims the dispatch for it and the body is sent; a ``done`` claim (sent) ends the watch;
- 5.5, 5.6: once the complete join has stood ``RESEND_AFTER`` s (a live process deletes its keys
  milliseconds after its count), it reports the member again: the count equals the size, the body is sent.
  A process still alive that long between its count and its send (a publish retrying through a broker
  outage) then sends the body too: its own idempotency (FM-4's claim) is what makes that safe.

Costs: one read of the task's stored meta per redelivered chord member and per chord member whose process
was lost, in the worker's main process, over the result backend's own client (its socket timeouts and retry
policy), and on 5.5 and 5.6 one look at the chord's join; a member that ends normally costs nothing. A pool
process in its count answers a time limit or a cancel once the count returned: with Redis or the broker away,
after their retries (billiard's ``SIGKILL`` still ends it 0.1 s after a time limit's ``SIGTERM``).
``RedisBackend.on_chord_part_return`` is wrapped for the whole process, every app in it.

Limits:
- Only the Redis result backend's join is covered (the lab's); another backend's ``on_chord_part_return``
  is called as it is, idempotent or not.
- Only SUCCESS is counted this way: a stored failure is already in the member's envelope (FM-1), and a
  member stored FAILURE by Celery is what FM-1 removes.
- A member that dies between its store and its count must come back: a broker that dead-letters its
  message instead (the delivery limit, FM-3) hands it to the DLQ drain, which finalises what it finds.
- The watch lives in the main process: a worker stopped before the claim expires (up to about 21 s on 5.7)
  takes it along, and the member's message is acked by then, so the body waits for a later redelivery of
  another member, if any.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, cast

from celery import Celery
from celery.app.task import Context
from celery.backends.redis import RedisBackend
from celery.signals import task_received, worker_process_init
from celery.states import SUCCESS
from billiard.exceptions import WorkerLostError

log = logging.getLogger(__name__)


def _already_joined(backend: Any, group_id: str, task_id: str, result: Any) -> bool:
    """Whether the member is in its chord's join already. Celery 5.7's join script ignores a second report itself
    (``_chord_part_return_script``): no look is needed. 5.5 and 5.6 add the encoded result to the join's sorted set
    (a list when ``result_chord_ordered`` is off) and send the body whenever the count equals the chord's size: a
    second report of a counted member, landing between the last member's count and the deletion of the join's keys,
    would send the body a second time (seen in ``tests/test_stored_members.py`` on 5.5.3), so it is not made."""
    if hasattr(backend, "_chord_part_return_script") or not hasattr(backend, "get_key_for_group"):
        return False
    jkey = backend.get_key_for_group(group_id, ".j")
    encoded = backend.encode([1, task_id, SUCCESS, backend.encode_result(result, SUCCESS)])
    if getattr(backend, "_chord_zset", True):
        return backend.client.zscore(jkey, encoded) is not None
    return backend.client.lpos(jkey, encoded) is not None


def count_stored(app: Celery, request: Any) -> bool:
    """Count ``request``'s stored SUCCESS into its chord, if it is a chord member whose result is stored SUCCESS."""
    chord_body, group_id = request.chord, request.group
    if not chord_body or not group_id:
        return False  # not a chord member
    backend = cast(Any, app.backend)
    try:
        meta = cast(dict[str, Any], backend.get_task_meta(request.id, cache=False))
        if meta.get("status") != SUCCESS:
            return False  # not stored, or stored as something else: the member runs again, or its failure stands
        context = Context({**cast(dict[str, Any], request.request_dict), "chord": chord_body,
                           "group": group_id, "group_index": request.group_index})
        joined = _already_joined(backend, group_id, request.id, meta.get("result"))
        if not joined:
            backend.on_chord_part_return(context, SUCCESS, meta.get("result"))
        if _dispatch_pending(backend, group_id) and backend.client.set(
                backend.get_key_for_group(group_id, ".resend"), request.id, nx=True, ex=RESEND_KEY_SECONDS):
            threading.Thread(target=finish_dispatch, args=(app, context, meta.get("result")), daemon=True,
                             name=f"finish-dispatch-{group_id}").start()
    except Exception as exc:  # the backend does not answer: Celery goes on as it would without this
        log.warning("stored member %s not counted again: %r", request.id, exc)
        return False
    if joined:
        return False  # counted before its process died: counting again could send the body twice (5.5, 5.6)
    log.info("counted the stored result of chord member %s (group %s)", request.id, group_id)
    return True


RESEND_AFTER = 5.0
"""5.5, 5.6: how long a complete join may stand with its keys before its body is taken as never sent."""
WATCH_SECONDS = 120.0
"""The most ``finish_dispatch`` watches a chord (5.7: a claim lives about 21 s at most with Celery's defaults)."""
RESEND_KEY_SECONDS = 300
"""How long the ``.resend`` key keeps a second watch of the same chord from starting."""


def _dispatch_pending(backend: Any, group_id: str) -> bool:
    """Whether the chord's join is complete and its body not yet known sent (the Redis backend's keys)."""
    if not hasattr(backend, "get_key_for_group"):
        return False  # another backend: its join is its own
    client, key = backend.client, backend.get_key_for_group
    if hasattr(backend, "_chord_part_return_script"):  # 5.7: the claim key holds the dispatcher's token
        claim = client.get(key(group_id, ".c"))
        return claim is not None and claim not in (b"done", "done")
    size = client.get(key(group_id, ".s"))
    if size is None:
        return False  # sent (its keys deleted), or not a Redis chord
    jkey = key(group_id, ".j")
    ready = client.zcount(jkey, "-inf", "+inf") if getattr(backend, "_chord_zset", True) else client.llen(jkey)
    return int(ready) == int(size) + int(client.get(key(group_id, ".t")) or 0)


def finish_dispatch(app: Celery, context: Any, result: Any) -> bool:
    """Send the body of a chord whose join is complete and whose dispatcher died (see the module's docstring):
    report the member again once the dead process's claim expired (5.7) or the join stood ``RESEND_AFTER`` s
    (5.5, 5.6). True when it reported; False when the body was sent meanwhile or the watch ended."""
    backend = cast(Any, app.backend)
    group_id = str(context.group)
    try:
        return _finish_dispatch(backend, group_id, context, result)
    except Exception as exc:  # the backend went away while it watched: the chord stays as Celery left it
        log.warning("chord %s: its unsent body's watch ended: %r", group_id, exc)
        return False
    finally:
        with contextlib.suppress(Exception):  # a later death may watch again (the key expires if Redis is away)
            backend.client.delete(backend.get_key_for_group(group_id, ".resend"))


def _finish_dispatch(backend: Any, group_id: str, context: Any, result: Any) -> bool:
    claimed = hasattr(backend, "_chord_part_return_script")
    started = time.monotonic()
    while time.monotonic() - started < WATCH_SECONDS:
        if not _dispatch_pending(backend, group_id):
            if not claimed or backend.client.get(backend.get_key_for_group(group_id, ".c")) is not None:
                return False  # sent (5.7: "done"; 5.5, 5.6: its keys deleted)
            if not backend.client.exists(backend.get_key_for_group(group_id, ".s")):
                return False  # the chord's keys are gone
            break  # 5.7: the dead process's claim expired, the chord's keys are there
        if not claimed and time.monotonic() - started >= RESEND_AFTER:
            break
        threading.Event().wait(0.2)  # the claim's expiry, or the keys' deletion, is looked at five times a second
    else:
        log.warning("chord %s: its join is complete and its body unsent after %.0f s; left as it is", group_id,
                    WATCH_SECONDS)
        return False
    backend.on_chord_part_return(context, SUCCESS, result)
    log.info("sent the body of chord %s, whose last member died before it sent it", group_id)
    return True


def count_stored_members(app: Celery) -> None:
    """Count a chord member whose result is stored SUCCESS when its process is lost or its message comes back."""

    def on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
        if request is None or request.app is not app or not request.chord:
            return
        if cast(dict[str, Any], request.delivery_info or {}).get("redelivered"):
            count_stored(app, request)
        on_failure = request.on_failure

        def counted_on_failure(exc_info: Any, *args: Any, **kwargs: Any) -> Any:
            exc = getattr(exc_info, "exception", None)
            exc = getattr(exc, "exc", exc)  # billiard's ExceptionWithTraceback wraps it (Request.on_failure unwraps too)
            if isinstance(exc, WorkerLostError):
                count_stored(app, request)
            return on_failure(exc_info, *args, **kwargs)

        request.on_failure = counted_on_failure  # this request's own: Celery's pool calls it on a lost process

    task_received.connect(on_received, weak=False, dispatch_uid=f"count_stored_members:{id(app)}")
    worker_process_init.connect(_in_pool_process, weak=False, dispatch_uid="count_stored_members:pool")
    if not getattr(RedisBackend.on_chord_part_return, "_whole", False):
        setattr(RedisBackend, "on_chord_part_return", _whole(RedisBackend.on_chord_part_return))


HELD_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGQUIT", "SIGHUP", "SIGUSR1")
                     if hasattr(signal, name))
"""What billiard (``reset_signals``) and Celery's soft limit turn into exceptions in a pool process."""
_POOL = [False]


def _in_pool_process(**_: Any) -> None:
    _POOL[0] = True


@contextlib.contextmanager
def _signals_held() -> Generator[None, None, None]:
    """Hold ``HELD_SIGNALS`` (their Python handlers, on the main thread) until the block ends, then deliver them."""
    if not _POOL[0] or threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    previous = {number: signal.signal(number, lambda n, _frame: got.append(n)) for number in HELD_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)
        for number in dict.fromkeys(got):
            os.kill(os.getpid(), number)  # to the handler it had: billiard's SystemExit, Celery's soft limit


def _whole(count: Callable[..., Any]) -> Callable[..., Any]:
    """Celery's count and the body's send, which a signal's exception must not split (see the module's docstring)."""

    @functools.wraps(count)
    def on_chord_part_return(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _signals_held():
            return count(self, *args, **kwargs)

    setattr(on_chord_part_return, "_whole", True)
    return on_chord_part_return
