"""Case study 3 end to end, through the harness, on the real RabbitMQ, Redis and a real SQL ledger
(every cell with its exact numbers, the burst on PostgreSQL too), and its parts without a broker:
shards, batches, retries in place, a held lot, the dry run."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import get_args

import pytest
from celery.exceptions import Reject
from sqlalchemy import func, select

from case_studies.cte_ingestion import fixed, stand_ins, study, writeup
from case_studies.cte_ingestion.events import (CTE_TYPES, CriticalTrackingEvent, Quarantined, generate, idempotency_key,
                                               validate)
from case_studies.cte_ingestion.ledger import Ledger, LedgerCounts, TransientLedgerError
from case_studies.cte_ingestion.metrics import CteMetrics, outcomes, read
from case_studies.logs import read_events
from lab import records
from lab.settings import amqp_name, redis_prefix
from pydantic import ValidationError
from lab.records import RunReport
from tests.cells import passing
from shared.backend import backend_redis
from shared.in_place import retry_in_place
from shared.retry import RetriesExhausted, RetryPolicy
from shared.turns import Turns

STREAM = study.stream()


def cell(name: str, kind: records.Kind) -> RunReport:
    return passing(f"cte_ingestion/{name}", kind)


# ---- without a broker ----------------------------------------------------------------


def test_the_stream_holds_what_the_checks_count() -> None:
    assert len(STREAM.payloads) == 2000 and STREAM.valid_distinct == 1915
    assert len(STREAM.invalid) == 37 and len(STREAM.duplicates) == 48 and len(STREAM.dropped) == 6
    assert {str(p["event_type"]) for p in STREAM.payloads} == set(CTE_TYPES)
    # what the write-up's model makes of it: 14 let through (10 wrong check digits, 4 missing a KDE), and 499
    # payloads refused, 476 of them valid initial packing and first land-based receiving events (13 resends)
    assert len(study.loose(STREAM)) == 14 and Counter(STREAM.invalid[p] for p in study.loose(STREAM)) \
        == {"gln_check_digit": 6, "gtin_check_digit": 4, "missing_kde": 4}
    refused = study.writeup_refused(STREAM)
    assert len(refused) == 499 and len([p for p in refused if p not in STREAM.invalid]) == 476
    assert len({study.raw_key(STREAM.payloads[p]) for p in refused}) == 486
    assert len(study.writeup_keys(STREAM)) == 1466


def test_the_writeups_model_takes_exactly_what_the_study_predicts() -> None:
    assert study.WRITEUP_CTE_TYPES == get_args(writeup.CTEEvent.model_fields["event_type"].annotation)
    for position, payload in enumerate(STREAM.payloads):
        try:
            writeup.CTEEvent.model_validate(stand_ins.as_published(payload))
            took = True
        except ValidationError as error:
            took = False
            assert position not in STREAM.invalid or "literal_error" in {e["type"] for e in error.errors()} \
                or STREAM.invalid[position] not in study.LOOSE
        assert took == study.writeup_takes(STREAM, position), (position, payload["event_type"])


def test_a_lot_goes_to_one_shard_whatever_the_process_and_lots_spread() -> None:
    lots = sorted(STREAM.lot_sequences)
    assert [stand_ins.shard_of(lot, 4) for lot in lots[:6]] == [stand_ins.shard_of(lot, 4) for lot in lots[:6]]
    assert stand_ins.shard_of("SUP001-250303-0001", 4) == int.from_bytes(
        __import__("hashlib").sha256(b"SUP001-250303-0001").digest()[:8], "big") % 4
    spread = Counter(stand_ins.shard_of(lot, 4) for lot in lots)
    assert set(spread) == {0, 1, 2, 3} and min(spread.values()) > len(lots) // 8


def test_batches_keep_each_lots_order_and_every_payload_once() -> None:
    messages = stand_ins.batches(list(STREAM.payloads), 4, 50)
    assert sum(len(b) for _, b in messages) == 2000 and all(len(b) <= 50 for _, b in messages)
    seen: dict[str, list[object]] = {}
    for shard, batch in messages:
        for payload in batch:
            assert stand_ins.shard_of(stand_ins.lot_of(payload), 4) == shard
            seen.setdefault(stand_ins.lot_of(payload), []).append(payload["seq"])
    produced: dict[str, list[object]] = {}
    for payload in STREAM.payloads:
        produced.setdefault(stand_ins.lot_of(payload), []).append(payload["seq"])
    assert seen == produced


def test_retry_in_place_retries_then_gives_up_with_the_cause() -> None:
    calls: list[int] = []
    heard: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) <= 2:
            raise TransientLedgerError("dropped")
        return "ok"

    policy = RetryPolicy(max_retries=5, base=0.001, cap=0.01, retry_on=(TransientLedgerError,))
    assert retry_in_place(flaky, policy, on_retry=lambda k, _e: heard.append(k)) == "ok"
    assert len(calls) == 3 and heard == [0, 1]

    def never() -> str:
        calls.append(1)
        raise TransientLedgerError("down")

    calls.clear()
    with pytest.raises(RetriesExhausted) as caught:
        retry_in_place(never, policy)
    assert len(calls) == 6 and isinstance(caught.value.__cause__, TransientLedgerError)
    with pytest.raises(ValueError):  # anything else is not retried
        retry_in_place(lambda: int("x"), policy)


def _events(lot_size: int = 4) -> list[CriticalTrackingEvent]:
    s = generate(5, 400)
    lot = next(code for code, seqs in s.lot_sequences.items() if len(seqs) >= lot_size)
    found = [validate(p, now=s.as_of) for p in s.payloads if p["lot_code"] == lot]
    return [e for e in found if isinstance(e, CriticalTrackingEvent)][:lot_size]


def test_a_dead_letter_holds_its_lot_until_a_replay_commits_it_in_order(tmp_path: Path) -> None:
    book = Ledger(f"sqlite:///{tmp_path / 'held.sqlite'}", hold_lots=True)
    book.create()
    first, second, third, fourth = _events()
    assert book.commit(first) == "committed"
    book.dead_letter("k2", second.model_dump(mode="json"), "retries_exhausted", second.supplier_id, second.lot_code)
    assert book.commit(third) == "held" and book.commit(fourth) == "held"  # nothing passes the dead letter
    assert book.commit(first) == "deduplicated"  # a resend of what is committed is still a resend
    assert [book.commit(e, replay=True) for e in (second, third, fourth)] == ["committed"] * 3
    assert book.lot_sequences()[first.lot_key] == [e.seq for e in (first, second, third, fourth)]
    assert book.counts().out_of_order_commits == 0 and book.counts().out_of_order_attempts == 0
    assert book.mark_replayed("k2") and book.commit(fourth) == "deduplicated"


def test_the_dry_run_decides_a_real_runs_outcomes_and_writes_nothing(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``fixed.ingest_one`` with ``CTE_DRY_RUN``'s ledger over a ledger that already holds rows:
    every table's rows are the same before and after, byte for byte, and the metrics count
    exactly what a real run would."""
    url = f"sqlite:///{tmp_path / 'dry.sqlite'}"
    real = Ledger(url, hold_lots=True)
    real.create()
    s = generate(11, 300, invalid_every=17, duplicate_every=13)
    other = generate(12, 20)  # rows of an earlier run, which the dry run must leave alone
    for p in other.payloads:
        e = validate({**p, "lot_code": f"OLD-{p['lot_code']}"}, now=other.as_of)  # lots of their own
        assert isinstance(e, CriticalTrackingEvent)
        real.commit(e)
    real.quarantine(Quarantined("{not json", ()))

    def snapshot() -> dict[str, list[tuple[object, ...]]]:
        with real.engine.connect() as conn:
            return {t.name: sorted(tuple(map(str, row)) for row in conn.execute(select(t)))
                    for t in real.metadata.sorted_tables}

    before = snapshot()
    metrics = CteMetrics()
    monkeypatch.setattr(fixed, "ledger", Ledger(url, dry_run=True, hold_lots=True))
    monkeypatch.setattr(fixed, "metrics", metrics)
    for p in s.payloads:
        fixed.ingest_one(p)
    assert snapshot() == before
    with real.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(real.events_table)).scalar_one() == 20
    assert outcomes(read(metrics.registry)) == s.expected_outcomes()


