"""``@hard_timeout`` and ``BackstopRequest``: deadlines that end a chord member as an envelope (FM-6).

``@hard_timeout(seconds, soft=None)`` (knobs: the deadlines, kept on the wrapper as
``hard_timeout_seconds`` and ``soft_timeout_seconds``, which a check reads). How:
``signal.setitimer(ITIMER_REAL, seconds)``; the SIGALRM handler raises
``HardTimeout`` (``envelope_reason = "hard_timeout"``) in the main thread, in
whatever Python code is running, including code that catches and ignores
Celery's ``SoftTimeLimitExceeded``. ``HardTimeout`` is a ``BaseException``, not
an ``Exception``, so a body's ``except Exception`` cannot swallow it either,
and ``@enveloped`` has to record a ``BaseException`` whose class declares an
``envelope_reason`` as well as any ``Exception``. The body unwinds,
``@enveloped`` records a SUCCESS-state failure, the chord completes, and the
pool slot is free again.

``soft=`` (below ``seconds``) asks first: at the soft deadline the handler raises
Celery's own ``SoftTimeLimitExceeded``, so code written to cooperate with Celery's
soft limit cooperates unchanged, and re-arms the timer for the rest of the time.
The timer starts when the body starts and is cancelled when it ends (a nested
``finally``, so that an alarm landing in the first one still cancels it, and an
alarm that comes after the body does nothing): nothing of it fires outside the
body, inside ``@enveloped``. One ``ITIMER_REAL`` serves every body running under
``@hard_timeout`` in the process: it is armed for the earliest of their deadlines.

Do not pair it with Celery's ``soft_time_limit``. That limit is billiard's: the
worker's main process starts its own timer when the job is accepted and sends the
pool process ``SIGUSR1`` (``billiard.pool.TimeoutHandler.on_soft_timeout``), whose
handler (``soft_timeout_sighandler``) raises ``SoftTimeLimitExceeded`` wherever that
process is at the moment: also after a body that ended just in time returned,
while ``celery.app.trace`` stores its result, where no decorator catches it, and the
trace stores FAILURE (``on_error``; or ``EncodeError(SoftTimeLimitExceeded())`` when
it lands in the encoding). FM-6's hard variant shows it (``doc28``). A Celery soft
limit above the in-body deadlines would add nothing: it could only fire once they
failed, in C code, where its Python handler cannot run either. Keep Celery's
``time_limit`` (above the hard timeout) as the backstop for what a signal cannot
reach, with ``BackstopRequest`` as the task's ``Request`` class.

``BackstopRequest`` (a ``celery.worker.request.Request``; attach it with
``@app.task(..., Request=BackstopRequest)``) changes what the worker's main
process records when ``time_limit`` expires. In Celery 5.5 to 5.7 (with billiard
4.3.2, which all three environments of ``make matrix`` pin), billiard's
``TimeoutHandler.on_hard_timeout`` first sets the job's result to
``TimeLimitExceeded``, which calls ``Request.on_failure``, then calls
``Request.on_timeout(soft=False)``, then ``Pool._trywaitkill`` sends the pool process
billiard's ``TERM_SIGNAL`` (``Popen.terminate``: SIGTERM, or the signal ``REMAP_SIGTERM``
names, SIGQUIT in the lab's workers), waits 0.1 s and sends SIGKILL (read in billiard
4.3.2; the pool process's handler for that signal is Python code, so a process stuck in
C dies of the SIGKILL: FM-6's ``C_HANG`` runs it). Celery's
``on_failure`` and ``on_timeout`` each call ``backend.mark_as_failure``, and the
chord becomes ``ChordError`` (5.7's ``on_timeout`` also runs ``Task.on_failure``
and the ``task_failure`` signal; 5.6 and 5.7 store nothing there during a cold shutdown).
``BackstopRequest`` handles both calls once: it sends what the trace would have
sent after the body (the request's link callbacks and the next step of its
chain) with a failure envelope, stores that envelope with
``backend.mark_as_done``, whose ``on_chord_part_return`` counts the member, so
the chord body runs, acks the message (``task_acks_late``) and sends
``task-succeeded``. The backend calls run on a thread of their own (two threads
per worker process, ``_settling``), not on the worker's main loop, which would
otherwise take no message, heartbeat or ack while a backend that hangs uses up
its socket timeouts and retries (tests/test_backstop_loop.py: the next message
started 0.10 s after it was sent, 6.1 s before); the ack and the event go back to
the loop (kombu's ``Hub.call_soon``, which takes a lock in kombu 5.5.4 to 5.7.0).
An envelope that cannot be stored (the backend's retries used up) is logged and
its message requeued (``reject(requeue=True)``): it runs again, a whole run
(same test). A request Celery cancelled before its limit expired (``Request.cancel`` on a lost
broker connection, FM-9, or in a cold shutdown, FM-7, sets ``Request._already_cancelled`` in
5.5.3, 5.6.3 and 5.7.0) is not settled: its delivery went with the connection, and its redelivered
copy is the run that counts; an envelope stored over the cancel's RETRY would make
``worker_deduplicate_successful_tasks`` ack that copy unrun (a run reached this when the cancel's
signal landed while the pool process held its signals, ``shared/stored_members.py``:
tests/test_stored_members.py, ``cancelled-then-time-limit``). A SUCCESS the pool process stored
is still counted. A warm shutdown waits for a settling thread that still retries
(not proven by a run). Its reason is ``time_limit``, apart from ``hard_timeout``: the process was
killed, no ``finally`` ran and the pool process was replaced; ``attempts`` is
``request.retries + 1``. No
WorkerLostError follows: the job is already settled when its process dies.

Limits (state them to anyone who relies on it; tests/test_hard_timeout_limits.py runs each one marked
"run"):

- ``@hard_timeout`` runs on the main thread only: signals are delivered to the
  main thread, so it refuses to run elsewhere (prefork pool children run tasks
  on their main thread; the threads, eventlet and gevent pools do not);
- ``@hard_timeout`` cannot interrupt C code that does not return to the
  interpreter (a C extension stuck in a loop, a blocking call that retries on
  EINTR inside C): only ``time_limit`` ends that, by killing the process, and
  neither ``finally`` blocks nor ``task_postrun`` run in it (run: the alarm's
  ``HardTimeout`` comes only as a ``sum(range(n))`` returns);
- ``HardTimeout`` is raised wherever the body's Python is at that moment: inside
  a library's I/O or under a lock. A lock released only on the normal path stays
  taken (run); a ``with`` block releases it. Landing in redis-py's read of a reply
  (a ``BLPOP``, redis-py 5.2.1, 6.4.0 and 8.1.0), redis-py drops that connection,
  and the client's next command gets its own reply (run). Inside kombu or py-amqp
  I/O a connection can be left mid-frame (not proven by a run): do not publish
  from a body under a deadline without a ``finally`` that closes what it opened;
- a bare ``except:`` or ``except BaseException:`` in the body catches
  ``HardTimeout``, and the body then runs on with no deadline left (run);
- nested ``@hard_timeout`` bodies keep every deadline: the earliest one fires and
  ends its own body and every body inside it, and when an inner body ends the
  outer deadline still holds (run, both orders); a ``setitimer`` timer that other
  code set before the outermost body is given back, with what was left of it (run);
- ``BackstopRequest`` acks even with ``task_acks_on_timeout=False`` (Celery 5.7;
  in 5.5 and 5.6 ``task_acks_on_failure_or_timeout=False``), where Celery would
  requeue: the envelope is the member's last word. A rerun's result would count in
  the chord a second time on 5.5 and 5.6 (their join adds each different result)
  and be dropped on 5.7 (its join counts a task id once); it stores nothing
  when the pool process had already stored an
  outcome (the kill can race the result), nor during a cold shutdown (Celery's
  own handling then); a kill that lands after the pool process stored SUCCESS
  and before the Redis backend counted it for the chord
  (``celery.backends.base.Backend.mark_as_done`` stores, then calls
  ``on_chord_part_return``) would leave a member stored and never counted, the chord
  waiting for ever, in silence: when it finds SUCCESS stored it counts the stored
  result (``shared.stored_members.count_stored``: once, a member already counted is
  not counted again; its cost, a read of the join on 5.5 and 5.6, only then;
  tests/test_stored_members.py, Celery 5.5.3 to 5.7.0); it sends no ``task_failure`` signal and calls no
  ``Task.on_failure`` (the stored state is SUCCESS, as for any enveloped
  failure).
"""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any, Concatenate, ParamSpec, TypeVar

