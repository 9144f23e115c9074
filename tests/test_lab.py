"""Integration: every cell of the matrix, through the harness's own code, on the real
RabbitMQ and Redis. Each test asserts the exact numbers, not only the verdict."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import cast

import pytest

import run_all_fms
from lab import harness, records
from lab import workers
from lessons.fm7.checks import MIN_DEPLOYS
from lab.fm import ROOT
from lab.records import RunReport
from lab.workers import Worker
from lab.records import Observations
from lab.waiting import wait_until
from lessons.fm3.scenario import foreign_letters

pytestmark = pytest.mark.usefixtures("real_services")

# attempts per document of scenario N on FM N's (fixed) code
FIXED_ATTEMPTS = {"doc1": 1, "doc2": 1, "doc3": 2, "doc4": 3, "doc5": 3, "doc6": 4, "doc7": 1, "doc8": 1,
                  "doc9": 0, "doc10": 1, "doc11": 1, **{f"doc{i}": 2 for i in range(12, 28)}, "doc28": 1, "doc29": 0,
                  "doc30": 1}
FAILED_REASONS = {"doc1": "error", "doc4": "dead_lettered", "doc6": "retries_exhausted", "doc7": "soft_timeout",
                  "doc8": "hard_timeout", "doc9": "dead_lettered", "doc10": "hard_timeout", "doc11": "time_limit",
                  "doc29": "hard_timeout", "doc30": "time_limit"}


def quiet(_: str) -> None:
    pass


LAB_JOBS = 2
"""The module's lab runs, two at once (``run_all_fms.run_at_once``, as ``make matrix`` runs them): never two
on one program's code, the longest scenarios first."""
_CELLS = {"test_fixed_fm_holds_every_guarantee_up_to_its_own": "fixed",
          "test_a_fixed_runs_worker_windows_hold_no_traceback_and_no_error": "fixed",
          "test_earlier_code_shows_the_symptom_of_the_later_scenario": "broken",
          "test_without_its_hard_fix_an_fm_shows_the_hard_variants_symptom": "weak"}


def _cell(item: pytest.Item) -> tuple[str, records.Kind] | None:
    """The harness run a collected test of this module asserts on (None: it runs its own)."""
    name = getattr(item, "originalname", item.name)
    if name == "test_fm0_reproduces_its_bug":
        return ("fm0", "bug")
    kind = _CELLS.get(name)
    callspec = getattr(item, "callspec", None)
    if kind is None or callspec is None:
        return None
    return (f"fm{callspec.params['n']}", cast(records.Kind, kind))


@pytest.fixture(scope="module")
def lab_runs(request: pytest.FixtureRequest) -> dict[tuple[str, str], RunReport]:
    """Every run the selected tests of this module need, made once, ``LAB_JOBS`` at once."""
    here = str(request.path)
    wanted = sorted({c for item in request.session.items if str(item.path) == here and (c := _cell(item))})
    reports: dict[tuple[str, str], RunReport] = {}

    def run(i: int) -> None:
        fm, kind = wanted[i]
        reports[wanted[i]] = harness.run_one(fm, kind, quiet)

    run_all_fms.run_at_once(wanted, LAB_JOBS, run, lambda: None)
    return reports


def observed(report: RunReport) -> Observations:
    assert report.error is None, report.error
    assert report.observations is not None
    return report.observations


