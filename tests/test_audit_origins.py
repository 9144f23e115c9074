"""Where a finding says a value was set: the settings module or class ``config_from_object`` was given, read
from its source; a value read from the environment marked so; names Celery does not read; the app found as
``celery -A`` finds it. On the corpus's projects (tests/audit_corpus), no broker.

Projects whose tasks are ``shared_task`` (paperless, Onyx, Plane) are audited by the command in a process of
its own: loaded here, their shared tasks would join every app finalized after them in this process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from audit.facts import AppFacts, collect, load_app
from audit.rules import Options, run_rules

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "audit_corpus"


def facts_of(target: str) -> AppFacts:
    return collect(load_app(target), target)


def line_of(path: Path, text: str) -> int:
    """The 1-based line of ``path`` that starts with ``text``."""
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.lstrip().startswith(text))


def audit_json(target: str, *args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", "audit", target, "--json", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)


def test_a_settings_class_read_with_a_namespace() -> None:
    """Read the Docs: config_from_object(DockerBaseSettings, namespace="CELERY"), the values in its base class."""
    facts = facts_of("tests.audit_corpus.readthedocs.worker:app")
    settings = CORPUS / "readthedocs" / "settings.py"
    o = facts.origins["task_acks_late"]
    assert (o.name, o.file, o.line, o.environment) == ("CELERY_TASK_ACKS_LATE", str(settings),
                                                       line_of(settings, "CELERY_TASK_ACKS_LATE"), False)
    assert facts.origins["broker_url"].line == line_of(settings, "CELERY_BROKER_URL")  # the subclass's
    assert facts.how("task_time_limit") == (f"set as CELERY_TASK_TIME_LIMIT at tests/audit_corpus/readthedocs/"
                                            f"settings.py:{line_of(settings, 'CELERY_TASK_TIME_LIMIT')}")
    assert facts.how("worker_soft_shutdown_timeout") == "Celery's default"
    found = {f.rule.id: f for f in run_rules(facts, Options())}
    late = found["acks-late-without-reject-on-worker-lost"]
    assert "(Celery's default)" in late.where  # task_reject_on_worker_lost is not set: that one is Celery's default
    unknown = found["setting-not-in-this-celery"]
    assert "CELERY_TASK_SEND_ERROR_EMAILS" in unknown.where and unknown.severity == "low"


def test_values_read_from_the_environment_are_marked() -> None:
    """DefectDojo: every value through os.environ with a default, some assigned inside an if."""
    facts = facts_of("tests.audit_corpus.defectdojo.celery:app")
    settings = CORPUS / "defectdojo" / "settings.py"
    o = facts.origins["task_time_limit"]
    assert (o.line, o.environment) == (line_of(settings, "CELERY_TASK_TIME_LIMIT = _int("), True)
    assert facts.origins["result_serializer"].environment is False
    assert facts.unknown_settings == ("CELERY_TASK_DEFAULT_EXPIRES",)
    f = next(f for f in run_rules(facts, Options()) if f.rule.id == "setting-not-in-this-celery")
    assert f.where == f"1 name(s) Celery {facts.celery_version} does not read: CELERY_TASK_DEFAULT_EXPIRES"
    assert (f.file, f.line) == (str(settings), line_of(settings, "CELERY_TASK_DEFAULT_EXPIRES = _int("))


def test_old_names_under_a_namespace_are_read_and_not_reported() -> None:
    """Taiga's CELERY_QUEUES is an old name: Celery 5.7 maps it under the namespace; 5.5 and 5.6 ignore it, and
    the audit reports it there (read in each version's conf: celery.utils.collections.ConfigurationView._to_keys)."""
    taiga = facts_of("tests.audit_corpus.taiga.celery:app")
    if taiga.celery_minor >= (5, 7):
        assert taiga.origins["task_queues"].name == "CELERY_QUEUES" and set(taiga.queues) == {"tasks", "transient"}
        assert taiga.unknown_settings == ()
    else:  # 5.5 and 5.6 read no old name under a namespace: the transient queue is never declared
        assert "task_queues" not in taiga.origins and set(taiga.queues) == {"tasks"}
        assert taiga.unknown_settings == ("CELERY_QUEUES",)
    assert "one-queue-per-key-order" not in {f.rule.id for f in run_rules(taiga, Options())}  # task.# promises no order


def test_a_name_celery_ignores_but_whose_setting_is_given_anyway() -> None:
    """Lemur updates the conf with Flask's whole config: CELERY_BROKER_URL is read by no setting, but the same URL is
    given to Celery() as broker=, so nothing it was set for is lost."""
    facts = facts_of("tests.audit_corpus.lemur.celery:celery_app")
    assert "CELERY_BROKER_URL" in facts.unknown_settings
    assert "setting-not-in-this-celery" not in {f.rule.id for f in run_rules(facts, Options())}


def test_retry_kwargs_max_retries_wins_over_the_tasks() -> None:
    """Saleor: retry_kwargs={"max_retries": 5}; celery.app.autoretry passes it to Task.retry, where it wins."""
    facts = facts_of("tests.audit_corpus.saleor.celeryconf:app")
    task = next(t for t in facts.tasks if t.name.endswith("api_post_request_task"))
    assert task.retry_max == 5 and task.opt("max_retries") == 3  # the task's own is Celery's default, unused here


def test_a_settings_module_without_a_namespace_and_a_threads_pool() -> None:
    """Onyx: config_from_object("...configs.light"); the pool finding points at worker_pool's line there."""
    _, doc = audit_json("tests.audit_corpus.onyx.light:celery_app")
    module = CORPUS / "onyx" / "configs_light.py"
    pool = next(f for f in doc["findings"] if f["rule"] == "pool-cannot-apply-deadlines")
    assert (pool["file"], pool["line"]) == ("tests/audit_corpus/onyx/configs_light.py", line_of(module, "worker_pool ="))
    assert f"worker_pool='threads' (set at tests/audit_corpus/onyx/configs_light.py:{line_of(module, 'worker_pool =')};" \
        in pool["where"]
    rules = {f["rule"] for f in doc["findings"]}
    assert not rules & {"acks-late-without-reject-on-worker-lost", "celery-soft-time-limit", "time-limit-fails-chord"}


def test_a_django_namespace_value_from_the_environment() -> None:
    """paperless-ngx: CELERY_TASK_TIME_LIMIT from PAPERLESS_WORKER_TIMEOUT, and a chord in bulk_edit."""
    _, doc = audit_json("tests.audit_corpus.paperless")  # the package: `celery -A paperless` finds paperless.celery
    settings = CORPUS / "paperless" / "settings.py"
    f = next(f for f in doc["findings"] if f["rule"] == "time-limit-fails-chord")
    line = line_of(settings, "CELERY_TASK_TIME_LIMIT")
    assert f["where"].startswith(f"setting task_time_limit=1800 (set as CELERY_TASK_TIME_LIMIT at "
                                 f"tests/audit_corpus/paperless/settings.py:{line}, read from the environment)")
    assert (f["file"], f["line"]) == ("tests/audit_corpus/paperless/settings.py", line)
    assert any("chord-outlives-result-expires" in n and "--chord-gap" in n for n in doc["cannot_tell"])


def test_the_app_is_found_as_celery_a_finds_it() -> None:
    """celery.app.utils.find_app: module:attribute; a module's app, then celery; a package's celery submodule;
    then any Celery app the module holds (Lemur's celery_app, Onyx's)."""
    for target, main in (("tests.audit_corpus.taiga", "taiga"), ("tests.audit_corpus.taiga.celery", "taiga"),
                         ("tests.audit_corpus.lemur", "lemur"), ("tests.audit_corpus.onyx.light",
                                                                 "tests.audit_corpus.onyx.light")):
        assert load_app(target).main == main, target


def test_a_settings_dict_given_as_config_source() -> None:
    """Airflow: Celery(name, config_source=DEFAULT_CELERY_CONFIG); each key's line in the dict literal, marked when
    its value comes from the environment (Airflow's AIRFLOW__CELERY__... variables)."""
    facts = facts_of("tests.audit_corpus.airflow.celery_executor_utils:app")
    module = CORPUS / "airflow" / "default_celery.py"
    late = facts.origins["task_acks_late"]
    assert (late.file, late.line, late.environment) == (str(module), line_of(module, '"task_acks_late"'), True)
    assert facts.origins["event_serializer"].environment is False
    concurrency = line_of(module, '"worker_concurrency"')
    assert facts.how("worker_concurrency").endswith(f"default_celery.py:{concurrency}, read from the environment")
