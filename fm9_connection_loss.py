"""FM-9: the broker drops the worker's connection mid-task.

Symptom (fm8 on scenario 9): two side chords run on a RabbitMQ node the lab owns (``lab.connloss``:
its consumer timeout 2.4 s, checked every 0.1 s), served by a second worker of the same code that
reaches the node through a link the runner can cut (``lab.link``). Side ``connloss``: while one slow
member parses alone, the runner cuts the worker's connections, as a network blip or a failover does.
RabbitMQ requeues the member's unacked message, the worker reconnects within milliseconds and takes
the message again, and nothing stops the first run. On 5.6 and 5.7 the copy runs in the free pool
process while the first goes on (``--prove``, one run: ``doc78 attempt 2 began 0.28s after attempt 1,
which still ran``): the chord counts it once (FM-7's ``worker_deduplicate_successful_tasks`` cannot help,
nothing is stored yet), but the document's work ran twice at once, two writes, two calls to whatever it
calls. On 5.5 the copy waited in some runs here (received at once, started only once the first had
ended; why is not read off Celery's source here): the first run went on to its end with its message already
given back (``doc78 attempt 1 ran on 0.71s after the cut to its end (ok), its message back 0.08s after
the cut``), its ack lost, and FM-7's deduplication skipped the copy only because the first stored in time. Side ``overlong``: a member stuck in
C code, which only Celery's ``time_limit`` (3 s, FM-6) ends, holds its message past the node's consumer
timeout. RabbitMQ closes the channel, ``PRECONDITION_FAILED - delivery acknowledgement on channel 1
timed out``, and the worker exits (status 1): every task it ran is requeued, and the over-long message
goes to the next worker, which it ends the same way.

Root cause: RabbitMQ requeues what a closed connection or channel held unacked; Celery does not stop
what was running. ``celery.worker.consumer.consumer.Consumer.start`` treats only the transport's
connection errors as recoverable unless ``broker_channel_error_retry`` is set, so a channel error (the
406) escapes and ends the worker; on a connection error it reconnects
(``on_connection_error_after_connected``) and, unless ``worker_cancel_long_running_tasks_on_connection_loss``
is set, leaves the late-acked tasks running ("In Celery 5.1 we introduced an optional breaking change
...", the warning it logs; the default becomes True in 6.0). Their acks can no longer be sent (``Couldn't
ack ..., reason: RecoverableConnectionError``). And nothing bounds a task below the broker's
``consumer_timeout`` (30 min by default since RabbitMQ 3.8.17): Celery cannot read it.

Fix:

- ``broker_channel_error_retry = True`` (Celery 5.3+): a channel the broker closed is a reconnect, not
  the end of the worker;
- ``worker_cancel_long_running_tasks_on_connection_loss = True`` (5.1+): on a lost connection the worker
  cancels every late-acked task it ran (``Request.cancel``: SIGTERM to its pool process; the lab's
  observer records the body as ``cancelled``), before the broker's redelivery can reach a free process;
  the redelivered message runs once more, from the start: the work must be idempotent (FM-4);
- ``within_consumer_timeout(app, CONSUMER_TIMEOUT)`` (``shared.consumer_timeout``): the app states the
  broker's timeout (``RCL_CONSUMER_TIMEOUT``, seconds; RabbitMQ's 1800 by default) and every task's
  ``time_limit`` is lowered to half of it where higher, with a warning at import (one it gives a task that
  had none, at debug level). The cancel above cannot end a process stuck in C code: billiard's SIGTERM
  handler in a pool process is Python, which runs only when the C call returns (``shared.timeouts``,
  FM-6). With the limit the kill comes first, at 1.2 s on the lab's node: FM-6's ``time_limit`` envelope,
  the message acked, no 406. With 1800 s nothing of the lab changes (its longest limit is 15 s).

Hard variant (``--prove``, fm9w: the two settings without ``within_consumer_timeout``): the worker survives
the 406 and cancels ``doc81``, which stays stuck in C, and its message comes back (S9 hard). Seen in
runs here: 5.7 and 5.6 ran it a second time (2.8 s and 7.9 s after the first began) and the broker timed
it out again; 5.5 never ended it within the run while the broker closed the worker's channel every 2.5 s.

G9 (sides ``connloss`` and ``overlong``): the cut happened once while a member ran; that run cancelled,
none ran on with its message given back, none parsed in two processes at once; both chords SUCCESS, each document once, one email each; the linked worker
never exited; the over-long member parsed once and ended as an envelope, ``time_limit``.

Delta from fm8: ``broker_channel_error_retry``, ``worker_cancel_long_running_tasks_on_connection_loss``,
``CONSUMER_TIMEOUT`` and ``within_consumer_timeout``.

Tradeoffs: a cancel throws away work in progress, and the redelivery starts it again (the cut in
scenario 9 costs one slow parse); it also cancels the drain (FM-3) that ran at that moment, which the
next pass repeats. Each redelivery counts against FM-3's delivery limit (3 deliveries on RabbitMQ 3.x):
a document whose connection drops twice while it runs is dead-lettered, and FM-7's send-back finds it
innocent (its starts, not its deliveries, are counted). ``within_consumer_timeout`` caps the kill, not
the in-body deadlines (FM-6): on a broker whose timeout is below twice those deadlines (the lab's node:
1.2 s against the parse's 1.5 s), a Python hang ends as ``time_limit`` instead of ``hard_timeout``.
The cap holds only where the worker reads the task's own limit: a ``time_limit`` passed with
``apply_async`` is not lowered.

Still open: nothing of FM-1 to FM-9; the audit of your own app (``docs/audit.md``) checks these
settings in yours.

You will see (by hand; ``run_all_fms.py`` prints the same verdict and timeline):

- in the submitter's shell: ``fm9 fixed (scenario 9 on fm9, ...): PASS``, an ``ok`` line for each of G1
  to G9, the lanes fm8 lists, then the side chords ``connloss`` (doc78 ok with a ``cancelled`` first
  attempt where the harness cut the link) and ``overlong`` (doc81 failed: time_limit, doc82 ok);
- in the worker's window: the lines fm8 lists, and after a drop ``Connection to broker lost. Trying to
  re-establish the connection...``, then ``Task ... cannot be acknowledged after a connection loss since
  late acknowledgement is enabled for it. Terminating it instead.``

Run it alone (from the repository's folder after ``make lab``; a worker shell and the submitter's):

    REMAP_SIGTERM=SIGQUIT .venv/bin/celery -A fm9_connection_loss worker --without-gossip --without-mingle --without-heartbeat -B
    .venv/bin/python fm9_connection_loss.py

with, in both shells first, fm8's two variables (a Redis of your own as the backend, the observations on
the shared one) and, if your RabbitMQ's ``consumer_timeout`` is not the default,
``export RCL_CONSUMER_TIMEOUT=<its seconds>``. To drop the worker's connection and no one else's, start
``.venv/bin/python -m lab.link`` in a third shell first and, in the worker's shell only, the
``export CELERY_BROKER_URL=...`` it prints: each Enter there cuts what goes through it. Scenario 9 holds
scenarios 7 and 8: deploy and stop your Redis as fm8's docstring says. While the side chord ``connloss``
runs, press Enter in the link's shell; ``doc81`` ends at its ``time_limit`` (3 s) on a broker with the
default timeout. Or ``.venv/bin/python run_all_fms.py --only fm9``, which starts, cuts and removes a node
and a link of its own. Ctrl-C in the submitter's shell cancels the run (exit status 130).
"""

