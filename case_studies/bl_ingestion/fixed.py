"""Case study 2, fixed: bulk Bill-of-Lading ingestion on a Redis broker that loses no consignment.

The write-up: "bulk B/L ingestion with Celery" (``writeup.py`` runs it as
published) splits a UN/EDIFACT IFCSUM manifest into one unit per ``CNI``
consignment group and runs a chord of ``parse_bl`` over the units with an
``aggregate_batch`` body that forwards the parsed B/Ls to the terminal operating
system (TOS). Redis is the broker: acks late, reject on worker lost, prefetch 1,
a ``visibility_timeout``. ``parse_bl`` retries connection errors with backoff
``min(2^n x 10, 600)`` s, at most 4 times, and dead-letters any other error as a
JSON record on a Redis list, returning a sentinel so that the chord completes;
``aggregate_batch`` guards itself with ``SET NX`` on the batch id; a replay job
``BRPOP``s the list and re-enqueues each unit with ``parse_bl.delay``. Redis
gives none of RabbitMQ's guards: no quorum queue, no delivery limit, and a
message that a worker holds longer than ``visibility_timeout`` is handed to
another worker while the first still runs (``QoS.restore_visible`` in
``kombu/transport/redis.py`` puts back every unacked message older than the
timeout; a worker runs it when it starts, then its event loop every 10 s,
scanning every 10th time, so about every 100 s, in kombu 5.5 to 5.7 (read in
each version's source, not run); the lab's
``slow_parse`` runs the same sweep every 0.25 s, as a worker starting then would:
``study.sweep``).

What the runs show (``python run_all_fms.py --only bl_ingestion --prove``): each
mistake of the write-up by a run of its code, and its fix by a run of this file.

- ``exhausted``: a unit whose registry refuses five connections exhausts its
  retries; the write-up re-raises, the chord fails and nothing is forwarded;
- ``replay``: the replayer is killed between its pop and the re-enqueue; the
  write-up loses the unit, and the unit it does replay is parsed and never
  forwarded (``parse_bl.delay`` has no chord, so no aggregate sees it);
- ``resend``: the carrier re-sends the manifest under a new batch id. The
  write-up's forward is keyed on the B/L number, so a real B/L is booked once;
  every unit it made a number up for is booked again under the new batch's
  made-up number: the two consignments without ``RFF+BM`` and the phantom unit
  of its split (its split on ``CNI+`` text makes 41 units of the 40
  consignments: a shipper's name ending in ``TECNI`` is followed by ``+``, and
  the piece from there carries that consignment's containers under
  ``<batch>-28``; its own B/L is booked from a piece with no container);
- ``aggregate_crash``: ``aggregate_batch`` is killed after its ``SET NX``; its
  redelivery finds the key and skips, and the batch is never forwarded;
- ``slow_parse``: a parse that takes longer than ``visibility_timeout`` runs
  again while it still runs (twice in most runs; a copy that waits unacked past
  the timeout in turn is handed out a third time), and its dead-letter is pushed
  once per run;
- ``outage``: the whole container registry is down until every unit has used
  its 1 + 4 attempts, longer than the write-up's whole backoff (1.5 s at the
  lab's scale, 150 s as published); every unit's retries re-raise, the chord
  fails and nothing is dead-lettered, so the replay has nothing to mend: the
  manifest is lost until the carrier sends it again. Here every unit is
  dead-lettered ``retries_exhausted``, the chord completes, and one replay
  once the registry is back books every valid B/L once;
- ``poison_replay``: one run of the write-up's replay pops its bad-check-digit
  unit, re-enqueues it, the unit is dead-lettered again and popped again: 200
  times, its bound, and the record is back in the list at the end. Here that
  unit is booked (its container refused alone) and what only the carrier can
  mend goes to the rejected list, which no replay reads;
- in every run, a unit with ``RFF+BN`` only or no reference is booked by the
  write-up's code under a made-up ``<batch>-<index>`` number, although its text
  says such a unit is dead-lettered with a precise reason.

Fix:

- units are parsed in chunks of ``CHUNK_SIZE`` (``parse_units``), each unit on
  its own inside: a unit the registry refuses waits for the chunk's retry (the
  retry carries only the refused units and what is already parsed, with FM-5's
  backoff and jitter); a unit whose retries run out is dead-lettered with the
  reason ``retries_exhausted`` and the chunk returns: the chord completes. One
  task per unit, the write-up's shape, is the chord's own cost:
  ``bench/bench_bl.py`` on the lab's two-core machine, shared with other
  runs (load average about 4), took a 4,000 consignment manifest end to end
  in 12.8 s in chunks of 50 (4.7 s of it the dispatch: pydifact's split and
  the chord), against 57.2 s for the write-up's one task per unit (19.5 s of
  it sending 4,114 messages; Celery's publish and round trips per task);
- ``@enveloped`` (FM-1) on ``parse_units``: a chunk that fails for good (its
  ``time_limit``, FM-6) is an envelope, the chord completes, and
  ``aggregate_batch`` dead-letters its units with the envelope's reason;
- ``DeadLetters`` (``dead_letters.py``): ``take`` moves a record to a
  processing list atomically, ``done`` removes it once the re-enqueue returned,
  ``reap`` returns a dead replayer's records; a replay is a chord of its own
  with an ``aggregate_batch`` body, so replayed units are forwarded;
- the key names the consignment (carrier and B/L number,
  ``manifest.consignment_key``), and the TOS books a key once;
- FM-4's claim (``shared.claim``: the owner's redelivery resumes; ``sent`` only
  once every B/L is forwarded) with the consignment key as the TOS's idempotency
  key, so a crash in the middle of forwarding books nothing twice;
- ``visibility_timeout`` sized above the hard deadline (FM-6's ``time_limit``)
  and the longest retry countdown, and every side effect keyed
  (``DeadLetters.put`` once per key; the TOS once per key);
- a unit with no B/L is rejected with its reason (``manifest.parse_unit``); a
  container with a bad check digit is refused alone (one ``container_rejected``
  line), and its B/L is booked with its other containers;
- the manifest's bytes are decoded in the character set its ``UNB`` names
  (``manifest.decode_interchange``), never with replacement.
- FM-8 on a Redis broker: ``reject_unstored(app, requeue=True)``. A result the
  backend cannot store after the body (a backend that blinks, or that lives on
  another server than the broker) is otherwise a failure outside the body,
  which Celery acks: the chunk's outcome is stored nowhere and its chord never
  completes. FM-8's guard rejects instead; Redis has no dead-letter exchange,
  so where fm8 rejects without requeue (which would delete the message here)
  this one requeues: kombu's Redis ``QoS.reject`` puts the message back at its
  queue's head and it runs again, at once and again while the backend is gone
  (every effect is keyed, so nothing doubles). ``tests/test_backend_requeue.py``
  runs the three on a Redis broker with a backend it stops: no guard, the
  message acked and its result nowhere; the guard without requeue, dropped; with
  requeue, run again until the backend is back, then stored.

Two lists: ``dead`` holds what a replay can mend (a registry down past the
retries, a container the registry did not know yet); ``rejected`` holds what
only the carrier can mend (no B/L, a bad check digit): replaying it would only
dead-letter it again. Every dead-letter, rejection, replay and aggregate is one
JSON log line (structlog) with the batch id and the B/L number.

Tradeoffs: a chunk is parsed again whole when its process dies (every effect is
keyed, so nothing doubles), and its units wait for its slowest one; the claim and
the keyed TOS cost a Redis round trip per batch and one per booking; ``visibility_timeout`` above every deadline means a worker that
dies holding a message (a lost connection, not a killed pool process, which
``task_reject_on_worker_lost`` requeues at once) delays that unit by the whole
timeout; the reaper's ``STALE_SECONDS`` trades a slow return of a dead replayer's
records against a second replay of a slow one (harmless: every effect is keyed).
Redis still has no delivery limit: a unit that kills its process on every
delivery is requeued for ever (``count_starts`` would give the bound FM-3's
quorum queue gives; not built here).

Run it alone (from the repository's folder after ``make lab``; two shells):

    .venv/bin/celery -A case_studies.bl_ingestion.fixed worker --without-gossip --without-mingle --without-heartbeat
    .venv/bin/python -m case_studies.bl_ingestion.fixed

or ``.venv/bin/python run_all_fms.py --only bl_ingestion``.
"""

