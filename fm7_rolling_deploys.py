"""FM-7: a rolling deploy must not lose, repeat or dead-letter work.

Symptom (fm6's code, scenario 7): the lab deploys the worker three times, as Kubernetes does,
while 32 slow but healthy documents run. A new worker starts. The old one gets SIGTERM, then
SIGKILL when a short grace period ends. At the SIGKILL the old worker is still inside a slow
body: that work is lost. Every message it held goes back to the broker and counts as a
delivery. A healthy document that three deploys meet is dead-lettered.

Root cause: SIGTERM starts Celery's warm shutdown. It waits for every running body, so a grace
shorter than a body ends in SIGKILL. The worker holds 8 messages (a prefetch of 4 for each of
2 processes). RabbitMQ 3.x counts every return against FM-3's delivery limit, started or not.

Fix:

- ``worker_prefetch_multiplier = 1`` (every Celery 5): with late acks a worker holds only
  what its processes run. A deploy hands back almost nothing unstarted.
- ``WORKER_ENV`` sets ``REMAP_SIGTERM=SIGQUIT`` in the worker's environment (billiard reads it
  at start, under Celery 5.5 to 5.7): SIGTERM becomes Celery's cold shutdown.
- ``worker_soft_shutdown_timeout = 0.3`` (Celery 5.5+): running bodies get 0.3 s. Then Celery
  stops them, and their messages go back unacknowledged to start afresh.
- ``worker_deduplicate_successful_tasks = True`` (Celery 5.1+): a redelivered message whose
  result is stored as SUCCESS is acked without running again.
- ``count_stored_members(app)`` (``shared/stored_members.py``; Celery 5.5 to 5.7): a member
  killed or cancelled after its result is stored, before the chord counts it, is counted once.
- ``send_back=True`` on the drain (``shared/dlq.py``; Celery 5.5 to 5.7): a dead letter
  whose process never crashed goes back to its queue, at most 5 times.

Costs: a body cut at a deploy starts again: make it idempotent (FM-4). The grace must cover
the soft timeout, one body and Celery's own stop (over 1 s). Prefetch 1 costs a broker round trip
per message. ``REMAP_SIGTERM`` is not a setting: the deployment must set it.

Still open: the result backend going away mid-chord (FM-8).

Run it (one shell each; the submitter says when to start the new version and to stop
the old worker, with each command):

    REMAP_SIGTERM=SIGQUIT .venv/bin/celery -A fm7_rolling_deploys worker --without-gossip --without-mingle --without-heartbeat -B
    .venv/bin/python fm7_rolling_deploys.py

Or run ``.venv/bin/python run_all_fms.py --only fm7``. The old worker prints ``lab: cold shutdown``
and Celery's ``Initiating Soft Shutdown``.

Deeper: lessons/fm7/README.md (the walkthrough), docs/failure-modes.md (section FM-7) and docs/celery-versions.md.
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
    return drain(app, DLQ, send_back=True)  # FM-7: a letter whose deliveries were not its own attempts goes back


def submit(doc_ids: list[str], pipeline_id: str) -> AsyncResult[Any]:
    """One ``fetch | parse`` chain per document; ``notify`` once every chain has returned."""
    write_manifest(app, pipeline_id, doc_ids)  # the ids once, for notify: not in its signature, which every message carries
    header = group(chain(fetch_document.s(d), parse_document.s()) for d in doc_ids)
    return chord(header)(notify.s(pipeline_id))


if __name__ == "__main__":  # submit the scenario to a worker you started, then check it
    from lab.by_hand import run_by_hand

    raise SystemExit(run_by_hand(__file__))
