"""FM-3, poison that kills its worker on every delivery (``fm3_dlq_reconciliation.py``)."""

from __future__ import annotations

from lab import harness
from lessons.fm3.scenario import foreign_letters
from tests.lessons.runs import LabRuns, holds_every_guarantee_up_to_its_own, symptom_run


def test_poison_is_dead_lettered_at_the_brokers_bound_and_the_chord_completes(lab: LabRuns) -> None:
    obs = holds_every_guarantee_up_to_its_own(lab.of("fm3")["fixed"], 3)
    assert obs.attempts["doc4"] == 3 and obs.fetch_attempts["doc9"] == 3
    assert obs.parked == foreign_letters(harness.load("fm3")) and obs.dlq_depth == 0  # the foreign letters, parked


def test_without_a_delivery_limit_poison_is_redelivered_for_ever(lab: LabRuns) -> None:
    obs = symptom_run(lab.of("fm3")["broken"], 3, "fm2", "S3")
    assert obs.attempts["doc4"] > 3 and obs.notify_runs["chord"] == 0


def test_with_the_drain_as_first_written_a_poison_chain_head_leaves_its_chord_pending(lab: LabRuns) -> None:
    obs = symptom_run(lab.of("fm3")["weak"], 3, "fm3w", "S3 hard")
    assert obs.fetch_attempts["doc9"] == 3 and obs.chord.state == "PENDING"
