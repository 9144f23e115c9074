"""The repository's modules import one another without a circle (DESIGN.md §10): the run records sit
below the harness, the display and the case studies, and a program run by hand goes through
``lab.by_hand``, not through the harness that imports the runner that imports the checks.

Every import counts, one inside a function too; only imports under ``if TYPE_CHECKING:`` do not."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIPPED = {"tests", ".venv", ".lab", "build"}


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).parts
        if any(p in SKIPPED or p.startswith(".") for p in parts[:-1]):
            continue
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        found[name] = path
    return found


def _type_checking_only(tree: ast.AST) -> set[int]:
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return hidden


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The repository modules ``name`` imports (a package's ``__init__`` for ``from pkg import x`` when x is no module)."""

    def own(target: str) -> str | None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        return target or None

    tree = ast.parse(path.read_text(encoding="utf-8"))
    hidden = _type_checking_only(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" for a in node.names] or [base]
        for target in targets:
            if (found := own(target)) is not None and found != name:
                out.add(found)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_of_the_repository_imports_itself_through_others() -> None:
    known = modules()
    graph = {name: imported(name, path, known) for name, path in known.items()}
    assert circles(graph) == []


def test_the_circle_finder_finds_a_circle_it_is_shown() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_run_records_import_nothing_that_runs_a_run() -> None:
    known = modules()
    assert imported("lab.records", known["lab.records"], known) == {"lab.observe", "shared.envelope"}
