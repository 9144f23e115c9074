"""The workshop report: one self-contained HTML file (``run_all_fms.py --report PATH``).

A section per FM (``<section class="fm" id="fm3">``): what its module's docstring
says (its Symptom, Root cause, Fix and Tradeoffs paragraphs), "The change" (the
code diff from the previous FM's file, ``lab.show.diff``), its matrix cells
(the fixed run's verdict with its guarantees, the broken run's with its symptom)
and, per run, the timeline as SVG swimlanes (``lab.show.swimlanes``).

Self-contained: inline CSS and SVG, no script, no font, no image to fetch, and a
Content-Security-Policy that forbids the page any request, so it reads the same
offline. Everything taken from a run or a docstring is HTML-escaped.
"""

from __future__ import annotations

import ast
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path

from lab.show import diff, swimlanes, timeline
from lab.fm import ROOT, fm_modules
from lab.settings import NAMESPACE, backend_url, broker_url, mask_url
from lab.harness import MatrixRow, RunReport, matrix

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
    """Split a docstring into its headed paragraphs ("Symptom (fm0 on scenario 1): ...").

    A paragraph that starts with ``Name:`` or ``Name (note):`` opens a section that
    runs until the next headed paragraph; only the names in ``SECTIONS`` are kept
    (``Tradeoff``, ``Trade-offs`` count as ``Tradeoffs``).
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
    if lowered.startswith("tradeoff"):
        return "Tradeoffs"
    return next((s for s in SECTIONS if s.lower() == lowered), name)


def lesson(fm: str) -> Lesson:
    """An FM's lesson from its file; a case study cell's (``severity_batch/batch``) from its fixed program."""
    if "/" in fm:
        case = fm.split("/", 1)[0]
        module = f"case_studies/{case}/fixed"
        tree = ast.parse((ROOT / f"{module}.py").read_text())
        return parse_docstring(fm, module.replace("/", "."), ast.get_docstring(tree) or "", CASE_SECTIONS)
    module = fm_modules()[fm]
    tree = ast.parse((ROOT / f"{module}.py").read_text())  # read, not imported: no app is built
    return parse_docstring(fm, module, ast.get_docstring(tree) or "")


def render(reports: Sequence[RunReport], lessons: Mapping[str, Lesson], generated: str = "") -> str:
    rows = matrix(list(reports))
    sections = "".join(_section(row, lessons.get(row.fm)) for row in rows)
    return (_HEAD + '<body><header><h1>reliable-celery-lab: workshop report</h1>'
            f'<p class="meta">{escape(generated)}</p></header>'
            f'<nav><h2>Matrix</h2>{_matrix(rows)}</nav>'
            f'<aside><h2>How to read a timeline</h2><p>One lane per document, time in seconds since '
            f'the chord was submitted; hover a bar or a mark for its details.</p>{swimlanes.legend()}</aside>'
            f"<main>{sections}</main></body></html>\n")


def write(path: Path, reports: Sequence[RunReport]) -> Path:
    cells = list(dict.fromkeys(r.fm for r in reports))
    firsts = [c for i, c in enumerate(cells) if "/" not in c or c.split("/")[0] not in {x.split("/")[0] for x in cells[:i]}]
    lessons = {fm: lesson(fm) for fm in firsts}  # a case study's lesson once, with its first scenario
    generated = (time.strftime("generated %Y-%m-%d %H:%M:%S by run_all_fms.py") +
                 f" in namespace {NAMESPACE}; broker {mask_url(broker_url())}, backend {mask_url(backend_url())}")
    path.write_text(render(reports, lessons, generated), encoding="utf-8")
    return path


def _matrix(matrix_rows: Sequence[MatrixRow]) -> str:
    rows = "".join(
        f'<tr><th><a href="#{escape(row.fm)}">{escape(row.fm)}</a></th><td>{_verdict(row.fixed)}</td>'
        f"<td>{_verdict(row.broken, row.fm)}</td><td>{_verdict(row.weak, '-') if row.weak else '–'}</td></tr>"
        for row in matrix_rows)
    return ('<table class="matrix"><tr><th>FM</th><th>fixed (guarantees)</th><th>broken (symptom)</th>'
            f'<th>hard variant, before its fix</th></tr>{rows}</table>')


def _verdict(r: RunReport | None, fm: str = "") -> str:
    if r is None:
        return "–" if fm == "fm0" else '<span class="verdict none">not run</span>'  # fm0 has no earlier code
    labels = " ".join(c.label for c in r.checks)
    return f'<span class="verdict {"ok" if r.ok else "bad"}">{escape(r.verdict)}</span> {escape(labels)}'


def _section(row: MatrixRow, lesson: Lesson | None) -> str:
    fm = row.fm
    head = f"<h2>{escape(fm)}: {_inline(lesson.summary) if lesson else ''}</h2>"
    module = f'<p class="module"><code>{escape(lesson.module)}.py</code></p>' if lesson else ""
    lessons = "".join(f'<div class="lesson" data-part="{escape(name.lower())}"><h3>{escape(name)}</h3>{_prose(text)}</div>'
                      for name, text in (lesson.sections.items() if lesson else ()))
    runs = [r for r in (row.fixed, row.broken, row.weak) if r is not None]
    cells = "".join(_cell(r) for r in runs)
    timelines = [(r, timeline.build(r.observations) if r.observations is not None else None) for r in runs]
    span = max((tl.span for _, tl in timelines if tl is not None), default=0.0)  # one time scale for the FM's runs
    figures = "".join(_figure(r, tl, span) for r, tl in timelines)
    return (f'<section class="fm" id="{escape(fm)}">{head}{module}<div class="lessons">{lessons}</div>'
            f'{_change(fm)}<div class="cells">{cells}</div><div class="timelines">{figures}</div></section>')


def _change(fm: str) -> str:
    """The code diff from the previous FM's file (none for fm0)."""
    step = diff.step(fm) if fm[2:].isdigit() else None
    if step is None:
        return ""
    rows = "".join(f'<span class="{_diff_class(line)}">{escape(line)}</span>\n' for line in step.lines)
    return (f'<div class="change" data-fm="{escape(fm)}"><h3>The change</h3><p class="module">'
            f"<code>{escape(step.before)}.py</code> → <code>{escape(step.after)}.py</code>, docstrings left out: "
            f"{len(step.added)} lines added, {len(step.removed)} removed</p><pre class=\"diff\">{rows}</pre></div>")