from celery import Task, states
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded
from celery.worker import state as worker_state
from celery.worker.request import Request
from celery.worker.state import task_ready
from kombu.asynchronous import get_event_loop

from shared.envelope import Result, send_next
from shared.stored_members import count_stored

P = ParamSpec("P")
R = TypeVar("R")


logger = logging.getLogger(__name__)

_settling = ThreadPoolExecutor(max_workers=2, thread_name_prefix="backstop")
"""Where ``BackstopRequest`` talks to the backend, off the worker's main loop."""


class HardTimeout(BaseException):
    """``@hard_timeout``'s deadline passed; a ``BaseException`` so ``except Exception`` lets it through."""

    envelope_reason = "hard_timeout"


@dataclass
class _Deadline:
    """One running ``@hard_timeout`` body: its deadlines on ``time.monotonic()``."""

    name: str
    seconds: float
    soft: float | None
    hard_at: float
    soft_at: float | None
    asked: bool = False  # the soft deadline has raised
    over: bool = False  # the body ended, or its hard deadline (or an outer one) raised

    def next_at(self) -> float:
        return self.soft_at if self.soft_at is not None and not self.asked else self.hard_at


_running: list[_Deadline] = []
"""The bodies running under ``@hard_timeout`` in this process, outermost first (main thread only)."""
_EARLY = 0.002
"""An alarm this close to a deadline counts as at it (``setitimer`` can fire a little early)."""


