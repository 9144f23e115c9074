"""Each hard variant is a real file (``lessons/<fm>/before_hard_fix.py``): the FM's program as it stood before
its hard fix. Its code (docstrings left out, as ``--diff`` shows a lesson) differs from the FM file's by the hard
fix alone, a few lines: a change to the FM that is not made to it too (or the other way) fails here. No broker."""

from __future__ import annotations

import difflib
import re

import pytest

import lessons
from lab import harness
from lab.fm import ROOT

from lab.show.diff import code_of

BOUND = re.compile(r"but for the hard fix \((?P<what>[^)]*)\): (?P<n>\d+) lines added or removed")
"""How a program before its hard fix states, in its own docstring, what its hard fix is and how many lines it takes."""


def stated_bound(fm: str) -> int:
    """The lines added plus removed between ``fm``'s code and its program before the hard fix, as that program's own
    docstring states them (the lesson's folder holds its bound: a new lesson adds no line here)."""
    module = lessons.before_hard_fix(fm)
    assert module is not None
    found = BOUND.search(" ".join((ROOT / f"{module.replace('.', '/')}.py").read_text(encoding="utf-8").split()))
    assert found is not None, f"{module}'s docstring does not say its hard fix and its lines ({BOUND.pattern})"
    return int(found["n"])


HARD_VARIANTS = [fm for fm in lessons.FMS if lessons.before_hard_fix(fm) is not None]


def changed_lines(fm: str) -> list[str]:
    module = lessons.before_hard_fix(fm)
    assert module is not None
    diff = difflib.unified_diff(code_of(lessons.modules()[fm]), code_of(module.replace(".", "/")), lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]


def test_the_lessons_with_a_hard_variant_are_those_with_a_program_before_the_hard_fix() -> None:
    """A lesson whose checks say a hard variant's symptom (``S<n> hard``) has the program it runs on, and no other."""
    said = [fm for n, fm in enumerate(lessons.FMS, 1) if f"S{n} hard" in lessons.words()]
    assert HARD_VARIANTS == said and len(said) >= 7


@pytest.mark.parametrize("fm", HARD_VARIANTS)
def test_the_program_before_the_hard_fix_differs_from_the_fm_by_the_hard_fix_alone(fm: str) -> None:
    changed = changed_lines(fm)
    assert 0 < len(changed) == stated_bound(fm) <= 12, "\n".join(changed)


@pytest.mark.parametrize("fm", HARD_VARIANTS)
def test_the_program_before_the_hard_fix_runs_in_a_namespace_of_its_own(fm: str) -> None:
    program = harness.load(f"{fm}w")
    assert program.short == f"{fm}w" and program.module == f"lessons.{fm}.before_hard_fix"
    assert all(name.startswith(harness.amqp_name(f"{fm}w", "")) for name in program.queue_names)
    assert harness.code_of(fm, "weak") == f"{fm}w"
