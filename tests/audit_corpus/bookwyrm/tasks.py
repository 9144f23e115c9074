"""bookwyrm/tasks.py at db40a61c: the app the tasks are declared on (lines 10-12) and queue names (15-29)."""

from __future__ import annotations

from celery import Celery

from tests.audit_corpus.bookwyrm import settings

app = Celery("tasks", broker=settings.CELERY_BROKER_URL, backend=settings.CELERY_RESULT_BACKEND)

LOW = "low_priority"
STREAMS = "streams"
MISC = "misc"
