"""The lessons, in order (DESIGN.md §10): one folder each, beside the programs at the root.

A lesson's folder holds what the lab adds to its FM's program to teach and prove it: the documents and
faults its scenario adds, its side chords, its fault injector, its checks, and (when it has a hard variant)
its program as it stood before the hard fix (``before_hard_fix.py``). The FM files stay at the root, the
complete programs. Adding a lesson is its folder, its FM file, its test file and one line here.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import cast

from lab.app import BEFORE_HARD_FIX
from lab.fm import Fm, fm_modules
from lab.lesson import FolderLesson, LessonChecks, Programs, RunKind, Stop

from lab.records import Check, Observations
from lab.scenarios import Part, Scenario, cumulative

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


def _part(lesson: str) -> Part:
    return cast(Part, importlib.import_module(f"lessons.{lesson}.scenario").PART)


def scenario(number: int) -> Scenario:
    """Scenario ``number``: what lessons 1..number add (fm0 runs scenario 1)."""
    if not 1 <= number <= len(FMS):
        raise ValueError(f"no scenario {number}; there are 1..{len(FMS)}")
    return cumulative(number, [_part(lesson) for lesson in FMS[:number]])


def scenario_for(kind: RunKind, number: int) -> Scenario:
    """The scenario a run of ``kind`` meets: scenario ``number`` whole for a fixed run (it checks every guarantee up
    to its own) and the naive program's bug; for a symptom's run (broken) or a hard variant's (weak), only what the
    lesson says its check needs (``lab.scenarios.Needs``, its part's ``symptom`` and ``hard``), when it says."""
    whole = scenario(number)
    if kind not in ("broken", "weak"):
        return whole
    part = _part(FMS[number - 1])
    needs = part.symptom if kind == "broken" else part.hard
    return whole.narrowed(needs) if needs is not None else whole


def scenarios() -> range:
    """The scenarios' numbers."""
    return range(1, len(FMS) + 1)


def lesson(name: str) -> FolderLesson:
    """The lesson ``name`` (``fm7``), read off its folder."""
    n = FMS.index(name)
    checks = cast(LessonChecks, importlib.import_module(f"lessons.{name}.checks").CHECKS)
    modules = fm_modules()
    programs = Programs(modules[name], modules.get(FMS[n - 1] if n else "fm0"), before_hard_fix(name))
    return FolderLesson(name, programs, _part(name), checks)


def guarantees(number: int, obs: Observations, fm: Fm) -> list[Check]:
    """G1..Gn on FM n's run of scenario n."""
    return [lesson(name).checks.guarantee(obs, fm) for name in FMS[:number]]


def checks_of(kind: RunKind, number: int, obs: Observations, fixed: Fm) -> list[Check]:
    """fixed: G1..Gn of FM n; broken: Sn (on FM n-1's code); weak: Sn hard (on FM n before its hard fix); bug: S1."""
    if kind == "fixed":
        return guarantees(number, obs, fixed)
    checks = lesson(FMS[number - 1] if kind != "bug" else FMS[0]).checks
    if kind == "weak":
        if checks.hard_symptom is None:
            raise ValueError(f"lesson {FMS[number - 1]} has no hard variant")
        return [checks.hard_symptom(obs, fixed)]
    return [checks.symptom(obs, fixed)]


def stop_of(kind: RunKind, number: int, fixed: Fm, program: Fm) -> Stop | None:
    """Where a run of ``kind`` stops when its chord never completes (broken: the symptom's; weak: the hard variant's)."""
    checks = lesson(FMS[number - 1]).checks
    found = checks.symptom_stop if kind == "broken" else checks.hard_stop if kind == "weak" else None
    return found(fixed, program) if found is not None else None


NAIVE_BUG: tuple[str, RunKind] = ("fm0", "bug")
"""The naive program's bug (``--include-fm0``): scenario 1 on fm0, its symptom S1, FM-1's to show."""


def cells(name: str) -> list[tuple[str, RunKind]]:
    """The runs lesson ``name`` needs (``run_all_fms.py --only <name> --prove``): its fixed program, the broken one, the
    one before its hard fix when it has one; the first lesson's, the naive program's bug too."""
    found: list[tuple[str, RunKind]] = [(name, "fixed"), (name, "broken")]
    if before_hard_fix(name) is not None:
        found.append((name, "weak"))
    return [NAIVE_BUG, *found] if name == FMS[0] else found


def first_scenario(tag: str) -> int:
    """The first scenario that holds the side chord ``tag`` (its lesson's number); 0 for none of the lessons'."""
    return next((i + 1 for i, name in enumerate(FMS) if any(side.tag == tag for side in _part(name).sides)), 0)


def words() -> dict[str, str]:
    """What each lesson's checks mean, in words: the guarantees, the symptoms, the hard variants' symptoms, each in
    the lessons' order (``G1`` .. ``G9``, ``S1`` .. ``S9``, ``S1 hard`` ..)."""
    found = {label: text for name in FMS for label, text in lesson(name).checks.words.items()}
    kinds = (lambda label: label.startswith("G"), lambda label: label.startswith("S") and not label.endswith(" hard"),
             lambda label: label.endswith(" hard"))
    return {label: found[label] for kind in kinds for label in found if kind(label)}
