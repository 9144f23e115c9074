"""Taiga's export tasks at 3bea7114 (taiga/export_import/tasks.py:31 and :95), options only."""

from __future__ import annotations

from typing import Any

from tests.audit_corpus.taiga.celery import app


@app.task(bind=True, name="taiga.export_import.tasks.dump_project")
def dump_project(self: Any, user: object, project: object, dump_format: str) -> None: ...


@app.task(name="taiga.export_import.tasks.load_project_dump")
def load_project_dump(user: object, dump: object) -> None: ...
