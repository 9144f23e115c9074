"""lab/quiet_log.py: the lines the lab's deploys, outages and cuts cause, each said once (no broker needed)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import celery.apps.worker as apps_worker
import pytest
import redis

from lab import quiet_log
from lab.quiet_log import COLD_SHUTDOWN_LINE, COLD_SHUTDOWN_SAY, QuietFaults


def count_starts() -> Callable[..., None]:
    """A receiver named as ``shared.dlq.count_starts``' own are (``count_starts.<locals>.on_prerun``)."""

    def on_prerun(**_: object) -> None:
        pass

    return on_prerun


def other_receiver(**_: object) -> None:
    pass


def record(logger: str, level: int, msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord(logger, level, __file__, 1, msg, args, None)


def signal_error(receiver: object, exc: BaseException) -> logging.LogRecord:
    return record("celery.utils.dispatch.signal", logging.ERROR, "Signal handler %r raised: %r", receiver, exc)


def test_count_starts_meeting_the_backend_gone_is_one_expected_line_per_outage() -> None:
    quiet = QuietFaults()
    first = signal_error(count_starts(), redis.ConnectionError("Error 111 connecting"))
    assert quiet.filter(first) is True
    assert first.levelno == logging.INFO and first.exc_info is None
    assert first.getMessage().startswith("expected: the result backend is gone (ConnectionError): count_starts could "
                                         "not count the start of a task")
    assert quiet.filter(signal_error(count_starts(), redis.TimeoutError("timed out"))) is False  # the same outage


def test_the_backends_retried_store_is_one_expected_line_per_outage() -> None:
    """Celery's Redis backend logs ``E_LOST`` at ERROR before each retry of a store (three with the lab's policy)."""
    quiet = QuietFaults()
    first = record("celery.backends.redis", logging.ERROR, "Connection to Redis lost: Retry (%s/%s) %s.", 0, 3, "now")
    assert quiet.filter(first) is True
    assert first.levelno == logging.INFO
    assert first.getMessage().startswith("expected: the result backend is gone: Celery retries the store of a task "
                                         "(the backend's retry_policy, 3 retries)")
    again = record("celery.backends.redis", logging.ERROR, "Connection to Redis lost: Retry (%s/%s) %s.", 1, 3, "now")
    assert quiet.filter(again) is False  # the same outage
    other = record("celery.backends.redis", logging.ERROR, "Chord %r raised: %r", "id", ValueError("x"))
    assert quiet.filter(other) is True and other.levelno == logging.ERROR


@pytest.mark.parametrize(("receiver", "exc"), [(other_receiver, redis.ConnectionError("gone")),
                                               (count_starts(), ValueError("a bug"))])
def test_any_other_signal_handler_error_stays_as_celery_wrote_it(receiver: object, exc: BaseException) -> None:
    r = signal_error(receiver, exc)
    assert QuietFaults().filter(r) is True
    assert r.levelno == logging.ERROR and r.msg == "Signal handler %r raised: %r"


def test_the_drains_warnings_that_a_lab_line_says_are_dropped_and_a_parked_letter_is_not() -> None:
    quiet = QuietFaults()
    for msg in ("dead letter %s (%s) sent back to its queue: %s", "dead letter %s (%s) kept in the DLQ: %s"):
        assert quiet.filter(record("shared.dlq", logging.WARNING, msg, "id", "fm8.parse_document", "why")) is False
    parked = record("shared.dlq", logging.WARNING, "parked %d dead letters in %s, which no drain can place: %s", 1, "q", "x")
    assert quiet.filter(parked) is True and parked.levelno == logging.WARNING


def test_a_lost_broker_connection_is_a_lab_line_kept_at_warning() -> None:
    r = record("celery.worker.consumer.consumer", logging.WARNING, "%s (%r)",
               "consumer: Connection to broker lost. Trying to re-establish the connection...",
               OSError("Server unexpectedly closed connection"))
    assert QuietFaults().filter(r) is True
    assert r.levelno == logging.WARNING
    assert r.getMessage().startswith("lab: the broker connection was lost (OSError('Server unexpectedly closed "
                                     "connection'); the lab cuts it on purpose)")


def test_an_ack_on_the_cut_connection_is_a_lab_line_at_warning() -> None:
    from amqp.exceptions import RecoverableConnectionError

    r = record("celery.worker.request", logging.CRITICAL, "Couldn't ack %r, reason:%r", 151,
               RecoverableConnectionError("connection already closed"))
    assert QuietFaults().filter(r) is True
    assert r.levelno == logging.WARNING and r.exc_info is None
    assert r.getMessage().startswith("lab: the ack of delivery 151 could not be sent, its connection was closed")
    other = record("celery.worker.request", logging.CRITICAL, "Couldn't ack %r, reason:%r", 152, ValueError("a bug"))
    assert QuietFaults().filter(other) is True and other.levelno == logging.CRITICAL


def test_kombus_second_line_for_an_ack_on_the_cut_connection_is_dropped_and_other_callback_errors_pass() -> None:
    class _Ack:
        def __repr__(self) -> str:
            return "<promise@0x7f --> <bound method Message.ack_log_error of <Message object>>>"

    hub = "kombu.asynchronous.hub"
    cut = record(hub, logging.ERROR, "Callback %r raised exception: %r", _Ack(), BrokenPipeError(32, "Broken pipe"))
    assert QuietFaults().filter(cut) is False
    bug = record(hub, logging.ERROR, "Callback %r raised exception: %r", _Ack(), ValueError("a bug"))
    elsewhere = record(hub, logging.ERROR, "Callback %r raised exception: %r", "<promise of on_task>", BrokenPipeError())
    assert QuietFaults().filter(bug) is True and QuietFaults().filter(elsewhere) is True


@pytest.mark.usefixtures("restored_safe_say")
def test_every_logger_a_record_it_reads_is_made_on_gets_the_filter() -> None:
    """A logger's filter reads only the records made on that logger: each record the filter knows must come from a
    logger ``_setup`` filters (kombu's hub was missing: its failed-ack line passed on a fm9 spare worker in CI)."""
    made_on = {"celery.utils.dispatch.signal", "celery.backends.redis", "shared.dlq", "shared.backend",
               "celery.worker.consumer.consumer", "celery.worker.request", "celery.app.amqp", "kombu.asynchronous.hub",
               "celery.bootsteps", "celery.beat", "celery.app.trace", "py.warnings"}
    assert made_on <= set(quiet_log.FILTERED)
    loggers = [logging.getLogger(name) for name in quiet_log.FILTERED]
    before = [list(logger.filters) for logger in loggers]
    try:
        quiet_log._setup()  # pyright: ignore[reportPrivateUsage]
        assert any(isinstance(f, QuietFaults) for f in logging.getLogger("kombu.asynchronous.hub").filters)
    finally:
        for logger, filters in zip(loggers, before):
            logger.filters[:] = filters


@pytest.fixture
def restored_safe_say() -> Iterator[None]:
    original = getattr(apps_worker, "safe_say")
    yield
    setattr(apps_worker, "safe_say", original)


@pytest.mark.usefixtures("restored_safe_say")
def test_the_cold_shutdowns_ctrl_c_line_is_said_in_words_and_other_lines_pass(tmp_path: Path) -> None:
    quiet_log._quiet_cold_shutdown()  # pyright: ignore[reportPrivateUsage]
    quiet_log._quiet_cold_shutdown()  # pyright: ignore[reportPrivateUsage]  # twice: still one wrapper
    out = tmp_path / "window"
    with out.open("w") as f:
        getattr(apps_worker, "safe_say")(COLD_SHUTDOWN_SAY, f)
        getattr(apps_worker, "safe_say")("worker: Cold shutdown (MainProcess)", f)
    said = [line for line in out.read_text().splitlines() if line]  # safe_say writes a blank line before each
    assert said == [COLD_SHUTDOWN_LINE, "worker: Cold shutdown (MainProcess)"]


def test_a_reconnect_the_cut_met_is_a_lab_line_at_warning_and_another_cannot_connect_stays_loud() -> None:
    said = "consumer: Cannot connect to %s: %s.\n%s"
    cut = record("celery.worker.consumer.consumer", logging.ERROR, said, "amqp://guest:**@127.0.0.1:32851//",
                 ConnectionResetError(104, "Connection reset by peer"), "Trying again in 2.00 seconds... (1/100)")
    assert QuietFaults().filter(cut) is True and cut.levelno == logging.WARNING
    assert cut.getMessage().startswith("lab: the broker connection could not be made again yet")
    other = record("celery.worker.consumer.consumer", logging.ERROR, said, "amqp://x//", ValueError("a bug"), "")
    assert QuietFaults().filter(other) is True and other.levelno == logging.ERROR


def test_the_hubs_close_on_a_cut_connection_in_a_shutdown_is_a_lab_line_and_another_step_error_stays_loud() -> None:
    cut = record("celery.bootsteps", logging.ERROR, "Error on %s %s: %r", "terminating", "Hub",
                 BrokenPipeError(32, "Broken pipe"))
    assert QuietFaults().filter(cut) is True
    assert cut.levelname == "WARNING" and str(cut.msg).startswith("lab: the worker's event loop") and cut.exc_info is None
    other = record("celery.bootsteps", logging.ERROR, "Error on %s %s: %r", "terminating", "Pool", ValueError("a bug"))
    assert QuietFaults().filter(other) is True and other.levelname == "ERROR"


def test_an_embedded_beats_reconnect_over_a_cut_is_a_lab_line_and_another_beat_error_stays_loud() -> None:
    said = quiet_log.BEAT_RETRY_SAY
    cut = record("celery.beat", logging.ERROR, said, OSError("Server unexpectedly closed connection"), 2.0)
    assert QuietFaults().filter(cut) is True and cut.levelname == "WARNING" and cut.exc_info is None
    assert cut.getMessage().startswith("lab: the beat in this worker lost its broker connection")
    other = record("celery.beat", logging.ERROR, said, ValueError("a bug"), 2.0)
    assert QuietFaults().filter(other) is True and other.levelname == "ERROR"
    assert other.getMessage() == "beat: Connection error: a bug. Trying again in 2.0 seconds..."


def _task_failed(name: str, exc: BaseException) -> logging.LogRecord:
    """The record ``celery.app.trace`` makes for a task's unexpected failure (one mapping as its args)."""
    context = {"name": name, "id": "t1", "description": "raised unexpected", "exc": repr(exc)}
    made = logging.LogRecord("celery.app.trace", logging.ERROR, __file__, 1, quiet_log.TASK_FAILED_SAY, (context,),
                             (type(exc), exc, None))
    assert made.args == context  # logging takes a lone mapping as the args, as Celery's own call does
    return made


def test_the_dlq_drain_cut_mid_pass_is_a_lab_line_and_another_task_failure_stays_loud() -> None:
    cut = _task_failed("fm9_connection_loss.drain_dead_letters", OSError("Server unexpectedly closed connection"))
    assert QuietFaults().filter(cut) is True and cut.levelname == "WARNING" and cut.exc_info is None
    assert cut.getMessage().startswith("lab: the DLQ drain's broker connection was cut (OSError(")
    for other in (_task_failed("fm9_connection_loss.parse_document", OSError("closed")),
                  _task_failed("fm9_connection_loss.drain_dead_letters", ValueError("a bug"))):
        assert QuietFaults().filter(other) is True and other.levelname == "ERROR" and other.exc_info is not None


def test_a_lost_broker_connection_as_celery_5_5_and_5_6_log_it_is_the_same_lab_line_without_its_traceback() -> None:
    said = ("consumer: Connection to broker lost. Trying to re-establish the connection...")
    exc = OSError("Server unexpectedly closed connection")
    lost = logging.LogRecord("celery.worker.consumer.consumer", logging.WARNING, __file__, 1, said, None,
                             (type(exc), exc, None))
    assert QuietFaults().filter(lost) is True and lost.levelname == "WARNING" and lost.exc_info is None
    assert lost.getMessage().startswith("lab: the broker connection was lost (OSError(")
    bug = ValueError("a bug")
    other = logging.LogRecord("celery.worker.consumer.consumer", logging.WARNING, __file__, 1, said, None,
                              (type(bug), bug, None))
    assert QuietFaults().filter(other) is True and other.exc_info is not None and other.getMessage() == said


def test_celery_5_5s_two_tracebacks_for_a_result_not_stored_are_dropped_and_other_warnings_pass() -> None:
    from shared.backend import ResultNotStored

    unstored = ResultNotStored("SUCCESS of t1 not stored, the result backend is gone (ConnectionError: Error 111)")
    warned = record("py.warnings", logging.WARNING, "%s", f"/x/celery/app/trace.py:662: RuntimeWarning: Exception raised "
                    f"outside body: {unstored!r}:\nTraceback (most recent call last):\n")
    assert repr(unstored).startswith("reject requeue=False: ")  # what the warning quotes
    assert QuietFaults().filter(warned) is False
    whole = record("py.warnings", logging.WARNING, warned.getMessage())  # how Python 3.11.7's captureWarnings logs it
    assert QuietFaults().filter(whole) is False
    failed = logging.LogRecord("celery.app.trace", logging.WARNING, __file__, 1, "Task %(name)s[%(id)s] %(exc)s",
                               ({"name": "fm8.parse_document", "id": "t1", "exc": repr(unstored)},),
                               (type(unstored), unstored, None))
    assert QuietFaults().filter(failed) is False
    other = record("py.warnings", logging.WARNING, "%s", "/x/y.py:1: RuntimeWarning: Exception raised outside body: "
                   "ValueError('a bug')")
    assert QuietFaults().filter(other) is True and other.getMessage().endswith("ValueError('a bug')")
