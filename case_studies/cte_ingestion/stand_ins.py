"""What the CTE programs need around them, as the lab stands it in: shards, the ledger's faults.

Not the lesson and not a fix:

- ``shard_of(lot, shards)``: a lot's shard by a stable hash (sha256 of the lot code, the first
  8 bytes as an integer, modulo the shard count). Python's ``hash()`` of a string changes with
  every process (``PYTHONHASHSEED``): two producers would send one lot to two shards;
- ``batches(payloads, shards, size)``: the producer's messages, per shard, in stream order: each
  message carries up to ``size`` payloads of one shard, so a shard's messages, read one after
  the other, give each of its lots' events in the order produced;
- ``LedgerFaults(app)``: the ledger's fault hook (``Ledger(fault=...)``), run inside the commit's
  transaction. The runner writes a plan, idempotency key to fault (``plan_faults``), under the
  program's Redis prefix before it publishes; each process reads it once, at its first commit
  (a worker started by hand keeps the plan it read: start it again for another plan). Attempts
  of a planned key are counted in Redis (``INCR``), across retries, redeliveries and replays:
  ``FLAKY:n`` raises ``TransientLedgerError`` on attempts 1..n (a lost connection, a lock
  timeout); ``FLAKE_FOREVER`` raises it on every attempt until the runner ``repair``s the
  event (the operator mended the cause, then replays); ``CRASH_ONCE`` SIGKILLs the process on
  attempt 1, before the commit (the transaction dies with the process, as a power cut would
  leave it). ``set_outage(app, True)`` takes the ledger down for every event until
  ``set_outage(app, False)``: each commit raises ``TransientLedgerError`` (the runner ends it on what
  it observes, once the outage has outlasted an event's whole backoff). Only commits fail: the
  dead-letter and quarantine tables still answer (a database wholly down would refuse the fixed
  program's dead letter too, which is not built here);
- ``as_published(payload)`` and ``ledger_event(fields, payload)``: what the write-up's program
  (``writeup.py``) needs around it. Its model reads its own field names (``timestamp`` for the
  stream's ``event_time``); it gives no ledger, so the lab's takes a row built from the event it
  validated, not validated again, with what its model ignores from the payload (the supplier, the
  unit, ``seq``: the producer's order, which only the lab's check of each lot's order reads).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from typing import Any, cast

from celery import Celery

from case_studies.cte_ingestion.events import CriticalTrackingEvent, RawEvent, idempotency_key, lot_key_of
from case_studies.cte_ingestion.ledger import TransientLedgerError
from lab.faults import Fault, kill_self
from shared.backend import backend_redis


def shard_of(lot_code: str, shards: int) -> int:
    """The lot's shard, the same in every process and on every host."""
    return int.from_bytes(hashlib.sha256(lot_code.encode()).digest()[:8], "big") % shards


def lot_of(payload: RawEvent) -> str:
    """The payload's lot as sent (``events.lot_key_of``: its lot code, or a harvest's key; an invalid payload
    still names its lot, as text)."""
    return lot_key_of(payload)


def batches(payloads: Sequence[RawEvent], shards: int, size: int) -> list[tuple[int, list[RawEvent]]]:
    """``(shard, payloads)`` messages, each shard's in stream order, interleaved across shards."""
    open_batches: dict[int, list[RawEvent]] = {}
    out: list[tuple[int, list[RawEvent]]] = []
    for payload in payloads:
        shard = shard_of(lot_of(payload), shards)
        batch = open_batches.setdefault(shard, [])
        batch.append(payload)
        if len(batch) == size:
            out.append((shard, batch))
            open_batches[shard] = []
    out.extend((shard, batch) for shard, batch in sorted(open_batches.items()) if batch)
    return out


def as_published(payload: RawEvent) -> RawEvent:
    """The stream's payload under the write-up's field names: ``event_time`` sent as ``timestamp``."""
    return {("timestamp" if k == "event_time" else k): v for k, v in payload.items()}


