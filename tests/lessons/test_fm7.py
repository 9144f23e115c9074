"""FM-7, rolling deploys (``fm7_rolling_deploys.py``)."""

from __future__ import annotations

from lab.observe import Event
from lessons.fm7.checks import (MIN_DEPLOYS, cancelled_before_kill, cancelled_findings, cancelled_said, cancels_after_term,
                                ended_by_the_deploy, killed_at_grace, unread_at_term)
from lessons.fm7.scenario import CANCELLED_DOCS, DEPLOYS, STORED_DOCS
from tests.lessons.runs import LabRuns, holds_every_guarantee_up_to_its_own, symptom_run
from tests.synthetic import side, summary_outcome


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


def test_a_member_a_deploy_cancels_between_its_store_and_its_count_is_counted_once(lab: LabRuns) -> None:
    obs = holds_every_guarantee_up_to_its_own(lab.of("fm7")["fixed"], 7)
    cancelled = obs.sides["cancelled"]
    kinds = [e.kind for e in cancelled.events if e.kind in ("stored_uncounted", "held_deploy_term", "held_deploy_end",
                                                             "ended_after_store")]
    # held, the deploy's SIGTERM, then (Celery's cancel after the 0.3 s soft wait, or the grace's SIGKILL while the
    # soft wait has it in hand: G7 reads which) the worker's end and the held process gone
    assert kinds[:2] == ["stored_uncounted", "held_deploy_term"] and sorted(kinds[2:]) == [
        "ended_after_store", "held_deploy_end"], kinds
    assert any(e.kind in ("cancelled", "soft_wait") and e.get("doc") == CANCELLED_DOCS[0] for e in cancelled.events)
    assert cancelled.chord.state == "SUCCESS" and len(cancelled.emails) == 1
    assert cancelled.attempts[CANCELLED_DOCS[0]] == 1  # its redelivery was deduplicated, and counted


def test_without_count_stored_members_a_member_a_deploy_cancels_after_its_store_leaves_the_chord_pending(
        lab: LabRuns) -> None:
    obs = symptom_run(lab.of("fm7")["weak"], 7, "fm7w", "S7 hard")
    cancelled = obs.sides["cancelled"]
    assert any(e.kind == "cancelled" and e.get("doc") == CANCELLED_DOCS[0] for e in cancelled.events)
    assert cancelled.members[CANCELLED_DOCS[0]].state == "SUCCESS" and cancelled.chord.state == "PENDING"
    assert not cancelled.emails and not any(e.kind == "dead_lettered" for e in cancelled.events)


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


def test_a_read_body_the_sigkill_overtook_passes_only_when_its_own_delivery_was_cancelled_by_the_old_worker() -> None:
    """doc1's cancel came from the old worker, for the delivery it held, before the SIGKILL: the kill overtook a
    cancel. doc3's cancel names an earlier delivery, doc4's came from another worker, doc5's after the SIGKILL was
    decided: none of them was cancelled by this shutdown in time."""
    events = [_e(0.5, "received", task="t3old", doc="doc3", pid="10"), _e(0.6, "cancelled", task="t3old", doc="doc3", pid="10"),
              *[_e(1.0 + i / 10, "received", task=f"t{i}", doc=f"doc{i}", pid="10") for i in (1, 3, 4, 5)],
              _e(2.1, "deploy_term", n="1", old_pid="10", running="doc1,doc3,doc4,doc5", sent="2.0"),
              _e(2.0, "soft_wait", task="t1", doc="doc1", pid="10"),
              _e(2.3, "cancelled", task="t1", doc="doc1", pid="10"), _e(2.3, "cancelled", task="t4", doc="doc4", pid="99"),
              _e(2.5, "deploy_kill", n="1", lost="doc1,doc3,doc4,doc5"),
              _e(2.51, "cancelled", task="t5", doc="doc5", pid="10")]
    assert cancelled_before_kill(events, ["doc1", "doc3", "doc4", "doc5"], 0.3) == [
        "doc1 (cancelled 0.30s after its SIGTERM, SIGKILLed at 0.50s)"]
    # doc5 in the soft wait's hands, its cancel not reached by the SIGKILL: listed too; doc3's soft wait named an
    # earlier delivery, doc4's came from another worker: still failing G7
    held = [_e(2.0, "soft_wait", task=t, doc=d, pid=p) for t, d, p in (("t5", "doc5", "10"), ("t3old", "doc3", "10"),
                                                                        ("t4", "doc4", "99"))]
    both = sorted([*events, *held], key=lambda e: e.t)
    assert cancelled_before_kill(both, ["doc1", "doc3", "doc4", "doc5"], 0.3) == [
        "doc1 (cancelled 0.30s after its SIGTERM, SIGKILLed at 0.50s)",
        "doc5 (in the cold shutdown's hands 0.00s after its SIGTERM, its cancel not reached by the SIGKILL at 0.50s)"]
    # a soft wait as long as the grace: doc5's cancel was never due before the SIGKILL, so it fails G7
    assert cancelled_before_kill(both, ["doc5"], 0.5) == []
    assert cancels_after_term(events) == ["deploy 1: doc1 waited at 0.00s, doc1 cancelled at 0.30s"]


def test_a_held_member_gone_before_the_deploy_found_its_worker_fails_g7_saying_so() -> None:
    """``DeployOnHeld`` records ``held_deploy_missed`` when the held pool process is gone (its time limit, on a machine
    too loaded to send the side in time) before its worker was found: no deploy cancelled it, and G7 says why."""
    doc = CANCELLED_DOCS[0]
    events = [_e(1.0, "received", task="t1", doc=doc, pid="10"), _e(1.2, "stored_uncounted", doc=doc, pid="11"),
              _e(4.0, "held_deploy_missed", doc=doc, child="11"), _e(4.1, "received", task="t1", doc=doc, pid="12")]
    f = cancelled_findings(side("cancelled", (doc,), events, summary_outcome([doc], [])))
    assert (f.held, f.cancels, f.ended, f.missed, f.received) == (1, 0, 0, 1, 2)
    assert not ended_by_the_deploy(f)
    assert cancelled_said(f).endswith("; its process gone before the deploy found its worker 1x")
