"""A ``Timeline`` as lines of text for the console.

``lines(tl, title)`` gives one line per document's final state, one per attempt
(start and end in seconds since submission, and how it ended), the DLQ drain's
finalisation, then every delivery of the chord's body (``notify``, or a case study's
``reconcile``) and, in an FM, every email. Then each side chord of the run: a heading
line (its tag, what it is for, its chord's outcome and its body's fate), its documents'
lines and its body's, indented under it. Document names are padded to the longest
(a case study's ``chunk000`` as much as ``doc1``). A line is a tuple of ``Piece``:
text plus, where it shows an ending, the key of its mark in ``timeline.MARKS``,
so a terminal can colour it and put the glyph in front, and a log can print the
words alone (``plain``).
"""

from __future__ import annotations

from typing import NamedTuple

from lab.show.timeline import MARKS, Attempt, DocTimeline, NotifyRun, SideTimeline, Timeline

ERROR_WIDTH = 48
"""Exception texts longer than this are cut (the report keeps them whole)."""
SIDE_WIDTH = 92
"""A side chord's facts wrap at this many columns (about the width of an attempt's line with its error)."""


class Piece(NamedTuple):
    text: str
    mark: str | None = None  # a key of MARKS


Line = tuple[Piece, ...]

FINAL_WORDS = {
    "kept": "kept: dead-lettered, the drain kept it in the DLQ (nothing finalised it)",
    "killed": "lost: killed and never delivered again",
    "running": "unfinished: no end when the run stopped",
    "retrying": "unfinished: a retry was still to come",
}


def seconds(t: float | None) -> str:
    return "?" if t is None else f"{t:.3f}"


def span(start: float, end: float | None) -> str:
    return (f"{start:.3f}→{end:.3f}s" if end is not None else f"{start:.3f}s→").ljust(14)


