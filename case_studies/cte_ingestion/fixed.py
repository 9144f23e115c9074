"""Case study 3, fixed: burst CTE ingestion that keeps each lot's order and drops no event.

The write-up: "High-volume CTE ingestion with Celery" (``writeup.py`` runs it as
published) publishes each Critical Tracking Event with ``routing_key=lot.<code>``
onto one queue with several consumers on a Redis broker, claims per-lot order
from the routing key, validates with a pydantic model whose GLN and GTIN
patterns count digits (invalid: quarantined with its payload, never retried),
upserts into a ledger on the idempotency key and retries
``TransientLedgerError`` with backoff and jitter, at most 5 times; acks late,
prefetch 1, reject on worker lost. It also asks for a dry-run mode and for
alerts on queue depth, commit latency and the dead-letter rate per supplier.

What the runs show (``python run_all_fms.py --only cte_ingestion --prove``): on
a burst of 2,000 events from a seed (invalid and resent payloads in it, a ledger
that drops its connection twice for some events, a process killed mid-commit,
one event whose ledger faults outlast its retries), the write-up's code, on its
Redis broker with its own model, breaks both of its claims and lets bad numbers in:

- order: one queue with two pool processes commits events behind later events
  of their lot. The worker holds two messages at once (prefetch multiplier x
  concurrency) and runs them side by side, so two events of one lot run at
  once (several workers: RabbitMQ spreads a queue round robin, the same race);
  and a retry is a new message
  (``celery.app.task.Task.retry`` publishes the request again) that comes back
  behind the lot's later events. The routing key only picks the queue;
- lost event: when the retries run out, ``Task.retry`` (called by
  ``autoretry_for``'s wrapper, ``celery.app.autoretry``) re-raises the last
  ``TransientLedgerError``, the task is FAILURE and, acks late or not, the
  message is acked (``task_acks_on_failure_or_timeout`` defaults to True): the
  event is in no ledger table and in no dead-letter store;
- its model: its patterns commit the burst's 10 events whose GLN or GTIN
  fails its GS1 check digit, and, reading none of the KDEs the rule requires
  per CTE type, the 4 of its types that lack one; ``events.validate``
  quarantines the 14. Its event types are 5 of the rule's 7: it quarantines
  the burst's 476 valid initial packing and first land-based receiving
  events, which ``events.validate`` takes.

On this file the same burst commits 1,915 events (every valid distinct one) in
each lot's order, quarantines the 37 invalid payloads (6 of them without a
KDE their CTE type requires, each named with the type), and its metrics equal
the ledger's counts, exactly (``study.py`` lists the checks).

Fix:

- shards: a lot goes to shard ``sha256(lot) mod SHARDS`` (``stand_ins.shard_of``;
  not Python's ``hash()``, which differs per process), one queue per shard,
  declared with ``x-single-active-consumer``: however many workers subscribe,
  RabbitMQ delivers a shard to one of them at a time and fails over to the
  next when its connection dies (a broker feature of classic and quorum
  queues since 3.8, no plugin). One worker per shard at ``-c 1`` with prefetch
  1 runs one message of the shard at a time, so a shard's messages commit in
  queue order; different shards run in parallel. (One worker at ``-c N`` over
  every shard would not do: Celery's prefetch of N is per channel, so N
  messages of one shard could run at once);
- one ledger transaction per message (``Ledger.commit_many``: a batch of up to
  ``BATCH`` events of one shard), so the database's commit is paid per batch;
- retries in place (``shared.in_place.retry_in_place``): a transient error
  rolls the batch back, and its events are then committed one at a time, each
  retried with backoff and jitter inside the task, the message unacknowledged,
  so nothing of the shard passes the event being retried. A re-publish
  (``Task.retry``) would send it to the back of the shard;
- dead letters, with a held lot: when the in-place retries run out, the event
  goes to the ledger's dead letters with its payload and reason, and its lot is
  held: later events of the lot are dead-lettered behind it (reason ``held``)
  rather than committed past it. ``replay()`` sends each held lot's dead
  letters back through its shard in the lot's order (``replay_batch``), which
  commits each once and releases the lot. Guarantee: every valid event is
  committed exactly once, after the replay for a held lot, and never behind a
  later event of its lot; the ledger's sequence guard refuses any that would be
  (zero refusals in every run: the shards and the hold keep the order, the
  guard is the last line);
- a crash mid-commit: acks late + reject on worker lost requeue the message,
  but RabbitMQ 3.x does not promise to put it back at the head: a run saw the
  next message of the shard delivered and run first, committing a lot's
  events behind later ones (the guard refused them). So the producer numbers
  each shard's messages (``shared.turns``) and a message that comes before its
  predecessor is done is rejected back to the queue (``Reject(requeue=True)``)
  until its turn;
- metrics (``metrics.CteMetrics``, Prometheus' client in multiprocess mode):
  events by outcome and supplier, retries, the commit latency histogram; the
  runner adds queue depth per shard and dead-letter depth. The checks read
  them and compare them with the ledger, exactly;
- dry run (``CTE_DRY_RUN=1`` in the worker's environment): validates, decides
  and logs every commit it would make, and writes nothing;
- an outage longer than an event's whole backoff (scenario ``outage``, CT7): the
  event whose in-place retries ran out is dead-lettered and holds its lot, the
  others commit once the ledger is back, and the replay commits the held lot in
  order: every valid event once. (The stand-in fails commits only: a database
  wholly down would refuse the dead letter too, and ``ingest_batch`` would fail
  and be acked; not handled here);
- ``seq`` optional (real feeds send none): the order is the shards' and the
  turns', so the ledger numbers an event without one ``head + 1`` under its
  lot's lock (scenario ``no_seq``, CT6: every lot in the order produced).

The broker: this program stays on RabbitMQ, where the write-up's is Redis,
because its order rests on ``x-single-active-consumer``: the broker gives a
shard to one consumer at a time and fails over when it dies. A Redis list has
no such thing: a shard's order would rest on starting exactly one worker at
``-c 1`` per list, which nothing checks (CT2 write-up: two consumers of one
Redis list commit a lot out of order), and a message unacked past
``visibility_timeout`` is handed out again while it may still run (case study
2, BL8 write-up).

FM-9's settings, as fm9 sets them (``fm9 S9``/``G9``): with
``worker_cancel_long_running_tasks_on_connection_loss`` a dropped broker
connection cancels the running batch, so its requeued message (back at its
shard's head) runs after it, not beside it, which would break the lot's order;
``broker_channel_error_retry`` keeps the worker through a channel the broker
closes. The batches have no ``time_limit``: FM-9's third part has nothing to
lower. FM-8's guard matters only to the tasks that store a result, here the
lab's ``probe`` and ``idle`` (the study's own ignore theirs); a shard queue has
no dead-letter exchange, so it rejects with requeue (``reject_unstored(app,
requeue=True)``, ``tests/test_backend_requeue.py``).

Tradeoffs: a lot's order costs head-of-line blocking: an event retried in place
holds its whole shard for up to the retries' backoff (about 3 s here), and a
held lot waits for an operator's replay. Shards can only add throughput as far
as the ledger takes parallel writers and the machine has cores:
``bench/bench_cte.py`` on a two-core machine drained 10,000 events in 11.0,
9.3 and 7.7 s (medians of two) with 1, 2 and 4 shards on PostgreSQL, and in 5.0
to 5.5 s whatever the shards on SQLite, which takes one writer at a time (there
the shards buy order, not speed). A message carries a
batch of one shard's events (``BATCH`` payloads), which pays Celery's
per-message cost and the ledger's commit once per batch (one transaction per
event drained the burst, as generated before its KDEs per CTE type, in 24.7 s on
PostgreSQL and 33.9 s on SQLite with 4 shards, against 9.8 to 19.5 and 7.7 to 8.3 s
in batches then); a crash rolls the batch back and redelivers it whole. A message that kills its worker on every
delivery would stop its shard for ever: a classic queue has no delivery limit
(a quorum queue's ``x-delivery-limit`` and FM-3's drain would bound it; not
built here).

Run it alone (services up), from the repository's root. The shard queues are
``<namespace>.ct.shard.<k>``, so every shell needs the same ``RCL_NAMESPACE``
(``rcl`` when unset), and the workers and the submitter the same empty
``PROMETHEUS_MULTIPROC_DIR``. In every shell:

    export RCL_NAMESPACE=${RCL_NAMESPACE:-rcl} PROMETHEUS_MULTIPROC_DIR=$PWD/.lab/${RCL_NAMESPACE:-rcl}/cte-by-hand

once, before any worker starts:

    rm -rf "$PROMETHEUS_MULTIPROC_DIR" && mkdir -p "$PROMETHEUS_MULTIPROC_DIR"

one worker per shard, each in its own shell, with ``K=0`` in the first and
1, 2, 3 in the next three:

    K=0; .venv/bin/celery -A case_studies.cte_ingestion.fixed worker --without-gossip --without-mingle --without-heartbeat -Q $RCL_NAMESPACE.ct.shard.$K

and, once the four have printed their banner, in a fifth:

    .venv/bin/python -m case_studies.cte_ingestion.fixed

which submits the ``burst`` and prints CT1..CT4 (exit 0 when all hold). One
worker with ``-Q`` listing every shard keeps the order too, at one message at
a time. Or let the harness start the workers:
``.venv/bin/python run_all_fms.py --only cte_ingestion``.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from typing import Any, cast

from celery import Task
from celery.exceptions import Reject
from kombu import Exchange, Queue

from structlog.typing import FilteringBoundLogger

from case_studies.cte_ingestion.events import (CriticalTrackingEvent, Quarantined, RawEvent, RawPayload, idempotency_key,
                                               validate)
from case_studies.cte_ingestion.ledger import Ledger, TransientLedgerError
from case_studies.cte_ingestion.metrics import CteMetrics
from case_studies.cte_ingestion.stand_ins import LedgerFaults, batches, shard_of
from case_studies.logs import event_log
from lab.app import lab_app
from lab.settings import amqp_name
from shared.backend import backend_redis, reject_unstored
from shared.in_place import retry_in_place
from shared.retry import RetriesExhausted, RetryPolicy
from shared.turns import Turns

SHARDS = int(os.environ.get("CTE_SHARDS", "4"))  # fix: lots spread over this many ordered queues
BATCH = 50  # payloads of one shard per message
DRY_RUN = os.environ.get("CTE_DRY_RUN", "") == "1"  # write-up: validate and log, write nothing
RETRY = RetryPolicy(max_retries=5, base=0.05, cap=1.0, retry_on=(TransientLedgerError,))  # write-up: 5 retries
DECISIONS = "decisions"  # the lab: the decision log's name (these messages carry no run id)

app = lab_app(__name__, short="ct")  # JSON only; queues, exchanges and result keys under the namespace
app.conf.task_acks_late = True  # write-up: a message is acked once its events are in the ledger
app.conf.task_reject_on_worker_lost = True  # write-up: a killed process requeues its message (at the shard's head)
app.conf.worker_prefetch_multiplier = 1  # write-up
app.conf.worker_concurrency = 1  # fix: one message of a shard at a time
app.conf.task_ignore_result = True  # the ledger is the record; the metrics its view
app.conf.broker_channel_error_retry = True  # FM-9 (5.3+): a channel the broker closes is a reconnect
app.conf.worker_cancel_long_running_tasks_on_connection_loss = True  # FM-9 (5.1+): a lost connection stops the batch
reject_unstored(app, requeue=True)  # FM-8: the lab's probe and idle store results; their queue has no dead-letter exchange
SHARD_EXCHANGE = Exchange(amqp_name("ct", "shards"), type="direct")
SHARD_QUEUES = [Queue(amqp_name("ct", f"shard.{k}"), SHARD_EXCHANGE, routing_key=amqp_name("ct", f"shard.{k}"),
                      queue_arguments={"x-single-active-consumer": True})  # fix: one consumer per shard at a time
                for k in range(SHARDS)]
app.conf.task_queues = SHARD_QUEUES
app.conf.task_default_queue = str(SHARD_QUEUES[0].name)

ledger = Ledger(dry_run=DRY_RUN, hold_lots=True, fault=LedgerFaults(app))  # fix: a dead letter holds its lot
metrics = CteMetrics()  # one per process; PROMETHEUS_MULTIPROC_DIR gathers the processes' values


def decisions() -> FilteringBoundLogger:
    """fix: one JSON line (structlog) per decision, each with ``event_id`` (the idempotency key; a quarantined
    payload's own key), ``lot_code``, ``supplier`` and ``dry_run`` (``case_studies.logs``; in the lab the file
    ``.lab/<namespace>/events/ct-decisions.jsonl``)."""
    return event_log("ct", DECISIONS).bind(dry_run=DRY_RUN)


def _event_fields(event: CriticalTrackingEvent) -> dict[str, Any]:
    return {"event_id": idempotency_key(event), "lot_code": event.lot_code, "supplier": event.supplier_id,
            "seq": event.seq, "cte_type": event.event_type, "source_event_id": event.source_event_id}


def set_aside(bad: Quarantined) -> str:
    """Quarantine an invalid payload with every problem (write-up: never retried)."""
    outcome = "quarantined" if ledger.quarantine(bad) else "deduplicated"  # a redelivery keeps it once
    metrics.count(outcome, bad.supplier)
    decisions().warning("event_quarantined", event_id=bad.key, lot_code=None, supplier=bad.supplier, outcome=outcome,
                        cte_type=bad.cte_type,  # fix: a missing_kde problem names the KDE its type requires
                        problems=[f"{'.'.join(str(x) for x in p['loc'])}: {p['type']}" for p in bad.errors])  # fix
    return outcome


def settle(raw: RawPayload, event: CriticalTrackingEvent, outcome: str, replay: bool) -> str:
    """After the ledger decided: a held event goes behind its lot's dead letter; the outcome is counted."""
    key = idempotency_key(event)
    if outcome == "held":  # fix: an earlier event of the lot waits for a replay; this one waits behind it
        fresh = ledger.dead_letter(key, raw, "held", event.supplier_id, event.lot_key)
        outcome = "dead_lettered" if fresh else "deduplicated"
    if replay:
        ledger.mark_replayed(key)
    metrics.count(cast(Any, outcome), event.supplier_id)
    if event.unknown_fields:  # fix: kept in the ledger's payload as sent, and reported, never fatal
        decisions().warning("event_unknown_fields", **_event_fields(event), fields=list(event.unknown_fields))
    log = decisions().warning if outcome == "dead_lettered" else decisions().info
    log("event_" + outcome, **_event_fields(event), replay=replay,  # fix: committed, deduplicated, dead_lettered
        **({"reason": "held behind its lot's dead letter"} if outcome == "dead_lettered" else {}))
    return outcome


