"""Two of DefectDojo's tasks at 7cfa159a (dojo/tasks.py:33, dojo/notifications/tasks.py:209), options only."""

from __future__ import annotations

from typing import Any

from tests.audit_corpus.defectdojo.celery import app


@app.task(bind=True, name="dojo.tasks.flush_auditlog")  # dojo/tasks.py:33
def flush_auditlog(self: Any) -> None: ...


@app.task(ignore_result=True, name="dojo.notifications.tasks.webhook_reactivation")  # notifications/tasks.py:209
def webhook_reactivation(endpoint_id: int) -> None: ...
