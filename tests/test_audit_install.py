"""The audit installs beside a project's own Celery: ``pip install ./audit`` adds the audit and changes no Celery.

A throwaway venv sees a Celery already installed (the Celery 5.5 environment ``make matrix`` builds, else the
lab's own) through a ``.pth`` line, as a project's environment holds its pinned Celery; pip installs the audit's
distribution (audit/pyproject.toml: ``celery>=5.5,<6``, no pin) and nothing else, and the command runs from the
installed copy against that Celery.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lab import matrix
from lab.matrix import Cell, Version

ROOT = Path(__file__).resolve().parent.parent


def test_pip_install_of_the_audit_keeps_the_projects_celery(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)  # a project's environment, not this test session's (the repository)
    envs = [ROOT / ".lab" / "matrix" / "celery-5.5", Path(sys.prefix)]
    project = next(e for e in envs if list(e.glob("lib/python3*/site-packages/celery/__init__.py")))
    site_of_project = next(project.glob("lib/python3*/site-packages"))
    celery_before = subprocess.run([str(project / "bin" / "python"), "-c", "import celery; print(celery.__version__)"],
                                   capture_output=True, text=True, check=True).stdout.strip()
    source = tmp_path / "src" / "audit"  # a copy: the build leaves nothing in the repository
    shutil.copytree(ROOT / "audit", source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "project-celery.pth").write_text(f"{site_of_project}\n")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                           "--no-input", "--disable-pip-version-check", str(source)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    installed = sorted(p.name for p in site.iterdir() if p.name != "__pycache__")
    assert installed == ["audit", "project-celery.pth", "reliable_celery_audit-0.1.0.dist-info"], installed
    run = subprocess.run([str(venv / "bin" / "python"), "-c", "import audit, celery; print(audit.__file__, "
                          "celery.__version__)"], cwd=tmp_path, capture_output=True, text=True, check=True)
    where, version = run.stdout.split()
    assert Path(where).is_relative_to(site) and version == celery_before
    rules = subprocess.run([str(venv / "bin" / "reliable-celery-audit"), "--rules"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
    assert rules.returncode == 0 and "acks-early" in rules.stdout
    (tmp_path / "proj.py").write_text("from celery import Celery\napp = Celery('proj', broker='redis://x//')\n"
                                      "@app.task\ndef work(): ...\n")
    audited = subprocess.run([str(venv / "bin" / "reliable-celery-audit"), "proj", "--json", "--fail-on", "never"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert audited.returncode == 0, audited.stderr
    assert f'"celery": "{celery_before}"' in audited.stdout and '"proj.work"' in audited.stdout


def test_make_matrix_runs_the_audit_tests_on_each_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Row A1 of make matrix's table: pytest's exit status for the audit's tests, one cell per version."""
    monkeypatch.setattr(matrix, "ENVS_DIR", tmp_path / "envs")
    results = tmp_path / "envs" / "results"
    results.mkdir(parents=True)
    vs = [Version(n, tmp_path / f"celery-{n}.txt") for n in ("5.5", "5.6")]
    for v, code in zip(vs, (0, 1)):
        v.pins.write_text(f"celery=={v.name}.0\n")
        (results / f"celery-{v.name}-lab.json").write_text(json.dumps({"versions": {}, "runs": []}))
        (results / f"celery-{v.name}-claims.json").write_text(json.dumps({"claims": []}))
        (results / f"celery-{v.name}-audit.json").write_text(json.dumps({"exit": code}))
    table, _ = matrix.collect(vs)
    a1 = next(r for r in table if r.label == "A1")
    assert a1.cells["5.5"] == Cell("pass") and a1.cells["5.6"].state == "FAIL"
    assert {"tests/test_audit_corpus.py", "tests/test_audit_rules.py"} <= set(matrix.AUDIT_TESTS)
