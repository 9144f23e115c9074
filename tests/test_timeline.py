"""Timelines from synthetic Observations (no broker): every ending, and how the console shows it."""

from __future__ import annotations

import dataclasses
import io

from lab.show import timeline, timeline_text
from shared.envelope import REASONS
from lab.harness import RunReport
from lab.show.progress import Board
from lab.runner import Outcome
from lab.show.timeline import MARKS, DocTimeline, Timeline
from tests.synthetic import (broken_run, end, ev, fixed_run, kept_letter_run, lost_run, notify_story_run, observations, start,
                             summary_outcome)


def doc(tl: Timeline, name: str) -> DocTimeline:
    return next(d for d in tl.docs if d.doc == name)


def ms(t: float | None) -> int | None:
    """Seconds to whole milliseconds (the synthetic events are placed to the millisecond)."""
    return None if t is None else round(t * 1000)


def endings(tl: Timeline, name: str) -> list[str]:
    return [a.how for a in doc(tl, name).attempts]


def test_each_attempt_is_placed_relative_to_submission_and_ends_as_observed() -> None:
    tl = timeline.build(fixed_run())
    first = doc(tl, "doc1").attempts[0]
    assert (first.n, ms(first.start), ms(first.end), first.how, first.reason) == (1, 20, 21, "raised", "error")
    assert first.error == "PermanentError: doc1 is malformed"
    assert endings(tl, "doc2") == ["ok"]
    assert endings(tl, "doc3") == ["killed", "ok"]  # no end, then another attempt: the process died
    assert endings(tl, "doc4") == ["killed", "killed", "killed"]
    assert ms(doc(tl, "doc4").dead_lettered_at) == 900
    assert endings(tl, "doc5") == ["retried", "retried", "ok"]
    assert [ms(a.retry_in) for a in doc(tl, "doc5").attempts] == [140, 250, None]
    assert endings(tl, "doc6") == ["retried", "retried", "retried", "raised"]
    assert [(a.how, a.reason) for a in doc(tl, "doc7").attempts + doc(tl, "doc8").attempts] == [
        ("raised", "soft_timeout"), ("raised", "hard_timeout")]


def test_a_documents_final_state_carries_the_envelope_reason_from_the_summary() -> None:
    tl = timeline.build(fixed_run())
    finals = {d.doc: (d.final, d.reason) for d in tl.docs}
    assert finals == {
        "doc1": ("failed", "error"), "doc2": ("ok", None), "doc3": ("ok", None), "doc4": ("failed", "dead_lettered"),
        "doc5": ("ok", None), "doc6": ("failed", "retries_exhausted"), "doc7": ("failed", "soft_timeout"),
        "doc8": ("failed", "hard_timeout"), "doc11": ("failed", "time_limit")}
    # expired and revoked are the reasons of a head that never ran: side chord "expired", not this chord
    assert {d.mark for d in tl.docs if d.final == "failed"} == set(REASONS) - {"expired", "revoked"}


def test_notify_runs_pair_starts_with_ends_and_a_busy_claim_is_a_retry() -> None:
    tl = timeline.build(fixed_run())
    seen = [(n.role, n.how, n.retry_in) for n in tl.notifies]
    assert seen == [("chord", "sent", None), ("duplicate", "retried", 0.05), ("duplicate", "skipped", None)]
    assert ms(tl.notifies[0].gate_wait) == 1601
    assert [(e.role, ms(e.t)) for e in tl.emails] == [("chord", 1640)]


def test_a_run_stopped_on_its_symptom_shows_what_was_still_running() -> None:
    tl = timeline.build(broken_run())
    assert endings(tl, "doc3") == ["running"]  # no end and nothing after it
    assert endings(tl, "doc4") == ["killed", "running"]
    assert endings(tl, "doc8") == ["running"]
    finals = {d.doc: d.final for d in tl.docs}
    assert finals["doc5"] == "retrying" and finals["doc6"] == "not started" and finals["doc7"] == "ok"
    assert finals["doc1"] == "failed" and doc(tl, "doc1").reason == "error"
    assert tl.notifies == () and tl.chord == "not finished (PENDING)"
    assert ms(tl.span) == 2400


def test_an_attempt_the_chord_finished_without_was_killed_and_lost() -> None:
    tl = timeline.build(lost_run())
    assert endings(tl, "doc3") == ["killed"] and doc(tl, "doc3").final == "killed"
    assert tl.chord.startswith("FAILURE ChordError")


