"""A lab worker's window during the deploys', outages' and cuts' lessons: each line the lab's deploys, outages and cuts cause, said once.

Those lessons' scenarios do to a worker what a rolling deploy, a result backend outage and a dropped broker
connection do. Celery and the lab's own primitives answer with lines that read like bugs: one 4 s outage
printed some 60 ``ERROR ... Signal handler count_starts.<locals>.on_prerun ... raised: ConnectionError``
records with three chained tracebacks each. This module, which ``lab.app.lab_app`` installs in every lab
worker beside ``lab.worker_log``, changes only what is printed, never what Celery or a primitive decides:

- ``count_starts``' signal handlers (``shared.dlq``) that meet the result backend gone: Celery logs each
  failure at ``ERROR`` with its traceback, four a second while the drain runs. The first in a process is
  one ``expected:`` line at ``INFO`` that says what is lost; the repeats within ``OUTAGE_SECONDS`` are
  dropped. A ``count_starts`` failure of any other kind stays as Celery wrote it.
- Celery's ``Connection to Redis lost: Retry (n/3) ...`` at ``ERROR``, which the Redis backend logs before each
  retry of a store (its ``retry_policy``) while the backend is gone: the first in a process is one ``expected:``
  line at ``INFO``, the repeats within ``OUTAGE_SECONDS`` are dropped; the store's failure, if it comes, has its
  own ``expected:`` line (``lab.worker_log``).
- on Celery 5.5.3, the ``RuntimeWarning`` and the failure line, each with a traceback, for a result ``ResultNotStored``
  could not store (``UNSTORED_SAY``) are dropped: ``lab.worker_log``'s ``expected:`` line says it once, as on 5.6 and 5.7.
- the DLQ drain's ``WARNING`` for a letter it sent back to its queue or kept in the DLQ (``shared.dlq``)
  is dropped: the ``lab:`` line of ``lab.worker_log.recovery`` says the same with the document's name.
  ``shared.backend``'s ``WARNING`` for a chain head whose result was not stored is dropped for the same
  reason (``recovery`` says it on ``store_failed``).
- Celery's ``consumer: Connection to broker lost``, its ``consumer: Cannot connect to ...`` for a reconnect the cut
  met, its ``Task ... cannot be acknowledged after a
  connection loss ... Terminating it instead.``, a chord callback's publish retried on the closed
  connection (``Retrying refused callback publish``), and kombu's ``CRITICAL`` ``Couldn't ack ... reason:
  RecoverableConnectionError(... 'connection already closed' ...)`` for a task that ended after the cut (its ack
  goes to the closed channel; the broker has requeued the message already; kombu's hub then logs the same failed
  ack at ``ERROR``, ``Callback <... ack_log_error ...> raised exception``, which is dropped; and Celery's
  ``Error on terminating Hub`` when a worker's shutdown closes its event loop over a cut connection, an embedded
  beat's ``beat: Connection error: ... Trying again``, and the DLQ drain's failure when the cut closes the connection it
  reads the DLQ on) each become one
  ``lab:`` line that says what happens next. They stay at ``WARNING``: the worker cannot tell the lab's cut from a real one.
- Celery's ``worker: Hitting Ctrl+C again will terminate all running tasks!``, which
  ``celery.apps.worker.on_cold_shutdown`` prints (``safe_say``, not a log record) when a cold shutdown
  starts: with ``REMAP_SIGTERM=SIGQUIT`` (the deploys' lesson on) that is every SIGTERM, a deploy's included, so the
  words about Ctrl+C mislead. The line says what the cold shutdown does instead.

Where a record does not match exactly, it passes unchanged: a failure the lab did not cause stays loud.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any, cast

import redis
from celery.signals import worker_init
from amqp.exceptions import RecoverableConnectionError

from lab.observe import doc_in
from shared.backend import ResultNotStored

OUTAGE_SECONDS = 10.0
"""After one ``count_starts`` failure is said, the next ones in this process within this time are dropped."""

GONE: tuple[type[BaseException], ...] = (redis.ConnectionError, redis.TimeoutError)
"""What a result backend that does not answer raises in redis-py (and so in ``count_starts``)."""

BACKEND_RETRY_SAY = "Connection to Redis lost: Retry (%s/%s) %s."
"""What ``celery.backends.redis.RedisBackend.on_connection_error`` logs at ``ERROR`` before each retry of a store
(``E_LOST``, Celery 5.5 to 5.7): one a retry, three a store with the lab's ``retry_policy``."""

