"""Exercises (DESIGN.md §11): the attendee writes a lesson's fix, the lab checks it under the lesson's faults.

- ``hand_out(lesson, folder)`` writes the attendee's starting file: the program of the lesson before, renamed
  ``<lesson>x_<name>.py`` (so its queues, exchanges and Redis keys sit in a namespace part of their own, apart
  from the lab's program of the same lesson: ``lab.app.short_name``), its docstring replaced by the lesson's task
  (``Task`` in ``lessons/<lesson>/exercise.py``), its code unchanged.
- what a check needs of a lesson: the bounds its guarantee needs (deliveries, retries, deadlines) as the lesson
  states them (``Stated``; ``held`` holds a program to them instead of its own), and the symptoms that give a
  wrong answer its verdict before its chord ends (``Task.early``); the check itself is ``lab.exercise_check``.
- ``hint(lesson, step)``: where to look, which setting or primitive, then the diff to the lab's fix.

No lesson is named here: what a lesson says lives in its folder.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import lessons
from lab.fm import ROOT, Fm
from lab.lesson import Stop
from lab.observe import Reader
from lab.runner import StopCondition
from lab.show import diff
from shared.retry import RetryPolicy

DEFAULT_FOLDER = ROOT / "exercises"
"""Where ``--exercise`` writes when no folder is given (git ignores it)."""
EXERCISE_MARK = "x"
"""The exercise's namespace part: the lesson's name and this (the lab's own program keeps the lesson's name)."""
WORDS_LIMIT = 400
"""An exercise's docstring, like an FM file's, stays under this many words."""


@dataclass(frozen=True)
class Stated:
    """The bounds a lesson's guarantee needs, as the lesson states them (None: it states none)."""

    delivery_bound: int | None = None  # deliveries before the broker dead-letters a message
    retry_policy: RetryPolicy | None = None  # how many retries, with which delays
    hard_timeout: float | None = None  # the chord member's deadline, in seconds
    fetch_hard_timeout: float | None = None  # the chain head's deadline, in seconds

    def over(self, earlier: Stated) -> Stated:
        """These bounds, and the earlier lessons' where this one states none."""
        return Stated(**{f.name: getattr(self, f.name) if getattr(self, f.name) is not None else getattr(earlier, f.name)
                         for f in dataclasses.fields(self)})


EarlyFor = Callable[[Stated], Sequence[Stop]]
"""``stated bounds -> symptoms a wrong answer shows before its chord ends`` (each holds in no run that passes)."""


@dataclass(frozen=True)
class Task:
    """A lesson's exercise (``lessons/<lesson>/exercise.py``, ``EXERCISE``)."""

    symptom: str  # what the attendee sees on the starting file, in words
    must_hold: tuple[str, ...]  # the lesson's guarantee in words, with the numbers it needs
    hints: tuple[str, str]  # where to look; which Celery setting or shared/ primitive (the third is the diff)
    stated: Stated = Stated()
    early: EarlyFor = lambda _: ()
    needs: tuple[str, ...] = ()  # services of the lab's own its scenario starts ("redis-server", "rabbitmq-server")


@dataclass(frozen=True)
class Held(Fm):
    """The program under check, held to the bounds the lesson states instead of its own."""

    stated: Stated = Stated()

    @property
    def bounds_stated(self) -> bool:
        return True

    @property
    def delivery_bound(self) -> int | None:
        return self.stated.delivery_bound

    @property
    def retry_policy(self) -> RetryPolicy | None:
        return self.stated.retry_policy

    @property
    def hard_timeout(self) -> float | None:
        return self.stated.hard_timeout

    def fetch_hard_timeout(self) -> float | None:
        return self.stated.fetch_hard_timeout


class ExerciseError(Exception):
    """Bad input to ``--exercise``, ``--check`` or ``--hint`` (exit 2), said in words."""


# ---- what a lesson says -------------------------------------------------------------------------------------


def lesson_names() -> tuple[str, ...]:
    return tuple(n for n in lessons.FMS if (lessons.HERE / n / "exercise.py").exists())


