"""``make matrix`` (``lab.matrix``): its pins and the table it builds, without running anything."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from lab import matrix
from lab.fm import ROOT
from lab.matrix import Cell, Version


def test_the_pins_cover_celery_5_5_5_6_and_5_7_each_with_its_kombu_and_redis() -> None:
    vs = matrix.versions()
    assert [v.name for v in vs] == ["5.5", "5.6", "5.7"]
    for v in vs:
        text = v.pins.read_text()
        assert v.celery.startswith(f"{v.name}.")
        assert (matrix.pinned(text, "kombu") or "").startswith(f"{v.name}.")  # Celery X.Y runs on kombu X.Y
        assert matrix.pinned(text, "redis") is not None and matrix.pinned(text, "pytest") is not None
        unpinned = [line for line in text.splitlines() if line.strip() and not line.startswith("#") and "==" not in line]
        assert unpinned == [], f"{v.pins.name}: every package pinned"


def test_the_5_7_pins_are_the_default_environments() -> None:
    """The pinned default (pyproject.toml) and matrix/celery-5.7.txt must not drift apart."""
    deps: list[str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    wanted = {re.sub(r"\[.*\]", "", d.split("==")[0]): d.split("==")[1] for d in deps}
    pins = next(v for v in matrix.versions() if v.name == "5.7").pins.read_text()
    assert {name: matrix.pinned(pins, name) for name in wanted} == wanted


def test_pinned_reads_a_requirements_line_whatever_its_spelling() -> None:
    text = "# a comment\nSQLAlchemy==2.1.9\ntyping_extensions==4.16.0  # why\ncelery==5.5.3\n"
    assert matrix.pinned(text, "sqlalchemy") == "2.1.9"
    assert matrix.pinned(text, "typing-extensions") == "4.16.0"
    assert matrix.pinned(text, "kombu") is None


def test_an_environment_whose_pins_are_unchanged_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matrix, "ENVS_DIR", tmp_path / "envs")
    pins = tmp_path / "celery-5.5.txt"
    pins.write_text("celery==5.5.3\n")
    v = Version("5.5", pins)
    v.python.parent.mkdir(parents=True)
    v.python.write_text("")
    (v.env / matrix.STAMP).write_text(matrix.stamp_of(pins.read_text()) + "\n")
    assert matrix.ensure_env(v, say=lambda _: None) is False  # nothing built, nothing run
    assert matrix.stamp_of("celery==5.5.2\n") != matrix.stamp_of(pins.read_text())  # new pins: rebuilt


def _run(fm: str, kind: str, checks: list[tuple[str, bool, str]], error: str | None = None) -> dict[str, Any]:
    return {"fm": fm, "kind": kind, "error": error, "checks": [{"label": lab, "ok": ok, "detail": d} for lab, ok, d in checks]}


def test_a_guarantee_passes_only_where_every_fm_that_checks_it_holds() -> None:
    data = {"runs": [
        _run("fm1", "fixed", [("G1", True, "")]),
        _run("fm2", "fixed", [("G1", False, "chord notify finished 0x"), ("G2", True, "")]),
        _run("fm2", "broken", [("S2", True, "")]),
    ]}
    cells = matrix.lab_cells(data)
    assert cells["G1"] == Cell("FAIL", "fm2 fixed: chord notify finished 0x")
    assert cells["G2"] == Cell("pass") and cells["S2"] == Cell("pass")


def test_a_run_that_ended_in_error_fails_the_checks_it_would_have_made() -> None:
    cells = matrix.lab_cells({"runs": [_run("fm3", "fixed", [], "the worker exited (-9)\nlog tail"),
                                        _run("fm5", "weak", [], "deadline")]})
    assert set(cells) == {"G1", "G2", "G3", "S5 hard"}
    assert cells["G3"] == Cell("FAIL", "fm3 fixed: ERROR: the worker exited (-9)")


def test_a_claims_outcome_is_pass_fail_or_not_applicable() -> None:
    data = {"claims": [
        {"label": "C1", "title": "holds", "outcome": "passed", "limit": None, "message": ""},
        {"label": "C2", "title": "5.7 only", "outcome": "passed", "limit": "5.5: ZADD", "message": ""},
        {"label": "C3", "title": "no such setting", "outcome": "skipped", "limit": None, "message": "new in 5.7"},
        {"label": "C4", "title": "broke", "outcome": "failed", "limit": None, "message": "assert 220 == 4"},
    ]}
    cells, titles = matrix.claim_cells(data)
    assert cells == {"C1": Cell("pass"), "C2": Cell("fail", "5.5: ZADD"), "C3": Cell("n/a", "new in 5.7"),
                     "C4": Cell("FAIL", "failed: assert 220 == 4")}
    assert titles["C2"] == "5.7 only"
    assert matrix.failed(matrix.rows({"5.7": cells}, titles))
    assert not matrix.failed(matrix.rows({"5.7": {k: c for k, c in cells.items() if k != "C4"}}, titles))


def test_rows_come_in_table_order_and_a_check_one_version_lacks_is_a_fail_there() -> None:
    columns = {"5.5": {"C2": Cell("pass"), "G2": Cell("pass"), "S3 hard": Cell("pass")},
               "5.7": {"C2": Cell("pass"), "G2": Cell("pass"), "S3 hard": Cell("pass"), "SB6 write-up": Cell("pass"),
                       "SB1": Cell("pass"), "S3": Cell("pass"), "G10": Cell("pass"), "C10": Cell("pass")}}
    table = matrix.rows(columns, {})
    assert [r.label for r in table] == ["G2", "G10", "S3", "S3 hard", "SB1", "SB6 write-up", "C2", "C10"]
    assert table[0].title == matrix.TITLES["G2"]
    assert table[2].cells["5.5"] == Cell("FAIL", "not reported: the run stopped before it")


def test_the_table_numbers_each_reason_once_under_the_grid() -> None:
    columns = {"5.5": {"G1": Cell("pass"), "C5": Cell("n/a", "no such setting"), "C11": Cell("fail", "ZADD")},
               "5.6": {"G1": Cell("pass"), "C5": Cell("n/a", "no such setting"), "C11": Cell("fail", "ZADD")},
               "5.7": {"G1": Cell("pass"), "C5": Cell("pass"), "C11": Cell("pass")}}
    text = matrix.render(matrix.rows(columns, {"C5": "retry on worker lost", "C11": "counted once"}),
                         {"5.5": "celery 5.5.3", "5.6": "celery 5.6.3", "5.7": "celery 5.7.0"})
    lines = text.splitlines()
    assert lines[0].split() == ["check", "celery", "5.5.3", "celery", "5.6.3", "celery", "5.7.0"]
    assert lines[2].split() == ["C5", "retry", "on", "worker", "lost", "n/a", "[1]", "n/a", "[1]", "pass"]
    assert lines[3].split()[-5:] == ["fail", "[2]", "fail", "[2]", "pass"]
    assert lines[-2:] == ["[1] no such setting", "[2] ZADD"]


def test_an_unknown_version_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert matrix.main(["--only", "4.4"]) == 2
    assert "no pins for 4.4" in capsys.readouterr().err



def _write_results(envs: Path, version: str, runs: list[dict[str, Any]], celery: str,
                   claims_empty: bool = False) -> None:
    results = envs / "results"
    results.mkdir(parents=True, exist_ok=True)
    (results / f"celery-{version}-lab.json").write_text(json.dumps({"versions": {"celery": celery}, "runs": runs}))
    claims = [] if claims_empty else [{"label": "C1", "title": "a claim", "test": "t", "outcome": "passed", "limit": None,
                                       "message": ""}]
    (results / f"celery-{version}-claims.json").write_text(json.dumps({"claims": claims}))


def test_an_error_in_one_version_fails_its_cells_there_and_leaves_the_other_versions_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As make matrix saw it: case study 3's burst ERROR on 5.5 marked 5.6's and 5.7's cells
    'FAIL [1] not reported' although both had passed."""
    monkeypatch.setattr(matrix, "ENVS_DIR", tmp_path / "envs")
    burst_ok = [("CT1", True, ""), ("CT2", True, ""), ("CT4", True, "")]
    passed = [_run("fm1", "fixed", [("G1", True, "")]), _run("cte_ingestion/burst", "fixed", burst_ok),
              _run("cte_ingestion/dry_run", "fixed", [("CT5", True, "")])]
    errored = [passed[0], _run("cte_ingestion/burst", "fixed", [], "unpack_from requires a buffer of at least 4 bytes\ntail"),
               passed[2]]
    _write_results(tmp_path / "envs", "5.5", errored, "5.5.3")
    _write_results(tmp_path / "envs", "5.6", passed, "5.6.3")
    _write_results(tmp_path / "envs", "5.7", passed, "5.7.0")
    vs = [Version(n, tmp_path / f"celery-{n}.txt") for n in ("5.5", "5.6", "5.7")]
    for v in vs:
        v.pins.write_text(f"celery=={v.name}.0\n")
    table, headers = matrix.collect(vs)
    assert headers == {"5.5": "celery 5.5.3", "5.6": "celery 5.6.3", "5.7": "celery 5.7.0"}
    cells = {r.label: r.cells for r in table}
    assert list(cells) == ["G1", "CT1", "CT2", "CT4", "CT5", "C1"]  # no row for the cell's own name
    error = Cell("FAIL", "cte_ingestion/burst fixed: ERROR: unpack_from requires a buffer of at least 4 bytes")
    for label in ("CT1", "CT2", "CT4"):
        assert cells[label] == {"5.5": error, "5.6": Cell("pass"), "5.7": Cell("pass")}
    assert cells["G1"] == cells["CT5"] == {v: Cell("pass") for v in ("5.5", "5.6", "5.7")}


