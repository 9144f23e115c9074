"""Exercises (DESIGN.md §11, issue 42), what needs no broker: the starting file each lesson hands out, its task,
its hints, the bounds the lesson states, and its wrong answers (their code bounded against the lab's fix)."""

from __future__ import annotations

import ast
import difflib
import re
from pathlib import Path

import pytest

import lessons
import run_all_fms
from lab import exercise, exercise_check, harness
from lab.fm import ROOT, load_module
from lab.show.diff import code_of

LESSONS = ("fm1", "fm2", "fm3", "fm4", "fm5", "fm6", "fm7", "fm8", "fm9")
"""The lessons with an exercise (every one)."""

WRONG_LINES = {
    "fm1a_error_swallowed": 17, "fm1b_envelope_without_revoked": 3,
    "fm2a_acks_late_alone": 1, "fm2b_reject_alone": 1,
    "fm3a_limit_without_drain": 1, "fm3b_drain_discards": 7,
    "fm4a_lock_without_ttl": 11, "fm4b_released_before_sending": 12,
    "fm5a_autoretry_under_envelope": 5, "fm5b_retry_outside_envelope": 2,
    "fm6a_soft_time_limit_alone": 10, "fm6b_time_limit_alone": 10,
    "fm7a_prefetch_one_alone": 2, "fm7b_soft_shutdown_without_remap": 1,
    "fm8a_reject_without_send_back": 2, "fm8b_retry_without_reject": 2,
    "fm9a_settings_without_limit": 3, "fm9b_limit_without_cancel": 1,
}
"""Lines added plus lines removed between each wrong answer's code and the lab's fix (docstrings left out): the
fix with one plausible mistake, no more; a change to the FM that is not made to them too fails here."""

REASONS = {"dead_lettered", "retries_exhausted", "soft_timeout", "hard_timeout", "time_limit"}
"""Failure reasons a guarantee names as the outcome to see: not a hint of how to get it."""


def wrong_answers(lesson: str) -> list[Path]:
    return sorted((lessons.HERE / lesson / "wrong").glob(f"{lesson}?_*.py"))


def test_the_lessons_with_an_exercise() -> None:
    assert exercise.lesson_names() == LESSONS


@pytest.mark.parametrize("lesson", LESSONS)
def test_the_starting_file_is_the_previous_program_renamed_with_the_task_as_its_docstring(
        lesson: str, tmp_path: Path) -> None:
    path = exercise.hand_out(lesson, tmp_path)
    assert path.name == f"{lesson}x_{lessons.modules()[lesson].split('_', 1)[1]}.py"
    before = (ROOT / f"{exercise.previous_module(lesson)}.py").read_text()
    assert _code(path.read_text()) == _code(before)  # its code unchanged
    program = harness.checked(load_module(path.stem, tmp_path))  # its names in a namespace part of its own
    assert program.short == f"{lesson}x" and program.module == path.stem
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert len(doc.split()) <= exercise.WORDS_LIMIT
    assert f"--check {path}" in doc and f"--hint {lesson} 1" in doc
    task = exercise.task_of(lesson)
    assert " ".join(task.symptom.split()) in " ".join(doc.split())


@pytest.mark.parametrize("lesson", LESSONS)
def test_the_task_names_no_setting_or_primitive_of_the_fix(lesson: str) -> None:
    step = exercise.diff.step(lesson)
    assert step is not None
    before = "\n".join(code_of(exercise.previous_module(lesson)))
    names = {n for line in step.added for n in re.findall(r"\b[A-Za-z]+(?:_[A-Za-z]+)+\b|\b[A-Z][a-z]+[A-Z]\w*\b", line)}
    new = {n for n in names if not re.search(rf"\b{re.escape(n)}\b", before)} - REASONS
    task = exercise.task_of(lesson)
    told = " ".join([task.symptom, *task.must_hold])
    assert [n for n in new if re.search(rf"\b{re.escape(n)}\b", told)] == []


def test_the_starting_file_is_not_overwritten_unless_asked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_all_fms.main(["--exercise", "fm3", str(tmp_path)]) == 0
    said = capsys.readouterr().out
    path = tmp_path / "fm3x_dlq_reconciliation.py"
    assert f"$EDITOR {path}" in said and f"run_all_fms.py --check {path}" in said
    path.write_text(path.read_text() + "# my fix\n")
    assert run_all_fms.main(["--exercise", "fm3", str(tmp_path)]) == 2
    assert "not overwritten" in capsys.readouterr().err and path.read_text().endswith("# my fix\n")
    assert run_all_fms.main(["--exercise", "fm3", str(tmp_path), "--force"]) == 0
    assert "replaced" in capsys.readouterr().out and not path.read_text().endswith("# my fix\n")
    assert run_all_fms.main(["--exercise", "fm3", str(ROOT / "lab")]) == 2  # never into the lab's code
    assert run_all_fms.main(["--exercise", "fm0", str(tmp_path)]) == 2  # the naive program is no lesson
    assert not (ROOT / "lab" / "fm3x_dlq_reconciliation.py").exists()


