"""src/paperless/celery.py at b0e0e8a3: the app (line 57), the namespace (line 63), autodiscovery (line 66)."""

from __future__ import annotations

from celery import Celery

app = Celery("paperless")
app.config_from_object("tests.audit_corpus.paperless.settings", namespace="CELERY")
app.autodiscover_tasks(["tests.audit_corpus.paperless.documents"])
