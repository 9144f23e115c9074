"""paperless-ngx's Celery settings (src/paperless/settings/__init__.py at b0e0e8a3), as Django would hold them."""

from __future__ import annotations

import os

# src/paperless/settings/__init__.py:252 reads PAPERLESS_REDIS; src/paperless/settings/custom.py:38-39 defaults it
_REDIS = os.environ.get("PAPERLESS_REDIS") or "redis://localhost:6379"

CELERY_BROKER_URL = _REDIS  # settings/__init__.py:678
CELERY_RESULT_BACKEND = _REDIS  # :679
CELERY_RESULT_EXPIRES = 3600  # :683 ("results are only needed for chord synchronization")
CELERY_WORKER_HIJACK_ROOT_LOGGER = False  # :686
CELERY_WORKER_CONCURRENCY = int(os.environ.get("PAPERLESS_TASK_WORKERS", 1))  # :687
CELERY_WORKER_MAX_TASKS_PER_CHILD = 1  # :689
CELERY_WORKER_SEND_TASK_EVENTS = True  # :690
CELERY_TASK_SEND_SENT_EVENT = True  # :691
CELERY_SEND_TASK_SENT_EVENT = True  # :692, the old name of the one above (Celery maps it)
CELERY_BROKER_CONNECTION_RETRY = True  # :693
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True  # :694
CELERY_BROKER_TRANSPORT_OPTIONS = {"global_keyprefix": os.environ.get("PAPERLESS_REDIS_PREFIX", "")}  # :695-697
CELERY_TASK_TRACK_STARTED = True  # :699
CELERY_TASK_TIME_LIMIT = int(os.environ.get("PAPERLESS_WORKER_TIMEOUT", 1800))  # :700
CELERY_TASK_SERIALIZER = "json"  # :707 is "signed-pickle", a serializer paperless registers; json here, no rule reads it
CELERY_ACCEPT_CONTENT = ["application/json"]  # :709 (likewise)
