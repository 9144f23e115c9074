"""The audit's first users: the lab's own FM files and case studies; then the command itself.

No broker is needed: the audit opens no connection (the last tests prove it, on every app of the lab).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from audit.cli import main
from audit.facts import AppFacts, collect, load_app
from audit.output import mask
from audit.rules import RULES, Finding, Options, run_rules

ROOT = Path(__file__).resolve().parent.parent
FMS = ["fm0_naive", "fm1_mid_pipeline_error", "fm2_worker_crash", "fm3_dlq_reconciliation", "fm4_duplicated_runs",
       "fm5_transient_failures", "fm6_task_timeouts", "fm7_rolling_deploys", "fm8_backend_outage",
       "fm9_connection_loss"]
PIPELINE = ("fetch_document", "parse_document", "notify")
STUDIES = ["case_studies.severity_batch", "case_studies.bl_ingestion", "case_studies.cte_ingestion"]
SB_DEADLINE = 20.0  # case_studies/severity_batch/fixed.py: DEADLINE_SECONDS; given as --chord-gap: a straggler member
# can keep the chord without a return that long (case study 1 stages one), so the chord keys must outlive it


def facts_of(module: str) -> AppFacts:
    return collect(load_app(f"{module}:app"), f"{module}:app")


def findings(module: str, options: Options = Options()) -> list[Finding]:
    return run_rules(facts_of(module), options)


def pipeline_rules(module: str) -> set[str]:
    """The rules that name one of the FM's own pipeline tasks (not the lab's probe, nor the DLQ drain)."""
    own = {f"{module}.{t}" for t in PIPELINE}
    return {f.rule.id for f in findings(module) if own & set(f.tasks)}


# ---- the FM files, FM by FM ------------------------------------------------------------------

CLEARS = {
    1: set[str](),  # FM-1's fix, @enveloped, is in the task body: no setting shows it
    2: {"acks-early"},  # task_acks_late + task_reject_on_worker_lost
    3: {"unbounded-redelivery"},  # the quorum queue's x-delivery-limit and dead-letter exchange
    4: set[str](),  # FM-4's claim is in notify's body
    5: set[str](),  # FM-5's @transient_retryable is in the body; its retries wait in the broker, so none is flagged
    6: {"no-deadline"},  # @hard_timeout in every pipeline task, time_limit with BackstopRequest
    7: {"prefetch-above-delivery-limit", "warm-shutdown-only"},  # prefetch 1; the soft shutdown on SIGTERM
    8: {"unstored-result-acked"},  # reject_unstored: an unstorable result rejects into the DLX (the drain sends it back)
    9: {"connection-loss-leaves-tasks-running",  # worker_cancel_long_running_tasks_on_connection_loss
        "channel-error-ends-worker"},  # broker_channel_error_retry; within_consumer_timeout changes nothing at 1800 s
}
"""What each FM N clears of the rules fm N-1 breaks. ``time-limit-above-consumer-timeout`` is in no FM's pipeline: fm0
to fm5 have no time_limit (``no-deadline`` says it, consumer timeout included), and fm6's limits (3 s, 15 s) are far
below RabbitMQ's default; ``test_fm8_under_the_lab_nodes_consumer_timeout`` shows it on fm8's code."""

EXPOSES = {
    2: {"unbounded-redelivery",  # requeue with no bound (S3, FM-3)
        "warm-shutdown-only",  # acks late meets a deploy (S7, FM-7)
        "unstored-result-acked",  # a late ack after a result the backend could not store (S8, FM-8)
        "connection-loss-leaves-tasks-running", "channel-error-ends-worker"},  # unacked while it runs (S9, FM-9)
    3: {"prefetch-above-delivery-limit"},  # x-delivery-limit 2 under the default prefetch (C19), which FM-7 fixes
}
"""What an FM's fix exposes that a later FM fixes: the lab's own chain of symptoms."""


def test_fm0_breaks_every_rule_its_configuration_can() -> None:
    assert pipeline_rules("fm0_naive") == {"acks-early", "no-deadline"}


@pytest.mark.parametrize("n", range(1, len(FMS)))
def test_each_fm_clears_the_rules_its_fix_fixes(n: int) -> None:
    before, after = pipeline_rules(FMS[n - 1]), pipeline_rules(FMS[n])
    assert before - after == CLEARS[n], f"fm{n} should clear {CLEARS[n]} of fm{n - 1}'s {before}; leaves {after}"
    assert after - before == EXPOSES.get(n, set()), f"fm{n} exposes {after - before}"


@pytest.mark.parametrize("n", range(6, len(FMS)))
def test_from_fm6_on_an_fm_leaves_only_what_the_later_fms_fix(n: int) -> None:
    later = set[str]().union(*(CLEARS[k] for k in range(n + 1, len(FMS))))
    assert pipeline_rules(FMS[n]) == later


def test_fm9_is_clean_of_the_fm8_and_fm9_rules_on_every_task() -> None:
    """Its own pipeline, and the lab's plumbing beside it (probe, idle, the DLQ drain), with RabbitMQ's default
    consumer_timeout: within_consumer_timeout gave the plumbing 900 s limits and left the pipeline's as they were."""
    found = findings("fm9_connection_loss")
    assert not {f.rule.id for f in found} & (CLEARS[8] | CLEARS[9] | {"time-limit-above-consumer-timeout"})
    assert not [f for f in found if f.severity == "high"]