from __future__ import annotations

import json
from typing import Any, TypedDict, cast

from celery import Task, chord, group
from celery.result import AsyncResult

from case_studies.bl_ingestion.dead_letters import DeadLetters
from case_studies.bl_ingestion.logs import event_log
from case_studies.bl_ingestion.manifest import (MalformedInterchange, UnitRejected, bill_of_lading, consignment_key,
                                                encode_interchange, parse_unit, split, unit_key)
from case_studies.bl_ingestion.stand_ins import (RegistryUnavailable, Terminal, UnitRef, UnknownContainer, crash_point,
                                                 registry, run_of, unit_name)
from lab.app import lab_app
from shared.backend import backend_redis, reject_unstored
from shared.claim import NotifyClaim
from shared.envelope import Result, Wire, enveloped
from shared.retry import RetryPolicy
from shared.timeouts import BackstopRequest

CHUNK_SIZE = 50  # fix: units per parse task (bench/bench_bl.py: one task per unit is the chord's own cost)
TIME_LIMIT = 10  # FM-6: no chunk runs longer (seconds)
RETRY = RetryPolicy(max_retries=4, base=0.1, cap=6.0)  # write-up: 4 retries, backoff (with jitter, FM-5)
VISIBILITY_SECONDS = 30
"""fix: above TIME_LIMIT plus the longest retry countdown the worker holds unacked (2 x 0.8 s);
the lab's scale of the write-up's 3,600 s."""
STALE_SECONDS = 2.0  # fix: a record this long in the processing list lost its replayer