CLOSED: tuple[type[BaseException], ...] = (RecoverableConnectionError, ConnectionError, OSError)
"""What an ack or a reject on a connection the broker no longer has raises (py-amqp, kombu)."""

TASK_FAILED_SAY = "Task %(name)s[%(id)s] %(description)s: %(exc)s"
"""What ``celery.app.trace.TraceInfo._log_error`` logs for a task's failure (``LOG_FAILURE``, Celery 5.5 to 5.7; at
``ERROR`` with its traceback when unexpected): the DLQ drain's, when the lab cuts the connection it reads the DLQ on."""

BROKER_LOST_SAY = "consumer: Connection to broker lost."
"""How ``celery.worker.consumer.consumer.CONNECTION_RETRY`` begins: Celery 5.7.0 logs it as ``'%s (%r)'`` with the
exception, 5.5.3 and 5.6.3 alone with ``exc_info=True`` (``Consumer.on_connection_error_after_connected``)."""

UNSTORED_INTERNAL = "RuntimeWarning: Exception raised outside body: reject requeue="
UNSTORED_SAY = "not stored, the result backend is gone"
"""Celery 5.5.3 has no ``except Reject: raise`` in ``celery.app.trace.build_tracer``'s ``trace_task``: the backend guard's
``ResultNotStored`` (``shared.backend``, whose words the second string is) raised by the result's store becomes an
internal error there, which ``report_internal_error`` warns of (``RuntimeWarning`` with its traceback, logged on
``py.warnings`` as the record's whole message since Python 3.11, bpo-46557; as ``"%s"`` and an argument before) and
whose failure the tracer logs again with its traceback (5.6.3 and 5.7.0 log neither)."""

BEAT_RETRY_SAY = "beat: Connection error: %s. Trying again in %s seconds..."
"""What ``celery.beat.Scheduler._ensure_connected``'s error handler logs at ``ERROR`` before each reconnect of the
beat's publisher (read in 5.5.3, 5.6.3 and 5.7.0; seen on 5.7.0 in CI): the embedded beat (``-B``) of a worker whose
link the lab cuts."""

COLD_SHUTDOWN_SAY = "worker: Hitting Ctrl+C again will terminate all running tasks!"
"""What ``celery.apps.worker.on_cold_shutdown`` prints (Celery 5.5 to 5.7)."""

COLD_SHUTDOWN_LINE = ("lab: cold shutdown (a SIGTERM: REMAP_SIGTERM=SIGQUIT makes it cold; or a second Ctrl+C): running "
                      "tasks get worker_soft_shutdown_timeout, then Celery stops them and their messages go back "
                      "unacknowledged to run again from the start")


def _qualname(receiver: object) -> str:
    return str(getattr(receiver, "__qualname__", ""))


def _chain(exc: BaseException | None) -> list[BaseException]:
    """An exception and every one it was raised while handling (``__context__``), at most 10 deep."""
    found: list[BaseException] = []
    while exc is not None and len(found) < 10:
        found.append(exc)
        exc = exc.__context__
    return found


def _current_task() -> str:
    """``doc68's parse_document`` or ``drain_dead_letters``: the task this pool process runs, in words."""
    from celery import current_task

    task = cast(Any, current_task)
    if not task:
        return "a task"
    name = str(getattr(task, "name", "") or "a task").rsplit(".", 1)[-1]
    found = doc_in(tuple(getattr(task.request, "args", None) or ()))
    return f"{found[1]}'s {name}" if found else name


