"""A ``Timeline`` drawn as swimlanes for the HTML report: one row per lane, as wide as the page.

A figure is a CSS grid of rows (``<div class="lanes">``), each row a lane
(``<div class="lane" data-doc="doc4">``) of three cells: its name, its plot (an inline
SVG whose width is the column's, every position in per cent of it, so the plot
stretches with the page and in print while marks and text keep their size) and, in
words, what happened in it (``<span class="what">``): the details are on the page,
not only in tooltips, so they print. A name sits in its own column: it never covers a mark.

Lanes, top to bottom: one per document; three or more consecutive documents whose
story is the same (a burst, a run of healthy chunks) share one lane
(``data-docs`` lists them); then one lane per delivery of the chord's body
(``notify``, a case study's ``reconcile``): the claim's story (the chord's notify killed
before sending, its redelivery sending and killed, the one that completes; the duplicate's
busy-retries, then its skip) reads lane by lane. Consecutive busy-retries of one
role share a lane; when the deliveries crowd into a small part of the run, their lanes
get a time axis of their own, zoomed in. In a later run of the FM (broken, hard variant)
the documents whose story is the one they had in the fixed run get one line that says
so ("as above", ``data-docs``): what stays in lanes is what the symptom changed; in the hard
variant's run, of the documents left, those whose story is the broken run's get a line too
(and its body, when it never ran in either). A later run's lanes group two documents with one
story; documents with no attempt share their story's lane wherever they stand (named
``20 documents``, the words list them by number: ``doc10–doc28, doc30``). A fetch that
started and never ended, with no parse after it, is a hung head (``fetch still running``).
In a big run (``COMPACT_BODY_FROM`` document lanes and more: from the retries' burst on) the
body's deliveries share one lane per role, told one after the other.
Documents named with a common batch prefix are named without it (the caption gives it).

Side chords (``Timeline.sides``, a hard variant's own chord) come last, one row each
(``data-side``), named ``side <tag>``: in words its chord's outcome, what it is for and
what became of its body, its letters, its documents and its claim, each with its mark
(``expired`` for a head that expired, ``dead_lettered`` or ``kept`` for the body's letter,
``email``). A side chord that completed is that line alone (``<div class="side">``); one
that did not gets a lane (``<div class="lane">``) whose track holds its documents'
attempts and its body's deliveries: the plot is kept for what failed, so that a section
stays about two screens. A side chord whose story is the fixed run's is named on the
"as above" line instead.

An attempt is a bar from its start to its end; its ending is a mark in the colour and
shape of ``timeline.MARKS``: one per envelope reason (``error``, ``dead_lettered``,
``retries_exhausted``, ``soft_timeout``, ``hard_timeout``, ``time_limit``) and for ``ok``,
``killed`` (a dashed bar up to whatever came next, since no end was recorded),
``retried`` (a dotted line over the backoff to the next attempt), ``running`` (a bar to
the right edge), ``kept`` (a dead letter the drain kept), ``email`` and ``deduplicated``;
``member_failure`` ends a document whose chord member Celery stored as FAILURE outside the
body, and ``store_stall`` starts a thin bar over the time its result store stalled.
``legend(keys)`` lists marks with their labels: the report puts every mark at the top and,
per FM, the marks its figures use. Every text is escaped.

One piece: the lanes, their marks and the legend are one SVG vocabulary; split, each mark would sit apart from
its legend entry.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from html import escape

from lab.show.timeline import MARKS, Attempt, DocTimeline, Injected, NotifyRun, SideTimeline, Stall, Timeline, UNSTORED, WorkerLife
from lab.show.timeline_text import short

LANE = 17  # px: the height of a lane's plot
AXIS = 16  # px: the height of the time axis
MID = 10  # px: a lane's centre line (room above it for a delay's label)
R = 5.5  # mark radius
LO, HI = 1.5, 98.0  # per cent of the plot where time 0 and the end of the span sit
GROUP_AT = 3  # consecutive documents with one story share a lane from this many on
COMPACT_BODY_FROM = 12
"""From this many document lanes on (a big run: the retries' burst and on), the body's deliveries share a lane per role."""
DELAY_LABEL_AT = 9.0  # per cent of the plot a backoff must span to carry its delay's label


@dataclass(frozen=True)
class Figure:
    """A run's swimlanes (HTML) and the marks they draw (for the FM's legend)."""

    html: str
    marks: frozenset[str]
    prefix: str = ""  # what every document's name starts with, left out of the lane names
    names: int = 0  # the longest lane name, in characters: the page gives an FM's figures one name column (``--names``)


@dataclass
class _Row:
    name: str
    attrs: dict[str, str]
    what: str  # HTML
    parts: list[str] = field(default_factory=lambda: [])
    same: bool = False  # a line for the documents whose story is the fixed run's (no plot)
    line: bool = False  # a side chord's line: words only, across the plot's column and the words' (no plot)
    height: int = LANE  # px: its plot's


class _Scale:
    """Seconds to per cent of a plot: ``t0`` at ``LO``, ``t0 + span`` at ``HI``."""

    def __init__(self, span: float, t0: float = 0.0) -> None:
        self.span, self.t0 = max(span, 0.05), t0

    def x(self, t: float) -> float:
        return round(LO + (HI - LO) * min(max(t - self.t0, 0.0), self.span) / self.span, 2)

    def step(self) -> float:
        for step in (0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0):
            if self.span / step <= 8:
                return step
        return 120.0

    def ticks(self) -> list[float]:
        step = self.step()
        k = math.ceil(self.t0 / step - 1e-9)
        out: list[float] = []
        while k * step <= self.t0 + self.span + 1e-9:
            out.append(round(k * step, 6))
            k += 1
        return out

    def grid(self, height: int = LANE) -> str:
        return "".join(f'<line class="grid" x1="{self.x(t)}%" y1="0" x2="{self.x(t)}%" y2="{height}"/>' for t in self.ticks())

    def axis(self, name: str, what: str, zoom: bool = False, kind: str = "") -> str:
        ticks = "".join(f'<text x="{self.x(t)}%" y="12" text-anchor="middle">{t:g}</text>' for t in self.ticks())
        extra = (" zoom" if zoom else "") + (f" {kind}" if kind else "")
        return (f'<div class="axis{extra}"><span class="name">{escape(name)}</span><svg class="plot" '
                f'xmlns="http://www.w3.org/2000/svg" height="{AXIS}" aria-hidden="true">{ticks}</svg>'
                f'<span class="what">{escape(what)}</span></div>')


ZOOM_BELOW = 0.4
"""The body's lanes get a time axis of their own (zoomed in) when its deliveries span less than this share of the run."""


def _body_scale(tl: Timeline, scale: _Scale) -> _Scale | None:
    """A zoomed scale for the body's deliveries when they crowd into a corner of the run's (the claim's story)."""
    if len(tl.notifies) < 2:
        return None
    t0 = min(n.start for n in tl.notifies)
    t1 = max([*(n.end if n.end is not None else tl.span for n in tl.notifies), *(e.t for e in tl.emails)])
    if t1 - t0 >= ZOOM_BELOW * scale.span:
        return None
    pad = 0.04 * (t1 - t0) + 0.005
    return _Scale(t1 - t0 + 2 * pad, max(t0 - pad, 0.0))