def test_an_error_no_version_can_explain_keeps_the_cells_name() -> None:
    cells = matrix.lab_cells({"runs": [_run("bl_ingestion/replay", "broken", [], "deadline")]}, known={})
    assert cells == {"bl_ingestion/replay (broken)": Cell("FAIL", "bl_ingestion/replay broken: ERROR: deadline")}


def test_table_only_before_any_run_says_there_are_no_results_and_how_to_make_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(matrix, "ENVS_DIR", tmp_path / "envs")
    monkeypatch.setattr(matrix, "TABLE_FILE", tmp_path / "envs" / "table.txt")
    assert matrix.main(["--table-only"]) == 2
    said = capsys.readouterr()
    assert said.out == "" and said.err.startswith("no matrix results yet (none under ")
    assert "make matrix, or python -m lab.matrix, runs the lab on each version and makes them" in said.err
    assert not (tmp_path / "envs" / "table.txt").exists()
    _write_results(tmp_path / "envs", "5.6", [_run("fm1", "fixed", [("G1", True, "")])], "5.6.3")
    assert matrix.main(["--table-only"]) == 0  # one version run: its table, the others named as not run
    out = capsys.readouterr().out
    assert out.startswith("celery 5.5: no results yet (python -m lab.matrix --only 5.5 makes them): left out\n"
                          "celery 5.7: no results yet (python -m lab.matrix --only 5.7 makes them): left out\n")
    grid = out.split("\n\n")[1].splitlines()  # after the two lines and the blank one
    assert grid[0].split() == ["check", "celery", "5.6.3"] and grid[1].split()[0] == "G1" and grid[1].split()[-1] == "pass"