def test_fm8_under_the_lab_nodes_consumer_timeout() -> None:
    """Scenario 9's node has a 2.4 s consumer_timeout: fm8's limits (3 s, 15 s: FM-6's) are at or above it, which S9
    and S9 hard show; fm9, told the node's timeout (RCL_CONSUMER_TIMEOUT, as the lab's linked worker is), is not."""
    found = [f for f in findings("fm8_backend_outage", Options(consumer_timeout=2.4))
             if f.rule.id == "time-limit-above-consumer-timeout"]
    assert sorted(t.rsplit(".", 1)[-1] for f in found for t in f.tasks) == sorted(PIPELINE)
    assert {f.severity for f in found} == {"high"}
    told = audit_cmd("fm9_connection_loss:app", "--json", "--consumer-timeout", "2.4", env={"RCL_CONSUMER_TIMEOUT": "2.4"})
    assert told.returncode in (0, 1), told.stderr
    assert not [f for f in json.loads(told.stdout)["findings"] if f["rule"] == "time-limit-above-consumer-timeout"]
    untold = audit_cmd("fm9_connection_loss:app", "--json", "--consumer-timeout", "2.4", env={"RCL_CONSUMER_TIMEOUT": "1800"})
    assert [f for f in json.loads(untold.stdout)["findings"] if f["rule"] == "time-limit-above-consumer-timeout"]


# ---- the case studies ------------------------------------------------------------------------

WRITEUP_MISTAKES = {
    "case_studies.severity_batch": {"chord-outlives-result-expires", "retries-exhausted-fail"},  # SB6, SB5 write-up
    "case_studies.bl_ingestion": {"visibility-timeout-below-run"},  # BL8 write-up (parse_bl)
    "case_studies.cte_ingestion": {"one-queue-per-key-order"},  # CT2 write-up (CT3's loss is not a chord's: no rule)
}

STATED_LIMITS = {
    "case_studies.severity_batch": set[str](),
    "case_studies.bl_ingestion": {"unbounded-redelivery"},  # fixed.py: "Redis still has no delivery limit"
    "case_studies.cte_ingestion": {"unbounded-redelivery"},  # fixed.py: "a classic queue has no delivery limit"
}
"""High findings in a fixed program that its own docstring names as not handled."""

@pytest.mark.parametrize("study", STUDIES)
def test_a_write_up_is_flagged_for_its_mistakes_and_its_fixed_program_is_not(study: str) -> None:
    options = Options(chord_gap=SB_DEADLINE)
    writeup = findings(f"{study}.writeup", options)
    fixed = findings(f"{study}.fixed", options)
    assert WRITEUP_MISTAKES[study] <= {f.rule.id for f in writeup}
    still = {f.rule.id for f in fixed} & WRITEUP_MISTAKES[study]
    if study == "case_studies.bl_ingestion":  # its other tasks have no time_limit; the parse task is fixed
        assert [f.tasks for f in writeup if f.rule.id == "visibility-timeout-below-run"
                and any(t.endswith(".parse_bl") for t in f.tasks)]
        assert not [f for f in fixed if f.rule.id == "visibility-timeout-below-run"
                    and any(t.endswith(".parse_units") for t in f.tasks)]
    else:
        assert not still, f"{study}.fixed still {still}"
    assert {f.rule.id for f in fixed if f.severity == "high"} == STATED_LIMITS[study]