def blocks(tl: Timeline) -> list[SideTimeline]:
    """The side chords the runner acted on from outside (deploys, an outage, a cut, a consumer timeout) that get a
    block of lanes of their own: the ones this run's scenario adds (its lesson), and any that did not complete."""
    return [s for s in tl.sides if s.hit and (s.scenario == tl.scenario or s.state not in ("SUCCESS", "NOT SENT"))]


def main_span(tl: Timeline) -> float:
    """The seconds the run's own lanes need: the whole run, unless side chords the runner acted on came last (each
    ``blocks`` one has its own time axis, the others a line of words): then up to the end of everything else."""
    if not any(s.hit for s in tl.sides):
        return tl.span
    own = [*(t for d in tl.docs for t in _doc_times(d)), *(n.end or n.start for n in tl.notifies), *(e.t for e in tl.emails),
           *(s.end for s in tl.sides if not s.hit)]
    return max(own, default=tl.span)


def _doc_times(d: DocTimeline) -> list[float]:
    return [*(a.end if a.end is not None else a.start for a in d.attempts),
            *(t for t in (d.dead_lettered_at, d.kept_at, d.revoked_at) if t is not None)]


def render(tl: Timeline, span: float | None = None, like: Timeline | None = None, like_name: str = "fixed",
           also: Timeline | None = None, also_name: str = "broken", side_spans: dict[str, float] | None = None,
           like_where: str = "above") -> Figure:
    """The run as lanes; ``span`` (seconds) sets a time scale shared with the FM's other runs.

    ``like``: the FM's first run (its fixed run), drawn above this one: the documents whose
    story is the same there (same endings, same final state) get one line that says so
    instead of a lane each, so a broken run shows what its symptom changed; ``also``: a later
    run drawn above too (the broken run, above the hard variant's): of the documents left, those
    whose story is the same there get a line that says so. The body's
    lanes come under an axis of their own, zoomed in, when its deliveries crowd into a
    small part of the run (``ZOOM_BELOW``); so do its deliveries when they are ``like``'s.

    A side chord the runner acted on from outside (``blocks``) comes last, under a time axis of its own (as long as
    ``side_spans`` says for its tag, so that the FM's runs line up): the workers its deploys started and stopped, a
    lane each, their attempts in their pool's slots; its documents, those with one story in one lane; its body's
    deliveries; and what the runner did drawn on the lanes it hit (``_injected_parts``). ``like_where``: where the
    ``like`` run is ("above", or another FM's section)."""
    scale = _Scale(max(span or 0.0, main_span(tl)))
    used: set[str] = set()
    prefix = _prefix([d.doc for d in tl.docs])
    before = {d.doc: _shape(d) for d in like.docs} if like is not None else {}
    same = [d for d in tl.docs if before.get(d.doc) == _shape(d)]
    earlier = {s.tag: _side_shape(s) for s in like.sides} if like is not None else {}
    same_sides = [s.tag for s in tl.sides if earlier.get(s.tag) == _side_shape(s)]
    same_body = like is not None and bool(tl.notifies) and _body_shape(tl) == _body_shape(like)
    rows = ([_same_row(same, tl.docs, prefix, like_name, same_sides, tl.body if same_body else "", like_where)]
            if same or same_sides or same_body else [])
    shapes = {d.doc: _shape(d) for d in also.docs} if also is not None else {}
    told = [d for d in tl.docs if d not in same and shapes.get(d.doc) == _shape(d)]
    idle = also is not None and not tl.notifies and not also.notifies  # the body never ran there either
    rows += [_same_row(told, tl.docs, prefix, also_name, body=tl.body if idle else "")] if told or idle else []
    rows += [_doc_row(group, scale, tl.span, prefix, used, tl.docs)
             for group in _groups([d for d in tl.docs if d not in same and d not in told], 2 if like is not None else GROUP_AT)]
    zoom = None if same_body else _body_scale(tl, scale)
    body_rows = [] if idle or same_body else _body_rows(tl, zoom or scale, used, compact=len(rows) >= COMPACT_BODY_FROM)
    drawn = [s for s in blocks(tl) if s.tag not in same_sides]
    parts = [scale.axis("t (s)", "what happened")] if rows or body_rows or not drawn else []
    parts += [_row_html(row, scale) for row in rows]
    if zoom is not None:
        t1 = zoom.t0 + zoom.span
        parts.append(zoom.axis("t (s), zoom", f"{tl.body}'s deliveries, zoomed in: {zoom.t0:.2f}–{t1:.2f}s", zoom=True))
    parts += [_row_html(row, zoom or scale) for row in body_rows]
    side_rows = [_side_row(s, scale, used) for s in tl.sides if s.tag not in same_sides and s not in drawn]
    if zoom is not None and any(not row.line for row in side_rows):  # back to the run's time scale for their plots
        parts.append(scale.axis("t (s)", "side chords, on the run's time scale", kind="sides"))
    parts += [_row_html(row, scale) for row in side_rows]
    block_rows: list[_Row] = []
    for s in drawn:
        html, rows_of = _block(s, (side_spans or {}).get(s.tag, 0.0), used)
        parts.append(html)
        block_rows += rows_of
    label = f"timeline of run {tl.run_id}"
    return Figure(f'<div class="lanes" role="group" aria-label={_q(label)}>{"".join(parts)}</div>', frozenset(used), prefix,
                  max([*(len(row.name) for row in [*rows, *body_rows, *side_rows, *block_rows]),
                       *(len(f"side {s.tag}") for s in drawn)], default=8))


def _body_shape(tl: Timeline) -> tuple[object, ...]:
    """What the body's deliveries tell, without their times (a run of busy-retries, however long, as one): equal
    shapes tell one story."""
    steps: list[tuple[object, ...]] = []
    for n in sorted(tl.notifies, key=lambda n: n.role):  # each role's deliveries in order
        step = (n.role, n.how, n.crash, n.outcome, n.gate_wait is None, n.deduplicated_at is None)
        if not (n.how == "retried" and steps[-1:] == [step]):
            steps.append(step)
    return tuple(steps), len(tl.emails)


# ---- a side chord the runner acted on: a block of lanes on its own time axis ------------------------------------


BLOCK_PAD = 0.03
"""A block's axis starts and ends this share of its span before its first and after its last event."""
WORKER_LANE = 22  # px: a worker's lane, its pool's two slots one above the other


def side_span(s: SideTimeline) -> float:
    """The seconds a side's block spans (the report gives an FM's runs the longest, per side)."""
    return max(s.end - s.start, 0.05)