def test_only_the_claims_run_writes_the_claims_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """make matrix saw it: the audit's pytest run, started with the claims' RCL_CLAIMS_JSON, wrote an empty list over
    the claims' results, and every claim row left the table without a FAIL."""
    monkeypatch.setattr(matrix, "ENVS_DIR", tmp_path / "envs")
    v = Version("5.7", tmp_path / "celery-5.7.txt")
    out = matrix.outputs(v)
    ran = {what: env for what, _, _, env in matrix.steps(v, out, {"RCL_NAMESPACE": "x"})}
    assert list(ran) == ["lab", "claims", "audit"]
    assert [what for what, env in ran.items() if "RCL_CLAIMS_JSON" in env] == ["claims"]
    assert ran["claims"]["RCL_CLAIMS_JSON"] == str(out.claims)


def test_the_lab_steps_run_one_at_a_time_and_the_pytest_steps_beside_them_from_the_last_version_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matrix, "ENVS_DIR", tmp_path / "envs")
    vs = [Version(name, tmp_path / f"celery-{name}.txt") for name in ("5.5", "5.6", "5.7")]
    lab, tests = matrix.lanes(vs)
    assert [(v.name, what) for v, what, *_ in lab] == [("5.5", "lab"), ("5.6", "lab"), ("5.7", "lab")]
    assert [(v.name, what) for v, what, *_ in tests] == [("5.7", "claims"), ("5.7", "audit"), ("5.6", "claims"),
                                                         ("5.6", "audit"), ("5.5", "claims"), ("5.5", "audit")]
    assert len({log for *_, log, _ in lab + tests}) == 9  # each step writes a log of its own


def test_a_claims_run_that_reported_no_claim_fails_its_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(matrix, "ENVS_DIR", tmp_path / "envs")
    _write_results(tmp_path / "envs", "5.7", [_run("fm1", "fixed", [("G1", True, "")])], "5.7.0", claims_empty=True)
    v = Version("5.7", tmp_path / "celery-5.7.txt")
    v.pins.write_text("celery==5.7.0\n")
    table, _ = matrix.collect([v])
    cells = {r.label: r.cells["5.7"] for r in table}
    assert cells["claims"].state == "FAIL" and cells["G1"] == Cell("pass")
    assert matrix.failed(table)
