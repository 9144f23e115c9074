"""Batch severity scoring's domain: the extract, validation and the score (pure, no services),
and the ledger on SQLite and on PostgreSQL.

The PostgreSQL URL comes from conftest.py's ``postgres_url`` (skipped, saying why, when
PostgreSQL does not answer, unless ``RCL_REQUIRE_POSTGRES=1``). The tables are
those of the test namespace (see conftest.py; a second one, beside it, from
``namespaces.derived``), emptied before and after each test and dropped at the session's end;
the SQLite ledgers live in pytest's temporary folders.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from decimal import ROUND_DOWN, Context, Decimal, localcontext
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy.exc import StatementError

from case_studies.severity_batch import claims, ledger
from case_studies.severity_batch.claims import (COLUMNS, MODEL_VERSION, POISON_KINDS, THRESHOLDS, TIERS, PoisonClaim,
                                                Thresholds, assess, generate, parse, score)
from case_studies.severity_batch.ledger import Ledger, LedgerCounts
from lab import settings
from tests.namespaces import derived



def clean_row(**changes: str) -> claims.RawClaim:
    row = {"claim_id": "C00000001", "policy_id": "P1234567", "peril": "fire", "coverage_limit": "100000.00",
           "loss_amount": "25000.00", "reported_at": "2025-03-14", "prior_claims": "1",
           "property_age_years": "30", "region_risk": "0.40"}
    row.update(changes)
    return row


def reason_of(row: claims.RawClaim) -> str:
    with pytest.raises(PoisonClaim) as caught:
        parse(row)
    return caught.value.reason


# The extract, validation and the score: pure.

def test_generate_is_deterministic_for_a_seed() -> None:
    batch = generate(11, 2_000, poison_every=9, featureless_every=4)
    assert batch == generate(11, 2_000, poison_every=9, featureless_every=4)
    assert batch.rows != generate(12, 2_000, poison_every=9, featureless_every=4).rows
    ids = [row["claim_id"] for row in batch.rows]
    assert ids[:2] == ["C00000001", "C00000002"] and len(set(ids)) == 2_000
    assert all(tuple(row) == COLUMNS for row in batch.rows)
    assert all(isinstance(value, str) for row in batch.rows for value in row.values())


def test_poison_and_featureless_ids_are_exact() -> None:
    batch = generate(5, 1_000, poison_every=7, featureless_every=5)
    assert batch.poison_ids == {f"C{i:08d}" for i in range(7, 1_001, 7)}
    assert batch.featureless_ids == {f"C{i:08d}" for i in range(5, 1_001, 5) if i % 7}
    assert batch.scorable == 1_000 - 142 - (200 - 28)
    plain = generate(5, 1_000)
    assert not plain.poison_ids and not plain.featureless_ids and plain.scorable == 1_000


def test_every_row_parses_to_what_the_batch_says() -> None:
    batch = generate(3, 3_000, poison_every=13, featureless_every=6)
    assert len(batch.poison_ids) >= 3 * len(POISON_KINDS)  # every kind of poison, several times
    fields_named: set[str] = set()
    for row in batch.rows:
        if row["claim_id"] in batch.poison_ids:
            reason = reason_of(row)
            named = {column for column in COLUMNS if column in reason}
            assert named, f"{row['claim_id']}: the reason names no field: {reason}"
            fields_named |= named
        elif row["claim_id"] in batch.featureless_ids:
            assert parse(row) is None
        else:
            claim = parse(row)
            assert claim is not None and claim.claim_id == row["claim_id"]
    assert {"loss_amount", "coverage_limit", "peril", "reported_at"} <= fields_named


@pytest.mark.parametrize(("changes", "named"), [
    ({"loss_amount": "NaN"}, "loss_amount"),
    ({"loss_amount": "1,250.00"}, "loss_amount"),
    ({"loss_amount": "12.345"}, "loss_amount"),
    ({"coverage_limit": "-100000.00"}, "coverage_limit"),
    ({"coverage_limit": "0.00", "loss_amount": "0.00"}, "coverage_limit"),
    ({"peril": "earthquake"}, "peril"),
    ({"loss_amount": "-120.00"}, "loss_amount"),
    ({"reported_at": "2025-02-30"}, "reported_at"),
    ({"region_risk": "1.35"}, "region_risk"),
    ({"region_risk": ""}, "region_risk"),  # some features but not all: malformed, not featureless
    ({"prior_claims": "-1"}, "prior_claims"),
    ({"policy_id": ""}, "policy_id"),
    ({"adjuster": "Kim"}, "adjuster"),  # extra column
])
def test_a_malformed_row_is_poison_with_a_reason_naming_the_field(changes: dict[str, str], named: str) -> None:
    assert named in reason_of(clean_row(**changes))


def test_a_missing_column_and_several_problems_are_all_named() -> None:
    row = clean_row(peril="hail", loss_amount="n/a")
    del row["reported_at"]
    reason = reason_of(row)
    assert all(field in reason for field in ("peril", "loss_amount", "reported_at")), reason


def test_a_row_without_features_is_skipped_not_poison() -> None:
    assert parse(clean_row(prior_claims="", property_age_years="", region_risk="")) is None


def test_a_claim_is_strict_and_frozen() -> None:
    claim = parse(clean_row())
    assert claim is not None
    assert claim.loss_amount == Decimal("25000.00") and claim.prior_claims == 1 and claim.peril == "fire"
    with pytest.raises(ValidationError):
        setattr(claim, "loss_amount", Decimal(0))  # noqa: B010  (frozen: refused at run time)
    with pytest.raises(ValidationError):
        claims.Claim.model_validate({**clean_row(), "prior_claims": "1"})  # strict: a string is not an int here


def test_scores_lie_in_0_1_with_4_places_and_depend_on_nothing_else() -> None:
    batch = generate(8, 2_000, poison_every=50, featureless_every=20)
    parsed = [claim for row in batch.rows if row["claim_id"] not in batch.poison_ids
              if (claim := parse(row)) is not None]
    scores = [score(claim) for claim in parsed]
    assert all(Decimal(0) <= s <= Decimal(1) and s.as_tuple().exponent == -4 for s in scores)
    assert len(set(scores)) > 1_000  # a score, not a constant
    with localcontext(Context(prec=3, rounding=ROUND_DOWN)):  # the caller's decimal context changes nothing
        assert [score(claim) for claim in parsed] == scores
    assert [score(claim) for claim in parsed] == scores


def test_the_score_rises_with_the_loss_and_stays_in_bounds_at_the_extremes() -> None:
    low, high = parse(clean_row(loss_amount="1000.00")), parse(clean_row(loss_amount="90000.00"))
    assert low is not None and high is not None and score(low) < score(high)
    worst = parse(clean_row(loss_amount="100000.00", prior_claims="50", property_age_years="300", region_risk="1.00"))
    best = parse(clean_row(peril="theft", loss_amount="0.00", prior_claims="0", property_age_years="0",
                           region_risk="0.00"))
    assert worst is not None and best is not None
    assert score(worst) == Decimal("0.9183") and score(best) == Decimal("0.0600")


def test_the_size_of_the_loss_counts_not_only_its_ratio_to_the_limit() -> None:
    small = parse(clean_row(coverage_limit="10000.00", loss_amount="9000.00"))  # 90% of a small limit
    large = parse(clean_row(coverage_limit="1000000.00", loss_amount="900000.00"))  # 90% of a large one
    assert small is not None and large is not None
    assert (assess(small).score, assess(small).tier) == (Decimal("0.5886"), "medium")
    assert (assess(large).score, assess(large).tier) == (Decimal("0.7219"), "high")  # and a large loss: at least high


def test_a_loss_above_its_limit_is_an_excess_of_limit_claim_scored_not_quarantined() -> None:
    claim = parse(clean_row(coverage_limit="100000.00", loss_amount="100000.01"))
    assert claim is not None
    severity = assess(claim)
    assert severity.excess_of_limit and severity.tier in ("high", "severe")
    assert (severity.thresholds, severity.model) == (THRESHOLDS.version, MODEL_VERSION)
    small = parse(clean_row(peril="theft", coverage_limit="1000.00", loss_amount="1500.00", prior_claims="0",
                            property_age_years="0", region_risk="0.00"))
    assert small is not None and assess(small).score < THRESHOLDS.medium and assess(small).tier == "high"  # floor


def test_tiers_follow_the_versioned_thresholds_and_the_absolute_floors() -> None:
    batch = generate(8, 2_000, poison_every=50, featureless_every=20)
    parsed = [claim for row in batch.rows if row["claim_id"] not in batch.poison_ids
              if (claim := parse(row)) is not None]
    for claim in parsed:
        s = assess(claim)
        by_score = sum(1 for cut in (THRESHOLDS.medium, THRESHOLDS.high, THRESHOLDS.severe) if s.score >= cut)
        floor = 3 if claim.loss_amount >= THRESHOLDS.catastrophic_loss else 2 if (
            s.excess_of_limit or claim.loss_amount >= THRESHOLDS.large_loss) else 0
        assert TIERS.index(s.tier) == (3 if floor == 3 else max(by_score, floor)), (claim, s)
    stricter = Thresholds("tiers-test", Decimal("0.9"), Decimal("0.95"), Decimal("0.99"), Decimal(10**9),
                          Decimal(10**9))
    assert {assess(c, stricter).tier for c in parsed} == {"low"} and assess(parsed[0], stricter).thresholds == \
        "tiers-test"


# The ledger, on SQLite and PostgreSQL.

@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_at(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty ledger database of each kind."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'severity-ledger.sqlite'}"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def book(ledger_at: str) -> Iterator[Ledger]:
    """The test namespace's ledger, its tables created and empty; emptied again afterwards."""
    made = Ledger(ledger_at)
    made.create()
    made.clear()
    yield made
    made.clear()
    made.dispose()


