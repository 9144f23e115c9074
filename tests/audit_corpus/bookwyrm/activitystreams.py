"""Two of BookWyrm's tasks at db40a61c (bookwyrm/activitystreams.py:600, activitypub/base_activity.py:322),
declared on bookwyrm.tasks.app as the project does (shared: the worker's app runs them too)."""

from __future__ import annotations

from tests.audit_corpus.bookwyrm.tasks import MISC, STREAMS, app


@app.task(queue=STREAMS, name="bookwyrm.activitystreams.add_book_statuses_task")
def add_book_statuses_task(user_id: int, book_id: int) -> None: ...


@app.task(queue=MISC, name="bookwyrm.activitypub.base_activity.set_related_field")
def set_related_field(model_name: str, origin_model_name: str, related_field_name: str, related_remote_id: str,
                      data: object) -> None: ...
