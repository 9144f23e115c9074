"""What CTE ingestion exports to Prometheus, and how a check reads it back.

The series (``CteMetrics``):

- ``cte_events_total{outcome, supplier}`` (Counter): every handled payload, by outcome:
  ``committed``, ``deduplicated``, ``out_of_order``, ``quarantined``, ``dead_lettered``.
- ``cte_retries_total`` (Counter): commits retried after a ``TransientLedgerError``.
- ``cte_commit_latency_seconds`` (Histogram): one ledger commit, retries not included.
- ``cte_queue_depth{shard}`` (Gauge): messages waiting, per queue (shard), as last measured.
- ``cte_dead_letter_depth`` (Gauge): dead letters not replayed yet, as last measured.

The write-up's alerts are queries on these (``ALERTS``). The dead-letter rate per supplier is not a
series of its own: it is ``rate()`` over the counter above, computed by the Prometheus server. A
counter only ever counts; the server takes its rate over any window, across missed scrapes and
process restarts (``rate`` understands a counter reset). A rate computed inside a worker would be
tied to that worker's own window and lost with it.

Registries: ``CteMetrics()`` registers on a private ``CollectorRegistry``, never the process-wide
default one, so two instances (two tests) never collide. ``read(registry)`` gives every sample as
``{'name{label="value",...}': value}`` (no ``_created`` timestamps), and ``outcomes(samples)`` the
``(outcome, supplier)`` counts that ``Ledger.by_supplier()`` and ``Stream.expected_outcomes()``
give, so a check compares metrics with the ledger exactly.

Several worker processes (a Celery prefork pool, several workers): every process has its own
counters, and a scrape of one child sees only that child. Two ways to gather them:

1. prometheus-client's multiprocess mode: set ``PROMETHEUS_MULTIPROC_DIR`` to an empty folder in the
   environment of every worker before it starts (the mode is chosen when ``prometheus_client`` is
   first imported); each process then keeps its values in memory-mapped files there, and one
   exporter process serves ``exporter_registry()``, which adds them up (counters and histograms
   summed; these gauges keep the most recent value set by any process). Limits: one folder per host
   and per run (stale files from an earlier run are counted again: empty it first, ``reset_dir``);
   only one ``CteMetrics`` per process (two would overwrite each other's values in the same file).
   A process makes its files when it first records after it started (a prefork child: after its
   fork, so mid-run, whenever the pool replaces a child), in two steps: it creates the file empty,
   then sizes it (``prometheus_client.mmap_dict.MmapedDict.__init__``: ``open(..., 'a+b')``, then
   ``truncate``). prometheus-client's own ``MultiProcessCollector.collect`` reads every ``*.db``, and
   one caught between the two steps fails the whole read ("unpack_from requires a buffer of at least
   4 bytes ... actual buffer size is 0": seen once in ``make matrix``, 0.2 s into a burst, as the
   first task reached a child). ``exporter_registry`` reads only files already sized; an empty one
   holds no value yet (values are written after the sizing), so nothing is lost, and the next read
   counts it.
2. The workers record into shared storage (the ledger's rows, Redis counters) and one process
   exports from there. Exact and crash-proof for what the ledger holds, but latency and retries
   would cost a network write each.

``CteMetrics`` works unchanged in both: it only needs a registry in the process that records.
Whichever way, a metric is incremented after the ledger's transaction commits, so a worker killed
between the two leaves the metric one behind the ledger: the ledger is the record, the metrics
its view.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, cast, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Metric, generate_latest
from prometheus_client.context_managers import Timer
from prometheus_client.multiprocess import MultiProcessCollector

from case_studies.cte_ingestion.events import supplier_label

MetricOutcome = Literal["committed", "deduplicated", "out_of_order", "quarantined", "dead_lettered"]
METRIC_OUTCOMES: tuple[MetricOutcome, ...] = get_args(MetricOutcome)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Seconds: a local commit takes about a millisecond; a second means a lock queue or a slow disk."""

ALERTS: dict[str, str] = {
    "CteQueueBacklog": "max by (shard) (cte_queue_depth) > 10000",
    "CteCommitLatencyHigh": "histogram_quantile(0.99, sum by (le) (rate(cte_commit_latency_seconds_bucket[5m]))) > 0.5",
    "CteSupplierDeadLetters": 'sum by (supplier) (rate(cte_events_total{outcome=~"quarantined|dead_lettered"}[15m])) '
                              '/ sum by (supplier) (rate(cte_events_total[15m])) > 0.02',
}
"""The write-up's alerts as PromQL (thresholds are examples): queue depth, commit latency, and the
share of a supplier's payloads set aside (quarantined or dead-lettered) over 15 minutes."""


