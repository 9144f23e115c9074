"""readthedocs/worker.py at 79371961: create_application() makes the app from the settings class with the
CELERY_ namespace (lines 17-19); the settings module chosen is docker_compose's (line 14)."""

from __future__ import annotations

from celery import Celery

from tests.audit_corpus.readthedocs.settings import DockerBaseSettings

app = Celery(DockerBaseSettings.CELERY_APP_NAME)
app.config_from_object(DockerBaseSettings, namespace="CELERY")
app.conf.include = ["tests.audit_corpus.readthedocs.builds"]
