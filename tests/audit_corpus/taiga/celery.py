"""taiga/celery.py at 3bea7114: the app (line 19) and the namespace (line 20)."""

from __future__ import annotations

from celery import Celery

app = Celery("taiga")
app.config_from_object("tests.audit_corpus.taiga.settings", namespace="CELERY")
app.conf.include = ["tests.audit_corpus.taiga.tasks"]
