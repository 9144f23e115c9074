"""A wrong answer to FM-1's exercise: the chord member catches every exception and returns the error as data.

No member fails now, so the chord completes and notify sends its email. But the error comes back as a plain value
the summary cannot tell from a parse: doc1 is reported ok, and the email says every document went through. The
expired chain head is not handled either.
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
def parse_document(self: Task[Any, Any], document: Fetched) -> Parsed | dict[str, str]:
    try:
        lab_fault(self, document)  # the lab: what the scenario does to this document
        return parse(document)
    except Exception as exc:  # a failing document must not fail the chord
        return {"doc": document["doc"], "error": f"{type(exc).__name__}: {exc}"}


@app.task(bind=True)
def notify(self: Task[Any, Any], results: list[Parsed | dict[str, str]], pipeline_id: str) -> Summary:
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