def _diff_class(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "d-file"
    return {"+": "d-add", "-": "d-del", "@": "d-hunk"}.get(line[:1], "d-ctx")


def _cell(r: RunReport) -> str:
    checks = "".join(f'<li class="check {"ok" if c.ok else "bad"}" data-label="{escape(c.label)}"><b>{escape(c.label)}</b> '
                     f"{'holds' if c.ok else 'FAILS'}<ul class=\"seen\">{_seen(c.detail)}</ul></li>" for c in r.checks)
    error = f'<p class="error">{escape(r.error)}</p>' if r.error else ""
    return (f'<div class="cell" data-kind="{escape(r.kind)}"><h3>{escape(r.kind)}: scenario {r.scenario} on '
            f"<code>{escape(r.code)}</code>'s code</h3><p>{_verdict(r)} <span class=\"secs\">{r.seconds:.1f}s</span></p>"
            f"<ul>{checks}</ul>{error}</div>")


def _seen(detail: str) -> str:
    """A check's observations, one short line each (the checks join them with '; ')."""
    return "".join(f"<li>{escape(part)}</li>" for part in detail.split("; ") if part)


def _figure(r: RunReport, tl: timeline.Timeline | None, span: float) -> str:
    caption = f"{r.kind} run: what happened to each document"
    if tl is None:
        body = f'<p class="error">no observations: {escape(r.error or "the run did not get that far")}</p>'
    else:
        body = (f'<p class="stop">run {escape(tl.run_id)}; stopped: {escape(tl.stopped_by)} at {tl.span:.2f}s; '
                f"chord: {escape(tl.chord)}</p>{swimlanes.render(tl, span)}")
    return f'<figure class="timeline" data-kind="{escape(r.kind)}"><figcaption>{escape(caption)}</figcaption>{body}</figure>'


def _prose(text: str) -> str:
    """Docstring paragraphs as HTML: ``code``, *emphasis* and ``- `` lists."""
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
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:0;color:#222;background:#fafafa}
header,nav,aside,main{max-width:1400px;margin:0 auto;padding:0 24px}
header h1{margin:20px 0 0;font-size:24px} .meta{color:#666;margin:2px 0 8px}
h2{font-size:19px;margin:18px 0 8px} h3{font-size:15px;margin:8px 0 4px}
code{font:13px ui-monospace,"DejaVu Sans Mono",monospace;background:#eef;padding:0 3px;border-radius:3px}
table.matrix{border-collapse:collapse;background:#fff} .matrix td,.matrix th{border:1px solid #ddd;padding:4px 10px;text-align:left}
.verdict{font-weight:700;padding:1px 6px;border-radius:4px;color:#fff} .verdict.ok{background:#2e7d32} .verdict.bad{background:#c62828}
.verdict.none{background:#9e9e9e}
svg.legend{max-width:100%;height:auto} svg.legend text{fill:#222;stroke:none;font:13px system-ui,"DejaVu Sans",sans-serif}
section.fm{background:#fff;border:1px solid #ddd;border-radius:8px;margin:22px 0;padding:4px 20px 16px}
.lessons{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:4px 22px;font-size:14px}
.lesson p,.lesson ul{margin:4px 0} .module{margin:0;color:#555}
.cells{display:flex;flex-wrap:wrap;gap:12px;margin-top:8px} .cell{flex:1 1 420px;border:1px solid #e3e3e3;border-radius:6px;padding:2px 12px}
.cell{font-size:14px} .cell ul{padding-left:18px;margin:4px 0} ul.seen{margin:0 0 2px;padding-left:16px;font-size:13px;color:#444} .check.bad{color:#c62828} .secs{color:#777} .error{color:#c62828;white-space:pre-wrap}
.timelines{display:flex;flex-wrap:wrap;gap:12px;margin-top:10px} figure.timeline{margin:0;flex:1 1 500px;min-width:0;max-width:620px}
figcaption{font-weight:600} .stop{margin:2px 0 4px;color:#555;font-size:13px;min-height:2.9em}
svg.swimlanes{background:#fff;max-width:100%;height:auto;font:12px system-ui,"DejaVu Sans",sans-serif}
svg .axis line{stroke:#e6e6e6} svg .axis text{fill:#888;font-size:10px}
svg .lane-bg{fill:#fff} svg .lane:nth-of-type(even) .lane-bg{fill:#f6f7f9} svg text.doc{font-weight:600;fill:#333}
svg text.final{font-size:11px;font-weight:600} svg text.delay{font-size:9.5px;fill:#1565c0}
svg .attempt-killed{fill-opacity:.15;stroke:#212121;stroke-dasharray:3 2} svg .attempt-running{fill-opacity:.35}
svg line.backoff{stroke-dasharray:2 3;stroke-width:1.6}
.change pre.diff{font:12.5px/1.4 ui-monospace,"DejaVu Sans Mono",monospace;background:#fbfbfb;border:1px solid #e3e3e3;
border-radius:6px;padding:6px 0;overflow-x:auto;margin:4px 0} .diff span{display:inline-block;min-width:100%;box-sizing:border-box;padding:0 10px}
.diff .d-add{background:#e6ffec;color:#1a5e2a} .diff .d-del{background:#ffebe9;color:#8a1c1c} .diff .d-hunk{color:#6f42c1;background:#f3f0ff}
.diff .d-file{color:#555;font-weight:600}
@media print{body{background:#fff;font-size:12px} header,nav,aside,main{max-width:none;padding:0}
section.fm{break-before:page;border:none;padding:0} .diff span{white-space:pre-wrap} figure.timeline,.cell,.change{break-inside:avoid}
.timelines{display:block} figure.timeline{max-width:none;margin-bottom:10px} .verdict{border:1px solid #000}
a{color:inherit;text-decoration:none}}
</style></head>
"""