def _block(s: SideTimeline, span: float, used: set[str]) -> tuple[str, list[_Row]]:
    """A side chord as a block: its axis (its words in the words' column), its workers, documents and body, and what
    the runner did on the lanes it hit."""
    width = max(span, side_span(s))
    scale = _Scale(width * (1 + 2 * BLOCK_PAD), s.start - BLOCK_PAD * width)
    sub = s.timeline
    workers = [_worker_row(w, s, scale, used) for w in s.workers]
    hit = {i.doc for i in s.injected if i.doc}
    docs = [_doc_row(g, scale, sub.span, "", used, sub.docs, deliveries=True) for g in _block_groups(sub.docs, hit)]
    plain = len(sub.notifies) == 1 and sub.notifies[0].how == "sent" and len(sub.emails) == 1  # its words say "email sent"
    body = [] if plain else _body_rows(sub, scale, used)
    exits = [i for i in s.injected if i.kind == "worker_exit"]
    linked = [_Row("linked worker", {"data-doc": "linked worker", "data-worker": "linked"},
                   f'<b class="final" style="color:{MARKS["worker_exit"].colour}">exited</b> · '
                   + escape("; ".join(i.words for i in exits)))] if exits else []
    rows = [*linked, *workers, *docs, *body]
    for row in rows:
        row.parts[:0] = _bands(s.injected, scale, used)  # under the lane's own bars and marks
        row.parts += _injected_parts(s.injected, row, scale, used)
    purpose = f" · {escape(s.purpose)}" if s.purpose else ""
    facts = "; ".join(_icon(f.mark, used) + escape(f.text) if f.mark else escape(f.text) for f in s.facts)
    words = f'<b class="final" style="color:{MARKS[s.mark].colour}">{escape(s.head)}</b>{purpose}'
    used.add(s.mark)
    t1 = scale.t0 + scale.span
    axis = (f'<div class="axis block" data-side="{escape(s.tag)}"><span class="name">side {escape(s.tag)}</span>'
            f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" height="{AXIS}" aria-label="{scale.t0:.2f}–{t1:.2f}s">'
            + "".join(f'<text x="{scale.x(t)}%" y="12" text-anchor="middle">{t:g}</text>' for t in scale.ticks())
            + f'</svg><span class="what">{words}</span></div>')
    if facts:  # a row of their own, as wide as the plot and the words (in the words' column they made the axis tall)
        axis += f'<div class="block-facts" data-side="{escape(s.tag)}"><span class="what">{facts}</span></div>'
    return axis + "".join(_row_html(row, scale) for row in rows), rows


def _block_groups(docs: Sequence[DocTimeline], hit: set[str]) -> list[list[DocTimeline]]:
    """A block's documents: those with one story (and as many deliveries) share a lane wherever they stand; a document
    the runner's act names (the member a cut met) keeps a lane of its own."""
    out: dict[tuple[object, ...], list[DocTimeline]] = {}
    for d in docs:
        key = (d.doc,) if d.doc in hit else (_shape(d), len(d.delivered))
        out.setdefault(key, []).append(d)
    return list(out.values())


def _bands(injected: Sequence[Injected], scale: _Scale, used: set[str]) -> list[str]:
    """The outage's band across a lane: from the backend's stop until it answered again."""
    out: list[str] = []
    for i in injected:
        if i.kind == "backend_down" and i.until is not None:
            used.add("backend_down")
            x0, x1 = scale.x(i.t), scale.x(i.until)
            out.append(f'<rect class="band band-backend_down" x="{x0}%" y="0" width="{round(max(x1 - x0, 0.3), 2)}%" '
                       f'height="100%" fill="{MARKS["backend_down"].colour}" fill-opacity=".22">'
                       f"<title>{escape(i.words)} ({i.t:.2f}–{i.until:.2f}s)</title></rect>")
    return out


def _injected_parts(injected: Sequence[Injected], row: _Row, scale: _Scale, used: set[str]) -> list[str]:
    """What the runner did, on a lane it hit: the cut (a line across every lane, its mark on the member that ran), the
    consumer timeout (on the over-long member's lane: a dashed line at the broker's deadline, its mark where it
    fired) and the linked worker's exit."""
    out: list[str] = []
    doc = row.attrs.get("data-doc", "")
    docs = row.attrs.get("data-docs", doc).split()
    for i in injected:
        x = scale.x(i.t)
        if i.kind == "link_cut":
            out.append(f'<line class="cut" x1="{x}%" y1="0" x2="{x}%" y2="100%" stroke="{MARKS["link_cut"].colour}" '
                       f'stroke-width="1.6"><title>{escape(i.words)} at {i.t:.3f}s</title></line>')
            if i.doc in docs:
                out.append(_mark("link_cut", x, MID, f"{i.words} at {i.t:.3f}s", used))
        elif i.kind == "consumer_timeout" and i.doc in docs:
            out.append(f'<line class="deadline" x1="{x}%" y1="0" x2="{x}%" y2="100%" '
                       f'stroke="{MARKS["consumer_timeout"].colour}" stroke-width="1.4" stroke-dasharray="3 2">'
                       f"<title>{escape(i.words)}</title></line>")
            at = scale.x(i.until) if i.fired and i.until is not None else x
            out.append(_mark("consumer_timeout", at, MID, f"{i.words} (deadline {i.t:.3f}s)", used))
        elif i.kind == "worker_exit" and doc == "linked worker":
            out.append(_mark("worker_exit", x, MID, f"{i.words} at {i.t:.3f}s", used))
    return out


def _worker_row(w: WorkerLife, s: SideTimeline, scale: _Scale, used: set[str]) -> _Row:
    """A deploy's worker: booting (dashed) until it took its first message, its attempts in its pool's slots, its
    SIGTERM, and its end: SIGKILL at the grace's end, or its own exit."""
    end = w.gone if w.gone is not None else s.end
    mid = WORKER_LANE / 2
    parts: list[str] = []
    begin = w.started if w.started is not None else (w.up if w.up is not None else s.start)
    ready = w.up if w.up is not None else end
    grey = MARKS["running"].colour
    if w.started is not None:
        parts.append(f'<line class="booting" x1="{scale.x(begin)}%" y1="{mid}" x2="{scale.x(ready)}%" y2="{mid}" '
                     f'stroke="{grey}" stroke-width="1.2" stroke-dasharray="2 2">'
                     f"<title>{escape(w.name)} starting from {begin:.3f}s</title></line>")
    parts.append(f'<line class="serving" x1="{scale.x(ready)}%" y1="{mid}" x2="{scale.x(end)}%" y2="{mid}" '
                 f'stroke="{grey}" stroke-width="1"/>')
    for a in w.attempts:
        y = 2 + 11 * min(a.slot, 1)
        key = "ok" if a.attempt.how == "ok" else "killed" if a.attempt.how in ("killed", "running") else "error"
        x0, x1 = scale.x(a.attempt.start), scale.x(a.until)
        tip = f"{a.doc} attempt {a.attempt.n} on {w.name}: {a.attempt.start:.3f}s → {_tip(a.attempt, a.until)}"
        parts.append(f'<rect class="slot slot-{a.attempt.how}" data-doc="{escape(a.doc)}" x="{x0}%" y="{y}" '
                     f'width="{round(max(x1 - x0, 0.3), 2)}%" height="7" rx="1.5" fill="{MARKS[key].colour}" '
                     f'fill-opacity="{".85" if key == "ok" else ".35"}"><title>{escape(tip)}</title></rect>')
    words: list[str] = []
    if w.started is None:
        words.append("the run's worker")
    elif w.up is not None:
        words.append(f"up {w.up:.2f}s")
        parts.append(_mark("worker_up", scale.x(w.up), mid, f"{w.name}: started {w.started:.3f}s, its first message "
                           f"at {w.up:.3f}s", used))
    else:
        words.append(f"started {w.started:.2f}s, took no message")
    words.append(f"ran {len(w.attempts)} attempt{'s' if len(w.attempts) != 1 else ''}")
    if w.term is not None:
        held = f", holding {', '.join(d.split(':')[0] for d in w.waiting)} unstarted" if w.waiting else ""
        words.append(f"SIGTERM {w.term:.2f}s while running {', '.join(w.running) or 'nothing'}{held}")
        parts.append(_mark("sigterm", scale.x(w.term), mid, f"{w.name}: SIGTERM at {w.term:.3f}s", used))
    if w.gone is not None and w.term is not None:
        after = f"{w.gone - w.term:.2f} s later"
        if w.how == "killed":
            words.append(f"SIGKILL {after}" + (f": {', '.join(w.lost)} lost mid-body" if w.lost else ""))
        else:
            words.append(f"exited {after}")
        key = "sigkill" if w.how == "killed" else "worker_exit"
        parts.append(_mark(key, scale.x(w.gone), mid, f"{w.name}: {'SIGKILL' if w.how == 'killed' else 'exited'} at "
                           f"{w.gone:.3f}s", used))
    elif w.term is None:
        words.append("served to the end")
    what = f'<b class="final">{escape(words[0])}</b> · ' + escape("; ".join(words[1:]))
    return _Row(w.name, {"data-doc": w.name, "data-worker": w.name}, what, parts, height=WORKER_LANE)


