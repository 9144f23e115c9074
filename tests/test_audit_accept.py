"""Accepting a finding: ignores with a reason in pyproject.toml, a baseline, --fail-on never; accepted findings
kept in JSON and in SARIF (``suppressions``, SARIF 2.1.0); SARIF paths relative to the repository's root."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from audit.cli import main

ROOT = Path(__file__).resolve().parent.parent


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def pyproject(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "pyproject.toml"
    path.write_text("[tool.reliable-celery-audit]\n" + body)
    return path


def test_fail_on_never_never_fails(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "fm0_naive:app", "--json", "--fail-on", "never")
    assert code == 0 and json.loads(out)["counts"]["high"] >= 1


def test_an_ignored_rule_is_kept_in_json_and_not_counted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = pyproject(tmp_path, '[[tool.reliable-celery-audit.ignore]]\nrule = "acks-early"\n'
                       'reason = "every task is idempotent and reconciled nightly"\n')
    assert run(capsys, "fm0_naive:app", "--json")[0] == 1  # acks-early is high
    code, out, _ = run(capsys, "fm0_naive:app", "--json", "--config", str(config))
    doc: dict[str, Any] = json.loads(out)
    early = next(f for f in doc["findings"] if f["rule"] == "acks-early")
    assert early["suppressed"] == {"kind": "external", "justification": "every task is idempotent and reconciled nightly",
                                   "source": "pyproject.toml ignore"}
    assert code == 0 and doc["counts"]["high"] == 0 and doc["suppressed_count"] == 1  # no-deadline is medium


def test_an_ignore_for_some_tasks_splits_the_finding(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = pyproject(tmp_path, '[[tool.reliable-celery-audit.ignore]]\nrule = "acks-early"\n'
                       'tasks = ["fm0_naive.notify"]\nreason = "notify sends at most one email: losing it is fine"\n')
    code, out, _ = run(capsys, "fm0_naive:app", "--json", "--config", str(config))
    early = [f for f in json.loads(out)["findings"] if f["rule"] == "acks-early"]
    assert [(f["tasks"], f["suppressed"] is None) for f in early if "fm0_naive.notify" in f["tasks"]] == \
        [(["fm0_naive.notify"], False)]
    kept = next(f for f in early if f["suppressed"] is None)
    assert "fm0_naive.notify" not in kept["tasks"] and kept["tasks"] and code == 1


def test_an_ignore_without_a_reason_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = pyproject(tmp_path, '[[tool.reliable-celery-audit.ignore]]\nrule = "acks-early"\n')
    code, out, err = run(capsys, "fm0_naive:app", "--config", str(config))
    assert code == 2 and out == "" and "has no reason" in err and len(err.strip().splitlines()) == 1
    bad = pyproject(tmp_path, '[[tool.reliable-celery-audit.ignore]]\nrule = "no-such-rule"\nreason = "x"\n')
    assert run(capsys, "fm0_naive:app", "--config", str(bad))[0] == 2


def test_a_baseline_accepts_todays_findings_and_fails_on_new_ones(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    baseline = tmp_path / "audit-baseline.json"
    assert run(capsys, "fm0_naive:app", "--write-baseline", str(baseline))[0] == 1  # written, reported as usual
    assert {i["rule"] for i in json.loads(baseline.read_text())["findings"]} == {"acks-early", "no-deadline"}
    code, out, _ = run(capsys, "fm0_naive:app", "--sarif", "--baseline", str(baseline))
    assert code == 0
    results = json.loads(out)["runs"][0]["results"]
    assert results and all(r["baselineState"] == "unchanged" for r in results)
    assert all(r["suppressions"][0]["kind"] == "external" and r["suppressions"][0]["status"] == "accepted"
               and "baseline" in r["suppressions"][0]["justification"] for r in results)
    code, out, _ = run(capsys, "fm2_worker_crash:app", "--sarif", "--baseline", str(baseline))
    assert code == 1 and {r["baselineState"] for r in json.loads(out)["runs"][0]["results"]} == {"new"}
    assert run(capsys, "fm0_naive:app", "--baseline", str(tmp_path / "none.json"))[0] == 2


def test_fail_on_and_baseline_from_pyproject(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = pyproject(tmp_path, 'fail-on = "never"\n')
    assert run(capsys, "fm0_naive:app", "--config", str(config))[0] == 0
    assert run(capsys, "fm0_naive:app", "--config", str(pyproject(tmp_path, 'fail-on = "sometimes"\n')))[0] == 2
    assert run(capsys, "fm0_naive:app", "--config", str(pyproject(tmp_path, 'nonsense = 1\n')))[0] == 2


def test_sarif_paths_are_relative_to_the_repository_root(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Run from a folder of the repository, not its root: the URIs still start at the root (code scanning's base)."""
    assert (ROOT / ".git").exists()
    monkeypatch.chdir(ROOT / "tests")
    code, out, _ = run(capsys, "tests.audit_corpus.taiga", "--sarif")
    assert code == 1
    run_ = json.loads(out)["runs"][0]
    assert run_["originalUriBaseIds"]["SRCROOT"]["uri"] == ROOT.as_uri() + "/"
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run_["results"]}
    assert uris and all(u.startswith("tests/audit_corpus/taiga/") and not os.path.isabs(u) for u in uris)
    assert {r["locations"][0]["physicalLocation"]["artifactLocation"]["uriBaseId"] for r in run_["results"]} == {"SRCROOT"}
