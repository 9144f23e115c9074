"""A ``Timeline`` drawn as inline SVG swimlanes, for the HTML report.

One lane per document (``<g class="lane" data-doc="doc4">``) and one for
``notify`` and the emails (``data-doc="notify"``: the chord's ``notify`` on the
upper half, a duplicate on the lower). An attempt is a bar from its start to its
end; its ending is a mark in the colour and shape of ``timeline.MARKS``: one per
envelope reason (``error``, ``dead_lettered``, ``retries_exhausted``,
``soft_timeout``, ``hard_timeout``, ``time_limit``) and for ``ok``, ``killed`` (a dashed bar up to
whatever came next, since no end was recorded), ``retried`` (a dotted line over
the backoff to the next attempt) and ``running`` (a bar to the right edge). Every
shape has a ``<title>`` (a tooltip); every text is escaped. ``legend()`` draws
the marks once, with their labels.
"""

from __future__ import annotations

from html import escape

from lab.show.timeline import MARKS, Attempt, DocTimeline, NotifyRun, Timeline

WIDTH, LEFT, PLOT_RIGHT = 560, 50, 418  # the plot spans LEFT..PLOT_RIGHT; final states to its right
LANE, TOP, R = 25, 24, 5.5  # lane height, axis height, mark radius


def render(tl: Timeline, span: float | None = None) -> str:
    """The run as SVG lanes; ``span`` (seconds) sets a time scale shared with other runs."""
    scale = _Scale(max(span or 0.0, tl.span))
    lanes = [_doc_lane(d, i, scale, tl.span) for i, d in enumerate(tl.docs)]
    lanes.append(_notify_lane(tl, len(tl.docs), scale))
    height = TOP + LANE * (len(tl.docs) + 1) + 8
    return (f'<svg class="swimlanes" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
            f'width="{WIDTH}" height="{height}" role="img" aria-label="{escape(f"timeline of run {tl.run_id}")}">'
            f"{_axis(scale, height)}{''.join(lanes)}</svg>")


class _Scale:
    def __init__(self, span: float) -> None:
        self.span = max(span, 0.05)

    def x(self, t: float) -> float:
        return round(LEFT + (PLOT_RIGHT - LEFT) * min(max(t, 0.0), self.span) / self.span, 1)

    def step(self) -> float:
        for step in (0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0):
            if self.span / step <= 8:
                return step
        return 120.0


def _axis(scale: _Scale, height: int) -> str:
    step, parts = scale.step(), ['<g class="axis"><text x="6" y="14">t (s)</text>']
    k = 0
    while k * step <= scale.span + 1e-9:
        x = scale.x(k * step)
        parts.append(f'<line x1="{x}" y1="{TOP - 6}" x2="{x}" y2="{height - 6}"/>'
                     f'<text x="{x}" y="14" text-anchor="middle">{k * step:g}</text>')
        k += 1
    return "".join(parts) + "</g>"


def _doc_lane(d: DocTimeline, row: int, scale: _Scale, span: float) -> str:
    y = TOP + row * LANE + LANE / 2
    what = (d.reason or "error") if d.final == "failed" else d.final  # a reason is a failure: its colour says so
    parts = [f'<g class="lane" data-doc="{escape(d.doc)}" data-final="{escape(d.final)}" data-reason="{escape(d.reason or "")}">',
             f'<rect class="lane-bg" x="0" y="{y - LANE / 2}" width="{WIDTH}" height="{LANE}"/>',
             f'<text class="doc" x="6" y="{y + 4}">{escape(d.doc)}</text>',
             f'<text class="final" x="{PLOT_RIGHT + 12}" y="{y + 4}" fill="{MARKS[d.mark].colour}">{escape(what)}'
             f"<title>{escape(d.error or what)}</title></text>"]
    for i, a in enumerate(d.attempts):
        after = d.attempts[i + 1].start if i + 1 < len(d.attempts) else d.dead_lettered_at
        last_reason = d.reason if i == len(d.attempts) - 1 and d.final == "failed" else None
        parts.append(_attempt(d.doc, a, y, scale, span if after is None else after, last_reason))
    if d.dead_lettered_at is not None:
        x = scale.x(d.dead_lettered_at)
        parts.append(_mark("dead_lettered", x, y, f"{d.doc}: dead-lettered, finalised by the DLQ drain at {d.dead_lettered_at:.3f}s"))
    return "".join(parts) + "</g>"


def _attempt(doc: str, a: Attempt, y: float, scale: _Scale, next_t: float, final_reason: str | None) -> str:
    x0 = scale.x(a.start)
    end = a.end if a.end is not None else next_t
    x1 = max(scale.x(end), x0 + 3)
    # A process killed at its time_limit has no end of its own; the backstop's envelope names it.
    ended_by = a.how == "raised" or (a.how == "killed" and final_reason == "time_limit")
    mark = final_reason if ended_by and final_reason else a.mark
    tip = f"{doc} {'fetch' if a.stage == 'fetch' else 'attempt'} {a.n}: {a.start:.3f}s → " + _tip(a, next_t)
    bar = (f'<rect class="attempt attempt-{a.how}" data-attempt="{a.n}" x="{x0}" y="{y - 6}" width="{round(x1 - x0, 1)}" '
           f'height="12" rx="2" fill="{MARKS[mark].colour}"><title>{escape(tip)}</title></rect>')
    extra = ""
    if a.how == "retried" and a.end is not None and a.retry_in is not None:
        due = scale.x(a.end + a.retry_in)
        extra = f'<line class="backoff" x1="{x1}" y1="{y}" x2="{max(due, x1)}" y2="{y}" stroke="{MARKS["retried"].colour}"/>'
        if due - x1 >= 40:  # room for the delay's label over the backoff (the tooltip has it anyway)
            extra += f'<text class="delay" x="{round((x1 + due) / 2, 1)}" y="{y - 7}" text-anchor="middle">+{1000 * a.retry_in:.0f} ms</text>'
    return bar + extra + _mark(mark, x1, y, tip)


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


