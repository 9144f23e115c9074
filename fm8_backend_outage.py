"""FM-8: the result backend may go away mid-chord; no finished work may be lost.

Symptom (fm7's code, scenario 8): the run's result backend is a Redis the lab owns. While 8
slow documents parse, the lab stops it for 2 s, then starts it again with its data. A parse
that ends in those seconds cannot store its result, yet fm7 acks its message. The work is
done, its outcome is nowhere, and the chord stays PENDING for ever.

Root cause: Celery stores a result after the body returns. A failed store is a failure outside
the body, and Celery acks a late-acked message on failure by default. FM-1's envelope cannot
help: it is the very result that cannot be stored.

Fix (``shared/backend.py`` and ``shared/dlq.py``; Celery 5.5 to 5.7):

- ``reject_unstored(app)``: a task whose own result cannot be stored raises
  ``ResultNotStored``, a reject without requeue. The message goes to FM-3's dead-letter queue;
  nothing is acked or stored. A chain's first task stays acked: its next step is sent already.
- ``send_back_rejected=True`` on the drain: such a letter goes back to its queue, runs again
  and stores its outcome. While the backend is gone, the drain keeps it.
- ``BACKEND_GONE`` on ``notify``: the claim lives in the backend's Redis. A ``ConnectionError``
  there is retried with backoff, 6 times. FM-4's claim and key keep it to one email.

Turning acks on failure off is not enough: Celery still stores FAILURE if the backend is back
in time, and the chord fails.

Costs: a rejected document is parsed again at the tail of its queue. An outage loses FM-3's
start counters, so a poison letter may be sent back up to 5 times.

Still open: the broker drops the worker's connection mid-task (FM-9).

Run it: start the lab's Redis for your result backend, ``.venv/bin/python -m lab.hand backend start``;
in both shells, the ``export`` line the submitter prints until it is set:

    REMAP_SIGTERM=SIGQUIT .venv/bin/celery -A fm8_backend_outage worker --without-gossip --without-mingle --without-heartbeat -B
    .venv/bin/python fm8_backend_outage.py

The submitter says when to deploy (as FM-7), to stop that Redis and to start it again, each command
in full. The worker says each lost store in one ``expected:`` line. Or run
``.venv/bin/python run_all_fms.py --only fm8``.

Deeper: lessons/fm8/README.md (the walkthrough), docs/failure-modes.md (section FM-8) and docs/celery-versions.md.
"""

from __future__ import annotations

from typing import Any

import redis
from celery import Task, chain, chord, group
from celery.result import AsyncResult
from kombu import Exchange, Queue

from lab.app import lab_app
from lab.faults import lab_fault
from lab.pipeline import Fetched, Parsed, Summary, fetch_text, parse, send_email, summarise
from shared.backend import reject_unstored
from shared.claim import ClaimBusy, NotifyClaim, busy_waits, release_when_dead_lettered
from shared.dlq import DeadLetteringQueue, count_starts, drain
from shared.envelope import Wire, envelope_revoked, enveloped, unwrap
from shared.manifest import read_manifest, write_manifest
from shared.retry import RetryPolicy, transient_retryable
from shared.stored_members import count_stored_members
from shared.timeouts import BackstopRequest, hard_timeout

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
app.conf.worker_prefetch_multiplier = 1  # FM-7: a worker holds (nearly) only what it runs; a deploy returns few unstarted
app.conf.worker_soft_shutdown_timeout = 0.3  # FM-7 (Celery 5.5+): after SIGTERM running bodies get 0.3 s, then go back
WORKER_ENV = {"REMAP_SIGTERM": "SIGQUIT"}  # FM-7: SIGTERM starts the soft/cold shutdown (Celery reads it at start only)
app.conf.worker_deduplicate_successful_tasks = True  # FM-7 (5.1+): a redelivered task stored SUCCESS is not run
count_stored_members(app)  # FM-7: a member killed between its result's store and its count is counted once
reject_unstored(app)  # FM-8: a result the backend cannot store rejects its message, into the DLX: nothing acked or stored
BACKEND_GONE = RetryPolicy(max_retries=6, base=0.5, retry_on=(redis.ConnectionError, redis.TimeoutError))  # FM-8: 31.5 to 63 s in all


@app.task(bind=True, time_limit=3, Request=BackstopRequest)  # FM-6: every task has a deadline; Celery's kills last
@enveloped  # FM-1: every exit is a SUCCESS-state envelope
@hard_timeout(1.5, soft=1)  # FM-6: asks at 1 s, then raises HardTimeout at 1.5 s, inside the body only
def fetch_document(self: Task[Any, Any], doc_id: str) -> Fetched:
    return {"doc": doc_id, "text": fetch_text(doc_id)}  # a document store stands in for S3


@app.task(bind=True, time_limit=3, Request=BackstopRequest)  # FM-6: the backstop; its kill is still an envelope
@enveloped  # FM-1
@transient_retryable(RetryPolicy(max_retries=3, base=0.1), wait_in=QUEUE)  # FM-5: backoff, jitter; waits in the broker
@hard_timeout(1.5, soft=1)  # FM-6: SIGALRM asks (SoftTimeLimitExceeded) at 1 s, raises HardTimeout at 1.5 s
def parse_document(self: Task[Any, Any], fetched: Wire) -> Parsed:
    document: Fetched = unwrap(fetched)  # FM-1: the fetch's envelope; UpstreamFailed if it failed
    lab_fault(self, document)  # the lab: what the scenario does to this document
    return parse(document)


@app.task(bind=True, time_limit=15, Request=BackstopRequest)  # FM-6
@enveloped  # FM-1
@transient_retryable(BACKEND_GONE, wait_in=QUEUE)  # FM-8: the claim's Redis gone is a wait, not the end
@hard_timeout(10, soft=8)  # FM-6: the chord body too (it may wait for a busy claim's owner)
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
    return drain(app, DLQ, send_back=True, send_back_rejected=True)  # FM-8: and one rejected with its outcome unstored


def submit(doc_ids: list[str], pipeline_id: str) -> AsyncResult[Any]:
    """One ``fetch | parse`` chain per document; ``notify`` once every chain has returned."""
    write_manifest(app, pipeline_id, doc_ids)  # the ids once, for notify: not in its signature, which every message carries
    header = group(chain(fetch_document.s(d), parse_document.s()) for d in doc_ids)
    return chord(header)(notify.s(pipeline_id))


if __name__ == "__main__":  # submit the scenario to a worker you started, then check it
    from lab.by_hand import run_by_hand

    raise SystemExit(run_by_hand(__file__))
