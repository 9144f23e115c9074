from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from lab.faults import (CRASH_ONCE, FAIL, FLAKE_FOREVER, FLAKY, HARD_HANG, POISON, SLOW_SECONDS, SLOW_UNTIL_RELEASED, SOFT_HANG,
                        Fault, PermanentError, TransientError, inject, release)
from lab.observe import run_prefix


@pytest.mark.parametrize("fault", [FAIL, CRASH_ONCE, POISON, FLAKY(2), FLAKE_FOREVER, SOFT_HANG, HARD_HANG])
def test_faults_round_trip_through_the_wire(fault: Fault) -> None:
    assert Fault.from_wire(fault.to_wire()) == fault


@pytest.mark.parametrize("text", ["NOPE", "FLAKY", "FLAKY:0", "FLAKY:x", "FAIL:2"])
def test_bad_fault_text_is_rejected(text: str) -> None:
    with pytest.raises(ValueError):
        Fault.from_wire(text)


def test_no_fault_and_fail() -> None:
    inject(None, 1)
    with pytest.raises(PermanentError, match="doc1 is malformed"):
        inject(FAIL, 1, doc="doc1")


def test_flaky_fails_exactly_its_count_then_succeeds() -> None:
    for attempt in (1, 2):
        with pytest.raises(TransientError):
            inject(FLAKY(2), attempt)
    inject(FLAKY(2), 3)
    with pytest.raises(TransientError):
        inject(FLAKE_FOREVER, 9)


def _inject_in_child(fault_wire: str, attempt: int) -> None:
    inject(Fault.from_wire(fault_wire), attempt)


@pytest.mark.parametrize(("fault", "attempt", "exitcode"), [(CRASH_ONCE, 1, -signal.SIGKILL), (CRASH_ONCE, 2, 0), (POISON, 5, -signal.SIGKILL)])
def test_crashes_sigkill_their_own_process(fault: Fault, attempt: int, exitcode: int) -> None:
    child = multiprocessing.get_context("fork").Process(target=_inject_in_child, args=(fault.to_wire(), attempt))
    child.start()
    child.join(timeout=10)
    assert child.exitcode == exitcode


def test_slow_until_released_is_slow_then_quick_once_its_run_is_released(redis_keys: list[str]) -> None:
    """What the deploys' and the outage's sides rely on: the same fault, in the same run, takes the slow
    document's time until ``release`` and none after it, and another run's release leaves it slow."""
    run, other = f"test-release-{time.time_ns()}", f"test-release-other-{time.time_ns()}"
    redis_keys.extend(f"{run_prefix(r)}slow-released" for r in (run, other))

    def took() -> float:
        started = time.monotonic()
        inject(SLOW_UNTIL_RELEASED, 1, doc="doc34", run=run)
        return time.monotonic() - started

    assert took() >= SLOW_SECONDS
    release(other)
    assert took() >= SLOW_SECONDS
    release(run)
    assert took() < SLOW_SECONDS / 4
    assert Fault.from_wire(SLOW_UNTIL_RELEASED.to_wire()) == SLOW_UNTIL_RELEASED



def _c_hang_in_child(seconds: float, out: str) -> None:
    """Arm SIGALRM (as ``@hard_timeout`` does) and SIGUSR1 (Celery's soft limit) to fire inside the hang."""
    from lab.faults import _hang_in_one_c_call  # pyright: ignore[reportPrivateUsage]
    began = time.monotonic()
    handled: list[float] = []

    def note(_number: int, _frame: object) -> None:
        handled.append(time.monotonic() - began)

    signal.signal(signal.SIGALRM, note)
    signal.signal(signal.SIGUSR1, note)
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    threading.Timer(0.4, os.kill, (os.getpid(), signal.SIGUSR1)).start()
    cpu = time.process_time()
    _hang_in_one_c_call(seconds)
    Path(out).write_text(json.dumps({"took": time.monotonic() - began, "handled": handled,
                                     "cpu": time.process_time() - cpu}))


def test_a_c_hang_runs_no_signal_handler_until_it_returns_and_uses_no_cpu(tmp_path: Path) -> None:
    """C_HANG (lab.faults): a SIGALRM at 0.2 s and a SIGUSR1 at 0.4 s run their Python handlers only once the
    1.5 s call returned; the hang sleeps (it spun a core before, ``sum(range(n))``)."""
    out = tmp_path / "hang.json"
    child = multiprocessing.get_context("fork").Process(target=_c_hang_in_child, args=(1.5, str(out)))
    child.start()
    child.join(timeout=20)
    assert child.exitcode == 0
    seen = json.loads(out.read_text())
    assert seen["took"] >= 1.5
    assert len(seen["handled"]) == 2 and min(seen["handled"]) >= 1.5, seen
    assert seen["cpu"] < 0.3, seen