def scored(n: int, value: str = "0.5000", start: int = 1) -> list[tuple[str, Decimal]]:
    return [(f"C{i:08d}", Decimal(value)) for i in range(start, start + n)]


def test_upserting_twice_changes_nothing(book: Ledger) -> None:
    rows = scored(1_200)
    for _ in range(2):
        for i in range(0, len(rows), 500):
            book.upsert_scores("run-a", rows[i:i + 500], MODEL_VERSION)
    assert book.counts("run-a") == LedgerCounts(scored=1_200, quarantined=0)
    book.upsert_scores("run-a", [("C00000007", Decimal("0.9000")), ("C00000007", Decimal("0.9100"))], "severity-1.0.1")
    assert book.counts("run-a").scored == 1_200 and book.scores_of("run-a")["C00000007"] == Decimal("0.9100")
    book.upsert_scores("run-b", rows[:10], MODEL_VERSION)  # the key is (claim id, run id): another run is apart
    assert book.counts("run-b").scored == 10 and book.counts("run-a").scored == 1_200


def test_quarantining_twice_keeps_one_row(book: Ledger) -> None:
    book.quarantine("run-a", [("C00000003", "peril: unknown"), ("C00000009", "loss_amount: not a number")])
    book.quarantine("run-a", [("C00000003", "redelivered")])
    assert book.counts("run-a") == LedgerCounts(scored=0, quarantined=2)
    assert book.reasons("run-a") == {"C00000003": "peril: unknown", "C00000009": "loss_amount: not a number"}


