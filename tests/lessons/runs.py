"""The lab's runs the lesson tests assert on: made once a session, the cells the registry declares for a lesson
(``lessons.cells``), two at once (``run_all_fms.run_at_once``, as ``make matrix`` runs them), when a lesson's
test first asks for them."""

from __future__ import annotations

import shutil
from collections.abc import Mapping

import lessons
import run_all_fms
from lab import harness
from lab.fm import ROOT
from lab.lesson import RunKind
from lab.records import Observations, RunReport

LAB_JOBS = 2
"""Runs at once: never two on one program's code, the longest scenarios first."""


def _quiet(_: str) -> None:
    pass


class LabRuns:
    """Every run a session's lesson tests asked for, each made once."""

    def __init__(self) -> None:
        self.reports: dict[tuple[str, RunKind], RunReport] = {}

    def of(self, lesson: str) -> Mapping[RunKind, RunReport]:
        """The runs of ``lesson`` (made now, those not made yet), by kind."""
        wanted = lessons.cells(lesson)
        missing = [cell for cell in wanted if cell not in self.reports]

        def run(i: int) -> None:
            fm, kind = missing[i]
            self.reports[missing[i]] = report = harness.run_one(fm, kind, _quiet)
            if report.error is not None:
                keep_logs(report)

        if missing:
            run_all_fms.run_at_once(missing, LAB_JOBS, run, lambda: None)
        return {kind: self.reports[(fm, kind)] for fm, kind in wanted if fm == lesson}

    def naive(self) -> RunReport:
        """The naive program's bug run (the first lesson's cells hold it)."""
        self.of(lessons.FMS[0])
        return self.reports[lessons.NAIVE_BUG]


KEPT = ROOT / ".lab" / "kept-logs"
"""Where the worker logs of a run that ended in ERROR are copied: the namespace keeps only its newest logs
(``lab.workers.KEEP_LOGS``), and a session makes more."""


def keep_logs(report: RunReport) -> None:
    if report.log is None:
        return
    run = "-".join(report.log.stem.rsplit("-", 2)[1:])
    KEPT.mkdir(parents=True, exist_ok=True)
    for log in report.log.parent.glob(f"*{run}*"):
        shutil.copy2(log, KEPT / log.name)


def observed(report: RunReport) -> Observations:
    assert report.error is None, f"{report.error} (logs copied to {KEPT}); checks not holding: " + "; ".join(
        f"{c.label}: {c.detail}" for c in report.checks if not c.ok)
    assert report.observations is not None
    return report.observations


def symptom_run(report: RunReport, n: int, code: str, label: str) -> Observations:
    """Scenario n on ``code`` (broken: FM n-1; weak: FM n without its hard fix), its one symptom holding."""
    obs = observed(report)
    assert report.code == code and obs.scenario == n
    met = lessons.scenario_for(report.kind, n)  # only what the lesson says its symptom needs (the whole, if it says not)
    assert obs.docs == met.docs and set(obs.sides) <= {side.tag for side in met.sides}
    assert [(c.label, c.ok) for c in report.checks] == [(label, True)], report.checks
    return obs


# attempts per document of scenario N on FM N's (fixed) code
FIXED_ATTEMPTS = {"doc1": 1, "doc2": 1, "doc3": 2, "doc4": 3, "doc5": 3, "doc6": 4, "doc7": 1, "doc8": 1,
                  "doc9": 0, "doc10": 1, "doc11": 1, **{f"doc{i}": 2 for i in range(12, 28)}, "doc28": 1, "doc29": 0,
                  "doc30": 1, "doc90": 1}
FAILED_REASONS = {"doc1": "error", "doc4": "dead_lettered", "doc6": "retries_exhausted", "doc7": "soft_timeout",
                  "doc8": "hard_timeout", "doc9": "dead_lettered", "doc10": "hard_timeout", "doc11": "time_limit",
                  "doc29": "hard_timeout", "doc30": "time_limit"}


def holds_every_guarantee_up_to_its_own(report: RunReport, n: int) -> Observations:
    """FM n's run of scenario n: G1..Gn all hold, every document with its exact attempts and outcome, one email,
    the side chords of lessons 1..n (the registry's) all sent."""
    obs = observed(report)
    assert [c.label for c in report.checks] == [f"G{i}" for i in range(1, n + 1)]
    failing = [c for c in report.checks if not c.ok]
    assert not failing, "; ".join(f"{c.label}: {c.detail}" for c in failing)
    assert dict(obs.attempts) == {doc: FIXED_ATTEMPTS[doc] for doc in obs.docs}
    summary = obs.summary()
    assert summary is not None
    assert {f["doc"]: f["reason"] for f in summary["failed"]} == {d: r for d, r in FAILED_REASONS.items() if d in obs.docs}
    assert len(obs.emails) == 1
    assert sorted(obs.sides) == sorted(side.tag for side in lessons.scenario(n).sides)
    assert all(side.submitted for side in obs.sides.values())
    return obs
