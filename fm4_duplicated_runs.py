"""FM-4: a duplicated ``notify`` must not send a second email.

Symptom (fm3 on scenario 4): a second ``notify`` for the same pipeline arrives
while the first is sending (a redelivery after a lost ack, an operator who
re-fires the body), and the process sending dies twice: once before it sends,
once right after. Every delivery that reaches the mail API sends: three emails.

Root cause: at-least-once delivery, which FM-2 and FM-3 chose on purpose.
Nothing in Celery deduplicates a task by business key.

Fix (two halves):

- a claim in Redis per pipeline id (``shared/claim.py``): ``SET NX`` with a TTL
  marks it ``claimed`` by the task id, the owner sends and marks it ``sent``. A
  concurrent ``notify`` finds it ``claimed`` and asks again 50 ms later, in case
  the owner fails and releases: it waits in the broker (``BUSY``, delay queues
  ``QUEUE.busy.0.<s>``, ``shared/retry.py``'s ``DelayQueues`` as FM-5 explains them),
  not as ``Task.retry(countdown=...)``, whose ETA message a worker on a quorum queue
  holds in its static prefetch (Celery warns on every such retry that direct
  exchanges get no native delayed delivery); a later one finds ``sent`` and
  returns ``sent=False``. The owner's own redelivery (the same task id, FM-2
  requeued it when its process died) resumes the claim instead of waiting for it.
  The busy-retry budget (``policy.busy_retries``) outlasts the claim's 60 s TTL, so a
  claim whose owner never comes back expires before the waiting ``notify`` gives up
  (``tests/test_celery_claims.py`` runs that with a 2 s TTL: the duplicate sends
  once the claim has expired);
- the mail API's idempotency key (``idempotency_key=claim.key``): an owner killed
  after sending and before marking ``sent`` is redelivered and sends again, and
  the mail API delivers that key once. The claim keeps the calls to one in the
  common case; the key makes the email exactly-once when the claim cannot.

Scenario 4 makes the interleaving certain: the first ``notify`` waits at a gate
(inside the mail stand-in) after claiming, the runner opens it only once the
duplicate has seen the claim (its first busy-retry), and the mail stand-in then
kills the owner before it sends, and its redelivery once the email is out. G4:
one email, two calls to the mail API, the chord's ``notify`` started 3 times,
the email out within 10 s of the first kill (measured: under 0.1 s with the lab's
pool; a stock worker may notice each dead pool process up to 5 s later, README),
the duplicate ``sent=False``.

Hard variant, before this fix (``--prove``, ``lab/weak.py``): with the claim as
it was (no resume, 400 busy-retries of 50 ms), the owner's redelivery is turned
away by its own claim; 20 s of retries end before the 60 s TTL, and
``tests/test_celery_claims.py`` runs that to its end: no email at all, and the
chord SUCCESS holding notify's ``MaxRetriesExceededError``. Without the key, the
owner killed after sending sends twice (the same file).

A poison ``notify`` (FM-3's side chord ``body``) wins the claim on every delivery
and dies holding it; ``release_when_dead_lettered(app, notify)`` releases it when
the drain finalises that dead letter, so a re-fired ``notify`` sends at once rather
than after the claim's TTL (G4: the body's claim is gone at the end of the run).

Delta from fm3: ``NotifyClaim`` in notify: ``acquire``, ``BUSY.retry`` while
busy, ``"sent": False`` when done, ``claim.sending()`` around ``send_email``
with its ``idempotency_key``; ``release_when_dead_lettered``.

Tradeoffs: recovery from a dead owner needs its redelivery (immediate here;
FM-2's requeue) or, failing that, the claim's TTL. A redelivery while the first
delivery still runs (RabbitMQ requeues on a lost *connection*, and Celery 5.5
to 5.7 let the running task go on: read, not run, ``shared/claim.py``) resumes the claim too, and both call the mail API:
the key is what keeps that to one email. Without a receiver that honours an
idempotency key, at-most-once and at-least-once are the only choices.
Busy-retries cost broker round trips while the owner works, and one delay
queue per slice.

Still open: a transient error fails a document for good (FM-5).

You will see (by hand; ``run_all_fms.py`` prints the same verdict and timeline):

- in the second shell: ``fm4 fixed (scenario 4 on fm4, ...): PASS``, an ``ok`` line for
  each of G1..G4, then the documents as fm3 lists them, and the ``notify`` lanes: the chord's ``notify``
  ``killed before sending``, then ``killed after the email was out``, then ``sent``; the
  duplicate ``retried after 50 ms (claim busy)`` a few times, then ``skipped, sent=False
  (already sent)``; one email;
- in the worker's window, after Celery's banner (``app: rcl_fm4`` in the default namespace, ``<namespace>_fm4`` in yours):
  the lines fm3 lists, and the two kills of the crash plan, each in two ``expected:`` lines
  (``expected: the lab killed pool process ...: scenario 4's crash plan kills notify after
  claiming, before it sends``, then ``... once the email is out, before it marks the claim
  sent``, each followed by ``expected: the chord's notify lost its process ...: Celery
  requeues it``); ``lab: notify (duplicate) found the claim held by another notify: it
  busy-retries ...``; ``lab: notify (chord) ended ok; the email is sent`` and ``lab: notify
  (duplicate) ended ok; sent=False: the claim says the email is out already``. No
  ``Direct exchanges are not supported with native delayed delivery`` warning: the busy
  waits go through the broker, not a countdown (fm4w, ``--prove``, prints it).

Run it alone (from the repository's folder after ``make lab``; two shells):

    .venv/bin/celery -A fm4_duplicated_runs worker --without-gossip --without-mingle --without-heartbeat -B
    .venv/bin/python fm4_duplicated_runs.py

or ``.venv/bin/python run_all_fms.py --only fm4``. Ctrl-C in the second shell cancels the
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
