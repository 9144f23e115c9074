"""FM-2, a worker process killed mid-task (``fm2_worker_crash.py``)."""

from __future__ import annotations

from tests.lessons.runs import LabRuns, holds_every_guarantee_up_to_its_own, symptom_run


def test_a_crashed_document_is_delivered_again_and_ends_ok(lab: LabRuns) -> None:
    obs = holds_every_guarantee_up_to_its_own(lab.of("fm2")["fixed"], 2)
    assert obs.attempts["doc3"] == 2 and obs.is_ok("doc3")


def test_with_early_acks_the_crashed_document_is_lost_and_the_chord_fails(lab: LabRuns) -> None:
    obs = symptom_run(lab.of("fm2")["broken"], 2, "fm1", "S2")
    assert obs.attempts["doc3"] == 1 and "WorkerLostError" in (obs.chord.error or "")