def test_every_ending_has_its_own_mark() -> None:
    for key in (*REASONS, "ok", "killed", "retried", "running", "email"):
        assert key in MARKS
    assert len({m.glyph for m in MARKS.values()}) == len(MARKS)
    assert len({m.colour for m in MARKS.values()}) == len(MARKS)


def test_text_lines_say_how_each_attempt_ended() -> None:
    text = "\n".join(timeline_text.plain(line) for line in timeline_text.lines(timeline.build(fixed_run()), "fm6 fixed"))
    assert "killed: the process died" in text
    assert "dead-lettered: finalised by the DLQ drain" in text
    assert "raised error, retried after 140 ms" in text
    assert "failed: retries_exhausted" in text and "failed: soft_timeout" in text and "failed: hard_timeout" in text
    assert "retried after 50 ms (claim busy)" in text
    assert "skipped, sent=False (already sent)" in text and "email sent" in text
    broken = "\n".join(timeline_text.plain(line) for line in timeline_text.lines(timeline.build(broken_run()), "fm6 broken"))
    assert "no end when the run stopped (2.40s)" in broken and "never ran" in broken


def _reports() -> list[RunReport]:
    return [RunReport("fm6", "fixed", "fm6", 6, observations=fixed_run()),
            RunReport("fm6", "broken", "fm5", 6, observations=broken_run())]


def test_plain_console_prints_a_line_per_stage_and_the_timelines_one_after_the_other() -> None:
    out = io.StringIO()
    with Board(2, file=out) as board:
        board.stage("fm6", "fixed", "resetting")
        board.stage("fm6", "fixed", "running the scenario")
        board.finished("fm6 fixed (scenario 6 on fm6, 1.0s): PASS", ok=True)
        board.timelines("fm6", _reports())
    text = out.getvalue()
    assert "fm6 fixed [ 0.0s] resetting ..." in text and "running the scenario ..." in text
    assert "\x1b[" not in text  # no terminal codes in a log
    fixed_at, broken_at = text.index("fm6 fixed: scenario 6"), text.index("fm6 broken: scenario 6")
    assert fixed_at < broken_at


def test_a_wide_terminal_shows_the_fixed_and_broken_timelines_side_by_side() -> None:
    out = io.StringIO()
    board = Board(2, file=out, live=True)
    board.console.width = 220
    board.timelines("fm6", _reports())
    lines = out.getvalue().splitlines()
    assert any("fm6 fixed: scenario 6" in ln and "fm6 broken: scenario 6" in ln for ln in lines)
    narrow = io.StringIO()
    board = Board(2, file=narrow, live=True)
    board.console.width = 100
    board.timelines("fm6", _reports())
    assert not any("fm6 fixed: scenario 6" in ln and "fm6 broken: scenario 6" in ln for ln in narrow.getvalue().splitlines())


def test_an_outcome_no_envelope_reason_names_is_drawn_as_an_error() -> None:
    obs = observations([start(0.01, "doc1", 1), end(0.02, "doc1", 1, "exploded", "Boom"),
                        ev(0.03, "notify_start", role="chord")], Outcome("PENDING", None, None, None))
    tl = timeline.build(obs)
    assert [(a.how, a.reason, a.mark) for a in doc(tl, "doc1").attempts] == [("raised", "error", "error")]
    assert [(n.role, n.how) for n in tl.notifies] == [("chord", "running")]


def test_a_poison_fetch_shows_its_fetches_when_no_parse_ever_began() -> None:
    events = [ev(0.02, "fetch_start", doc="doc9", attempt=1), ev(0.2, "fetch_start", doc="doc9", attempt=2),
              ev(0.4, "fetch_start", doc="doc9", attempt=3), ev(0.7, "dead_lettered", doc="doc9"),
              ev(0.03, "fetch_start", doc="doc2", attempt=1), start(0.05, "doc2", 1), end(0.06, "doc2", 1)]
    obs = dataclasses.replace(observations(events, summary_outcome(["doc2"], [("doc9", "dead_lettered", "x")])),
                              docs=("doc2", "doc9"))
    tl = timeline.build(obs)
    assert [(a.stage, a.how) for a in doc(tl, "doc9").attempts] == [("fetch", "killed")] * 3
    assert [(a.stage, a.how) for a in doc(tl, "doc2").attempts] == [("parse", "ok")]  # its one fetch is not drawn
    text = "\n".join(timeline_text.plain(line) for line in timeline_text.lines(tl, "fm3 fixed"))
    assert text.count("fetch killed: the process died") == 3