# ---- through the harness ---------------------------------------------------------------


@pytest.mark.usefixtures("real_services")
def test_the_burst_commits_every_valid_event_once_in_each_lots_order() -> None:
    report = cell("burst", "fixed")
    assert [c.label for c in report.checks] == ["CT1", "CT2", "CT3", "CT4"]
    counts = Ledger().counts()
    assert counts == LedgerCounts(committed=1915, quarantined=37, dead_lettered=5, dead_letters_pending=0,
                                  out_of_order_attempts=0, out_of_order_commits=0)
    lines = read_events("ct", fixed.DECISIONS)  # every decision of the run, one JSON line each
    assert all({"timestamp", "level", "event", "event_id", "lot_code", "supplier", "dry_run"} <= set(e) for e in lines)
    assert not any(e["dry_run"] for e in lines)

    def ids(event: str, **where: object) -> list[str]:
        return [e["event_id"] for e in lines if e["event"] == event and all(e.get(k) == v for k, v in where.items())]

    valid = {idempotency_key(e) for p in STREAM.payloads if isinstance(e := validate(p), CriticalTrackingEvent)}
    assert len(set(ids("event_committed"))) == 1915 and set(ids("event_committed")) == valid
    assert len(set(ids("event_quarantined"))) == 37
    lacking = [e for e in lines if e["event"] == "event_quarantined" and any("missing_kde" in p for p in e["problems"])]
    assert sorted((e["cte_type"], e["problems"][0]) for e in lacking) == sorted(
        (STREAM.payloads[p]["event_type"], f"{kde}: missing_kde") for p, kde in STREAM.dropped.items())
    exhausted = ids("event_dead_lettered", reason="retries_exhausted")
    held = ids("event_dead_lettered", reason="held behind its lot's dead letter")
    assert len(exhausted) == 1 and len(held) == 4
    assert set(ids("event_committed", replay=True)) == {*exhausted, *held}  # the replay commits the 5 once
    assert len(ids("commit_retried")) + len([e for e in lines if e["event"] == "message_rolled_back"]) == 12


