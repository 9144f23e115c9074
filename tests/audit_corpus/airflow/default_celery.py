"""providers/celery/src/airflow/providers/celery/executors/default_celery.py at 00564358, with Airflow's
``conf.get(section, key, fallback=...)`` read as the environment variables it falls back to."""

from __future__ import annotations

import os


def _conf(section: str, key: str, fallback: str) -> str:
    """Airflow reads AIRFLOW__<SECTION>__<KEY> from the environment before airflow.cfg; the fallback else."""
    return os.environ.get(f"AIRFLOW__{section.upper()}__{key.upper()}", fallback)


broker_url = _conf("celery", "BROKER_URL", "redis://redis:6379/0")  # line 50
broker_transport_options: dict[str, object] = {}  # line 52: the [celery_broker_transport_options] section, empty
if "visibility_timeout" not in broker_transport_options and broker_url.startswith(("redis://", "rediss://")):
    broker_transport_options["visibility_timeout"] = 86400  # lines 53-55
result_backend = _conf("celery", "RESULT_BACKEND", "db+postgresql://airflow:airflow@postgres/airflow")  # 66-70

DEFAULT_CELERY_CONFIG = {  # lines 74-94
    "accept_content": ["json"],
    "event_serializer": "json",
    "worker_prefetch_multiplier": int(_conf("celery", "worker_prefetch_multiplier", "1")),
    "task_acks_late": _conf("celery", "task_acks_late", "True") == "True",
    "task_default_queue": _conf("operators", "DEFAULT_QUEUE", "default"),
    "task_default_exchange": _conf("operators", "DEFAULT_QUEUE", "default"),
    "task_track_started": True,
    "broker_url": broker_url,
    "broker_transport_options": broker_transport_options,
    "broker_connection_retry_on_startup": True,
    "result_backend": result_backend,
    "worker_concurrency": int(_conf("celery", "WORKER_CONCURRENCY", "16")),
    "worker_enable_remote_control": True,
}
