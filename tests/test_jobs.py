"""``run_all_fms.py --jobs N``: the scheduler of runs at once, without services (the runs are stand-ins).

What it must keep: never two runs of the same code at once (they share its queues and Redis keys),
at most N at once, every run once, fm1's broken cell after fm0's run (it is a copy of it), the
reports and the timelines in the plan's order whatever order the runs end in. The real runs at once
are tested in tests/test_harness_failures.py (interrupted) and by ``make lab``, which runs with --jobs.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Callable

import pytest

import run_all_fms
from lab import harness, records
from lab.records import Check
from lab.records import Kind, RunReport
from lab.show import progress

PLAN = harness.plan(["fm1", "fm2", "fm3", "fm4", "fm5", "fm6"], include_fm0=True, prove=True)
BARRIER_SECONDS = 10.0


class StandIn:
    """``harness.run_one`` that records which codes run at once; the first ``together`` runs meet at a
    barrier, so a scheduler that ran them one after another would time out there."""

    def __init__(self, together: int) -> None:
        self.lock = threading.Lock()
        self.active: list[str] = []
        self.most = 0
        self.clash: list[str] = []
        self.started: list[tuple[str, Kind]] = []
        self.barrier = threading.Barrier(together, timeout=BARRIER_SECONDS)
        self.met = 0

    def __call__(self, fm: str, kind: Kind, on_stage: Callable[[str], None]) -> RunReport:
        code = harness.code_of(fm, kind)
        with self.lock:
            if code in self.active:
                self.clash.append(code)
            self.active.append(code)
            self.most = max(self.most, len(self.active))
            self.started.append((fm, kind))
            meet = self.met < self.barrier.parties
            self.met += meet
        on_stage("running the scenario")
        if meet:
            self.barrier.wait()
        with self.lock:
            self.active.remove(code)
        n = max(harness.number(fm), 1)
        return RunReport(fm, kind, code, 1 if kind == "bug" else n, checks=[Check(f"G{n}", True, "")])


def no_lines(report: RunReport) -> list[object]:
    return []


@pytest.fixture
def board_to_text(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    out = io.StringIO()
    original = progress.Board.__init__

    def plain(self: progress.Board, runs: int, file: object = None, live: bool | None = None) -> None:
        original(self, runs, file=out, live=False)

    monkeypatch.setattr(progress.Board, "__init__", plain)
    monkeypatch.setattr(progress, "timeline_of", no_lines)
    return out


@pytest.mark.parametrize("jobs", [2, 3])
def test_runs_at_once_never_share_code_and_come_back_in_plan_order(
        jobs: int, monkeypatch: pytest.MonkeyPatch, board_to_text: io.StringIO) -> None:
    stand_in = StandIn(together=jobs)
    monkeypatch.setattr(harness, "run_one", stand_in)
    reports = run_all_fms.run_plan(PLAN, jobs)
    assert [(r.fm, r.kind) for r in reports] == PLAN
    assert stand_in.clash == []
    assert stand_in.most == jobs  # the barrier held `jobs` runs together
    assert ("fm1", "broken") not in stand_in.started  # a copy of fm0's run, not a run of its own
    assert len(stand_in.started) == len(PLAN) - 1
    fm1_broken = next(r for r in reports if (r.fm, r.kind) == ("fm1", "broken"))
    assert (fm1_broken.code, fm1_broken.verdict) == ("fm0", "REPRODUCED")
    said = [line.split(":")[0] for line in board_to_text.getvalue().splitlines() if line.startswith("--- ")]
    assert said == [f"--- fm{i}" for i in range(7)]  # each FM's timelines once its runs are done, in order


def test_the_longest_scenarios_start_first(monkeypatch: pytest.MonkeyPatch, board_to_text: io.StringIO) -> None:
    stand_in = StandIn(together=3)
    monkeypatch.setattr(harness, "run_one", stand_in)
    run_all_fms.run_plan(PLAN, 3)
    assert stand_in.started[:3] == [("fm6", "fixed"), ("fm6", "broken"), ("fm6", "weak")]


def test_one_job_runs_the_plan_in_order(monkeypatch: pytest.MonkeyPatch, board_to_text: io.StringIO) -> None:
    stand_in = StandIn(together=1)
    monkeypatch.setattr(harness, "run_one", stand_in)
    run_all_fms.run_plan(PLAN, 1)
    assert stand_in.started == [run for run in PLAN if run != ("fm1", "broken")]
    assert stand_in.most == 1


def test_a_harness_error_in_one_run_ends_the_plan_once_the_others_stop(
        monkeypatch: pytest.MonkeyPatch, board_to_text: io.StringIO) -> None:
    stand_in = StandIn(together=1)

    def run_one(fm: str, kind: Kind, on_stage: Callable[[str], None]) -> RunReport:
        if (fm, kind) == ("fm6", "broken"):
            raise records.HarnessError("the broker refused fm5's queues")
        return stand_in(fm, kind, on_stage)

    monkeypatch.setattr(harness, "run_one", run_one)
    with pytest.raises(records.HarnessError, match="refused"):
        run_all_fms.run_plan(PLAN, 3)
    assert stand_in.active == []  # no run left going


def test_jobs_must_be_a_positive_number(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        run_all_fms.parse_args(["--jobs", "0"])
    assert exit_.value.code == 2
    assert "--jobs takes a whole number from 1 up" in capsys.readouterr().err
