"""The workshop report: one self-contained HTML file (``run_all_fms.py --report PATH``), a handout.

At the top, the matrix, what each check it names means (``lab.matrix.TITLES``: the
lab's one table of words per check, after DESIGN.md §2) and every mark of the
timelines. Then a section per FM (``<section class="fm" id="<short>">``), about two
screens of 1280 x 800: what its module's docstring says (its Symptom, Root cause,
Fix and Tradeoffs paragraphs, in four columns at 1280 px), "The change" (the code diff
from the previous FM's file, ``lab.show.diff``, one line of context, blank lines as thin
gaps) with, beside it, the later runs (the broken run's verdict with its symptom, the hard
variant's) and the marks its timelines use; then the fixed run's verdict with its guarantees
(each check named in words with what it saw), and per run the timeline as swimlanes as wide as the page
(``lab.show.swimlanes``), each lane saying in words what happened in it, the run's side
chords last (a line each, a lane for one that did not complete).

Badges: PASS is green, a symptom reproduced (REPRODUCED, BUG REPRODUCED) is a
neutral slate: the bug was shown as intended, nothing to celebrate or fix; anything
that did not hold (FAIL, NOT REPRODUCED, ERROR) is red.

Self-contained: inline CSS and SVG, no script, no font, no image to fetch, and a
Content-Security-Policy that forbids the page any request, so it reads the same
offline. Everything the timelines say is text on the page (tooltips only repeat
it with exact times), so it prints: the print rules keep it and start each FM on a
new page. Everything taken from a run or a docstring is HTML-escaped.
"""

from __future__ import annotations

import ast
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path

from lab.show import diff, swimlanes, timeline, timeline_text
from lab.records import Check
from lab.fm import ROOT
from lab.matrix import TITLES
from lab.settings import NAMESPACE, backend_url, broker_url, mask_url
from lab.records import MatrixRow, RunReport, matrix
from lessons import FMS, NAIVE, broken_code, modules, number, scenario

SECTIONS = ("Symptom", "Root cause", "Fix", "Tradeoffs")
"""The docstring paragraphs the report shows, in this order."""
CASE_SECTIONS = ("The write-up", "What the runs show", "Fix", "Tradeoffs")
"""A case study's: what the write-up claims, what the runs show, the fix, the tradeoffs."""
_HEADING = re.compile(r"^(?P<name>[A-Z][\w -]{1,30}?)\s*(?P<note>\([^)]*\))?:(\s|$)")


@dataclass(frozen=True)
class Lesson:
    """What an FM module's docstring teaches."""

    fm: str
    module: str
    summary: str  # the first line
    sections: Mapping[str, str]  # a name of SECTIONS -> its text (paragraphs kept)


def parse_docstring(fm: str, module: str, doc: str, sections: tuple[str, ...] = SECTIONS) -> Lesson:
    """Split a docstring into its headed paragraphs ("Symptom (<short> on its scenario): ...").

    A paragraph that starts with ``Name:`` or ``Name (note):`` opens a section that
    runs until the next headed paragraph; only the names in ``SECTIONS`` are kept
    (``Tradeoff``, ``Trade-offs`` and ``Costs`` count as ``Tradeoffs``).
    """
    paragraphs = [p.strip() for p in re.split(r"\n\s*\n", doc.strip()) if p.strip()]
    summary = paragraphs[0].splitlines()[0] if paragraphs else fm
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for para in paragraphs[1:]:
        m = _HEADING.match(para)
        if m:
            name = _canonical(m.group("name"))
            current = found.setdefault(name, []) if name in sections else None
            if current is not None:
                rest = para[m.end():].strip()
                current.append(" ".join(part for part in (m.group("note") or "", rest) if part))
        elif current is not None:
            current.append(para)
    return Lesson(fm, module, summary, {name: "\n\n".join(found[name]) for name in sections if name in found})


