"""The benchmark's baseline: the lab's chord as a plain Celery program, with no lab code.

The same shape and business as the FM files (``bench/bench_chord.py`` runs both): a document is
read from a Redis document store (one GET, as ``lab.pipeline.fetch_text``), its words are counted,
and the chord's body collects the results. Two shapes:

- ``submit_chain``: one ``fetch_document | parse_document`` chain per document, body ``collect``
  (the FM files' shape: two messages and two stored results per document);
- ``submit_task``: one ``process_document`` task per document (fetch and parse in one body).

What is *not* here: envelopes, acks late, quorum queues, deadlines, retries, the notify claim, the
observer. Celery's defaults everywhere except JSON only, ``worker_concurrency = 2`` (fm7's), and
names under the namespace (``RCL_NAMESPACE``), so that it can share the lab's broker and Redis:
queue ``<namespace>.plain.tasks``, Redis keys under ``<namespace>:plain:`` (the result backend's
``global_keyprefix``; the document store's keys too). The body learns its documents from the
header's results, not from a list in its signature, so each message's size does not grow with N.

Worker: ``celery -A bench.plain_chord worker -c 2 --without-gossip --without-mingle --without-heartbeat``
(``bench/bench_chord.py`` starts and stops it).
"""

from __future__ import annotations

from typing import Any, TypedDict, cast

import redis
from celery import Celery, chain, chord, group
from celery.result import AsyncResult

from lab.settings import NAMESPACE, backend_url, broker_url  # the URLs and the namespace only: no signal, no task

QUEUE = f"{NAMESPACE}.plain.tasks"
PREFIX = f"{NAMESPACE}:plain:"
DOC_TTL_SECONDS = 3600

app = Celery(f"{NAMESPACE}_plain", broker=broker_url(), backend=backend_url())
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    result_accept_content=["json"],
    task_default_queue=QUEUE,
    task_default_exchange=QUEUE,
    task_default_routing_key=QUEUE,
    result_backend_transport_options={"global_keyprefix": PREFIX},
    result_expires=3600,
    control_exchange=f"{NAMESPACE}.plain.control",
    event_exchange=f"{NAMESPACE}.plain.events",
    worker_enable_remote_control=False,  # no pidbox queue outside the namespace
    worker_concurrency=2,  # as fm7
)


class Fetched(TypedDict):
    doc: str
    text: str


class Parsed(TypedDict):
    doc: str
    words: int


class Collected(TypedDict):
    ok: list[str]
    sent: bool


_store: tuple[int, redis.Redis] | None = None


def store() -> redis.Redis:
    """The document store's client, one per process (pool children fork)."""
    import os

    global _store
    if _store is None or _store[0] != os.getpid():
        _store = (os.getpid(), cast(Any, redis.Redis).from_url(backend_url(), decode_responses=True))
    return _store[1]


def doc_key(doc_id: str) -> str:
    return f"{PREFIX}doc:{doc_id}"


def put_documents(doc_ids: list[str]) -> None:
    """Fill the document store for a run (one pipeline; the benchmark does it before its clock starts)."""
    pipe = cast(Any, store()).pipeline(transaction=False)
    for doc_id in doc_ids:
        pipe.set(doc_key(doc_id), f"the text of {doc_id}", ex=DOC_TTL_SECONDS)
    pipe.execute()


def _fetch(doc_id: str) -> Fetched:
    text = cast(str | None, store().get(doc_key(doc_id)))
    if text is None:
        raise LookupError(f"no document {doc_id!r} in the store")
    return {"doc": doc_id, "text": text}


def _parse(document: Fetched) -> Parsed:
    return {"doc": document["doc"], "words": len(document["text"].split())}


@app.task
def fetch_document(doc_id: str) -> Fetched:
    return _fetch(doc_id)


@app.task
def parse_document(document: Fetched) -> Parsed:
    return _parse(document)


@app.task
def process_document(doc_id: str) -> Parsed:
    return _parse(_fetch(doc_id))


@app.task
def collect(results: list[Parsed], pipeline_id: str) -> Collected:
    return {"ok": [r["doc"] for r in results], "sent": True}  # the "email" of the FM files' notify


@app.task
def probe() -> str:
    return "pong"


def submit_chain(doc_ids: list[str], pipeline_id: str) -> AsyncResult[Any]:
    """One ``fetch | parse`` chain per document, ``collect`` once every chain has returned."""
    header = group(chain(fetch_document.s(d), parse_document.s()) for d in doc_ids)
    return chord(header)(collect.s(pipeline_id))


def submit_task(doc_ids: list[str], pipeline_id: str) -> AsyncResult[Any]:
    """One ``process_document`` task per document, ``collect`` once every one has returned."""
    return chord(group(process_document.s(d) for d in doc_ids))(collect.s(pipeline_id))