@pytest.mark.usefixtures("real_services")
def test_the_writeup_on_its_redis_broker_lets_wrong_check_digits_through_reorders_lots_and_loses_an_event() -> None:
    report = cell("burst", "broken")
    assert report.code == "ctw" and [c.label for c in report.checks] == ["CT1 write-up", "CT2 write-up", "CT3 write-up"]
    loose = study.loose(STREAM)
    assert len(loose) == 14 and {STREAM.invalid[p] for p in loose} == {"gln_check_digit", "gtin_check_digit",
                                                                          "missing_kde"}
    counts = Ledger().counts()  # 1,466 distinct events its model takes (14 let through among them) - 1 lost
    assert counts.committed == 1465 and counts.quarantined == 486 and counts.dead_lettered == 0
    assert counts.out_of_order_commits > 0
    lines = read_events("ctw", "decisions")  # the write-up's line per decision; the lost event has none
    assert all({"timestamp", "level", "event", "event_id", "lot_code", "supplier"} <= set(e) for e in lines)
    committed = {e["event_id"] for e in lines if e["event"] == "cte_ingested" and e["outcome"] == "committed"}
    assert len(committed) == 1465 and {study.raw_key(STREAM.payloads[p]) for p in loose} <= committed
    quarantined = [e for e in lines if e["event"] == "cte_quarantined"]
    assert len(quarantined) == 499 and len({e["event_id"] for e in quarantined}) == 486  # 13 resends
    assert {t for e in quarantined for t in e["errors"]} == {"timezone_aware", "value_error", "greater_than",
                                                             "literal_error"}  # 2 of the rule's 7 CTE types unknown
    prefix = f"{redis_prefix('ctw')}broker:"  # its broker: the lab's Redis, every key under the program's prefix
    assert writeup.app.conf.broker_url.startswith("redis://")
    assert writeup.app.conf.broker_transport_options == {"global_keyprefix": prefix, "visibility_timeout": 3600}
    r, _ = backend_redis(writeup.app)
    assert r.exists(f"{prefix}_kombu.binding.{writeup.QUEUE}.lots") and r.llen(f"{prefix}{writeup.QUEUE}") == 0