@pytest.mark.parametrize("n", range(1, 10))
def test_fixed_fm_holds_every_guarantee_up_to_its_own(n: int, lab_runs: dict[tuple[str, str], RunReport]) -> None:
    report = lab_runs[(f"fm{n}", "fixed")]
    obs = observed(report)
    assert [c.label for c in report.checks] == [f"G{i}" for i in range(1, n + 1)]
    assert [c for c in report.checks if not c.ok] == []
    assert dict(obs.attempts) == {doc: FIXED_ATTEMPTS[doc] for doc in obs.docs}
    summary = obs.summary()
    assert summary is not None
    assert {f["doc"]: f["reason"] for f in summary["failed"]} == {d: r for d, r in FAILED_REASONS.items() if d in obs.docs}
    assert obs.notify_runs["chord"] == (3 if n >= 4 else 1) and len(obs.emails) == 1  # 4+: the owner killed twice
    assert sorted(obs.sides) == sorted((["behind", "body", "expired"] if n >= 3 else ["expired"]) + (["deploy"] if n >= 7 else [])
                                       + (["outage"] if n >= 8 else []) + (["connloss", "overlong"] if n >= 9 else []))
    if n >= 7:  # two or three deploys (lab.MIN_DEPLOYS); every slow document ok, none dead-lettered
        deploy = obs.sides["deploy"]
        assert MIN_DEPLOYS <= sum(1 for e in deploy.events if e.kind == "deploy_term") <= 3
        assert not any(e.kind == "dead_lettered" for e in deploy.events) and len(deploy.emails) == 1
    if n >= 8:  # two outages of the backend; every store that failed was run again, the side chord whole, one email
        outage = obs.sides["outage"]
        assert [e.get("phase") for e in outage.events if e.kind == "backend_up"] == ["members", "notify"]
        failed = {e.get("task") for e in outage.events if e.kind == "store_failed" and e.get("stage") == "parse_document"}
        assert failed and failed <= {e.get("task") for e in outage.events if e.kind == "sent_back"}
        assert outage.chord.state == "SUCCESS" and len(outage.emails) == 1 and all(outage.attempts[d] >= 1 for d in outage.docs)
    if n >= 9:  # one cut while doc78 ran alone: its first run cancelled, its second ok; doc81 killed at its lowered limit
        connloss, overlong = obs.sides["connloss"], obs.sides["overlong"]
        assert [e.get("running") for e in connloss.events if e.kind == "link_cut"] == ["doc78"]
        assert [e.get("outcome") for e in connloss.events if e.kind == "attempt_end" and e.get("doc") == "doc78"] == ["cancelled", "ok"]
        assert (overlong.failed("doc81") or {}).get("reason") == "time_limit" and len(overlong.emails) == 1
        assert not any(e.kind == "worker_exit" for e in (*connloss.events, *overlong.events))
    if n >= 3:
        assert obs.fetch_attempts["doc9"] == 3
        assert obs.parked == foreign_letters(harness.load(f"fm{n}")) and obs.dlq_depth == 0
    if n >= 4:
        assert obs.duplicate is not None and obs.duplicate.envelope is not None
        assert obs.duplicate.envelope.payload is not None and obs.duplicate.envelope.payload["sent"] is False


def worker_logs(report: RunReport) -> list[Path]:
    """Every worker log of one run: its worker's, and those of the workers its deploys and its link started
    (``fm8-fixed-fm8-deploy1-<run>.log``, ``fm9-fixed-fm9-linked-<run>.log``)."""
    assert report.log is not None
    head, run = report.log.name.rsplit("-", 2)[0], "-".join(report.log.name.rsplit("-", 2)[1:])
    return sorted(report.log.parent.glob(f"{head}-*{run}")) + [report.log]


NAMED_ERRORS: dict[int, tuple[str, ...]] = {}
"""ERROR lines a fixed run's lesson names (none: every line the lab's faults cause is an ``expected:`` or
``lab:`` line, ``lab.worker_log`` and ``lab.quiet_log``)."""


@pytest.mark.parametrize("n", range(1, 10))
def test_a_fixed_runs_worker_windows_hold_no_traceback_and_no_error(n: int, lab_runs: dict[tuple[str, str], RunReport]) -> None:
    """Issue 41: during FM-8's outage and FM-9's cut, Celery's and the primitives' own lines (the count_starts
    signal handlers' ConnectionError, 57 ERRORs and 163 tracebacks in one fm8 run) are each one short line."""
    report = lab_runs[(f"fm{n}", "fixed")]
    observed(report)  # the run went to its end: every window it opened is in the logs
    logs = worker_logs(report)
    assert len(logs) >= 1 + (MIN_DEPLOYS if n >= 7 else 0) + (1 if n >= 9 else 0), logs
    assert (n >= 9) is any(log.name.startswith(f"fm{n}-fixed-fm{n}-linked-") for log in logs), logs
    for log in logs:
        lines = log.read_text(errors="replace").splitlines()
        errors = [line for line in lines if ("ERROR/" in line or "CRITICAL/" in line)
                  and not any(named in line for named in NAMED_ERRORS.get(n, ()))]
        assert errors == [], f"{log.name}: {errors[:5]}"
        assert not any(line.startswith("Traceback") for line in lines), log.name
        assert "Hitting Ctrl+C again" not in "\n".join(lines), log.name  # a deploy's SIGTERM is said in words


