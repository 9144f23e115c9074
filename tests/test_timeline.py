"""Timelines from synthetic Observations (no broker): every ending, and how the console shows it."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

from lab.show import timeline, timeline_text
from shared.envelope import REASONS, Result
from lab.records import Outcome, RunReport
from lab.show.progress import Board
from lab.show.timeline import MARKS, DocTimeline, Timeline
from tests.synthetic import (EXPIRED_ERROR, FOREIGN, broken_run, end, ev, fixed_run, kept_letter_run, lost_run, member_failure_run,
                             notify_story_run, observations, sided_run, start, summary_outcome, weak_sides_run)


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
    tl = timeline.build(sided_run())
    finals = {d.doc: (d.final, d.reason) for d in tl.docs}
    assert finals == {
        "doc1": ("failed", "error"), "doc2": ("ok", None), "doc3": ("ok", None), "doc4": ("failed", "dead_lettered"),
        "doc5": ("ok", None), "doc6": ("failed", "retries_exhausted"), "doc7": ("failed", "soft_timeout"),
        "doc8": ("failed", "hard_timeout"), "doc11": ("failed", "time_limit")}
    # expired and revoked are the reasons of a head that never ran: they end the side chord "expired"
    side_docs = [d for side in tl.sides for d in side.timeline.docs]
    assert {d.mark for d in tl.docs if d.final == "failed"} == set(REASONS) - {"expired", "revoked"}
    assert {d.mark for d in (*tl.docs, *side_docs) if d.final == "failed"} == set(REASONS)


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
    return [RunReport("fm6", "fixed", "fm6", 6, observations=sided_run()),
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


def plain_lines(tl: Timeline, title: str = "t") -> list[str]:
    return [timeline_text.plain(line) for line in timeline_text.lines(tl, title)]


def test_each_side_chord_is_built_on_the_runs_time_base_with_its_bodys_fate() -> None:
    tl = timeline.build(sided_run())
    sides = {s.tag: s for s in tl.sides}
    assert list(sides) == ["expired", "body", "behind"]
    expired, body, behind = sides["expired"], sides["body"], sides["behind"]
    assert [(d.doc, d.final, d.reason, ms(d.revoked_at), d.expired) for d in expired.timeline.docs] == [
        ("doc31", "failed", "expired", -4, True), ("doc34", "failed", "revoked", 2, False)]
    assert (expired.state, expired.body, expired.mark) == ("SUCCESS", "sent", "ok")
    # the poison body: three deliveries killed by the mail API, then the drain's finalising
    assert [(n.how, n.crash) for n in body.timeline.notifies] == [("killed", "poison_mail")] * 3
    assert (body.state, body.body, body.deliveries, ms(body.body_at), body.mark) == ("SUCCESS", "dead_lettered", 3, 800,
                                                                                      "dead_lettered")
    assert body.outcome == ("chord SUCCESS (envelope FAILURE dead_lettered): body dead-lettered after 3 deliveries, "
                            "finalised by the drain; claim released")  # fm6 holds a claim: the drain released it
    assert behind.purpose == f"a poison member behind {FOREIGN} letters no drain can place"
    assert [(f.text, f.mark) for f in behind.facts] == [
        (f"all {FOREIGN} foreign letters parked", None), ("doc33 failed: dead_lettered", "dead_lettered"), ("email sent", "email")]
    assert ms(tl.span) == 1700  # the sides ended inside the run


def test_the_text_timeline_heads_each_side_chord_and_indents_its_lines() -> None:
    lines = plain_lines(timeline.build(sided_run()), "fm6 fixed")
    at = lines.index("  side chord body (a poison notify): chord SUCCESS (envelope FAILURE dead_lettered):")
    assert lines[at + 1:at + 8] == [
        "    · body dead-lettered after 3 deliveries, finalised by the drain; claim released",
        "    doc32 ok",
        "      #1 0.020→0.021s   ok",
        *["    notify chord     " + f"{t:.3f}→{t + 0.001:.3f}s".ljust(14) + " killed by the poison mail API" for t in (0.1, 0.3, 0.5)],
        "    notify           0.800s         dead-lettered: finalised by the DLQ drain"]
    expired = lines.index("  side chord expired (a chain head sent already expired): chord SUCCESS;")
    assert lines[expired + 1:expired + 5] == [
        "    · doc31 failed: expired (head REVOKED); doc34 failed: revoked (head REVOKED); email sent",
        "    doc31 failed: expired", "         -0.004s        fetch expired before it ran (REVOKED)", "    doc34 failed: revoked"]
    behind = lines.index(f"  side chord behind (a poison member behind {FOREIGN} letters no drain can place): chord SUCCESS;")
    assert lines[behind + 1] == f"    · all {FOREIGN} foreign letters parked; doc33 failed: dead_lettered; email sent"
    assert lines.index("  notify duplicate 1.680→1.682s   skipped, sent=False (already sent)") < expired  # the main chord first
    assert max(len(line) for line in lines[expired:]) <= 100  # narrow enough to stand beside the broken run's timeline


def test_a_side_chord_that_hangs_says_what_held_it() -> None:
    tl = timeline.build(weak_sides_run())
    sides = {s.tag: s for s in tl.sides}
    doc31 = sides["expired"].timeline.docs[0]
    assert (doc31.final, doc31.mark, doc31.attempts) == ("revoked", "expired", ())  # not "not started": its head expired
    assert [(s.state, s.body, s.mark) for s in tl.sides] == [("PENDING", "never ran", "running"), ("PENDING", "kept", "kept"),
                                                              ("PENDING", "never ran", "running")]
    lines = plain_lines(tl, "fm3 weak")
    head = lines.index("  side chord expired (a chain head sent already expired): chord PENDING;")
    assert lines[head + 1:head + 3] == ["    · doc31's head REVOKED (expired), nothing ran after it",
                                        "    doc31 head expired before it ran: nothing after it ran"]
    head = lines.index("  side chord body (a poison notify): chord PENDING:")
    assert lines[head + 1] == "    · body dead-lettered after 3 deliveries, kept in the DLQ in silence (not a chord member, 2 passes)"
    assert "    notify           0.750s         dead-lettered: the drain kept its letter in the DLQ, nothing finalised it" in lines
    head = lines.index(f"  side chord behind (a poison member behind {FOREIGN} letters no drain can place): chord PENDING;")
    assert lines[head + 1:head + 3] == [f"    · none of {FOREIGN} foreign letters parked (DLQ: {FOREIGN + 3} ready at the end);",
                                        "    · doc33 never finalised by the drain"]  # fm3w has no claim to speak of


def test_a_member_whose_envelope_celery_holds_ended_though_its_chord_waits_for_the_body() -> None:
    """fm6w: the expired head's failure went down the chain (its member holds the envelope); the body waits behind
    pinned slots. The document failed ``expired``; what holds the chord is its body."""
    obs = weak_sides_run()
    stored = Outcome("SUCCESS", Result[Any].failure(EXPIRED_ERROR, "expired", 1), None, None)
    expired = dataclasses.replace(obs.sides["expired"], members={"doc31": stored})
    tl = timeline.build(dataclasses.replace(obs, sides={"expired": expired}))
    doc31 = tl.sides[0].timeline.docs[0]
    assert (doc31.final, doc31.reason, doc31.error) == ("failed", "expired", EXPIRED_ERROR)
    assert [f.text for f in tl.sides[0].facts] == ["doc31 failed: expired (head REVOKED)", "notify never ran"]


def test_a_side_chord_the_runner_never_sent_is_its_heading_alone() -> None:
    obs = weak_sides_run()
    behind = dataclasses.replace(obs.sides["behind"], submitted=False, events=(), chord=Outcome("NOT SENT", None, None, None))
    tl = timeline.build(dataclasses.replace(obs, sides={"behind": behind}, events=obs.events[:-1]))  # no foreign letters either
    assert plain_lines(tl)[-2:] == ["  side chord behind (a poison member behind letters no drain can place): not sent:",
                                    "    · the run stopped before the runner sent it"]


def test_a_member_celery_stored_as_failure_while_the_chord_waits_says_so() -> None:
    tl = timeline.build(member_failure_run())
    doc11, doc28 = doc(tl, "doc11"), doc(tl, "doc28")
    assert (doc11.final, doc11.member_error, doc11.mark, endings(tl, "doc11")) == (
        "member failure", "TimeLimitExceeded", "member_failure", ["killed"])  # not "running": Celery recorded its end
    assert (doc28.final, doc28.member_error, endings(tl, "doc28")) == ("member failure", "SoftTimeLimitExceeded", ["ok"])
    assert [(ms(st.start), st.seconds, ms(st.until), st.cut) for st in doc28.stalls] == [(800, 1.0, 1100, True)]
    assert doc(tl, "doc2").final == "ok"
    lines = plain_lines(tl)
    assert "  doc11 member FAILURE: TimeLimitExceeded, stored by Celery outside the body" in lines
    assert "  doc28 member FAILURE: SoftTimeLimitExceeded, stored by Celery outside the body" in lines
    assert "       0.800s         result store stalled 1.0 s after the body returned, cut at 1.100s" in lines


def test_a_stall_the_body_outlived_is_whole_and_a_finished_chord_keeps_its_own_words() -> None:
    events = [start(0.1, "doc28", 1), ev(0.8, "store_stall", doc="doc28", seconds="1.0"), end(1.81, "doc28", 1)]
    ok = timeline.build(dataclasses.replace(observations(events, summary_outcome(["doc28"], [])), docs=("doc28",)))
    assert [(ms(st.until), st.cut) for st in doc(ok, "doc28").stalls] == [(1800, False)]
    assert "       0.800s         result store stalled 1.0 s after the body returned" in plain_lines(ok)
    # once the chord finished, the chord's own account stands: a FAILURE member does not rewrite it
    lost = dataclasses.replace(lost_run(), members={"doc3": Outcome("FAILURE", None, "WorkerLostError", "x")})
    assert doc(timeline.build(lost), "doc3").final == "killed"


def test_a_timeline_reads_the_summary_once_not_once_per_document(monkeypatch: Any) -> None:
    """issue 26: the harness linear in N. Building the timeline of N documents names each summary entry a
    bounded number of times (``short_doc``), not N times each (3,000 documents took 1.25 s, now 0.03 s)."""
    from lab import records

    calls = {"n": 0}
    real = records.short_doc

    def counted(value: str) -> str:
        calls["n"] += 1
        return real(value)

    monkeypatch.setattr(records, "short_doc", counted)
    for n in (300, 900):
        docs = [f"doc{i}" for i in range(n)]
        events = [e for i, d in enumerate(docs) for e in (ev(0.001 * i, "attempt_start", doc=d, attempt=1),
                                                           end(0.001 * i + 0.0005, d, 1))]
        obs = dataclasses.replace(observations(events, summary_outcome(docs, [])), docs=tuple(docs))
        calls["n"] = 0
        tl = timeline.build(obs)
        assert [d.final for d in tl.docs] == ["ok"] * n
        assert calls["n"] <= 2 * n, (n, calls["n"])  # was n * n
