"""The lesson interface (DESIGN.md §10): what every lesson declares, the failure modes and the case studies alike.

A lesson runs programs (``Programs``: the one it teaches, the one that shows its symptom, and the one as it
stood before its hard fix), on documents and faults of its own with the injectors that act on its runs
(``lab.scenarios.Part``), and judges each run with checks (``LessonChecks``: named predicates over the run's
``Observations``). The harness and the runner know a lesson only through this; what is cumulative (scenario N
holds what lessons 1..N add, FM N checks the guarantees of 1..N) is built by the registry (``lessons``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from lab.fm import Fm
from lab.records import Check, Observations
from lab.runner import StopCondition
from lab.scenarios import Part

RunKind = Literal["fixed", "broken", "weak", "bug"]
"""Which program a run runs: the lesson's (fixed), the broken one, the one before the hard fix, the naive program's bug."""
Checker = Callable[[Observations, Fm], Check]
"""A named predicate over a run's observations; ``Fm`` is the program whose bounds it holds the run to (the
lesson's own, for a symptom too)."""
Stop = tuple[str, StopCondition]
"""Where a run whose chord never completes stops: the symptom in words, and when it holds."""
StopFor = Callable[[Fm, Fm], Stop | None]
"""``(the lesson's program, the program that runs) -> where that run stops`` (None: when its chord ends)."""


@dataclass(frozen=True)
class Programs:
    """The modules a lesson runs (``celery -A <module> worker``)."""

    fixed: str  # the program it teaches (an FM file; a case study's fixed program)
    broken: str | None  # the one that shows its symptom: the FM before it; the write-up as published
    before_hard_fix: str | None = None  # the program as it stood before its hard fix (a real file beside the lesson)


@dataclass(frozen=True)
class LessonChecks:
    """A lesson's checks: its guarantee (on its program), its symptom (on the broken one) and its hard variant's
    symptom (on the one before the hard fix), each with where its run stops when the chord never completes."""

    guarantee: Checker
    symptom: Checker
    symptom_stop: StopFor | None = None
    hard_symptom: Checker | None = None
    hard_stop: StopFor | None = None
    words: Mapping[str, str] = field(default_factory=lambda: {})  # each check's label -> what it means, in words


class Lesson(Protocol):
    """What a lesson declares (the nine FMs here; the case studies implement it too)."""

    @property
    def name(self) -> str:
        """How the CLI names it (its folder's name, ``severity_batch``)."""
        ...

    @property
    def programs(self) -> Programs: ...

    @property
    def part(self) -> Part:
        """The documents and faults it adds, its side chords and its fault injectors."""
        ...

    @property
    def checks(self) -> LessonChecks: ...


@dataclass(frozen=True)
class FolderLesson:
    """A lesson whose pieces sit in its folder (``lessons/<name>/``): an FM's."""

    name: str
    programs: Programs
    part: Part
    checks: LessonChecks
