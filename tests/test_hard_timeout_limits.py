"""``@hard_timeout``'s limits, each as its docstring states it, run (issue 38, item 4)."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from typing import Any, cast

import pytest
import redis

from lab.settings import NAMESPACE, backend_url
from shared.timeouts import HardTimeout, hard_timeout


class _Task:
    def __init__(self, name: str) -> None:
        self.name = name


def _run(seconds: float, body: Any, name: str = "t", soft: float | None = None) -> Any:
    return cast(Any, hard_timeout(seconds, soft=soft))(body)(_Task(name))


def test_a_nested_deadline_that_ends_keeps_the_outer_one() -> None:
    """Before: the inner body's end switched the process's one timer off; the outer body slept 3 s."""
    def inner(task: Any) -> str:
        return "inner done"

    def outer(task: Any) -> None:
        assert _run(0.3, inner, "inner") == "inner done"
        time.sleep(3)

    began = time.monotonic()
    with pytest.raises(HardTimeout, match="outer ran past its hard timeout of 1.0s"):
        _run(1.0, outer, "outer")
    assert 0.95 < time.monotonic() - began < 1.5
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_an_outer_deadline_that_comes_first_ends_the_inner_body() -> None:
    """Before: the inner timer replaced the outer one, which then fired at the inner's 2 s."""
    def inner(task: Any) -> None:
        time.sleep(3)

    def outer(task: Any) -> None:
        _run(2.0, inner, "inner")

    began = time.monotonic()
    with pytest.raises(HardTimeout, match="outer ran past its hard timeout of 0.5s"):
        _run(0.5, outer, "outer")
    assert time.monotonic() - began < 1.0


def test_a_timer_set_before_the_body_is_given_back() -> None:
    fired: list[float] = []
    previous = signal.signal(signal.SIGALRM, lambda signum, frame: fired.append(time.monotonic()))
    try:
        began = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, 0.6)
        def quick(task: Any) -> str:
            return "quick"

        assert _run(2.0, quick) == "quick"
        assert 0.4 < signal.getitimer(signal.ITIMER_REAL)[0] <= 0.6
        assert fired == [] and signal.getsignal(signal.SIGALRM) is not None
        deadline = time.monotonic() + 2
        while not fired and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(fired) == 1 and 0.55 < fired[0] - began < 1.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_bare_except_swallows_it_and_the_body_runs_on_without_a_deadline() -> None:
    """The limit: a bare ``except:`` (or ``except BaseException``) catches HardTimeout."""
    def body(task: Any) -> str:
        try:
            time.sleep(2)
        except:  # noqa: E722  (the limit under test)
            pass
        time.sleep(0.5)  # no second alarm comes
        return "swallowed"

    began = time.monotonic()
    assert _run(0.3, body) == "swallowed"
    assert 0.75 < time.monotonic() - began < 1.3


def test_a_lock_taken_without_a_finally_stays_taken() -> None:
    """The limit: HardTimeout lands wherever the body is; a lock released only on the normal path leaks."""
    lock = threading.Lock()

    def body(task: Any) -> None:
        lock.acquire()
        time.sleep(2)
        lock.release()

    with pytest.raises(HardTimeout):
        _run(0.3, body)
    assert lock.locked()
    lock.release()


@pytest.mark.usefixtures("real_services")
def test_landing_in_a_redis_py_read_leaves_the_client_usable() -> None:
    """The limit, read and run: the alarm lands inside redis-py's read of a BLPOP; redis-py disconnects that
    connection (its read raised), so the client's next command gets its own reply, not the BLPOP's."""
    r: Any = cast(Any, redis.Redis).from_url(backend_url(), decode_responses=True, socket_timeout=10)
    key = f"{NAMESPACE}:htl:{uuid.uuid4().hex[:8]}"
    try:
        def body(task: Any) -> Any:
            return r.blpop(f"{key}:list", timeout=5)

        began = time.monotonic()
        with pytest.raises(HardTimeout):
            _run(0.3, body)
        assert time.monotonic() - began < 1.0
        r.set(key, "mine")
        r.rpush(f"{key}:list", "late")
        assert r.get(key) == "mine"
        assert r.lrange(f"{key}:list", 0, -1) == ["late"]  # the interrupted BLPOP took nothing
    finally:
        r.delete(key, f"{key}:list")
        r.close()


def test_c_code_that_does_not_return_is_not_interrupted() -> None:
    """The limit: the alarm's Python handler runs only once a C call returns to the interpreter."""
    n = 4 * 10**7
    began = time.monotonic()
    sum(range(n))  # one C call
    alone = time.monotonic() - began
    assert alone > 0.3, f"the C call took only {alone:.2f}s here: raise n"
    done: list[float] = []

    def body(task: Any) -> None:
        sum(range(n))
        done.append(time.monotonic())  # never reached: the alarm raises as the C call returns
        time.sleep(2)

    began = time.monotonic()
    with pytest.raises(HardTimeout):
        _run(0.05, body)
    took = time.monotonic() - began
    assert done == [] and took > 0.5 * alone and took > 0.2, (took, alone)