def _row_html(row: _Row, scale: _Scale) -> str:
    if row.same:
        sides = f' data-sides={_q(row.attrs["data-sides"])}' if row.attrs.get("data-sides") else ""
        body = f' data-body={_q(row.attrs["data-body"])}' if row.attrs.get("data-body") else ""
        return (f'<div class="same" data-docs={_q(row.attrs["data-docs"])}{sides}{body}><span class="name">{escape(row.name)}</span>'
                f'<span class="what">{row.what}</span></div>')
    if row.line:
        attrs = "".join(f" {k}={_q(v)}" for k, v in row.attrs.items())
        return f'<div class="side"{attrs}><span class="name">{escape(row.name)}</span><span class="what">{row.what}</span></div>'
    attrs = "".join(f" {k}={_q(v)}" for k, v in row.attrs.items())
    return (f'<div class="lane"{attrs}><span class="name">{escape(row.name)}</span>'
            f'<span class="track"><svg class="plot" xmlns="http://www.w3.org/2000/svg" height="{row.height}" role="img" '
            f'aria-label={_q(row.name)}>{scale.grid(row.height)}{"".join(row.parts)}</svg></span>'
            f'<span class="what">{row.what}</span></div>')


def _q(value: str) -> str:
    return f'"{escape(value)}"'


# ---- documents ------------------------------------------------------------------


def _prefix(docs: Sequence[str]) -> str:
    """A batch id every name starts with (``B212845-0ce453-``), cut after its last ``-``; else nothing."""
    if len(docs) < 2:
        return ""
    common = os.path.commonprefix(list(docs))
    cut = common[: common.rfind("-") + 1]
    return cut if len(cut) >= 4 else ""


def _shape(d: DocTimeline) -> tuple[object, ...]:
    """What a document's lane tells, without its times: equal shapes can share a lane."""
    return (tuple((a.stage, a.how, a.reason) for a in d.attempts), d.final, d.reason,
            d.dead_lettered_at is None, d.kept_at is None, d.revoked_at is None, d.member_error, len(d.stalls))


def _groups(docs: Sequence[DocTimeline], at: int = GROUP_AT) -> list[list[DocTimeline]]:
    """Consecutive documents with one story, from ``at`` of them on (a later run's: two, its symptom is the story);
    documents with no attempt (nothing to plot) join their story's group wherever they stand (``not started``:
    the documents a stopped run never reached)."""
    out: list[list[DocTimeline]] = []
    idle: dict[tuple[object, ...], list[DocTimeline]] = {}
    for d in docs:
        shape = _shape(d)
        if not d.attempts and shape in idle:
            idle[shape].append(d)
        elif out and _shape(out[-1][0]) == shape:
            out[-1].append(d)
        else:
            out.append([d])
            if not d.attempts:
                idle[shape] = out[-1]
    group_of = {d.doc: g for g in out for d in g}
    split: list[list[DocTimeline]] = []
    for d in docs:  # a group too small to share a lane: its documents in their own places
        g = group_of[d.doc]
        if len(g) < at:
            split.append([d])
        elif g[0] is d:
            split.append(g)
    return split


_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def _ranges(docs: Sequence[DocTimeline], among: Sequence[DocTimeline], prefix: str) -> str:
    """``doc1–doc10, doc12–doc27``: ``docs`` as runs of neighbours, by number when every name ends in one
    (``doc10, doc11, doc28``, ``doc12``..: ``doc10–doc12``), else in ``among``'s order."""
    numbered = [_NUMBERED.match(d.doc) for d in docs]
    if all(numbered):
        at = {d.doc: int(m.group(2)) for d, m in zip(docs, numbered) if m}
        stems = {d.doc: m.group(1) for d, m in zip(docs, numbered) if m}
        docs = sorted(docs, key=lambda d: (stems[d.doc], at[d.doc]))
    else:
        at = {d.doc: i for i, d in enumerate(among)}
        stems = {d.doc: "" for d in docs}
    runs: list[list[DocTimeline]] = []
    for d in docs:
        if runs and stems[d.doc] == stems[runs[-1][-1].doc] and at[d.doc] == at[runs[-1][-1].doc] + 1:
            runs[-1].append(d)
        else:
            runs.append([d])
    return ", ".join(r[0].doc.removeprefix(prefix) + (f"–{r[-1].doc.removeprefix(prefix)}" if len(r) > 2 else
                                                      f", {r[-1].doc.removeprefix(prefix)}" if len(r) == 2 else "")
                     for r in runs)


def _same_row(same: list[DocTimeline], among: Sequence[DocTimeline], prefix: str, like_name: str,
              sides: Sequence[str] = (), body: str = "", where: str = "above") -> _Row:
    """The line for the documents (and side chords, and a body: ``body``) whose story is ``like_name``'s."""
    extra = [*(f"side {tag}" for tag in sides), *([body] if body else [])]
    told = [*([_ranges(same, among, prefix)] if same else []), *extra]
    names = ", ".join(told[:-1]) + f" and {told[-1]}" if len(told) > 1 and extra else ", ".join(told)
    what = escape(f"{names}: the same story as in the {like_name} run {where} (same attempts and endings, same final state)")
    count = f"{len(same)} as above" if not extra else f"{len(same) + len(extra)} as above" if same else "as above"
    attrs = {"data-docs": " ".join(d.doc for d in same), "data-sides": " ".join(sides), **({"data-body": body} if body else {})}
    return _Row(count, attrs, what, same=True)


def _doc_row(group: list[DocTimeline], scale: _Scale, span: float, prefix: str, used: set[str],
             among: Sequence[DocTimeline] = (), deliveries: bool = False) -> _Row:
    first = group[0]
    name = first.doc.removeprefix(prefix)
    attrs = {"data-doc": first.doc, "data-final": first.final, "data-reason": first.reason or ""}
    ranges = _ranges(group, among or group, prefix)
    listed = "," in ranges and len(ranges) > 12  # named in the words: the name column stays narrow
    if len(group) > 1:  # neighbours: "doc12–doc27 ×16"; two: "doc5, doc6"; else a count, and the words name them
        name = (f"{len(group)} documents" if listed else ranges if "," in ranges
                else f"{name}–{group[-1].doc.removeprefix(prefix)} ×{len(group)}")
        attrs["data-docs"] = " ".join(d.doc for d in group)
    colour = MARKS[first.mark].colour
    used.add(first.mark)
    exact = len({_story(d) for d in group}) == 1  # a burst retried after one delay says it once, exactly
    story = _story(first, exact=exact)
    story = story or {"ok": "its first attempt returned", "not started": "no attempt began"}.get(first.final, "")
    extra = len(first.delivered) - len(first.attempts)
    if deliveries and extra > 0:  # a message handed back unstarted (a warm shutdown's prefetch), then delivered again
        story = f"delivered {len(first.delivered)}x, {extra}x handed back unstarted" + (f", {story}" if story else "")
    what = (f'<b class="final" style="color:{colour}">{escape(_final_word(first))}</b>'
            + (f" · {escape(ranges)}: " if listed else " · each: " if len(group) > 1 and story else " · " if story else "")
            + escape(story))
    row = _Row(name, attrs, what)
    for d in group:
        row.parts += _doc_parts(d, scale, span, used, labels=len(group) == 1)
        if deliveries and len(d.delivered) > len(d.attempts):
            row.parts += [_tick(d.doc, t, k + 1, scale, used) for k, t in enumerate(d.delivered)]
    return row


