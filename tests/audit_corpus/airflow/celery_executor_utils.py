"""providers/celery/src/airflow/providers/celery/executors/celery_executor_utils.py at 00ba3862: the app made
from the config dict (_get_celery_app: Celery(name, config_source=...)) and its task execute_workload (no options)."""

from __future__ import annotations

from celery import Celery

from tests.audit_corpus.airflow.default_celery import DEFAULT_CELERY_CONFIG

app = Celery("airflow.providers.celery.executors.celery_executor", config_source=DEFAULT_CELERY_CONFIG)


@app.task(name="execute_workload")
def execute_workload(input: str) -> None: ...
