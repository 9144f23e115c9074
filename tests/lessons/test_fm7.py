"""FM-7, rolling deploys (``fm7_rolling_deploys.py``)."""

from __future__ import annotations

from lab.observe import Event
from lessons.fm7.checks import MIN_DEPLOYS, killed_at_grace, unread_at_term
from lessons.fm7.scenario import STORED_DOCS
from lessons.fm7.scenario import DEPLOYS
from tests.lessons.runs import LabRuns, holds_every_guarantee_up_to_its_own, symptom_run


def test_rolling_deploys_dead_letter_no_innocent_document_and_lose_none(lab: LabRuns) -> None:
    obs = holds_every_guarantee_up_to_its_own(lab.of("fm7")["fixed"], 7)
    deploy = obs.sides["deploy"]
    assert MIN_DEPLOYS <= sum(1 for e in deploy.events if e.kind == "deploy_term") <= DEPLOYS
    assert not any(e.kind == "dead_lettered" for e in deploy.events) and len(deploy.emails) == 1


def test_a_member_killed_between_its_store_and_its_count_is_counted_once(lab: LabRuns) -> None:
    obs = holds_every_guarantee_up_to_its_own(lab.of("fm7")["fixed"], 7)
    stored = obs.sides["stored"]
    assert [e.get("killed") for e in stored.events if e.kind == "killed_after_store"] == ["yes"]
    assert stored.chord.state == "SUCCESS" and len(stored.emails) == 1
    assert stored.attempts[STORED_DOCS[0]] == 1  # its body ran once: the kill came after it, the count came back


def test_without_count_stored_members_a_member_killed_after_its_store_leaves_the_chord_pending(lab: LabRuns) -> None:
    obs = symptom_run(lab.of("fm7")["weak"], 7, "fm7w", "S7 hard")
    stored = obs.sides["stored"]
    assert stored.members[STORED_DOCS[0]].state == "SUCCESS" and stored.chord.state == "PENDING"
    assert not stored.emails and not any(e.kind == "dead_lettered" for e in stored.events)


def test_with_a_warm_shutdown_longer_than_the_grace_a_deploy_kills_a_document_mid_body(lab: LabRuns) -> None:
    obs = symptom_run(lab.of("fm7")["broken"], 7, "fm6", "S7")
    kills = [e for e in obs.sides["deploy"].events if e.kind == "deploy_kill"]
    assert MIN_DEPLOYS <= len(kills) <= DEPLOYS and any(e.get("lost") for e in kills)


def _e(t: float, kind: str, **fields: str) -> Event:
    return Event(t, kind, fields)


def test_a_body_killed_at_the_grace_is_unread_only_when_its_start_reached_the_worker_after_the_sigterm() -> None:
    """doc1's start was read (accepted) before the SIGTERM: the soft shutdown had to cancel it; doc2's was read after
    it (the body began as the SIGTERM came): beyond Celery's cancel. An accept of an earlier delivery does not count."""
    events = [_e(1.0, "received", task="t2", doc="doc2", pid="10"), _e(1.1, "accepted", task="t2", doc="doc2", pid="10"),
              _e(2.0, "received", task="t1", doc="doc1", pid="10"), _e(2.1, "attempt_start", task="t1", doc="doc1", pid="11"),
              _e(2.1, "accepted", task="t1", doc="doc1", pid="10"),
              _e(3.0, "received", task="t2", doc="doc2", pid="10"), _e(3.1, "attempt_start", task="t2", doc="doc2", pid="12"),
              _e(3.2, "deploy_term", n="1", old_pid="10", running="doc1,doc2"),
              _e(3.3, "accepted", task="t2", doc="doc2", pid="10"),
              _e(3.8, "deploy_kill", n="1", lost="doc1,doc2")]
    lost, late = killed_at_grace(events)
    assert (lost, late) == (["doc1", "doc2"], [])
    assert unread_at_term(events, lost) == ["doc2"]