class QuietFaults(logging.Filter):
    """Says each record of the lab's deploys, outages and cuts once (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._told_gone = 0.0  # time.monotonic() of the last count_starts failure said
        self._told_retry = 0.0  # time.monotonic() of the last retried store said

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return self.decide(record)
        except Exception:  # a courtesy: never lose a record over it
            return True

    def decide(self, record: logging.LogRecord) -> bool:
        msg, args = str(record.msg), record.args if isinstance(record.args, tuple) else ()
        if msg == "Signal handler %r raised: %r" and len(args) == 2:
            return self._count_starts(record, args[0], args[1])
        if record.name == "celery.backends.redis" and msg == BACKEND_RETRY_SAY and len(args) == 3:
            return self._store_retry(record, args[1])
        if record.name == "shared.dlq" and (msg.startswith("dead letter %s (%s) sent back to its queue")
                                             or msg.startswith("dead letter %s (%s) kept in the DLQ")):
            return False  # lab.worker_log.recovery says it, with the document's name
        if record.name == "shared.backend" and "not stored" in msg and "kept acked" in msg:
            return False  # lab.worker_log.recovery says it on store_failed
        if msg == "%s (%r)" and args and "Connection to broker lost" in str(args[0]):
            return _broker_lost(record, args[1])
        if msg.startswith(BROKER_LOST_SAY) and not args and record.exc_info is not None \
                and isinstance(record.exc_info[1], CLOSED):  # Celery 5.5 and 5.6: the same line, with its traceback
            return _broker_lost(record, record.exc_info[1])
        if msg.startswith("consumer: Cannot connect to %s: %s.") and len(args) == 3 and isinstance(args[1], CLOSED):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            return _say(record, f"lab: the broker connection could not be made again yet ({args[1]!r}; the lab cut it on "
                        f"purpose, a reconnect can meet the cut): Celery tries again ({args[2]})", keep_level=True)
        if msg.startswith("Task %s cannot be acknowledged after a connection loss") and args:
            request = args[0]
            found = doc_in(tuple(getattr(request, "args", None) or ()))
            name = str(getattr(request, "name", "") or "a task").rsplit(".", 1)[-1]
            who = f"{found[1]}'s {name}" if found else name
            return _say(record, f"lab: {who} was running when the connection was lost, and its message is back in the "
                        "broker: Celery cancels this run (worker_cancel_long_running_tasks_on_connection_loss), so the "
                        "redelivered copy is the only one", keep_level=True)
        if (msg.startswith("Couldn't ack %r, reason:") or msg.startswith("Couldn't reject %r, reason:")) \
                and len(args) == 2 and isinstance(args[1], CLOSED):
            what = "ack" if "ack %r" in msg else "reject"
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            return _say(record, f"lab: the {what} of delivery {args[0]} could not be sent, its connection was closed "
                        f"({args[1]!r}; the lab cuts it on purpose): RabbitMQ has put the message back with every other "
                        "it had delivered unacked on that connection, and delivers it again", keep_level=True)
        if msg == "Callback %r raised exception: %r" and len(args) == 2 and isinstance(args[1], CLOSED) \
                and any(name in repr(args[0]) for name in ("ack_log_error", "reject_log_error")):
            return False  # kombu's hub on the same failed ack: the "Couldn't ack" line before says it
        if record.name == "celery.bootsteps" and msg == "Error on %s %s: %r" and len(args) == 3 \
                and args[1] == "Hub" and isinstance(args[2], CLOSED):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            return _say(record, f"lab: the worker's event loop, closed as it shuts down, met a connection already gone "
                        f"({args[2]!r}; the lab cuts it on purpose): nothing it held is lost, the broker has it back",
                        keep_level=True)
        if record.name == "celery.app.trace" and msg == TASK_FAILED_SAY and isinstance(record.args, dict) \
                and str(record.args.get("name", "")).endswith(".drain_dead_letters") \
                and record.exc_info is not None and isinstance(record.exc_info[1], CLOSED):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            return _say(record, f"lab: the DLQ drain's broker connection was cut ({record.exc_info[1]!r}; the lab cuts "
                        "it on purpose): the letters it held unacked are back in the DLQ, and its next pass drains them",
                        keep_level=True)
        if record.name == "py.warnings" and UNSTORED_INTERNAL in record.getMessage() and UNSTORED_SAY in record.getMessage():
            return False  # Celery 5.5.3's own word on ResultNotStored: lab.worker_log's expected: line says it
        if record.name == "celery.app.trace" and record.exc_info is not None \
                and isinstance(record.exc_info[1], ResultNotStored):  # the same, on 5.5.3, as the task's failure
            return False
        if record.name == "celery.beat" and msg == BEAT_RETRY_SAY and len(args) == 2 and isinstance(args[0], CLOSED):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            return _say(record, f"lab: the beat in this worker lost its broker connection ({args[0]!r}; the lab cuts it "
                        f"on purpose): it connects again in {args[1]} s, then goes on with its schedule",
                        keep_level=True)
        if msg.startswith("Retrying refused callback publish for %r") and len(args) >= 5:
            return _say(record, f"lab: the connection closed while {args[0]} was being published as a chord's "
                        f"callback: Celery publishes it again ({args[1]}/{args[2]}): {args[4]!r}", keep_level=True)
        return True

    def _store_retry(self, record: logging.LogRecord, retries: object) -> bool:
        now = time.monotonic()
        if now - self._told_retry < OUTAGE_SECONDS:
            return False  # said already in this outage
        self._told_retry = now
        return _say(record, f"expected: the result backend is gone: Celery retries the store of {_current_task()} "
                    f"(the backend's retry_policy, {retries} retries); if it is still gone then, the store fails and "
                    f"the line after says what follows (repeats in the next {OUTAGE_SECONDS:.0f} s not shown)")

    def _count_starts(self, record: logging.LogRecord, receiver: object, exc: object) -> bool:
        name = _qualname(receiver)
        if not name.startswith("count_starts.<locals>.on_") or not isinstance(exc, GONE):
            return True
        now = time.monotonic()
        if now - self._told_gone < OUTAGE_SECONDS:
            return False  # said already in this outage
        self._told_gone = now
        stored = any(isinstance(e, ResultNotStored) for e in _chain(exc))
        what = "end" if name.endswith("on_postrun") else "start"
        return _say(record, f"expected: the result backend is gone ({type(exc).__name__}): count_starts could not "
                    f"count the {what} of {_current_task()}{' (its result was not stored either)' if stored else ''}; "
                    f"until the backend answers, starts and ends go uncounted (repeats in the next "
                    f"{OUTAGE_SECONDS:.0f} s not shown)")


def _broker_lost(record: logging.LogRecord, exc: object) -> bool:
    return _say(record, f"lab: the broker connection was lost ({exc!r}; the lab cuts it on purpose): RabbitMQ requeues "
                "every message this worker held unacked; Celery reconnects", keep_level=True)


def _say(record: logging.LogRecord, text: str, keep_level: bool = False) -> bool:
    record.msg, record.args = text, None
    record.exc_info, record.exc_text, record.stack_info = None, None, None
    if not keep_level:
        record.levelno, record.levelname = logging.INFO, "INFO"
    return True


FILTERED = ("celery.utils.dispatch.signal", "shared.dlq", "shared.backend", "celery.worker.consumer.consumer",
            "celery.app.amqp", "celery.backends.redis", "celery.worker.request", "kombu.asynchronous.hub",
            "celery.bootsteps", "celery.beat", "celery.app.trace", "py.warnings")
"""The loggers whose records ``QuietFaults`` reads (a logger's filter sees only the records made on that logger, not
those of its children: kombu's hub is named, or its failed-ack line passes, as it did on a spare worker of the cut)."""


def _quiet_cold_shutdown() -> None:
    """Replace ``celery.apps.worker.safe_say`` (looked up when called) by one that says the cold shutdown in words."""
    import celery.apps.worker as apps_worker

    original: Any = getattr(apps_worker, "safe_say")
    if getattr(original, "lab_quiet", False):
        return

    def safe_say(msg: str, f: Any = sys.__stderr__) -> None:
        original(COLD_SHUTDOWN_LINE if msg == COLD_SHUTDOWN_SAY else msg, f)

    setattr(safe_say, "lab_quiet", True)
    setattr(apps_worker, "safe_say", safe_say)


def _setup(**_: object) -> None:
    """The worker's main process, before its pool forks (the pool processes inherit the filters)."""
    quiet = QuietFaults()
    for name in FILTERED:
        logger = logging.getLogger(name)
        if not any(isinstance(f, QuietFaults) for f in logger.filters):
            logger.addFilter(quiet)
    _quiet_cold_shutdown()


def install() -> None:
    """Called by ``lab_app``: in a worker, at ``worker_init``, the filter and the cold shutdown's line."""
    worker_init.connect(_setup, weak=False)
