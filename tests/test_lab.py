"""Integration: the CLI and the harness's failure paths on the real RabbitMQ and Redis. Each lesson's own runs
(fixed, broken, before its hard fix) are asserted in its own file, ``tests/lessons/test_<fm>.py``."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import run_all_fms
from lab import harness, workers
from lab.fm import ROOT
from lab.waiting import wait_until
from lab.workers import Worker

pytestmark = pytest.mark.usefixtures("real_services")


def test_cli_reports_bug_reproduced_and_pass(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_all_fms.main(["--include-fm0", "--only", "fm0", "fm1"]) == 0
    out = capsys.readouterr().out
    assert "fm0   BUG REPRODUCED S1" in out and "fm1   PASS G1" in out


def test_a_worker_that_cannot_start_is_reported_with_its_log() -> None:
    broken = dataclasses.replace(harness.load("fm1"), module="no_such_module_here")
    worker = Worker(broken, "t-" + str(os.getpid()), workers.LOG_DIR / f"unready-{os.getpid()}.log")
    worker.start()
    try:
        with pytest.raises(workers.WorkerFailed, match="exited with .* before it was ready"):
            worker.wait_ready(timeout=60)
    finally:
        worker.stop(grace=1)


def test_ctrl_c_stops_the_worker_and_exits_130() -> None:
    before: set[Path] = set(workers.WORKERS_DIR.glob("*")) if workers.WORKERS_DIR.exists() else set()
    proc = subprocess.Popen([sys.executable, "run_all_fms.py", "--only", "fm6"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: bool(set(workers.WORKERS_DIR.glob("*")) - before), timeout=60)
        started = {int(p.name) for p in set(workers.WORKERS_DIR.glob("*")) - before}
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    for pgid in started:
        assert wait_until(lambda: not _group_alive(pgid), timeout=10), f"worker group {pgid} left running"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
