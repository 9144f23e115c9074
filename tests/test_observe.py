"""The observer: Celery's signals in, one record per happening out (its attempt counter
is a Redis INCR, so these use the real Redis; keys under the lab's namespace, with a TTL)."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any, cast

import pytest
from celery.exceptions import Retry

from lab.observe import Happening, Observer, current_attempt, doc_id, doc_in, short_doc, split_doc_id
from shared.envelope import Result
from shared.retry import TransientError

pytestmark = pytest.mark.usefixtures("real_services")


def test_a_task_call_names_its_document_by_id_by_fetched_document_or_by_envelope() -> None:
    ident = doc_id("r1", "doc3")
    fetched = {"doc": ident, "text": "the text of doc3"}
    assert split_doc_id(ident) == ("r1", "doc3") and short_doc(ident) == "doc3"
    assert doc_in([ident]) == doc_in([fetched]) == doc_in([Result[Any].success(fetched, 1).to_wire()]) == ("r1", "doc3")
    assert doc_in([]) is None and doc_in(["no-run-here"]) is None and doc_in([{"doc": 3}]) is None


def test_attempts_retries_and_endings_reach_every_sink() -> None:
    seen: list[Happening] = []
    observer = Observer([seen.append])
    run = f"test-{uuid.uuid4().hex[:8]}"
    task = SimpleNamespace(name="fm5_transient_failures.parse_document")
    args = [doc_id(run, "doc5")]

    observer.prerun("t1", task, args, {})
    assert current_attempt("t1") == 1
    retry = Retry(exc=TransientError("503"), when=cast(Any, 0.25))  # a countdown, as Task.retry passes it
    observer.retry(task, SimpleNamespace(id="t1", args=args, kwargs={}), retry)
    observer.postrun("t1", task, args, {}, retry, "RETRY")
    observer.prerun("t2", task, args, {})
    assert current_attempt("t2") == 2  # counted per document, across task calls
    observer.postrun("t2", task, args, {}, Result[Any].success({"doc": args[0], "words": 4}, 2).to_wire(), "SUCCESS")

    assert [(h.kind, h.doc, dict(h.fields)) for h in seen] == [
        ("attempt_start", "doc5", {"attempt": "1"}),
        ("attempt_end", "doc5", {"attempt": "1", "outcome": "error", "error": "TransientError: 503"}),
        ("retry", "doc5", {"retry": "1", "delay": "0.25"}),  # exact, not rounded
        ("attempt_start", "doc5", {"attempt": "2"}),
        ("attempt_end", "doc5", {"attempt": "2", "outcome": "ok"}),
    ]
    assert {h.run_id for h in seen} == {run}


def test_a_notify_is_seen_by_its_pipeline_id_and_its_envelope_says_whether_it_sent() -> None:
    seen: list[Happening] = []
    observer = Observer([seen.append])
    task = SimpleNamespace(name="fm4_duplicated_runs.notify")
    args = [[], ["r2/doc1"], "r2"]
    observer.prerun("n1", task, args, {})
    observer.postrun("n1", task, args, {}, Result[Any].success({"ok": [], "failed": [], "sent": False}, 1).to_wire(), "SUCCESS")
    assert [(h.kind, h.run_id, dict(h.fields)) for h in seen] == [
        ("notify_start", "r2", {}), ("notify_end", "r2", {"outcome": "ok", "sent": "False"})]