app = lab_app(__name__, short="bl", broker="redis")  # JSON only; every Redis key under the namespace
app.conf.task_acks_late = True  # write-up: ack when the unit has returned
app.conf.task_reject_on_worker_lost = True  # write-up: a killed process requeues its unit
app.conf.worker_prefetch_multiplier = 1  # write-up
app.conf.worker_concurrency = 2
app.conf.broker_transport_options.update(visibility_timeout=VISIBILITY_SECONDS)  # fix: sized above every deadline
reject_unstored(app, requeue=True)  # FM-8 on a Redis broker: an unstorable result sends its message back


class Parsed(TypedDict):
    doc: str  # the unit's name, <batch>-blNNNN
    batch: str
    status: str  # ok | rejected | dead_lettered
    bl: str | None
    key: str


class ChunkRef(TypedDict):
    doc: str  # <run>/<batch>-cNNN: the lab's observer follows a chunk as the FMs follow a document
    batch: str
    units: list[UnitRef]  # the units still to parse (a retry carries only those that met a refusal)
    done: list[Parsed]  # what earlier attempts of this chunk parsed


class BatchCounts(TypedDict):
    batch: str
    forwarded: int
    booked: int
    rejected: int
    dead_lettered: int
    sent: bool


def stores() -> tuple[DeadLetters, DeadLetters]:
    """``(dead, rejected)``: what a replay can mend, and what only the carrier can."""
    r, prefix = backend_redis(app)
    return DeadLetters(r, prefix, "dead"), DeadLetters(r, prefix, "rejected")


def park(unit: UnitRef, store: DeadLetters, reason: str, detail: str, bl: str | None = None) -> Parsed:
    """Dead-letter (or reject) ``unit`` once, with one JSON log line (fix: every side effect keyed)."""
    bl = bl or bill_of_lading(unit["raw"])  # its RFF+BM, when it has one
    record = {"unit": unit, "batch": unit["batch"], "bl": bl, "raw": unit["raw"], "reason": reason, "detail": detail}
    if store.put(unit_key(unit["carrier"], unit["raw"]), record):
        event = "unit_rejected" if store.list.endswith("rejected") else "unit_dead_lettered"
        event_log(run_of(unit)).warning(event, batch_id=unit["batch"], bl_number=bl, unit=unit["index"], reason=reason,
                                         detail=detail)
    status = "rejected" if store.list.endswith("rejected") else "dead_lettered"
    return {"doc": unit_name(unit["batch"], unit["index"]), "batch": unit["batch"], "status": status, "bl": bl, "key": ""}


