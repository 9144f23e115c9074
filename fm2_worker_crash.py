"""FM-2: a worker process that dies mid-task must not lose its message.

Symptom (fm1's code, scenario 2): ``doc3``'s pool process is killed (SIGKILL) on its first
attempt, as an out-of-memory kill would. ``doc3`` is never tried again. The chord's result
is a ``ChordError`` naming ``WorkerLostError``, and ``notify`` never runs.

Root cause: early acknowledgement. By default the worker acks a message as soon as a pool
process takes it, before the body runs. RabbitMQ has forgotten the message when the process
dies. Celery then stores the task as failed, and the chord fails.

Fix (each setting is in every Celery the lab runs, 5.5 to 5.7):

- ``task_acks_late = True``: ack only after the body returns.
- ``task_reject_on_worker_lost = True``: a task whose process died is rejected with requeue,
  not stored as failed. RabbitMQ delivers it again; ``doc3`` succeeds on attempt 2. Without
  it, a late ack still acks the lost message, and the chord still breaks.
- ``worker_concurrency = 2``: two pool processes. This fix works with one; the lab's
  scenario 4 needs two ``notify`` calls at once.

Costs: at-least-once delivery. A task can now run twice, side effects included, so it must
be idempotent (FM-4 does that for ``notify``).

Still open: a message that kills its process every time is redelivered for ever (FM-3).

Run it (two shells, in the repository's folder, after ``make lab``):

    .venv/bin/celery -A fm2_worker_crash worker --without-gossip --without-mingle --without-heartbeat
    .venv/bin/python fm2_worker_crash.py

The second shell prints ``PASS``; ``doc3`` is killed once, then ok. For the kill the worker
prints two ``expected:`` lines where Celery prints an ``ERROR`` and a traceback, then
``lab: doc3 ok on attempt 2``. Or run ``.venv/bin/python run_all_fms.py --only fm2``.

Deeper: lessons/fm2/README.md (the walkthrough), docs/failure-modes.md (section FM-2) and docs/celery-versions.md.
"""

from __future__ import annotations

from typing import Any

from celery import Task, chain, chord, group
from celery.result import AsyncResult

from lab.app import lab_app
from lab.faults import lab_fault
from lab.pipeline import Fetched, Parsed, Summary, fetch_text, parse, send_email, summarise
from shared.envelope import Wire, envelope_revoked, enveloped, unwrap
from shared.manifest import read_manifest, write_manifest

app = lab_app(__name__)  # JSON only; queue, exchanges and result keys under the FM's namespace
envelope_revoked(app)  # FM-1: a chain head revoked or expired before it ran hands its chain a FAILURE envelope
app.conf.task_acks_late = True  # FM-2: ack when the body has returned
app.conf.task_reject_on_worker_lost = True  # FM-2: a process that dies requeues its message
app.conf.worker_concurrency = 2  # two pool processes: the lab's scenario 4 needs two slots


@app.task(bind=True)
@enveloped  # FM-1: every exit is a SUCCESS-state envelope
def fetch_document(self: Task[Any, Any], doc_id: str) -> Fetched:
    return {"doc": doc_id, "text": fetch_text(doc_id)}  # a document store stands in for S3


@app.task(bind=True)
@enveloped  # FM-1
def parse_document(self: Task[Any, Any], fetched: Wire) -> Parsed:
    document: Fetched = unwrap(fetched)  # FM-1: the fetch's envelope; UpstreamFailed if it failed
    lab_fault(self, document)  # the lab: what the scenario does to this document
    return parse(document)


@app.task(bind=True)
@enveloped  # FM-1
def notify(self: Task[Any, Any], results: list[Wire], pipeline_id: str) -> Summary:
    summary = summarise(results, read_manifest(app, pipeline_id))  # the documents, from the manifest
    send_email(pipeline_id, summary)
    return {**summary, "sent": True}


def submit(doc_ids: list[str], pipeline_id: str) -> AsyncResult[Any]:
    """One ``fetch | parse`` chain per document; ``notify`` once every chain has returned."""
    write_manifest(app, pipeline_id, doc_ids)  # the ids once, for notify: not in its signature, which every message carries
    header = group(chain(fetch_document.s(d), parse_document.s()) for d in doc_ids)
    return chord(header)(notify.s(pipeline_id))


if __name__ == "__main__":  # submit the scenario to a worker you started, then check it
    from lab.by_hand import run_by_hand

    raise SystemExit(run_by_hand(__file__))