@pytest.mark.parametrize("lesson", LESSONS)
def test_three_hints_the_last_the_lab_s_fix(lesson: str, capsys: pytest.CaptureFixture[str]) -> None:
    for step in (1, 2):
        assert run_all_fms.main(["--hint", lesson, str(step)]) == 0
        said = capsys.readouterr().out
        assert " ".join(exercise.task_of(lesson).hints[step - 1].split()) in " ".join(said.split())
        assert f"--hint {lesson} {step + 1}" in said
    assert run_all_fms.main(["--hint", lesson, "3"]) == 0
    said = capsys.readouterr().out
    found = exercise.diff.step(lesson)
    assert found is not None and found.text in said
    assert run_all_fms.main(["--hint", lesson, "4"]) == 2


@pytest.mark.parametrize("lesson", LESSONS)
def test_the_bounds_the_lesson_states_are_those_of_the_lab_s_fix(lesson: str) -> None:
    """The lesson states its numbers (the check never reads them off the program under check); the lab's own fix
    holds exactly those."""
    stated, fix = exercise.stated(lesson), harness.load(lesson)
    if stated.delivery_bound is not None:
        assert fix.delivery_bound == stated.delivery_bound
    if stated.retry_policy is not None:
        assert fix.retry_policy == stated.retry_policy
    if stated.hard_timeout is not None:
        assert fix.hard_timeout == stated.hard_timeout and fix.fetch_hard_timeout() == stated.fetch_hard_timeout
    judged = exercise.held(fix, stated)
    assert (judged.delivery_bound, judged.retry_policy, judged.hard_timeout) == \
        (stated.delivery_bound, stated.retry_policy, stated.hard_timeout)


def test_a_program_is_held_to_the_lesson_s_bounds_not_its_own() -> None:
    naive = harness.load("fm2")  # no delivery limit, no retry policy, no deadline of its own
    judged = exercise.held(naive, exercise.stated("fm6"))
    assert naive.delivery_bound is None and judged.delivery_bound == 3
    assert naive.retry_policy is None and judged.retry_policy is not None and judged.retry_policy.max_retries == 3
    assert naive.hard_timeout is None and judged.hard_timeout == 1.5 and judged.fetch_hard_timeout() == 1.5
    assert (judged.short, judged.concurrency, judged.queue_names) == (naive.short, naive.concurrency, naive.queue_names)


@pytest.mark.parametrize("lesson", LESSONS)
def test_each_lesson_keeps_two_wrong_answers(lesson: str) -> None:
    assert len(wrong_answers(lesson)) >= 2


@pytest.mark.parametrize("name", list(WRONG_LINES))
def test_a_wrong_answer_is_the_lab_s_fix_with_one_mistake(name: str) -> None:
    lesson = name[:3]
    assert name in {p.stem for p in wrong_answers(lesson)}
    diff = difflib.unified_diff(code_of(lessons.modules()[lesson]), code_of(f"lessons/{lesson}/wrong/{name}"), lineterm="", n=0)
    changed = [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert len(changed) == WRONG_LINES[name], "\n".join(changed)


@pytest.mark.parametrize("name", list(WRONG_LINES))
def test_a_wrong_answer_runs_in_a_namespace_part_of_its_own(name: str) -> None:
    lesson, program = exercise_check.program_at(ROOT / "lessons" / name[:3] / "wrong" / f"{name}.py")
    assert lesson == name[:3] and program.short == name.split("_", 1)[0]
    assert program.module == f"lessons.{lesson}.wrong.{name}"


def test_check_refuses_a_file_that_is_no_exercise(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "my_pipeline.py"
    other.write_text("x = 1\n")
    assert run_all_fms.main(["--check", str(other)]) == 2
    assert "not an exercise's name" in capsys.readouterr().err
    assert run_all_fms.main(["--check", str(tmp_path / "fm3x_missing.py")]) == 2
    assert "no such Python file" in capsys.readouterr().err


def test_a_focus_names_only_what_the_scenario_holds() -> None:
    sc = lessons.scenario(4)
    kept = exercise_check.focused(sc, ["doc2", "duplicate notify"])
    assert kept.docs == ("doc2",) and set(kept.injectors) == {"duplicate notify"} and kept.sides == ()
    with pytest.raises(exercise.ExerciseError, match="doc99"):
        exercise_check.focused(sc, ["doc99"])


def _code(source: str) -> str:
    tree = ast.parse(source)
    first = tree.body[0]
    assert isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
    return "".join(source.splitlines(keepends=True)[first.end_lineno or 0:])
