"""apps/api/plane/celery.py at 4ca6d6c7: the app (line 23) and the namespace (line 27)."""

from __future__ import annotations

from celery import Celery

app = Celery("plane")
app.config_from_object("tests.audit_corpus.plane.settings", namespace="CELERY")