def ledger_event(fields: Mapping[str, Any], payload: Mapping[str, Any]) -> CriticalTrackingEvent:
    """The ledger's row of an event the write-up's model validated (``fields``: its ``model_dump()``), as it is."""
    seq = payload.get("seq")
    return CriticalTrackingEvent.model_construct(
        supplier_id=str(payload.get("supplier_id", "unknown")), lot_code=fields["lot_code"],
        event_type=fields["event_type"], location_gln=fields["location_gln"], gtin=fields["gtin"],
        event_time=fields["timestamp"], quantity=fields["quantity"],
        unit_of_measure=str(payload.get("unit_of_measure", "")), source_event_id=fields["source_event_id"],
        seq=seq if isinstance(seq, int) else None)


def _faults_key(prefix: str) -> str:
    return f"{prefix}ledger-faults"


def _attempts_key(prefix: str, key: str) -> str:
    return f"{prefix}ledger-attempts:{key}"


def _repaired_key(prefix: str) -> str:
    return f"{prefix}ledger-repaired"


def _down_key(prefix: str) -> str:
    return f"{prefix}ledger-down"


def set_outage(app: Celery, down: bool) -> None:
    """Take the ledger's commits down (``down``) or bring them back, for every process at once."""
    r, prefix = backend_redis(app)
    if down:
        r.set(_down_key(prefix), "1", ex=3600)
    else:
        r.delete(_down_key(prefix))


def repair(app: Celery, key: str) -> None:
    """The operator mended what failed ``key``'s commits (a ``FLAKE_FOREVER`` fault stops)."""
    r, prefix = backend_redis(app)
    r.sadd(_repaired_key(prefix), key)
    r.expire(_repaired_key(prefix), 3600)


def plan_faults(app: Celery, plan: Mapping[str, Fault]) -> None:
    """Write the run's plan (idempotency key -> fault) and forget earlier attempts and repairs."""
    r, prefix = backend_redis(app)
    r.delete(_faults_key(prefix), _repaired_key(prefix), *(_attempts_key(prefix, key) for key in plan))
    if plan:
        r.hset(_faults_key(prefix), mapping={key: fault.to_wire() for key, fault in plan.items()})
    r.expire(_faults_key(prefix), 3600)


def attempts(app: Celery, key: str) -> int:
    """How often the ledger was asked to commit the planned event ``key``."""
    r, prefix = backend_redis(app)
    return int(cast(Any, r.get(_attempts_key(prefix, key))) or 0)


class LedgerFaults:
    """The ledger's fault hook: plays the plan's fault for a planned event (see the module)."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self._plan: tuple[int, dict[str, Fault]] | None = None  # (pid, plan), read once per process

    def plan(self) -> dict[str, Fault]:
        if self._plan is None or self._plan[0] != os.getpid():
            r, prefix = backend_redis(self.app)
            raw = cast(dict[str, str], r.hgetall(_faults_key(prefix)))
            self._plan = (os.getpid(), {key: Fault.from_wire(text) for key, text in raw.items()})
        return self._plan[1]

    def __call__(self, cte: CriticalTrackingEvent) -> None:
        key = idempotency_key(cte)
        r, prefix = backend_redis(self.app)
        if r.exists(_down_key(prefix)):
            raise TransientLedgerError("the ledger is down (an outage)")
        fault = self.plan().get(key)
        if fault is None:
            return
        attempt = int(r.incr(_attempts_key(prefix, key)))
        r.expire(_attempts_key(prefix, key), 3600)
        if fault.kind == "FLAKY" and attempt <= fault.times:
            raise TransientLedgerError(f"the ledger's connection dropped (attempt {attempt})")
        if fault.kind == "CRASH_ONCE" and attempt == 1:
            kill_self()
        if fault.kind == "FLAKE_FOREVER" and not r.sismember(_repaired_key(prefix), key):
            raise TransientLedgerError(f"the ledger's connection dropped (attempt {attempt})")
