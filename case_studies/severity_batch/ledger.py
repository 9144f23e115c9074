"""The ledger: scores, quarantined rows, signed run manifests and flags, in SQLite or PostgreSQL.

Knobs (environment variables):

- ``RCL_LEDGER_URL``: an SQLAlchemy URL, e.g. ``postgresql+psycopg://user:pw@host/db``
  (a bare ``postgresql://`` means psycopg 3 too). Default: an SQLite file,
  ``.lab/<namespace>/severity-ledger.sqlite`` in the repository.
- ``RCL_NAMESPACE`` (``lab.settings``): every table is ``<namespace>_severity_<name>``,
  so several namespaces share one database; ``clear()`` deletes only their rows.

Every write is idempotent: scores are upserted on (claim id, run id), a quarantined row
is kept once, a manifest is signed once (append-only), so a redelivered chunk changes
nothing. Limits: SQLite takes one writer at a time (WAL lets readers go on; a writer
waits up to ``ledger_base.BUSY_TIMEOUT_MS`` for the lock, then fails with "database is locked");
``create()`` from several processes at the very same moment may still race on
PostgreSQL (create the tables once, before dispatching).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import (Column, DateTime, Dialect, Integer, MetaData, Numeric, String, Table, Text, delete, func,
                        inspect, select)
from sqlalchemy.schema import CreateTable
from sqlalchemy.types import TypeDecorator, TypeEngine

from case_studies.ledger_base import ROOT as ROOT, SqlLedger, utc
from case_studies.ledger_base import ledger_url as shared_ledger_url
from lab.settings import NAMESPACE, mask_url

SCORE_PLACES = 4


def ledger_url() -> str:
    """``RCL_LEDGER_URL``, or the namespace's SQLite file (its folder created)."""
    return shared_ledger_url("severity-ledger.sqlite")