def _tick(doc: str, t: float, n: int, scale: _Scale, used: set[str]) -> str:
    """A delivery of a document's message to a worker: a short tick above its lane's centre."""
    used.add("delivered")
    x = scale.x(t)
    return (f'<line class="delivered" x1="{x}%" y1="{MID - 9}" x2="{x}%" y2="{MID - 3}" stroke="{MARKS["delivered"].colour}" '
            f'stroke-width="1.8"><title>{escape(doc)}: delivery {n} at {t:.3f}s</title></line>')


def _doc_parts(d: DocTimeline, scale: _Scale, span: float, used: set[str], labels: bool = True) -> list[str]:
    """A document's attempts, stalls and ending marks on a plot."""
    parts: list[str] = []
    for i, a in enumerate(d.attempts):
        after = d.attempts[i + 1].start if i + 1 < len(d.attempts) else (d.dead_lettered_at or d.kept_at)
        last = i == len(d.attempts) - 1
        last_reason = d.reason if last and d.final == "failed" else "member_failure" if last and d.final == "member failure" else None
        parts.append(_attempt(d.doc, a, scale, span if after is None else after, last_reason, used, labels=labels))
    for st in d.stalls:
        x0, x1 = scale.x(st.start), scale.x(st.until)
        tip = f"{d.doc}: {_stall_words(st)} (from {st.start:.3f}s to {st.until:.3f}s)"
        parts.append(f'<rect class="stall" x="{x0}%" y="{MID - 2}" width="{round(max(x1 - x0, 0.3), 2)}%" height="4" '
                     f'fill="{MARKS["store_stall"].colour}"><title>{escape(tip)}</title></rect>'
                     + _mark("store_stall", x0, MID, tip, used))
    if d.revoked_at is not None:
        key = "expired" if d.expired else "revoked"
        parts.append(_mark(key, scale.x(d.revoked_at), MID,
                           f"{d.doc}: its fetch (the chain's head) {key} before it ran, at {d.revoked_at:.3f}s", used))
    if d.dead_lettered_at is not None:
        parts.append(_mark("dead_lettered", scale.x(d.dead_lettered_at), MID,
                           f"{d.doc}: dead-lettered, finalised by the DLQ drain at {d.dead_lettered_at:.3f}s", used))
    if d.kept_at is not None:
        parts.append(_mark("kept", scale.x(d.kept_at), MID,
                           f"{d.doc}: dead-lettered, the drain kept it in the DLQ at {d.kept_at:.3f}s", used))
    return parts


def _stall_words(st: Stall, short: bool = False) -> str:
    """``short``: without where it was cut (a member failure: Celery stored the limit that cut it)."""
    if short:
        return f"store stalled {st.seconds:.1f} s"
    if st.cut:
        return f"result store stalled {st.seconds:.1f} s, cut at {st.until:.2f}s"
    return f"result store stalled {st.seconds:.1f} s"


FINAL = {"ok": "ok", "kept": "kept in the DLQ", "revoked": "head revoked", "member failure": "member FAILURE", "killed": "lost",
         "running": "still running", "retrying": "retry pending", "not started": "not started"}


def _final_word(d: DocTimeline) -> str:
    if d.final == "revoked" and d.expired:
        return "head expired"
    if d.hung:
        return "fetch still running"
    return (d.reason or "error") if d.final == "failed" else FINAL[d.final]


def _story(d: DocTimeline, exact: bool = True) -> str:
    """What happened to a document, in order, in words (``exact``: with its delays, times and errors)."""
    steps: list[str] = []
    runs: list[list[Attempt]] = []
    for a in d.attempts:
        if runs and (runs[-1][0].stage, runs[-1][0].how, runs[-1][0].reason) == (a.stage, a.how, a.reason):
            runs[-1].append(a)
        else:
            runs.append([a])
    for k, run in enumerate(runs):
        a, n = run[0], len(run)
        times = f" ×{n}" if n > 1 else ""
        stage = "fetch " if a.stage == "fetch" else ""
        if a.how == "ok":
            if k:  # a first attempt that returned says nothing the final state does not
                steps.append(f"{stage}ok on attempt {a.n}")
        elif a.how == "killed" and k == len(runs) - 1 and d.final == "failed" and d.reason == "time_limit":
            steps.append(f"{stage}killed at Celery's time_limit{times}, the backstop recorded it")
        elif a.how == "killed":
            steps.append(f"{stage}killed{times}")
        elif a.how == "running" and d.hung:
            steps.append("hung head: its fetch never ended, no parse began")
        elif a.how == "running":
            steps.append(f"{stage}running when the run stopped")
        elif a.how == "retried":
            delays = ", ".join(f"{1000 * (x.retry_in or 0.0):.0f}" for x in run)
            kind = (a.error.split(":", 1)[0] if a.error else "") or a.reason or "error"
            steps.append(f"{kind}{times}, retried" + (f" after {delays} ms" if exact else ""))
            if k + 1 < len(runs) and runs[k + 1][0].reason == "retries_exhausted":  # "retried after 183, 325 ms; gave up"
                steps[-1] += "; gave up"
                break
        elif a.reason == "retries_exhausted":
            steps.append("gave up")  # its mark and its final word say retries_exhausted, its tooltip the attempt
        elif a.error.startswith(UNSTORED):
            steps.append(UNSTORED)  # why the store failed is in its tooltip (cut to fit, it read "... stored (…")
        else:
            steps.append(short(_unqualified(a.error), 40 if steps else 52) if a.error and exact else f"raised {a.reason}")
    member = d.final == "member failure"  # its final word and its mark say Celery stored it outside the body
    steps += [_stall_words(st, short=member) if exact else "its result store stalled" for st in d.stalls]
    if d.revoked_at is not None:
        steps.append(f"its fetch {'expired' if d.expired else 'was revoked'} before it ran (REVOKED)"
                     + (", nothing ran after it" if d.final == "revoked" else ""))
    if d.dead_lettered_at is not None:
        steps.append("the DLQ drain finalised it" + (f" at {d.dead_lettered_at:.2f}s" if exact else ""))
    if d.kept_at is not None:
        steps.append("dead-lettered, and the drain kept it in the DLQ" + (f" ({d.kept_why})" if d.kept_why else ""))
    if member:
        steps.append(f"Celery stored {d.member_error or 'an error'}" + ("" if d.stalls else " outside the body"))
    elif d.final == "failed" and d.reason == "time_limit" and d.attempts and d.attempts[-1].how == "ok":
        steps.append("its time_limit fired")  # after the body returned: in the result store (the backstop's envelope says so)
    elif d.final == "failed" and d.error and exact and (not d.attempts or d.attempts[-1].how == "ok"):
        steps.append(short(_unqualified(d.error), 40 if steps else 52))  # what the envelope says, where no attempt shows it
    return ", then ".join(steps)


