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

``fixed.py`` is the corrected program.
"""

from __future__ import annotations

from typing import Any, TypedDict

from celery import Task, chord, group
from celery.result import AsyncResult

from case_studies.severity_batch.claims import MODEL_VERSION, PoisonClaim, parse, score
from case_studies.severity_batch.ledger import Ledger
from case_studies.severity_batch.stand_ins import (ChunkRef, FeatureStoreUnavailable, RunSpec, chunks, extract,
                                                   feature_store, lab_chunk_fault)
from lab.app import lab_app

app = lab_app(__name__, short="sbw")  # JSON only; queue, exchanges and result keys under the namespace
app.conf.task_acks_late = True
app.conf.task_reject_on_worker_lost = True
app.conf.worker_prefetch_multiplier = 1
app.conf.worker_concurrency = 2
app.conf.result_expires = 8  # the lab's scale for Celery's default (one day), which the write-up keeps

ledger = Ledger()  # the scores' SQL ledger (RCL_LEDGER_URL; SQLite under .lab/ by default), one engine per process


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
    feature_store(self, chunk)
    scored: list[tuple[str, Any]] = []
    quarantined: list[tuple[str, str]] = []
    skipped = 0
    for raw in rows:
        try:
            claim = parse(raw)
        except PoisonClaim as exc:
            quarantined.append((raw["claim_id"], exc.reason))
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
        raise BatchImbalance(f"dispatched {dispatched}, accounted {sum(totals.values())}")
    ledger.sign(run_id, MODEL_VERSION, dispatched, totals["scored"], totals["quarantined"], totals["skipped"])
    return {"dispatched": dispatched, **totals}


def submit(spec: RunSpec) -> AsyncResult[Any]:
    refs = chunks(spec)
    return chord(group(score_chunk.s(r) for r in refs))(reconcile.s(spec["claims"], spec["run"]))
