"""What a lab worker's window says: the lab's own deaths as such, and every recovery.

A lab scenario kills pool processes on purpose (``CRASH_ONCE``, ``POISON``,
``FETCH_POISON``, the claim's crash plan) and runs hangs into Celery's limits. Stock
Celery reports each of those as a failure: billiard's ``Process 'ForkPoolWorker-N'
pid:... exited with 'signal 9 (SIGKILL)'`` and Celery's ``Task handler raised error:
WorkerLostError(...)`` with a ten-line traceback, ``Soft time limit (1s) exceeded``,
and, at the worker's default level (WARNING), not one line of what recovered. This
module, which ``lab.app.lab_app`` installs in every lab worker, changes only what is
printed, never what Celery decides:

- ``ExpectedFaults``, a ``logging.Filter`` on billiard's and Celery's loggers in the
  worker, turns each of those records into one ``INFO`` line that starts with
  ``expected:`` and names the scenario's fault, the document and what Celery does
  next (``expected: the lab killed pool process ForkPoolWorker-2 (pid 8801): scenario
  fault POISON on doc4, parse_document attempt 1``), without its traceback. It does so
  only when the task the record is about carries one of the lab's faults (read off
  the task's arguments, the lab's document store or the run's crash plan); any other
  record is left exactly as Celery wrote it: a death the lab did not cause stays loud;
- ``recovery``, a sink of the lab's observer (``lab.observe.OBSERVER``), logs one line
  per recovery on the ``lab.worker`` logger, whose level is ``INFO`` whatever the
  worker's ``--loglevel``: a document ok after a redelivery or a retry, each retry
  planned and its delay, a document failed for good (its envelope's reason), a
  dead letter the DLQ drain finalised, ``notify``'s busy-retry on a claim and how
  each ``notify`` ended.

Limits: the filter finds the task of a dead pool process by the pid Celery noted when
the process accepted it, or else by the process the job was written to; it reads the
fault from the task's arguments, the run's record in Redis or, for a fetch, the
document's text as it was when the message arrived (one Redis read per fetch in the
main process). Where it cannot tell, the record stays as Celery wrote it. Stock Celery (``worker_hijack_root_logger``
off, another logging set-up) may route these loggers elsewhere: the filters sit on
the loggers, so they go along.
"""

from __future__ import annotations

import logging
import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from billiard.exceptions import WorkerLostError
from celery.exceptions import ChordError
from celery.signals import task_postrun, task_received, worker_init

from lab import observe
from lab.faults import PermanentError, fault_in
from lab.observe import Happening, Reader, RunRecorder, doc_in
from shared.dlq import delivery_bound
from shared.envelope import is_envelope

LOGGER = logging.getLogger("lab.worker")
"""The recoveries' logger: ``INFO``, so that a worker at Celery's default level shows them."""

KILLS = ("CRASH_ONCE", "POISON", "FETCH_POISON")
"""Faults that SIGKILL the process that meets them (``lab.faults``)."""
HANGS = ("SOFT_HANG", "HARD_HANG", "SWALLOW_HANG", "C_HANG")

_requests: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
"""Task id -> Celery's ``Request`` in the worker's main process, as long as Celery holds it."""
_time_limited: dict[int, Cause] = {}
"""Pool process pid -> the cause of the time limit that is killing it (for billiard's exit line that follows)."""
_lost_jobs: dict[int, str] = {}
"""billiard job number -> the explanation of the kill (for Celery's ``WorkerLostError`` line that follows)."""


# ---- what the lab did to a task ------------------------------------------------------


@dataclass(frozen=True)
class Cause:
    """The lab's fault behind what happened to one task."""

    doc: str  # doc4, or "" for notify
    task: str  # parse_document, fetch_document, notify
    fault: str  # POISON, C_HANG, ..., or the crash plan's step for notify (before_send)
    attempt: int  # the attempt the observer counted (0: not counted)