def _canonical(name: str) -> str:
    lowered = name.lower().replace("-", "").strip()
    if lowered.startswith("tradeoff") or lowered == "costs":  # an FM docstring's "Costs" (issue 41)
        return "Tradeoffs"
    return next((s for s in SECTIONS if s.lower() == lowered), name)


def lesson(fm: str) -> Lesson:
    """An FM's lesson from its file; a case study cell's (``severity_batch/batch``) from its fixed program."""
    if "/" in fm:
        case = fm.split("/", 1)[0]
        module = f"case_studies/{case}/fixed"
        tree = ast.parse((ROOT / f"{module}.py").read_text())
        return parse_docstring(fm, module.replace("/", "."), ast.get_docstring(tree) or "", CASE_SECTIONS)
    module = modules()[fm]
    tree = ast.parse((ROOT / f"{module}.py").read_text())  # read, not imported: no app is built
    return parse_docstring(fm, module, ast.get_docstring(tree) or "")


def words(label: str) -> str:
    """What check ``label`` (``G3``, ``S4 hard``, ``SB5 write-up``) promises, in a few words ("" if the table has none)."""
    return TITLES.get(label, "")


def render(reports: Sequence[RunReport], lessons: Mapping[str, Lesson], generated: str = "") -> str:
    rows = matrix(list(reports))
    fixed = {row.fm: row.fixed for row in rows if row.fixed is not None}
    sections = "".join(_section(row, lessons.get(row.fm), _lesson_home(row.fm, lessons), _previous(row.fm, fixed))
                       for row in rows)
    labels = list(dict.fromkeys(c.label for r in reports for c in r.checks))
    return (_HEAD + '<body><header><h1>reliable-celery-lab: workshop report</h1>'
            f'<p class="meta">{escape(generated)}</p></header>'
            f'<nav><h2>Matrix</h2>{_matrix(rows)}{_glossary(labels)}</nav>'
            f'<aside><h2>How to read a timeline</h2><p>One lane per document (three or more with the same story share '
            f'one), then one per delivery of the chord\'s body; time in seconds since the chord was submitted. Beside '
            f'each lane, in words, what happened in it; a bar or a mark\'s tooltip adds its exact times. '
            f'Each FM lists the marks its timelines use.</p>{swimlanes.legend()}</aside>'
            f"<main>{sections}</main></body></html>\n")


def lessons_for(reports: Sequence[RunReport]) -> dict[str, Lesson]:
    """Each FM's lesson; a case study's once, with its first scenario."""
    cells = list(dict.fromkeys(r.fm for r in reports))
    firsts = [c for i, c in enumerate(cells) if "/" not in c or c.split("/")[0] not in {x.split("/")[0] for x in cells[:i]}]
    return {fm: lesson(fm) for fm in firsts}


def write(path: Path, reports: Sequence[RunReport]) -> Path:
    generated = (time.strftime("generated %Y-%m-%d %H:%M:%S by run_all_fms.py") +
                 f" in namespace {NAMESPACE}; broker {mask_url(broker_url())}, backend {mask_url(backend_url())}")
    path.write_text(render(reports, lessons_for(reports), generated), encoding="utf-8")
    return path


def _lesson_home(fm: str, lessons: Mapping[str, Lesson]) -> str | None:
    """The cell whose section holds a case study scenario's lesson (its first scenario's), if another one does."""
    if "/" not in fm or fm in lessons:
        return None
    case = fm.split("/", 1)[0]
    return next((c for c in lessons if c.split("/", 1)[0] == case), None)