def test_fm0_reproduces_its_bug(lab_runs: dict[tuple[str, str], RunReport]) -> None:
    report = lab_runs[("fm0", "bug")]
    obs = observed(report)
    assert report.verdict == "BUG REPRODUCED", report.checks
    assert obs.notify_runs["chord"] == 0 and obs.emails == ()
    assert obs.chord.error_type == "ChordError" and "doc1 is malformed" in (obs.chord.error or "")


def symptom_run(report: RunReport, n: int, code: str, label: str) -> tuple[RunReport, Observations]:
    """Scenario n on ``code`` (broken: FM n-1; weak: FM n without its hard fix), its one symptom holding."""
    obs = observed(report)
    assert report.code == code and obs.scenario == n
    assert [(c.label, c.ok) for c in report.checks] == [(label, True)], report.checks
    return report, obs


@pytest.mark.parametrize("n", range(1, 10))
def test_earlier_code_shows_the_symptom_of_the_later_scenario(n: int, lab_runs: dict[tuple[str, str], RunReport]) -> None:
    _, obs = symptom_run(lab_runs[(f"fm{n}", "broken")], n, f"fm{n - 1}", f"S{n}")
    if n == 2:
        assert obs.attempts["doc3"] == 1 and "WorkerLostError" in (obs.chord.error or "")
    if n == 3:
        assert obs.attempts["doc4"] > 3 and obs.notify_runs["chord"] == 0
    if n == 4:
        assert len(obs.emails) == 3
    if n == 5:
        assert obs.attempts["doc5"] == 1
    if n == 6:
        assert obs.notify_runs["chord"] == 0 and obs.stopped_by == "doc8 outlived the hard deadline"
    if n == 7:  # fm6's warm shutdown outlives the grace: a SIGKILL ends a slow document's body
        kills = [e for e in obs.sides["deploy"].events if e.kind == "deploy_kill"]
        assert 2 <= len(kills) <= 3 and any(e.get("lost") for e in kills)
    if n == 8:  # fm7 acks what it could not store: the side chord waits for members that never report
        outage = obs.sides["outage"]
        assert outage.chord.state == "PENDING" and not any(e.kind == "sent_back" for e in outage.events)
        assert obs.stopped_by.startswith("the outage chord not done")


@pytest.mark.parametrize("n", [1, 3, 4, 5, 6, 9])
def test_without_its_hard_fix_an_fm_shows_the_hard_variants_symptom(n: int, lab_runs: dict[tuple[str, str], RunReport]) -> None:
    report, obs = symptom_run(lab_runs[(f"fm{n}", "weak")], n, f"fm{n}w", f"S{n} hard")
    if n == 1:
        assert obs.sides["expired"].chord.state == "PENDING" and obs.sides["expired"].heads["doc31"] == "REVOKED"
    if n == 3:
        assert obs.fetch_attempts["doc9"] == 3 and obs.chord.state == "PENDING"
    if n == 4:
        assert obs.emails == ()
    if n == 5:  # shared/retry.py: a plain countdown is an ETA held by the worker, as Celery 5.7 says in its log
        assert report.log is not None
        assert "Direct exchanges are not supported with native delayed delivery" in report.log.read_text()
    if n == 9:  # the 406 came (the worker reconnected) and the redelivery ran while doc81 was stuck in C
        assert report.log is not None and "PRECONDITION_FAILED" in (report.log.parent / report.log.name.replace(
            "-fm9w-", "-fm9w-linked-")).read_text()
    if n == 6:
        assert obs.members["doc11"].error_type == "TimeLimitExceeded" and obs.notify_runs["chord"] == 0
        assert obs.members["doc28"].state == "FAILURE" and obs.chord.state == "PENDING"


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
