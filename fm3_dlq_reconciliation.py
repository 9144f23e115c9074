"""FM-3: a poison message must stop somewhere, and the chord must still complete.

Symptom (fm2's code, scenario 3): ``doc4`` is poison: it kills its process on every attempt.
FM-2's fix requeues it each time. Its attempts never stop, a pool slot is burnt on it, and
``notify`` never runs.

Root cause: FM-2 puts no bound on redelivery. A requeued message comes back with the same
headers, and Celery's retry count does not see it.

Fix (``shared/dlq.py``; RabbitMQ 3.x, Celery 5.5 to 5.7):

- ``DeadLetteringQueue``: the task queue becomes a quorum queue with ``x-delivery-limit: 2``
  and a dead-letter exchange. RabbitMQ 3.x delivers ``doc4`` 3 times, then moves it to the
  dead-letter queue. The queue declares that queue itself, so no dead letter is dropped.
- ``DLQ``: the dead-letter queue. No worker consumes it as a task queue.
- ``drain_dead_letters`` on ``beat_schedule`` (the worker's ``-B`` runs it every 0.25 s):
  for each dead letter it stores a failure envelope, reason ``dead_lettered``, as that chord
  member's result. The chord completes. A letter it cannot place goes to a parking queue.
- ``count_starts(app)``: counts real starts per task id. A dead letter then says how many
  deliveries were real attempts.

Costs: a dead-lettered document is reported failed, not retried; an operator must look. The
chord waits up to one drain period more. A worker killed whole returns every message it held,
and each return counts as a delivery: keep the limit above such losses.

Still open: a duplicated ``notify`` sends two emails (FM-4).

Run it (two shells, in the repository's folder, after ``make lab``):

    .venv/bin/celery -A fm3_dlq_reconciliation worker --without-gossip --without-mingle --without-heartbeat -B
    .venv/bin/python fm3_dlq_reconciliation.py

The second shell prints ``PASS``; ``doc4`` is killed 3 times, then dead-lettered. The worker
says each kill in ``expected:`` lines, then ``lab: doc4 dead-lettered``. Its only warnings
are the drain's, for letters it parks. Or run ``.venv/bin/python run_all_fms.py --only fm3``.

Deeper: lessons/fm3/README.md (the walkthrough), docs/failure-modes.md (section FM-3) and docs/celery-versions.md.
"""

from __future__ import annotations

from typing import Any

from celery import Task, chain, chord, group
from celery.result import AsyncResult
from kombu import Exchange, Queue

from lab.app import lab_app
from lab.faults import lab_fault
from lab.pipeline import Fetched, Parsed, Summary, fetch_text, parse, send_email, summarise
from shared.dlq import DeadLetteringQueue, count_starts, drain
from shared.envelope import Wire, envelope_revoked, enveloped, unwrap
from shared.manifest import read_manifest, write_manifest

app = lab_app(__name__)  # JSON only; queue, exchanges and result keys under the FM's namespace
envelope_revoked(app)  # FM-1: a chain head revoked or expired before it ran hands its chain a FAILURE envelope
app.conf.task_acks_late = True  # FM-2: ack when the body has returned
app.conf.task_reject_on_worker_lost = True  # FM-2: a process that dies requeues its message
app.conf.worker_concurrency = 2  # two pool processes: the lab's scenario 4 needs two slots
QUEUE = app.conf.task_default_queue  # FM-3: its dead letters go to QUEUE.dlq, which no worker consumes
DLQ = Queue(f"{QUEUE}.dlq", Exchange(f"{QUEUE}.dlx"), routing_key=f"{QUEUE}.dlq")  # FM-3
app.conf.task_queues = [DeadLetteringQueue(QUEUE, Exchange(QUEUE), routing_key=QUEUE, dead_letters=DLQ,  # FM-3
    queue_arguments={"x-queue-type": "quorum", "x-delivery-limit": 2,  # FM-3: RabbitMQ 3.x delivers 3 times at most
                     "x-dead-letter-exchange": DLQ.exchange.name, "x-dead-letter-routing-key": DLQ.routing_key})]
app.conf.beat_schedule = {"drain": {"task": f"{__name__}.drain_dead_letters", "schedule": 0.25}}  # FM-3: -B
count_starts(app)  # FM-3: starts per task id, so a dead letter tells its deliveries from its real attempts


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


@app.task(ignore_result=True)
def drain_dead_letters() -> int:  # FM-3: finalise each dead letter as a failure; park what it cannot place
    return drain(app, DLQ)


def submit(doc_ids: list[str], pipeline_id: str) -> AsyncResult[Any]:
    """One ``fetch | parse`` chain per document; ``notify`` once every chain has returned."""
    write_manifest(app, pipeline_id, doc_ids)  # the ids once, for notify: not in its signature, which every message carries
    header = group(chain(fetch_document.s(d), parse_document.s()) for d in doc_ids)
    return chord(header)(notify.s(pipeline_id))


if __name__ == "__main__":  # submit the scenario to a worker you started, then check it
    from lab.by_hand import run_by_hand

    raise SystemExit(run_by_hand(__file__))