def _glossary(labels: Sequence[str]) -> str:
    """What every check the page names means, in words (``lab.matrix.TITLES``)."""
    if not labels:
        return ""
    items = "".join(f'<li data-label="{escape(label)}"><b>{escape(label)}</b> {escape(words(label))}</li>' for label in labels)
    guarantees = sorted({label for label in labels if re.fullmatch(r"G\d+", label)}, key=lambda g: int(g[1:]))
    named = f"{guarantees[0]} to {guarantees[-1]}" if len(guarantees) > 1 else "G1, G2 …"
    return ('<h3>The checks</h3><p class="note">A fixed run checks guarantees (' + escape(named) + " in the FMs: what the "
            "fix makes true); a broken run (the FM's scenario on the previous FM's code, or a case study's write-up) shows a "
            "symptom (S1, S2 …, a case study's <i>write-up</i> checks), the proof that the fix is load-bearing; a hard "
            "variant (<i>hard</i>) runs the FM without the fix of its hard case. docs/failure-modes.md (Scenarios) says "
            f'what each check holds exactly.</p><ul class="glossary">{items}</ul>')


def _matrix(matrix_rows: Sequence[MatrixRow]) -> str:
    rows = "".join(
        f'<tr><th><a href="#{escape(row.fm)}">{escape(row.fm)}</a></th><td>{_verdict(row.fixed)}</td>'
        f"<td>{_verdict(row.broken, row.fm)}</td><td>{_verdict(row.weak, '-') if row.weak else '–'}</td></tr>"
        for row in matrix_rows)
    return ('<table class="matrix"><tr><th>FM</th><th>fixed (guarantees)</th><th>broken (symptom)</th>'
            f'<th>hard variant, before its fix</th></tr>{rows}</table>')


REPRODUCED = {"REPRODUCED", "BUG REPRODUCED"}
"""Verdicts of a symptom shown as intended: a neutral badge, neither green nor red."""


def _verdict(r: RunReport | None, fm: str = "") -> str:
    if r is None:
        return "–" if fm == NAIVE else '<span class="verdict none">not run</span>'  # the naive program has no earlier code
    labels = " ".join(c.label for c in r.checks)
    return f'<span class="verdict {_badge(r)}">{escape(r.verdict)}</span> {escape(labels)}'


def _badge(r: RunReport) -> str:
    return "ok" if r.verdict == "PASS" else "shown" if r.ok and r.verdict in REPRODUCED else "bad"


def _previous(fm: str, fixed: Mapping[str, RunReport]) -> tuple[str, RunReport] | None:
    """The previous FM's fixed run, when FM ``fm``'s scenario adds only side chords (the deploys', the outage's and
    the cut's: its main chord is the previous scenario's, its lesson a side chord the runner acts on): its main
    chord is told against it."""
    n = number(fm) if fm in FMS else 0
    if n < 2 or scenario(n).docs != scenario(n - 1).docs:
        return None
    before = fixed.get(previous := broken_code(fm))
    return (previous, before) if before is not None else None