def test_a_dead_letter_the_drain_kept_is_kept_not_running() -> None:
    tl = timeline.build(kept_letter_run())
    doc9 = doc(tl, "doc9")
    assert (doc9.final, doc9.mark, ms(doc9.kept_at), doc9.kept_why) == ("kept", "kept", 950, "not a chord member")
    assert [(a.stage, a.how) for a in doc9.attempts] == [("fetch", "killed")] * 3  # the kept letter followed the last
    text = "\n".join(timeline_text.plain(line) for line in timeline_text.lines(tl, "fm3 weak"))
    assert "kept: dead-lettered, the drain kept it in the DLQ" in text and "running" not in text.split("doc9")[1]


def test_every_notify_delivery_is_its_own_run_and_a_lost_one_was_killed() -> None:
    tl = timeline.build(notify_story_run())
    seen = [(n.role, n.how, n.crash, ms(n.deduplicated_at)) for n in tl.notifies]
    assert seen == [("chord", "killed", "before_send", None), *[("duplicate", "retried", None, None)] * 2,
                    ("chord", "killed", "after_send", None), *[("duplicate", "retried", None, None)] * 3,
                    ("chord", "sent", None, 1340), ("duplicate", "skipped", None, None)]
    lost = timeline.build(observations([ev(0.1, "notify_start", role="chord"), ev(0.5, "notify_start", role="chord"),
                                        ev(0.6, "notify_end", role="chord", outcome="ok")], Outcome("SUCCESS", None, None, None)))
    assert [(n.how, n.end) for n in lost.notifies] == [("killed", None), ("ended", lost.notifies[1].end)]


def test_a_case_studys_text_timeline_pads_long_names_and_names_its_body() -> None:
    chunks = ("chunk000", "chunk001")
    events = [start(0.01, "chunk000", 1), end(0.02, "chunk000", 1), start(0.01, "chunk001", 1), end(0.03, "chunk001", 1),
              ev(0.05, "notify_start", role="chord"), ev(0.06, "notify_end", role="chord", outcome="ok")]
    obs = dataclasses.replace(observations(events, summary_outcome(list(chunks), [])), docs=chunks, fm="sb")
    lines = [timeline_text.plain(line) for line in timeline_text.lines(timeline.build(obs, body="reconcile"), "sb fixed")]
    assert "  chunk000 ok" in lines and "  chunk001 ok" in lines  # not "chunk000ok"
    assert any(line.startswith("  reconcile chord") and line.endswith("ended: ok") for line in lines)
    assert not any("notify" in line or "email" in line for line in lines)


def test_a_run_with_no_documents_says_it_has_no_timeline_and_no_chord_state() -> None:
    obs = dataclasses.replace(observations([], Outcome("PENDING", None, None, None)), docs=(), stopped_by="drained")
    lines = [timeline_text.plain(line) for line in timeline_text.lines(timeline.build(obs), "ct fixed")]
    assert lines[1:] == ["stopped: drained at 2.50s", f"  {timeline_text.NO_CHORD}"]
    assert not any("PENDING" in line or "notify" in line for line in lines)


def test_the_chords_last_delivery_returned_when_the_chord_holds_its_result() -> None:
    """The runner stopped at "chord finished" before the body's end event landed: the stored result says it returned."""
    events = [start(0.01, "doc2", 1), end(0.02, "doc2", 1), ev(0.1, "notify_start", role="chord")]
    tl = timeline.build(observations(events, summary_outcome(["doc2"], [])), body="aggregate_batch")
    assert [(n.how, n.outcome, n.returned, n.end) for n in tl.notifies] == [("ended", "ok", True, None)]
    text = [timeline_text.plain(line) for line in timeline_text.lines(tl, "bl fixed")]
    assert any(line.endswith("ended: ok (its end known from the chord's stored result)") for line in text)
    pending = timeline.build(observations(events, Outcome("PENDING", None, None, None)))
    assert [(n.how, n.returned) for n in pending.notifies] == [("running", False)]  # nothing says it returned
