"""The services around the severity pipeline, as the lab stands them in.

Not the lesson and not a fix: what production has outside the Celery program.

- ``RunSpec`` and ``ChunkRef``: what a run and one chunk of it say on the wire.
  A chunk names its rows by position in the run's extract; its ``doc`` is
  ``<run>/chunkNNN``, so the lab's observer (``lab.observe``) follows each chunk
  as the FMs follow a document;
- ``extract(chunk)``: the staged extract of open claims (a warehouse query in
  production). The lab generates it from the run's seed (``claims.generate``),
  once per process;
- ``feature_store(chunk)``: the feature service every chunk of ``fixed.py`` calls first, once
  (``row_features(task, chunk, row)``: the write-up's call, one per row). It plays
  the scenario's fault for the chunk, written by the runner into the lab's
  document store (``lab.pipeline.store_document``): ``FLAKY:n`` answers 503
  (``FeatureStoreUnavailable``) on the first n attempts, ``FLAKE_FOREVER`` on
  every one, ``SOFT_HANG`` answers after ``STRAGGLER_SECONDS`` on the first attempt
  (a straggler). Per row, the first row's call plays it: a 503 fails the first call of the
  attempt, and a straggler's service is slow once, not once per row;
- ``lab_chunk_fault(task, chunk)``: the lab's one line in ``score_chunk``, after
  the chunk's writes: ``CRASH_ONCE`` SIGKILLs the process on attempt 1, so the
  redelivered chunk writes every row a second time.
"""

from __future__ import annotations

import functools
import time
from typing import Any, TypedDict

from celery import Task

from case_studies.severity_batch.claims import Batch, RawClaim, generate
from lab.faults import fault_in, inject
from lab.observe import current_attempt
from lab.pipeline import DocumentMissing, fetch_text


STRAGGLER_SECONDS = 10.0
"""How late a ``SOFT_HANG`` chunk's feature store answers: past the write-up's scaled
``result_expires`` of 8 s (chosen above the 5 s its retries of a dead chunk can take)."""


class FeatureStoreUnavailable(ConnectionError):
    """The feature service answered 503: a later attempt may succeed."""


class RunSpec(TypedDict):
    run: str  # the run id (the lab's run id)
    seed: int
    claims: int
    chunk_size: int
    poison_every: int
    featureless_every: int


class ChunkRef(TypedDict):
    doc: str  # <run>/chunkNNN
    run: str
    seed: int
    claims: int
    poison_every: int
    featureless_every: int
    start: int
    stop: int


def chunk_name(i: int) -> str:
    return f"chunk{i:03d}"


def chunks(spec: RunSpec) -> list[ChunkRef]:
    size, n = spec["chunk_size"], spec["claims"]
    return [ChunkRef(doc=f"{spec['run']}/{chunk_name(i)}", run=spec["run"], seed=spec["seed"], claims=n,
                     poison_every=spec["poison_every"], featureless_every=spec["featureless_every"],
                     start=start, stop=min(start + size, n))
            for i, start in enumerate(range(0, n, size))]


@functools.lru_cache(maxsize=4)
def _batch(seed: int, n: int, poison_every: int, featureless_every: int) -> Batch:
    return generate(seed, n, poison_every=poison_every, featureless_every=featureless_every)


def extract(chunk: ChunkRef) -> tuple[RawClaim, ...]:
    """The chunk's rows of the run's extract."""
    batch = _batch(chunk["seed"], chunk["claims"], chunk["poison_every"], chunk["featureless_every"])
    return batch.rows[chunk["start"]:chunk["stop"]]


def _fault_text(chunk: ChunkRef) -> str:
    try:
        return fetch_text(chunk["doc"])
    except DocumentMissing:  # a run outside the lab's scenarios: no faults
        return ""


def feature_store(task: Task[Any, Any], chunk: ChunkRef) -> None:
    """Call the feature service for the chunk (the lab: misbehave as the scenario says)."""
    fault = fault_in(_fault_text(chunk))
    if fault is None:
        return
    attempt = current_attempt(task.request.id)
    if fault.kind == "FLAKE_FOREVER" or (fault.kind == "FLAKY" and attempt <= fault.times):
        raise FeatureStoreUnavailable(f"503 from the feature store (attempt {attempt})")
    if fault.kind == "SOFT_HANG" and attempt == 1:
        time.sleep(STRAGGLER_SECONDS)


def row_features(task: Task[Any, Any], chunk: ChunkRef, row: RawClaim) -> RawClaim:
    """One claim's features from the feature service (the write-up loads them per row): the row with them.

    The extract already holds the features (``claims.FEATURES``); the call is where the service fails
    (``feature_store``'s faults, played by the chunk's first row: see the module)."""
    if row["claim_id"] == extract(chunk)[0]["claim_id"]:
        feature_store(task, chunk)
    return row


def lab_chunk_fault(task: Task[Any, Any], chunk: ChunkRef) -> None:
    """After the chunk's writes: ``CRASH_ONCE`` kills this process on attempt 1."""
    fault = fault_in(_fault_text(chunk))
    if fault is not None and fault.kind == "CRASH_ONCE":
        inject(fault, current_attempt(task.request.id))
