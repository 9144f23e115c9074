"""The lessons, in order (DESIGN.md §10): one folder each, beside the programs at the root.

A lesson's folder holds what the lab adds to its FM's program to teach and prove it: the documents and
faults its scenario adds, its side chords, its fault injector, its checks, and (when it has a hard variant)
its program as it stood before the hard fix (``before_hard_fix.py``). The FM files stay at the root, the
complete programs. Adding a lesson is its folder, its FM file, its test file and one line here.
"""

from __future__ import annotations

from pathlib import Path

from lab.app import BEFORE_HARD_FIX

HERE = Path(__file__).resolve().parent

FMS: tuple[str, ...] = (
    "fm1",
    "fm2",
    "fm3",
    "fm4",
    "fm5",
    "fm6",
    "fm7",
    "fm8",
    "fm9",
)
"""The FM lessons in order: scenario N holds what lessons 1..N add, FM N checks the guarantees of 1..N."""


def before_hard_fix(lesson: str) -> str | None:
    """The module of ``lesson``'s program as it stood before its hard fix, when it has one."""
    return f"lessons.{lesson}.{BEFORE_HARD_FIX}" if (HERE / lesson / f"{BEFORE_HARD_FIX}.py").exists() else None
