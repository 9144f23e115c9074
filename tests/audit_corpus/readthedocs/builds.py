"""Read the Docs' build tasks at 79371961 (readthedocs/projects/tasks/builds.py), options only."""

from __future__ import annotations

from typing import Any

from celery import Task

from tests.audit_corpus.readthedocs.settings import DockerBaseSettings
from tests.audit_corpus.readthedocs.worker import app


class BuildMaxConcurrencyError(Exception):
    pass


class UpdateDocsTask(Task):  # pyright: ignore[reportMissingTypeArgument]  # builds.py:271-284
    autoretry_for = (BuildMaxConcurrencyError,)
    max_retries = DockerBaseSettings.RTD_BUILDS_MAX_RETRIES
    default_retry_delay = DockerBaseSettings.RTD_BUILDS_RETRY_DELAY
    retry_backoff = False


class SyncRepositoryTask(Task):  # pyright: ignore[reportMissingTypeArgument]  # builds.py:132-146; its retries are raised in the body (self.retry)
    max_retries = 5
    default_retry_delay = 7 * 60


@app.task(base=UpdateDocsTask, bind=True, ignore_result=True,
          name="readthedocs.projects.tasks.builds.update_docs_task")  # builds.py:1028-1032
def update_docs_task(self: Any, version_id: int, build_id: int) -> None: ...


@app.task(base=SyncRepositoryTask, bind=True, name="readthedocs.projects.tasks.builds.sync_repository_task")  # builds.py:248-251
def sync_repository_task(self: Any, version_id: int) -> None: ...
