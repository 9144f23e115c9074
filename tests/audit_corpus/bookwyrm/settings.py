"""BookWyrm's Celery settings (celerywyrm/settings.py at db40a61c), the environment read with the same defaults."""

from __future__ import annotations

import os

_BROKER = os.environ.get("REDIS_BROKER_URL", "redis://:@redis_broker:6379/0")  # settings.py:8-15

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", _BROKER)  # :17-19
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", _BROKER)  # :20-22
CELERY_DEFAULT_QUEUE = "low_priority"  # :24
CELERY_CREATE_MISSING_QUEUES = True  # :25
CELERY_ACCEPT_CONTENT = ["json"]  # :27
CELERY_TASK_SERIALIZER = "json"  # :28
CELERY_RESULT_SERIALIZER = "json"  # :29
CELERY_TIMEZONE = os.environ.get("TIME_ZONE", "UTC")  # :32
CELERY_WORKER_CONCURRENCY = os.environ.get("CELERY_WORKER_CONCURRENCY", None)  # :34
CELERY_TASK_SOFT_TIME_LIMIT = os.environ.get("CELERY_TASK_SOFT_TIME_LIMIT", None)  # :35
