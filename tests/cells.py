"""One helper for the case studies' end-to-end tests: a cell run through the harness, which must pass."""

from __future__ import annotations

from lab import harness, records
from lab.records import RunReport


def quiet(_: str) -> None:
    pass


def passing(cell: str, kind: records.Kind) -> RunReport:
    """``harness.run_one(cell, kind)``, asserted to have ended without an error and with every check holding."""
    report = harness.run_one(cell, kind, quiet)
    assert report.error is None, report.error
    assert report.checks and all(c.ok for c in report.checks), [f"{c.label}: {c.detail}" for c in report.checks]
    return report
