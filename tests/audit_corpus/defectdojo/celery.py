"""dojo/celery.py at 7cfa159a: the app (line 156) and the namespace (line 158)."""

from __future__ import annotations

from celery import Celery

app = Celery("dojo")
app.config_from_object("tests.audit_corpus.defectdojo.settings", namespace="CELERY")
app.conf.include = ["tests.audit_corpus.defectdojo.tasks"]
