"""A module over 500 lines says in its docstring why it is one piece (issue 37): a sentence that starts with
``One piece:``. A long module that cannot say so is two."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 500


def long_modules() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    paths = [ROOT / name for name in listed.split()]
    return [p for p in paths if p.exists() and len(p.read_text(encoding="utf-8").splitlines()) > LIMIT]


def test_every_module_over_500_lines_says_why_it_is_one_piece() -> None:
    unsaid = [str(p.relative_to(ROOT)) for p in long_modules()
              if "One piece:" not in (ast.get_docstring(ast.parse(p.read_text(encoding="utf-8"))) or "")]
    assert unsaid == []


def test_the_size_test_sees_the_long_modules() -> None:
    assert ROOT / "lab" / "show" / "swimlanes.py" in long_modules()