def _notify_lane(tl: Timeline, row: int, scale: _Scale) -> str:
    y = TOP + row * LANE + LANE / 2
    parts = [f'<g class="lane notify" data-doc="notify">',
             f'<rect class="lane-bg" x="0" y="{y - LANE / 2}" width="{WIDTH}" height="{LANE}"/>',
             f'<text class="doc" x="6" y="{y + 4}">notify</text>']
    if not tl.notifies:
        parts.append(f'<text class="final" x="{PLOT_RIGHT + 12}" y="{y + 4}" fill="{MARKS["running"].colour}">never ran</text>')
    for n in tl.notifies:
        parts.append(_notify_bar(n, y + (-5 if n.role == "chord" else 6), scale, tl.span))
    for e in tl.emails:
        parts.append(_mark("email", scale.x(e.t), y + (-5 if e.role == "chord" else 6), f"email sent by the {e.role} notify at {e.t:.3f}s"))
    if tl.notifies:
        sent = len(tl.emails)
        colour = MARKS["ok" if sent == 1 else "error"].colour
        parts.append(f'<text class="final" x="{PLOT_RIGHT + 12}" y="{y + 4}" fill="{colour}">{sent} email{"s" if sent != 1 else ""}</text>')
    return "".join(parts) + "</g>"


def _notify_bar(n: NotifyRun, y: float, scale: _Scale, span: float) -> str:
    key = {"sent": "email", "skipped": "ok", "ended": "ok" if n.outcome == "ok" else "error", "retried": "retried",
           "killed": "killed", "running": "running"}[n.how]
    x0 = scale.x(n.start)
    x1 = max(scale.x(n.end if n.end is not None else span), x0 + 3)
    retry = f" after {1000 * (n.retry_in or 0.0):.0f} ms (claim busy)" if n.how == "retried" else ""
    gate = f", waited at the gate from {n.gate_wait:.3f}s" if n.gate_wait is not None else ""
    crash = f" ({n.crash})" if n.crash else ""
    tip = f"notify ({n.role}) {n.start:.3f}s → {n.how}{crash}{retry}{gate}"
    return (f'<rect class="notify-run notify-{n.how}" data-role="{escape(n.role)}" x="{x0}" y="{y - 4}" '
            f'width="{round(x1 - x0, 1)}" height="8" rx="2" fill="{MARKS[key].colour}"><title>{escape(tip)}</title></rect>')


def _mark(key: str, x: float, y: float, tip: str) -> str:
    colour = MARKS[key].colour
    return f'<g class="mark mark-{key}" fill="{colour}" stroke="{colour}">{_shape(key, x, y)}<title>{escape(tip)}</title></g>'


def _shape(key: str, x: float, y: float) -> str:
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
    if key == "time_limit":
        return f'<rect x="{x - r}" y="{y - r}" width="{2 * r}" height="{2 * r}" fill="#fff" stroke-width="2.5"/>'
    if key == "killed":
        return (f'<polygon points="{x - 1},{y - 8} {x + 4},{y - 8} {x + 1},{y - 1} {x + 5},{y - 1} {x - 3},{y + 8} '
                f'{x - 1},{y + 1} {x - 5},{y + 1}" stroke="none"/>')
    if key == "retried":
        return f'<circle cx="{x}" cy="{y}" r="{r - 1}" fill="#fff" stroke-width="2"/>'
    if key == "running":
        return f'<polygon points="{x},{y - r} {x + r + 2},{y} {x},{y + r}"/>'
    return (f'<rect x="{x - 6}" y="{y - 4}" width="12" height="8" fill="#fff" stroke-width="1.4"/>'
            f'<path d="M{x - 6} {y - 4}L{x} {y + 1}L{x + 6} {y - 4}" fill="none" stroke-width="1.4"/>')


def legend(columns: int = 2, column_width: int = 420) -> str:
    """Every mark with its label, in one SVG of ``columns`` columns."""
    rows = -(-len(MARKS) // columns)
    items: list[str] = []
    for i, (key, m) in enumerate(MARKS.items()):
        x, y = 12 + column_width * (i // rows), 14 + 22 * (i % rows)
        items.append(f'<g class="legend-item" data-mark="{key}" fill="{m.colour}" stroke="{m.colour}">{_shape(key, x, y)}'
                     f'<text x="{x + 16}" y="{y + 4}">{escape(m.label)}</text></g>')
    width, height = column_width * columns, 22 * rows + 6
    return (f'<svg class="legend" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
            f'height="{height}" role="img" aria-label="legend">{"".join(items)}</svg>')
