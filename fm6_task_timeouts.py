"""FM-6: a hung task must end inside its body, so the chord still completes.

Symptom (fm5 on scenario 6): ``doc8`` hangs and ignores every polite request.
Its pool slot is pinned for as long as it hangs; ``notify`` never runs.

Root cause: no deadline inside the body. Celery's own ``time_limit`` alone is
not enough: on expiry billiard's ``TimeoutHandler.on_hard_timeout`` fails the
job, which calls ``celery.worker.request.Request.on_failure``, then calls
``Request.on_timeout`` (hard branch), then kills the pool process; both Celery
calls store FAILURE with ``TimeLimitExceeded`` (``backend.mark_as_failure``; Celery
5.5 to 5.7 with billiard 4.3.2, and 5.7's ``on_timeout`` also runs ``Task.on_failure``
and the ``task_failure`` signal).
The chord member is FAILURE, the chord fails with ``ChordError`` (FM-1's
symptom again) and ``notify`` does not run (``tests/test_celery_claims.py``
runs exactly that: this file without ``@hard_timeout``).

Fix (``shared/timeouts.py``; in-body deadlines first, Celery's limit as the backstop only):

- ``@hard_timeout(1.5, soft=1)`` (``SIGALRM`` through ``setitimer``, started when
  the body starts and cancelled when it ends) asks first: at 1 s it raises
  Celery's own ``SoftTimeLimitExceeded`` inside the body, which stops ``doc7``,
  which cooperates (``@enveloped`` records ``soft_timeout``); at 1.5 s it raises
  ``HardTimeout`` in whatever Python code runs: ``doc8`` swallows
  ``SoftTimeLimitExceeded`` and ends ``hard_timeout``. ``HardTimeout`` is a
  ``BaseException``, so ``doc10``, whose body is wrapped in ``except Exception:
  continue``, cannot swallow it either (a test in ``tests/test_retry_and_timeout.py``
  shows an ``Exception`` subclass swallowed by the same body);
- no ``soft_time_limit``: Celery's soft limit is billiard's ``SIGUSR1`` from the
  worker's main process, on a timer of its own (``TimeoutHandler.on_soft_timeout``),
  and its handler (``billiard.pool.soft_timeout_sighandler``) raises wherever the pool
  process is, also after the body returned, while ``celery.app.trace`` stores the
  result: there ``@enveloped`` cannot catch it, the trace stores FAILURE and the
  chord breaks. ``doc28`` ends its body at 0.7 s and its result store then stalls
  for 1 s (the lab's backend, as a slow Redis would): with ``soft_time_limit=1``
  (``--prove``) its member is FAILURE ``SoftTimeLimitExceeded``; with the in-body
  deadline, ended with the body, it is ok;
- ``time_limit=3`` with ``Request=BackstopRequest`` for what no signal handler
  reaches: ``doc11`` spins in one C call (``sum(range(n))``), which returns to
  the interpreter only when it ends, so the ``SIGALRM`` handler never runs.
  Celery kills the process at 3 s; ``BackstopRequest``, the worker-side request
  class, stores a SUCCESS-state envelope with reason ``time_limit`` through
  ``backend.mark_as_done`` instead of FAILURE, acks, and the chord completes.
  Without it (``--prove``) that same member is FAILURE ``TimeLimitExceeded``.
  A time limit that lands outside the body is an envelope too: ``doc30``'s store
  stalls past 3 s, the process is killed with no result stored, and
  ``BackstopRequest`` records ``time_limit``;
- every task has a deadline: the same stack on ``fetch_document`` (``doc29``'s fetch,
  the chain's head, hangs: ``hard_timeout`` at 1.5 s, its parse records it) and a
  longer one on ``notify`` (10 s, soft at 8, ``time_limit`` 15: it may wait at
  FM-4's claim). Without them a hung head pins its slot (``--prove``).

G6: ``doc7`` soft_timeout, ``doc8`` and ``doc10`` hard_timeout, ``doc11`` and ``doc30``
time_limit, ``doc28`` ok after its stalled store, ``doc29`` hard_timeout of its fetch,
the chord completes, and a probe task is served at once afterwards.

Delta from fm5: ``@hard_timeout`` (with ``soft``), ``time_limit`` and ``Request`` on the three tasks.

Tradeoffs: a limit sized for the slowest legitimate document; ``SIGALRM`` is
process-wide and main-thread only (prefork, not threads or gevent); a
timed-out document is not retried; a process killed at ``time_limit`` runs no
``finally`` and its pool process is replaced. The lab's backstop is 3 s, short
so that the lab stays fast; it must stay above the hard timeout by the time an
envelope takes to be stored. A store slower than the backstop's margin loses a
result that was computed (``doc30``: recorded as ``time_limit``). (celery-types
types the task's limits as whole seconds, so the lab uses 1 and 3; Celery itself
takes floats.)

You will see (by hand; ``run_all_fms.py`` prints the same verdict and timeline):

- in the second shell: ``fm6 fixed (scenario 6 on fm6, ...): PASS``, an ``ok`` line for
  each of G1..G6, then the lanes fm5 lists, and: ``doc7`` ``raised soft_timeout`` after 1 s;
  ``doc8`` and ``doc10`` ``raised hard_timeout`` after 1.5 s; ``doc11`` ``killed: the
  process died``, its final state ``failed: time_limit``; ``doc28`` ok; ``doc29``
  ``failed: hard_timeout`` (its fetch); ``doc30`` ``failed: time_limit``;
- in the worker's window, after Celery's banner (``app: rcl_fm6`` in the default namespace,
  ``<namespace>_fm6`` in yours): the lines fm5 lists; ``lab: doc7 failed for good on attempt
  1: soft_timeout (SoftTimeLimitExceeded: ... ran past its soft deadline of 1s)`` and the
  same with ``hard_timeout`` for doc8 and doc10 (no ``Soft time limit exceeded`` line of
  Celery's: no Celery soft limit is set); ``lab: doc29's fetch failed for good: hard_timeout``;
  ``lab: doc28's body returned; its result store stalls 1.0s``, and nothing after it: no
  limit fires outside the body; for doc11 ``expected: doc11's parse_document ran past its
  time_limit (...): Celery kills its process; BackstopRequest records the envelope reason
  time_limit ...`` and ``expected: Celery's time_limit killed pool process ...``, and the
  same two for doc30, whose store stalled past ``time_limit`` after its body returned.

Run it alone (from the repository's folder after ``make lab``; two shells):

    .venv/bin/celery -A fm6_task_timeouts worker --without-gossip --without-mingle --without-heartbeat -B
    .venv/bin/python fm6_task_timeouts.py

or ``.venv/bin/python run_all_fms.py --only fm6``. Ctrl-C in the second shell cancels the
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
    return drain(app, DLQ)


def submit(doc_ids: list[str], pipeline_id: str) -> AsyncResult[Any]:
    """One ``fetch | parse`` chain per document; ``notify`` once every chain has returned."""
    write_manifest(app, pipeline_id, doc_ids)  # the ids once, for notify: not in its signature, which every message carries
    header = group(chain(fetch_document.s(d), parse_document.s()) for d in doc_ids)
    return chord(header)(notify.s(pipeline_id))


if __name__ == "__main__":  # submit the scenario to a worker you started, then check it
    from lab.by_hand import run_by_hand

    raise SystemExit(run_by_hand(__file__))