def _role(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def text_of(name: str, args: Sequence[object]) -> str | None:
    """The document text a call of task ``name`` meets: in its argument (a parse), or in the lab's
    document store (a fetch)."""
    task, found = _role(name), doc_in(args)
    if found is None:
        return None
    if task == "parse_document":
        first = args[0]
        payload = cast(Mapping[str, object], first).get("payload") if is_envelope(first) else first
        text = cast(Mapping[str, object], payload).get("text") if isinstance(payload, Mapping) else None
        return text if isinstance(text, str) else None
    return RunRecorder(found[0]).get(f"doc:{found[1]}") if task == "fetch_document" else None


def cause_of(name: str, args: Sequence[object], text: str | None = None) -> Cause | None:
    """The lab's fault in a call of task ``name`` with ``args`` (``text``: the document's, if known), if any."""
    task = _role(name)
    found = doc_in(args)
    if found is not None and task in ("parse_document", "fetch_document"):
        run, doc = found
        text = text if text is not None else text_of(name, args)
        fault = fault_in(text) if text is not None else None
        if fault is None:
            return None
        attempts = Reader(run).attempts(doc, "attempts" if task == "parse_document" else "fetch-attempts")
        return Cause(doc, task, fault.kind, attempts)
    return None


def request_cause(request: Any) -> Cause | None:
    """The lab's fault behind Celery's ``request`` (main process): a document's fault, or for ``notify``
    the step of the claim's crash plan that killed it (the run's ``crash`` event names the task)."""
    name, args = str(getattr(request, "name", "")), cast(Sequence[object], getattr(request, "args", None) or ())
    if _role(name) == "notify" and len(args) > 1 and isinstance(args[-1], str):  # its pipeline, the last argument
        task_id = str(getattr(request, "id", ""))
        crashes = [e for e in Reader(args[-1]).events() if e.kind == "crash" and e.get("task") == task_id]
        return Cause("", "notify", crashes[-1].get("when"), 0) if crashes else None
    return cause_of(name, args, getattr(request, "lab_text", None))


def _what(c: Cause) -> str:
    if c.task == "notify":
        if c.fault == "poison_mail":
            return "a poison chord body: the mail stand-in kills every notify of this side chord (body)"
        when = "after claiming, before it sends" if c.fault == "before_send" else "once the email is out, before it marks the claim sent"
        return f"the scenario's crash plan kills notify {when}"
    attempt = f" attempt {c.attempt}" if c.attempt else ""
    return f"scenario fault {c.fault} on {c.doc}, {c.task}{attempt}"


def _next_step(request: Any) -> str:
    """What Celery does with a task whose process was lost (``Request.on_failure``, Celery 5.5 to 5.7),
    and, on a quorum queue with a delivery limit, what the broker does with the requeued message."""
    task = getattr(request, "task", None)
    if getattr(task, "acks_late", False) and getattr(task, "reject_on_worker_lost", False):
        then = "the broker delivers it again"
        message = getattr(request, "_message", None)
        headers = cast(Mapping[str, object], getattr(message, "headers", None) or {})
        delivery_info = cast(Mapping[str, object], getattr(request, "delivery_info", None) or {})
        queue = str(delivery_info.get("routing_key") or "")
        bound = delivery_bound(task.app, queue) if task is not None and queue else None
        count = headers.get("x-delivery-count")  # RabbitMQ's, on a quorum queue's redeliveries: deliveries before this one
        delivery = int(count) + 1 if isinstance(count, int) else 1
        if bound is not None:
            then = (f"that was delivery {delivery} of {bound} (x-delivery-limit + 1): the broker dead-letters it"
                    if delivery >= bound else f"delivery {delivery + 1} of at most {bound} comes next")
        return f"Celery requeues it (acks_late + reject_on_worker_lost): {then}"
    if getattr(task, "acks_late", False):
        return "Celery acks it and records the failure (acks_late without reject_on_worker_lost)"
    return "its message was acked when it arrived, so Celery records the failure and the message is gone"


def _job(request: Any) -> Any | None:
    """billiard's job (``ApplyResult``) for ``request``, while Celery holds it."""
    ref = getattr(request, "_apply_result", None)
    return ref() if callable(ref) else None


def _by_pid(pid: int) -> Any | None:
    """The request whose job ran in pool process ``pid``: the pid Celery noted when the process accepted
    it, or else the process the job was written to (a kill can reach the main process before the
    acceptance does)."""
    written = None
    for request in list(_requests.values()):
        job = _job(request)
        if job is None or job.ready():  # done: an earlier task of the same process
            continue
        if getattr(request, "worker_pid", None) == pid:
            return request
        if getattr(getattr(job, "_write_to", None), "pid", None) == pid:
            written = request
    return written


def _job_of(request: Any) -> int | None:
    number = getattr(_job(request), "_job", None)
    return number if isinstance(number, int) else None


# ---- the filter ---------------------------------------------------------------------------


def _rewrite(record: logging.LogRecord, text: str) -> bool:
    record.msg, record.args = text, None
    record.exc_info, record.exc_text, record.stack_info = None, None, None
    record.levelno, record.levelname = logging.INFO, "INFO"
    return True


_JOB = re.compile(r"Job: (\d+)\.")


class ExpectedFaults(logging.Filter):
    """Rewrites the records of the lab's own faults (see the module docstring); passes every record on."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = self.explain(record)
        except Exception:  # the explanation is a courtesy: never lose the record over it
            return True
        return _rewrite(record, text) if text is not None else True

    def explain(self, record: logging.LogRecord) -> str | None:
        msg, args = str(record.msg), record.args if isinstance(record.args, tuple) else ()
        if msg.startswith("Process %r pid:%r exited with") and len(args) == 3:
            return self._exited(str(args[0]), int(cast(int, args[1])), str(args[2]))
        if msg.startswith("Task handler raised error") and args and isinstance(args[0], WorkerLostError):
            found = _JOB.search(str(args[0]))
            cause = _lost_jobs.pop(int(found.group(1)), None) if found else None
            return f"expected: {cause}" if cause else None
        if msg.startswith("Soft time limit") and len(args) == 3:
            return self._soft_limit(args[0], str(args[2]))
        if msg == "%s[%s]: %s" and len(args) == 3 and "ran past its time_limit" in str(args[2]):
            return self._time_limit(str(args[1]))
        if msg.startswith("Chord %r raised") and len(args) == 2 and isinstance(args[1], ChordError):
            if "PermanentError" in str(args[1]):  # the lab's FAIL fault, raised by a bare (unenveloped) member
                return (f"expected: the chord failed: ChordError: {args[1]}; a member in the FAILURE state makes Celery "
                        "skip the body, so notify never runs (the naive program's bug)")
            return None
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, PermanentError):  # celery.app.trace: a bare task raised the lab's FAIL fault
            data = cast(Mapping[str, object], getattr(record, "data", None) or {})
            return (f"expected: {data.get('name', 'a task')}[{data.get('id', '?')}] raised PermanentError: {exc} "
                    "(scenario fault FAIL); no @enveloped here, so Celery stores FAILURE")
        return None

    def _exited(self, process: str, pid: int, status: str) -> str | None:
        cause = _time_limited.pop(pid, None)  # its job is over already: the time limit's line came first
        by_limit = cause is not None
        request = _by_pid(pid) if cause is None else None
        cause = cause or (request_cause(request) if request is not None else None)
        if cause is None or "SIGKILL" not in status:
            return None
        if cause.fault in KILLS or cause.task == "notify":
            head = f"the lab killed pool process {process} (pid {pid}): {_what(cause)}"
        elif cause.fault == "HOLD_AFTER_STORE":
            who = "Celery's time_limit" if by_limit else "the lab"
            head = (f"{who} killed pool process {process} (pid {pid}): {_what(cause)}, its result stored and not yet "
                    "counted in its chord")
        elif cause.fault == "C_HANG":
            head = (f"Celery's time_limit killed pool process {process} (pid {pid}): {_what(cause)}, stuck in one C call "
                    "that no signal handler interrupts")
        elif cause.fault == "STALL_PAST_LIMIT":
            head = (f"Celery's time_limit killed pool process {process} (pid {pid}): {_what(cause)}, its body long "
                    "returned, inside its stalled result store")
        else:
            return None
        job = _job_of(request)
        if job is not None:
            owner = f"{cause.doc}'s {cause.task}" if cause.doc else "the chord's notify"
            _lost_jobs[job] = f"{owner} lost its process (WorkerLostError): {_next_step(request)}"
        return f"expected: {head}"

    def _soft_limit(self, seconds: object, task_id: str) -> str | None:
        request = _requests.get(task_id)
        cause = request_cause(request) if request is not None else None
        if cause is None or cause.fault not in HANGS:
            return None
        then = {"SOFT_HANG": "it cooperates and ends soft_timeout",
                "HARD_HANG": "it swallows that exception; @hard_timeout ends it",
                "SWALLOW_HANG": "its except Exception swallows that; @hard_timeout (a BaseException) ends it",
                "C_HANG": "it is inside one C call and cannot see it; Celery's time_limit ends it"}[cause.fault]
        return (f"expected: {cause.doc}'s {cause.task} passed its soft_time_limit of {seconds}s ({_what(cause)}): "
                f"Celery raises SoftTimeLimitExceeded in it; {then}")

    def _time_limit(self, task_id: str) -> str | None:
        request = _requests.get(task_id)
        cause = request_cause(request) if request is not None else None
        if cause is None or cause.fault not in ("C_HANG", "STALL_PAST_LIMIT", "HOLD_AFTER_STORE"):
            return None
        pid = getattr(request, "worker_pid", None)
        if isinstance(pid, int):
            _time_limited[pid] = cause
        if cause.fault == "HOLD_AFTER_STORE":
            return (f"expected: {cause.doc}'s {cause.task} ran past its time_limit after its result was stored, before "
                    f"its chord counted it ({_what(cause)}): Celery kills its process; BackstopRequest finds SUCCESS "
                    "stored and counts it into the chord")
        where = " after its body returned, its result not stored yet" if cause.fault == "STALL_PAST_LIMIT" else ""
        return (f"expected: {cause.doc}'s {cause.task} ran past its time_limit{where} ({_what(cause)}): Celery kills its "
                "process; BackstopRequest records the envelope reason time_limit, and the chord goes on")


FILTERED = ("multiprocessing", "celery.worker.request", "celery.app.trace", "celery.backends.redis",
            "celery.backends.base", "shared.timeouts")
"""The loggers whose records of the lab's faults ``ExpectedFaults`` rewrites (billiard logs as ``multiprocessing``)."""


# ---- the recoveries -------------------------------------------------------------------------


_pending_end: dict[str, Happening] = {}
"""An attempt that raised, until we know whether a retry follows (then the retry's line says it)."""
_busy_told: set[str] = set()


def recovery(h: Happening) -> None:
    """The observer's sink in a lab worker: one ``lab.worker`` line per recovery (see the module docstring)."""
    f = h.fields
    if h.kind == "attempt_end":
        if f.get("outcome") == "ok":
            if int(f.get("attempt") or 0) > 1:
                LOGGER.info("lab: %s ok on attempt %s", h.doc, f.get("attempt"))
        else:
            _pending_end[h.task_id] = h  # told by the retry line, or at task_postrun
    elif h.kind == "retry":
        failed = _pending_end.pop(h.task_id, None)
        error = failed.fields.get("error", "") if failed is not None else ""
        delay = float(f["delay"]) if f.get("delay") else None
        LOGGER.info("lab: %s attempt %s raised %s; retry %s in %s", h.doc, f.get("retry"), error or "an error",
                    f.get("retry"), f"{delay:.2f}s" if delay is not None else "a moment")
    elif h.kind == "fetch_end" and f.get("outcome") != "ok":
        LOGGER.info("lab: %s's fetch failed for good: %s (%s), in a SUCCESS-state envelope: its parse records it and "
                    "the chord goes on", h.doc, f.get("outcome"), f.get("error"))
    elif h.kind == "dead_lettered" and not h.doc:  # the chord body itself
        LOGGER.info("lab: the chord's notify dead-lettered (%s); the DLQ drain stored that as the chord's result "
                    "(dead_lettered): the chord ends, visibly, without its email", f.get("death"))
    elif h.kind == "dead_lettered":
        LOGGER.info("lab: %s dead-lettered (%s); the DLQ drain recorded it as failed (dead_lettered): the chord "
                    "can complete", h.doc, f.get("death"))
    elif h.kind == "sent_back" and str(f.get("why", "")).startswith("rejected"):
        LOGGER.info("lab: the drain published %s again to its queue, to run again and store its outcome (%s)",
                    h.doc or "the chord's notify", f.get("why"))
    elif h.kind == "sent_back":
        LOGGER.info("lab: %s dead-lettered at its delivery limit, yet innocent (%s): the DLQ drain published it "
                    "again to its queue, where its deliveries count afresh", h.doc or "the chord's notify", f.get("why"))
    elif h.kind == "dead_letter_kept" and "did not answer" in str(f.get("why")):
        LOGGER.info("lab: a dead letter of %s stays in the DLQ until the result backend answers; the drain's next "
                    "pass takes it again", h.doc or "the chord's notify")
    elif h.kind == "dead_letter_kept":
        LOGGER.info("lab: a dead letter of %s stays in the DLQ for an operator: %s", h.doc or "the chord's notify",
                    f.get("why"))
    elif h.kind == "store_failed":
        LOGGER.info("expected: %s", _store_failed(h))
    elif h.kind == "notify_retry" and h.task_id not in _busy_told:
        _busy_told.add(h.task_id)
        LOGGER.info("lab: notify %s found the claim held by another notify: it busy-retries (every %ss) until the "
                    "claim is released or sent", _notify_role(h), f.get("delay") or "?")
    elif h.kind == "notify_end":
        sent = {"True": "the email is sent", "False": "sent=False: the claim says the email is out already"}
        LOGGER.info("lab: notify %s ended %s%s", _notify_role(h), f.get("outcome"),
                    f"; {sent[f['sent']]}" if f.get("sent") in sent else "")


def _store_failed(h: Happening) -> str:
    """A result the backend did not store (a result backend outage), and what follows, by the app's guard."""
    from celery import current_task

    from shared.backend import RejectUnstored

    f = h.fields
    stage = str(f.get("stage") or "task")
    who = f"{h.doc}'s {stage}" if h.doc else "the chord's notify"
    guarded = isinstance(getattr(current_task, "backend", None), RejectUnstored)
    head = f"{who} ended, but its result was not stored ({f.get('error')})"
    if guarded and stage == "fetch_document":
        return f"{head}: a chain's head stays acked, its parse was sent already with the result in it"
    if guarded:
        return (f"{head}: ResultNotStored rejects its message into the DLQ, and the drain sends it back to run "
                "again once the result backend answers")
    return f"{head}: Celery acks its message all the same, so its outcome is lost (the backend outage's symptom)"


def _notify_role(h: Happening) -> str:
    return "(duplicate)" if RunRecorder(h.run_id).get("duplicate") == h.task_id else "(chord)"


def _tell_failed(sender: object = None, task_id: str = "", state: str = "", **_: object) -> None:
    h = _pending_end.pop(task_id, None)
    if h is not None and state == "SUCCESS":  # a bare task's FAILURE: Celery's own line says it (the naive program)
        LOGGER.info("lab: %s failed for good on attempt %s: %s (%s), in a SUCCESS-state envelope: the chord goes on",
                    h.doc, h.fields.get("attempt"), h.fields.get("outcome"), h.fields.get("error"))


def _remember(sender: object = None, request: object = None, **_: object) -> None:
    """``task_received``: keep the request, and a fetch's document text as it is now (a cancelled
    by-hand run deletes its documents while its last fetches may still die of theirs)."""
    task_id = str(getattr(request, "id", "") or "")
    if not task_id:
        return
    _requests[task_id] = request
    name = str(getattr(request, "name", ""))
    if _role(name) == "fetch_document":
        try:
            setattr(request, "lab_text", text_of(name, cast(Sequence[object], getattr(request, "args", None) or ())))
        except Exception:  # Redis gone: the kill, if any, is then reported as Celery writes it
            pass


def _setup(**_: object) -> None:
    """The worker's main process, before its pool forks (the pool processes inherit all of it)."""
    global _set_up
    if _set_up:
        return
    _set_up = True
    observe.OBSERVER.sinks.append(recovery)
    task_postrun.connect(_tell_failed, weak=False)  # after lab.observe's receiver (lab_app installed it first)
    task_received.connect(_remember, weak=False)
    LOGGER.setLevel(logging.INFO)
    expected = ExpectedFaults()
    for name in FILTERED:
        logger = logging.getLogger(name)
        if not any(isinstance(f, ExpectedFaults) for f in logger.filters):
            logger.addFilter(expected)


_set_up = False


def install() -> None:
    """Called by ``lab_app`` (after ``lab.observe.install``): in a worker, at ``worker_init``, the filter,
    the ``lab.worker`` level, the sink and its signals; nothing in any other process (the harness)."""
    worker_init.connect(_setup, weak=False)  # the same receiver again is no second connection
