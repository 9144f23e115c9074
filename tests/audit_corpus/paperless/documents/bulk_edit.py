"""paperless-ngx's src/documents/bulk_edit.py at b0e0e8a3: the delete task (line 361) and the chord that
splits a document (lines 676-681: consume_file members, delete as the body), as a function never called here."""

from __future__ import annotations

from celery import chord, shared_task, signature


@shared_task(name="documents.bulk_edit.delete")  # bulk_edit.py:361
def delete(doc_ids: list[int]) -> str:
    return "OK"


def split_and_delete(doc_id: int, parts: list[object]) -> None:
    """bulk_edit.py:676: one consume_file per part, then delete the original."""
    header = [signature("documents.tasks.consume_file", args=(p,)) for p in parts]
    chord(header, delete.si([doc_id])).apply_async()