def short(text: str, width: int = ERROR_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


NO_CHORD = "no timeline: this program has no chord and its tasks carry no document the lab follows; its checks say what the run did"


def lines(tl: Timeline, title: str) -> list[Line]:
    if not tl.has_chord:
        return [(Piece(title),), (Piece(f"stopped: {tl.stopped_by} at {tl.span:.2f}s"),), (Piece(f"  {NO_CHORD}"),)]
    out: list[Line] = [(Piece(title),),
                       (Piece(f"stopped: {tl.stopped_by} at {tl.span:.2f}s; chord: {short(tl.chord, 60)}"),)]
    width = max([6, *(len(d.doc) + 1 for d in tl.docs)])
    for doc in tl.docs:
        out.extend(_doc(doc, tl.span, width))
    out.extend(_notify(tl))
    for side in tl.sides:
        out.extend(_side(side, tl.span))
    return out


def _side(side: SideTimeline, stopped_at: float) -> list[Line]:
    """A side chord: its heading line, then its documents' and its body's lines, indented under it."""
    purpose = f" ({side.purpose})" if side.purpose else ""
    head: list[Line] = [(Piece(f"  side chord {side.tag}{purpose}: "), Piece(side.head + side.joint.rstrip(), side.mark))]
    line: list[Piece] = [Piece("    · ")]
    for i, f in enumerate(side.facts):  # the facts under the heading, wrapped: a side-by-side console stays narrow
        text = f.text + (";" if i + 1 < len(side.facts) else "")
        if len(line) > 1 and sum(len(p.text) for p in line) + 1 + len(text) > SIDE_WIDTH:
            head.append(tuple(line))
            line = [Piece("    · ")]
        line += [*([Piece(" ")] if len(line) > 1 else []), Piece(text, f.mark)]
    if len(line) > 1:
        head.append(tuple(line))
    if side.state == "NOT SENT":
        return head
    sub = side.timeline
    width = max([6, *(len(d.doc) + 1 for d in sub.docs)])
    body = [*(x for d in sub.docs for x in _doc(d, stopped_at, width)), *_notify(sub, fate=side)]
    return [*head, *(((Piece("  " + ln[0].text, ln[0].mark), *ln[1:]) if ln else ln) for ln in body)]


def _doc(d: DocTimeline, stopped_at: float, width: int = 6) -> list[Line]:
    what = (f"failed: {d.reason}" if d.final == "failed" else d.member_words if d.final == "member failure"
            else f"head {'expired' if d.expired else 'revoked'} before it ran: nothing after it ran" if d.final == "revoked"
            else "unfinished: fetch still running (hung head)" if d.hung
            else "lost: acked with its result unstored, never delivered again" if d.final == "killed" and d.unstored
            else FINAL_WORDS.get(d.final, d.final))
    out: list[Line] = [(Piece(f"  {d.doc:<{width}}"), Piece(what, d.mark))]
    for a in d.attempts:
        stage = "fetch " if a.stage == "fetch" else ""
        out.append((Piece(f"    #{a.n} {span(a.start, a.end)} "), Piece(stage + _ending(a, stopped_at), a.mark)))
    for st in d.stalls:
        cut = f", cut at {st.until:.3f}s" if st.cut else ""
        out.append((Piece(f"       {seconds(st.start)}s".ljust(22)),
                    Piece(f"result store stalled {st.seconds:.1f} s after the body returned{cut}", "store_stall")))
    if d.revoked_at is not None:
        out.append((Piece(f"       {seconds(d.revoked_at)}s".ljust(22)),
                    Piece(f"fetch {'expired' if d.expired else 'revoked'} before it ran (REVOKED)",
                          "expired" if d.expired else "revoked")))
    if d.dead_lettered_at is not None:
        out.append((Piece(f"       {seconds(d.dead_lettered_at)}s".ljust(22)),
                    Piece("dead-lettered: finalised by the DLQ drain", "dead_lettered")))
    if d.kept_at is not None:
        why = f" ({d.kept_why})" if d.kept_why else ""
        out.append((Piece(f"       {seconds(d.kept_at)}s".ljust(22)),
                    Piece(f"dead-lettered: the drain kept it in the DLQ{why}", "kept")))
    return out


def _ending(a: Attempt, stopped_at: float) -> str:
    if a.how == "ok":
        return "ok"
    if a.how == "killed":
        return "killed: the process died"
    if a.how == "running":
        return f"no end when the run stopped ({stopped_at:.2f}s)"
    if a.how == "retried":
        return f"raised {a.reason}, retried after {1000 * (a.retry_in or 0.0):.0f} ms"
    return f"raised {a.reason}: {short(a.error)}"


def _notify(tl: Timeline, fate: SideTimeline | None = None) -> list[Line]:
    """The body's deliveries and emails; ``fate``: a side chord, whose body's dead letter has a line too."""
    if not tl.notifies:
        return [(Piece(f"  {tl.body}  "), Piece("never ran", "running"))]
    out: list[Line] = []
    for n in tl.notifies:
        out.append((Piece(f"  {tl.body} {n.role:<9} {span(n.start, n.end)} "), Piece(*_notify_ending(n))))
    if tl.counts_emails:
        for e in tl.emails:
            out.append((Piece(f"  email  {e.role:<9} {seconds(e.t)}s".ljust(34)), Piece("email sent", "email")))
    if fate is not None and fate.body in ("dead_lettered", "kept"):
        what = ("dead-lettered: finalised by the DLQ drain" if fate.body == "dead_lettered"
                else "dead-lettered: the drain kept its letter in the DLQ, nothing finalised it")
        out.append((Piece(f"  {tl.body} {'':<9} {seconds(fate.body_at)}s".ljust(34)), Piece(what, fate.body)))
    return out


def _notify_ending(n: NotifyRun) -> tuple[str, str]:
    gate = f", waited at the gate from {n.gate_wait:.3f}s" if n.gate_wait is not None else ""
    if n.how == "sent":
        dedup = ", the mail API dropped the repeat (same idempotency key)" if n.deduplicated_at is not None else ""
        return f"sent{gate}{dedup}", "ok"
    if n.how == "skipped":
        return "skipped, sent=False (already sent)", "ok"
    if n.how == "ended":
        seen = " (its end known from the chord's stored result)" if n.returned else ""
        return (f"ended: ok{seen}", "ok") if n.outcome == "ok" else (f"ended: {n.outcome}{seen}", "error")
    if n.how == "retried":
        return f"retried after {1000 * (n.retry_in or 0.0):.0f} ms (claim busy)", "retried"
    if n.how == "killed":
        if n.crash == "poison_mail":
            return f"killed by the poison mail API{gate}", "killed"
        if n.crash is None:
            return f"killed: the process died (no end recorded), delivered again{gate}", "killed"
        return f"killed {'after the email was out' if n.crash == 'after_send' else 'before sending'}{gate}", "killed"
    return f"no end when the run stopped{gate}", "running"


def plain(line: Line) -> str:
    """A line as a log shows it: words only."""
    return "".join(p.text for p in line).rstrip()


def glyph(mark: str | None) -> str:
    found = MARKS.get(mark) if mark is not None else None
    return found.glyph if found is not None else ""