def test_the_case_studies_fixed_programs_set_fm8s_guard_and_fm9s_settings() -> None:
    """Each fixed program guards its stores (FM-8): on RabbitMQ with a dead-letter exchange (severity_batch) as fm8
    does, elsewhere with requeue (bl_ingestion's Redis broker, cte_ingestion's classic shard queues); and sets
    FM-9's settings where the broker is RabbitMQ. Each write-up program does neither."""
    for study in STUDIES:
        fixed, writeup = (facts_of(f"{study}.{kind}") for kind in ("fixed", "writeup"))
        assert fixed.backend_guards_store and not writeup.backend_guards_store, study
        assert fixed.backend_requeues_unstored == (study != "case_studies.severity_batch"), study
        if fixed.broker_kind == "rabbitmq":
            assert fixed.settings["worker_cancel_long_running_tasks_on_connection_loss"] is True, study
            assert fixed.settings["broker_channel_error_retry"] is True, study
    for study, tasks in {"case_studies.severity_batch": {"score_chunk", "reconcile"},
                         "case_studies.bl_ingestion": {"parse_bl"}}.items():  # where the write-up stores results
        found = [f for f in findings(f"{study}.writeup") if f.rule.id == "unstored-result-acked"]
        assert tasks <= {t.rsplit(".", 1)[-1] for f in found for t in f.tasks}, study


def test_the_write_up_cells_are_the_proofs() -> None:
    found = {f.rule.id: f for f in findings("case_studies.severity_batch.writeup", Options(chord_gap=SB_DEADLINE))}
    assert found["chord-outlives-result-expires"].rule.proof.cell == "severity_batch SB6 write-up"
    assert "result_expires=8s" in found["chord-outlives-result-expires"].where
    assert "--case-studies --only severity_batch --prove" in (found["chord-outlives-result-expires"].rule.proof.command or "")


# ---- the command -----------------------------------------------------------------------------


