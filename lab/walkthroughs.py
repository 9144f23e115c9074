"""The walkthroughs' printed output: each lesson's README (``lessons/<name>/README.md``) quotes what the lab's commands
print, in blocks this module renders from the lesson's runs, writes and compares.

    .venv/bin/python -m lab.walkthroughs --write            # every lesson: make its runs, rewrite its blocks
    .venv/bin/python -m lab.walkthroughs --write NAME ...   # only these lessons

A block in a README is a marker line, a fenced ``text`` block the marker owns, and a closing marker:

    <!-- output: KIND ARGS -->
    ```text
    ...
    ```
    <!-- /output -->

KIND says what the block quotes, each with the same functions the command line prints with:

- ``diff``: ``run_all_fms.py --diff NAME``, the step from the previous program (no run needed);
- ``run``: the fixed run's verdict and its last check's line (the lesson's own guarantee), as
  ``run_all_fms.py --only NAME`` prints them; the earlier checks are counted, not quoted;
- ``prove``: the summary table of the lesson's runs and each symptom's line, as ``--prove`` prints them;
- ``timeline WHAT``: the lines of WHAT (a document, ``notify``, ``email`` or ``side chord TAG``; several joined by
  ``, ``) in the fixed run's timeline and the broken run's, each under its run's title line.

The lesson tests compare every block with the runs their session already made (``differences``), after
``masked`` hid what changes from run to run: run ids, task ids, pids, ports, job numbers, times and durations.
Everything else in a block (verdicts, attempts, reasons, outcomes, the order of the lines) must be the same.
"""

from __future__ import annotations

import argparse
import difflib
import io
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import lessons
import run_all_fms
from lab import harness
from lab.fm import ROOT
from lab.lesson import RunKind
from lab.records import RunReport
from lab.show import timeline_text
from lab.show.progress import timeline_of

KINDS_SHOWN: tuple[RunKind, ...] = ("fixed", "broken", "weak")
"""The runs a walkthrough quotes, in this order (the naive program's bug run is the first lesson's broken run)."""

BLOCK = re.compile(r"(?P<open><!-- output: (?P<kind>\w+)(?P<args>[^>]*?) -->\n)```text\n(?P<body>.*?)```\n"
                   r"(?P<close><!-- /output -->)", re.S)

MASKS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b\d{6}-[0-9a-f]{6}\b"), "<run>"),  # a run id: the time it began and a random tail
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b"), "<id>"),  # a task or chord id
    (re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{1,11}…"), "<id>…"),  # one cut short
    (re.compile(r"\b(pid|Job:|port) ?\d+"), r"\1 <n>"),  # a process, a pool's job number, a port
    (re.compile(r":\d{4,5}\b"), ":<port>"),
    (re.compile(r"-?\d+\.\d+(?:→\d+\.\d+)?"), "<t>"),  # seconds since submission, a span, a duration
    (re.compile(r"\b\d+ ?ms\b"), "<t> ms"),
)
PADDING = re.compile(r"(?<=\S)[ \t]+")
"""The padding that follows the width of a time (the indentation stays: it says what belongs to what)."""


VARIES = "varies"
"""A block marked ``varies`` quotes runs whose details differ from run to run by the lesson's nature (which documents a
deploy hits, how many stores an outage fails): it is compared by its lines that do not: each run's first line, its
checks' labels and verdicts, the first line of each document or side chord in a timeline (its outcome), the summary
table whole; in any order after a part's first line."""
CHECK_LINE = re.compile(r"^(  (?:ok  |FAIL) [^:]+):")


def masked(text: str, varies: bool = False) -> str:
    """``text`` with what differs from one run to the next replaced by a placeholder; ``varies``: a later part is
    reduced to its first line and its checks' labels."""
    for pattern, placeholder in MASKS:
        text = pattern.sub(placeholder, text)
    parts = "\n".join(line.rstrip() for line in text.splitlines()).split("\n\n")
    if varies:
        parts = [_reduced(part) for part in parts if part.strip()]
    return PADDING.sub(" ", "\n\n".join(parts))


def _reduced(part: str) -> str:
    """A part's lines as far as they do not vary: a check by its label and verdict, a timeline by its lines two
    spaces in (a document's or a side chord's first line), a table whole."""
    found: list[str] = []
    for line in part.splitlines():
        if m := CHECK_LINE.match(line):
            found.append(m.group(1) + ": ...")
        elif len(line) - len(line.lstrip(" ")) <= 2:
            found.append(line)
    return "\n".join(found[:1] + sorted(found[1:]))  # which of two near-simultaneous lines comes first varies too


def readme(name: str) -> Path:
    return ROOT / "lessons" / name / "README.md"


def shown(runs: Mapping[RunKind, RunReport]) -> list[RunReport]:
    return [runs[kind] for kind in KINDS_SHOWN if kind in runs]


def diff_block(name: str) -> list[str]:
    out = io.StringIO()
    run_all_fms.print_diffs([name], out)
    return out.getvalue().rstrip("\n").splitlines()


def _describe(r: RunReport, only_last: bool) -> list[str]:
    lines = harness.describe(r).splitlines()
    if not only_last or len(r.checks) < 2:
        return lines
    earlier = r.checks[:-1]
    held = ("holds" if len(earlier) == 1 else "each holds") if all(c.ok for c in earlier) else "not all hold"
    labels = earlier[0].label if len(earlier) == 1 else f"{earlier[0].label} to {earlier[-1].label}"
    return [lines[0], f"  ... {labels}: {'one line' if len(earlier) == 1 else 'one line each'}, {held}", *lines[len(r.checks):]]


def run_block(runs: Mapping[RunKind, RunReport]) -> list[str]:
    return _describe(runs["fixed"], only_last=True)