def test_a_manifest_is_signed_once(book: Ledger) -> None:
    assert book.manifest("run-a") is None
    assert book.sign("run-a", MODEL_VERSION, dispatched=10, scored=7, quarantined=2, skipped=1) is True
    assert book.sign("run-a", "severity-9", dispatched=99, scored=0, quarantined=0, skipped=0) is False
    manifest = book.manifest("run-a")
    assert manifest is not None and manifest.signed_at.tzinfo is not None
    assert (manifest.model_version, manifest.dispatched, manifest.scored, manifest.quarantined, manifest.skipped) \
        == (MODEL_VERSION, 10, 7, 2, 1)


def test_flags_are_appended_in_order(book: Ledger) -> None:
    book.flag("run-a", "imbalance", "dispatched 10, accounted 9")
    book.flag("run-a", "imbalance", "dispatched 10, accounted 9")
    book.flag("run-b", "late", "")
    assert [(f.reason, f.detail) for f in book.flags("run-a")] == [("imbalance", "dispatched 10, accounted 9")] * 2
    assert [f.run_id for f in book.flags("run-b")] == ["run-b"] and book.flags("run-c") == []


def test_scores_come_back_as_the_exact_decimal(book: Ledger) -> None:
    values = ["0.0000", "0.0001", "0.1235", "0.3333", "0.9999", "1.0000"]
    book.upsert_scores("run-a", [(f"C{i:08d}", Decimal(v)) for i, v in enumerate(values)], MODEL_VERSION)
    back = book.scores_of("run-a")
    assert [str(back[f"C{i:08d}"]) for i in range(len(values))] == values
    with pytest.raises(StatementError, match="more than 4 decimal places"):
        book.upsert_scores("run-a", [("C00000001", Decimal("0.12345"))], MODEL_VERSION)  # never rounded silently