def _unqualified(error: str) -> str:
    """An exception's text with its task names unqualified (``parse_document``, not ``<short>_<what>.parse_document``):
    the section names the module once."""
    return re.sub(r"\b(?:fm\d\w*|case_studies(?:\.\w+)+)\.(?=\w)", "", error)


def _attempt(doc: str, a: Attempt, scale: _Scale, next_t: float, final_reason: str | None, used: set[str],
             labels: bool = True) -> str:
    x0 = scale.x(a.start)
    end = a.end if a.end is not None else next_t
    x1 = max(scale.x(end), x0 + 0.3)
    # A process killed at its time_limit has no end of its own; the backstop's envelope names it.
    # A member Celery stored as FAILURE outside the body ends there, whatever the attempt's own end.
    ended_by = a.how == "raised" or (a.how == "killed" and final_reason == "time_limit") or final_reason == "member_failure"
    mark = final_reason if ended_by and final_reason else a.mark
    tip = f"{doc} {'fetch' if a.stage == 'fetch' else 'attempt'} {a.n}: {a.start:.3f}s → " + _tip(a, next_t)
    bar = (f'<rect class="attempt attempt-{a.how}" data-attempt="{a.n}" x="{x0}%" y="{MID - 5}" width="{round(x1 - x0, 2)}%" '
           f'height="10" rx="2" fill="{MARKS[mark].colour}"><title>{escape(tip)}</title></rect>')
    extra = ""
    if a.how == "retried" and a.end is not None and a.retry_in is not None:
        due = max(scale.x(a.end + a.retry_in), x1)
        extra = f'<line class="backoff" x1="{x1}%" y1="{MID}" x2="{due}%" y2="{MID}" stroke="{MARKS["retried"].colour}"/>'
        if labels and due - x1 >= DELAY_LABEL_AT:  # a shared lane's labels would pile up
            extra += (f'<text class="delay" x="{round((x1 + due) / 2, 2)}%" y="{MID - 6}" text-anchor="middle">'
                      f"+{1000 * a.retry_in:.0f} ms</text>")
    return bar + extra + _mark(mark, x1, MID, tip, used)


# ---- side chords: one lane each ---------------------------------------------------------


def _side_shape(s: SideTimeline) -> tuple[object, ...]:
    """What a side chord's lane tells, without its times."""
    return (s.state, s.body, s.head, tuple(_shape(d) for d in s.timeline.docs),
            tuple((n.how, n.crash) for n in s.timeline.notifies))


def _side_row(s: SideTimeline, scale: _Scale, used: set[str]) -> _Row:
    """A side chord: its line of words, and a lane (its documents' attempts, its body's deliveries and fate on one
    track) when its chord did not complete."""
    key = s.mark
    used.add(key)
    purpose = f" · {escape(s.purpose)}" if s.purpose else ""
    facts = "; ".join(_icon(f.mark, used) + escape(f.text) if f.mark else escape(f.text) for f in s.facts)
    what = (f'<b class="final" style="color:{MARKS[key].colour}">{escape(s.head)}</b>{purpose}'
            + (f"{escape(s.joint)}{facts}" if facts else ""))
    attrs = {"data-doc": f"side {s.tag}", "data-side": s.tag, "data-state": s.state, "data-body": s.body}
    row = _Row(f"side {s.tag}", attrs, what, line=s.state in ("SUCCESS", "NOT SENT"))
    if row.line:
        return row
    sub = s.timeline
    for d in sub.docs:
        row.parts += _doc_parts(d, scale, sub.span, used)
    for n in sub.notifies:
        row.parts.append(_body_bar(sub, n, scale, used))
    if sub.counts_emails:
        row.parts += [_mark("email", scale.x(e.t), MID, f"side {s.tag}: email sent at {e.t:.3f}s", used) for e in sub.emails]
    if s.body in ("dead_lettered", "kept") and s.body_at is not None:
        tip = (f"side {s.tag}: its {sub.body} dead-lettered after {s.deliveries} deliveries; " +
               ("the drain finalised it" if s.body == "dead_lettered" else "the drain kept its letter in the DLQ")
               + f" at {s.body_at:.3f}s")
        row.parts.append(_mark(s.body, scale.x(s.body_at), MID, tip, used))
    return row


def _icon(key: str, used: set[str]) -> str:
    """Mark ``key`` inline, before the words it stands for (a side chord's line)."""
    used.add(key)
    colour = MARKS[key].colour
    return (f'<svg class="icon" xmlns="http://www.w3.org/2000/svg" width="13" height="13" viewBox="-9 -9 18 18" '
            f'aria-hidden="true"><g class="mark mark-{key}" fill="{colour}" stroke="{colour}">{shape(key, 0, 0)}</g></svg>')


def _tip(a: Attempt, next_t: float) -> str:
    if a.how == "killed":
        return f"no end recorded: the process died (what came next: {next_t:.3f}s)"
    if a.how == "running":
        return "no end when the run stopped"
    head = f"{a.end:.3f}s " if a.end is not None else ""
    if a.how == "ok":
        return head + "ok"
    if a.how == "retried":
        return head + f"raised {a.reason} ({a.error}); retry planned in {1000 * (a.retry_in or 0):.0f} ms"
    return head + f"raised {a.reason}: {a.error}"


# ---- the chord's body: one lane per delivery -------------------------------------------


def _body_lanes(tl: Timeline) -> list[list[NotifyRun]]:
    """The body's deliveries, by role (the chord's first), consecutive busy-retries of a role together."""
    roles = list(dict.fromkeys(["chord", *(n.role for n in tl.notifies)]))
    lanes: list[list[NotifyRun]] = []
    for role in roles:
        runs = [n for n in tl.notifies if n.role == role]
        for n in runs:
            if lanes and lanes[-1][0].role == role and n.how == "retried" and lanes[-1][-1].how == "retried":
                lanes[-1].append(n)
            else:
                lanes.append([n])
    return lanes


def _role_row(tl: Timeline, lanes: list[list[NotifyRun]], scale: _Scale, used: set[str]) -> _Row:
    """A role's deliveries on one lane (a big run's: the claim's story told again), in words one after the other."""
    role, runs = lanes[0][0].role, [n for lane in lanes for n in lane]
    name = (tl.body if role == "chord" else role) + (f" ×{len(runs)}" if len(runs) > 1 else "")
    key = _body_key(runs[-1], tl.counts_emails)
    used.add(key)
    heads = [_body_words(tl, lane, [n for n in tl.notifies if n.role == role].index(lane[0]) + 1)[0]
             + (f" (each retried after {1000 * (lane[0].retry_in or 0.0):.0f} ms)" if lane[0].how == "retried" else "")
             for lane in lanes]
    kills = [h.removeprefix("killed ") for h in heads[:-1] if h.startswith("killed")]
    said = (" and ".join(k.removesuffix(" sending") for k in kills) + " sending" if all(k.endswith(" sending") for k in kills)
            else " and ".join(kills))
    earlier = [*([f"after {'kills' if len(kills) > 1 else 'a kill'} {said}"] if kills else []),
               *(h for h in heads[:-1] if not h.startswith("killed"))]  # "after kills before and after sending"
    steps = ["after " + ", ".join(earlier).removeprefix("after ")] if earlier else []
    emails = _emails_in(tl, runs) if tl.counts_emails else []
    if emails:
        steps.append(f"email{'s' if len(emails) > 1 else ''} at " + ", ".join(f"{t:.3f}s" for t in emails))
    if any(n.deduplicated_at is not None for n in runs):
        steps.append("repeat dropped")
    if runs[-1].how == "skipped":
        steps.append("the claim said sent")
    what = (f'<b class="final" style="color:{MARKS[key].colour}">{escape(heads[-1])}</b>'
            + (f" · {escape('; '.join(steps))}" if steps else ""))
    row = _Row(name, {"data-doc": name, "data-role": role, "data-delivery": f"1-{len(runs)}", "data-how": runs[-1].how}, what)
    for lane in lanes:
        row.parts += _body_parts(tl, lane, scale, used)
    return row


