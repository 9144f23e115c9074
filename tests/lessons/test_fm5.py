"""FM-5, transient failures (``fm5_transient_failures.py``)."""

from __future__ import annotations

from tests.lessons.runs import LabRuns, holds_every_guarantee_up_to_its_own, symptom_run


def test_transient_errors_are_retried_with_growing_gaps_then_given_up(lab: LabRuns) -> None:
    obs = holds_every_guarantee_up_to_its_own(lab.of("fm5")["fixed"], 5)
    assert obs.attempts["doc5"] == 3 and obs.attempts["doc6"] == 4
    assert obs.burst_probe is not None and obs.burst_probe[1] is not None  # the probe sent during the burst came back


def test_without_retries_a_transient_error_fails_its_document_at_once(lab: LabRuns) -> None:
    obs = symptom_run(lab.of("fm5")["broken"], 5, "fm4", "S5")
    assert obs.attempts["doc5"] == 1


def test_with_retries_held_by_the_worker_a_burst_of_them_holds_new_work(lab: LabRuns) -> None:
    report = lab.of("fm5")["weak"]
    symptom_run(report, 5, "fm5w", "S5 hard")
    assert report.log is not None  # shared/retry.py: a plain countdown is an ETA held by the worker, as Celery 5.7 says
    assert "Direct exchanges are not supported with native delayed delivery" in report.log.read_text()
