"""FM-8: the result backend goes away mid-chord.

Symptom (fm7 on scenario 8): the run's result backend is a Redis the lab owns (its own
``redis-server``, append-only file on, ``lab.outage``). While the side chord ``outage`` runs (12
slow but healthy documents, 0.8 s of parse each), the runner stops that Redis once two parses have
ended and others still run, and starts it again 4 s later, its data intact. Every parse that ends
in those 4 s has returned its envelope, and its result cannot be stored. fm7 acks those messages:
the work is done, its outcome is nowhere, and the chord waits for members that will never report
(``--prove``, one run: ``10 stores failed; acked with the outcome unstored: doc68 (parse_document),
...; outage chord PENDING``, 12 s after the backend came back). No ``notify``, no email, nothing in the
DLQ; the worker's window says ``Exception raised outside body: ConnectionError`` once per member.

Root cause: the store comes after the body. ``celery.app.trace.build_tracer``'s ``trace_task`` calls
``backend.mark_as_done`` once the body returned; its ``ConnectionError`` (after the backend
client's own retries, ``lab.app.BACKEND_RETRY_POLICY``, 1.5 s) lands in the outer ``except``:
``report_internal_error`` and the ``task_internal_error`` signal, and the worker's main process gets
a failure. ``celery.worker.request.Request.on_failure`` then acks a late-acked message unless told
otherwise: ``task_acks_on_failure_or_timeout`` (True by default) on 5.5 and 5.6; on 5.7
``task_acks_on_failure``, which falls back to it (``celery.app.task.Task`` reads both). FM-1's envelope
does not help: it is the very result that cannot be stored.

The settings alone are not the fix. With ``task_acks_on_failure = False`` (5.7;
``task_acks_on_failure_or_timeout = False`` on 5.5 and 5.6) the message is rejected into FM-3's
dead-letter exchange, but Celery still tries to store the member's FAILURE, in the pool
(``handle_failure``) and in the main process (``Request.on_failure``), each with the backend's
retries: a backend back within them records the member as failed, the chord counts it, and the
chord fails (``ChordError: Dependency ... raised ConnectionError``, one run in two on 5.6.3 here).

Fix:

- ``reject_unstored(app)`` (``shared.backend``, Celery 5.5 to 5.7): the app's Redis backend class
  gains a guard: a task whose own result (SUCCESS, RETRY or FAILURE) cannot be stored raises
  ``ResultNotStored``, a ``Reject`` without requeue, instead of the ``ConnectionError``, and a
  FAILURE that is only that is never stored. ``Request.on_failure`` rejects a ``Reject`` before
  anything else, on all three versions (5.7 first records it as FAILURE, ``celery#4222``: the guard
  stores nothing there), so the message goes to the dead-letter exchange with nothing acked and
  nothing recorded. Only a task's own result, in the process running it: the drain and the main
  process still see the backend's own errors. And not a chain's head: ``celery.app.trace`` sends
  the chain's next step before it stores the head's result (inline in ``trace_task`` on 5.5,
  ``_dispatch_callbacks_and_chain`` on 5.6 and 5.7), with the result in it, so a head run again
  would send its parse twice (run twice, and on 5.5 and 5.6 counted twice in the chord, claim C11);
  its lost store is logged and its message acked (claim C21: the backend gone while all 12 heads
  run; each parse runs, the chord counts each document once);
- ``drain(..., send_back_rejected=True)``: FM-7's send-back for a letter dead-lettered
  ``rejected`` (``shared.dlq``): one whose crashes (starts less ends) are below the bound is
  published again to its queue, at most 5 times; it runs again and stores its outcome. The drain
  reads the start counters from the backend, so while it is gone it keeps every letter in the DLQ
  (``dead_letter_kept``) and sends them back on its first pass after the return;
- ``BACKEND_GONE`` on ``notify`` (``@transient_retryable``): the claim's Redis is the backend's
  (FM-4). A ``ConnectionError`` from it is FM-1's terminal ``error`` envelope without this, and in a
  blip shorter than the result store's retries that envelope is stored once the blip is over: no
  email (seen on fm6's code when this FM was designed; not a lab run). It is a retry
  (backoff 0.5 s doubling, jittered, 6 times: 31 s at least). In a longer outage the retry is
  published first (``Task.retry``) and its ``RETRY`` state cannot be stored: the message is
  rejected as well, so ``notify`` comes back more than once (4 runs after the return in a run here);
  the claim and the mail API's idempotency key (FM-4) keep it to one email. Scenario 8 stops the
  backend while ``notify`` holds its claim and sends (the lab's mail API waits for the runner):
  the email goes out, the claim cannot be marked sent, and the next run sends again under the same
  key, which the mail API deduplicates.

G8 (the side chord ``outage``; two outages of 4 s: while members store, while ``notify`` holds its
claim): the chord completes, all 12 documents ok, each once, one email, within 12 s of the
backend's last return (0.07 to 0.20 s in runs here: the drain's next pass, 0.25 s apart, and
one parse); every member or ``notify`` whose store failed runs again, and every head whose store
failed has its parse run (no message acked with its outcome lost); none parsed in two processes at
once.

Hard variant (``tests/test_celery_claims.py``, claim C20): the backend comes back empty (no
persistence). What it held is gone: the results already stored, the chord's counter and the
results it had gathered, the manifest, the claim, FM-3's start counters. The members that report
after the restart never make a full chord, and nothing fails: the chord is PENDING for good. The
fix here cannot rebuild what the backend lost; the test shows what is still known (the run's
observations, which are on another Redis here) and the remedy: persistence on the backend
(``appendonly yes``), and a submitter that waits with a deadline and submits the pipeline again
(FM-4's claim and key make a second email impossible only while the claim's key survives).

Delta from fm7: ``reject_unstored``, ``send_back_rejected`` and ``BACKEND_GONE``.

Tradeoffs: a rejected message goes through the DLQ to the tail of its queue, and its document is
parsed again: make the work idempotent (FM-4). FM-3's start counters live in the backend, so an
outage loses them (``sent back ..., 0 started``): the drain cannot tell a poison message whose
crashes went uncounted and sends it back, up to 5 times. A chain head whose store failed has no
stored result: FM-7's deduplication cannot skip it if a deploy later hands its message back, and
anything that reads the head's state sees PENDING. ``result_backend_always_retry`` is the other way, not taken: its
retries run after the body, where no in-body deadline guards them, so Celery's ``time_limit``
(FM-6's backstop, 3 s) ends a long outage with a ``time_limit`` envelope for a body that succeeded
(seen on fm6's code when this FM was designed; not a lab run).

Still open: the broker drops the worker's connection mid-task (FM-9).

You will see (by hand; ``run_all_fms.py`` prints the same verdict and timeline):

- in the submitter's shell: ``fm8 fixed (scenario 8 on fm8, ...): PASS``, an ``ok`` line for each
  of G1..G8, then the lanes fm7 lists, and the side chord ``outage``: doc66 to doc77 ok, a document
  whose store failed with a second attempt;
- in the worker's window, after Celery's banner (``results:`` the backend's URL): the lines fm7
  lists, and per member that met the outage ``ResultNotStored: SUCCESS of ... not stored, the
  result backend is gone`` and, from the drain, ``dead letter ... sent back to its queue: rejected
  with its outcome unstored``.

Run it alone (from the repository's folder after ``make lab``; a worker shell and the submitter's,
both with the same two variables: the backend a Redis of your own that you may stop, the lab's
observations on the shared one):

    REMAP_SIGTERM=SIGQUIT .venv/bin/celery -A fm8_backend_outage worker --without-gossip --without-mingle --without-heartbeat -B
    .venv/bin/python fm8_backend_outage.py

with, in every shell first, ``export CELERY_RESULT_BACKEND=redis://127.0.0.1:16379/0
RCL_OBSERVATIONS_URL=redis://127.0.0.1:6379/0`` and a Redis of your own started on that port
(``redis-server --port 16379 --appendonly yes --dir /tmp``). Scenario 8 holds scenario 7: deploy
as fm7's docstring says while the side chord ``deploy`` runs (a second worker with ``-n
second@%h``, then SIGTERM of the first). Once the submitter's shell shows the side chord
``outage`` running, stop your Redis (``redis-cli -p 16379 shutdown``) and start it again a few
seconds later: G8 by hand asks that at least one store failed and that every document still ends
ok, once, with one email. Or ``.venv/bin/python run_all_fms.py --only fm8``, which starts, stops
and removes a Redis of its own. Ctrl-C in the submitter's shell cancels the run (exit status 130).
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
