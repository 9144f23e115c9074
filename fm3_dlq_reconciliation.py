"""FM-3: a poison message must stop somewhere, and the chord must still complete.

Symptom (fm2 on scenario 3): ``doc4`` SIGKILLs its process on every attempt.
With FM-2's fix it is requeued every time: attempts climb past any bound, a
pool slot is burnt on it for ever and ``notify`` never runs.

Root cause: FM-2 has no bound on redelivery: a message requeued by
``reject_on_worker_lost`` comes back with the same headers, and
``request.retries`` does not count redeliveries. Celery 5.7 offers a bound of
its own, ``task_retry_on_worker_lost`` (``celery.worker.request.Request.on_failure``
calls ``_retry_worker_lost``): it publishes the lost task again with
``retries + 1`` until ``max_retries``, and then marks it FAILURE, so the chord
still breaks (``tests/test_celery_claims.py`` runs it on fm2: ``doc4`` attempted
4 times, then ``ChordError(WorkerLostError)``). The setting is new in 5.7.0:
Celery 5.5 and 5.6 ignore it and loop as fm2 does, so there the broker's bound
is the only one. The broker's bound below ends in
a SUCCESS-state envelope instead, needs no retry delay on the task, and also
bounds a worker lost whole, whose main process is not there to call
``on_failure`` (``tests/test_celery_claims.py`` kills one three times).

Fix (``shared/dlq.py``):

- the task queue becomes a RabbitMQ quorum queue with ``x-delivery-limit: 2``
  and a dead-letter exchange; RabbitMQ 3.x delivers ``doc4`` 3 times (limit + 1)
  and then dead-letters it to the DLQ instead of delivering it again.
  (RabbitMQ 4.0 gives every quorum queue a limit of 20 unless one is set, and
  later 4.x releases changed which returns count; ``shared/dlq.py`` says more.
  The lab runs RabbitMQ 3.x; the 4.x behaviour is stated, not run.)
- nobody consumes the DLQ as a task queue. A beat task, ``drain_dead_letters``,
  reads it every 0.25 s and finds the chord member each dead letter stands for:
  the message itself (``doc4``'s ``parse_document``), or, for a chain's head, the
  last task of the chain it carries. Scenario 3's hard variant is ``doc9``,
  whose *fetch* is poison: ``fetch_document`` is not the chord member, and
  ``parse_document`` was never sent. For that member the drain writes a
  SUCCESS-state ``Result`` with reason ``dead_lettered`` through
  ``backend.mark_as_done``, with a request rebuilt from the message;
  ``Backend.mark_as_done`` calls ``on_chord_part_return``, the member counts,
  and ``notify`` fires (Celery 5.5 to 5.7). A drain that runs again on the same
  dead letter (its ack lost) writes the same envelope: Celery 5.7 counts a
  member once whatever it reports; 5.5 and 5.6 count a result already in the
  join once only when it is byte for byte the same, which the drain's is
  (``shared/dlq.py``). A task message that leads to no member (the chord body
  ``notify`` itself, a plain task) gets the same envelope as its own result, so
  the chord's result says that its body was dead-lettered, and why. A letter
  that is no Celery task at all is parked in ``QUEUE.dlq.parked``, announced
  (``dead_letter_parked``) and counted, never put back where the next pass would
  read it first; only a backend that does not answer stops a pass, the letter
  kept for the next one. Nothing is acked unless it was finalised or parked.
- the DLQ must exist before a message dies (RabbitMQ drops a dead letter it
  cannot route): ``DeadLetteringQueue`` is a kombu ``Queue`` that declares its
  ``dead_letters`` queue whenever it is declared itself, by the worker or anyone.
- deliveries are not attempts: a worker killed whole returns every message it
  held, prefetched and never started included, and RabbitMQ counts each return
  (``tests/test_celery_claims.py``: three kills dead-letter eight members of
  which two ran per round). ``count_starts(app)`` counts real starts per task id,
  and the envelope says both (``after 3 deliveries, 3 started``). Choose the
  limit above the whole-worker losses a prefetched message may live through.

Hard variants (``--prove``'s third column runs the drain as it first stood,
``lab/weak.py``): ``doc9`` above; a poison chord body (side chord ``body``: the
mail API kills every ``notify`` of that pipeline), which a drain that finalises
chord members only keeps in the DLQ while its chord stays PENDING, in silence;
and a poison member (side ``behind``, ``doc33``) dead-lettered behind 201 letters
no drain can place, one more than the two drains the pool may run at once read in a
pass (100 each): a drain that puts them back reads the same ones on every pass and
never reaches ``doc33``. G3: the body's chord result is its ``dead_lettered``
envelope, ``doc33`` is finalised, 201 letters parked.

Delta from fm2: the ``DLQ``, ``task_queues`` with a ``DeadLetteringQueue`` whose
``queue_arguments`` say ``quorum``, ``x-delivery-limit`` and ``x-dead-letter-exchange``,
``drain_dead_letters`` on ``beat_schedule`` (worker flag -B), and ``count_starts``.

Tradeoffs: a dead-lettered document is reported failed, not retried; an
operator must look at why. The drain runs every 0.25 s here (seconds or
minutes in production), which is how long a chord waits after the last
delivery. Quorum queues have no global QoS and, in Celery 5.5 to 5.7, pull in the
``DelayedDelivery`` bootstep; the lab's apps run without it (``lab/app.py``)
so that nothing outside the FM's namespace is declared.

Still open: a duplicated ``notify`` sends two emails (FM-4).

You will see (by hand; ``run_all_fms.py`` prints the same verdict and timeline):

- in the second shell: ``fm3 fixed (scenario 3 on fm3, ...): PASS``, an ``ok`` line for
  each of G1..G3, then what happened to each document: as fm2 lists it, and ``doc4`` killed on attempts
  1 to 3, then ``dead-lettered: finalised by the DLQ drain``, and ``doc9``'s fetch killed
  3 times, then dead-lettered the same way;
- in the worker's window, after Celery's banner (``app: rcl_fm3`` in the default namespace, ``<namespace>_fm3`` in yours):
  seven kills, each said in two ``expected:`` lines as fm2 says doc3's (doc3 once, doc4
  and doc9's fetch three times each); the second line counts the deliveries (``delivery 2
  of at most 3 comes next``, and at the third ``that was delivery 3 of 3 (x-delivery-limit
  + 1): the broker dead-letters it``); then ``lab: doc4 dead-lettered (delivery_limit); the
  DLQ drain recorded it as failed (dead_lettered): the chord can complete``, the same for
  ``doc9``, and the ``lab:`` lines fm2 lists. The hard variants' chords of their own add
  three kills of the poison ``notify`` (``FM-3's poison chord body``), then ``lab: the chord's
  notify dead-lettered``, three of ``doc33``'s, and the drain's ``WARNING`` lines ``parked 100
  dead letters in ...dlq.parked, which no drain can place: 100 not JSON (text/plain)`` for the
  201 foreign letters (the only warnings, and meant: an operator should look at a parked letter).
  No traceback, no ``ERROR``: one would not be the lab's.

Run it alone (from the repository's folder after ``make lab``; two shells):

    .venv/bin/celery -A fm3_dlq_reconciliation worker --without-gossip --without-mingle --without-heartbeat -B
    .venv/bin/python fm3_dlq_reconciliation.py

or ``.venv/bin/python run_all_fms.py --only fm3``. Ctrl-C in the second shell cancels the
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
    send_email(pipeline_id, summary)
    return {**summary, "sent": True}


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
