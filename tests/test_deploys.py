"""Scenario 7's records read back (no broker needed): which worker holds what, and G7's overlap rule."""

from __future__ import annotations

from lab.checks import overlaps
from lessons.fm7.checks import killed_at_grace
from lessons.fm7.deploy import held
from lab.observe import Event


def ev(t: float, kind: str, **fields: str) -> Event:
    return Event(t, kind, fields)


def test_held_follows_a_message_to_the_worker_that_received_it_last() -> None:
    events = [ev(1.0, "received", task="a", doc="doc34", pid="100", returned="0"),
              ev(1.1, "received", task="b", doc="doc35", pid="100", returned="0"),
              ev(1.2, "attempt_start", task="a", doc="doc34", pid="101", attempt="1"),
              ev(2.0, "received", task="b", doc="doc35", pid="200", returned="1")]  # b went back, and on to worker 200
    found = held(events)
    assert (found["a"].holder, found["a"].started, found["a"].child, found["a"].ended) == ("100", 1.2, "101", False)
    assert (found["b"].holder, found["b"].returned, found["b"].started) == ("200", 1, None)


def _run(gone_at: float, ended: bool = False) -> list[Event]:
    """doc34 starts in worker 100; a deploy stops 100; the message goes to worker 200, which starts it at 2.0."""
    events = [ev(1.0, "received", task="a", doc="doc34", pid="100", returned="0"),
              ev(1.1, "attempt_start", task="a", doc="doc34", pid="101", attempt="1"),
              ev(1.2, "deploy_term", n="1", old_pid="100"),
              ev(gone_at, "deploy_kill", n="1", lost="doc34"),
              ev(1.9, "received", task="a", doc="doc34", pid="200", returned="1"),
              ev(2.0, "attempt_start", task="a", doc="doc34", pid="201", attempt="2")]
    if ended:
        events.append(ev(1.5, "attempt_end", task="a", doc="doc34", pid="101", attempt="1", outcome="ok"))
    return sorted(events, key=lambda e: e.t)


def test_an_attempt_that_begins_after_the_worker_of_the_one_before_was_gone_is_no_overlap() -> None:
    assert overlaps(_run(gone_at=1.7)) == []


def test_an_attempt_that_begins_while_the_one_before_still_runs_in_a_live_worker_is_an_overlap() -> None:
    found = overlaps(_run(gone_at=2.5))  # celery#5998 on 5.5: the broker requeued it, the old worker still ran it
    assert found == ["doc34 attempt 2 began 0.90s after attempt 1, which still ran"]


def test_an_attempt_that_ended_before_the_next_began_is_no_overlap_whatever_its_worker() -> None:
    assert overlaps(_run(gone_at=2.5, ended=True)) == []


def test_a_body_killed_at_the_grace_counts_against_g7_only_if_it_ran_at_the_sigterm() -> None:
    events = [ev(1.0, "deploy_term", n="1", old_pid="100", running="doc36", waiting="doc39:0"),
              ev(1.5, "deploy_kill", n="1", lost="doc36,doc39"),  # doc39 began 2 ms after the SIGTERM
              ev(2.0, "deploy_term", n="2", old_pid="200", running="doc40,doc41", waiting=""),
              ev(2.5, "deploy_kill", n="2", lost="")]
    assert killed_at_grace(events) == (["doc36"], ["doc39"])
