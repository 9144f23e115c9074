from __future__ import annotations

import math
import random
import signal
import time
from typing import Any

import pytest
from celery import Celery, Task
from celery.signals import task_retry

from shared.envelope import Result, enveloped
from lab.faults import FLAKY, PermanentError, TransientError, inject
from shared.retry import DelayQueues, RetryPolicy, transient_retryable
from shared.timeouts import HardTimeout, hard_timeout


def test_delays_double_and_jitter_stays_in_its_band() -> None:
    policy = RetryPolicy(max_retries=5, base=0.1, factor=2.0)
    rng = random.Random(7)
    delays = [policy.delay(k, rng) for k in range(5)]
    for k, d in enumerate(delays):
        low, high = policy.bounds(k)
        assert math.isclose(low, 0.1 * 2**k) and math.isclose(high, 2 * low)
        assert low <= d < high
    assert delays == sorted(delays) and len(set(delays)) == 5


def test_cap_bounds_the_delay() -> None:
    assert RetryPolicy(base=1.0, cap=3.0).planned(10) == 3.0


def _task(app: Celery, body: Any) -> Task[Any, Any]:
    return app.task(bind=True, shared=False)(body)


def test_transient_errors_retry_until_success(local_app: Celery) -> None:
    seen: list[tuple[int, float]] = []
    attempts: list[int] = []

    def body(task: Task[Any, Any]) -> str:
        attempts.append(1)
        inject(FLAKY(2), len(attempts))
        return "parsed"

    def on_retry(sender: object = None, request: Any = None, reason: Any = None, **_: object) -> None:
        seen.append((int(request.retries) + 1, float(reason.when)))  # Celery's own signal: no hook in the decorator

    policy = RetryPolicy(max_retries=3, base=0.1)
    wrapped = enveloped(transient_retryable(policy)(body))
    task_retry.connect(on_retry, weak=False)
    try:
        result = _task(local_app, wrapped).apply()  # eager: Celery runs each retry at once
    finally:
        task_retry.disconnect(on_retry)
    env = Result.from_wire(result.get())
    assert env.ok and env.payload == "parsed" and len(attempts) == 3
    assert [n for n, _ in seen] == [1, 2]
    assert all(policy.bounds(n - 1)[0] <= d < policy.bounds(n - 1)[1] for n, d in seen)


def test_exhaustion_is_recorded_as_retries_exhausted(local_app: Celery) -> None:
    attempts: list[int] = []

    def body(task: Task[Any, Any]) -> str:
        attempts.append(1)
        raise TransientError("503")

    wrapped = enveloped(transient_retryable(RetryPolicy(max_retries=3, base=0.01))(body))
    env = Result.from_wire(_task(local_app, wrapped).apply().get())
    assert (env.status, env.reason, len(attempts)) == ("FAILURE", "retries_exhausted", 4)
    assert "gave up after 4 attempts" in (env.error or "")


def test_permanent_errors_are_not_retried(local_app: Celery) -> None:
    attempts: list[int] = []

    def body(task: Task[Any, Any]) -> str:
        attempts.append(1)
        raise PermanentError("bad")

    wrapped = enveloped(transient_retryable(RetryPolicy())(body))
    env = Result.from_wire(_task(local_app, wrapped).apply().get())
    assert (env.reason, len(attempts)) == ("error", 1)


def test_hard_timeout_interrupts_the_body_and_restores_the_handler(local_app: Celery) -> None:
    def body(task: Task[Any, Any]) -> None:
        time.sleep(5)

    before = signal.getsignal(signal.SIGALRM)
    task = _task(local_app, body)
    started = time.monotonic()
    with pytest.raises(HardTimeout):
        hard_timeout(0.2)(body)(task)
    assert time.monotonic() - started < 2
    assert signal.getsignal(signal.SIGALRM) == before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_hard_timeout_refuses_a_non_positive_deadline() -> None:
    with pytest.raises(ValueError):
        hard_timeout(0)


