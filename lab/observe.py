"""What a run saw: an observer on Celery's signals, and its record in Redis.

The FM files' task bodies hold no observation code. The observer listens to
Celery's own signals in the worker and turns them into ``Happening`` records:

- ``task_prerun`` of ``fetch_document``: a fetch starts (counted per document,
  apart from the parse's attempts);
- ``task_prerun`` of ``parse_document``: an attempt starts. Attempts are counted
  per document in Redis (``INCR``), which survives a redelivery that Celery's
  ``request.retries`` does not see; the count goes to ``@enveloped``
  (``note_attempt``) and to the lab's fault (``current_attempt``);
- ``task_postrun``: the attempt (or ``notify``) ended; how is read off the
  envelope it returned (or the exception, for the naive program's bare tasks); a ``fetch_document``'s
  is a ``fetch_end`` (a fetch started and never ended is a hung or killed chain head);
- ``task_retry``: a retry was planned, ``Retry.when`` seconds from now;
- ``task_received`` of ``parse_document``: the worker's main process took the message
  (``received``, with the broker's count of its earlier deliveries: the rolling deploys);
- ``Request.on_accepted`` of ``parse_document`` (no signal: ``install`` wraps Celery's method, in
  the main process): the main process read that a pool process began the body (``accepted``). Only
  a request it has read so is in ``celery.worker.state.active_requests``, all that a cold shutdown's
  cancel reaches (``Consumer.cancel_all_unacked_requests`` in 5.5.3, ``cancel_active_requests`` in 5.6.3, 5.7.0);
- ``WorkController.wait_for_soft_shutdown`` (wrapped the same way): a cold shutdown's soft wait begins, with
  this running ``parse_document`` among the requests its cancel will reach (``soft_wait``); then ``Request.cancel``
  of it: the cancel is about to terminate the body's pool process (``cancelled``);
- ``task_received`` of the runner's burst probe (``BURST_PROBE`` in its task id): the
  worker's main process took it off the broker, before any pool process is free for it
  (the retries' hard variant: a prefetch full of waiting retries keeps it on the broker);
- ``shared.dlq.dead_lettered``: the DLQ drain finalised a dead letter (a document's, or
  the chord body's own); ``shared.dlq.dead_letter_kept``: it put a message back in the
  DLQ instead; ``shared.dlq.dead_letter_parked``: it parked one (the runner's foreign
  letters carry their run in a header); ``shared.dlq.dead_letter_sent_back``: it published
  an innocent one again to its queue (the rolling deploys, ``sent_back``);
- ``task_revoked`` of ``fetch_document``: the worker discarded an expired (or revoked)
  chain head;
- ``task_internal_error`` of a fetch, a parse or ``notify``: an error outside the body
  (``celery.app.trace``'s "Exception raised outside body"), after its ``task_postrun``: the
  body ended and its result could not be stored (a backend outage, ``store_failed``); with its fix,
  ``shared.backend.result_unstored`` says it instead, before the message is rejected.

What a killed process cannot report (no ``task_postrun``), the attempt counter
and the broker still tell: an attempt that started and never ended.

Sinks: every ``Happening`` goes to each function in ``SINKS``. The lab's own
sink writes the run's record to Redis (``RunRecorder``); a metrics exporter would
append its own (counts by envelope reason, attempts per document, DLQ drains).

Redis layout (``P`` = ``<namespace>:run:<run_id>:``, on the Redis ``RCL_OBSERVATIONS_URL`` names,
the result backend's by default), every key with a TTL:

- ``P doc:<doc>``: the document's text (the lab's document store, ``lab.pipeline``);
- ``P attempts:<doc>``: INCR per attempt of ``parse_document``;
- ``P events``: a stream, one entry per happening (wall time in ``t``);
- ``P fetch-attempts:<doc>``: INCR per attempt of ``fetch_document``;
- ``P emails``: one item per email the mail stand-in delivered; ``P mail_calls``:
  one item per call of it; ``P mail-key:<key>``: an idempotency key it has seen;
- ``P gated``, ``P gate``: the claim's interleaving; ``P crash_plan``: the claim's crashes
  (``lab.pipeline.send_email``);
- ``P duplicate``: the task id of the duplicate ``notify`` the runner fired, so
  that the reader tells the chord's own ``notify`` (role ``chord``) from it.

How a task call finds its run: the lab's document ids are ``<run_id>/<doc>``
and its pipeline id is the run id, so the run travels with the work itself.

One piece: the observer that writes a run's events in the worker and the reader that reads them back in the
runner share one key layout and one event format.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from celery import current_task
from celery.result import AsyncResult
from celery.signals import after_task_publish, task_internal_error, task_postrun, task_prerun, task_received, task_retry, task_revoked
from celery.worker.request import Request

from lab.settings import NAMESPACE, observations_url
from shared import dlq
from shared.backend import ResultNotStored, result_unstored
from shared.envelope import Result, describe, is_envelope, note_attempt, reason_of

_log = logging.getLogger(__name__)

TTL_SECONDS = 3600

_client: tuple[int, redis.Redis] | None = None


def connect(url: str, **options: Any) -> redis.Redis:
    """A Redis client for ``url`` that answers ``str`` (redis-py's ``from_url`` is untyped)."""
    return cast(Any, redis.Redis).from_url(url, decode_responses=True, **options)


SOCKET_TIMEOUT_SECONDS = 5.0
"""A Redis that stops answering (frozen, gone) is an error after this long, not a hang."""


def client() -> redis.Redis:
    """One Redis client per process (pool children fork: a new one after fork)."""
    global _client
    if _client is None or _client[0] != os.getpid():
        _client = (os.getpid(), connect(observations_url(), socket_timeout=SOCKET_TIMEOUT_SECONDS,
                                         socket_connect_timeout=SOCKET_TIMEOUT_SECONDS))
    return _client[1]


def run_prefix(run_id: str) -> str:
    return f"{NAMESPACE}:run:{run_id}:"


# ---- document ids: the run travels with the work --------------------------------


def doc_id(run_id: str, doc: str) -> str:
    return f"{run_id}/{doc}"


def split_doc_id(value: str) -> tuple[str, str] | None:
    """``(run_id, doc)`` of a lab document id, or None for anything else."""
    run, sep, doc = value.rpartition("/")
    return (run, doc) if sep and run and doc else None


def short_doc(value: str) -> str:
    """``doc3`` for ``<run>/doc3``; anything else unchanged."""
    found = split_doc_id(value)
    return found[1] if found else value


def doc_in(args: Sequence[object]) -> tuple[str, str] | None:
    """The lab document a task call is about, from its first argument: a document
    id, a fetched document, or an envelope holding one."""
    if not args:
        return None
    first = args[0]
    if is_envelope(first):
        first = cast(Mapping[str, object], first).get("payload")
    if isinstance(first, Mapping):
        first = cast(Mapping[str, object], first).get("doc")
    return split_doc_id(first) if isinstance(first, str) else None


# ---- the observer ------------------------------------------------------------------


@dataclass(frozen=True)
class Happening:
    """One thing a task did, as the observer saw it."""

    kind: str  # fetch_start, attempt_start, attempt_end, retry, notify_start, notify_end, notify_retry, dead_lettered
    run_id: str
    task_id: str
    doc: str = ""
    fields: Mapping[str, str] = field(default_factory=lambda: {})


Sink = Callable[[Happening], None]

_attempts: dict[str, int] = {}  # task id -> attempt number, in the process running it


def current_attempt(task_id: str | None) -> int:
    """The attempt number of the ``parse_document`` call running here (1 if unknown)."""
    return _attempts.get(task_id or "", 1)


ROLES = {"score_chunk": "parse_document", "reconcile": "notify", "parse_bl": "parse_document", "parse_units": "parse_document",
         "aggregate_batch": "notify"}
"""A case study's tasks in the FMs' roles: its chord member (one attempt per chunk,
the chunk standing for the document) and its chord body (the run standing for the pipeline)."""


def _role_of(task: object) -> str:
    """``parse_document`` for a task (or a task name) ``<short>_<what>.parse_document``."""
    name = str(task if isinstance(task, str) else getattr(task, "name", "")).rsplit(".", 1)[-1]
    return ROLES.get(name, name)


def _pipeline_in(args: Sequence[object], kwargs: Mapping[str, object]) -> str | None:
    """The run a chord body's call is about: its last argument (an FM's ``pipeline_id``, a case study's
    ``run_id``), positional or by name."""
    value = kwargs.get("pipeline_id", kwargs.get("run_id", args[-1] if len(args) > 1 else None))
    return value if isinstance(value, str) else None


def _ending(state: str, retval: object, retry_sent: bool = False) -> dict[str, str]:
    """How a body ended: ``outcome`` (ok or an envelope reason), ``error``, and for notify ``sent``."""
    if state != "SUCCESS" and retval is None and retry_sent:  # a backend outage: its retry went out, its RETRY state did not
        # celery.app.trace: Task.retry published the retry, then raised Retry; on_error's handle_retry could not
        # store the RETRY state (the backend gone), so ``state`` was never assigned and task_postrun reports None.
        return {"outcome": "retry", "error": "its retry was sent; its RETRY state could not be stored", "state": state}
    if state != "SUCCESS" and retval is None:  # a deploy: SystemExit in the body (a cold shutdown cancelled it)
        # Celery then reports the state it had before the body ran: None, or, for a redelivered message with
        # worker_deduplicate_successful_tasks, the stored state its check read (celery.app.trace.build_tracer
        # assigns ``state = r.state`` to the variable task_postrun reports; 5.5 to 5.7): PENDING, or on 5.5
        # RETRY, which 5.5's cancel stored for the cut before (see ``retry``).
        # a lost connection: the same SystemExit when the worker cancels a late-acked task after a lost connection.
        return {"outcome": "cancelled", "error": "SystemExit: the worker stopped the body (a shutdown, or its connection "
                "lost)", "state": state}
    if state == "SUCCESS" and is_envelope(retval):
        env = Result.from_wire(retval)
        payload = cast(object, env.payload)
        sent = cast(Mapping[str, object], payload).get("sent") if isinstance(payload, Mapping) else None
        extra = {"sent": str(sent)} if sent is not None else {}
        return {"outcome": "ok", **extra} if env.ok else {"outcome": env.reason or "error", "error": env.error or "", **extra}
    if isinstance(retval, BaseException):
        return {"outcome": reason_of(retval), "error": describe(retval)}
    sent = cast(Mapping[str, object], retval).get("sent") if isinstance(retval, Mapping) else None
    return {"outcome": "ok", **({"sent": str(sent)} if sent is not None else {})}


class Observer:
    """Celery signals in, ``Happening`` records out to every sink."""

    def __init__(self, sinks: Iterable[Sink] = ()) -> None:
        self.sinks: list[Sink] = list(sinks)

    def emit(self, h: Happening) -> None:
        for sink in self.sinks:
            sink(h)

    def prerun(self, task_id: str, task: object, args: Sequence[object], kwargs: Mapping[str, object]) -> None:
        role = _role_of(task)
        if role == "parse_document" and (found := doc_in(args)):
            run, doc = found
            n = count_attempt(run, doc)
            _attempts[task_id] = n
            note_attempt(n)
            self.emit(Happening("attempt_start", run, task_id, doc, {"attempt": str(n)}))
        elif role == "fetch_document" and (found := doc_in(args)):
            run, doc = found
            n = count_attempt(run, doc, "fetch-attempts")
            self.emit(Happening("fetch_start", run, task_id, doc, {"attempt": str(n)}))
        elif role == "notify" and (run := _pipeline_in(args, kwargs)):
            self.emit(Happening("notify_start", run, task_id))

    def postrun(self, task_id: str, task: object, args: Sequence[object], kwargs: Mapping[str, object],
                retval: object, state: str) -> None:
        role = _role_of(task)
        n = _attempts.pop(task_id, 0)
        if role == "drain_dead_letters":
            drain_ran(task)
        if state == "RETRY" and retval is not None:
            return  # the retry signal told it (a cut body's state may read RETRY too, with no return value: _ending)
        if role == "parse_document" and (found := doc_in(args)):
            run, doc = found
            self.emit(Happening("attempt_end", run, task_id, doc, {"attempt": str(n), **_ending(state, retval)}))
        elif role == "fetch_document" and (found := doc_in(args)):
            run, doc = found  # the chain head's own end: ok, or failed for good (its parse records it)
            self.emit(Happening("fetch_end", run, task_id, doc, _ending(state, retval)))
        elif role == "notify" and (run := _pipeline_in(args, kwargs)):
            retry_sent = task_id in _retry_sent
            _retry_sent.discard(task_id)
            self.emit(Happening("notify_end", run, task_id, "", _ending(state, retval, retry_sent)))

    def retry(self, task: object, request: object, reason: object) -> None:
        task_id = str(getattr(request, "id", ""))
        args = cast(Sequence[object], getattr(request, "args", None) or ())
        kwargs = cast(Mapping[str, object], getattr(request, "kwargs", None) or {})
        role = _role_of(task)
        when = getattr(reason, "when", None)
        delay = repr(float(when)) if isinstance(when, (int, float)) else ""  # exact: G5 checks it against its band
        exc = cast(BaseException | None, getattr(reason, "exc", None))
        if reason is None:
            # Celery 5.5's cold shutdown stores a request it cancels as a retry ("cancelled by Celery") and
            # announces it without a reason, acks late or not (celery.worker.request.Request._announce_cancelled;
            # from 5.6 Consumer.cancel_active_requests passes emit_retry=False for acks late). A retry the task
            # asks for always comes with its Retry. This is a cut, and its own task_postrun tells it (_ending).
            return
        if role == "parse_document" and (found := doc_in(args)):
            run, doc = found
            n = _attempts.get(task_id, 0)
            error = describe(exc) if exc is not None else ""
            self.emit(Happening("attempt_end", run, task_id, doc,
                                {"attempt": str(n), "outcome": reason_of(exc) if exc else "error", "error": error}))
            self.emit(Happening("retry", run, task_id, doc, {"retry": str(n), "delay": delay}))
        elif role == "notify" and (run := _pipeline_in(args, kwargs)):
            self.emit(Happening("notify_retry", run, task_id, "", {"delay": delay}))

    def internal_error(self, task_id: str, task: object, args: Sequence[object], kwargs: Mapping[str, object],
                       exc: object) -> None:
        """A backend outage: an error outside the body (Celery's ``task_internal_error``): the body ended (its
        ``attempt_end`` came first) and what follows it, the result's store, failed."""
        role = _role_of(task)
        error = describe(exc) if isinstance(exc, BaseException) else str(exc)
        if role in ("parse_document", "fetch_document") and (found := doc_in(args)):
            self.emit(Happening("store_failed", found[0], task_id, found[1], {"stage": role, "error": error}))
        elif role == "notify" and (run := _pipeline_in(args, kwargs)):
            self.emit(Happening("store_failed", run, task_id, "", {"stage": role, "error": error}))

    def letter(self, kind: str, task_id: str, args: Sequence[object], kwargs: Mapping[str, object],
               fields: dict[str, str]) -> None:
        """What the DLQ drain did with a letter: a document's, or the chord body's (``notify``) own."""
        if found := doc_in(args):
            self.emit(Happening(kind, found[0], task_id, found[1], fields))
        elif run := _pipeline_in(args, kwargs):
            self.emit(Happening(kind, run, task_id, "", fields))

    def dead_letter_parked(self, headers: Mapping[str, object], why: str) -> None:
        run = headers.get(FOREIGN_RUN_HEADER)  # the lab's foreign letters say which run sent them
        if isinstance(run, str) and run:
            self.emit(Happening("dead_letter_parked", run, str(headers.get("id") or ""), "", {"why": why}))

    def revoked(self, task_id: str, task: object, args: Sequence[object], expired: bool) -> None:
        if _role_of(task) == "fetch_document" and (found := doc_in(args)):
            run, doc = found
            self.emit(Happening("revoked", run, task_id, doc, {"expired": str(expired)}))


FOREIGN_RUN_HEADER = "x-rcl-run"
"""A header on the letters the runner puts in a DLQ (the drain's hard variant), naming the run."""


# ---- the lab's sink: a run's record in Redis ------------------------------------------


def _drain_key(prefix: str) -> str:
    return f"{prefix}drain:last_run"


def drain_ran(task: object) -> None:
    """The DLQ drain (a beat task) just ran: its time and its count of passes, under its program's
    key prefix (``lab.metrics``: the drain's last-run age; the drain's hard variant counts passes)."""
    conf = getattr(getattr(task, "app", None), "conf", None)
    options = cast(Mapping[str, object], getattr(conf, "result_backend_transport_options", None) or {})
    prefix = str(options.get("global_keyprefix") or "")
    if prefix:
        client().set(_drain_key(prefix), repr(time.time()), ex=TTL_SECONDS)
        client().incr(f"{prefix}drain:passes")
        client().expire(f"{prefix}drain:passes", TTL_SECONDS)


def drain_passes(prefix: str) -> int:
    """How many passes the drain of the program with key prefix ``prefix`` finished."""
    raw = cast(str | None, client().get(f"{prefix}drain:passes"))
    return int(raw) if raw else 0


def drain_last_run(prefix: str) -> float | None:
    """When the drain of the program with Redis key prefix ``prefix`` last ran (wall time), if it did."""
    raw = cast(str | None, client().get(_drain_key(prefix)))
    return float(raw) if raw else None


def count_attempt(run_id: str, doc: str, counter: str = "attempts") -> int:
    r, key = client(), f"{run_prefix(run_id)}{counter}:{doc}"
    n = int(r.incr(key))
    r.expire(key, TTL_SECONDS)
    return n


class RunRecorder:
    """The write side: one run's record (used in the worker, by the sink and the stand-ins)."""

    def __init__(self, run_id: str) -> None:
        self.prefix = run_prefix(run_id)
        self.r = client()

    def event(self, kind: str, **fields: object) -> None:
        key = self.prefix + "events"
        entry: dict[str, str] = {"t": repr(time.time()), "kind": kind, "pid": str(os.getpid())}
        entry.update({k: str(v) for k, v in fields.items()})
        self.r.xadd(key, cast(Any, entry))
        self.r.expire(key, TTL_SECONDS)

    def put(self, name: str, value: str) -> None:
        self.r.set(self.prefix + name, value, ex=TTL_SECONDS)

    def get(self, name: str) -> str | None:
        return cast(str | None, self.r.get(self.prefix + name))

    def pop(self, name: str) -> str | None:
        """Take the first item of a list (a plan the runner wrote), or None."""
        return cast(str | None, self.r.lpop(self.prefix + name))

    def claim_once(self, name: str, value: str) -> bool:
        """Set ``name`` unless it is set already; True when this call set it."""
        return bool(self.r.set(self.prefix + name, value, nx=True, ex=TTL_SECONDS))

    def gate_open(self) -> bool:
        """The claim's interleaving: has the runner opened the gate?"""
        return self.get("gate") is not None

    def open_gate(self) -> None:
        self.put("gate", "1")

    def append(self, name: str, value: str) -> None:
        key = self.prefix + name
        self.r.rpush(key, value)
        self.r.expire(key, TTL_SECONDS)

    def get_list(self, name: str) -> list[str]:
        """Every item of a list the run appended to, in order."""
        return cast(list[str], self.r.lrange(self.prefix + name, 0, -1))


def record(h: Happening) -> None:
    """The lab's sink: every happening becomes an entry of its run's event stream."""
    fields: dict[str, str] = {"task": h.task_id, **h.fields}
    if h.doc:
        fields["doc"] = h.doc
    RunRecorder(h.run_id).event(h.kind, **fields)


OBSERVER = Observer([record])
"""The process's observer; ``install()`` connects it to Celery's signals."""


def _on_prerun(sender: object = None, task_id: str = "", task: object = None, args: Sequence[object] = (),
               kwargs: Mapping[str, object] | None = None, **_: object) -> None:
    OBSERVER.prerun(task_id, task or sender, args or (), kwargs or {})


def _on_postrun(sender: object = None, task_id: str = "", task: object = None, args: Sequence[object] = (),
                kwargs: Mapping[str, object] | None = None, retval: object = None, state: str = "", **_: object) -> None:
    OBSERVER.postrun(task_id, task or sender, args or (), kwargs or {}, retval, str(state))


_retry_sent: set[str] = set()
"""Task ids whose running body published its own retry (``after_task_publish`` of a message with its id)."""


def _on_published(sender: object = None, headers: Mapping[str, object] | None = None, **_: object) -> None:
    request = getattr(current_task, "request", None) if current_task else None
    running = str(getattr(request, "id", "") or "")
    if running and (headers or {}).get("id") == running:
        _retry_sent.add(running)


def _on_internal_error(sender: object = None, task_id: str = "", args: Sequence[object] = (),
                       kwargs: Mapping[str, object] | None = None, exception: object = None, **_: object) -> None:
    if not isinstance(exception, ResultNotStored):  # reject_unstored told it already (_on_unstored)
        OBSERVER.internal_error(task_id, sender, args or (), kwargs or {}, exception)


def _on_unstored(sender: object = None, task_id: str = "", error: str = "", **_: object) -> None:
    request = getattr(current_task, "request", None) if current_task else None
    args = cast(Sequence[object], getattr(request, "args", None) or ())
    kwargs = cast(Mapping[str, object], getattr(request, "kwargs", None) or {})
    OBSERVER.internal_error(task_id, current_task, args, kwargs, error)


def _on_retry(sender: object = None, request: object = None, reason: object = None, **_: object) -> None:
    OBSERVER.retry(sender, request, reason)


BURST_PROBE = ".burst-probe."
"""In the task id of the runner's burst probe, after its run id: ``<run_id>.burst-probe.<uuid>``."""


def _on_received(sender: object = None, request: object = None, **_: object) -> None:
    task_id = str(getattr(request, "id", "") or "")
    if BURST_PROBE in task_id:
        RunRecorder(task_id.split(BURST_PROBE, 1)[0]).event("burst_probe_received", task=task_id)
    elif str(getattr(request, "name", "")).endswith(".parse_document") and (found := doc_in(_args_of(request))):
        # a deploy: which worker (its main process: pid) holds the message, and how often the broker
        # delivered it before (a quorum queue's x-delivery-count: every return counts on RabbitMQ 3.x).
        message = getattr(request, "_message", None) or getattr(request, "message", None)
        headers = cast(Mapping[str, object], getattr(message, "headers", None) or {})
        count = headers.get("x-delivery-count")
        RunRecorder(found[0]).event("received", task=task_id, doc=found[1],
                                    returned=str(count) if isinstance(count, int) else "0")


def _on_accepted(request: object) -> None:
    if str(getattr(request, "name", "")).endswith(".parse_document") and (found := doc_in(_args_of(request))):
        RunRecorder(found[0]).event("accepted", task=str(getattr(request, "id", "")), doc=found[1])


def _on_cancel(request: object, kind: str = "cancelled") -> None:
    if str(getattr(request, "name", "")).endswith(".parse_document") and (found := doc_in(_args_of(request))):
        extra = {"in_wait": "1"} if kind == "cancelled" and _soft_waiting.is_set() else {}
        RunRecorder(found[0]).event(kind, task=str(getattr(request, "id", "")), doc=found[1], **extra)


_soft_waiting = threading.Event()
"""Set while ``WorkController.wait_for_soft_shutdown`` (Celery's own) sleeps in this process: a cancel then (another
thread's: the main one sleeps) is recorded ``in_wait``; the cold shutdown's own cancel comes after the wait."""


_celery_methods: list[tuple[type, str, Callable[..., object], Callable[..., object]]] = []
"""Celery's methods that ``install`` has wrapped: (class, name, the method it wrapped, its wrapper)."""


def _wrap_celery() -> None:
    """``Request.on_accepted`` reports after Celery's own has run (``accepted``). The cold shutdown reports twice,
    in the main process: ``WorkController.wait_for_soft_shutdown`` as it begins, once per running body the main
    process has read as started (``soft_wait``: these, and only these, its cancel will reach), and ``Request.cancel``
    of a running body just before it terminates the body's pool process (``cancelled``, ``in_wait`` when another
    thread cancels it while the wait still sleeps, as ``shared.soft_wait``'s does at a cut;
    ``Consumer.cancel_all_unacked_requests`` calls it in 5.5.3, ``cancel_active_requests`` in 5.6.3 and 5.7.0).
    Each wrapper reports only while the observer is installed, and otherwise only calls what it wrapped."""
    from celery.worker import state
    from celery.worker.worker import WorkController

    accepted = cast(Callable[..., None], Request.on_accepted)
    cancel = cast(Callable[..., None], Request.cancel)
    soft_wait = cast(Callable[..., None], WorkController.wait_for_soft_shutdown)

    def on_accepted(self: Request, pid: int, time_accepted: float) -> None:
        accepted(self, pid, time_accepted)
        if _installed:
            _never_in_celerys_way(_on_accepted, self)

    def on_cancel(self: Request, *args: object, **kwargs: object) -> None:
        if _installed and getattr(self, "time_start", None):  # the body runs: the cancel terminates its process
            _never_in_celerys_way(_on_cancel, self)
        cancel(self, *args, **kwargs)

    def on_soft_wait(self: WorkController) -> None:
        for request in tuple(state.active_requests) if _installed else ():
            _never_in_celerys_way(_on_cancel, request, "soft_wait")
        _soft_waiting.set()
        try:
            soft_wait(self)
        finally:
            _soft_waiting.clear()

    wrapped = {(cls, name) for cls, name, _, _ in _celery_methods}
    for cls, name, wrapper, original in ((Request, "on_accepted", on_accepted, accepted),
                                         (Request, "cancel", on_cancel, cancel),
                                         (WorkController, "wait_for_soft_shutdown", on_soft_wait, soft_wait)):
        if (cls, name) not in wrapped:  # still in place from an earlier install (another wrapper went on top of it)
            _celery_methods.append((cls, name, original, wrapper))
            setattr(cls, name, wrapper)


def _never_in_celerys_way(report: Callable[..., None], *args: object) -> None:
    """Run one of the observer's reports from inside a method of Celery's: whatever it raises (the observations'
    Redis gone, say) is logged and swallowed, so that Celery's own step (a cancel, a shutdown) goes on as without the
    observer. A signal's receivers get the same from Celery's ``Signal.send``."""
    try:
        report(*args)
    except Exception as exc:  # noqa: BLE001 - an observer never stops the worker it observes
        _log.warning("lab: the observer could not record %s: %r", getattr(report, "__name__", report), exc)


def _unwrap_celery() -> None:
    """Give each wrapped method back, unless another wrapper went on top of the observer's since (``shared.soft_wait``
    wraps the soft wait too): that one stays, and the observer's beneath it only calls what it wrapped."""
    for entry in list(_celery_methods):
        cls, name, original, wrapper = entry
        if getattr(cls, name) is wrapper:
            setattr(cls, name, original)
            _celery_methods.remove(entry)


def _args_of(request: object) -> Sequence[object]:
    try:
        return cast(Sequence[object], getattr(request, "args", None) or ())
    except Exception:  # a body Celery could not decode: no lab document
        return ()


def _on_dead_lettered(sender: object = None, letter: dlq.DeadLetter | None = None, **_: object) -> None:
    if letter is not None:
        OBSERVER.letter("dead_lettered", letter.task_id, letter.args, letter.kwargs, {"death": letter.death_reason})


def _on_dead_letter_parked(sender: object = None, headers: Mapping[str, object] | None = None, why: str = "",
                           **_: object) -> None:
    OBSERVER.dead_letter_parked(headers or {}, why)


def _on_revoked(sender: object = None, request: object = None, expired: bool = False, **_: object) -> None:
    OBSERVER.revoked(str(getattr(request, "id", "")), sender, _args_of(request), bool(expired))


def _on_dead_letter_kept(sender: object = None, headers: Mapping[str, object] | None = None,
                         args: Sequence[object] = (), why: str = "", **_: object) -> None:
    OBSERVER.letter("dead_letter_kept", str((headers or {}).get("id") or ""), args, {}, {"why": why})


def _on_dead_letter_sent_back(sender: object = None, headers: Mapping[str, object] | None = None,
                              args: Sequence[object] = (), why: str = "", **_: object) -> None:
    OBSERVER.letter("sent_back", str((headers or {}).get("id") or ""), args, {}, {"why": why})


_installed = False


def _connections() -> list[tuple[Any, Callable[..., None]]]:
    """Every (signal, handler) pair the observer connects: one list for ``install`` and ``uninstall``."""
    return [(task_prerun, _on_prerun), (task_postrun, _on_postrun), (task_retry, _on_retry),
            (task_received, _on_received), (task_internal_error, _on_internal_error), (result_unstored, _on_unstored),
            (after_task_publish, _on_published), (dlq.dead_lettered, _on_dead_lettered),
            (dlq.dead_letter_kept, _on_dead_letter_kept), (dlq.dead_letter_parked, _on_dead_letter_parked),
            (dlq.dead_letter_sent_back, _on_dead_letter_sent_back), (task_revoked, _on_revoked)]


def install() -> None:
    """Connect the observer to Celery's signals (once per process)."""
    global _installed
    if _installed:
        return
    for sig, handler in _connections():
        sig.connect(handler, weak=False)
    _wrap_celery()
    _installed = True


def uninstall() -> None:
    """Disconnect the observer from every signal ``install`` connected: the process then runs the
    FM's code alone, as production would, with no record in Redis (``bench/bench_chord.py``'s
    "observer off" rows). Nothing counts a parse's attempts then: ``current_attempt`` answers 1,
    so a fault that depends on the attempt (CRASH_ONCE, FLAKY) repeats; run no scenario this way.
    A later ``install()`` connects it again."""
    global _installed
    for sig, handler in _connections():
        sig.disconnect(handler)
    _unwrap_celery()
    _installed = False


# ---- the read side --------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    t: float
    kind: str
    fields: Mapping[str, str]

    def get(self, name: str, default: str = "") -> str:
        return self.fields.get(name, default)


def attempt_starts(events: Iterable[Event], doc: str) -> list[float]:
    """When each attempt of ``doc`` began (wall time), in order."""
    return [e.t for e in events if e.kind == "attempt_start" and e.get("doc") == doc]


def _after(stream_id: str) -> str:
    """The smallest stream id above ``stream_id`` (XRANGE's exclusive ``(`` needs Redis 6.2)."""
    ms, _, seq = stream_id.partition("-")
    return f"{ms}-{int(seq) + 1}"


def _with_role(rest: dict[str, str], duplicate: str | None) -> dict[str, str]:
    """A ``notify``'s event says whether it was the chord's or the duplicate's."""
    if "task" in rest and not rest.get("doc"):
        return {**rest, "role": "duplicate" if rest["task"] == duplicate else "chord"}
    return rest


class Reader:
    """The read side, used by the runner and the checks."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.rec = RunRecorder(run_id)
        self.prefix = self.rec.prefix
        self.r = self.rec.r
        self.members: Mapping[str, AsyncResult[Any]] = {}  # the runner's: each document's chord member
        self.side_readers: Mapping[str, Reader] = {}  # the runner's: the side chords' records, by tag
        self._last_id = ""  # the events already read (``events``), and the duplicate their roles were made for
        self._rows: list[tuple[float, str, dict[str, str]]] = []
        self._roles_for: str | None = None
        self._events: list[Event] = []
        self._by_kind: dict[str, list[Event]] = {}

    def member_state(self, doc: str) -> str:
        """The Celery state of ``doc``'s chord member (what the runner gave this reader), '' when unknown."""
        found = self.members.get(doc)
        return str(found.state) if found is not None else ""

    def attempts(self, doc: str, counter: str = "attempts") -> int:
        """Attempts of ``parse_document`` on ``doc`` (``counter="fetch-attempts"``: of its fetch)."""
        raw = self.rec.get(f"{counter}:{doc}")
        return int(raw) if raw is not None else 0

    def attempts_of(self, docs: Sequence[str], counter: str = "attempts") -> dict[str, int]:
        """``attempts`` of every document in ``docs``, in one round trip (a run's end reads them all)."""
        if not docs:
            return {}
        raws = cast(list[str | None], self.r.mget([f"{self.prefix}{counter}:{doc}" for doc in docs]))
        return {doc: int(raw) if raw is not None else 0 for doc, raw in zip(docs, raws)}

    def mail_calls(self) -> int:
        return int(self.r.llen(self.prefix + "mail_calls"))

    def duplicate_id(self) -> str | None:
        return self.rec.get("duplicate")

    def events(self) -> list[Event]:
        """Every event, with ``role`` (chord or duplicate) on those a ``notify`` made.

        Polled every few milliseconds while a run goes on, so each call reads only the entries
        added since the last one (a stream's ids only grow) and keeps what it read; the roles are
        made again only when the duplicate's id is new."""
        fresh = cast(list[tuple[str, dict[str, str]]],
                     self.r.xrange(self.prefix + "events", min=_after(self._last_id) if self._last_id else "-"))
        rows = [(float(f["t"]), f["kind"], {k: v for k, v in f.items() if k not in ("t", "kind")}) for _id, f in fresh]
        if fresh:
            self._last_id = fresh[-1][0]
            self._rows.extend(rows)
        duplicate = self.duplicate_id()
        if duplicate != self._roles_for:  # a new duplicate: every notify's role again
            self._roles_for = duplicate
            self._events, self._by_kind = [], {}
            rows = self._rows
        # else only the new rows (issue 26: remaking every event at every look made a run's reads quadratic)
        for t, kind, rest in rows:
            made = Event(t, kind, _with_role(rest, duplicate))
            self._events.append(made)
            self._by_kind.setdefault(kind, []).append(made)
        return list(self._events)

    def events_of(self, kind: str) -> list[Event]:
        """``events()`` of one kind, from an index kept as the events are read (the runner asks at every look)."""
        self.events()
        return list(self._by_kind.get(kind, ()))

    def notify_runs(self, role: str) -> int:
        return sum(1 for e in self.events_of("notify_start") if e.get("role") == role)

    def emails(self) -> list[str]:
        """``role|text`` per email sent."""
        duplicate = self.duplicate_id()
        out: list[str] = []
        for item in cast(list[str], self.r.lrange(self.prefix + "emails", 0, -1)):
            task, _, text = str(item).partition("|")
            out.append(f"{'duplicate' if task == duplicate else 'chord'}|{text}")
        return out

    def has_event(self, kind: str, **match: str) -> bool:
        return any(all(e.get(k) == v for k, v in match.items()) for e in self.events_of(kind))
