"""backend/onyx/background/celery/apps/light.py at a7d66a8b: the app (line 29) from the config module (line 30)."""

from __future__ import annotations

from celery import Celery

celery_app = Celery(__name__)
celery_app.config_from_object("tests.audit_corpus.onyx.configs_light")
celery_app.conf.include = ["tests.audit_corpus.onyx.vespa_tasks"]
