"""FM-8, the result backend goes away (``fm8_backend_outage.py``)."""

from __future__ import annotations

from tests.lessons.runs import LabRuns, holds_every_guarantee_up_to_its_own, symptom_run


def test_a_member_whose_outcome_was_not_stored_runs_again_and_the_chord_completes_after_the_outage(lab: LabRuns) -> None:
    obs = holds_every_guarantee_up_to_its_own(lab.of("fm8")["fixed"], 8)
    outage = obs.sides["outage"]
    assert [e.get("phase") for e in outage.events if e.kind == "backend_up"] == ["members", "notify"]
    failed = {e.get("task") for e in outage.events if e.kind == "store_failed" and e.get("stage") == "parse_document"}
    assert failed and failed <= {e.get("task") for e in outage.events if e.kind == "sent_back"}
    assert outage.chord.state == "SUCCESS" and len(outage.emails) == 1 and all(outage.attempts[d] >= 1 for d in outage.docs)


def test_without_the_guard_members_are_acked_unstored_and_the_chord_stays_pending(lab: LabRuns) -> None:
    obs = symptom_run(lab.of("fm8")["broken"], 8, "fm7", "S8")
    outage = obs.sides["outage"]
    assert outage.chord.state == "PENDING" and not any(e.kind == "sent_back" for e in outage.events)
    assert obs.stopped_by.startswith("the outage chord not done")