def prove_block(runs: Mapping[RunKind, RunReport]) -> list[str]:
    found = run_all_fms.summary_table(shown(runs), prove=True).splitlines()
    for r in shown(runs)[1:]:
        found += ["", *_describe(r, only_last=False)]
    return found


def picked(lines: Sequence[str], what: str) -> list[str]:
    """The lines of ``what`` in one run's timeline: its own line, two spaces in, and the deeper lines under it (for a
    side chord, its heading and the facts under it, not its members' lines)."""
    found: list[str] = []
    inside = False
    for line in lines:
        depth = len(line) - len(line.lstrip(" "))
        if depth == 2:
            inside = line[2:] == what or line[2:].startswith(what + " ") or line[2:].startswith(what + ":")
        elif depth < 2:
            inside = False
        if inside and (not what.startswith("side chord ") or depth == 2 or line.lstrip().startswith("· ")):
            found.append(line)  # a side chord: its heading and its facts (its members are many)
    return found


def timeline_block(runs: Mapping[RunKind, RunReport], what: str) -> list[str]:
    found: list[str] = []
    for r in shown(runs)[:2]:  # the fixed run and the broken one (a hard variant is about other documents)
        lines = [timeline_text.plain(line) for line in timeline_of(r)]
        mine = [line for one in what.split(", ") for line in picked(lines, one) or [f"  ({one}: not in this run's timeline)"]]
        found += [*([""] if found else []), lines[0], *mine]
    return found


@dataclass(frozen=True)
class Block:
    kind: str
    args: str
    body: str
    start: int
    end: int


RENDER: dict[str, Callable[[str, Mapping[RunKind, RunReport], str], list[str]]] = {
    "diff": lambda name, runs, args: diff_block(name),
    "run": lambda name, runs, args: run_block(runs),
    "prove": lambda name, runs, args: prove_block(runs),
    "timeline": lambda name, runs, args: timeline_block(runs, args),
}


def blocks(text: str) -> list[Block]:
    return [Block(m.group("kind"), m.group("args").strip(), m.group("body"), m.start("body"), m.end("body"))
            for m in BLOCK.finditer(text)]


def render(name: str, block: Block, runs: Mapping[RunKind, RunReport]) -> str:
    if block.kind not in RENDER:
        raise ValueError(f"{readme(name)}: no output of kind {block.kind!r} (known: {', '.join(RENDER)})")
    args = " ".join(word for word in block.args.split(" ") if word != VARIES)
    return "\n".join(RENDER[block.kind](name, runs, args)) + "\n"


def rewritten(name: str, runs: Mapping[RunKind, RunReport]) -> str:
    """The lesson's README with every block rendered from ``runs``."""
    text = readme(name).read_text(encoding="utf-8")
    for block in reversed(blocks(text)):
        text = text[: block.start] + render(name, block, runs) + text[block.end:]
    return text


def differences(name: str, runs: Mapping[RunKind, RunReport]) -> list[str]:
    """Each block of the lesson's README that ``runs`` print otherwise (masked), as its kind and a unified diff."""
    found: list[str] = []
    for block in blocks(readme(name).read_text(encoding="utf-8")):
        varies = VARIES in block.args.split()
        want = masked(block.body, varies).splitlines()
        got = masked(render(name, block, runs), varies).splitlines()
        if want != got:
            diff = "\n".join(difflib.unified_diff(want, got, "README", "this run", lineterm="", n=1))
            found.append(f"{block.kind} {block.args}".rstrip() + f":\n{diff}")
    return found


def make_runs(names: Sequence[str], jobs: int = 2) -> dict[str, dict[RunKind, RunReport]]:
    """The runs of each lesson (the cells ``--only NAME --prove`` makes), up to ``jobs`` at once."""
    cells = list(dict.fromkeys(cell for name in names for cell in lessons.cells(name)))
    reports: dict[tuple[str, RunKind], RunReport] = {}

    def run(i: int) -> None:
        fm, kind = cells[i]
        print(f"{fm} {kind} ...", flush=True)
        reports[cells[i]] = harness.run_one(fm, kind, lambda _: None)

    run_all_fms.run_at_once(cells, jobs, run, lambda: None)
    return {name: {kind: reports[(fm, kind)] for fm, kind in lessons.cells(name) if fm == name} for name in names}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.walkthroughs", description="the walkthroughs' printed output")
    p.add_argument("--write", action="store_true", help="make the lessons' runs and rewrite their READMEs' output blocks")
    p.add_argument("names", nargs="*", metavar="NAME", help="lessons (default: every one)")
    p.add_argument("--jobs", type=int, default=2, metavar="N", help="runs at once (default 2)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    names = list(args.names) or list(lessons.FMS)
    unknown = [n for n in names if n not in lessons.FMS]
    if unknown or not args.write:
        p.error(f"unknown lessons {unknown}; known: {', '.join(lessons.FMS)}" if unknown else "say --write")
    from lab import services, workers

    services.ensure()
    with workers.NamespaceLock():
        try:
            runs = make_runs(names, args.jobs)
        finally:
            workers.wait_stopped()
    failed: list[str] = []
    for name in names:
        bad = [f"{r.fm} {r.kind}: {r.verdict}" for r in runs[name].values() if not r.ok]
        if bad:  # a walkthrough quotes runs that did what the lesson says
            failed += bad
            for r in runs[name].values():
                if not r.ok:
                    print(harness.describe(r), file=sys.stderr)
            continue
        readme(name).write_text(rewritten(name, runs[name]), encoding="utf-8")
        print(f"wrote {readme(name).relative_to(ROOT)}")
    if failed:
        print(f"not written: {'; '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
