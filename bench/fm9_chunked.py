"""fm9 chunked: the final FM's program with ``size`` documents per task, for ``bench/bench_chord.py``.

Not an FM file (the FM files stay one document per task, the lesson's shape): the same app,
settings, queues, drain, FM-8's store guard and notify claim as ``fm9_connection_loss``
(imported, not copied), and the same decorator stack on each task, but a chain's head fetches a chunk of documents and its
parse counts the words of each. Per chunk, one ``fetch_documents | parse_documents`` chain; the
body ``notify_chunks`` reads the manifest (every document id, in header order) and gives each
chunk's envelope to its documents: a failed chunk fails each of its documents with its reason.

What chunking trades away: a fault of one document fails its chunk (its attempts, retries and
deadlines are the chunk's), and the observer records no document's attempts (it knows one
document per task: ``lab.observe``). So this is the throughput a pipeline that can take a
chunk's fate gets, measured; not a fix.

Worker: ``RCL_BENCH_FM=bench.fm9_chunked`` ``bench/fm_worker.py`` (fm9's flags: ``-B``,
``REMAP_SIGTERM=SIGQUIT``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from celery import Task, chain, chord, group
from celery.result import AsyncResult

import fm9_connection_loss as fm9
from lab.pipeline import Failed, Fetched, Parsed, Summary, fetch_text, parse, send_email
from shared.claim import ClaimBusy, NotifyClaim, release_when_dead_lettered
from shared.envelope import Result, Wire, enveloped, is_envelope, unwrap
from shared.manifest import read_manifest, write_manifest
from shared.retry import RetryPolicy, transient_retryable
from shared.timeouts import BackstopRequest, hard_timeout

app = fm9.app
WORKER_ENV = fm9.WORKER_ENV
CHUNK_SIZES = (10, 50)


@app.task(bind=True, time_limit=3, Request=BackstopRequest)  # FM-6
@enveloped  # FM-1
@hard_timeout(1.5, soft=1)  # FM-6
def fetch_documents(self: Task[Any, Any], doc_ids: list[str]) -> list[Fetched]:
    return [{"doc": d, "text": fetch_text(d)} for d in doc_ids]


@app.task(bind=True, time_limit=3, Request=BackstopRequest)  # FM-6
@enveloped  # FM-1
@transient_retryable(RetryPolicy(max_retries=3, base=0.1), wait_in=fm9.QUEUE)  # FM-5
@hard_timeout(1.5, soft=1)  # FM-6
def parse_documents(self: Task[Any, Any], fetched: Wire) -> list[Parsed]:
    documents: list[Fetched] = unwrap(fetched)  # FM-1
    return [parse(d) for d in documents]


def summarise_chunks(results: Sequence[object], doc_ids: Sequence[str], size: int) -> Summary:
    """Result ``i`` is the chunk of ``doc_ids[i * size:(i + 1) * size]`` (header order)."""
    ok: list[str] = []
    failed: list[Failed] = []
    for i, raw in enumerate(results):
        chunk = doc_ids[i * size:(i + 1) * size]
        envelope = Result.from_wire(raw) if is_envelope(raw) else None
        if envelope is not None and envelope.ok:
            ok += [str(p["doc"]) for p in cast(list[Parsed], envelope.payload)]
        else:
            reason = (envelope.reason or "error") if envelope is not None else "error"
            error = (envelope.error or "") if envelope is not None else f"not an envelope: {raw!r}"
            failed += [Failed(doc=d, reason=reason, error=error) for d in chunk]
    return {"ok": ok, "failed": failed, "sent": False}


@app.task(bind=True, time_limit=15, Request=BackstopRequest)  # FM-6
@enveloped  # FM-1
@transient_retryable(fm9.BACKEND_GONE, wait_in=fm9.QUEUE)  # FM-8
@hard_timeout(10, soft=8)  # FM-6
def notify_chunks(self: Task[Any, Any], results: list[Wire], pipeline_id: str, size: int) -> Summary:
    summary = summarise_chunks(results, read_manifest(app, pipeline_id), size)
    claim = NotifyClaim.of(app, pipeline_id, owner=self.request.id)  # FM-4
    if (state := claim.acquire()) == "busy":  # FM-4
        raise fm9.BUSY.retry(self, ClaimBusy(pipeline_id), claim.policy.poll)  # FM-4
    if state == "done":  # FM-4
        return {**summary, "sent": False}
    with claim.sending():  # FM-4
        send_email(pipeline_id, summary, idempotency_key=claim.key)  # FM-4
    return {**summary, "sent": True}


release_when_dead_lettered(app, notify_chunks)  # FM-4


def submit(doc_ids: list[str], pipeline_id: str, size: int) -> AsyncResult[Any]:
    """One ``fetch_documents | parse_documents`` chain per ``size`` documents; ``notify_chunks`` once all returned."""
    write_manifest(app, pipeline_id, doc_ids)
    chunks = [doc_ids[i:i + size] for i in range(0, len(doc_ids), size)]
    header = group(chain(fetch_documents.s(c), parse_documents.s()) for c in chunks)
    return chord(header)(notify_chunks.s(pipeline_id, size))