def parse_one(unit: UnitRef) -> Parsed:
    _, rejected = stores()
    try:
        consignment = parse_unit(unit["raw"])  # pydifact segments, ISO 6346 check digits (python-stdnum)
    except UnitRejected as exc:  # fix: a precise reason, in the rejected list (only the carrier can mend it)
        return park(unit, rejected, exc.reason, str(exc), exc.bl_number)
    for refused in consignment.rejected_containers:  # fix: a bad container is refused alone, the B/L goes on
        event_log(run_of(unit)).warning("container_rejected", batch_id=unit["batch"], bl_number=consignment.bl_number,
                                         unit=unit["index"], container=refused.number, reason=refused.reason,
                                         detail=refused.detail)
    return {"doc": unit_name(unit["batch"], unit["index"]), "batch": unit["batch"], "status": "ok",
            "bl": consignment.bl_number,
            "key": consignment_key(unit["carrier"], consignment.bl_number)}  # fix: the consignment, not the batch


@app.task(bind=True, time_limit=TIME_LIMIT, Request=BackstopRequest)  # FM-6: killed past the deadline, an envelope
@enveloped  # fix (FM-1): a chunk that fails for good is an envelope; the chord completes
def parse_units(self: Task[Any, Any], chunk: ChunkRef) -> list[Parsed]:
    done, waiting = list(chunk["done"]), list[UnitRef]()
    dead, _ = stores()
    for unit in chunk["units"]:
        try:
            registry(unit)  # the container registry: connection refused, unknown container, slow
        except RegistryUnavailable:  # write-up: retried with backoff
            waiting.append(unit)
            continue
        except UnknownContainer as exc:  # fix: dead-lettered at once with its reason; a replay may find it
            done.append(park(unit, dead, "unknown_container", str(exc)))
            continue
        done.append(parse_one(unit))
    if waiting and self.request.retries < RETRY.max_retries:  # fix: only the refused units wait for the retry
        raise self.retry(args=({**chunk, "units": waiting, "done": done},), countdown=RETRY.delay(self.request.retries),
                         max_retries=RETRY.max_retries)
    for unit in waiting:  # fix: retries run out: dead-lettered with the reason, the chord completes
        done.append(park(unit, dead, "retries_exhausted", f"registry refused {self.request.retries + 1} attempts"))
    return done


@app.task(bind=True)
@enveloped  # FM-1
def aggregate_batch(self: Task[Any, Any], results: list[Wire], batch_id: str, run_id: str) -> BatchCounts:
    claim = NotifyClaim.of(app, f"batch:{batch_id}", owner=self.request.id)  # fix (FM-4): the owner resumes
    if (state := claim.acquire()) == "busy":
        raise self.retry(countdown=claim.policy.poll, max_retries=claim.policy.busy_retries)
    envelopes = [Result.from_wire(w) for w in results]
    parsed = [p for e in envelopes if e.ok for p in cast(list[Parsed], e.payload)]
    counts: BatchCounts = {"batch": batch_id, "forwarded": 0, "booked": 0, "sent": False,
                           "rejected": sum(1 for p in parsed if p["status"] == "rejected"),
                           "dead_lettered": sum(1 for p in parsed if p["status"] == "dead_lettered")}
    if state == "done":
        return counts
    log, tos = event_log(run_id), Terminal(run_id)
    with claim.sending():  # released if forwarding fails, "sent" once every B/L is forwarded
        crash_point(run_id, "aggregate:after_claim")  # the lab
        dead, _ = stores()
        for chunk, env in zip(_chunks(batch_id), envelopes):  # fix: a chunk that failed for good: its units
            if not env.ok:  # are dead-lettered with the envelope's reason (a time limit, a crash)
                for unit in chunk:
                    park(unit, dead, env.reason or "error", env.error or "")
                    counts["dead_lettered"] += 1
        for p in (p for p in parsed if p["status"] == "ok"):
            counts["booked"] += tos.book(str(p["bl"]), p["key"], p["batch"])  # fix: the TOS books a key once
            counts["forwarded"] += 1
            crash_point(run_id, "aggregate:mid_forward")  # the lab
    counts["sent"] = True
    log.info("batch_aggregated", batch_id=batch_id, bl_number=None, **{k: v for k, v in counts.items() if k != "batch"})
    return counts


