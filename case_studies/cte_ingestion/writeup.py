"""Case study 3, as the write-up publishes it: CTE ingestion on one Redis queue, per-lot order claimed.

"High-volume CTE ingestion with Celery" (FSMA 204 traceability), line for line
where it gives code. Its app uses Redis as broker (``visibility_timeout`` of an
hour, the setting it names as the one that bites most often), acks late,
prefetch 1, reject on worker lost, several consumers (here two pool processes).
A producer publishes each Critical Tracking Event with ``routing_key=lot.<code>``
onto one queue, ``cte.ingest``, claiming that the routing key keeps each lot's
events in order. ``ingest_event`` validates the payload with the write-up's own
pydantic model, ``CTEEvent`` (its field names, ``timestamp`` among them;
``extra="ignore"``; GLN ``^\\d{13}$`` and GTIN ``^\\d{12,14}$``; an aware
timestamp not after the validator's clock; quantity ``> 0`` as ``Decimal``); an
invalid payload goes to ``quarantine_event`` with its raw payload and errors,
never retried. A valid one is upserted into the ledger on its idempotency key
(sha256 of ``lot|type|source id``: committed or deduplicated), and
``TransientLedgerError`` is retried with backoff and jitter, at most 5 times.
Every decision is one JSON line (structlog).

Departures the lab makes, each keeping the mechanism it runs:

| what | the write-up | the lab | why the mechanism is the same |
|---|---|---|---|
| names | queue ``cte.ingest``; Redis keys of its own | ``<namespace>.ctw.cte.ingest`` (its topic exchange ``<namespace>.ctw.cte.ingest.lots``, bound by ``lot.#``); every broker key under ``<namespace>:ctw:broker:`` (kombu's ``global_keyprefix``) | a prefix: the lab shares its Redis (``lab.app``) |
| routing | ``routing_key=lot.<code>`` onto ``cte.ingest`` | the same key, to a topic exchange whose one binding (``lot.#``) is that queue | on kombu's Redis transport an exchange is a binding table: every lot lands in the one list, as the write-up's queue |
| backoff | grows to 32 s | ``retry_backoff_max = 1`` s | the same autoretry, count and jitter, scaled in time |
| payloads | its producers send its field names | the lab's stream (``events.generate``) renamed by the runner (``stand_ins.as_published``: ``event_time`` sent as ``timestamp``); the rest it ignores (``supplier_id``, ``unit_of_measure``, ``seq``, the KDEs the rule requires per CTE type) stays in the payload | the same values, under the names its model reads |
| ledger | not given: "upsert on the key" | the fixed program's SQL ledger without its sequence guard (``Ledger(sequence_guard=False)``), given a row built from the validated event (``stand_ins.ledger_event``: not validated again) with the payload's ``supplier_id``, ``unit_of_measure`` and ``seq``, which its model ignores | an insert that does nothing on a key it holds, as the write-up's upsert; ``seq`` only lets the lab's check see a lot's order |
| logging | a line per decision | ``cte_quarantined`` and ``cte_ingested`` with ``event_id``, ``lot_code``, ``supplier`` and the outcome or errors, to ``.lab/<namespace>/events/ctw-decisions.jsonl`` (``case_studies.logs``) | only the destination |

What its design does not hold, shown by ``--prove`` (``study.py``):

- per-lot order (CT2 write-up): a routing key chooses queues, not an order
  inside one. A worker at ``-c 2`` with prefetch 1 takes two messages of the
  list at once (kombu's Redis transport: ``BRPOP``, the prefetch per worker is
  multiplier x concurrency) and runs them in two pool processes, so two events
  of one lot run at once; and a retry is a new message
  (``celery.app.task.Task.retry`` publishes the request again, with a countdown
  the worker holds unacked in its timer) that comes back behind the lot's later
  events. Events are committed behind later events of their lot;
- no event is dropped (CT3 write-up): once an event's retries run out,
  ``Task.retry`` (called by ``autoretry_for``'s wrapper, ``celery.app.autoretry``)
  re-raises the last ``TransientLedgerError``; the task is FAILURE and the
  message is acked like any return (``task_acks_on_failure_or_timeout`` defaults
  to True). The event is in no ledger table and in no dead-letter store: lost;
- the model (CT1 write-up): digit patterns accept a GLN or GTIN whose GS1 check
  digit is wrong (every GS1 number ends in one, there to catch a mistyped
  digit): the burst's 10 such events are committed; it reads none of the KDEs
  the Food Traceability Rule requires per CTE type (``extra="ignore"`` drops
  them): the burst's 4 events of its types that lack one are committed too,
  where the fixed contract (``events.validate``) quarantines the 14. Its
  ``event_type`` names 5 of the rule's 7 CTE types: every initial packing and
  first land-based receiving event (476 valid ones in the burst) is refused
  (``literal_error``) and quarantined;
- an outage longer than the whole backoff (CT7 write-up, scenario ``outage``:
  the ledger down from the publish until a first task has used its 1 + 5
  attempts): each event whose retries ran out in it is FAILURE, acked, in no
  table and no dead-letter store; the others commit once the ledger is back.

On Redis, ``visibility_timeout`` adds one more way to run an event twice: a
message unacked for longer (a countdown retry held past it, or a slow commit) is
handed out again. With the write-up's hour and a burst that drains in seconds
the runs never reach it; case study 2 shows it (BL8 write-up).

``fixed.py`` is the corrected program.

Run it alone (from the repository's folder after ``make lab``; two shells):

    .venv/bin/celery -A case_studies.cte_ingestion.writeup worker --without-gossip --without-mingle --without-heartbeat
    .venv/bin/python -m case_studies.cte_ingestion.writeup
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any, Literal

from celery import Task
from celery.result import AsyncResult
from kombu import Exchange, Queue
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, field_validator
from structlog.typing import FilteringBoundLogger

from case_studies.cte_ingestion.events import Problem, Quarantined, RawEvent
from case_studies.cte_ingestion.ledger import Ledger, Outcome, TransientLedgerError
from case_studies.cte_ingestion.stand_ins import LedgerFaults, ledger_event
from case_studies.logs import event_log
from lab.app import lab_app
from lab.settings import amqp_name

VISIBILITY_TIMEOUT = 3600  # write-up: an hour

app = lab_app(__name__, short="ctw", broker="redis")  # JSON only; broker keys under <namespace>:ctw:broker:
app.conf.broker_transport_options.update(visibility_timeout=VISIBILITY_TIMEOUT)  # write-up
app.conf.task_acks_late = True
app.conf.task_reject_on_worker_lost = True
app.conf.worker_prefetch_multiplier = 1
app.conf.worker_concurrency = 2
QUEUE = amqp_name("ctw", "cte.ingest")  # write-up: cte.ingest, one queue for every lot
LOTS = Exchange(f"{QUEUE}.lots", type="topic")
app.conf.update(task_default_queue=QUEUE, task_default_exchange=LOTS.name, task_default_exchange_type="topic",
                task_default_routing_key="lot.#")
app.conf.task_queues = [Queue(QUEUE, LOTS, routing_key="lot.#")]

ledger = Ledger(sequence_guard=False, fault=LedgerFaults(app))  # the lab's (RCL_LEDGER_URL; SQLite under .lab/)


class CTEEvent(BaseModel):
    """write-up: the Key Data Elements of one Critical Tracking Event."""

    model_config = ConfigDict(extra="ignore")

    lot_code: str = Field(min_length=1, max_length=64)
    event_type: Literal["harvesting", "cooling", "shipping", "receiving", "transformation"]
    location_gln: str = Field(pattern=r"^\d{13}$")
    timestamp: AwareDatetime
    gtin: str = Field(pattern=r"^\d{12,14}$")
    quantity: Decimal = Field(gt=0)
    source_event_id: str

    @field_validator("timestamp")
    @classmethod
    def not_in_future(cls, value: datetime) -> datetime:
        if value > datetime.now(timezone.utc):
            raise ValueError("timestamp is in the future")
        return value


def idempotency_key(event: CTEEvent) -> str:
    """write-up: sha256 of ``lot|type|source id``."""
    return hashlib.sha256(f"{event.lot_code}|{event.event_type}|{event.source_event_id}".encode()).hexdigest()


def log() -> FilteringBoundLogger:
    """write-up: one JSON line (structlog) per decision."""
    return event_log("ctw", "decisions")


@app.task(bind=True)
def quarantine_event(self: Task[Any, Any], payload: RawEvent, errors: list[dict[str, Any]]) -> bool:
    problems = tuple(Problem(loc=list(e["loc"]), type=str(e["type"]), msg=str(e["msg"])) for e in errors)
    return ledger.quarantine(Quarantined(payload, problems))  # the lab's store: the payload kept once


@app.task(bind=True, autoretry_for=(TransientLedgerError,), retry_backoff=True, retry_backoff_max=1,
          retry_jitter=True, max_retries=5)
def ingest_event(self: Task[Any, Any], payload: RawEvent) -> Outcome | None:
    try:
        event = CTEEvent.model_validate(payload)
    except ValidationError as exc:  # write-up: to the dead-letter task with the raw payload, never retried
        errors = [{"loc": list(e["loc"]), "type": e["type"], "msg": e["msg"]}
                  for e in exc.errors(include_url=False, include_context=False, include_input=False)]
        quarantine_event.delay(payload, errors)
        log().warning("cte_quarantined", event_id=Quarantined(payload, ()).key, lot_code=payload.get("lot_code"),
                      supplier=payload.get("supplier_id"), errors=sorted({str(e["type"]) for e in errors}))
        return None
    outcome = ledger.commit(ledger_event(event.model_dump(), payload))  # write-up: upsert on the key
    log().info("cte_ingested", event_id=idempotency_key(event), lot_code=event.lot_code,
               supplier=payload.get("supplier_id"), outcome=outcome)
    return outcome


def submit(payloads: list[RawEvent]) -> list[AsyncResult[Any]]:
    """write-up: publish the burst, one message per event, routed by its lot."""
    with app.producer_or_acquire() as producer:
        return [ingest_event.apply_async((p,), routing_key=f"lot.{p.get('lot_code', '')}", producer=producer)
                for p in payloads]


if __name__ == "__main__":  # submit the burst to the worker you started, then check it
    from case_studies.cte_ingestion.study import run_by_hand

    raise SystemExit(run_by_hand("broken"))
