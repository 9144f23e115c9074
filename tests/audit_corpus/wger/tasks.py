"""Two of wger's tasks at aaba2018 (wger/exercises/tasks.py:44, wger/core/tasks.py:33), no options."""

from __future__ import annotations

from tests.audit_corpus.wger.celery_configuration import app


@app.task(name="wger.exercises.tasks.sync_exercises_task")
def sync_exercises_task() -> None: ...


@app.task(name="wger.core.tasks.flush_expired_jwt_tokens_task")
def flush_expired_jwt_tokens_task() -> None: ...
