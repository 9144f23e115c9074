"""One lesson, one folder (DESIGN.md §10): the registry and the folders agree, each lesson declares its pieces
behind the lab's interfaces, and ``lab/`` names no failure mode and no scenario number. No broker needed."""

from __future__ import annotations

import re

import pytest

import lessons
from lab.fm import ROOT
from lab.injector import Injector
from lab.lesson import Lesson

LESSONS_DIR = ROOT / "lessons"
NAMES_A_LESSON = re.compile(r"\bfm[0-9]|FM-[0-9]|[Ss]cenarios? [0-9]")
"""An FM's short name, its number as the docstrings write it, or a scenario's number."""
NOT_YET_GENERIC = {
    "lab/app.py": 14, "lab/backend.py": 1, "lab/by_hand.py": 1, "lab/faults.py": 9, "lab/fm.py": 9, "lab/harness.py": 14,
    "lab/link.py": 3, "lab/matrix.py": 6, "lab/metrics.py": 3, "lab/observe.py": 18, "lab/owned.py": 4, "lab/pipeline.py": 7,
    "lab/pool.py": 1, "lab/quiet_log.py": 5, "lab/records.py": 3, "lab/settings.py": 5, "lab/show/diff.py": 2,
    "lab/show/report.py": 8, "lab/show/swimlanes.py": 7, "lab/show/timeline.py": 30, "lab/variants.py": 5,
    "lab/worker_log.py": 9,
}
"""Files of ``lab/`` that still name lessons (mostly in docstrings and examples, some in the fm0/fmN naming of the
harness), with how often: a ratchet. A new file names none, and none of these may name more; the runner, the
scenarios, the checks, the injector and the lesson interface name none already."""


def test_the_registry_holds_every_lesson_folder_and_every_fm_file_in_order() -> None:
    folders = sorted(p.name for p in LESSONS_DIR.iterdir() if (p / "__init__.py").exists())
    assert sorted(lessons.FMS) == folders
    assert list(lessons.FMS) == [s for s in lessons.modules() if s != "fm0"]


@pytest.mark.parametrize("name", lessons.FMS)
def test_each_lesson_declares_its_programs_documents_injectors_and_checks(name: str) -> None:
    lesson: Lesson = lessons.lesson(name)
    assert lesson.name == name and lesson.programs.fixed == lessons.modules()[name]
    assert lesson.programs.broken == lessons.modules()[f"fm{lessons.FMS.index(name)}"]
    assert all(callable(make) and isinstance(make(), Injector) for make in lesson.part.injectors.values())
    named = {side.injector for side in lesson.part.sides if side.injector is not None}
    assert named <= set(lessons.scenario(lessons.FMS.index(name) + 1).injectors)  # a side's injector is in its scenario
    assert all(doc.what for doc in lesson.part.docs) and all(side.what for side in lesson.part.sides)
    assert (lesson.checks.hard_symptom is None) is (lesson.programs.before_hard_fix is None)
    n = lessons.FMS.index(name) + 1
    assert sorted(lesson.checks.words) == sorted([f"G{n}", f"S{n}", *([f"S{n} hard"] if lesson.checks.hard_symptom else [])])
    assert all(lesson.checks.words.values())  # each check says what it means, in words


def test_each_document_has_one_lesson_and_a_name_in_words() -> None:
    docs = [d.id for name in lessons.FMS for d in lessons.lesson(name).part.docs]
    docs += [d.id for name in lessons.FMS for side in lessons.lesson(name).part.sides for d in side.docs]
    assert len(docs) == len(set(docs))
    last = lessons.scenario(len(lessons.FMS))
    assert set(last.what) == set(last.docs) and all(last.what.values())


def test_no_file_under_lab_names_a_failure_mode_or_a_scenario_number_beyond_what_is_left() -> None:
    found = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "lab").rglob("*.py"))
             if (n := len(NAMES_A_LESSON.findall(p.read_text())))}
    grown = {path: n for path, n in found.items() if n > NOT_YET_GENERIC.get(path, 0)}
    assert grown == {}, "lab/ names lessons: keep what a lesson adds in its folder (lessons/<name>/)"
    for path in ("lab/runner.py", "lab/scenarios.py", "lab/checks.py", "lab/injector.py", "lab/lesson.py"):
        assert path not in found
