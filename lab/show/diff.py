"""The change from one FM file to the next: the lesson of each FM, as a diff.

``step(fm)`` is the unified diff from FM N-1's code to FM N's, docstrings left
out (the code is what changes; the docstrings say why). ``run_all_fms.py --diff``
prints it, coloured on a terminal and plain in a pipe; the report shows it in
each FM's section ("The change"); ``tests/test_fm_files.py`` bounds its size.
"""

from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass

import lessons
from lab.fm import ROOT

CONTEXT_LINES = 2


def code_of(module: str) -> list[str]:
    """The module's source lines without its docstring (and the blank lines after it)."""
    source = (ROOT / f"{module}.py").read_text()
    tree = ast.parse(source)
    lines = source.splitlines()
    first = tree.body[0] if tree.body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        lines = lines[first.end_lineno or 0:]
    while lines and not lines[0].strip():
        lines = lines[1:]
    return lines


@dataclass(frozen=True)
class Step:
    """FM N's lesson: the diff from ``before`` (FM N-1's module) to ``after`` (FM N's)."""

    fm: str
    before: str
    after: str
    lines: tuple[str, ...]  # unified diff, without line ends

    @property
    def added(self) -> list[str]:
        return [line[1:] for line in self.lines if line.startswith("+") and not line.startswith("+++")]

    @property
    def removed(self) -> list[str]:
        return [line[1:] for line in self.lines if line.startswith("-") and not line.startswith("---")]

    @property
    def changed(self) -> int:
        """Lines added plus lines removed."""
        return len(self.added) + len(self.removed)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def step(fm: str, context: int = CONTEXT_LINES) -> Step | None:
    """The change that makes lesson ``fm``'s program from the one before it, with ``context`` unchanged lines
    around each change (the report: one, to stay short); None for the naive program, which has none before."""
    modules = lessons.modules()
    if lessons.number(fm) < 1:
        return None
    before = lessons.broken_code(fm)
    a, b = modules[before], modules[fm]
    diff = difflib.unified_diff(code_of(a), code_of(b), f"{a}.py", f"{b}.py", n=context, lineterm="")
    return Step(fm, a, b, tuple(diff))


def steps() -> list[Step]:
    return [s for fm in lessons.modules() if (s := step(fm)) is not None]
