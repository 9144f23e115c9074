"""lemur/common/celery.py at 3a3c2c20: make_celery (lines 48-65) builds the app with the broker and backend
from Flask's config, then updates its conf with the whole of that config (line 54)."""

from __future__ import annotations

from typing import Any

from celery import Celery

from tests.audit_corpus.lemur.config import FLASK_CONFIG


def make_celery(config: dict[str, Any]) -> Celery[Any]:
    celery = Celery("lemur", backend=config.get("CELERY_RESULT_BACKEND"), broker=config.get("CELERY_BROKER_URL"))
    celery.conf.update(config)
    return celery


celery_app = make_celery(FLASK_CONFIG)
