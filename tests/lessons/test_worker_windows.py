"""Issue 41, on every lesson's fixed run: the worker windows hold no traceback and no error line (during FM-8's
outage and FM-9's cut, Celery's and the primitives' own lines are each one short line)."""

from __future__ import annotations

from pathlib import Path

import pytest

import lessons
from lab.records import RunReport
from lessons.fm7.checks import MIN_DEPLOYS
from tests.lessons.runs import LabRuns, observed


def worker_logs(report: RunReport) -> list[Path]:
    """Every worker log of one run: its worker's, and those of the workers its injectors started
    (``fm8-fixed-fm8-deploy1-<run>.log``, ``fm9-fixed-fm9-linked-<run>.log``)."""
    assert report.log is not None
    head, run = report.log.name.rsplit("-", 2)[0], "-".join(report.log.name.rsplit("-", 2)[1:])
    return sorted(report.log.parent.glob(f"{head}-*{run}")) + [report.log]


@pytest.mark.parametrize("name", lessons.FMS)
def test_a_fixed_runs_worker_windows_hold_no_traceback_and_no_error(name: str, lab: LabRuns) -> None:
    report = lab.of(name)["fixed"]
    observed(report)  # the run went to its end: every window it opened is in the logs
    sc = lessons.scenario(lessons.FMS.index(name) + 1)
    deploys, linked = "rolling deploys" in sc.injectors, "connection cut" in sc.injectors
    logs = worker_logs(report)
    assert len(logs) >= 1 + (MIN_DEPLOYS if deploys else 0) + (1 if linked else 0), logs
    assert linked is any(log.name.startswith(f"{name}-fixed-{name}-linked-") for log in logs), logs
    for log in logs:
        lines = log.read_text(errors="replace").splitlines()
        errors = [line for line in lines if "ERROR/" in line or "CRITICAL/" in line]
        assert errors == [], f"{log.name}: {errors[:5]}"
        assert not any(line.startswith("Traceback") for line in lines), log.name
        assert "Hitting Ctrl+C again" not in "\n".join(lines), log.name  # a deploy's SIGTERM is said in words
