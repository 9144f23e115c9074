"""saleor/celeryconf.py at 723cd4eb: the app (line 24) and the namespace (line 26)."""

from __future__ import annotations

from celery import Celery

app = Celery("saleor")
app.config_from_object("tests.audit_corpus.saleor.settings", namespace="CELERY")
app.autodiscover_tasks(["tests.audit_corpus.saleor.plugins"])