def ingest_one(raw: RawPayload, replay: bool = False) -> str:
    """One payload: validated, committed (retried in place), or set aside; its outcome, counted once."""
    event = validate(raw)
    if isinstance(event, Quarantined):
        return set_aside(event)

    def commit() -> str:
        with metrics.time_commit():
            return ledger.commit(event, replay=replay)  # dry run: decides and logs, writes nothing

    def retried(k: int, exc: Exception) -> None:
        metrics.retried()
        decisions().warning("commit_retried", **_event_fields(event), retry=k + 1, error=type(exc).__name__)  # fix

    try:
        outcome = retry_in_place(commit, RETRY, on_retry=retried)  # fix: in place
    except RetriesExhausted as exc:  # fix: set aside with its payload; its lot is held behind it
        fresh = ledger.dead_letter(idempotency_key(event), raw, f"retries_exhausted: {exc.__cause__}",
                                   event.supplier_id, event.lot_key)
        metrics.count("dead_lettered" if fresh else "deduplicated", event.supplier_id)
        decisions().error("event_dead_lettered", **_event_fields(event), replay=replay, reason="retries_exhausted",
                          detail=str(exc), first=fresh)  # fix
        return "dead_lettered"
    return settle(raw, event, outcome, replay)


def ingest(payloads: Sequence[RawPayload], replay: bool = False) -> dict[str, int]:
    """A message's payloads, in the order produced: one ledger transaction for all its events; when it
    meets a transient error, each payload alone, retried in place, so only the one at fault waits."""
    checked = [(raw, validate(raw)) for raw in payloads]
    events = [e for _, e in checked if isinstance(e, CriticalTrackingEvent)]
    try:
        with metrics.time_commit():
            decided = iter(ledger.commit_many(events, replay=replay))  # fix: one commit per message
    except TransientLedgerError as exc:  # rolled back whole: nothing of it was written
        metrics.retried()
        decisions().warning("message_rolled_back", event_id=None, lot_code=None, supplier=None, events=len(events),
                            error=type(exc).__name__)  # fix: its events go on one at a time
        return dict(Counter(ingest_one(raw, replay) for raw in payloads))
    return dict(Counter(set_aside(e) if isinstance(e, Quarantined) else settle(raw, e, next(decided), replay)
                        for raw, e in checked))  # quarantined after the commit: a redelivery keeps nothing twice


