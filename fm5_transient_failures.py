"""FM-5: a transient error deserves another attempt, a bounded number of times.

Symptom (fm4 on scenario 5): ``doc5`` meets a 503 from a downstream service
twice and would have parsed on the third try; ``@enveloped`` records the first
error as terminal, so ``doc5`` fails after 1 attempt.

Root cause: every exception is terminal; nothing tells a transient error from
a permanent one.

Fix: ``@transient_retryable(RetryPolicy(...), wait_in=QUEUE)`` (``shared/retry.py``)
between ``@enveloped`` and the body: a ``TransientError`` is retried with
Celery's ``Task.retry`` after ``0.1 * 2**k`` seconds times a jitter in ``[1, 2)``
(at least the ``Retry-After`` the error carries), at most 3 times; then it raises
``RetriesExhausted`` and ``@enveloped`` records reason ``retries_exhausted``.
``doc5`` succeeds on attempt 3; ``doc6`` (503 for ever) fails after 4
attempts; each planned delay falls in its doubling band and no observed gap is
shorter than its planned delay.

Hard variant: a burst of waiting retries (``doc12``..``doc27``, each a 429 with
``Retry-After: 1.5``). A plain countdown retry is an ETA message that the worker
holds, unacknowledged, until it is due, and on FM-3's quorum queue the prefetch
is static (``celery.worker.consumer.tasks.Tasks.qos_global``, Celery 5.5 to 5.7, turns global QoS
off; RabbitMQ does not apply a later per-consumer ``basic.qos`` to a running
consumer): sixteen waiting retries fill the prefetch of 8 (2 processes x
multiplier 4) and new work waits until they come due (``--prove``: a probe sent
while the burst waits is taken by the worker only after the first of its retries
ran and was acked).
``wait_in=QUEUE`` keeps waiting retries in the broker: delay queues
``QUEUE.retry.<bucket>.<slice>`` with a per-message TTL that dead-letter back to
``QUEUE`` (``shared/retry.py`` says how, and why not Celery's native delayed
delivery, there since 5.5: it needs a topic exchange and broker-wide ``celery_delayed_*`` names).
G5: the worker takes the probe off the broker (its ``task_received``) within 0.5 s, or
before any retry of the burst ended, and every
burst document is ok after 2 attempts.

Delta from fm4: ``@transient_retryable`` with its ``RetryPolicy`` and ``wait_in`` on parse_document.

Tradeoffs: the lab's base delay is 0.1 s to stay fast; production uses
seconds and a cap. A retry waits behind an older one in its delay queue (TTLs
expire at the head only): it may run up to a quarter of its delay band late,
never early. Only errors you declare transient are retried.

Still open: a hung call pins a worker slot for ever (FM-6).

You will see (by hand; ``run_all_fms.py`` prints the same verdict and timeline):

- in the second shell: ``fm5 fixed (scenario 5 on fm5, ...): PASS``, an ``ok`` line for
  each of G1..G5, then the lanes fm4 lists, and: ``doc5`` ``raised error, retried after`` about 150
  and 250 ms, ok on attempt 3; ``doc6`` retried 3 times, then ``raised retries_exhausted``;
  ``doc12`` to ``doc27`` (the burst) each retried once after 1500 ms, then ok;
- in the worker's window, after Celery's banner (``app: rcl_fm5`` in the default namespace, ``<namespace>_fm5`` in yours):
  the lines fm4 lists, and one ``lab:`` line per retry (``lab: doc5 attempt 1 raised TransientError:
  503 from the parser service (attempt 1); retry 1 in 0.15s``; the burst's say ``429 ...
  Retry-After 1.5s; retry 1 in 1.50s``), one per recovery (``lab: doc5 ok on attempt 3``,
  ``lab: doc12 ok on attempt 2`` ...) and ``lab: doc6 failed for good on attempt 4:
  retries_exhausted (...)``.

Run it alone (from the repository's folder after ``make lab``; two shells):

    .venv/bin/celery -A fm5_transient_failures worker --without-gossip --without-mingle --without-heartbeat -B
    .venv/bin/python fm5_transient_failures.py

or ``.venv/bin/python run_all_fms.py --only fm5``. Ctrl-C in the second shell cancels the
run (exit status 130); the next run first waits for what the worker had already taken.
Add ``--loglevel=INFO`` to the worker to see Celery's own line for every task as well.
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
@transient_retryable(RetryPolicy(max_retries=3, base=0.1), wait_in=QUEUE)  # FM-5: backoff, jitter; waits in the broker
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
