"""The lab's code must import on Celery 5.5 and 5.6, whose classes are not generic at run time.

``Task[Any, Any]`` and ``AsyncResult[Any]`` exist for the type checker (celery-types, and
Celery 5.7's own classes); on 5.5.3 and 5.6.3 evaluating one raises ``TypeError: type 'Task'
is not subscriptable``. Annotations are never evaluated (every module has ``from __future__
import annotations``), but an alias and ``cast``'s first argument are: those must be quoted.
``make matrix`` proves the imports on each version; this test finds a regression without it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from lab.fm import ROOT
from lab.versions import CELERY, installed

GENERICS = {"Task", "AsyncResult", "GroupResult", "ResultBase", "Signature", "EagerResult", "Celery"}
SOURCES = ["shared", "lab", "case_studies", "tests", "bench"]


def _files() -> Iterator[Path]:
    yield from sorted(ROOT.glob("fm*.py"))
    yield ROOT / "run_all_fms.py"
    for folder in SOURCES:
        yield from sorted((ROOT / folder).rglob("*.py"))


def _subscripts_generic(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id in GENERICS
               for n in ast.walk(node))


def _evaluated_at_run_time(tree: ast.Module) -> Iterator[ast.expr]:
    """Expressions Python evaluates when the module runs that may hold a type: module-level
    assignments (aliases), and ``cast``'s first argument."""
    for stmt in tree.body:
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            yield stmt.value
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "cast" and node.args:
            yield node.args[0]


def test_no_subscripted_celery_generic_is_evaluated_at_run_time() -> None:
    found: list[str] = []
    for path in _files():
        tree = ast.parse(path.read_text(), str(path))
        for expr in _evaluated_at_run_time(tree):
            if _subscripts_generic(expr):
                found.append(f"{path.relative_to(ROOT)}:{getattr(expr, 'lineno', '?')}")
    assert found == [], f"quote these (Celery 5.5/5.6 cannot subscript them at run time): {found}"


def test_every_module_postpones_its_annotations() -> None:
    missing = [str(p.relative_to(ROOT)) for p in _files()
               if p.name != "__init__.py" and "from __future__ import annotations" not in p.read_text()]
    assert missing == []


def test_the_running_versions_are_known() -> None:
    found = installed()
    assert found["celery"].startswith(f"{CELERY[0]}.{CELERY[1]}.")
    assert set(found) == {"celery", "kombu", "redis", "billiard", "amqp"}