def test_the_writeups_model_reads_its_own_names_ignores_extras_and_counts_digits_only() -> None:
    payload = stand_ins.as_published(STREAM.payloads[study.loose(STREAM)[0]])  # a wrong GS1 check digit
    assert "timestamp" in payload and "event_time" not in payload
    event = writeup.CTEEvent.model_validate(payload)
    assert isinstance(validate(STREAM.payloads[study.loose(STREAM)[0]]), Quarantined)  # the fixed contract refuses it
    assert not hasattr(event, "supplier_id") and not hasattr(event, "seq")  # extra="ignore": dropped, no error
    assert writeup.idempotency_key(event) == study.raw_key(payload)
    row = stand_ins.ledger_event(event.model_dump(), payload)  # the lab's ledger row: as validated, with seq
    assert row.seq == payload["seq"] and row.location_gln == event.location_gln and row.event_time == event.timestamp
    with pytest.raises(ValidationError, match="timestamp"):
        writeup.CTEEvent.model_validate(STREAM.payloads[0])  # the lab's field name: its model finds no timestamp


@pytest.mark.usefixtures("real_services")
def test_an_outage_past_the_whole_backoff_loses_events_in_the_writeup_and_none_in_the_fix() -> None:
    small = study.stream(events=study.OUTAGE_EVENTS)
    fixed_run = cell("outage", "fixed")
    assert [c.label for c in fixed_run.checks] == ["CT1", "CT2", "CT7"]
    counts = Ledger().counts()
    assert counts.committed == small.valid_distinct and counts.quarantined == len(small.invalid)
    assert counts.dead_letters_pending == 0 and counts.out_of_order_commits == 0 and counts.dead_lettered > 0
    lines = read_events("ct", fixed.DECISIONS)
    exhausted = [e for e in lines if e["event"] == "event_dead_lettered" and e["reason"] == "retries_exhausted"]
    assert exhausted and all(e["detail"] == "6 attempts: TransientLedgerError: the ledger is down (an outage)"
                             for e in exhausted)
    replayed = {e["event_id"] for e in lines if e["event"] == "event_committed" and e["replay"]}
    assert {e["event_id"] for e in exhausted} <= replayed and len(replayed) == counts.dead_lettered

    writeup_run = cell("outage", "broken")
    assert [c.label for c in writeup_run.checks] == ["CT7 write-up"]
    book = Ledger()
    assert book.counts().dead_lettered == 0
    assert book.counts().committed < small.valid_distinct + len(study.loose(small))  # some event lost for good
    r, prefix = backend_redis(writeup.app)
    assert not r.exists(f"{prefix}ledger-down")  # the runner brought the ledger back


