"""FM-1, a member that raises (``fm1_mid_pipeline_error.py``): its runs on the real broker and backend."""

from __future__ import annotations

from tests.lessons.runs import LabRuns, holds_every_guarantee_up_to_its_own, observed, symptom_run


def test_every_exit_an_envelope_the_body_runs_once_and_says_which_document_failed(lab: LabRuns) -> None:
    obs = holds_every_guarantee_up_to_its_own(lab.of("fm1")["fixed"], 1)
    assert obs.notify_runs["chord"] == 1
    assert obs.sides["expired"].heads["doc31"] == "REVOKED"  # the expired head: Celery's record, its chord done


def test_without_envelopes_a_failed_member_stops_the_body_with_a_chord_error(lab: LabRuns) -> None:
    obs = symptom_run(lab.of("fm1")["broken"], 1, "fm0", "S1")
    assert obs.notify_runs["chord"] == 0 and "doc1 is malformed" in (obs.chord.error or "")


def test_the_naive_program_reproduces_its_bug(lab: LabRuns) -> None:
    report = lab.naive()
    obs = observed(report)
    assert report.verdict == "BUG REPRODUCED", report.checks
    assert obs.notify_runs["chord"] == 0 and obs.emails == ()
    assert obs.chord.error_type == "ChordError" and "doc1 is malformed" in (obs.chord.error or "")


def test_without_the_revoked_envelope_an_expired_chain_head_leaves_its_chord_pending(lab: LabRuns) -> None:
    obs = symptom_run(lab.of("fm1")["weak"], 1, "fm1w", "S1 hard")
    assert obs.sides["expired"].chord.state == "PENDING" and obs.sides["expired"].heads["doc31"] == "REVOKED"
