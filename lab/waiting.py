"""The lab's only way to wait: on an observable condition, with a deadline.

It is also where an interruption lands. The CLI's handler for SIGINT, SIGTERM and
SIGHUP (``interrupt``) only records the signal; every ``wait_until`` raises
``Interrupted`` for a recorded one at its next look (every 20 ms while the lab
waits), and ``raise_if_interrupted`` does at each stage of a run. Why not raise
from the handler: Python runs it between any two bytecodes, so the exception can
land inside a finaliser (``__del__``), where it is printed and dropped, or in
the middle of an AMQP publish, after which kombu's graceful close of the
half-written connection waits for ever for an answer (seen in the lab's tries).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

POLL_SECONDS = 0.02


class Timeout(Exception):
    """A condition did not hold before its deadline."""


class Interrupted(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP, handled like Ctrl-C; ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_pending: list[int] = []


def interrupt(signum: int, frame: object = None) -> None:
    """A signal handler: record the signal (``wait_until`` raises it)."""
    _pending.append(signum)


def raise_if_interrupted() -> None:
    if _pending:
        raise Interrupted(_pending[0])


def forget_interrupts() -> None:
    _pending.clear()


def wait_until(condition: Callable[[], bool], timeout: float, interval: float = POLL_SECONDS,
               interruptible: bool = True) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout`` seconds pass (False).

    ``interruptible=False``: a recorded interruption does not end the wait (a background
    thread's cleanup, which must finish and has no caller to raise to)."""
    deadline = time.monotonic() + timeout
    while True:
        if interruptible:
            raise_if_interrupted()
        if condition():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(interval, left))


def require(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """``wait_until`` that raises ``Timeout`` naming ``what`` when the deadline passes."""
    if not wait_until(condition, timeout):
        raise Timeout(f"{what} (waited {timeout:.1f}s)")