def test_clear_leaves_other_namespaces_alone(book: Ledger) -> None:
    other = Ledger(book.url, namespace=derived("other"))  # a '-' in the name: quoted by SQLAlchemy
    other.create()
    try:
        other.clear()
        other.upsert_scores("run-a", scored(3), MODEL_VERSION)
        other.sign("run-a", MODEL_VERSION, 3, 3, 0, 0)
        book.upsert_scores("run-a", scored(5), MODEL_VERSION)
        book.sign("run-a", MODEL_VERSION, 5, 5, 0, 0)
        book.clear()
        assert book.counts("run-a") == LedgerCounts(0, 0) and book.manifest("run-a") is None
        assert other.counts("run-a") == LedgerCounts(3, 0) and other.manifest("run-a") is not None
        book.create()  # idempotent
        assert other.counts("run-a") == LedgerCounts(3, 0)
    finally:
        other.clear()
        other.dispose()


def _write_concurrently(book: Ledger, worker: int, start: Any, results: Any) -> None:
    """One forked writer: 40 upserts of 100 rows, overlapping the other writer's, then a sign."""
    try:
        start.wait(timeout=30)
        for chunk in range(40):
            book.upsert_scores("run-c", scored(100, f"0.{worker}000", start=chunk * 100 + 1), MODEL_VERSION)
            book.quarantine("run-c", [(f"Q{chunk:07d}", f"worker {worker}")])
        results.put((worker, book.sign("run-c", MODEL_VERSION, 4_040, 4_000, 40, 0), ""))
    except Exception as error:  # reported to the test, which fails with it
        results.put((worker, False, repr(error)))


def test_two_processes_write_at_once_without_locking_errors(book: Ledger) -> None:
    book.upsert_scores("run-0", scored(1), MODEL_VERSION)  # the parent's engine exists before the fork
    context = multiprocessing.get_context("fork")
    start, results = context.Barrier(2), context.Queue()
    writers = [context.Process(target=_write_concurrently, args=(book, worker, start, results)) for worker in (1, 2)]
    for writer in writers:
        writer.start()
    outcomes = sorted(results.get(timeout=120) for _ in writers)
    for writer in writers:
        writer.join(timeout=30)
    assert [error for _, _, error in outcomes] == ["", ""], outcomes
    assert sorted(signed for _, signed, _ in outcomes) == [False, True]  # one manifest, whoever came first
    assert book.counts("run-c") == LedgerCounts(scored=4_000, quarantined=40)
    assert set(book.scores_of("run-c").values()) <= {Decimal("0.1000"), Decimal("0.2000")}
    assert book.counts("run-0").scored == 1  # and the parent's connections still work


def test_the_default_ledger_is_the_namespace_sqlite_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RCL_LEDGER_URL", raising=False)
    path = ledger.ROOT / ".lab" / settings.NAMESPACE / "severity-ledger.sqlite"
    assert ledger.ledger_url() == f"sqlite:///{path}" and path.parent.is_dir()
    monkeypatch.setenv("RCL_LEDGER_URL", "postgresql://lab:s3cret@db.example:5432/claims")
    shown = repr(Ledger())  # made lazily: nothing connects
    assert "s3cret" not in shown and "postgresql+psycopg://lab:***@db.example:5432/claims" in shown
    with pytest.raises(ValueError, match="not a namespace"):
        Ledger(namespace="Bad_Name")


def test_a_ledger_that_does_not_answer_is_a_broken_run_naming_it_masked() -> None:
    from lab.records import RunBroken

    with pytest.raises(RunBroken, match=r"the ledger at postgresql\+psycopg://lab:\*\*\*@127\.0\.0\.1:1/x does not answer"):
        Ledger("postgresql://lab:s3cret@127.0.0.1:1/x").opened(clear=True)
