"""``@hard_timeout``: a deadline that raises inside the task body (the FM-6 fix).

How: ``signal.setitimer(ITIMER_REAL, seconds)``; the SIGALRM handler raises
``HardTimeout`` (``envelope_reason = "hard_timeout"``) in the main thread, in
whatever Python code is running, including code that catches and ignores
Celery's ``SoftTimeLimitExceeded``. The body unwinds, ``@enveloped`` records a
SUCCESS-state failure, the chord completes, and the pool slot is free again.

Pair it with ``soft_time_limit`` (the polite request, below the hard timeout)
and keep Celery's ``time_limit`` (above it) as the backstop for what a signal
cannot reach.

The wrapper keeps its deadline as ``hard_timeout_seconds`` (what a check reads).

Limits (state them to anyone who relies on it):

- main thread only: signals are delivered to the main thread, so it refuses to
  run elsewhere (prefork pool children run tasks on their main thread; the
  threads, eventlet and gevent pools do not);
- it cannot interrupt C code that does not return to the interpreter (a C
  extension stuck in a loop, a blocking call that retries on EINTR inside C);
  Celery's ``time_limit`` is what kills that;
- one timer per process: nesting ``@hard_timeout`` replaces the outer timer.
"""

from __future__ import annotations

import functools
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, Concatenate, ParamSpec, TypeVar

from celery import Task

P = ParamSpec("P")
R = TypeVar("R")


class HardTimeout(Exception):
    envelope_reason = "hard_timeout"


def hard_timeout(
    seconds: float,
) -> Callable[[Callable[Concatenate[Task[Any, Any], P], R]], Callable[Concatenate[Task[Any, Any], P], R]]:
    if seconds <= 0:
        raise ValueError(f"hard_timeout needs a positive number of seconds, got {seconds}")

    def decorate(fn: Callable[Concatenate[Task[Any, Any], P], R]) -> Callable[Concatenate[Task[Any, Any], P], R]:
        @functools.wraps(fn)
        def wrapper(task: Task[Any, Any], *args: P.args, **kwargs: P.kwargs) -> R:
            if threading.current_thread() is not threading.main_thread():
                raise RuntimeError("@hard_timeout needs the main thread (use the prefork pool)")

            def on_alarm(signum: int, frame: FrameType | None) -> None:
                raise HardTimeout(f"{task.name} ran past its hard timeout of {seconds}s")

            previous = signal.signal(signal.SIGALRM, on_alarm)
            signal.setitimer(signal.ITIMER_REAL, seconds)
            try:
                return fn(task, *args, **kwargs)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)

        setattr(wrapper, "hard_timeout_seconds", seconds)
        return wrapper

    return decorate