def _arm() -> None:
    waiting = [d.next_at() for d in _running if not d.over]
    signal.setitimer(signal.ITIMER_REAL, max(min(waiting) - time.monotonic(), 0.0001) if waiting else 0)


def _on_alarm(signum: int, frame: FrameType | None) -> None:
    now = time.monotonic()
    due = [d for d in _running if not d.over and d.next_at() <= now + _EARLY]
    if not due:  # early, or for a body that is over: wait for the next deadline
        _arm()
        return
    first = min(due, key=_Deadline.next_at)  # the earliest; on a tie the outermost (min keeps the first)
    if first.soft_at is not None and not first.asked:
        first.asked = True  # ask, and leave the rest of the time to the hard deadline
        _arm()
        raise SoftTimeLimitExceeded(f"{first.name} ran past its soft deadline of {first.soft}s")
    for inner in _running[_running.index(first):]:  # this body and every body inside it end here
        inner.over = True
    _arm()
    raise HardTimeout(f"{first.name} ran past its hard timeout of {first.seconds}s")


def hard_timeout(
    seconds: float, soft: float | None = None,
) -> Callable[[Callable[Concatenate[Task[Any, Any], P], R]], Callable[Concatenate[Task[Any, Any], P], R]]:
    if seconds <= 0:
        raise ValueError(f"hard_timeout needs a positive number of seconds, got {seconds}")
    if soft is not None and not 0 < soft < seconds:
        raise ValueError(f"hard_timeout's soft deadline must lie between 0 and {seconds}s, got {soft}")

    def decorate(fn: Callable[Concatenate[Task[Any, Any], P], R]) -> Callable[Concatenate[Task[Any, Any], P], R]:
        @functools.wraps(fn)
        def wrapper(task: Task[Any, Any], *args: P.args, **kwargs: P.kwargs) -> R:
            if threading.current_thread() is not threading.main_thread():
                raise RuntimeError("@hard_timeout needs the main thread (use the prefork pool)")
            now = time.monotonic()
            mine = _Deadline(str(task.name), seconds, soft, now + seconds, None if soft is None else now + soft)
            outermost = not _running
            if outermost:  # the process's own SIGALRM handler and timer, given back when the outermost body ends
                previous = signal.signal(signal.SIGALRM, _on_alarm)
                left = signal.getitimer(signal.ITIMER_REAL)[0]
                theirs = now + left if left > 0 else None
            else:
                previous, theirs = None, None
            _running.append(mine)
            _arm()
            try:
                try:
                    return fn(task, *args, **kwargs)
                finally:
                    mine.over = True  # from here on no alarm raises for this body
            finally:  # reached even when an alarm raised inside the inner finally, before it marked the body over
                _running.remove(mine)
                if outermost:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    signal.signal(signal.SIGALRM, previous if previous is not None else signal.SIG_DFL)
                    if theirs is not None:  # a timer someone else set before: what was left of it
                        signal.setitimer(signal.ITIMER_REAL, max(theirs - time.monotonic(), 0.0001))
                else:
                    _arm()  # the outer deadlines go on

        setattr(wrapper, "hard_timeout_seconds", seconds)
        setattr(wrapper, "soft_timeout_seconds", soft)
        return wrapper

    return decorate


