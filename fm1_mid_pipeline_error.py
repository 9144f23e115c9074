"""FM-1: a document that fails must not sink the whole chord.

Symptom (fm0's code, scenario 1): ``doc1`` raises. ``notify``, the chord's body, never runs.
The chord's result is a ``ChordError``. The document that parsed fine is never reported.
Nobody hears about the one that failed.

Root cause: a chord member in Celery's FAILURE state. The Redis result backend then fails the
whole chord: the body's error callbacks run, the body does not.

Fix (each works on Celery 5.5 to 5.7):

- ``@enveloped`` (``shared/envelope.py``) under ``@app.task`` on every task. Every exit
  becomes a SUCCESS-state ``Result``, the envelope. Its ``status`` says FAILURE and its
  ``reason`` says why. ``notify`` counts ok and failed documents.
- ``unwrap`` in ``parse_document`` takes the payload out of the fetch's envelope. If the fetch
  failed, it raises ``UpstreamFailed``, which becomes the parse's own envelope.
- ``envelope_revoked(app)``: a chain's first task (its head) may expire before a worker runs
  it. Celery then never sends the rest of the chain, and the chord waits for ever. This hook
  sends the rest a FAILURE envelope with reason ``expired``.

Costs: Celery's own state says SUCCESS for a failed document. Dashboards such as Flower must
read the envelope's ``status`` and ``reason``. Error callbacks on the header tasks no longer
fire.

Still open: a worker process that dies mid-task loses its message (FM-2).

Run it (two shells, in the repository's folder, after ``make lab``):

    .venv/bin/celery -A fm1_mid_pipeline_error worker --without-gossip --without-mingle --without-heartbeat
    .venv/bin/python fm1_mid_pipeline_error.py

The second shell prints ``PASS`` and what happened to each document. The worker prints
``lab: doc1 failed for good ...`` and ``lab: notify (chord) ended ok``. A ``lab:`` line says
what the lab saw recover or end. Or run ``.venv/bin/python run_all_fms.py --only fm1``.

Deeper: lessons/fm1/README.md (the walkthrough), docs/failure-modes.md (section FM-0 / FM-1) and docs/celery-versions.md.
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
app.conf.task_acks_late = False  # Celery's default: ack as soon as a pool process takes the task
app.conf.task_reject_on_worker_lost = False  # Celery's default: a lost process fails its task
app.conf.worker_concurrency = 1  # one pool process


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
