from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path

import pytest

import run_all_fms
from case_studies.ledger_base import ledger_problem
import lessons
from lab import down, harness, services, workers
from lab.fm import ROOT
from lab.records import HarnessError
from lab.settings import NAMESPACE, mask_url
from tests.namespaces import derived


def test_short_and_full_names_resolve() -> None:
    assert harness.resolve(["fm3", "fm4_duplicated_runs"]) == ["fm3", "fm4"]


def test_every_fm_file_is_found() -> None:
    assert list(lessons.modules()) == [f"fm{i}" for i in range(10)]


def test_unknown_name_exits_2_with_the_valid_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_all_fms.main(["--only", "fm10"]) == 2
    err = capsys.readouterr().err
    assert "unknown FM fm10" in err and "fm3 (fm3_dlq_reconciliation)" in err
    with pytest.raises(HarnessError):
        harness.resolve(["fm3", "nope"])


def test_default_selection_is_fm1_to_fm9() -> None:
    assert run_all_fms.selected(run_all_fms.parse_args([])) == [f"fm{i}" for i in range(1, 10)]


def test_plan_orders_runs() -> None:
    assert harness.plan(["fm1", "fm3"], include_fm0=True, prove=True) == [
        ("fm0", "bug"), ("fm1", "fixed"), ("fm1", "broken"), ("fm1", "weak"), ("fm3", "fixed"), ("fm3", "broken"),
        ("fm3", "weak")]
    assert harness.plan(["fm0"], include_fm0=False, prove=False) == [("fm0", "bug")]


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("amqp://guest:guest@127.0.0.1:5672//", "amqp://guest:***@127.0.0.1:5672//"),
        ("redis://:s3cret@cache:6379/0", "redis://:***@cache:6379/0"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_passwords_are_masked(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_a_user_url_that_does_not_answer_is_an_error_naming_it_masked(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CELERY_BROKER_URL", "amqp://lab:hunter2@127.0.0.1:1//")
    with pytest.raises(services.ServiceError) as info:
        services.ensure(say=lambda _: None)
    assert "amqp://lab:***@127.0.0.1:1//" in str(info.value) and "hunter2" not in str(info.value)
    assert run_all_fms.main(["--only", "fm1"]) == 2
    assert "hunter2" not in capsys.readouterr().err


def test_diff_prints_the_step_plain_in_a_pipe_without_docstrings(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_all_fms.main(["--diff", "fm4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("== fm4: fm3_dlq_reconciliation.py -> fm4_duplicated_runs.py")
    assert "+from shared.claim import ClaimBusy, NotifyClaim, busy_waits, release_when_dead_lettered\n" in out and "-    send_email(pipeline_id, summary)\n" in out
    assert "\x1b[" not in out  # no colour codes in a pipe
    assert "Symptom" not in out and "FM-4: a duplicated" not in out  # docstrings left out


def test_diff_without_a_name_prints_every_step_and_a_bad_name_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_all_fms.main(["--diff"]) == 0
    heads = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("== ")]
    assert heads == [f"== fm{i}" for i in range(1, 10)]
    assert run_all_fms.main(["--diff", "fm10"]) == 2
    assert "unknown FM fm10" in capsys.readouterr().err


# ---- promises kept before anything runs: output paths, the ledger ---------------------------


def _must_not_run(*_: object, **__: object) -> None:
    raise AssertionError("services.ensure ran: the check came after the run had begun")


@pytest.mark.parametrize("option", ["--report", "--json"])
def test_an_output_path_that_cannot_be_opened_is_refused_before_anything_runs(
        option: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """/proc exists and, to root, every permission bit says yes; only opening the file says no."""
    monkeypatch.setattr(services, "ensure", _must_not_run)
    assert run_all_fms.main(["--only", "fm1", option, "/proc/rcl-out"]) == 2
    err = capsys.readouterr().err
    assert f"error: {option} /proc/rcl-out: cannot write there (No such file or directory)" in err
    assert not Path("/proc/rcl-out").exists()


def test_checking_an_output_path_leaves_no_file_behind_and_an_existing_one_as_it_was(tmp_path: Path) -> None:
    new, old = tmp_path / "report.html", tmp_path / "results.json"
    old.write_text("the last run's")
    run_all_fms.check_output(new, "--report")
    run_all_fms.check_output(old, "--json")
    assert not new.exists() and old.read_text() == "the last run's"


def test_report_and_json_without_a_path_go_under_the_namespaces_lab_folder() -> None:
    args = run_all_fms.parse_args(["--report", "--json", "--only", "fm1"])
    assert args.report == ROOT / ".lab" / NAMESPACE / "report.html"
    assert args.json == ROOT / ".lab" / NAMESPACE / "results.json" and args.only == ["fm1"]
    assert run_all_fms.parse_args(["--report", "mine.html"]).report == Path("mine.html")


def test_force_goes_with_down_only(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run_all_fms.parse_args(["--force"])
    assert info.value.code == 2 and "--force goes with --down" in capsys.readouterr().err


def test_a_ledger_url_that_does_not_answer_exits_2_before_anything_runs(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RCL_LEDGER_URL", "postgresql://lab:s3cret@127.0.0.1:1/claims")
    monkeypatch.setattr(services, "ensure", _must_not_run)
    started = time.monotonic()
    assert run_all_fms.main(["--only", "fm1", "severity_batch"]) == 2
    err = capsys.readouterr().err
    assert "error: RCL_LEDGER_URL=postgresql://lab:***@127.0.0.1:1/claims does not answer: " in err
    assert f"unset RCL_LEDGER_URL for SQLite under .lab/{NAMESPACE}/" in err and "s3cret" not in err
    assert time.monotonic() - started < 10


def test_the_ledger_url_is_asked_only_when_a_case_study_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RCL_LEDGER_URL", "postgresql://lab:s3cret@127.0.0.1:1/claims")
    run_all_fms.check_ledger(["fm1", "fm3"])  # the FMs keep no ledger: nothing to ask
    with pytest.raises(HarnessError, match="does not answer"):
        run_all_fms.check_ledger(["fm1", "cte_ingestion"])


def test_a_ledger_url_of_another_database_or_none_that_parses_is_named(tmp_path: Path) -> None:
    assert ledger_problem("mysql://lab:s3cret@db/claims") == (
        "RCL_LEDGER_URL=mysql://lab:***@db/claims: the ledgers run on SQLite or PostgreSQL, not mysql; give a "
        f"postgresql:// URL, or unset RCL_LEDGER_URL for SQLite under .lab/{NAMESPACE}/")
    assert (ledger_problem("no url") or "").startswith("RCL_LEDGER_URL=no url is not a database URL")
    assert "its driver cannot be loaded (No module named 'psycopg2')" in (ledger_problem("postgresql+psycopg2://a@h/d") or "")
    assert ledger_problem(f"sqlite:///{tmp_path / 'ledger.sqlite'}") is None
    assert ledger_problem("") is None  # unset: the SQLite files under .lab/


# ---- --down -------------------------------------------------------------------------------


@contextmanager
def holding(lock: Path) -> Generator[None]:
    """This process holds ``lock`` as a run holds its namespace's (``lab.workers.NamespaceLock``)."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        os.ftruncate(fd, 0)
        os.close(fd)


@pytest.fixture
def no_lab_services(monkeypatch: pytest.MonkeyPatch) -> None:
    """--down must not stop services the lab may have started for this very session."""
    monkeypatch.setattr(services, "started_by_lab", list[str])
    monkeypatch.setattr(services, "stop_started", _must_not_run)


@pytest.mark.usefixtures("no_lab_services")
def test_down_with_nothing_to_stop_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_all_fms.main(["--down"]) == 0
    assert capsys.readouterr().out == (f"nothing to stop in namespace {NAMESPACE}: no worker of the lab runs there, "
                                       "and the lab started no service\n")


@pytest.mark.usefixtures("no_lab_services")
def test_down_refuses_while_a_run_holds_the_namespace() -> None:
    said: list[str] = []
    with holding(workers.STATE_DIR / "lock"):
        assert down.down(say=said.append) == 2
    assert said == [f"a run (pid {os.getpid()}) is live in namespace {NAMESPACE}: not stopped; --down --force stops it"]
    assert NAMESPACE not in [r.namespace for r in down.live_runs()]  # let go: no longer live


def test_down_keeps_the_labs_services_while_another_namespace_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(services, "started_by_lab", lambda: ["redis-server"])
    monkeypatch.setattr(services, "stop_started", _must_not_run)
    other = derived("other-run")
    said: list[str] = []
    with holding(ROOT / ".lab" / other / "lock"):
        assert down.down(say=said.append) == 0
    assert said == [f"the lab's redis-server stay: a run (pid {os.getpid()}) is live in namespace {other} and uses "
                    "them; --down --force stops them too"]


_STUBBORN = """
import fcntl, os, signal, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.write(fd, str(os.getpid()).encode())
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a run that does not answer SIGTERM
print("held", flush=True)
sys.stdin.read()  # until the test closes its stdin
"""


@pytest.mark.usefixtures("no_lab_services")
def test_down_force_on_a_run_that_ignores_sigterm_says_so_and_stops_the_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(down, "RUN_STOP_SECONDS", 1.0)
    lock = workers.STATE_DIR / "lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    stubborn = subprocess.Popen([sys.executable, "-c", _STUBBORN, str(lock)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == "held\n"
        said: list[str] = []
        assert down.down(force=True, say=said.append) == 0
        assert said == [f"the live run (pid {stubborn.pid}) in namespace {NAMESPACE} did not end within 1s of SIGTERM: "
                        "its workers are stopped instead"]
        assert stubborn.poll() is None  # SIGTERM was all it got
    finally:
        stubborn.kill()
        stubborn.wait()