from __future__ import annotations

import os
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
from shared.consumer_timeout import DEFAULT_CONSUMER_TIMEOUT, within_consumer_timeout
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
app.conf.broker_channel_error_retry = True  # FM-9 (5.3+): a channel closed by the broker (406) is a reconnect, not the end
app.conf.worker_cancel_long_running_tasks_on_connection_loss = True  # FM-9 (5.1+): a lost connection ends what it requeued
CONSUMER_TIMEOUT = float(os.environ.get("RCL_CONSUMER_TIMEOUT", DEFAULT_CONSUMER_TIMEOUT))  # FM-9: the broker's, in seconds


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


within_consumer_timeout(app, CONSUMER_TIMEOUT)  # FM-9: every time_limit at most half of it: a task ends before its channel


def submit(doc_ids: list[str], pipeline_id: str) -> AsyncResult[Any]:
    """One ``fetch | parse`` chain per document; ``notify`` once every chain has returned."""
    write_manifest(app, pipeline_id, doc_ids)  # the ids once, for notify: not in its signature, which every message carries
    header = group(chain(fetch_document.s(d), parse_document.s()) for d in doc_ids)
    return chord(header)(notify.s(pipeline_id))


if __name__ == "__main__":  # submit the scenario to a worker you started, then check it
    from lab.by_hand import run_by_hand

    raise SystemExit(run_by_hand(__file__))