def task_of(lesson: str) -> Task:
    if lesson not in lesson_names():
        raise ExerciseError(f"no exercise {lesson!r}; there are: {', '.join(lesson_names())}")
    return cast(Task, importlib.import_module(f"lessons.{lesson}.exercise").EXERCISE)


def stated(lesson: str) -> Stated:
    """The bounds of ``lesson``'s guarantee and of every earlier one."""
    found = Stated()
    for name in lessons.FMS[:lessons.FMS.index(lesson) + 1]:
        if name in lesson_names():
            found = task_of(name).stated.over(found)
    return found


def needs(lesson: str) -> tuple[str, ...]:
    """The lab's own services the lesson's scenario starts (its own and the earlier lessons'), each once."""
    return tuple(dict.fromkeys(n for name in lessons.FMS[:lessons.FMS.index(lesson) + 1] if name in lesson_names()
                               for n in task_of(name).needs))


def held(program: Fm, bounds: Stated) -> Held:
    values = {f.name: getattr(program, f.name) for f in dataclasses.fields(Fm)}
    return cast(Any, Held)(**values, stated=bounds)


SYMPTOM_SEEN = "a symptom the lesson names"
"""How a run stopped by one of the lessons' ``early`` conditions says so, until the check names which."""


def early(lesson: str, bounds: Stated) -> tuple[tuple[str, StopCondition] | None, list[str]]:
    """A stop for the first symptom, of this lesson or an earlier one, a run shows before its chord ends, and the
    list that will hold its words once one held."""
    stops = [s for name in lessons.FMS[:lessons.FMS.index(lesson) + 1] if name in lesson_names()
             for s in task_of(name).early(bounds)]
    seen: list[str] = []

    def any_symptom(r: Reader) -> bool:
        for words, holds in stops:
            if holds(r):
                seen.append(words)
                return True
        return False

    return ((SYMPTOM_SEEN, any_symptom) if stops else None), seen


def title_of(module: str) -> str:
    """The first line of a program's docstring (its lesson in one line)."""
    doc = ast.get_docstring(ast.parse((ROOT / f"{module}.py").read_text())) or ""
    return doc.splitlines()[0] if doc else module


def number_of(lesson: str) -> int:
    return lessons.FMS.index(lesson) + 1


def previous_module(lesson: str) -> str:
    """The program the exercise starts from: the lesson before's (the naive program before the first lesson)."""
    n = lessons.FMS.index(lesson)
    modules = lessons.modules()
    return modules[lessons.FMS[n - 1]] if n else min(modules.values())


# ---- handing out ---------------------------------------------------------------------------------------------


def exercise_name(lesson: str) -> str:
    """``<lesson>x_<the lab's program's name>``: its own namespace part, the lesson's name in it."""
    return f"{lesson}{EXERCISE_MARK}_{lessons.modules()[lesson].split('_', 1)[1]}"


def task_text(lesson: str, path: str) -> str:
    task, before = task_of(lesson), previous_module(lesson)
    n = number_of(lesson)
    earlier = "" if n == 1 else f" and the guarantees of lessons 1 to {n - 1}, which this program holds already"
    lines = [
        f"Exercise {title_of(lessons.modules()[lesson])}",
        "",
        f"This is {before}.py, the lab's program of the lesson before, renamed: it holds "
        f"{'no fix yet' if n == 1 else 'every fix so far'}.",
        "Change its code so that it holds this lesson's guarantee too.",
        "",
        "What you will see if you check it as it is:",
        "",
        *[f"    {line}" for line in _wrapped(task.symptom)],
        "",
        *_wrapped(f"What must hold (the check runs the lesson's documents and faults on this program; it judges what "
                  f"happens, not your code){earlier}:"),
        "",
        *[line for item in task.must_hold for line in _wrapped(item, first="- ", rest="  ")],
        "",
        "Next:",
        "",
        f"    .venv/bin/python run_all_fms.py --check {path}",
        f"    .venv/bin/python run_all_fms.py --hint {lesson} 1      (2, then 3: the lab's own fix)",
    ]
    return "\n".join(lines)


