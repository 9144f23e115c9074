"""``run_all_fms.py --metrics``: the lab's Prometheus series, read off a run's observations (no broker)."""

from __future__ import annotations

import dataclasses
from typing import Any

from lab.records import RunReport
from lab.metrics import LabMetrics, exposition
from lab.records import Outcome, SideRun
from shared.envelope import Result
from tests.synthetic import ev, fixed_run, summary_outcome


def test_failures_by_envelope_reason_attempts_dlq_depth_and_drain_age() -> None:
    report = RunReport("fm6", "fixed", "fm6", 6, observations=fixed_run(), drain_last_run=1_000.0)
    lab = LabMetrics()
    lab.add(report, now=1_002.5)
    text = lab.render()
    for reason in ("error", "dead_lettered", "retries_exhausted", "soft_timeout", "hard_timeout", "time_limit"):
        assert f'rcl_documents_failed_total{{fm="fm6",reason="{reason}"}} 1.0' in text
    assert 'rcl_attempts_count{fm="fm6"} 9.0' in text and 'rcl_attempts_sum{fm="fm6"} 17.0' in text
    assert 'rcl_attempts_bucket{fm="fm6",le="1.0"} 5.0' in text
    assert 'rcl_dlq_depth{fm="fm6"} 0.0' in text
    assert 'rcl_dlq_drain_last_run_age_seconds{fm="fm6"} 2.5' in text


def test_a_case_studys_own_series_come_after_the_labs_as_scraped() -> None:
    own = RunReport("cte_ingestion/burst", "fixed", "ct", 1, observations=fixed_run(),
                    exposition='cte_events_total{outcome="committed",supplier="SUP-001"} 3.0\n')
    text = exposition([own])
    assert text.endswith('# cte_ingestion/burst (fixed, on ct)\ncte_events_total{outcome="committed",supplier="SUP-001"} 3.0\n')
    assert 'rcl_documents_failed_total{fm="ct"' not in text  # its own metrics say it: the lab's are not doubled


def test_every_document_is_counted_a_poison_chain_head_by_its_fetch_attempts() -> None:
    """doc9's poison is its fetch: it never reaches the parse, and used to be left out of the count."""
    base = fixed_run()
    obs = dataclasses.replace(base, docs=(*base.docs, "doc9", "doc99"), attempts={**base.attempts, "doc9": 0, "doc99": 0},
                              fetch_attempts={**base.fetch_attempts, "doc9": 3})
    lab = LabMetrics()
    lab.add(RunReport("fm3", "fixed", "fm3", 3, observations=obs))
    text = lab.render()
    assert 'rcl_attempts_count{fm="fm3"} 11.0' in text and 'rcl_attempts_sum{fm="fm3"} 20.0' in text  # 9 + doc9 + doc99
    assert 'rcl_attempts_bucket{fm="fm3",le="1.0"} 6.0' in text  # doc99, never started, counts 0


def test_a_family_no_run_gave_a_value_is_not_printed() -> None:
    """fm1 has no DLQ and no drain: no empty HELP/TYPE pairs for them."""
    report = RunReport("fm1", "fixed", "fm1", 1, observations=dataclasses.replace(fixed_run(), dlq_depth=None))
    text = exposition([report])
    assert "rcl_dlq_depth" not in text and "rcl_dlq_drain_last_run_age_seconds" not in text
    helped = [line.split()[2] for line in text.splitlines() if line.startswith("# HELP ")]
    assert helped and all(any(line.startswith(name) and not line.startswith("#") for line in text.splitlines())
                          for name in helped), text
    assert exposition([]) == ""  # nothing ran: nothing to print


def test_parked_and_kept_letters_and_a_dead_lettered_chord_body_are_named() -> None:
    """Issue 20: what the drain cannot place is parked, counted and named; a poison chord body is counted;
    the side chords' documents count as documents."""
    envelope = Result[Any].failure("notify dead-lettered by the broker (delivery_limit) after 3 deliveries, 3 started",
                                   "dead_lettered", 3, 3)
    body = SideRun("body", "r-body", ("doc32",), True, Outcome("SUCCESS", envelope, None, None), {}, {},
                   {"doc32": 1}, {"doc32": 1}, (ev(1.0, "dead_lettered", task="n1", death="delivery_limit"),), (), None)
    expired = SideRun("expired", "r-expired", ("doc31",), True,
                      summary_outcome([], [("doc31", "expired", "UpstreamFailed: fetch_document expired before it ran")]),
                      {}, {}, {"doc31": 1}, {"doc31": 0}, (), (), None)
    base = fixed_run()
    parked = tuple(ev(0.5, "dead_letter_parked", task="", why="not JSON (text/plain)") for _ in range(3))
    obs = dataclasses.replace(base, events=(*base.events, *parked, ev(0.6, "dead_letter_kept", task="x", why="gone")),
                              sides={"body": body, "expired": expired}, parked=3)
    lab = LabMetrics()
    lab.add(RunReport("fm3", "fixed", "fm3", 3, observations=obs))
    text = lab.render()
    assert 'rcl_dlq_parked{fm="fm3"} 3.0' in text
    assert 'rcl_dlq_parked_letters_total{fm="fm3",why="not JSON (text/plain)"} 3.0' in text
    assert 'rcl_dlq_kept_letters_total{fm="fm3"} 1.0' in text
    assert 'rcl_chord_bodies_dead_lettered_total{fm="fm3"} 1.0' in text
    assert 'rcl_documents_failed_total{fm="fm3",reason="expired"} 1.0' in text
    assert 'rcl_attempts_count{fm="fm3"} 11.0' in text  # the 9 documents of the chord, doc31 and doc32