def turns() -> Turns:
    return Turns(*backend_redis(app))


def in_turn(shard: int, number: int) -> None:
    """fix: message ``number`` of its shard runs after ``number - 1``, even when that one was requeued behind it."""
    if turns().early(queue_name(shard), number):
        decisions().info("message_requeued", event_id=None, lot_code=None, supplier=None, shard=shard,
                         number=number, reason="its predecessor is not done")  # fix
        raise Reject(f"shard {shard} message {number} came before {number - 1}", requeue=True)


@app.task(bind=True)
def ingest_batch(self: Task[Any, Any], payloads: list[RawEvent], shard: int, number: int) -> dict[str, int]:
    """One shard's payloads, in the order produced; ``number``: the message's place in its shard."""
    in_turn(shard, number)  # fix: a requeued message is not passed
    counts = ingest(payloads)
    turns().done(queue_name(shard), number)
    return counts


@app.task(bind=True)
def replay_batch(self: Task[Any, Any], payloads: list[str], shard: int, number: int) -> dict[str, int]:
    """A held lot's dead letters, in the lot's order: each committed once, the lot released."""
    in_turn(shard, number)
    counts = ingest(payloads, replay=True)
    turns().done(queue_name(shard), number)
    return counts


def queue_of(shard: int) -> Queue:
    return SHARD_QUEUES[shard]


