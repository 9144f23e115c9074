"""One lesson, one folder (DESIGN.md §10): the registry and the folders agree, each lesson declares its pieces
behind the lab's interfaces, and ``lab/`` names no failure mode and no scenario number. No broker needed."""

from __future__ import annotations

import re

import pytest

import lessons
from lab.fm import ROOT
from lab.injector import Injector
from lab.lesson import CaseStudy, Lesson, RunKind
from lab.scenarios import MAIN, Needs

LESSONS_DIR = ROOT / "lessons"
NAMES_A_LESSON = re.compile(r"\bfm[0-9]|FM-[0-9]|[Ss]cenarios? [0-9]")
"""An FM's short name, its number as the docstrings write it, or a scenario's number."""



def test_the_registry_holds_every_lesson_folder_and_every_fm_file_in_order() -> None:
    folders = sorted(p.name for p in LESSONS_DIR.iterdir() if (p / "__init__.py").exists())
    assert sorted(lessons.FMS) == folders
    assert list(lessons.FMS) == [s for s in lessons.modules() if s != lessons.NAIVE]


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


@pytest.mark.parametrize("name", lessons.FMS)
def test_a_symptoms_run_meets_only_what_its_lesson_says_it_needs_and_a_fixed_run_the_whole_scenario(name: str) -> None:
    n = lessons.FMS.index(name) + 1
    whole, part = lessons.scenario(n), lessons.lesson(name).part
    assert lessons.scenario_for("fixed", n) == whole
    runs: list[tuple[RunKind, Needs | None]] = [("broken", part.symptom), ("weak", part.hard)]
    for kind, needs in runs:
        met = lessons.scenario_for(kind, n)
        if needs is None:
            assert met == whole
            continue
        assert met.number == n and met.docs == needs.docs and [s.tag for s in met.sides] == list(needs.sides)
        assert {d: whole.faults[d] for d in needs.docs} == dict(met.faults)
        assert set(met.injectors) == {s.injector for s in met.sides if s.injector is not None}
        for side in met.sides:  # each still sent after the run's own chord or a side kept; none waits for one left out
            assert side.after and set(side.after) <= {MAIN, *needs.sides} and set(side.before) <= set(needs.sides)
            assert side.docs == next(s for s in whole.sides if s.tag == side.tag).docs


def test_a_scenario_cannot_be_narrowed_to_what_it_does_not_hold() -> None:
    last = lessons.scenario(len(lessons.FMS))
    for needs in (Needs(docs=("doc2", "no-such-doc")), Needs(docs=("doc2",), sides=("no-such-side",)), Needs(docs=())):
        with pytest.raises(ValueError, match="cannot be narrowed"):
            last.narrowed(needs)


def test_each_document_has_one_lesson_and_a_name_in_words() -> None:
    docs = [d.id for name in lessons.FMS for d in lessons.lesson(name).part.docs]
    docs += [d.id for name in lessons.FMS for side in lessons.lesson(name).part.sides for d in side.docs]
    assert len(docs) == len(set(docs))
    last = lessons.scenario(len(lessons.FMS))
    assert set(last.what) == set(last.docs) and all(last.what.values())


def test_no_file_under_lab_names_a_failure_mode_or_a_scenario_number() -> None:
    found = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / "lab").rglob("*.py"))
             if (n := len(NAMES_A_LESSON.findall(p.read_text())))}
    assert found == {}, "lab/ names lessons: keep what a lesson adds in its folder (lessons/<name>/), its name in the registry"


def test_the_rule_sees_a_lesson_named() -> None:
    named = ["fm9_connection_loss", "FM-4's claim", "scenario 8", "Scenarios 7 to 9", "lessons.fm7.deploy"]
    assert all(NAMES_A_LESSON.search(text) for text in named)
    assert not any(NAMES_A_LESSON.search(text) for text in ["<short>_<what>", "include_fm0", "a lesson's claim"])


def test_case_studies_are_found_through_the_registry_by_name_cell_and_code() -> None:
    for study in lessons.CASE_STUDIES:
        case: CaseStudy = study
        assert lessons.case_study(case.name) is case and lessons.case_study(f"{case.name}/{case.scenarios[0]}") is case
        assert sorted(case.codes.values()) == ["broken", "fixed"]
        assert all(lessons.case_study(code) is case for code in case.codes)
        assert set(case.writeup_shows) <= set(case.scenarios)
        assert case.programs.fixed.startswith(f"case_studies.{case.name}.") and case.programs.broken is not None
    assert sorted(c.name for c in lessons.CASE_STUDIES) == sorted(p.parent.name for p in (ROOT / "case_studies").glob("*/study.py"))
    assert lessons.case_study("fm3") is None and lessons.case_study("nothing/batch") is None
