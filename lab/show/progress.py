"""What the harness shows on the console while it works, and after each FM.

``Board`` is the console of one ``run_all_fms.py`` invocation:

- ``stage(fm, kind, stage)`` (the harness's ``on_stage``, with fm and kind bound):
  on a terminal, a live ``rich`` display of the FM, the run, the stage and the
  elapsed time (of the stage, of the run, of the whole lab), a row per run in
  progress (``--jobs``: several at once); elsewhere (CI logs, pipes, tests) one
  plain line per stage;
- ``say(text)``: a line above the live display (a run's result, for instance);
- ``timelines(fm, reports)``: after an FM's runs, a text timeline per run
  (``lab.show.timeline_text``); with ``--prove`` the fixed and broken runs side by
  side when the terminal is wide enough, else one after the other.

Limits: the live display redraws 8 times a second and needs the terminal to
itself; anything else printed to stdout meanwhile shows above it (``rich``
redirects it). Workers never print here: their output goes to their logs.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import TextIO

from rich.console import Console, Group
from rich.progress import Progress, ProgressColumn, SpinnerColumn, Task, TaskID, TextColumn
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from lab.show import timeline, timeline_text
from lab.records import Kind, RunReport, Stage
from lab.show.timeline import MARKS
from lab.show.timeline_text import Line

GAP = 4
"""Columns between two timelines shown side by side."""


class _Clock(ProgressColumn):
    """Elapsed time of a row: of the stage and the run, or of the whole lab."""

    def render(self, task: Task) -> Text:
        since = task.fields.get("stage_since")
        if isinstance(since, float):
            return Text(f"stage {time.monotonic() - since:4.1f}s  run {task.elapsed or 0.0:4.1f}s", style="progress.elapsed")
        return Text(f"{task.elapsed or 0.0:5.1f}s in all", style="progress.elapsed")


class Board:
    """The console of one lab run: live on a terminal (``live=None`` asks the console), plain lines elsewhere."""

    def __init__(self, runs: int, file: TextIO | None = None, live: bool | None = None) -> None:
        self.file = file or sys.stdout
        self.console = Console(file=self.file, highlight=False)
        self.live = self.console.is_terminal if live is None else live
        self.runs, self.done, self.failing = runs, 0, 0
        # No redirection of sys.stdout/sys.stderr through the live display: a finaliser
        # (AsyncResult.__del__ with Redis gone) that writes to stderr from the refresh
        # thread would wait for the display's lock, which that thread holds: a frozen screen.
        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), _Clock(), console=self.console,
                                 transient=True, refresh_per_second=8, redirect_stdout=False, redirect_stderr=False)
        self.overall: TaskID | None = None
        self.rows: dict[tuple[str, str], tuple[TaskID | None, float]] = {}  # each run in progress: its row, its start
        self.key: tuple[str, str] | None = None  # the run that spoke last
        self.lock = threading.Lock()  # runs on several threads (--jobs) speak through one board

    def __enter__(self) -> Board:
        if self.live:
            self.progress.start()
            self.overall = self.progress.add_task(self._overall_words(), total=None)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.live:
            self.progress.stop()

    def _overall_words(self) -> str:
        failing = f", [bold red]{self.failing} failing[/]" if self.failing else ""
        return f"lab: {self.done}/{self.runs} runs done{failing}"

    # ---- while a run works ----

    def stage(self, fm: str, kind: Kind, stage: Stage) -> None:
        """The harness's ``on_stage``, with ``fm`` and ``kind`` bound (``functools.partial``)."""
        with self.lock:
            key = self.key = (fm, kind)
            if key not in self.rows:
                self.rows[key] = (self.progress.add_task("", total=None) if self.live else None, time.monotonic())
            row, started = self.rows[key]
            if not self.live:
                print(f"{fm} {kind} [{time.monotonic() - started:4.1f}s] {stage} ...", file=self.file, flush=True)
            elif row is not None:
                self.progress.update(row, description=f"[bold]{fm} {kind}[/]: {stage}", stage_since=time.monotonic())

    def finished(self, text: str, ok: bool, key: tuple[str, str] | None = None) -> None:
        """A run is over (``key``: which, when several are in progress; else the last that spoke):
        its result above the display, and one more run done."""
        with self.lock:
            found = self.rows.pop(key or self.key or ("", ""), None)
            self.key = None
            self.done += 1
            self.failing += not ok
            if self.live:
                if found is not None and found[0] is not None:
                    self.progress.remove_task(found[0])
                if self.overall is not None:
                    self.progress.update(self.overall, description=self._overall_words())
        self.say(text, "green" if ok else "bold red")

    def say(self, text: str, style: str = "") -> None:
        with self.lock:
            if self.live:
                self.console.print(Text(text, style=style))
            else:
                print(text, file=self.file, flush=True)

    # ---- after an FM's runs ----

    def timelines(self, fm: str, reports: Sequence[RunReport]) -> None:
        with self.lock:
            self._timelines(fm, reports)

    def _timelines(self, fm: str, reports: Sequence[RunReport]) -> None:
        blocks = [timeline_of(r) for r in reports]
        if not self.live:
            print(f"--- {fm}: what happened to each document (seconds since submission) ---", file=self.file)
            for block in blocks:
                for line in block:
                    print(timeline_text.plain(line), file=self.file)
            print(file=self.file, flush=True)
            return
        texts = [_rich(block) for block in blocks]
        self.console.print(Rule(f"{fm}: what happened to each document (seconds since submission)", align="left"))
        widths = [max((t.cell_len for t in text.split()), default=0) for text in texts]
        if len(texts) == 2 and sum(widths) + GAP <= self.console.width:
            grid = Table.grid(padding=(0, GAP))
            grid.add_row(*texts)
            self.console.print(grid)
        else:
            self.console.print(Group(*texts))
        self.console.print()


def timeline_of(r: RunReport) -> list[Line]:
    """A run's timeline as the console prints it after its FM: a title line (run, scenario, code, verdict), then its lines."""
    title = f"{r.fm} {r.kind}: scenario {r.scenario} on {r.code}'s code, {r.verdict}"
    if r.observations is None:
        return [(timeline_text.Piece(title),), (timeline_text.Piece(f"  no observations: {r.error}", "running"),)]
    tl = timeline.build(r.observations, r.body)
    return timeline_text.lines(tl, f"{title} (run {tl.run_id})")


def _rich(block: list[Line]) -> Text:
    out = Text()
    for i, line in enumerate(block):
        if i:
            out.append("\n")
        for piece in line:
            mark = MARKS.get(piece.mark) if piece.mark is not None else None
            if mark is not None:
                out.append(f"{mark.glyph} {piece.text}", style=mark.colour)
            else:
                out.append(piece.text, style="bold" if i == 0 else "")
    return out