class Score(TypeDecorator[Decimal]):
    """A score, exact: NUMERIC(10, 4) where the database has a decimal type; on SQLite, whose
    NUMERIC is a float underneath, the text of the Decimal. A value with more places is refused."""

    impl = Numeric(10, SCORE_PLACES, asdecimal=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(String(16))
        return dialect.type_descriptor(Numeric(10, SCORE_PLACES, asdecimal=True))

    def process_bind_param(self, value: Decimal | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        exact = value.quantize(Decimal(1).scaleb(-SCORE_PLACES))
        if exact != value:
            raise ValueError(f"score {value} has more than {SCORE_PLACES} decimal places")
        return str(exact) if dialect.name == "sqlite" else exact

    def process_result_value(self, value: Any, dialect: Dialect) -> Decimal | None:
        return None if value is None else Decimal(value)


@dataclass(frozen=True)
class LedgerCounts:
    scored: int
    quarantined: int


@dataclass(frozen=True)
class Manifest:
    run_id: str
    model_version: str
    dispatched: int
    scored: int
    quarantined: int
    skipped: int
    signed_at: datetime


@dataclass(frozen=True)
class Flag:
    run_id: str
    reason: str
    detail: str
    flagged_at: datetime


class Ledger(SqlLedger):
    """The tables of one namespace in the database at ``url`` (default ``ledger_url()``).

    The engine is made lazily, one per process: a Ledger built before a fork (a Celery
    prefork worker) never hands its parent's pooled connections to a child."""

    def __init__(self, url: str | None = None, namespace: str = NAMESPACE) -> None:
        super().__init__(url or ledger_url(), namespace)
        self.metadata = MetaData()
        prefix = f"{namespace}_severity"
        self.score_table = Table(
            f"{prefix}_scores", self.metadata,
            Column("claim_id", String(64), primary_key=True),
            Column("run_id", String(64), primary_key=True),
            Column("score", Score(), nullable=False),
            Column("model_version", String(64), nullable=False),
            Column("scored_at", DateTime(timezone=True), nullable=False),
        )
        self.quarantine_table = Table(
            f"{prefix}_quarantine", self.metadata,
            Column("claim_id", String(64), primary_key=True),
            Column("run_id", String(64), primary_key=True),
            Column("reason", Text, nullable=False),
        )
        self.manifest_table = Table(
            f"{prefix}_manifests", self.metadata,
            Column("run_id", String(64), primary_key=True),
            Column("model_version", String(64), nullable=False),
            Column("dispatched", Integer, nullable=False),
            Column("scored", Integer, nullable=False),
            Column("quarantined", Integer, nullable=False),
            Column("skipped", Integer, nullable=False),
            Column("signed_at", DateTime(timezone=True), nullable=False),
        )
        self.flag_table = Table(
            f"{prefix}_flags", self.metadata,
            Column("id", Integer, primary_key=True, autoincrement=True),
            Column("run_id", String(64), nullable=False, index=True),
            Column("reason", Text, nullable=False),
            Column("detail", Text, nullable=False),
            Column("flagged_at", DateTime(timezone=True), nullable=False),
        )

    def __repr__(self) -> str:
        return f"Ledger({mask_url(self.url)!r}, namespace={self.namespace!r})"

    def create(self) -> None:
        """Create the namespace's tables that are missing; never alters one that exists."""
        with self.engine.begin() as conn:
            for table in self.metadata.sorted_tables:
                conn.execute(CreateTable(table, if_not_exists=True))
                for index in table.indexes:
                    index.create(conn, checkfirst=True)

    def clear(self) -> None:
        """Delete every row of the namespace's tables (those that exist); other tables are not touched."""
        with self.engine.begin() as conn:
            present = set(inspect(conn).get_table_names())
            for table in self.metadata.sorted_tables:
                if table.name in present:
                    conn.execute(delete(table))

    def upsert_scores(self, run_id: str, rows: Sequence[tuple[str, Decimal]], model_version: str) -> None:
        """Write (claim id, score) rows of a run: one statement, the rows as its parameters.
        A row already there for (claim id, run id) is overwritten, never doubled; a claim id
        given twice in ``rows`` is written once, with its last score."""
        latest = dict(rows)  # PostgreSQL refuses to update one row twice in one statement
        if not latest:
            return
        now = datetime.now(UTC)
        stmt = self._insert(self.score_table)
        stmt = stmt.on_conflict_do_update(
            index_elements=[self.score_table.c.claim_id, self.score_table.c.run_id],
            set_={"score": stmt.excluded.score, "model_version": stmt.excluded.model_version,
                  "scored_at": stmt.excluded.scored_at})
        params = [{"claim_id": claim_id, "run_id": run_id, "score": value, "model_version": model_version,
                   "scored_at": now} for claim_id, value in latest.items()]
        with self.engine.begin() as conn:
            conn.execute(stmt, params)

    def quarantine(self, run_id: str, rows: Sequence[tuple[str, str]]) -> None:
        """Keep (claim id, reason) rows of a run aside; a row already kept stays as it was."""
        if not rows:
            return
        stmt = self._insert(self.quarantine_table).on_conflict_do_nothing(
            index_elements=[self.quarantine_table.c.claim_id, self.quarantine_table.c.run_id])
        with self.engine.begin() as conn:
            conn.execute(stmt, [{"claim_id": claim_id, "run_id": run_id, "reason": reason}
                                for claim_id, reason in rows])

    def counts(self, run_id: str) -> LedgerCounts:
        with self.engine.connect() as conn:
            scored = conn.execute(select(func.count()).select_from(self.score_table)
                                  .where(self.score_table.c.run_id == run_id)).scalar_one()
            quarantined = conn.execute(select(func.count()).select_from(self.quarantine_table)
                                       .where(self.quarantine_table.c.run_id == run_id)).scalar_one()
        return LedgerCounts(scored=scored, quarantined=quarantined)

    def scores_of(self, run_id: str) -> dict[str, Decimal]:
        """Claim id to score, for one run."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(self.score_table.c.claim_id, self.score_table.c.score)
                                .where(self.score_table.c.run_id == run_id)).all()
        return {claim_id: value for claim_id, value in rows}

    def reasons(self, run_id: str) -> dict[str, str]:
        """Claim id to quarantine reason, for one run."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(self.quarantine_table.c.claim_id, self.quarantine_table.c.reason)
                                .where(self.quarantine_table.c.run_id == run_id)).all()
        return {claim_id: reason for claim_id, reason in rows}

    def sign(self, run_id: str, model_version: str, dispatched: int, scored: int, quarantined: int,
             skipped: int) -> bool:
        """Append the run's manifest; True when this call wrote it, False when one was there already."""
        m = self.manifest_table.c
        stmt = (self._insert(self.manifest_table).on_conflict_do_nothing(index_elements=[m.run_id])
                .returning(m.run_id))  # a row back means this call inserted it (rowcount is not kept for INSERT)
        with self.engine.begin() as conn:
            result = conn.execute(stmt, {"run_id": run_id, "model_version": model_version, "dispatched": dispatched,
                                         "scored": scored, "quarantined": quarantined, "skipped": skipped,
                                         "signed_at": datetime.now(UTC)})
            return result.first() is not None

    def manifest(self, run_id: str) -> Manifest | None:
        m = self.manifest_table.c
        with self.engine.connect() as conn:
            row = conn.execute(select(m.run_id, m.model_version, m.dispatched, m.scored, m.quarantined, m.skipped,
                                      m.signed_at).where(m.run_id == run_id)).first()
        if row is None:
            return None
        return Manifest(row.run_id, row.model_version, row.dispatched, row.scored, row.quarantined, row.skipped,
                        utc(row.signed_at))

    def flag(self, run_id: str, reason: str, detail: str) -> None:
        """Append a flag on a run (e.g. an imbalance found by reconcile); flags are never updated."""
        with self.engine.begin() as conn:
            conn.execute(self.flag_table.insert(), {"run_id": run_id, "reason": reason, "detail": detail,
                                                 "flagged_at": datetime.now(UTC)})

    def flags(self, run_id: str) -> list[Flag]:
        """A run's flags, oldest first."""
        f = self.flag_table.c
        with self.engine.connect() as conn:
            rows = conn.execute(select(f.run_id, f.reason, f.detail, f.flagged_at)
                                .where(f.run_id == run_id).order_by(f.id)).all()
        return [Flag(row.run_id, row.reason, row.detail, utc(row.flagged_at)) for row in rows]
