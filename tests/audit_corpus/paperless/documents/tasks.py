"""paperless-ngx's tasks (src/documents/tasks.py and bulk_edit.py at b0e0e8a3), options only; bodies are stubs.

bulk_edit.py:676-681 applies chord(header=[consume_file.s(...) ...], body=delete.si(...)), so consume_file
and delete are a chord's member and body.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from tests.audit_corpus.paperless.documents import bulk_edit as bulk_edit  # its task registers with the tasks


class SearchIndexLockError(Exception):
    pass


@shared_task(name="documents.tasks.index_document", bind=True, ignore_result=True,
             autoretry_for=(SearchIndexLockError,), max_retries=5, retry_backoff=60,
             retry_jitter=True)  # tasks.py:88-95
def index_document(self: Any, document_id: int) -> None: ...


@shared_task(name="documents.tasks.train_classifier")  # tasks.py:145
def train_classifier() -> None: ...


@shared_task(name="documents.tasks.consume_file", bind=True)  # tasks.py:181, a chord member (bulk_edit.py:676)
def consume_file(self: Any, input_doc: object) -> None: ...