def audit_cmd(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "audit", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_table_names_the_rule_the_proof_the_command_and_the_fix(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "fm0_naive:app")
    assert code == 1
    assert "acks-early" in out and "fm2 S2" in out and "run_all_fms.py --only fm2 --prove" in out
    assert "task_acks_late = True" in out and f"Celery {version('celery')}, kombu {version('kombu')}" in out
    assert "broker rabbitmq" in out and "result backend redis" in out


def test_a_password_in_a_url_is_masked() -> None:
    assert mask("amqp://user:s3cret@host:5672//") == "amqp://user:***@host:5672//"
    assert mask("redis://host:6379/0") == "redis://host:6379/0"


def test_fail_on_sets_the_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_main(capsys, "fm9_connection_loss:app")[0] == 0  # medium findings only (the lab's plumbing)
    assert run_main(capsys, "fm9_connection_loss:app", "--fail-on", "medium")[0] == 1
    assert run_main(capsys, "fm0_naive:app", "--fail-on", "high")[0] == 1


def test_the_consumer_timeout_is_a_number_of_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("0", "-5", "nan"):
        with pytest.raises(SystemExit) as exit_:
            main(["fm9_connection_loss:app", "--consumer-timeout", bad])
        assert exit_.value.code == 2 and "--consumer-timeout takes a number of seconds" in capsys.readouterr().err
    code, out, _ = run_main(capsys, "fm8_backend_outage:app", "--consumer-timeout", "2.4")
    assert code == 1 and "consumer_timeout 2.4s" in out


def test_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "fm2_worker_crash:app", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["app"] == "fm2_worker_crash:app" and doc["celery"] == version("celery")
    f = next(f for f in doc["findings"] if f["rule"] == "unbounded-redelivery")
    assert f["proof"]["cell"] == "fm3 S3" and f["severity"] == "high" and f["queue"].endswith(".fm2.tasks")
    assert f["file"] == "fm2_worker_crash.py"
    assert "task_reject_on_worker_lost = True" in Path(ROOT / f["file"]).read_text().splitlines()[f["line"] - 1]
    assert doc["rules_checked"] == [r.id for r in RULES]


def test_sarif_for_code_scanning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "audit.sarif"
    code, printed, _ = run_main(capsys, "fm0_naive:app", "--sarif", "-o", str(out))
    assert code == 1 and printed == ""
    doc: dict[str, Any] = json.loads(out.read_text())
    assert doc["version"] == "2.1.0" and len(doc["runs"]) == 1
    run = doc["runs"][0]
    rules = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert rules == [r.id for r in RULES]
    assert run["results"], "fm0 has findings"
    for result in run["results"]:
        assert rules[result["ruleIndex"]] == result["ruleId"]
        assert result["level"] in ("error", "warning", "note") and result["message"]["text"]
        where = result["locations"][0]["physicalLocation"]
        assert where["artifactLocation"]["uri"] == "fm0_naive.py" and where["region"]["startLine"] > 1
    assert {r["level"] for r in run["results"]} == {"error", "warning"}


def test_the_rules_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main(capsys, "--rules")
    assert code == 0 and all(r.id in out for r in RULES)
    assert "no lab run proves it yet" in out


def test_the_console_script_is_installed() -> None:
    script = Path(sys.executable).parent / "reliable-celery-audit"
    if not script.exists() and sys.prefix != str(ROOT / ".venv"):
        pytest.skip("a venv the project is not installed in (make matrix's run the tests from the repository)")
    assert script.exists(), "pip install -e . installs reliable-celery-audit ([project.scripts])"
    done = subprocess.run([str(script), "--rules"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "acks-early" in done.stdout


@pytest.mark.parametrize(("source", "says"), [
    (None, "no module named 'nosuchapp_xyz'"),
    ("raise RuntimeError('settings missing')\n", "raised RuntimeError: settings missing"),
    ("app = 42\n", "int, not a Celery app"),
    ("import socket\nsocket.create_connection(('127.0.0.1', 6379))\n", "tried to connect to ('127.0.0.1', 6379)"),
    ("import redis\nredis.Redis(host='127.0.0.1', port=6379).ping()\n", "tried to connect"),
    # Celery finalizing the app's tasks calls each task class's bind: an error there is a load failure, exit 2
    ("from celery import Celery\napp = Celery('x', set_as_current=False)\nclass Bad(app.Task):\n"
     "    @classmethod\n    def bind(cls, app):\n        raise RuntimeError('bad bind')\n"
     "@app.task(base=Bad, shared=False)\ndef t(): ...\n", "raised RuntimeError: bad bind"),
])
def test_an_app_that_cannot_be_imported_exits_2_in_one_line(tmp_path: Path, source: str | None, says: str) -> None:
    if source is not None:
        (tmp_path / "nosuchapp_xyz.py").write_text(textwrap.dedent(source))
    done = audit_cmd("nosuchapp_xyz:app", cwd=tmp_path, env={"PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1


# ---- the audit opens no connection -------------------------------------------------------------

DRIVER = """
import json, os, socket, sys
tried = []
def record(*args, **kwargs):
    tried.append(repr(args[-1] if args else kwargs))
    raise OSError("test: no connection")
socket.socket.connect = lambda self, address: record(address)
socket.socket.connect_ex = lambda self, address: record(address)
socket.create_connection = lambda address, *a, **k: record(address)
from audit.cli import main
codes = {t: main([t, "--json", "-o", os.devnull, "--chord-gap", "20"]) for t in sys.argv[1:]}
print(json.dumps({"codes": codes, "tried": tried}))
"""


def test_auditing_every_app_of_the_lab_opens_no_connection() -> None:
    """Every socket connection, in the guard or out of it, is recorded: none is tried, and none was refused
    (a refused one is exit 2). The URLs point where nothing answers, in case one were tried all the same."""
    targets = [f"{m}:app" for m in FMS] + [f"{s}.{k}:app" for s in STUDIES for k in ("writeup", "fixed")]
    env = {**os.environ, "CELERY_BROKER_URL": "amqp://guest:guest@127.0.0.1:1//",
           "CELERY_RESULT_BACKEND": "redis://127.0.0.1:1/0"}
    done = subprocess.run([sys.executable, "-c", DRIVER, *targets], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["tried"] == []
    assert set(result["codes"].values()) <= {0, 1}, result["codes"]
    assert len(result["codes"]) == len(targets)


def test_the_task_modules_a_worker_imports_are_audited_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``include`` (and ``imports``, autodiscovery) name modules a worker imports before it runs: their tasks count."""
    (tmp_path / "audinc_app.py").write_text(
        "from celery import Celery\napp = Celery('audinc', broker='amqp://guest@localhost//', include=['audinc_tasks'])\n")
    (tmp_path / "audinc_tasks.py").write_text(
        "from audinc_app import app\n\n@app.task(acks_late=False)\ndef hello() -> None: ...\n")
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    found = findings("audinc_app")
    assert [f.tasks for f in found if f.rule.id == "acks-early" and "audinc_tasks.hello" in f.tasks]
