"""FM-4: a duplicated ``notify`` must not send a second email.

Symptom (fm3 on scenario 4): a second ``notify`` for the same pipeline arrives
while the first is sending (a redelivery after a lost ack, an operator who
re-fires the body). Both send: two emails.

Root cause: at-least-once delivery, which FM-2 and FM-3 chose on purpose.
Nothing in Celery deduplicates a task by business key.

Fix: a claim in Redis per pipeline id (``shared/claim.py``): ``SET NX`` with a
TTL marks it ``claimed``, the owner sends and marks it ``sent``. A concurrent
``notify`` finds it ``claimed`` and busy-retries (``Task.retry``, 50 ms) in
case the owner fails and releases; a later one finds ``sent`` and returns
``sent=False``. The scenario makes the overlap certain: the first ``notify``
waits at a gate (inside the mail stand-in) after claiming, and the runner opens
the gate only once the duplicate has seen the claim (its first retry).

Delta from fm3: ``NotifyClaim`` in notify: ``acquire``, ``self.retry`` while
busy, ``"sent": False`` when done, ``claim.sending()`` around ``send_email``.

Tradeoffs: an owner that sends and dies before marking ``sent`` leaves a claim
that expires (60 s), and the next attempt sends again: at-most-twice in that
window, unless the mail provider also deduplicates on the pipeline id.
Busy-retries cost broker round trips while the owner works.

Still open: a transient error fails a document for good (FM-5).

Run it alone (two shells, services up):

    celery -A fm4_duplicated_runs worker --without-gossip --without-mingle --without-heartbeat -B
    python fm4_duplicated_runs.py

or ``python run_all_fms.py --only fm4``.
"""

from __future__ import annotations

from typing import Any

from celery import Task, chain, chord, group
from celery.result import AsyncResult
from kombu import Exchange, Queue

from lab.app import lab_app
from lab.faults import lab_fault
from lab.pipeline import Fetched, Parsed, Summary, fetch_text, parse, send_email, summarise
from shared.claim import NotifyClaim
from shared.dlq import DeadLetteringQueue, drain
from shared.envelope import Wire, enveloped, unwrap

app = lab_app(__name__)  # JSON only; queue, exchanges and result keys under the FM's namespace
app.conf.task_acks_late = True  # FM-2: ack when the body has returned
app.conf.task_reject_on_worker_lost = True  # FM-2: a process that dies requeues its message
app.conf.worker_concurrency = 2  # two pool processes: the lab's scenario 4 needs two slots
QUEUE = app.conf.task_default_queue  # FM-3: its dead letters go to QUEUE.dlq, which no worker consumes
DLQ = Queue(f"{QUEUE}.dlq", Exchange(f"{QUEUE}.dlx"), routing_key=f"{QUEUE}.dlq")  # FM-3
app.conf.task_queues = [DeadLetteringQueue(QUEUE, Exchange(QUEUE), routing_key=QUEUE, dead_letters=DLQ,  # FM-3
    queue_arguments={"x-queue-type": "quorum", "x-delivery-limit": 2,  # FM-3: RabbitMQ 3.x delivers 3 times at most
                     "x-dead-letter-exchange": DLQ.exchange.name, "x-dead-letter-routing-key": DLQ.routing_key})]
app.conf.beat_schedule = {"drain": {"task": f"{__name__}.drain_dead_letters", "schedule": 0.25}}  # FM-3: -B


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
def notify(self: Task[Any, Any], results: list[Wire], doc_ids: list[str], pipeline_id: str) -> Summary:
    summary = summarise(results, doc_ids)
    claim = NotifyClaim.of(app, pipeline_id, owner=self.request.id)  # FM-4: SET NX in the backend's Redis
    if (state := claim.acquire()) == "busy":  # FM-4: another notify is sending; it may still fail
        raise self.retry(countdown=0.05, max_retries=400)
    if state == "done":  # FM-4: already sent
        return {**summary, "sent": False}
    with claim.sending():  # FM-4: released if sending fails, marked sent if it succeeds
        send_email(pipeline_id, summary)
    return {**summary, "sent": True}


@app.task(ignore_result=True)
def drain_dead_letters() -> int:  # FM-3: finalise each dead-lettered chord member as a failure
    return drain(app, DLQ)


def submit(doc_ids: list[str], pipeline_id: str) -> AsyncResult[Any]:
    """One ``fetch | parse`` chain per document; ``notify`` once every chain has returned."""
    header = group(chain(fetch_document.s(d), parse_document.s()) for d in doc_ids)
    return chord(header)(notify.s(doc_ids, pipeline_id))


if __name__ == "__main__":  # submit the scenario to a worker you started, then check it
    from lab.harness import run_by_hand

    raise SystemExit(run_by_hand(__file__))
