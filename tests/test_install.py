"""``make lab``'s install (``pip install -e '.[dev]'``) warns about nothing of the project's own layout.

The packages (``lab``, ``shared``, ``case_studies``) and the FM modules sit at the repository's root;
``pyproject.toml`` says so (``package-dir = {"" = "."}``), and setuptools then makes the editable
install one ``.pth`` line naming the root. Without it, setuptools installs an import finder instead
and warns on every fresh install ("BuildBackendWarning: Editable installation. Please be careful with
folders in your working directory with the same name as your package ...").
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lab.fm import ROOT


def test_an_editable_install_is_one_path_entry_and_warns_about_nothing(tmp_path: Path) -> None:
    venv = tmp_path / "venv"  # a throwaway environment: the project's own .venv is left as it is
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                           "--no-deps", "--no-input", "--disable-pip-version-check", "-e", str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    warned = [line for line in said.splitlines()
              if "BuildBackendWarning" in line or "SetuptoolsWarning" in line or "careful with folders" in line]
    assert warned == [], "\n".join(warned)
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert [p.name for p in site.glob("__editable__*")] == ["__editable__.reliable_celery_lab-0.1.0.pth"]  # no finder
    assert (site / "__editable__.reliable_celery_lab-0.1.0.pth").read_text().split() == [str(ROOT)]