@pytest.mark.usefixtures("real_services")
def test_without_seq_each_lot_is_committed_in_the_order_produced() -> None:
    report = cell("no_seq", "fixed")
    assert [c.label for c in report.checks] == ["CT1", "CT6", "CT3", "CT4"]
    book = Ledger()
    assert book.counts() == LedgerCounts(committed=1915, quarantined=37, dead_lettered=5, dead_letters_pending=0,
                                         out_of_order_attempts=0, out_of_order_commits=0)
    produced: dict[str, list[str]] = {}
    for p, payload in enumerate(STREAM.payloads):
        if p not in STREAM.invalid and p not in STREAM.duplicates:
            produced.setdefault(stand_ins.lot_of(payload), []).append(study.raw_key(payload))
    assert book.lot_keys() == produced
    assert all(seqs == list(range(1, len(seqs) + 1)) for seqs in book.lot_sequences().values())
    lines = read_events("ct", fixed.DECISIONS)
    assert {e["seq"] for e in lines if e["event"] == "event_committed"} == {None}  # none was sent


@pytest.mark.usefixtures("real_services")
def test_the_dry_run_cell_leaves_the_ledger_untouched() -> None:
    report = cell("dry_run", "fixed")
    assert [c.label for c in report.checks] == ["CT5"]
    lines = read_events("ct", fixed.DECISIONS)
    assert lines and all(e["dry_run"] is True for e in lines)  # each decision logged, marked as a dry run's
    assert len({e["event_id"] for e in lines if e["event"] == "event_committed"}) == 1915
    assert Ledger().counts() == LedgerCounts(0, 0, 0, 0, 0, 0)


@pytest.mark.usefixtures("real_services")
def test_the_burst_on_postgresql(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same cell with the ledger on PostgreSQL (the workers inherit RCL_LEDGER_URL)."""
    monkeypatch.setenv("RCL_LEDGER_URL", postgres_url)
    cell("burst", "fixed")
    book = Ledger(postgres_url)
    assert book.counts().committed == 1915 and book.counts().out_of_order_commits == 0
    book.clear()


def test_the_fault_plan_picks_distinct_lots() -> None:
    plan = study.choose_faults(STREAM, 4, fixed.BATCH)
    positions = (*plan.flaky, plan.crash, plan.exhausted)
    lots = {stand_ins.lot_of(STREAM.payloads[p]) for p in positions}
    assert len(lots) == 5 and len(plan.held) >= 2
    assert study.choose_faults(STREAM, 4, fixed.BATCH) == plan


def test_every_shard_queue_admits_one_active_consumer_and_no_name_leaves_the_namespace() -> None:
    fm = study.program("fixed")
    assert [q.name for q in fm.task_queues] == [amqp_name('ct', f'shard.{k}') for k in range(fixed.SHARDS)]
    assert all((q.queue_arguments or {}).get("x-single-active-consumer") is True for q in fm.task_queues)
    assert fm.concurrency == 1 and fm.app.conf.worker_prefetch_multiplier == 1 and fm.app.conf.task_acks_late
    published = study.program("broken")
    assert len(published.task_queues) == 1 and published.concurrency == 2  # the write-up: one queue, two consumers
    assert [q.name for q in published.task_queues] == [amqp_name("ctw", "cte.ingest")]


@pytest.mark.usefixtures("real_services")
def test_a_message_that_comes_before_its_predecessor_waits_its_turn(redis_keys: list[str]) -> None:
    r, prefix = backend_redis(fixed.app)
    turns = Turns(r, f"{prefix}test-")
    redis_keys.extend([f"{prefix}test-turns:q:taken", f"{prefix}test-turns:q:done"])
    r.delete(*redis_keys)
    assert [turns.take("q") for _ in range(3)] == [1, 2, 3]
    assert not turns.early("q", 1) and turns.early("q", 2)  # 2 waits for 1
    turns.done("q", 1)
    assert not turns.early("q", 2) and turns.early("q", 3)
    turns.done("q", 2)
    turns.done("q", 1)  # a redelivery of 1 done again: the progress never moves back
    assert turns.last_done("q") == 2 and not turns.early("q", 3)
    with pytest.raises(Reject):  # the task's gate: rejected back to its queue, requeued
        fixed.in_turn(0, fixed.turns().last_done(fixed.queue_name(0)) + 2)
