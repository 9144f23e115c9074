"""FM-4: a duplicated ``notify`` must not send a second email.

Symptom (fm3's code, scenario 4): a second ``notify`` for the same pipeline arrives while the
first is sending. That happens after a lost ack, or when an operator fires it again. The lab
also kills the sender twice: before it sends, and right after. Every call that reaches the
mail API sends: three emails.

Root cause: at-least-once delivery, which FM-2 and FM-3 chose on purpose. Nothing in Celery
deduplicates a task by a business key.

Fix (``shared/claim.py``; Celery 5.5 to 5.7):

- ``NotifyClaim``: a Redis key per pipeline, set only if absent (``SET NX``), with a 60 s
  expiry. The first ``notify`` claims, sends, and marks it sent. A concurrent one waits and
  asks again. A later one returns ``sent=False``. The owner's own redelivery resumes its claim.
- ``busy_waits(QUEUE)``: a waiting ``notify`` waits in the broker, in delay queues beside the
  task queue ``QUEUE`` (FM-5 explains them), not in the worker's memory.
- ``idempotency_key=claim.key`` on ``send_email``: an owner killed after sending, before it
  marks the claim sent, sends again. The mail API delivers one key once.
- ``release_when_dead_lettered(app, notify)``: a ``notify`` that FM-3's drain finalised as
  dead-lettered releases its claim, so a re-fired one need not wait for the expiry.

Costs: exactly one email needs a receiver that honours the key; the claim alone narrows the
window. A dead owner is recovered by its redelivery, or else after the expiry. Busy waits cost
broker round trips.

Still open: a transient error fails a document for good (FM-5).

Run it (two shells, in the repository's folder, after ``make lab``):

    .venv/bin/celery -A fm4_duplicated_runs worker --without-gossip --without-mingle --without-heartbeat -B
    .venv/bin/python fm4_duplicated_runs.py

The second shell prints ``PASS`` and one email. The worker says both kills in ``expected:``
lines, then ``lab: notify (duplicate) ended ok; sent=False``. Or run
``.venv/bin/python run_all_fms.py --only fm4``.

Deeper: lessons/fm4/README.md (the walkthrough), docs/failure-modes.md (section FM-4) and docs/celery-versions.md.
"""

from __future__ import annotations

from typing import Any

from celery import Task, chain, chord, group
from celery.result import AsyncResult
from kombu import Exchange, Queue

from lab.app import lab_app
from lab.faults import lab_fault
from lab.pipeline import Fetched, Parsed, Summary, fetch_text, parse, send_email, summarise
from shared.claim import ClaimBusy, NotifyClaim, busy_waits, release_when_dead_lettered
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
BUSY = busy_waits(QUEUE)  # FM-4: a busy notify waits in the broker (delay queues, FM-5's way), not in the worker


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
    claim = NotifyClaim.of(app, pipeline_id, owner=self.request.id)  # FM-4: SET NX; the owner's redelivery resumes it
    if (state := claim.acquire()) == "busy":  # FM-4: another notify is sending; it may still fail
        raise BUSY.retry(self, ClaimBusy(pipeline_id), claim.policy.poll)  # FM-4: ask again later; outlast the claim's TTL
    if state == "done":  # FM-4: already sent
        return {**summary, "sent": False}
    with claim.sending():  # FM-4: released if sending fails, marked sent if it succeeds
        send_email(pipeline_id, summary, idempotency_key=claim.key)  # FM-4: the mail API delivers a key once
    return {**summary, "sent": True}


release_when_dead_lettered(app, notify)  # FM-4: a notify the drain finalised as dead-lettered releases its claim


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
