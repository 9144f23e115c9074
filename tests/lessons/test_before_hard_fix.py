"""Each hard variant is a real file (``lessons/<fm>/before_hard_fix.py``): the FM's program as it stood before
its hard fix. Its code (docstrings left out, as ``--diff`` shows a lesson) differs from the FM file's by the hard
fix alone, a few lines: a change to the FM that is not made to it too (or the other way) fails here. No broker."""

from __future__ import annotations

import difflib

import pytest

import lessons
from lab import harness

from lab.show.diff import code_of

HARD_FIX_LINES = {"fm1": 3, "fm3": 2, "fm4": 10, "fm5": 2, "fm6": 12, "fm7": 2, "fm9": 7}
"""Lines added plus lines removed between each FM's code and its program before the hard fix: fm1 (no
``envelope_revoked``), fm3 (the drain as first written), fm4 (the claim as first written: no resume, a 20 s
busy budget, no idempotency key), fm5 (no ``wait_in``), fm6 (Celery's soft limit, no backstop request, no
deadline on the fetch or on ``notify``), fm7 (no ``count_stored_members``), fm9 (no ``within_consumer_timeout``, no ``cancel_when_lost_in_soft_wait``, no ``fence_redeliveries``)."""


def changed_lines(fm: str) -> list[str]:
    module = lessons.before_hard_fix(fm)
    assert module is not None
    diff = difflib.unified_diff(code_of(lessons.modules()[fm]), code_of(module.replace(".", "/")), lineterm="", n=0)
    return [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]


def test_the_lessons_with_a_hard_variant_are_those_with_a_program_before_the_hard_fix() -> None:
    assert [fm for fm in lessons.FMS if lessons.before_hard_fix(fm) is not None] == list(HARD_FIX_LINES)


@pytest.mark.parametrize("fm", list(HARD_FIX_LINES))
def test_the_program_before_the_hard_fix_differs_from_the_fm_by_the_hard_fix_alone(fm: str) -> None:
    changed = changed_lines(fm)
    assert len(changed) == HARD_FIX_LINES[fm], "\n".join(changed)


@pytest.mark.parametrize("fm", list(HARD_FIX_LINES))
def test_the_program_before_the_hard_fix_runs_in_a_namespace_of_its_own(fm: str) -> None:
    program = harness.load(f"{fm}w")
    assert program.short == f"{fm}w" and program.module == f"lessons.{fm}.before_hard_fix"
    assert all(name.startswith(harness.amqp_name(f"{fm}w", "")) for name in program.queue_names)
    assert harness.code_of(fm, "weak") == f"{fm}w"