class CteMetrics:
    """The pipeline's series on ``registry`` (default: a new private one). One per process."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.events = Counter("cte_events", "Payloads handled, by outcome and supplier.", ["outcome", "supplier"],
                              registry=self.registry)
        self.retries = Counter("cte_retries", "Ledger commits retried after a transient error.",
                               registry=self.registry)
        self.commit_latency = Histogram("cte_commit_latency_seconds", "Time of one ledger commit.",
                                        buckets=LATENCY_BUCKETS, registry=self.registry)
        self.queue_depth = Gauge("cte_queue_depth", "Messages waiting, per queue, as last measured.", ["shard"],
                                 registry=self.registry, multiprocess_mode="mostrecent")
        self.dead_letter_depth = Gauge("cte_dead_letter_depth", "Dead letters not replayed yet, as last measured.",
                                       registry=self.registry, multiprocess_mode="mostrecent")

    def count(self, outcome: MetricOutcome, supplier: str) -> None:
        if outcome not in METRIC_OUTCOMES:  # a typo would otherwise become a series of its own
            raise ValueError(f"unknown outcome {outcome!r}: one of {', '.join(METRIC_OUTCOMES)}")
        self.events.labels(outcome=outcome, supplier=supplier_label(supplier)).inc()

    def retried(self) -> None:
        self.retries.inc()

    def time_commit(self) -> Timer:
        """``with metrics.time_commit(): ledger.commit(event)``: observes the commit's duration, even when it raises."""
        return self.commit_latency.time()

    def set_queue_depth(self, shard: str, depth: int) -> None:
        self.queue_depth.labels(shard=shard).set(depth)

    def set_dead_letter_depth(self, depth: int) -> None:
        self.dead_letter_depth.set(depth)

    def render(self) -> str:
        return render(self.registry)


def render(registry: CollectorRegistry) -> str:
    """The registry in Prometheus' text exposition format (what a scrape of ``/metrics`` returns)."""
    return generate_latest(registry).decode()


def read(registry: CollectorRegistry) -> dict[str, float]:
    """Every sample of the registry: ``{'cte_events_total{outcome="committed",supplier="SUP-001"}': 12.0, ...}``,
    labels sorted by name; ``_created`` samples (a wall-clock time) are left out."""
    samples: dict[str, float] = {}
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name.endswith("_created"):
                continue
            labels = ",".join(f'{name}="{value}"' for name, value in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


_EVENTS = re.compile(r'cte_events_total\{outcome="([a-z_]+)",supplier="([^"]*)"\}')


def outcomes(samples: Mapping[str, float]) -> dict[tuple[str, str], int]:
    """``cte_events_total`` from ``read``'s samples as (outcome, supplier) to count; zeros left out."""
    found: dict[tuple[str, str], int] = {}
    for name, value in samples.items():
        if (match := _EVENTS.fullmatch(name)) is not None and value:
            found[(match[1], match[2])] = int(value)
    return found


def multiprocess_dir() -> Path | None:
    """``PROMETHEUS_MULTIPROC_DIR`` when set: the processes of this host record there."""
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    return Path(path) if path else None


def exporter_registry(path: Path | None = None) -> CollectorRegistry:
    """For the one exporter process in multiprocess mode: a new registry that adds up the values
    every process recorded in ``path`` (default ``PROMETHEUS_MULTIPROC_DIR``)."""
    folder = path or multiprocess_dir()
    if folder is None:
        raise ValueError("PROMETHEUS_MULTIPROC_DIR is not set: there is nothing to gather")
    if not folder.is_dir():
        raise ValueError(f"PROMETHEUS_MULTIPROC_DIR={folder} is not a folder: there is nothing to gather")
    registry = CollectorRegistry()
    registry.register(SizedFiles(folder))
    return registry


class SizedFiles:
    """``MultiProcessCollector`` over the files of ``folder`` that their process has sized: a file
    it has created and not yet sized (empty) is left out, for this read (see the module's docstring)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def collect(self) -> Iterable[Metric]:
        files: list[str] = []
        for path in sorted(self.folder.glob("*.db")):
            try:
                if path.stat().st_size > 0:
                    files.append(str(path))
            except FileNotFoundError:  # removed since the glob (a reset between runs)
                continue
        merge = cast(Callable[..., Iterable[Metric]], cast(Any, MultiProcessCollector).merge)  # untyped upstream
        return merge(files, accumulate=True)


def reset_dir(path: Path) -> None:
    """Empty a multiprocess folder before the workers of a run start (its ``*.db`` files only)."""
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink()
