"""The audit on real projects' configuration (tests/audit_corpus): precision and recall against an expert's call.

Each project is audited by the command itself, in a process of its own (``python -m audit TARGET --json``:
shared tasks of one project must not reach another's app). A finding counts as right when its rule is in
the project's ``report`` and it is the first of that rule there and says none of ``not_says``; every other
finding is wrong. Recall: the ``report`` rules found right, over all of them. Both must be at least 90 %.

    .venv/bin/python -m pytest tests/test_audit_corpus.py -q -s    # prints the figures and every miss
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.audit_corpus.expected import CORPUS, Expected

ROOT = Path(__file__).resolve().parent.parent
FLOOR = 0.9


@dataclass(frozen=True)
class Score:
    right: list[str]
    wrong: list[str]
    missed: list[str]


def audit_json(target: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "audit", target, "--json"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode in (0, 1), f"{target}: exit {done.returncode}: {done.stderr.strip()}"
    return json.loads(done.stdout)


def for_version(expected: Expected, celery: str) -> Expected:
    """``expected`` on the installed Celery: ``before_57`` rules are must-report before 5.7, must-not from it."""
    major, minor = (int(x) for x in celery.split(".")[:2])
    if (major, minor) < (5, 7):
        return dataclasses.replace(expected, report={**expected.report, **expected.before_57})
    return dataclasses.replace(expected, not_report={**expected.not_report, **expected.before_57})


def score(name: str, expected: Expected, doc: dict[str, Any]) -> Score:
    expected = for_version(expected, str(doc["celery"]))
    right: list[str] = []
    wrong: list[str] = []
    seen: set[str] = set()
    for f in doc["findings"]:
        rule = str(f["rule"])
        text = f"{f['where']} {f['consequence']}"
        label = f"{name}: {rule} ({f['where']})"
        bad = expected.not_says.get(rule)
        if rule in expected.report and rule not in seen and not (bad and bad in text):
            right.append(label)
            seen.add(rule)
        else:
            why = ("a second finding of the rule" if rule in seen else f"says {bad!r}" if rule in expected.report
                   else expected.not_report.get(rule, "not expected"))
            wrong.append(f"{label}: {why}")
    missed = [f"{name}: {rule}: {why}" for rule, why in expected.report.items() if rule not in seen]
    return Score(right, wrong, missed)


@pytest.fixture(scope="module")
def scores() -> dict[str, Score]:
    return {name: score(name, e, audit_json(e.target)) for name, e in CORPUS.items()}


@pytest.fixture(scope="module")
def expected_total(scores: dict[str, Score]) -> int:
    return sum(len(s.right) + len(s.missed) for s in scores.values())


def test_the_corpus_holds_at_least_eight_projects() -> None:
    assert len(CORPUS) >= 8
    for name in CORPUS:
        assert (ROOT / "tests" / "audit_corpus" / name / "__init__.py").is_file()


def test_precision_and_recall_on_the_corpus(scores: dict[str, Score], expected_total: int) -> None:
    right = sum(len(s.right) for s in scores.values())
    wrong = [w for s in scores.values() for w in s.wrong]
    missed = [m for s in scores.values() for m in s.missed]
    expected = expected_total
    precision = right / (right + len(wrong)) if right + len(wrong) else 1.0
    recall = right / expected
    report = (f"precision {precision:.1%} ({right} right of {right + len(wrong)} findings), "
              f"recall {recall:.1%} ({right} of {expected} expected)")
    print("\n" + report + "".join(f"\n  wrong: {w}" for w in wrong) + "".join(f"\n  missed: {m}" for m in missed))
    assert precision >= FLOOR and recall >= FLOOR, report
