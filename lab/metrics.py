"""Prometheus metrics of the lab's runs, for any FM: ``run_all_fms.py --metrics`` prints them.

What an operator of the FMs' pipeline would alert on, read off what each run recorded (the
observer's record in Redis, ``lab.observe``, and the DLQ drain's last run), on a private
registry (``LabMetrics``), in Prometheus' text exposition format:

- ``rcl_documents_failed_total{fm, reason}`` (Counter): documents that failed for good, by the
  envelope's reason (``error``, ``dead_lettered``, ``retries_exhausted``, ``soft_timeout``,
  ``hard_timeout``, ``time_limit``, ``expired``, ``revoked``: the split a dashboard needs, DESIGN.md
  §2), the side chords' documents included;
- ``rcl_attempts{fm}`` (Histogram): attempts per document, every document of the run counted once
  (a redelivery counts: the observer counts starts in Redis): its ``parse_document`` attempts, or,
  for a document that never reached the parse (doc9's poison fetch, dead-lettered at the chain's
  head), its ``fetch_document`` attempts; a document never started counts 0;
- ``rcl_dlq_depth{fm}`` (Gauge): messages left in the FM's dead-letter queue after its run;
- ``rcl_dlq_parked{fm}`` (Gauge) and ``rcl_dlq_parked_letters_total{fm, why}`` (Counter): letters
  the drain parked apart because no drain can place them (``shared.dlq``), and why (for the lab's
  own letters, which say their run); an alert on the gauge asks an operator to look;
- ``rcl_dlq_kept_letters_total{fm}`` (Counter): letters the drain put back in the DLQ (the
  backend did not answer; with the drain as first built, anything it could not place);
- ``rcl_chord_bodies_dead_lettered_total{fm}`` (Counter): chord bodies (``notify``) the drain
  finalised as dead-lettered: a chord that completed without its body's work;
- ``rcl_dlq_drain_last_run_age_seconds{fm}`` (Gauge): seconds since the DLQ drain last ran
  (``observe.drain_ran`` keeps its time per FM), when the FM has a drain: an alert on it says
  the beat stopped;
- a case study that exports metrics of its own (case study 3's ``cte_*``) adds its run's
  exposition (``RunReport.exposition``); it is printed after these, as scraped.

Only families that hold a sample are printed (``render``): a run of a program without a dead-letter queue has no DLQ, and an empty
``# HELP``/``# TYPE`` pair would read like a broken exporter.

Labels are bounded: an FM's short name or a case-study cell, a reason from the fixed list.
One registry per ``LabMetrics``: two never collide. Limits: these are per run of the lab,
not a live exporter (the lab's runs last seconds; a scrape interval would see none of them).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Metric, generate_latest

from lab.records import RunReport

ATTEMPT_BUCKETS = (1, 2, 3, 4, 5, 6, 8, 10)


class LabMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.failed = Counter("rcl_documents_failed", "Documents that failed for good, by envelope reason.",
                              ["fm", "reason"], registry=self.registry)
        self.attempts = Histogram("rcl_attempts", "Attempts per document.", ["fm"], buckets=ATTEMPT_BUCKETS,
                                  registry=self.registry)
        self.dlq_depth = Gauge("rcl_dlq_depth", "Messages left in the dead-letter queue after the run.", ["fm"],
                               registry=self.registry)
        self.drain_age = Gauge("rcl_dlq_drain_last_run_age_seconds", "Seconds since the DLQ drain last ran.", ["fm"],
                               registry=self.registry)
        self.parked = Gauge("rcl_dlq_parked", "Letters in the DLQ's parking queue: no drain can place them.", ["fm"],
                            registry=self.registry)
        self.parked_why = Counter("rcl_dlq_parked_letters", "Letters the drain parked during the run, by why.",
                                  ["fm", "why"], registry=self.registry)
        self.kept = Counter("rcl_dlq_kept_letters", "Letters the drain put back in the DLQ (announced once each).",
                            ["fm"], registry=self.registry)
        self.bodies = Counter("rcl_chord_bodies_dead_lettered", "Chord bodies the drain finalised as dead-lettered.",
                              ["fm"], registry=self.registry)

    def add(self, report: RunReport, now: float | None = None) -> None:
        """One run's numbers, labelled with the FM whose code ran (a lesson's short name, its weak variant's, a case study's code)."""
        obs = report.observations
        label = report.code
        if obs is not None and report.exposition is None:  # a case study with its own metrics says it better
            for doc in obs.docs:
                self.attempts.labels(fm=label).observe(obs.attempts.get(doc, 0) or obs.fetch_attempts.get(doc, 0))
                failed = obs.failed(doc)
                if failed is not None:
                    self.failed.labels(fm=label, reason=str(failed.get("reason") or "error")).inc()
            for side in obs.sides.values():  # the hard variants' own chords: their documents count too
                for doc in side.docs:
                    self.attempts.labels(fm=label).observe(side.attempts.get(doc, 0) or side.fetch_attempts.get(doc, 0))
                    if (failed := side.failed(doc)) is not None:
                        self.failed.labels(fm=label, reason=str(failed.get("reason") or "error")).inc()
            events = [e for e in obs.events] + [e for side in obs.sides.values() for e in side.events]
            for e in events:
                if e.kind == "dead_letter_parked":
                    self.parked_why.labels(fm=label, why=e.get("why") or "?").inc()
                elif e.kind == "dead_letter_kept":
                    self.kept.labels(fm=label).inc()
                elif e.kind == "dead_lettered" and not e.get("doc"):  # no document: the chord body itself
                    self.bodies.labels(fm=label).inc()
            if obs.dlq_depth is not None:
                self.dlq_depth.labels(fm=label).set(obs.dlq_depth)
            if obs.parked is not None:
                self.parked.labels(fm=label).set(obs.parked)
        if report.drain_last_run is not None:
            self.drain_age.labels(fm=label).set(max(0.0, (now or time.time()) - report.drain_last_run))

    def render(self) -> str:
        return generate_latest(_WithSamples(self.registry)).decode()


class _WithSamples:
    """A registry's families that hold at least one sample (what ``generate_latest`` is given)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterable[Metric]:
        return [family for family in self.registry.collect() if family.samples]


def exposition(reports: Iterable[RunReport]) -> str:
    """The runs' metrics as one text: the lab's series, then each case study's own, as scraped."""
    lab = LabMetrics()
    own: list[str] = []
    for report in reports:
        lab.add(report)
        if report.exposition:
            own.append(f"# {report.fm} ({report.kind}, on {report.code})\n{report.exposition}")
    return "\n".join([lab.render(), *own])