def queue_name(shard: int) -> str:
    return str(SHARD_QUEUES[shard].name)


def submit(payloads: list[RawEvent], size: int = BATCH) -> int:
    """Publish the burst: messages of up to ``size`` payloads of one shard, in stream order. How many."""
    sent = 0
    with app.producer_or_acquire() as producer:
        for shard, batch in batches(payloads, SHARDS, size):
            number = turns().take(queue_name(shard))  # fix: numbered in its shard, taken in that order
            ingest_batch.apply_async((batch, shard, number), queue=queue_of(shard), producer=producer)
            sent += 1
    return sent


def replay(limit: int = 10_000, source: Ledger | None = None) -> dict[str, int]:
    """Send every pending dead letter back through its lot's shard, each lot in its order. Lot to count.

    ``source``: the ledger to read them from, when not this module's (built at import, from the
    environment of that moment)."""
    by_lot: dict[str, list[tuple[int, str]]] = {}
    for letter in (source or ledger).pending_dead_letters(limit):
        event = validate(letter.payload)
        if isinstance(event, Quarantined) or letter.lot is None:
            continue  # not an event: only its producer can mend it
        by_lot.setdefault(letter.lot, []).append((event.seq or 0, letter.payload))
    with app.producer_or_acquire() as producer:
        for lot, letters in by_lot.items():
            shard = shard_of(lot, SHARDS)
            ordered = [p for _, p in sorted(letters, key=lambda letter: letter[0])]  # by seq; none sent: as dead-lettered
            replay_batch.apply_async((ordered, shard, turns().take(queue_name(shard))),
                                     queue=queue_of(shard), producer=producer)
    return {lot: len(letters) for lot, letters in by_lot.items()}


if __name__ == "__main__":  # submit the scenarios to the workers you started, then check them
    from case_studies.cte_ingestion.study import run_by_hand

    raise SystemExit(run_by_hand("fixed"))
