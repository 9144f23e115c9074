"""FM-0: the naive pipeline, where one failing document sinks the whole chord.

Symptom (scenario 1): the program is a chord. Its header is one ``fetch_document |
parse_document`` chain per document; its body, ``notify``, sends one email. The lab makes
``doc1`` raise. ``notify`` never runs, so no email goes out. The chord's result is a FAILURE
holding a ``ChordError`` that names ``doc1``'s error. It does not hang: the chord fails as soon
as the last member returns.

Root cause: one member of the chord ends in Celery's FAILURE state. When the last member
returns, the Redis result backend sees that state and fails the chord. It runs the body's
error callbacks instead of the body.

Fix: none here. FM-1 adds ``@enveloped``.

Costs: none yet. Every later FM is this program plus one fix.

Still open: everything FM-1 to FM-9 fix, starting with this bug (FM-1).

Run it (two shells, in the repository's folder, after ``make lab``):

    .venv/bin/celery -A fm0_naive worker --without-gossip --without-mingle --without-heartbeat
    .venv/bin/python fm0_naive.py

The second shell prints ``BUG REPRODUCED``. The worker prints an ``expected:`` line for
``doc1``'s error and one for the failed chord. An ``expected:`` line is a fault the lab caused,
said where Celery would print a traceback. Or run
``.venv/bin/python run_all_fms.py --include-fm0 --only fm0``.

Deeper: docs/failure-modes.md (section FM-0 / FM-1) and docs/celery-versions.md.
"""

from __future__ import annotations

from typing import Any

from celery import Task, chain, chord, group
from celery.result import AsyncResult

from lab.app import lab_app
from lab.faults import lab_fault
from lab.pipeline import Fetched, Parsed, Summary, fetch_text, parse, send_email, summarise
from shared.manifest import read_manifest, write_manifest

app = lab_app(__name__)  # JSON only; queue, exchanges and result keys under the FM's namespace
app.conf.task_acks_late = False  # Celery's default: ack as soon as a pool process takes the task
app.conf.task_reject_on_worker_lost = False  # Celery's default: a lost process fails its task
app.conf.worker_concurrency = 1  # one pool process


@app.task(bind=True)
def fetch_document(self: Task[Any, Any], doc_id: str) -> Fetched:
    return {"doc": doc_id, "text": fetch_text(doc_id)}  # a document store stands in for S3


@app.task(bind=True)
def parse_document(self: Task[Any, Any], document: Fetched) -> Parsed:
    lab_fault(self, document)  # the lab: what the scenario does to this document
    return parse(document)


@app.task(bind=True)
def notify(self: Task[Any, Any], results: list[Parsed], pipeline_id: str) -> Summary:
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
