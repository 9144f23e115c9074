"""Case study 3, as the write-up publishes it: CTE ingestion on one queue, per-lot order claimed.

"High-volume CTE ingestion with Celery" (FSMA 204 traceability): a producer
publishes each Critical Tracking Event with ``routing_key=lot.<code>`` onto one
queue (``cte.ingest``; here ``<namespace>.ctw.tasks``, bound to a topic exchange
with ``lot.#``: every lot lands in the same queue), claiming that the routing
key keeps each lot's events in order. ``ingest_event`` validates the payload
against the strict contract (an invalid one goes to ``quarantine_event`` with its
raw payload and errors, never retried), upserts the event into the ledger on its
idempotency key (committed or deduplicated) and retries ``TransientLedgerError``
with backoff and jitter, at most 5 times. Acks late, prefetch 1, reject on
worker lost; several consumers (here two pool processes).

The lab runs it with these departures; the first two are not yet undone (issue 24),
and what ``--prove`` shows below follows from the write-up's queue, routing and
retries, not from them:

| what | the write-up | the lab | effect |
|---|---|---|---|
| backoff | grows to 32 s | ``retry_backoff_max = 1`` s | a scale: the same autoretry, count and jitter |
| validation | its own pydantic model: ``extra="ignore"``, digit patterns for GLN and GTIN, no clock skew | the lab's strict contract (``events.validate``): its field names, ``extra="forbid"``, a required ``seq``, GS1 check digits, a skew allowance | the 37 invalid payloads are refused by the lab's rules; the write-up's digit patterns would accept a wrong check digit |
| broker | Redis, where it names ``visibility_timeout`` as the setting that bites most | RabbitMQ (a topic exchange, one queue) | the reordering shown is RabbitMQ's; a Redis broker adds redelivery past ``visibility_timeout`` |
| ledger | not given | the fixed program's SQL ledger without its sequence guard | an upsert on the write-up's key, as it says |
| logging | a line per decision | a JSON line (structlog) per quarantine and per commit, each with ``event_id``, ``lot_code`` and ``outcome`` (``.lab/<namespace>/events/ctw-decisions.jsonl``) | only the destination |

What its design does not hold, shown by ``--prove``:

- per-lot order: a routing key chooses queues, not an order inside one. A
  worker at ``-c 2`` with prefetch 1 holds two messages of the queue at once
  (the prefetch is per worker: multiplier x concurrency) and runs them in two
  pool processes, so two events of one lot run at once (several workers: RabbitMQ
  spreads the queue over them round robin, the same race); and a retry is a new message
  (``celery.app.task.Task.retry`` publishes the request again, with a
  countdown the worker holds in its timer) that comes back behind the lot's
  later events. Events are committed behind later events of their lot;
- no event is dropped: once an event's retries run out, ``Task.retry``
  (called by ``autoretry_for``'s wrapper, ``celery.app.autoretry``) re-raises
  the last ``TransientLedgerError`` instead of retrying; the task is FAILURE
  and the message is acked like any return (acks late acks failures too:
  ``task_acks_on_failure_or_timeout`` defaults to True). The event is in no
  ledger table and in no dead-letter store: lost.

``fixed.py`` is the corrected program.
"""

from __future__ import annotations

from typing import Any, cast

from celery import Task
from structlog.typing import FilteringBoundLogger
from celery.result import AsyncResult
from kombu import Exchange, Queue

from case_studies.cte_ingestion.events import Problem, Quarantined, RawEvent, idempotency_key, validate
from case_studies.cte_ingestion.ledger import Ledger, Outcome, TransientLedgerError
from case_studies.cte_ingestion.stand_ins import LedgerFaults
from case_studies.logs import event_log
from lab.app import lab_app

app = lab_app(__name__, short="ctw")  # JSON only; queue, exchanges and result keys under the namespace
app.conf.task_acks_late = True
app.conf.task_reject_on_worker_lost = True
app.conf.worker_prefetch_multiplier = 1
app.conf.worker_concurrency = 2
QUEUE = app.conf.task_default_queue  # one queue for every lot: the write-up's cte.ingest
app.conf.task_queues = [Queue(QUEUE, Exchange(f"{QUEUE}.lots", type="topic"), routing_key="lot.#")]

ledger = Ledger(sequence_guard=False, fault=LedgerFaults(app))  # RCL_LEDGER_URL; SQLite under .lab/ by default


def log() -> FilteringBoundLogger:
    """The write-up's decision log (structlog, one JSON line each)."""
    return event_log("ctw", "decisions")


@app.task(bind=True)
def quarantine_event(self: Task[Any, Any], payload: RawEvent, errors: list[dict[str, Any]]) -> bool:
    return ledger.quarantine(Quarantined(payload, tuple(cast(list[Problem], errors))))


@app.task(bind=True, autoretry_for=(TransientLedgerError,), retry_backoff=True, retry_backoff_max=1,
          retry_jitter=True, max_retries=5)
def ingest_event(self: Task[Any, Any], payload: RawEvent) -> Outcome | None:
    event = validate(payload)
    if isinstance(event, Quarantined):
        quarantine_event.delay(payload, [dict(p) for p in event.errors])
        log().warning("cte_quarantined", event_id=event.key, lot_code=None, supplier=event.supplier,
                      errors=sorted(event.error_types))
        return None
    outcome = ledger.commit(event)  # upsert on the idempotency key
    log().info("cte_ingested", event_id=idempotency_key(event), lot_code=event.lot_code, supplier=event.supplier_id,
               outcome=outcome)
    return outcome


def submit(payloads: list[RawEvent]) -> list[AsyncResult[Any]]:
    """Publish the burst, one message per event, routed by its lot."""
    with app.producer_or_acquire() as producer:
        return [ingest_event.apply_async((p,), routing_key=f"lot.{p.get('lot_code', '')}", producer=producer)
                for p in payloads]