def test_only_the_hard_timeout_stops_a_hang_that_ignores_the_soft_limit(local_app: Celery) -> None:
    """The soft limit arrives as a signal that raises SoftTimeLimitExceeded (as billiard's does)."""
    import os
    import threading

    from celery.exceptions import SoftTimeLimitExceeded

    from lab.faults import HARD_HANG

    def on_soft(signum: int, frame: object) -> None:
        raise SoftTimeLimitExceeded()

    previous = signal.signal(signal.SIGUSR1, on_soft)
    soft = threading.Timer(0.1, os.kill, args=(os.getpid(), signal.SIGUSR1))

    def body(task: Task[Any, Any]) -> None:
        inject(HARD_HANG, 1)

    try:
        soft.start()
        started = time.monotonic()
        with pytest.raises(HardTimeout):
            hard_timeout(0.5)(body)(_task(local_app, body))
        assert 0.45 < time.monotonic() - started < 3
    finally:
        soft.cancel()
        signal.signal(signal.SIGUSR1, previous)


def _sleep_swallowing_exceptions(seconds: float) -> int:
    """Sleep ``seconds`` inside ``except Exception: continue``; return how many it swallowed."""
    swallowed, deadline = 0, time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            time.sleep(left)
        except Exception:
            swallowed += 1
            continue
    return swallowed


def test_an_exception_raised_by_an_alarm_is_swallowed_by_a_broad_handler() -> None:
    """Why HardTimeout is a BaseException: the same alarm raising an Exception goes nowhere."""

    def on_alarm(signum: int, frame: object) -> None:
        raise RuntimeError("deadline")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        assert _sleep_swallowing_exceptions(0.6) == 1  # raised, swallowed, and the body slept on
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_a_broad_except_exception_cannot_swallow_the_hard_timeout(local_app: Celery) -> None:
    """fm6's doc10: HardTimeout passes ``except Exception`` and @enveloped records it."""

    def body(task: Task[Any, Any]) -> int:
        return _sleep_swallowing_exceptions(30)

    started = time.monotonic()
    wire = enveloped(hard_timeout(0.2)(body))(_task(local_app, body))
    envelope = Result.from_wire(wire)
    assert envelope.reason == "hard_timeout" and (envelope.error or "").startswith("HardTimeout")
    assert time.monotonic() - started < 2
    assert not isinstance(HardTimeout("x"), Exception)


def test_enveloped_lets_system_exit_through(local_app: Celery) -> None:
    def body(task: Task[Any, Any]) -> None:
        raise SystemExit(3)

    with pytest.raises(SystemExit):
        enveloped(body)(_task(local_app, body))


def test_delay_queues_split_delays_into_doubling_buckets_and_slices() -> None:
    """shared/retry.py: bucket b holds [base 2**b, base 2**(b+1)) in four slices; longer waits clamp."""
    d = DelayQueues("ns.fm5.tasks", RetryPolicy(max_retries=3, base=0.1))
    assert d.buckets == 3  # up to the longest jittered delay, 2 x 0.4 s
    assert [d.queue_for(x).name for x in (0.1, 0.19, 0.26, 0.79, 1.5)] == [
        "ns.fm5.tasks.retry.0.0", "ns.fm5.tasks.retry.0.3", "ns.fm5.tasks.retry.1.1", "ns.fm5.tasks.retry.2.3",
        "ns.fm5.tasks.retry.2.3"]
    queues = d.queues()
    assert len(queues) == 12 and all(str(q.name).startswith("ns.fm5.tasks.retry.") for q in queues)
    assert all((q.queue_arguments or {}) == {"x-dead-letter-exchange": "ns.fm5.tasks",
                                             "x-dead-letter-routing-key": "ns.fm5.tasks"} for q in queues)


def test_a_retry_after_longer_than_the_backoff_is_honoured(local_app: Celery) -> None:
    seen: list[float] = []

    def on_retry(sender: object = None, reason: object = None, **_: object) -> None:
        seen.append(float(getattr(reason, "when", 0.0)))

    def body(task: Task[Any, Any]) -> None:
        raise TransientError("429", retry_after=2.5)

    task_retry.connect(on_retry, weak=False)
    try:
        task = _task(local_app, transient_retryable(RetryPolicy(max_retries=1, base=0.1))(body))
        task.apply()
    finally:
        task_retry.disconnect(on_retry)
    assert seen == [2.5]
