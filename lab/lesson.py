"""The lesson interface (DESIGN.md §10): what every lesson declares, the failure modes and the case studies alike.

A lesson runs programs (``Programs``: the one it teaches, the one that shows its symptom, and the one as it
stood before its hard fix), on documents and faults of its own with the injectors that act on its runs
(``lab.scenarios.Part``), and judges each run with checks (``LessonChecks``: named predicates over the run's
``Observations``). The harness and the runner know a lesson only through this; what is cumulative (scenario N
holds what lessons 1..N add, FM N checks the guarantees of 1..N) is built by the registry (``lessons``).

A case study (DESIGN.md §7) is a lesson too (``CaseStudy``): it names its programs the same way (fixed, and the
write-up as published in the ``broken`` slot), but its runs are its own. It plays several scenarios of its own,
each on the fixed program and some on the write-up's, and judges them over what its own run returns (ledger
rows, manifests, log lines) rather than over a cumulative scenario; so it declares its scenarios and runs a cell
itself (``run_one``), where an FM lesson hands the runner its ``Part`` and ``LessonChecks``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from lab.fm import Fm
from lab.records import Check, Observations, OnStage, RunReport
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


Cell = tuple[str, RunKind]
"""One run of a plan: a lesson (or a case study's ``<name>/<scenario>``) and the program it runs."""


class Taught(Protocol):
    """What every lesson declares, an FM's and a case study's alike: its name and the programs it runs."""

    @property
    def name(self) -> str:
        """How the CLI names it (its folder's name: ``severity_batch``)."""
        ...

    @property
    def programs(self) -> Programs: ...


class Lesson(Taught, Protocol):
    """An FM's lesson: its scenario's part and its checks; the registry makes them cumulative."""

    @property
    def part(self) -> Part:
        """The documents and faults it adds, its side chords and its fault injectors."""
        ...

    @property
    def checks(self) -> LessonChecks: ...


class CaseStudy(Taught, Protocol):
    """A case study (``case_studies/<name>/``): a production write-up run as published (``programs.broken``) and
    corrected (``programs.fixed``), scenario by scenario, each cell run by the case study itself."""

    @property
    def codes(self) -> Mapping[str, RunKind]:
        """Each program's namespace code and which program it is (``{"sb": "fixed", "sbw": "broken"}``)."""
        ...

    @property
    def scenarios(self) -> Sequence[str]:
        """Its scenarios, in order; each is a cell ``<name>/<scenario>`` on the fixed program."""
        ...

    @property
    def writeup_shows(self) -> Sequence[str]:
        """The scenarios ``--prove`` also runs on the write-up's program (each shows one of its mistakes)."""
        ...

    def program(self, kind: RunKind, /) -> Fm:
        """The program a run of ``kind`` runs (fixed or broken: the write-up), read off its module."""
        ...

    def run_one(self, cell: str, kind: RunKind, on_stage: OnStage, /) -> RunReport:
        """One cell ``<name>/<scenario>`` of ``kind``, from its namespace's reset to its checks."""
        ...

    def clear(self) -> None:
        """Delete this namespace's rows from its ledgers and its event logs (``run_all_fms.py --clean``)."""
        ...


@dataclass(frozen=True)
class FolderLesson:
    """A lesson whose pieces sit in its folder (``lessons/<name>/``): an FM's."""

    name: str
    programs: Programs
    part: Part
    checks: LessonChecks


@dataclass(frozen=True)
class FolderStudy:
    """A case study whose pieces sit in its folder (``case_studies/<name>/study.py`` makes one)."""

    name: str
    programs: Programs
    codes: Mapping[str, RunKind]
    scenarios: Sequence[str]
    writeup_shows: Sequence[str]
    program: Callable[[RunKind], Fm]
    run_one: Callable[[str, RunKind, OnStage], RunReport]
    clear: Callable[[], None]
