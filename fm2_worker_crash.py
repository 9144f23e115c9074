"""FM-2: a worker process that dies mid-task must not lose the message.

Symptom (fm1 on scenario 2): ``doc3``'s pool process is SIGKILLed on its first
attempt (an OOM kill, a node drained). ``doc3`` is attempted once, never again;
the chord result is ``ChordError`` naming ``WorkerLostError``; ``notify`` never runs.

Root cause: early acknowledgement. By default the worker acks a message as soon
as a pool process accepts it (``celery.worker.request.Request.on_accepted``
calls ``acknowledge`` unless the task is ``acks_late``; Celery 5.5 to 5.7), before the body runs,
so RabbitMQ has already forgotten it when the process dies. The main process
then reports ``WorkerLostError`` and ``Request.on_failure`` stores it with
``backend.mark_as_failure``, which also tells the chord (``on_chord_part_return``).

Fix: ``task_acks_late = True`` (ack after the body returns) plus
``task_reject_on_worker_lost = True``. In ``Request.on_failure``, a
``WorkerLostError`` of an ``acks_late`` task with ``reject_on_worker_lost`` is
rejected with ``requeue=True`` and *not* marked failed: RabbitMQ delivers it
again, ``doc3`` succeeds on attempt 2, the chord completes. Without
``reject_on_worker_lost``, ``acks_late`` alone acks the lost message
(``acks_on_failure`` in Celery 5.7, ``acks_on_failure_or_timeout`` in 5.5 and 5.6;
true by default) and marks it failed: the chord still breaks (tried:
removing either setting fails G2 with ``doc3 attempts 1``).

Celery 5.5 and 5.6: a process that dies *after* its result was stored (in a
``task_postrun`` handler, or killed on its way back to the main process) is
requeued too, runs again, and its second result counts in the chord join a
second time (the Redis backend's join adds each distinct result,
``RedisBackend.on_chord_part_return``): the body goes one member short
(``tests/test_celery_claims.py``, C11). Celery 5.7's ``Request.on_failure`` asks
the backend first (``_success_was_stored``) and acks such a task, and its join
counts a task id once. The lab's kills happen inside the body, before any result,
so G2 holds on all three; on 5.5 and 5.6 the window stays open, with no setting
to close it: upgrade, or keep what runs after the body's return trivial.

From here on the lab runs two pool processes (``worker_concurrency = 2``). This
fix does not need them: with one, the replacement process takes the requeued
message and G2 still holds. The lab's scenario 4 does, and ``--prove`` runs it
on fm3's code: two ``notify`` calls must overlap, which takes two slots.

Delta from fm1: ``task_acks_late``, ``task_reject_on_worker_lost`` and ``worker_concurrency``.

Tradeoffs: at-least-once. A task can now run twice (its side effects too),
so it must be idempotent (FM-4 deals with ``notify``). A message that kills
its worker every time is redelivered for ever (FM-3).

You will see (by hand; ``run_all_fms.py`` prints the same verdict and timeline):

- in the second shell: ``fm2 fixed (scenario 2 on fm2, ...): PASS``, an ``ok`` line for
  each of G1 and G2, then what happened to each document: as fm1 lists it, and ``doc3`` killed on
  attempt 1 (``killed: the process died``), ok on attempt 2;
- in the worker's window, after Celery's banner (``app: rcl_fm2`` in the default namespace, ``<namespace>_fm2`` in yours):
  the two ``lab:`` lines fm1 lists, and for the lab's one kill, where stock Celery prints an
  ``ERROR`` with a ``WorkerLostError`` traceback, two lines (``lab/worker_log.py``):
  ``expected: the lab killed pool process ForkPoolWorker-N (pid ...): scenario fault
  CRASH_ONCE on doc3, parse_document attempt 1`` and ``expected: doc3's parse_document lost
  its process (WorkerLostError): Celery requeues it (acks_late + reject_on_worker_lost):
  the broker delivers it again``; then ``lab: doc3 ok on attempt 2``.

Run it alone (from the repository's folder after ``make lab``; two shells):

    .venv/bin/celery -A fm2_worker_crash worker --without-gossip --without-mingle --without-heartbeat
    .venv/bin/python fm2_worker_crash.py

or ``.venv/bin/python run_all_fms.py --only fm2``. Ctrl-C in the second shell cancels the
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
