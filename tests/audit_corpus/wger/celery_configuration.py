"""wger/celery_configuration.py at aaba2018: the app (line 25), the namespace (line 29), autodiscovery (line 32)."""

from __future__ import annotations

from celery import Celery

app = Celery("wger")
app.config_from_object("tests.audit_corpus.wger.settings", namespace="CELERY")
app.conf.include = ["tests.audit_corpus.wger.tasks"]
