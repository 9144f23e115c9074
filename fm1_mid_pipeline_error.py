"""FM-1: a mid-pipeline error must not swallow the whole chord.

Symptom (fm0 on scenario 1): ``doc1`` raises, ``notify`` never runs and the
chord's result is a ``ChordError``; the document that parsed fine is never
reported, and nobody is told about the one that did not.

Root cause: a chord member in the FAILURE state. With the Redis backend,
``celery.backends.redis.RedisBackend.on_chord_part_return`` sees it when the
last member returns and hands the chord to
``celery.backends.base.Backend.chord_error_from_stack``: the body's errbacks
run, the body does not (Celery 5.5, 5.6 and 5.7 alike).

Fix: ``@enveloped`` (``shared/envelope.py``) under ``@app.task`` on every task.
Every exit becomes a SUCCESS state whose value is a ``Result`` with ``status``
FAILURE, ``error`` and ``reason``; ``notify`` aggregates ok and failed
documents. Celery's ``Retry`` (and ``Ignore``/``Reject``) pass through untouched.
The next task of a chain now receives an envelope: ``unwrap`` gives the payload,
or raises ``UpstreamFailed`` when the fetch failed.

Hard variant: a chain head that never runs. A fetch sent with an ``expires``
that passes before a worker takes it (or one revoked) is decided in the worker's
main process, before any body: ``celery.worker.request.Request.revoked`` calls
``_announce_revoked``, which stores REVOKED (``backend.mark_as_revoked``), acks the
message and sends ``task_revoked`` (Celery 5.5 to 5.7). ``mark_as_revoked`` passes
the outcome on only to a chord the task itself belongs to; a chain's head is none,
so its ``parse_document`` is never sent and the chord stays PENDING for ever
(``--prove``: side chord ``expired``, whose head is sent already expired).
``envelope_revoked(app)`` sends the rest of the chain on ``task_revoked`` with a
FAILURE envelope (reason ``expired`` or ``revoked``): ``doc31`` fails ``expired``
and the chord completes. Not covered: a chord *member* revoked itself is counted by
Celery as REVOKED and the chord fails with ``ChordError``; and a head that expires
while it waits in the broker is the broker's to drop (RabbitMQ gets Celery's
``expires`` as the message's ``expiration``, ``celery.app.base.Celery.send_task``):
without a dead-letter exchange (fm1, fm2) nobody hears of it; FM-3's DLQ catches it
(read in Celery 5.7.0 and RabbitMQ's documentation, not run). The lab revokes nothing by id: its
workers run without remote control, which a revoke travels by.

Delta from fm0: ``@enveloped`` on the three tasks; ``unwrap`` in parse_document, whose
argument is now an envelope (``Wire``); ``envelope_revoked`` for a chain head that never ran.

Tradeoffs: Celery's own state no longer says FAILURE for a failed document
(Flower shows SUCCESS); dashboards must read the envelope's ``status`` and
``reason``. Errbacks on the header tasks no longer fire.

Still open: a worker that dies mid-task loses the message (FM-2).

You will see (by hand; ``run_all_fms.py`` prints the same verdict and timeline):

- in the second shell: ``fm1 fixed (scenario 1 on fm1, ...): PASS``, an ``ok`` line for
  G1, then what happened to each document: ``doc1`` failed ``error``, ``doc2`` ok,
  ``notify`` sent, one email;
- in the worker's window, after Celery's banner (``app: rcl_fm1`` in the default namespace, ``<namespace>_fm1`` in yours):
  ``lab: doc1 failed for good on attempt 1: error (PermanentError: doc1 is malformed), in a
  SUCCESS-state envelope: the chord goes on`` and ``lab: notify (chord) ended ok; the email
  is sent``; nothing else.

Run it alone (from the repository's folder after ``make lab``; two shells):

    .venv/bin/celery -A fm1_mid_pipeline_error worker --without-gossip --without-mingle --without-heartbeat
    .venv/bin/python fm1_mid_pipeline_error.py

or ``.venv/bin/python run_all_fms.py --only fm1``. Ctrl-C in the second shell cancels the
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