def _wrapped(text: str, width: int = 100, first: str = "", rest: str = "") -> list[str]:
    out: list[str] = []
    line = first
    for word in text.split():
        if len(line) + len(word) + 1 > width and line.strip():
            out.append(line.rstrip())
            line = rest
        line += word + " "
    if line.strip():
        out.append(line.rstrip())
    return out


def hand_out(lesson: str, folder: Path = DEFAULT_FOLDER, force: bool = False) -> Path:
    """Write ``lesson``'s starting file into ``folder``; refuse to overwrite one unless ``force``."""
    task_of(lesson)
    folder = folder.resolve()
    if folder == ROOT or folder in (ROOT / "lab", ROOT / "lessons", ROOT / "shared"):
        raise ExerciseError(f"{folder} holds the lab's own code: give a folder of your own (default: {DEFAULT_FOLDER})")
    target = folder / f"{exercise_name(lesson)}.py"
    if target.exists() and not force:
        raise ExerciseError(f"{target} exists (your work?): not overwritten; move it, or add --force to replace it")
    source = (ROOT / f"{previous_module(lesson)}.py").read_text()
    folder.mkdir(parents=True, exist_ok=True)
    target.write_text(replace_docstring(source, task_text(lesson, shown(target))))
    return target


def shown(path: Path) -> str:
    """``path`` as typed from the repository's folder (relative when it is inside it)."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def replace_docstring(source: str, text: str) -> str:
    """``source`` with its module docstring replaced by ``text`` (its code unchanged)."""
    tree = ast.parse(source)
    first = tree.body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)):
        raise ExerciseError("the program has no docstring to replace")
    lines = source.splitlines(keepends=True)
    start, end = first.lineno - 1, first.end_lineno or first.lineno
    return "".join([*lines[:start], f'"""{text}\n"""\n', *lines[end:]])


# ---- hints ---------------------------------------------------------------------------------------------------


def hint(lesson: str, step: int) -> str:
    task = task_of(lesson)
    if step not in (1, 2, 3):
        raise ExerciseError(f"hints are 1 (where to look), 2 (which setting or primitive) and 3 (the lab's fix), not {step}")
    if step < 3:
        head = ("where to look", "which setting or primitive")[step - 1]
        return (f"hint {step} of 3 for {lesson} ({head}):\n\n" + "\n".join(_wrapped(task.hints[step - 1]))
                + f"\n\nnext: .venv/bin/python run_all_fms.py --hint {lesson} {step + 1}")
    found = diff.step(lesson)
    body = found.text if found is not None else "(no diff)"
    return (f"hint 3 of 3 for {lesson}: the lab's fix, the change from {previous_module(lesson)}.py to "
            f"{lessons.modules()[lesson]}.py (docstrings left out):\n\n{body}")


# ---- the command line (``run_all_fms.py --exercise / --hint / --check``) ----------------------------------------


def exercise_command(lesson: str, folder: Path | None, force: bool) -> int:
    try:
        target = folder / f"{exercise_name(lesson)}.py" if folder is not None else None
        replaced = force and target is not None and target.exists()
        path = hand_out(lesson, folder or DEFAULT_FOLDER, force)
    except ExerciseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    typed = shown(path)
    print(f"{'replaced' if replaced else 'wrote'} {typed}: {previous_module(lesson)}.py renamed for {lesson}, its "
          "docstring now your task, its code unchanged. Next:")
    print(f"  1. read the task and write the fix:  $EDITOR {typed}")
    print(f"  2. check it under the lesson's faults:  .venv/bin/python run_all_fms.py --check {typed}")
    print(f"  (stuck? .venv/bin/python run_all_fms.py --hint {lesson} 1)")
    return 0


def hint_command(lesson: str, step: int) -> int:
    try:
        print(hint(lesson, step))
    except ExerciseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