def _section(row: MatrixRow, lesson: Lesson | None, home: str | None = None,
             previous: tuple[str, RunReport] | None = None) -> str:
    fm = row.fm
    title = _inline(lesson.summary) if lesson else _scenario_title(fm, home)
    module = f' <code class="module">{escape(lesson.module)}.py</code>' if lesson else ""
    head = f'<h2><span class="tag">{escape(fm)}</span> {title}{module}</h2>'
    more = f' <span class="more">(more in <code>{escape(lesson.module)}.py</code>)</span>' if lesson else ""
    lessons = "".join(f'<div class="lesson" data-part="{escape(name.lower())}"><h3>{escape(name)}</h3>'
                      f'{_prose(shown, more if shown != text else "")}</div>'
                      for name, text in (lesson.sections.items() if lesson else ()) for shown in [within(text)])
    runs = [r for r in (row.fixed, row.broken, row.weak) if r is not None]
    timelines = [(r, _timeline(r)) for r in runs]
    # one time scale for the FM's runs; a side chord's block, one per side
    span = max((swimlanes.main_span(tl) for _, tl in timelines if tl is not None), default=0.0)
    side_spans: dict[str, float] = {}
    for s in (s for _, tl in timelines if tl is not None for s in swimlanes.blocks(tl)):
        side_spans[s.tag] = max(side_spans.get(s.tag, 0.0), swimlanes.side_span(s))
    like = timelines[0][1]  # the fixed run (the naive program's bug run): the others say what differs from it
    also = timelines[1] if len(timelines) > 2 else (runs[0], None)  # the broken run, above the hard variant's
    before = _timeline(previous[1]) if previous is not None else None  # the fixed run's main chord: the previous FM's?
    where = f"of {previous[0]}, in its section" if previous is not None else "above"
    drawn = [_figure(r, tl, span, like if i else before, runs[0].kind, also[1] if i > 1 else None, also[0].kind,
                     side_spans, "above" if i else where)
             for i, (r, tl) in enumerate(timelines)]
    marks: frozenset[str] = frozenset[str]().union(*(m for _, m, _ in drawn))
    names = max((n for _, _, n in drawn), default=0)  # one name column for the FM's figures: their plots line up
    legend = (f'<div class="fm-legend"><span class="legend-head">Marks in these timelines</span>'
              f"{swimlanes.legend(marks, short=True)}</div>" if marks else "")
    proven = previous[0] if previous is not None else ""  # the previous FM proved its guarantees: said in a line
    first, others = ("".join(_cell(r, proven) for r in runs[:1]), "".join(_cell(r) for r in runs[1:]))
    change = _change(fm)
    # The later runs' cells (what happens without the change) and the marks go in a column beside the change, whose
    # code leaves the page's right third empty; with no change, beside the fixed run's checks
    beside = f'<div class="others">{others}{legend}</div>' if others else ""
    if change and beside:
        change, cells = f'<div class="beside-change">{change}{beside}</div>', f'<div class="cells wide">{first}</div>'
    else:
        cells = f'<div class="cells">{first}{beside}</div>'
    return (f'<section class="fm" id="{escape(fm)}">{head}' + (f'<div class="lessons">{lessons}</div>' if lessons else "")
            + f'{change}{cells}<div class="timelines" style="--names:{names + 1}ch">{"" if others else legend}'
            f'{"".join(html for html, _, _ in drawn)}</div></section>')


def _timeline(r: RunReport) -> timeline.Timeline | None:
    return None if r.observations is None else timeline.build(r.observations, r.body)


def _scenario_title(fm: str, home: str | None) -> str:
    """The heading of a cell with no lesson of its own (a case study's later scenario)."""
    if "/" not in fm:
        return ""
    case, scenario = fm.split("/", 1)
    where = f' (the case study\'s lesson is under <a href="#{escape(home)}">{escape(home)}</a>)' if home else ""
    return f"{escape(case)}, scenario <code>{escape(scenario)}</code>{where}"


REPORT_CONTEXT = 1
"""Unchanged lines around each change in a section's diff (the console's ``--diff`` shows ``diff.CONTEXT_LINES``)."""


def _change(fm: str) -> str:
    """The code diff from the previous FM's file (none for the naive program)."""
    step = diff.step(fm, REPORT_CONTEXT) if fm[2:].isdigit() else None
    if step is None:
        return ""
    rows = "".join(_diff_rows([line for line in step.lines if not line.startswith(("+++", "---"))]))  # the line above names both
    return (f'<div class="change" data-fm="{escape(fm)}"><h3>The change</h3><p class="module">'
            f"<code>{escape(step.before)}.py</code> → <code>{escape(step.after)}.py</code>, docstrings left out: "
            f"{len(step.added)} lines added, {len(step.removed)} removed</p><pre class=\"diff\">{rows}</pre></div>")


def _diff_rows(lines: list[str]) -> list[str]:
    """A span per line; a run of blank context lines (between two functions) is one thin gap, so a section stays short."""
    out: list[str] = []
    for line in lines:
        if not line.strip():
            if not (out and out[-1].startswith('<span class="d-gap">')):
                out.append('<span class="d-gap"> </span>')
            continue
        out.append(f'<span class="{_diff_class(line)}">{escape(line)}</span>')  # a block each: a line
    return out