def _body_parts(tl: Timeline, lane: list[NotifyRun], scale: _Scale, used: set[str]) -> list[str]:
    """A lane's deliveries of the body: their bars, the gate they waited at, the repeat the mail API dropped, their emails."""
    parts: list[str] = []
    for n in lane:
        parts.append(_body_bar(tl, n, scale, used))
        if n.gate_wait is not None:
            parts.append(f'<line class="gate" x1="{scale.x(n.gate_wait)}%" y1="{MID - 8}" x2="{scale.x(n.gate_wait)}%" '
                         f'y2="{MID + 8}"><title>held at the runner\'s gate from {n.gate_wait:.3f}s</title></line>')
        if n.deduplicated_at is not None:
            parts.append(_mark("deduplicated", scale.x(n.deduplicated_at), MID,
                               f"the mail API dropped this email at {n.deduplicated_at:.3f}s: same idempotency key", used))
    if tl.counts_emails:
        role = lane[0].role
        parts += [_mark("email", scale.x(t), MID, f"email sent by the {role} {tl.body} at {t:.3f}s", used) for t in _emails_in(tl, lane)]
    return parts


def _body_rows(tl: Timeline, scale: _Scale, used: set[str], compact: bool = False) -> list[_Row]:
    """The body's lanes: one per delivery (consecutive busy-retries together); ``compact``: one per role."""
    if not tl.notifies:
        used.add("running")
        return [_Row(tl.body, {"data-doc": tl.body, "data-role": "chord"},
                     f'<b class="final" style="color:{MARKS["running"].colour}">never ran</b>')]
    rows: list[_Row] = []
    lanes = _body_lanes(tl)
    if compact and len(lanes) > len({n.role for n in tl.notifies}):
        return [_role_row(tl, [lane for lane in lanes if lane[0].role == role], scale, used)
                for role in dict.fromkeys(lane[0].role for lane in lanes)]
    for lane in lanes:
        role = lane[0].role
        of_role = [n for n in tl.notifies if n.role == role]
        first, last = of_role.index(lane[0]) + 1, of_role.index(lane[-1]) + 1
        name = tl.body if role == "chord" else role
        if len(of_role) > 1:
            name += f" #{first}" if first == last else f" #{first}–{last}"
        delivery = str(first) if first == last else f"{first}-{last}"
        key = _body_key(lane[-1], tl.counts_emails)
        used.add(key)
        words = _body_words(tl, lane, first)
        what = f'<b class="final" style="color:{MARKS[key].colour}">{escape(words[0])}</b>' + (f" · {escape(words[1])}" if words[1] else "")
        row = _Row(name, {"data-doc": name, "data-role": role, "data-delivery": delivery, "data-how": lane[-1].how}, what)
        row.parts += _body_parts(tl, lane, scale, used)
        rows.append(row)
    return rows


def _emails_in(tl: Timeline, lane: list[NotifyRun]) -> list[float]:
    """The emails a lane's deliveries sent: same role, between a delivery's start and the role's next start."""
    of_role = [n for n in tl.notifies if n.role == lane[0].role]
    out: list[float] = []
    for n in lane:
        i = of_role.index(n)
        until = of_role[i + 1].start if i + 1 < len(of_role) else float("inf")
        out += [e.t for e in tl.emails if e.role == n.role and n.start <= e.t < until]
    return out


def _body_key(n: NotifyRun, emails: bool = True) -> str:
    """The mark of how a delivery ended (a case study's body sends no email: its ``sent`` is just an end)."""
    return {"sent": "email" if emails else "ok", "skipped": "ok", "ended": "ok" if n.outcome == "ok" else "error", "retried": "retried",
            "killed": "killed", "running": "running"}[n.how]


def _body_words(tl: Timeline, lane: list[NotifyRun], delivery: int) -> tuple[str, str]:
    """(how the lane ended, what happened before) for a lane of the body's deliveries."""
    n = lane[-1]
    steps: list[str] = []
    if n.role == "duplicate" and delivery == 1:
        steps.append(f"the scenario's second {tl.body}")
    elif n.role == "chord" and delivery > 1:
        steps.append("delivered again")
    if n.gate_wait is not None:
        steps.append(f"held at the runner's gate from {n.gate_wait:.3f}s")
    if tl.counts_emails:
        steps += [f"email sent at {t:.3f}s" for t in _emails_in(tl, lane)]
    if n.deduplicated_at is not None:
        steps.append("the mail API dropped its repeat (same key)")
    if n.returned:
        steps.append("its end known from the chord's stored result")
    before = "; ".join(steps)
    if n.how == "retried":
        delay = f"{1000 * (n.retry_in or 0.0):.0f} ms"
        head = f"claim busy ×{len(lane)}" if len(lane) > 1 else "claim busy"
        return head, "; ".join([*steps, f"{'each ' if len(lane) > 1 else ''}retried after {delay}"])
    if n.how == "killed":
        what = {"before_send": "killed before sending", "after_send": "killed after sending"}.get(n.crash or "", "killed")
        return what, before or ("no end recorded, the process died" if n.crash is None else "")
    if n.how == "sent":
        return ("sent=True" if tl.counts_emails else "ended ok"), before
    if n.how == "skipped":
        return "skipped", "; ".join([*steps, "the claim said sent: returned sent=False"])
    if n.how == "ended":
        return ("ended ok" if n.outcome == "ok" else f"ended: {n.outcome}"), before
    return "still running", "; ".join([*steps, "no end when the run stopped"])


def _body_bar(tl: Timeline, n: NotifyRun, scale: _Scale, used: set[str]) -> str:
    key, body = _body_key(n, tl.counts_emails), tl.body
    x0 = scale.x(n.start)
    x1 = max(scale.x(n.end if n.end is not None else tl.span), x0 + 0.3)
    retry = f" after {1000 * (n.retry_in or 0.0):.0f} ms (claim busy)" if n.how == "retried" else ""
    gate = f", waited at the gate from {n.gate_wait:.3f}s" if n.gate_wait is not None else ""
    crash = f" ({n.crash})" if n.crash else ""
    tip = f"{body} ({n.role}) {n.start:.3f}s → {n.how}{crash}{retry}{gate}"
    return (f'<rect class="notify-run notify-{n.how}" data-role="{escape(n.role)}" x="{x0}%" y="{MID - 5}" '
            f'width="{round(x1 - x0, 2)}%" height="10" rx="2" fill="{MARKS[key].colour}"><title>{escape(tip)}</title></rect>'
            f"{'' if key == 'email' else _mark(key, x1, MID, tip, used)}")  # a sent one has its email's mark


# ---- marks ------------------------------------------------------------------------


