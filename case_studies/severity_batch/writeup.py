"""Case study 1, as the write-up publishes it: batch severity scoring in a chord of chunks.

"Orchestrating Batch Severity Scoring with Celery": open claims are chunked (500
ids in production; the lab's scenarios use smaller chunks), each chunk is a
``score_chunk`` task (acks late, reject on worker lost, prefetch 1, autoretry on
connection errors with exponential backoff, jitter and at most 5 retries), each
row is scored by the one scoring function, a poison row is quarantined and the
loop goes on, a row with no features is skipped, and every write is an upsert
keyed on ``(claim_id, run_id)``. The chord body ``reconcile`` sums the chunks
and raises ``BatchImbalance`` unless scored + quarantined + skipped equals the
claims dispatched; otherwise it signs the run's manifest.

The lab runs it unchanged but for two scales: ``retry_backoff_max = 1`` (the
write-up's backoff grows to minutes) and ``result_expires = 8`` (seconds), which
stands for Celery's default of one day that the write-up keeps, against a run
that takes longer. What its design does not consider, shown by ``--prove``:

- a chunk whose retries run out fails the chord: ``reconcile`` never runs, and
  the run is neither signed nor flagged;
- a chunk that returns after the chord's state expired (a straggler more than
  ``result_expires`` after the chunk before it) never completes the chord:
  ``reconcile`` silently never runs.

Its own design cannot make ``BatchImbalance`` fire: every row of a chunk is
scored, quarantined or skipped, or the chunk raises, so each chunk's counts add
up to its length; and a chunk that fails for good fails the chord before
``reconcile`` runs. The check guards nothing this code can produce (the runs
never see it fire); in ``fixed.py`` it fires because ``reconcile`` receives the
failed chunks as envelopes and counts them (SB5).

Departures the lab makes from the write-up's text, each keeping the mechanism:

| what | the write-up | the lab | why the mechanism is the same |
|---|---|---|---|
| chunk size | 500 ids | 250 in the scenarios | the same chord, eight chunks instead of four |
| backoff | exponential, growing to minutes | ``retry_backoff_max = 1`` s | the same autoretry, count and jitter, scaled in time |
| ``result_expires`` | Celery's default day | 8 s | a run longer than it, as one longer than a day |
| features | loaded per row, inside the per-row ``try`` (which catches ``PoisonClaim``) | the same: ``stand_ins.row_features`` per row, inside the ``try``; the extract holds the features, the call plays the scenario's faults on the chunk's first row | a 503 is not a ``PoisonClaim``: it leaves the row's ``try`` and the chunk retries whole; a 503 on a later row would redo the rows before it, which write nothing until the loop ends |
| writes | an upsert per row, keyed on ``(claim_id, run_id)`` | one upsert statement per chunk, the same key | a redelivered chunk rewrites the same keys; no row doubles either way |
| quarantine | a row per poison claim | the ledger's quarantine, which keeps a claim once per run | the counts ``reconcile`` sums come from the chunks' returns, not the table |
| logging | structlog lines for dispatch, poison, imbalance and completion | the same four, each with ``run_id``, to the run's file (``case_studies.logs``, ``sbw-<run>.jsonl``) | only the destination |

``fixed.py`` is the corrected program.
"""

from __future__ import annotations

from typing import Any, TypedDict

from celery import Task, chord, group
from celery.result import AsyncResult

from structlog.typing import FilteringBoundLogger

from case_studies.logs import event_log
from case_studies.severity_batch.claims import MODEL_VERSION, PoisonClaim, parse, score
from case_studies.severity_batch.ledger import Ledger
from case_studies.severity_batch.stand_ins import (ChunkRef, FeatureStoreUnavailable, RunSpec, chunks, extract,
                                                   lab_chunk_fault, row_features)
from lab.app import lab_app

app = lab_app(__name__, short="sbw")  # JSON only; queue, exchanges and result keys under the namespace
app.conf.task_acks_late = True
app.conf.task_reject_on_worker_lost = True
app.conf.worker_prefetch_multiplier = 1
app.conf.worker_concurrency = 2
app.conf.result_expires = 8  # the lab's scale for Celery's default (one day), which the write-up keeps

ledger = Ledger()  # the scores' SQL ledger (RCL_LEDGER_URL; SQLite under .lab/ by default), one engine per process


def log(run_id: str) -> FilteringBoundLogger:
    """The write-up's structured log (structlog, JSON lines), bound to the run."""
    return event_log("sbw", run_id).bind(run_id=run_id)


class ChunkCounts(TypedDict):
    chunk: str
    dispatched: int
    scored: int
    quarantined: int
    skipped: int


class BatchImbalance(Exception):
    """The chunks do not account for every claim dispatched."""


@app.task(bind=True, autoretry_for=(FeatureStoreUnavailable, TimeoutError), retry_backoff=True, retry_backoff_max=1,
          retry_jitter=True, max_retries=5)
def score_chunk(self: Task[Any, Any], chunk: ChunkRef) -> ChunkCounts:
    rows = extract(chunk)
    scored: list[tuple[str, Any]] = []
    quarantined: list[tuple[str, str]] = []
    skipped = 0
    for raw in rows:
        try:
            claim = parse(row_features(self, chunk, raw))  # write-up: features loaded per row, inside the row's try
        except PoisonClaim as exc:
            quarantined.append((raw["claim_id"], exc.reason))
            log(chunk["run"]).warning("claim_poison", claim_id=raw["claim_id"], reason=exc.reason)
            continue
        if claim is None:
            skipped += 1
            continue
        scored.append((claim.claim_id, score(claim)))
    ledger.upsert_scores(chunk["run"], scored, MODEL_VERSION)
    ledger.quarantine(chunk["run"], quarantined)
    lab_chunk_fault(self, chunk)  # the lab: what the scenario does to this chunk after its writes
    return {"chunk": chunk["doc"], "dispatched": len(rows), "scored": len(scored),
            "quarantined": len(quarantined), "skipped": skipped}


@app.task(bind=True)
def reconcile(self: Task[Any, Any], results: list[ChunkCounts], dispatched: int, run_id: str) -> dict[str, int]:
    totals = {k: sum(int(c[k]) for c in results) for k in ("scored", "quarantined", "skipped")}
    if sum(totals.values()) != dispatched:
        log(run_id).error("batch_imbalance", dispatched=dispatched, accounted=sum(totals.values()))
        raise BatchImbalance(f"dispatched {dispatched}, accounted {sum(totals.values())}")
    ledger.sign(run_id, MODEL_VERSION, dispatched, totals["scored"], totals["quarantined"], totals["skipped"])
    log(run_id).info("batch_complete", dispatched=dispatched, **totals)
    return {"dispatched": dispatched, **totals}


def submit(spec: RunSpec) -> AsyncResult[Any]:
    refs = chunks(spec)
    log(spec["run"]).info("batch_dispatched", claims=spec["claims"], chunks=len(refs))
    return chord(group(score_chunk.s(r) for r in refs))(reconcile.s(spec["claims"], spec["run"]))
