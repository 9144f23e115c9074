"""The lab's only way to wait: on an observable condition, with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable

POLL_SECONDS = 0.02


class Timeout(Exception):
    """A condition did not hold before its deadline."""


def wait_until(condition: Callable[[], bool], timeout: float, interval: float = POLL_SECONDS) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while True:
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
