"""FM-6, hung tasks (``fm6_task_timeouts.py``)."""

from __future__ import annotations

from tests.lessons.runs import LabRuns, holds_every_guarantee_up_to_its_own, symptom_run


def test_every_hang_ends_with_its_reason_and_the_worker_serves_at_once_afterwards(lab: LabRuns) -> None:
    obs = holds_every_guarantee_up_to_its_own(lab.of("fm6")["fixed"], 6)
    assert obs.probe_seconds is not None and obs.probe_seconds <= 2.0


def test_without_a_deadline_in_the_body_a_hang_pins_its_slot_and_the_chord_never_completes(lab: LabRuns) -> None:
    obs = symptom_run(lab.of("fm6")["broken"], 6, "fm5", "S6")
    assert obs.notify_runs["chord"] == 0 and obs.stopped_by == "doc8 outlived the hard deadline"


def test_with_celerys_limits_alone_hangs_in_c_and_stalled_stores_fail_outside_the_body(lab: LabRuns) -> None:
    obs = symptom_run(lab.of("fm6")["weak"], 6, "fm6w", "S6 hard")
    assert obs.members["doc11"].error_type == "TimeLimitExceeded" and obs.notify_runs["chord"] == 0
    assert obs.members["doc28"].state == "FAILURE" and obs.chord.state == "PENDING"


def test_a_member_its_time_limit_kills_between_its_store_and_its_count_is_counted_once(lab: LabRuns) -> None:
    obs = holds_every_guarantee_up_to_its_own(lab.of("fm6")["fixed"], 6)
    assert [e.kind for e in obs.events if e.get("doc") == "doc90" and e.kind in ("received", "stored_uncounted")] == [
        "received", "stored_uncounted"]  # delivered once: BackstopRequest settled and acked it, counted
    assert obs.members["doc90"].state == "SUCCESS" and obs.chord.state == "SUCCESS"
