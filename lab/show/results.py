"""A run's results as JSON (``run_all_fms.py --json PATH``), for programs such as ``make matrix``.

One object: ``versions`` (``lab.versions.installed``), ``namespace`` and ``runs``, one
per run in the order they ran, each with its cell (``fm``, ``kind``, ``code``,
``scenario``), its ``verdict``, ``ok``, ``error``, ``skipped`` (why this machine could not
run it, or null), ``seconds`` and its ``checks``
(``label``, ``ok``, ``detail``). Nothing else of the run (no observations): the
timelines and the HTML report are the place for what happened.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lab.records import RunReport
from lab.settings import NAMESPACE
from lab.versions import installed


def as_json(reports: list[RunReport]) -> dict[str, Any]:
    return {
        "versions": installed(),
        "namespace": NAMESPACE,
        "runs": [{"fm": r.fm, "kind": r.kind, "code": r.code, "scenario": r.scenario, "verdict": r.verdict,
                  "ok": r.ok, "error": r.error, "skipped": r.skipped, "seconds": round(r.seconds, 2),
                  "checks": [{"label": c.label, "ok": c.ok, "detail": c.detail} for c in r.checks]}
                 for r in reports],
    }


def write(path: Path, reports: list[RunReport]) -> Path:
    path.write_text(json.dumps(as_json(reports), indent=1) + "\n")
    return path