@app.task(bind=True)
def replay_dead_letters(self: Task[Any, Any], limit: int = 1000) -> str | None:
    """Re-enqueue the dead list as a chord of its own (fix: its units are aggregated and forwarded)."""
    dead, _ = stores()
    dead.reap(STALE_SECONDS)  # fix: a dead replayer's records go back to the dead list
    taken: list[str] = []
    while len(taken) < limit and (item := dead.take()) is not None:  # fix: moved, not popped
        taken.append(item)
        crash_point(run_of(json.loads(item)["unit"]), "replay:after_take")  # the lab
    if not taken:
        return None
    units = [cast(UnitRef, json.loads(item)["unit"]) for item in taken]
    run_id = run_of(units[0])
    body = dispatch(units, f"{units[0]['batch']}.replay-{str(self.request.id)[:8]}", run_id)
    for item, unit in zip(taken, units):  # fix: forgotten only once the re-enqueue has returned
        dead.done(item)
        event_log(run_id).info("unit_replayed", batch_id=unit["batch"], bl_number=bill_of_lading(unit["raw"]),
                               unit=unit["index"],
                               replay_batch=str(body.id))
    return str(body.id)


@app.task(bind=True)
def dispatch_manifest(self: Task[Any, Any], payload: bytes, batch_id: str, run_id: str,
                      chunk_size: int = CHUNK_SIZE) -> str:
    """Decode the manifest's bytes in the character set its UNB names, split it (pydifact) and send the chord;
    returns the chord body's task id. A manifest that cannot be read whole is refused whole, with its reason."""
    try:
        found = split(payload)  # fix: the UNB's character set, not UTF-8 with replacement
    except MalformedInterchange as exc:
        event_log(run_id).error("manifest_rejected", batch_id=batch_id, bl_number=None, reason=exc.reason,
                                detail=exc.detail, size=len(payload))
        raise
    units = [UnitRef(doc=f"{run_id}/{unit_name(batch_id, u.index)}", batch=batch_id, carrier=u.carrier, index=u.index,
                     raw=u.raw) for u in found]
    event_log(run_id).info("manifest_dispatched", batch_id=batch_id, bl_number=None, units=len(units),
                           chunks=-(-len(units) // chunk_size), size=len(payload))
    return str(dispatch(units, batch_id, run_id, chunk_size).id)


def _chunks(batch_id: str) -> list[list[UnitRef]]:
    r, prefix = backend_redis(app)
    return [cast(list[UnitRef], json.loads(x)) for x in cast(list[str], r.lrange(f"{prefix}chunks:{batch_id}", 0, -1))]


def dispatch(units: list[UnitRef], batch_id: str, run_id: str, chunk_size: int = CHUNK_SIZE) -> AsyncResult[Any]:
    """A chord of ``parse_units`` over chunks of ``units``, ``aggregate_batch`` once all have returned; the
    chunks kept in Redis (a day) for the aggregate to dead-letter a chunk that failed for good."""
    parts = [units[i:i + chunk_size] for i in range(0, len(units), chunk_size)]
    r, prefix = backend_redis(app)
    key = f"{prefix}chunks:{batch_id}"
    r.delete(key)
    if parts:
        r.rpush(key, *(json.dumps(p) for p in parts))
    r.expire(key, 86_400)
    header = group(parse_units.s(ChunkRef(doc=f"{run_id}/{batch_id}-c{i:03d}", batch=batch_id, units=p, done=[]))
                   for i, p in enumerate(parts))
    return chord(header)(aggregate_batch.s(batch_id, run_id))


def submit(manifest: str | bytes, batch_id: str, run_id: str, chunk_size: int = CHUNK_SIZE) -> AsyncResult[Any]:
    """Send the manifest's bytes (text is encoded in the character set its UNB names) to ``dispatch_manifest``;
    its result is the chord body's task id."""
    payload = encode_interchange(manifest) if isinstance(manifest, str) else manifest
    return dispatch_manifest.delay(payload, batch_id, run_id, chunk_size)


def replay() -> AsyncResult[Any]:
    return replay_dead_letters.delay()


if __name__ == "__main__":  # submit the scenarios to a worker you started, then check them
    from case_studies.bl_ingestion.study import run_by_hand

    raise SystemExit(run_by_hand("fixed"))