class BackstopRequest(Request):
    """Celery's ``Request``, recording an expired ``time_limit`` as a SUCCESS-state envelope."""

    _time_limit_handled = False

    def on_failure(self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False) -> None:
        exc = getattr(exc_info, "exception", None)
        exc = getattr(exc, "exc", exc)  # billiard's ExceptionWithTraceback, which Celery's on_failure unwraps too
        if isinstance(exc, TimeLimitExceeded) and not worker_state.should_terminate:
            self._on_time_limit(exc.args[0] if exc.args else "?")  # billiard's on_hard_timeout, first call
            return
        super().on_failure(exc_info, send_failed_event, return_ok)

    def on_timeout(self, soft: bool, timeout: float) -> None:
        if soft or worker_state.should_terminate:
            super().on_timeout(soft, timeout)
            return
        self._on_time_limit(timeout)  # billiard's on_hard_timeout, second call

    def _on_time_limit(self, timeout: object) -> None:
        if self._time_limit_handled:
            return
        self._time_limit_handled = True
        task_ready(self)
        message = f"TimeLimitExceeded: {self.name} ran past its time_limit of {timeout}s, and its pool process is killed"
        logger.error("%s[%s]: %s", self.name, self.id, message)
        hub = get_event_loop()
        if hub is None:  # no event loop (a worker without one): settle here, on this thread
            self._settle(message, lambda step: step())
            return
        # The backend calls can take its whole retry budget while it is gone: off the worker's main loop. The ack
        # (or the reject) and the event go back to the loop (kombu's Hub.call_soon takes a lock: thread-safe).
        _settling.submit(self._settle, message, lambda step: hub.call_soon(step))

    def _settle(self, message: str, on_loop: Callable[[Callable[[], None]], object]) -> None:
        """Store the envelope unless the pool process stored an outcome (a stored SUCCESS is counted into its chord,
        once); then ack (or, when the store failed, requeue) on the loop."""
        context: Any = getattr(self, "_context")  # the task's Context (celery-types does not declare it)
        cancelled = self._cancelled()
        try:
            envelope = None
            if (stored := self._stored_state()) == states.SUCCESS:
                self._count_stored()  # the kill may have landed between the pool process's store and its count
            elif cancelled:  # its redelivered copy runs: no envelope over the cancel's RETRY, no ack
                logger.warning("%s[%s]: its time_limit expired after Celery cancelled it; nothing stored, its "
                               "redelivered copy runs", self.name, self.id)
                return
            elif stored not in states.READY_STATES:
                envelope = Result[Any].failure(message, "time_limit", int(context.retries or 0) + 1).to_wire()
                send_next(self.task.app, context, envelope)  # what the trace would have sent after the body
                self.task.backend.mark_as_done(self.id, envelope, request=context)  # counts the chord member
        except Exception as exc:  # the envelope is not stored: the message runs again (a whole run)
            logger.error("%s[%s]: time_limit envelope not stored (%s: %s); its message is requeued", self.name,
                         self.id, type(exc).__name__, exc)
            on_loop(lambda: self.reject(requeue=True) if self.task.acks_late and not cancelled else None)
            return

        def settled() -> None:
            if envelope is not None:
                self.send_event("task-succeeded", result=repr(envelope), runtime=None)
            if self.task.acks_late and not cancelled:
                self.acknowledge()

        on_loop(settled)

    def _cancelled(self) -> bool:
        """Whether Celery cancelled this request (``Request.cancel``) before its limit expired."""
        return bool(getattr(self, "_already_cancelled", False))

    def _stored_state(self) -> str | None:
        """The outcome the pool process stored before the kill, if any (the timer can win that race)."""
        try:
            return str(self.task.backend.get_state(self.id))
        except Exception:  # the backend cannot say: store the envelope, as the trace would
            return None

    def _count_stored(self) -> None:
        """Count the stored SUCCESS into its chord, unless it is counted already."""
        count_stored(self.task.app, self)

