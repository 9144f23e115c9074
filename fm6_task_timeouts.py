"""FM-6: a hung task must end inside its body, so the chord still completes.

Symptom (fm5 on scenario 6): ``doc8`` hangs and ignores every polite request.
Its pool slot is pinned for as long as it hangs; ``notify`` never runs.

Root cause: no deadline inside the body. Celery's own ``time_limit`` alone is
not enough: on expiry the worker kills the pool process, and
``celery.worker.request.Request.on_timeout`` (hard branch) calls
``backend.mark_as_failure`` with ``TimeLimitExceeded``. That puts the chord
member in the FAILURE state, so the chord fails with ``ChordError`` (FM-1's
symptom again) and ``notify`` does not run (``tests/test_celery_claims.py``
runs exactly that: this file without ``@hard_timeout``).

Fix: ``@hard_timeout(1.5)`` (``shared/timeouts.py``, ``SIGALRM`` through
``setitimer``) raises ``HardTimeout`` inside the body, which ``@enveloped``
records as reason ``hard_timeout``. ``soft_time_limit=1`` asks first:
``SoftTimeLimitExceeded`` stops ``doc7``, which cooperates, and is recorded as
``soft_timeout``. ``time_limit=5`` stays as the backstop for what a signal
cannot interrupt (C code that never returns to the interpreter). Scenario 6 has
no such code, so G6 holds without the backstop (tried); removing
``@hard_timeout`` or ``soft_time_limit`` fails G6.

Delta from fm5: ``@hard_timeout``, ``soft_time_limit`` and ``time_limit`` on parse_document.

Tradeoffs: a limit sized for the slowest legitimate document; ``SIGALRM`` is
process-wide and main-thread only (prefork, not threads or gevent); a
timed-out document is not retried. (celery-types types the task's limits as
whole seconds, so the lab uses 1 and 5; Celery itself takes floats.)

Run it alone (two shells, services up):

    celery -A fm6_task_timeouts worker --without-gossip --without-mingle --without-heartbeat -B
    python fm6_task_timeouts.py

or ``python run_all_fms.py --only fm6``.
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
from shared.retry import RetryPolicy, transient_retryable
from shared.timeouts import hard_timeout

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


@app.task(bind=True, soft_time_limit=1, time_limit=5)  # FM-6: ask first; Celery's kill is the backstop
@enveloped  # FM-1
@transient_retryable(RetryPolicy(max_retries=3, base=0.1))  # FM-5: TransientError, backoff with jitter
@hard_timeout(1.5)  # FM-6: SIGALRM raises HardTimeout inside the body
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
