"""DefectDojo's Celery settings (dojo/settings/settings.dist.py at 7cfa159a), the environment read as
django-environ does it, with the same defaults (settings.dist.py:89-124)."""

from __future__ import annotations

import os


def _int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw else default


# docker-compose.yml:52 gives DD_CELERY_BROKER_URL a Redis (valkey) default
CELERY_BROKER_URL = os.environ.get("DD_CELERY_BROKER_URL") or "redis://valkey:6379/0"  # settings.dist.py:910-920
CELERY_TASK_IGNORE_RESULT = os.environ.get("DD_CELERY_TASK_IGNORE_RESULT", "true").lower() in ("1", "true", "yes")  # :921, default :98
CELERY_RESULT_BACKEND = os.environ.get("DD_CELERY_RESULT_BACKEND", "django-db")  # :925, default :109
CELERY_TIMEZONE = "UTC"  # :926
CELERY_RESULT_EXPIRES = _int("DD_CELERY_RESULT_EXPIRES", 86400)  # :927, default :110
CELERY_ACCEPT_CONTENT = ["json"]  # :929
CELERY_TASK_SERIALIZER = os.environ.get("DD_CELERY_TASK_SERIALIZER", "json")  # :930
CELERY_RESULT_SERIALIZER = "json"  # :931
if _int("DD_CELERY_TASK_TIME_LIMIT", 43200) > 0:  # :934-935, default :116
    CELERY_TASK_TIME_LIMIT = _int("DD_CELERY_TASK_TIME_LIMIT", 43200)
if _int("DD_CELERY_TASK_SOFT_TIME_LIMIT", 0) > 0:  # :936-937, default :120 (0: unset)
    CELERY_TASK_SOFT_TIME_LIMIT = _int("DD_CELERY_TASK_SOFT_TIME_LIMIT", 0)
if _int("DD_CELERY_TASK_DEFAULT_EXPIRES", 43200) > 0:  # :938-939, default :124
    CELERY_TASK_DEFAULT_EXPIRES = _int("DD_CELERY_TASK_DEFAULT_EXPIRES", 43200)
