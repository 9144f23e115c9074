"""FM-7: a rolling deploy must not lose, repeat or dead-letter work.

Symptom (fm6 on scenario 7): Kubernetes rolls the worker out three times while 32 slow but
healthy documents (0.8 s of work each, under fm6's deadlines) run and wait: a new worker of
the same code starts; once it consumes, the old worker's main process gets SIGTERM and, when
the grace period ends (0.5 s in the lab, ``lab.deploys``; shorter than a slow document),
SIGKILL. On fm6 every old worker is still running a slow document's body when the SIGKILL
comes: that work is lost and starts again (``--prove``: ``work lost to a SIGKILL: doc38, ...``).
Every message it held without starting it goes back to the broker and is charged a delivery
(the run's ``deploy_term`` events list them, e.g. ``doc41:0,doc42:0``: a document and its
earlier deliveries), and so is every body a deploy cuts: a document that three deploys meet is
dead-lettered, innocent (``parse_document dead-lettered by the broker (delivery_limit) after 3
deliveries, 0 started``, or ``3 started`` for one cut three times: seen in some runs, since
which messages a worker holds at a deploy depends on timing; claim C16 cuts one three times
on purpose).

Root cause: SIGTERM is Celery's warm shutdown (``celery.apps.worker.install_worker_term_handler``,
5.5 to 5.7): the worker stops consuming and waits for every running body, however long, so
a grace shorter than the slowest body ends in SIGKILL. The messages it prefetched
(``worker_prefetch_multiplier`` 4 x 2 processes) go back when its connection closes, and
RabbitMQ 3.x counts every return against FM-3's ``x-delivery-limit: 2``, started or not, cut
or crashed: FM-3's bound cannot tell a deploy from a poison message.

Fix (what a team deploys; each setting with the Celery version that has it):

- ``worker_prefetch_multiplier = 1`` (every Celery 5): with ``acks_late`` a fresh worker
  holds only what its 2 processes run, so a deploy hands back next to no message that never
  started (the run's first worker, after scenario 6's kills, was seen holding 3 more). Claim
  C19: without it (and without the send-back below, so that the count shows) three deploys
  dead-letter all 8 members a worker held, 6 of them never started; with it, only what the
  deploys cut. The send-back alone would save those letters too (G7 passed in a run here
  without prefetch 1), each at the cost of a trip through the DLQ to the queue's tail and one
  of its five sends: prefetch 1 keeps that budget for the bodies deploys really cut;
- ``WORKER_ENV``: ``REMAP_SIGTERM=SIGQUIT`` in the worker's environment (``billiard.common``
  reads it once, when the worker starts): SIGTERM becomes Celery's cold shutdown
  (``celery.apps.worker.on_cold_shutdown``), which, with ``worker_soft_shutdown_timeout = 0.3``
  (Celery 5.5+), first gives running bodies 0.3 s (``WorkController.wait_for_soft_shutdown``),
  then cancels what still runs (``Consumer.cancel_active_requests``: the pool process gets
  SIGQUIT, the body ends in ``SystemExit``) and leaves its message unacknowledged: it goes back
  with the connection and starts afresh on the new worker. No body is left running when the
  grace ends;
- ``worker_deduplicate_successful_tasks = True`` (Celery 5.1+; acks late and a persistent
  backend): a body that finished inside the soft wait stored its result, but the main process
  sleeps through that wait and sends no ack, so the message comes back. A redelivered message
  (``redelivered``) whose task id is stored SUCCESS is acked without running
  (``celery.app.trace.build_tracer``, ``Task already completed successfully`` in the log). It
  matters most for a chain head: a fetch run again publishes its ``parse`` again, two messages
  of one task id, and one run saw them parsed in two processes at once (doc60, 30 ms apart);
- ``drain(app, DLQ, send_back=True)``: the drain tells an innocent dead letter from a poison
  one (``shared.dlq``): ``count_starts`` counts the starts and the ends of every body per task
  id, and a poison message's process dies without an end (no ``task_postrun``). A letter whose
  crashes (starts less ends) are below the bound is published again to its queue, as a new
  message whose deliveries the broker counts afresh (at most 5 times); G7 lists it as ``sent
  back as innocent``. C16 proves it: a document cut by three deploys in a row is finalised
  ``dead_lettered`` without it and ends ok on its fourth start with it.

The chord body is no exception (claim C17): a ``notify`` cut while it holds the claim ends in
``SystemExit``, which ``claim.sending()`` lets through after releasing the claim; its message goes
back, and the next worker's ``notify`` sends: one email.

G7 (the side chord ``deploy``, 32 documents; 3 deploys, or 2 when new workers boot slowly):
every document ok, each once in the chord's summary, one email; none dead-lettered; none
parsed in two processes at once (an attempt starts only once the one before ended or its
worker was gone); no body that ran at a SIGTERM still running when its SIGKILL came. A body
that a pool process begins in the moment after the SIGTERM is not Celery's to cancel: the
main process, asleep in the soft wait, has not yet read that it began, and
``Consumer.cancel_active_requests`` cuts only ``active_requests``; ``on_cold_shutdown`` then
calls ``pool.stop()``, which waits for it, and the lab's grace kills it (one run in about
twelve: doc39, begun 2 ms after its SIGTERM; G7 lists it, and it runs again). The old
*process* is still there when the lab's grace ends, running nothing: Celery's own stop takes
longer than the whole grace even when idle (claim C18: at least 1 s).
``TaskPool.on_stop`` joins billiard's pool, each of whose processes sleeps 1 s after it
announced its exit (``billiard.pool.Worker._do_exit``), and from 5.6.1 the timer thread it
keeps heartbeats with, which sleeps 0.5 s a pass (its join adds 0 to 0.5 s). So G7 asks
that no body of the old worker still run when the SIGKILL comes, not that the process be
gone: in the lab (grace shorter than a healthy body, which fm6's 1 s deadline bounds) none
can be. In production give the grace the soft timeout, one whole body and that stop.

Hard variant (``tests/test_celery_claims.py``, claim C15, a ``make matrix`` row): a warm
shutdown longer than two broker heartbeats (``broker_heartbeat = 1``, a 6 s body). On Celery
5.5.3 the worker sends no heartbeat while its pool drains, RabbitMQ closes the connection,
requeues the running message, and the new worker starts it while the old one still runs it
(celery#5998); from 5.6.1 ``celery.concurrency.prefork.TaskPool.on_stop`` keeps firing the
hub's timers while the pool drains, and it runs once (5.6.3, 5.7.0). fm7 keeps its shutdown
short on every version: its bodies are cancelled after 0.3 s.

Delta from fm6: ``worker_prefetch_multiplier``, ``worker_soft_shutdown_timeout``, ``WORKER_ENV``,
``worker_deduplicate_successful_tasks`` and the drain's ``send_back``.

Tradeoffs: a body cut at a deploy starts again from the beginning (its work is done twice,
one after the other: make it idempotent, FM-4). A body that finished inside the soft wait is
not run again only because deduplication skips it; without it, 2 of 3 runs of fm7 here (with 40
slow documents) parsed one twice at once or fetched one again. In production make the
grace longer than the soft timeout plus the worker's stop (C18), so that the ack goes out.
Deduplication costs a backend read for every redelivered message, and it changes what
``task_postrun`` reports for a redelivered body cut by a shutdown: ``state`` is the stored
state its check read (``PENDING``; on 5.5 ``RETRY``, which 5.5 stores for every cut and
announces as a retry, ``Request._announce_cancelled``), not None
(``celery.app.trace.build_tracer``; C16 asserts it), so a ``task_postrun`` handler must not
take ``state`` for how the body ended. The send-back trusts that a crash sends no
``task_postrun``: a message that kills its process after its body ended (in the result store,
say) looks innocent and is sent back 5 times before it is dead-lettered. Prefetch 1 costs a
round trip per message, makes new work wait for a free process (FM-5's probe), and lets
RabbitMQ itself expire and dead-letter a head sent already expired when no worker has room
(FM-1's hard variant: G1 accepts it). ``REMAP_SIGTERM`` is an environment variable, not a
setting: the deployment must set it.

Still open: the result backend going away mid-chord (FM-8).

You will see (by hand; ``run_all_fms.py`` prints the same verdict and timeline):

- in the submitter's shell: ``fm7 fixed (scenario 7 on fm7, ...): PASS``, an ``ok`` line for
  each of G1..G7, then the lanes fm6 lists, and the side chord ``deploy``: doc34 to doc65 each
  ok, a document running at a deploy ``raised error: SystemExit: the worker's shutdown stopped
  the body`` on one attempt and ok on the next;
- in each worker's window, after Celery's banner (``app: rcl_fm7`` in the default namespace,
  ``<namespace>_fm7`` in yours): the lines fm6 lists, and in the window of the worker you
  deploy away ``Initiating Soft Shutdown, terminating in 0.3 seconds`` (when a body runs) and
  ``worker: Cold shutdown (MainProcess)``.

Run it alone (from the repository's folder after ``make lab``; a worker shell, the submitter's, and
a second worker's for the deploy):

    REMAP_SIGTERM=SIGQUIT .venv/bin/celery -A fm7_rolling_deploys worker --without-gossip --without-mingle --without-heartbeat -B
    .venv/bin/python fm7_rolling_deploys.py

A deploy by hand, in Kubernetes' order: once the submitter's shell shows the side chord
``deploy`` running, start the new version, the same command with ``-n second@%h``; once it
says ``ready``, ``kill -TERM`` the main process of the first (``pgrep -of 'celery -A
fm7_rolling_deploys'``: the oldest); G7 then wants the slow documents taken by at least two
workers. Or ``.venv/bin/python run_all_fms.py
--only fm7``, which deploys three times itself. Ctrl-C in the submitter's shell cancels the run
(exit status 130); the next run first waits for what the workers had already taken. Add
``--loglevel=INFO`` to a worker to see Celery's own line for every task as well.
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
app.conf.worker_prefetch_multiplier = 1  # FM-7: a worker holds (nearly) only what it runs; a deploy returns few unstarted
app.conf.worker_soft_shutdown_timeout = 0.3  # FM-7 (Celery 5.5+): after SIGTERM running bodies get 0.3 s, then go back
WORKER_ENV = {"REMAP_SIGTERM": "SIGQUIT"}  # FM-7: SIGTERM starts the soft/cold shutdown (Celery reads it at start only)
app.conf.worker_deduplicate_successful_tasks = True  # FM-7 (5.1+): a redelivered task stored SUCCESS is not run


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
