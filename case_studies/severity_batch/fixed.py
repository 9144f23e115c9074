"""Case study 1, fixed: overnight batch severity scoring that signs a run or says why not.

The write-up: "Orchestrating Batch Severity Scoring with Celery" (``writeup.py``
runs it as published) splits open claims into chunks, scores each chunk in a
chord of ``score_chunk`` tasks and reconciles in the chord body: scored +
quarantined + skipped must equal the claims dispatched before the run's
manifest is signed. A poison row is quarantined with its reason and its chunk
goes on; a row with no features is skipped; every write is an upsert keyed on
``(claim_id, run_id)``; acks late, reject on worker lost, a prefetch of 1, and
retries with exponential backoff and jitter for a feature store that fails.

What the runs show (``python run_all_fms.py --only severity_batch --prove``):
the row-level discipline holds. In scenario ``batch`` (2,000 claims, eight
chunks of 250) the manifest is signed with exactly 1,958 scored, 20 quarantined
and 22 skipped, the ledger holds each row once after a chunk retried twice and a
chunk whose process was killed after its writes, and a second submission of the
same run changes nothing. Two things it does not consider fail on its code:

- ``dead_chunk``: a chunk whose retries run out is a FAILURE chord member. The
  chord fails (``ChordError``), ``reconcile`` never runs, and the run is neither
  signed nor flagged: nobody is told;
- ``straggler``: the Redis backend keeps a chord's member count in a size key
  (``celery-taskset-meta-<group>.s``), set by ``celery.backends.redis.RedisBackend.set_chord_size``;
  each member's return refreshes its expiry in ``on_chord_part_return``, and the
  body is sent only when the size is still found. The expiry: in Celery 5.7,
  ``result_chord_expires``, which defaults to ``result_expires`` (the
  ``CHORD_PART_RETURN_LUA`` script refreshes it); in 5.5 and 5.6, which have no
  ``result_chord_expires``, ``result_expires`` itself (``RedisBackend.set`` and the
  ``expire`` calls of ``on_chord_part_return``'s pipeline). A chunk that returns more
  than that long after the one before it finds the key gone: the chord never
  completes, ``reconcile`` silently never runs (the lab scales the write-up's day of
  ``result_expires`` to 8 s and delays the last chunk 10 s; the run checks the size
  key is gone, on every version).

Fix:

- ``@enveloped`` (FM-1) on ``score_chunk``: a chunk that fails for good is a
  SUCCESS-state envelope, ``reconcile`` runs, counts it as failed and fails
  closed: it flags the run with the exact imbalance (``dispatched 2000, scored
  1713 + quarantined 18 + skipped 19 = 1750; failed chunks 1: ...``) and signs
  nothing;
- ``result_chord_expires`` above the run's deadline, whatever ``result_expires``
  says (it stays Celery's default day, 8 s at the lab's scale). That setting is new in
  Celery 5.7.0 (``celery.backends.base.BaseKeyValueStoreBackend.chord_expires``); 5.5
  and 5.6 ignore it, and there the fix is ``result_expires`` itself above the deadline,
  which keeps every result that long (the program sets it when ``lab.versions.CELERY``
  is older than 5.7; ``make matrix`` runs SB6 on each). And ``watch_runs``, a beat task that flags every run past its deadline
  with neither a manifest nor a flag (runs are registered with their deadline
  when submitted): every run is signed or flagged within ``DEADLINE_SECONDS``
  plus the watch's 1 s. A countdown task due at the deadline would be simpler,
  but on a quorum queue the worker would hold it in its static prefetch for the
  whole run (FM-5's hard variant);
- the FMs' other fixes where the write-up has their failure: ``wait_in`` for
  retries the broker holds (FM-5), a quorum queue with a delivery limit and the
  dead-letter drain for a chunk that kills its process on every delivery (FM-3);
  ``reject_unstored`` and the drain's ``send_back_rejected`` (FM-8: a chunk or
  ``reconcile`` whose result the backend cannot store is dead-lettered, not
  acked, and sent back once the backend answers; proven by ``fm8 S8``/``G8``);
  ``broker_channel_error_retry`` and
  ``worker_cancel_long_running_tasks_on_connection_loss`` (FM-9: a dropped
  broker connection cancels the running chunk, whose requeued message runs it
  again from the start, upserts and all, instead of beside it; a channel the
  broker closes is a reconnect, not the worker's end; ``fm9 S9``/``G9``). The
  chunks have no ``time_limit``, so FM-9's third part has nothing to lower.

Tradeoffs: the chunk size trades per-task overhead (Celery's and the ledger's
round trips per chunk) against the cost of redoing a lost chunk whole and the
parallelism of a small batch. ``bench/bench_severity.py`` measured, on a
two-core machine: 100,000 claims signed in 2.1 s in chunks of 500 (3.6 s with
the ledger on PostgreSQL); one task per claim, the FMs' shape, 110x slower at a
flat 3.1-3.5 s per 1,000 claims (the chord's join does not grow; each task's
own round trips do); chunks of 50, 500 and 5,000 on 20,000 claims in 2.2, 0.5
and 0.3 s;
a prefetch of 1 keeps a long chunk from holding others behind it, at one broker
round trip per chunk; ``result_chord_expires`` must outlive the longest run and
the deadline is the promise made to whoever signs the run (a run signed after
its deadline keeps the flag that says it was late: size the deadline to the
batch). A chunk's rows are
all written or all redone: a chunk killed after its writes writes them again
(an upsert, so no doubles).

Run it alone (from the repository's folder after ``make lab``; two shells):

    .venv/bin/celery -A case_studies.severity_batch.fixed worker --without-gossip --without-mingle --without-heartbeat -B
    .venv/bin/python -m case_studies.severity_batch.fixed

or ``.venv/bin/python run_all_fms.py --only severity_batch``.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any, TypedDict, cast

from celery import Task, chord, group
from celery.result import AsyncResult
from kombu import Exchange, Queue

from structlog.typing import FilteringBoundLogger

from case_studies.logs import event_log
from case_studies.severity_batch.claims import MODEL_VERSION, THRESHOLDS, PoisonClaim, assess, parse
from case_studies.severity_batch.ledger import Ledger
from case_studies.severity_batch.stand_ins import (ChunkRef, FeatureStoreUnavailable, RunSpec, chunk_name, chunks,
                                                   extract, feature_store, lab_chunk_fault)
from lab.app import lab_app
from lab.versions import CELERY
from shared.backend import backend_redis, reject_unstored
from shared.dlq import DeadLetteringQueue, count_starts, drain
from shared.envelope import Result, Wire, enveloped, is_envelope
from shared.retry import RetryPolicy, transient_retryable

DEADLINE_SECONDS = 20
"""Every run is signed or flagged within this (the lab's scale; production: the overnight window)."""

app = lab_app(__name__, short="sb")  # JSON only; queue, exchanges and result keys under the namespace
app.conf.task_acks_late = True  # write-up: ack when the chunk has returned
app.conf.task_reject_on_worker_lost = True  # write-up: a lost chunk is requeued
app.conf.worker_prefetch_multiplier = 1  # write-up: a long chunk holds no other behind it
app.conf.worker_concurrency = 2
app.conf.broker_channel_error_retry = True  # FM-9 (5.3+): a channel the broker closes is a reconnect
app.conf.worker_cancel_long_running_tasks_on_connection_loss = True  # FM-9 (5.1+): a lost connection stops the chunk
app.conf.result_expires = 8  # Celery's default (one day) at the lab's scale, as the write-up keeps it
app.conf.result_chord_expires = 3 * DEADLINE_SECONDS  # fix: the chord's state outlives the run's deadline (5.7+)
if CELERY < (5, 7):  # Celery 5.5/5.6 have no result_chord_expires: the fix is result_expires itself
    app.conf.result_expires = 3 * DEADLINE_SECONDS
QUEUE = app.conf.task_default_queue  # FM-3: a poison chunk is dead-lettered, not redelivered for ever
DLQ = Queue(f"{QUEUE}.dlq", Exchange(f"{QUEUE}.dlx"), routing_key=f"{QUEUE}.dlq")
app.conf.task_queues = [DeadLetteringQueue(QUEUE, Exchange(QUEUE), routing_key=QUEUE, dead_letters=DLQ,
    queue_arguments={"x-queue-type": "quorum", "x-delivery-limit": 2,
                     "x-dead-letter-exchange": DLQ.exchange.name, "x-dead-letter-routing-key": DLQ.routing_key})]
app.conf.beat_schedule = {"drain": {"task": f"{__name__}.drain_dead_letters", "schedule": 0.25},  # FM-3: -B
                          "watch": {"task": f"{__name__}.watch_runs", "schedule": 1.0}}  # fix: the deadline
count_starts(app)
reject_unstored(app)  # FM-8: an unstorable result dead-letters its message (the drain sends it back)
ledger = Ledger()  # the scores' SQL ledger (RCL_LEDGER_URL; SQLite under .lab/ by default), one engine per process


class ChunkCounts(TypedDict):
    chunk: str
    dispatched: int
    scored: int
    quarantined: int
    skipped: int


def decisions(run_id: str) -> FilteringBoundLogger:
    """fix: the run's decision log, one JSON line (structlog) per decision, each with ``run_id`` and
    ``model_version`` (``case_studies.logs``; a lab run's file is ``.lab/<namespace>/events/sb-<run>.jsonl``)."""
    return event_log("sb", run_id).bind(run_id=run_id, model_version=MODEL_VERSION)


class BatchImbalance(Exception):
    """The chunks do not account for every claim dispatched: the run is not signed."""


@app.task(bind=True)
@enveloped  # fix (FM-1): a chunk that fails for good is an envelope reconcile can count
@transient_retryable(RetryPolicy(max_retries=5, base=0.1, retry_on=(FeatureStoreUnavailable,)), wait_in=QUEUE)  # FM-5
def score_chunk(self: Task[Any, Any], chunk: ChunkRef) -> ChunkCounts:
    rows = extract(chunk)  # the staged extract of open claims
    feature_store(self, chunk)  # the feature service; a 503 is retried with backoff and jitter
    log = decisions(chunk["run"]).bind(chunk=chunk["doc"].rsplit("/", 1)[-1], retries=self.request.retries)  # fix
    scored: list[tuple[str, Any]] = []
    quarantined: list[tuple[str, str]] = []
    skipped, tiers = 0, Counter[str]()
    for raw in rows:
        try:
            claim = parse(raw)
        except PoisonClaim as exc:  # write-up: a bad row is quarantined, the chunk goes on
            quarantined.append((raw["claim_id"], exc.reason))
            log.warning("claim_quarantined", claim_id=raw["claim_id"], reason=exc.reason)  # fix: every decision
            continue
        if claim is None:  # write-up: no features, nothing to score
            skipped += 1
            log.info("claim_skipped", claim_id=raw["claim_id"], reason="no_features")  # fix
            continue
        severity = assess(claim)  # the score, and its tier under the versioned thresholds
        scored.append((claim.claim_id, severity.score))
        tiers[severity.tier] += 1
        if severity.excess_of_limit:  # fix: an excess-of-limit claim is scored and flagged, not quarantined
            log.warning("claim_excess_of_limit", claim_id=claim.claim_id, score=str(severity.score), tier=severity.tier,
                        loss=str(claim.loss_amount), limit=str(claim.coverage_limit))
    ledger.upsert_scores(chunk["run"], scored, MODEL_VERSION)  # write-up: keyed on (claim_id, run_id)
    ledger.quarantine(chunk["run"], quarantined)
    lab_chunk_fault(self, chunk)  # the lab: what the scenario does to this chunk after its writes
    log.info("chunk_scored", dispatched=len(rows), scored=len(scored), quarantined=len(quarantined),
             skipped=skipped, tiers=dict(tiers), thresholds=THRESHOLDS.version)  # fix
    return {"chunk": chunk["doc"], "dispatched": len(rows), "scored": len(scored),
            "quarantined": len(quarantined), "skipped": skipped}


@app.task(bind=True)
@enveloped  # FM-1
def reconcile(self: Task[Any, Any], results: list[Wire], dispatched: int, run_id: str) -> dict[str, int]:
    ok = [cast(ChunkCounts, Result.from_wire(w).payload) for w in results if is_envelope(w) and Result.from_wire(w).ok]
    failed = [f"{run_id}/{chunk_name(i)}" for i, w in enumerate(results)  # header order is chunk order
              if not (is_envelope(w) and Result.from_wire(w).ok)]
    totals = {k: sum(int(c[k]) for c in ok) for k in ("scored", "quarantined", "skipped")}
    accounted = sum(totals.values())
    if failed or accounted != dispatched:  # fix: fail closed, and say the numbers
        detail = (f"dispatched {dispatched}, scored {totals['scored']} + quarantined {totals['quarantined']} + "
                  f"skipped {totals['skipped']} = {accounted}; failed chunks {len(failed)}: {', '.join(failed)}")
        ledger.flag(run_id, "imbalance", detail)
        decisions(run_id).error("run_imbalance", dispatched=dispatched, accounted=accounted, **totals,
                                failed_chunks=[f.rsplit("/", 1)[-1] for f in failed])  # fix: every decision
        raise BatchImbalance(detail)
    new = ledger.sign(run_id, MODEL_VERSION, dispatched, totals["scored"], totals["quarantined"], totals["skipped"])
    decisions(run_id).info("run_signed", dispatched=dispatched, **totals, first_signature=new)  # fix
    return {"dispatched": dispatched, **totals}


@app.task(ignore_result=True)
def watch_runs() -> None:  # fix: on beat; a run past its deadline with no manifest and no flag is flagged
    r, prefix = backend_redis(app)
    for run_id in cast(list[str], cast(Any, r).zrangebyscore(f"{prefix}runs:open", 0, time.time())):
        flagged = ledger.manifest(run_id) is None and not ledger.flags(run_id)
        if flagged:
            ledger.flag(run_id, "not reconciled", f"no manifest and no flag {DEADLINE_SECONDS}s after submission")
        r.zrem(f"{prefix}runs:open", run_id)
        if flagged:
            decisions(run_id).error("run_not_reconciled", deadline_seconds=DEADLINE_SECONDS)  # fix


@app.task(ignore_result=True)
def drain_dead_letters() -> int:  # FM-3
    return drain(app, DLQ, send_back_rejected=True)  # FM-8: a letter rejected unstored runs again


def submit(spec: RunSpec) -> AsyncResult[Any]:
    """A chord of ``score_chunk`` over the run's chunks, ``reconcile`` once all have returned."""
    runs, prefix = backend_redis(app)
    runs.zadd(f"{prefix}runs:open", {spec["run"]: time.time() + DEADLINE_SECONDS})  # fix: watched until its deadline
    parts = chunks(spec)
    decisions(spec["run"]).info("run_dispatched", claims=spec["claims"], chunks=len(parts),
                                chunk_size=spec["chunk_size"], deadline_seconds=DEADLINE_SECONDS)  # fix
    return chord(group(score_chunk.s(c) for c in parts))(reconcile.s(spec["claims"], spec["run"]))


if __name__ == "__main__":  # submit the scenario to a worker you started, then check it
    from case_studies.severity_batch.study import run_by_hand

    raise SystemExit(run_by_hand("fixed"))