def _diff_class(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "d-file"
    return {"+": "d-add", "-": "d-del", "@": "d-hunk"}.get(line[:1], "d-ctx")


def _cell(r: RunReport, proven: str = "") -> str:
    """A run's verdict and checks; ``proven``: the previous FM whose section shows what its guarantees saw (scenarios
    7 to 9: its main chord is the same), so that the guarantees it proved and this run kept are one short line each."""
    symptom = r.kind != "fixed"  # broken, weak, bug: the check is a symptom shown, not a guarantee kept
    earlier = [c for c in r.checks if proven and c.ok and re.fullmatch(r"G\d+", c.label) and int(c.label[1:]) < r.scenario]
    kept = "".join(f'<li class="check ok" data-label="{escape(c.label)}"><b>{escape(c.label)}</b> '
                   f'<span class="words">({escape(words(c.label))})</span>: holds</li>' for c in earlier)
    if kept:
        kept = (f'<li class="earlier"><span class="note">as in {escape(proven)}\'s section:</span>'
                f'<ul class="earlier">{kept}</ul></li>')
    checks = kept + "".join(_check(c, symptom) for c in r.checks if c not in earlier)
    error = f'<p class="error">{escape(r.error)}</p>' if r.error else ""
    return (f'<div class="cell" data-kind="{escape(r.kind)}"><h3>{escape(r.kind)}: scenario {r.scenario} on '
            f"<code>{escape(r.code)}</code>'s code {_verdict(r)} <span class=\"secs\">{r.seconds:.1f}s</span></h3>"
            f'<ul class="checks">{checks}</ul>{error}</div>')


def _check(c: Check, symptom: bool) -> str:
    """``G3 (poison dead-lettered at the bound, DLQ empty): holds`` and what the check saw."""
    state = ("shown" if symptom else "ok") if c.ok else "bad"
    said = ("reproduced" if c.ok else "NOT REPRODUCED") if symptom else ("holds" if c.ok else "FAILS")
    meaning = words(c.label)
    named = f' <span class="words">({escape(meaning)})</span>' if meaning else ""
    return (f'<li class="check {state}" data-label="{escape(c.label)}"><b>{escape(c.label)}</b>{named}: {said}'
            f'<span class="seen">{_seen(c.detail)}</span></li>')


def _seen(detail: str) -> str:
    """A check's observations, short parts joined as the checks join them ('; ')."""
    return "; ".join(escape(part) for part in detail.split("; ") if part)


def _figure(r: RunReport, tl: timeline.Timeline | None, span: float, like: timeline.Timeline | None = None,
            like_name: str = "fixed", also: timeline.Timeline | None = None, also_name: str = "broken",
            side_spans: dict[str, float] | None = None, where: str = "above") -> tuple[str, frozenset[str], int]:
    caption = f"{r.kind} run"
    marks: frozenset[str] = frozenset()
    names = 0
    if tl is None:
        first = (r.error or "").split("\n", 1)[0]  # the run's box above has the whole message (a log tail): not twice
        more = " (the whole message is in the run's box above)" if r.error and "\n" in r.error else ""
        body = f'<p class="error">no observations: {escape(first or "the run did not get that far")}{more}</p>'
    elif not tl.has_chord:
        body = (f'<span class="stop">run {escape(tl.run_id)}; stopped: {escape(tl.stopped_by)} at {tl.span:.2f}s</span>'
                f'<p class="note">{escape(timeline_text.NO_CHORD)}.</p>')
    else:
        fig = swimlanes.render(tl, span, like, like_name, also, also_name, side_spans, where)
        marks, names = fig.marks, fig.names
        emails = f"; emails sent: {len(tl.emails)}" if tl.counts_emails else ""
        named = (f"; documents named without their common prefix <code>{escape(fig.prefix)}</code>" if fig.prefix else "")
        body = (f'<span class="stop">run {escape(tl.run_id)}; stopped: {escape(tl.stopped_by)} at {tl.span:.2f}s; '
                f"chord: {escape(tl.chord)}{emails}{named}</span>{fig.html}")
    return (f'<figure class="timeline" data-kind="{escape(r.kind)}"><figcaption>{escape(caption)}</figcaption>{body}</figure>',
            marks, names)


LESSON_WORDS = 90
"""The words of a docstring part the handout shows (whole sentences, then a pointer to the FM file): about two screens
an FM (an FM's skeleton budgets each part below it)."""
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z(`*])")


def within(text: str, budget: int = LESSON_WORDS) -> str:
    """``text`` up to ``budget`` words, in whole sentences (a list keeps its items' marks), `` …`` where it was cut."""
    out: list[str] = []
    count, cut = 0, False
    for para in re.split(r"\n\s*\n", text):
        lines = [ln.strip() for ln in para.splitlines() if ln.strip()]
        if not lines:
            continue
        listed = lines[0].startswith("- ")
        items = [" ".join(i.split()) for i in "\n".join(lines).split("\n- ")] if listed else [" ".join(lines)]
        kept: list[str] = []
        for item in items:
            said: list[str] = []
            sentences = _SENTENCE.split(item.removeprefix("- "))
            for sentence in sentences:
                n = len(sentence.split())
                if said and listed:  # a list item says its first sentence: each setting of a Fix is named
                    break
                if count + n > budget and (said or kept or out) and not (listed and not said):
                    cut = True
                    break
                said.append(sentence)
                count += n
            if said:
                kept.append(" ".join(said) + (" …" if len(said) < len(sentences) else ""))
            if cut:
                break
        if kept:
            out.append("\n".join(f"- {k}" for k in kept) if listed else kept[0])
        if cut:
            if out and not out[-1].endswith("…"):
                out[-1] += " …"
            break
    return "\n\n".join(out)


def _prose(text: str, more: str = "") -> str:
    """Docstring paragraphs as HTML: ``code``, *emphasis* and ``- `` lists; ``more`` (HTML) after the last one."""
    out: list[str] = []
    for para in re.split(r"\n\s*\n", text):
        lines = [ln.strip() for ln in para.splitlines() if ln.strip()]
        if lines and lines[0].startswith("- "):
            items: list[str] = []
            for ln in lines:
                if ln.startswith("- "):
                    items.append(ln[2:])
                else:
                    items[-1] += " " + ln
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>")
        elif lines:
            out.append(f"<p>{_inline(' '.join(lines))}</p>")
    if more and out and out[-1].endswith("</p>"):
        out[-1] = out[-1][:-4] + more + "</p>"
    elif more:
        out.append(f"<p>{more}</p>")
    return "".join(out)


def _inline(text: str) -> str:
    html = escape(text)
    html = re.sub(r"``(.+?)``", r"<code>\1</code>", html)
    return re.sub(r"(?<![\w*])\*(\w[^*]*?)\*(?![\w*])", r"<em>\1</em>", html)


_HEAD = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>reliable-celery-lab: workshop report</title>
<style>
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:0;color:#222;background:#fafafa}
header,nav,aside,main{max-width:1400px;margin:0 auto;padding:0 20px}
header h1{margin:16px 0 0;font-size:22px} .meta{color:#666;margin:2px 0 6px}
h2{font-size:18px;margin:6px 0 3px} h2 code.module{font-size:12.5px;font-weight:400;margin-left:6px;vertical-align:2px} h3{font-size:14px;margin:6px 0 2px}
code{font:12.5px ui-monospace,"DejaVu Sans Mono",monospace;background:#eef;padding:0 3px;border-radius:3px}
table.matrix{border-collapse:collapse;background:#fff} .matrix td,.matrix th{border:1px solid #ddd;padding:3px 9px;text-align:left}
.verdict{font-weight:700;padding:0 6px;border-radius:4px;color:#fff;font-size:12.5px;white-space:nowrap}
.verdict.ok{background:#2e7d32} .verdict.bad{background:#c62828} .verdict.shown{background:#546e7a} .verdict.none{background:#9e9e9e}
.note{color:#555;margin:2px 0}
ul.glossary{columns:3 22em;column-gap:24px;list-style:none;padding:0;margin:4px 0;font-size:13px}
ul.glossary li{break-inside:avoid;padding-left:5.2em;text-indent:-5.2em} ul.glossary b{display:inline-block;min-width:5em;text-indent:0}
ul.legend{display:flex;flex-wrap:wrap;gap:2px 18px;list-style:none;padding:0;margin:4px 0;font-size:12.5px}
ul.legend li{display:flex;align-items:center;gap:5px} ul.legend svg{flex:none}
section.fm{background:#fff;border:1px solid #ddd;border-radius:8px;margin:18px 0;padding:2px 18px 6px}
h2 .tag{font:600 13px ui-monospace,"DejaVu Sans Mono",monospace;color:#fff;background:#37474f;padding:1px 6px;border-radius:4px;
vertical-align:2px}
.lessons{columns:4 17em;column-gap:18px;font-size:12px;line-height:1.22} .lessons code{font-size:11px;padding:0 2px} .lesson h3{break-after:avoid;margin:4px 0 1px}
.lesson p,.lesson ul{margin:1px 0 3px} .lesson ul{padding-left:18px} .module{margin:0;color:#555}
.change h3{display:inline;margin-right:8px} .change .module{display:inline}
.change pre.diff{font:10.5px/1.15 ui-monospace,"DejaVu Sans Mono",monospace;background:#fbfbfb;border:1px solid #e3e3e3;
border-radius:6px;padding:4px 0;overflow-x:auto;margin:4px 0} .diff span{display:block;width:max-content;min-width:100%;box-sizing:border-box;padding:0 10px}
.diff .d-add{background:#e6ffec;color:#1a5e2a} .diff .d-del{background:#ffebe9;color:#8a1c1c} .diff .d-hunk{color:#6f42c1;background:#f3f0ff}
.diff .d-file{color:#555;font-weight:600}
pre.diff{line-height:0} .diff span{line-height:1.15} .diff span.d-gap{line-height:6px;height:6px} .diff .d-hunk{line-height:1.1;font-size:10.5px}
.cells{display:grid;grid-template-columns:minmax(0,2.4fr) minmax(18em,1fr);gap:10px;margin-top:6px} .cells>.cell:only-child{grid-column:1/-1}
.beside-change{display:grid;grid-template-columns:minmax(0,1fr) minmax(18em,30%);gap:10px;align-items:start} .beside-change .others{margin-top:6px} .cells.wide .cell{grid-column:1/-1} .cells.wide ul.checks{columns:2 26em;column-gap:22px}
.others{display:flex;flex-direction:column;gap:8px} .others .fm-legend{display:block} .others ul.legend{min-width:0;gap:1px 12px}
.cell{border:1px solid #e3e3e3;border-radius:6px;padding:2px 10px 4px;font-size:12.5px;line-height:1.3} .cell h3{font-size:13.5px;margin:4px 0 1px}
ul.checks{padding-left:16px;margin:1px 0} ul.checks li{margin:0 0 1px} .check.bad{color:#c62828}
.check .words{color:#333} .check .seen{font-size:10.5px;line-height:1.25;color:#555} .check .seen:not(:empty)::before{content:" — "} .secs{color:#777;font-weight:400}
.error{color:#c62828;white-space:pre-wrap}
.timelines{margin-top:4px} .fm-legend{display:flex;align-items:baseline;gap:0 14px;margin:2px 0} .fm-legend ul.legend{flex:1 1 0;min-width:20em;margin:0}
.legend-head{font-weight:600;font-size:13px;white-space:nowrap}
figure.timeline{margin:4px 0 0} figcaption{font-weight:600;display:inline;margin-right:8px;font-size:13px} figure.timeline{line-height:1.3} .stop{color:#555;font-size:12px}
figure.timeline .lanes{margin-top:2px}
.lanes{display:grid;grid-template-columns:calc(var(--names,8ch) * 1.05 + 16px) minmax(0,1fr) minmax(20em,42%);font-size:12px}
.lanes>div{display:contents} .lanes .name,.lanes .what,.lanes .track{box-sizing:border-box;min-height:17px} .lanes .track{display:block}
.lanes .name{font-weight:600;color:#333;padding:1px 10px 0 6px;white-space:nowrap;font-variant-numeric:tabular-nums;line-height:1.25}
.lanes .what{padding:1px 4px 0 8px;color:#444;line-height:1.25;font-size:11.5px} .lanes .same .what{grid-column:2/-1;font-style:italic}
.lanes svg.plot{display:block;width:100%;overflow:visible}
.lanes .lane:nth-child(even)>*{background:#f4f5f7}
.lanes .axis>*{min-height:16px;padding-top:0;color:#888;font-weight:400;font-size:11px}
.lanes .axis.zoom>*{border-top:1px dashed #b0bec5;background:#f7fafc}
.lanes .axis.sides>*{border-top:1px dashed #b0bec5;background:#f7fafc}
.lanes .side .what{grid-column:2/-1} .lanes .what svg.icon{vertical-align:-2px;margin-right:2px}
svg.plot text{fill:#888;font-size:10px;font-family:system-ui,"DejaVu Sans",sans-serif} svg.plot line.grid{stroke:#e4e4e4}
svg.plot text.delay{font-size:9.5px;fill:#1565c0} svg.plot line.gate{stroke:#37474f;stroke-width:1.5;stroke-dasharray:2 2}
svg .attempt-killed,svg .notify-killed{fill-opacity:.15;stroke:#212121;stroke-dasharray:3 2} svg .attempt-running{fill-opacity:.35}
svg line.backoff{stroke-dasharray:2 3;stroke-width:1.6}
b.final{font-weight:700}
code,.lanes .what,.check .seen,.cell h3,.lesson{overflow-wrap:anywhere} .diff span{white-space:pre-wrap;width:auto}
.change pre.diff{overflow-x:visible} .more{color:#666;font-style:italic}
ul.checks li.earlier{list-style:none;margin-left:-16px} ul.earlier{display:flex;flex-wrap:wrap;gap:0 14px;padding:0;margin:0}
ul.earlier li.check{list-style:none}
.lanes .axis.block>*{border-top:1px solid #90a4ae;background:#eceff1;padding-top:2px}
.lanes .axis.block .name{color:#37474f;font-weight:600;font-size:11.5px} .lanes .axis.block .what{color:#333;font-size:11.5px}
.lanes .block-facts .what{grid-column:1/-1;background:#eceff1;color:#333;font-size:11.5px;padding:0 4px 2px calc(var(--names,8ch) * 1.05 + 16px)}
@media print{@page{margin:12mm} body{background:#fff;font-size:11.5px} header,nav,aside,main{max-width:none;padding:0}
*{-webkit-print-color-adjust:exact;print-color-adjust:exact}
section.fm{break-before:page;border:none;padding:0;margin:0} .diff span{white-space:pre-wrap;width:auto}
figure.timeline,.cell,.change{break-inside:avoid} .lanes .lane{break-inside:avoid}
.lanes{grid-template-columns:calc(var(--names,8ch) * 1.05 + 16px) minmax(0,1fr) minmax(14em,42%)} .lanes .what{font-size:11px}
.verdict{border:1px solid #000} a{color:inherit;text-decoration:none}}
</style></head>
"""
