"""FM-0: the naive pipeline, FM-1's bug on display.

One line: a chord whose header task raises never runs its body.

Symptom: scenario 1 makes ``doc1`` raise. The chord's body, ``notify``, never
runs: no email, and the chord's result is a FAILURE holding ``ChordError``
("Dependency ... raised PermanentError('doc1 is malformed')"). It does not
hang: the Redis backend fails the chord as soon as the last member returns.

Root cause: ``celery.backends.redis.RedisBackend.on_chord_part_return`` counts
the members; once all have returned it decodes their states and a FAILURE one
makes it call ``chord_error_from_stack`` (``celery.backends.base``), which
runs the body's errbacks and stores the body as FAILURE instead of calling it.
(Read in Celery 5.5.3, 5.6.3 and 5.7.0, where it is the same; ``make matrix`` runs
S1 on each.)

Fix: none here. FM-1 (``fm1_mid_pipeline_error.py``) adds ``@enveloped``.

The program: ``submit`` sends a chord whose header is one
``fetch_document | parse_document`` chain per document and whose body is
``notify``. ``lab_app`` is a plain Celery app with JSON only and every name
under the FM's namespace (``lab/app.py``); ``fetch_text`` and ``send_email``
stand in for a document store and a mail API (``lab/pipeline.py``); the one lab
line, ``lab_fault``, does to a document what the scenario wrote into it.

You will see (by hand; ``run_all_fms.py`` prints the same verdict and timeline):

- in the second shell: ``fm0 bug (scenario 1 on fm0, ...): BUG REPRODUCED``, an ``ok``
  line for S1 (``notify ran 0x; chord result FAILURE ChordError``), then what happened to
  each document: ``doc1`` failed ``error`` on attempt 1, ``doc2`` ok, ``notify never ran``;
- in the worker's window, after Celery's banner (``app: rcl_fm0`` in the default namespace, ``<namespace>_fm0`` in yours):
  ``expected: fm0_naive.parse_document[...] raised PermanentError: doc1 is malformed
  (scenario fault FAIL) ...`` and ``expected: the chord failed: ChordError ... so notify
  never runs``, each one line where Celery would print a traceback (``lab/worker_log.py``).

Run it alone (from the repository's folder after ``make lab``; two shells):

    .venv/bin/celery -A fm0_naive worker --without-gossip --without-mingle --without-heartbeat
    .venv/bin/python fm0_naive.py

or ``.venv/bin/python run_all_fms.py --include-fm0 --only fm0`` (reported as BUG REPRODUCED). Ctrl-C in the second shell cancels the
run (exit status 130); the next run first waits for what the worker had already taken.
Add ``--loglevel=INFO`` to the worker to see Celery's own line for every task as well.
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
