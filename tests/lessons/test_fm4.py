"""FM-4, ``notify`` run twice (``fm4_duplicated_runs.py``)."""

from __future__ import annotations

from tests.lessons.runs import LabRuns, holds_every_guarantee_up_to_its_own, symptom_run


def test_one_email_across_a_duplicate_notify_and_an_owner_killed_twice(lab: LabRuns) -> None:
    obs = holds_every_guarantee_up_to_its_own(lab.of("fm4")["fixed"], 4)
    assert obs.notify_runs["chord"] == 3  # the owner killed before sending, then after
    assert obs.duplicate is not None and obs.duplicate.envelope is not None
    assert obs.duplicate.envelope.payload is not None and obs.duplicate.envelope.payload["sent"] is False


def test_without_a_claim_every_delivery_of_notify_sends_an_email(lab: LabRuns) -> None:
    obs = symptom_run(lab.of("fm4")["broken"], 4, "fm3", "S4")
    assert len(obs.emails) == 3


def test_with_the_claim_as_first_written_the_owners_redelivery_is_turned_away_and_no_email_goes(lab: LabRuns) -> None:
    obs = symptom_run(lab.of("fm4")["weak"], 4, "fm4w", "S4 hard")
    assert obs.emails == ()