def _mark(key: str, x: float, y: float, tip: str, used: set[str]) -> str:
    used.add(key)
    colour = MARKS[key].colour
    return (f'<svg x="{x}%" y="{y}" overflow="visible"><g class="mark mark-{key}" fill="{colour}" stroke="{colour}">'
            f"{shape(key, 0, 0)}<title>{escape(tip)}</title></g></svg>")


def shape(key: str, x: float, y: float) -> str:
    """The SVG of mark ``key`` centred on (x, y)."""
    r = R
    if key == "ok":
        return f'<circle cx="{x}" cy="{y}" r="{r - 1}"/>'
    if key == "error":
        return (f'<path d="M{x - r} {y - r}L{x + r} {y + r}M{x - r} {y + r}L{x + r} {y - r}" stroke-width="2.6" '
                f'fill="none"/>')
    if key == "retries_exhausted":
        return (f'<circle cx="{x}" cy="{y}" r="{r + 1}"/><path d="M{x - 3} {y - 3}L{x + 3} {y + 3}M{x - 3} {y + 3}'
                f'L{x + 3} {y - 3}" stroke="#fff" stroke-width="1.8"/>')
    if key == "soft_timeout":
        return f'<polygon points="{x},{y - r - 1} {x + r + 1},{y + r} {x - r - 1},{y + r}"/>'
    if key == "hard_timeout":
        return f'<polygon points="{x},{y - r - 2} {x + r + 1},{y} {x},{y + r + 2} {x - r - 1},{y}"/>'
    if key == "dead_lettered":
        return f'<rect x="{x - r}" y="{y - r}" width="{2 * r}" height="{2 * r}"/>'
    if key == "kept":
        return (f'<rect x="{x - r}" y="{y - r}" width="{2 * r}" height="{2 * r}" fill="#fff" stroke-width="2"/>'
                f'<circle cx="{x}" cy="{y}" r="2"/>')
    if key == "time_limit":
        return f'<rect x="{x - r}" y="{y - r}" width="{2 * r}" height="{2 * r}" fill="#fff" stroke-width="2.5"/>'
    if key == "killed":
        return (f'<polygon points="{x - 1},{y - 8} {x + 4},{y - 8} {x + 1},{y - 1} {x + 5},{y - 1} {x - 3},{y + 8} '
                f'{x - 1},{y + 1} {x - 5},{y + 1}" stroke="none"/>')
    if key == "retried":
        return f'<circle cx="{x}" cy="{y}" r="{r - 1}" fill="#fff" stroke-width="2"/>'
    if key == "running":
        return f'<polygon points="{x},{y - r} {x + r + 2},{y} {x},{y + r}"/>'
    if key == "member_failure":
        return (f'<rect x="{x - r}" y="{y - r}" width="{2 * r}" height="{2 * r}" fill="#fff" stroke-width="2"/>'
                f'<path d="M{x - 3} {y - 3}L{x + 3} {y + 3}M{x - 3} {y + 3}L{x + 3} {y - 3}" fill="none" stroke-width="2"/>')
    if key == "store_stall":
        return (f'<rect x="{x - 4}" y="{y - r - 1}" width="3" height="{2 * r + 2}" stroke="none"/>'
                f'<rect x="{x + 1}" y="{y - r - 1}" width="3" height="{2 * r + 2}" stroke="none"/>')
    if key == "expired":
        return (f'<path d="M{x - r} {y - r - 1}H{x + r}L{x - r} {y + r + 1}H{x + r}Z" stroke-width="1.2" '
                f'stroke-linejoin="round"/>')
    if key == "revoked":
        return (f'<circle cx="{x}" cy="{y}" r="{r}" fill="#fff" stroke-width="2"/>'
                f'<path d="M{x - 3.5} {y}H{x + 3.5}" fill="none" stroke-width="2.2"/>')
    if key == "deduplicated":
        return (f'<circle cx="{x}" cy="{y}" r="{r}" fill="#fff" stroke-width="1.6"/>'
                f'<path d="M{x - 3} {y - 1.5}H{x + 3}M{x - 3} {y + 1.5}H{x + 3}" fill="none" stroke-width="1.4"/>')
    if key == "delivered":
        return f'<path d="M{x} {y - 6}V{y + 6}M{x - 3.5} {y + 2.5}L{x} {y + 6}L{x + 3.5} {y + 2.5}" fill="none" stroke-width="1.8"/>'
    if key == "worker_up":
        return f'<path d="M{x} {y + 6}V{y - 5}M{x - 4.5} {y - 0.5}L{x} {y - 5}L{x + 4.5} {y - 0.5}" fill="none" stroke-width="2.4"/>'
    if key == "sigterm":
        return (f'<path d="M{x - 3.2} {y - 3.8}A5 5 0 1 0 {x + 3.2} {y - 3.8}" fill="none" stroke-width="2"/>'
                f'<path d="M{x} {y - 6.5}V{y}" fill="none" stroke-width="2"/>')
    if key == "sigkill":
        k = r * 0.41
        return (f'<polygon points="{x - k},{y - r} {x + k},{y - r} {x + r},{y - k} {x + r},{y + k} {x + k},{y + r} '
                f'{x - k},{y + r} {x - r},{y + k} {x - r},{y - k}" stroke="none"/>'
                f'<path d="M{x - 2.5} {y - 2.5}L{x + 2.5} {y + 2.5}M{x - 2.5} {y + 2.5}L{x + 2.5} {y - 2.5}" stroke="#fff" '
                f'stroke-width="1.6"/>')
    if key == "worker_exit":
        return f'<polygon points="{x - r - 1},{y - r + 1} {x + r + 1},{y - r + 1} {x},{y + r + 1}"/>'
    if key == "backend_down":
        return f'<rect x="{x - 6}" y="{y - 7}" width="12" height="14" fill-opacity=".35" stroke="none"/>'
    if key == "link_cut":
        return f'<path d="M{x - 3} {y - 7}L{x + 3} {y - 2.5}L{x - 3} {y + 2.5}L{x + 3} {y + 7}" fill="none" stroke-width="2.2"/>'
    if key == "consumer_timeout":
        return (f'<circle cx="{x}" cy="{y}" r="{r}" fill="#fff" stroke-width="1.8"/>'
                f'<path d="M{x} {y - 3.5}V{y}H{x + 3}" fill="none" stroke-width="1.6"/>')
    return (f'<rect x="{x - 6}" y="{y - 4}" width="12" height="8" fill="#fff" stroke-width="1.4"/>'
            f'<path d="M{x - 6} {y - 4}L{x} {y + 1}L{x + 6} {y - 4}" fill="none" stroke-width="1.4"/>')


def legend(keys: Iterable[str] | None = None, short: bool = False) -> str:
    """The marks ``keys`` (every mark: None) with their labels (``short``: the words before the label's colon),
    as a list that wraps to the page's width."""
    wanted = set(MARKS) if keys is None else set(keys)
    items = "".join(
        f'<li class="legend-item" data-mark="{key}"><svg xmlns="http://www.w3.org/2000/svg" width="18" height="18" '
        f'viewBox="-9 -9 18 18" aria-hidden="true"><g fill="{m.colour}" stroke="{m.colour}">{shape(key, 0, 0)}</g></svg>'
        f"{escape(m.label.split(':', 1)[0] if short else m.label)}</li>"
        for key, m in MARKS.items() if key in wanted)
    return f'<ul class="legend">{items}</ul>'
