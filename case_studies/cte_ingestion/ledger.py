"""The CTE ledger: committed events, each lot's head, refused out-of-order arrivals, quarantined
payloads and dead letters, in SQLite or PostgreSQL.

Knobs (environment variables), as for the severity ledger:

- ``RCL_LEDGER_URL``: an SQLAlchemy URL (a bare ``postgresql://`` means psycopg 3). Default: an
  SQLite file, ``.lab/<namespace>/cte-ledger.sqlite`` in the repository.
- ``RCL_NAMESPACE`` (``lab.settings``): every table is ``<namespace>_cte_<name>``; ``clear()``
  deletes only their rows, ``drop()`` only them.

``commit(event)`` does in one transaction what the write-up's upsert cannot:

1. It locks the lot's head row: one upsert, ``INSERT ... ON CONFLICT (lot) DO UPDATE SET seq = seq
   RETURNING seq``, makes the row on the lot's first event and otherwise changes nothing but takes
   the row's lock (PostgreSQL) or the database's one write lock (SQLite) until the transaction
   ends, and returns the head in the same round trip. Every commit of one lot now runs one after
   the other, on any number of workers: the decisions below are made on a head nobody else moves.
2. An event at or below the head whose idempotency key is there is ``deduplicated``: a resend,
   even one that arrives after newer events of its lot, is a duplicate, not a disorder. (An event
   above the head cannot have been committed.) The key holds the lot code, so the lot's lock covers
   it; the insert is still ``ON CONFLICT DO NOTHING`` on the key.
3. The sequence guard: an event whose ``seq`` is not above the lot's last committed ``seq`` (an
   older event after a newer one) is refused, ``out_of_order``: no event and no head is written,
   only the attempt, in ``<ns>_cte_out_of_order``, so a check can count attempts and assert zero.
   An event without ``seq`` (real feeds send none) is never refused: it has no order of its own to
   break, and the shards and turns of ``fixed.py`` give the lot its order.
4. Otherwise the event is written with the lot's next commit number (its place in the lot's commit
   order, assigned under the lock, so it is the true order on PostgreSQL too, which a clock column
   is not), and the head moves to its ``seq``: ``committed``. An event without ``seq`` is given the
   head's next, ``head + 1``, under the same lock: two commits of one lot can never take one number.

``hold_lots=True`` (the fixed program): a lot with a pending dead letter (``dead_letter(..., lot=)``)
is held. Its new events come back ``held`` from ``commit``, and the caller dead-letters them
behind the first, so nothing of the lot passes an event that waits for a replay; ``commit(event,
replay=True)`` (the replay, in the lot's order) skips the hold. The check is in the same transaction,
under the lot's lock.

``sequence_guard=False`` is the write-up's ledger: an older event is committed anyway (the attempt
row says ``refused = false``) and ``counts().out_of_order_commits`` counts it. A lot code is taken
as unique (its lot code source assigns it; the lab's codes carry the supplier): lots of two
suppliers with one code would share a head.

``fault`` (the lab's hook): a callable run inside the transaction after the writes, before the
commit; raising ``TransientLedgerError`` there rolls everything back, as a lost connection would.
Database errors that a retry can cure (a lost connection, PostgreSQL's serialization and deadlock
errors, SQLite's "database is locked") come out as ``TransientLedgerError`` too, so the task
retries one exception class; any other error is a bug and propagates.

``dry_run=True``: ``commit``, ``quarantine``, ``dead_letter`` and ``mark_replayed`` decide exactly as
they would, log what they would write, and write nothing (not even the tables: ``create()`` only
logs). Decisions of earlier dry-run calls are remembered by the Ledger object (in this process),
so a dry run over a whole stream predicts each outcome of a real run in one process.

Limits: SQLite takes one writer at a time (WAL lets readers go on; a writer waits up to
``ledger_base.BUSY_TIMEOUT_MS``). ``create()`` from several processes at the same moment may race on
PostgreSQL: create the tables once, before dispatching.

One piece: every table and every write of the ledger, on both databases, sit together, so that one reading
shows all it guarantees (each key committed once, each lot's order).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import (JSON, Boolean, Column, Connection, DateTime, Executable, Index, Integer, MetaData, String,
                        Table, Text, bindparam, delete, func, inspect, select, update)
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.schema import CreateTable

from case_studies.cte_ingestion.events import (CriticalTrackingEvent, Quarantined, RawPayload, idempotency_key,
                                               supplier_label)
from case_studies.ledger_base import ROOT as ROOT, SqlLedger, utc
from case_studies.ledger_base import ledger_url as shared_ledger_url
from lab.settings import NAMESPACE, mask_url

log = logging.getLogger(__name__)

Outcome = Literal["committed", "deduplicated", "out_of_order", "held"]


class TransientLedgerError(Exception):
    """The ledger could not answer now; the same commit later may succeed (retry it, with backoff)."""


FaultHook = Callable[[CriticalTrackingEvent], None]
"""Run inside ``commit``'s transaction, after its writes, before it commits; may raise to abort it."""


def ledger_url() -> str:
    """``RCL_LEDGER_URL``, or the namespace's SQLite file (its folder created)."""
    return shared_ledger_url("cte-ledger.sqlite")


@dataclass(frozen=True)
class LedgerCounts:
    """What a check compares with the stream's ground truth and with the metrics."""

    committed: int
    quarantined: int
    dead_lettered: int  # times anything was dead-lettered (a replayed one dead-lettered again counts twice)
    dead_letters_pending: int  # not replayed yet: the dead-letter depth
    out_of_order_attempts: int  # arrivals older than their lot's head (refused or, unguarded, committed)
    out_of_order_commits: int  # events committed after a later event of their lot: zero with the guard


@dataclass(frozen=True)
class DeadLetter:
    key: str
    payload: str
    reason: str
    supplier: str
    times: int  # how often it was dead-lettered (again after a replay)
    replayed: bool
    dead_lettered_at: datetime
    lot: str | None = None  # the event's lot, when it had one: a pending dead letter holds its lot


@dataclass(frozen=True)
class _Statements:
    lock_head: Executable
    insert_event: Executable
    advance_head: Executable
    find_event: Executable
    lot_held: Executable
    attempt: Executable


class Ledger(SqlLedger):
    """The CTE tables of one namespace in the database at ``url`` (default ``ledger_url()``).

    The engine is made lazily, one per process: a Ledger built before a fork (a Celery prefork
    worker) never hands its parent's pooled connections to a child."""

    def __init__(self, url: str | None = None, namespace: str = NAMESPACE, *, dry_run: bool = False,
                 sequence_guard: bool = True, hold_lots: bool = False, fault: FaultHook | None = None) -> None:
        super().__init__(url or ledger_url(), namespace)
        self.dry_run = dry_run
        self.sequence_guard = sequence_guard
        self.hold_lots = hold_lots
        self.fault = fault
        # dry run: what earlier calls would have written (by key; per lot, its head)
        self._would_head: dict[str, int] = {}
        self._would_commit: set[str] = set()
        self._would_quarantine: set[str] = set()
        self._would_pending: set[str] = set()
        self._would_replayed: set[str] = set()
        self._would_lot: dict[str, str] = {}  # dead letter key -> its lot
        self._tables: set[str] | None = None
        self.metadata = MetaData()
        prefix = f"{namespace}_cte"
        self.events_table = Table(
            f"{prefix}_events", self.metadata,
            Column("key", String(64), primary_key=True),  # idempotency_key(event)
            Column("lot", String(64), nullable=False),
            Column("seq", Integer, nullable=False),
            Column("commit_no", Integer, nullable=False),  # the event's place in its lot's commit order: 1, 2, ...
            Column("supplier", String(32), nullable=False, index=True),
            Column("event_type", String(32), nullable=False),  # first_land_based_receiving: 26
            Column("event_time", DateTime(timezone=True), nullable=False),
            Column("payload", JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),
            Column("committed_at", DateTime(timezone=True), nullable=False),
            Index(f"{prefix}_events_lot_order", "lot", "commit_no", unique=True),
        )
        self.heads_table = Table(
            f"{prefix}_lot_heads", self.metadata,
            Column("lot", String(64), primary_key=True),
            Column("seq", Integer, nullable=False),  # the highest seq committed; 0 before the first commit
            Column("commits", Integer, nullable=False),  # events committed for the lot
            Column("updated_at", DateTime(timezone=True), nullable=False),
        )
        self.out_of_order_table = Table(
            f"{prefix}_out_of_order", self.metadata,
            Column("id", Integer, primary_key=True, autoincrement=True),
            Column("key", String(64), nullable=False),
            Column("lot", String(64), nullable=False, index=True),
            Column("seq", Integer, nullable=False),
            Column("head_seq", Integer, nullable=False),  # the lot's head when it arrived
            Column("refused", Boolean, nullable=False),
            Column("attempted_at", DateTime(timezone=True), nullable=False),
        )
        self.quarantine_table = Table(
            f"{prefix}_quarantine", self.metadata,
            Column("key", String(64), primary_key=True),  # sha256 of the payload text: a redelivery is kept once
            Column("supplier", String(32), nullable=False, index=True),
            Column("payload", Text, nullable=False),  # as received: it may not even be JSON
            Column("errors", JSON().with_variant(postgresql.JSONB(), "postgresql"), nullable=False),
            Column("quarantined_at", DateTime(timezone=True), nullable=False),
        )
        self.dead_letter_table = Table(
            f"{prefix}_dead_letters", self.metadata,
            Column("key", String(64), primary_key=True),
            Column("supplier", String(32), nullable=False, index=True),
            Column("lot", String(64), nullable=True, index=True),
            Column("payload", Text, nullable=False),
            Column("reason", Text, nullable=False),
            Column("times", Integer, nullable=False),
            Column("replayed", Boolean, nullable=False),
            Column("dead_lettered_at", DateTime(timezone=True), nullable=False),
        )

    def __repr__(self) -> str:
        dry = ", dry_run=True" if self.dry_run else ""
        return f"Ledger({mask_url(self.url)!r}, namespace={self.namespace!r}{dry})"

    @contextmanager
    def _transaction(self) -> Generator[Connection]:
        """One transaction; errors a retry can cure come out as ``TransientLedgerError``."""
        try:
            with self.engine.begin() as conn:
                yield conn
        except DBAPIError as error:
            if not self._transient(error):
                raise
            raise TransientLedgerError(f"{type(error.orig).__name__}: {str(error.orig).strip()[:200]}") from error

    def _transient(self, error: DBAPIError) -> bool:
        if error.connection_invalidated:
            return True
        if self.engine.dialect.name == "postgresql":  # psycopg: connection, serialization, deadlock, lock timeout
            return isinstance(error, OperationalError)
        text = str(error.orig).lower()
        return isinstance(error, OperationalError) and ("locked" in text or "busy" in text)

    def create(self) -> None:
        """Create the namespace's tables that are missing; never alters one that exists."""
        if self.dry_run:
            log.info("dry run: would create the tables of %s", self.namespace)
            return
        with self.engine.begin() as conn:
            for table in self.metadata.sorted_tables:
                conn.execute(CreateTable(table, if_not_exists=True))
                for index in table.indexes:
                    index.create(conn, checkfirst=True)

    def clear(self) -> None:
        """Delete every row of the namespace's tables (those that exist); other tables are not touched."""
        for would in (self._would_head, self._would_commit, self._would_quarantine, self._would_pending,
                      self._would_replayed, self._would_lot):
            would.clear()
        if self.dry_run:
            log.info("dry run: would clear the tables of %s", self.namespace)
            return
        with self.engine.begin() as conn:
            present = set(inspect(conn).get_table_names())
            for table in self.metadata.sorted_tables:
                if table.name in present:
                    conn.execute(delete(table))

    def drop(self) -> None:
        """Drop the namespace's tables (those that exist); other tables are not touched."""
        if self.dry_run:
            log.info("dry run: would drop the tables of %s", self.namespace)
            return
        with self.engine.begin() as conn:
            self.metadata.drop_all(conn, checkfirst=True)

    @cached_property
    def _sql(self) -> _Statements:
        """The commit's statements, built once (parameters bound at execution): building a statement
        costs more Python time than SQLite takes to run it."""
        h, e = self.heads_table.c, self.events_table.c
        lock = self._insert(self.heads_table)
        lock = lock.on_conflict_do_update(index_elements=[h.lot], set_={"seq": h.seq}).returning(h.seq, h.commits)
        return _Statements(
            lock_head=lock,
            insert_event=self._insert(self.events_table).on_conflict_do_nothing(index_elements=[e.key]).returning(e.key),
            advance_head=update(self.heads_table).where(h.lot == bindparam("head_lot")).values(
                seq=bindparam("head_seq"), commits=bindparam("head_commits"), updated_at=bindparam("head_at")),
            find_event=select(e.key).where(e.key == bindparam("find_key")),
            lot_held=select(self.dead_letter_table.c.key).where(self.dead_letter_table.c.lot == bindparam("held_lot"),
                                                               self.dead_letter_table.c.replayed.is_(False)).limit(1),
            attempt=self.out_of_order_table.insert().values(
                key=bindparam("key"), lot=bindparam("lot"), seq=bindparam("seq"), head_seq=bindparam("head_seq"),
                refused=bindparam("refused"), attempted_at=bindparam("at")),
        )

    def commit(self, cte: CriticalTrackingEvent, replay: bool = False) -> Outcome:
        """Commit a validated event at most once, never behind a later event of its lot (see the module).

        With ``hold_lots``, a lot with a pending dead letter is held: its new events come back
        ``held`` (the caller dead-letters them too) until a replay (``replay=True``) commits the
        dead letters in order."""
        return self.commit_many([cte], replay)[0]

    def commit_many(self, ctes: Sequence[CriticalTrackingEvent], replay: bool = False) -> list[Outcome]:
        """``commit`` of each event, in the order given, in one transaction: all or nothing (a
        ``TransientLedgerError`` for one rolls back all). One transaction per batch, not per event:
        the database's commit (an fsync) and, on SQLite, its one write lock are paid once. On
        PostgreSQL the transaction holds the row lock of every lot it touched until it ends:
        callers must give one process's batches disjoint lots (a shard's), or two batches could
        wait for each other."""
        if self.dry_run:
            return [self._commit_dry(cte, idempotency_key(cte), replay) for cte in ctes]
        sql, now = self._sql, datetime.now(UTC)
        with self._transaction() as conn:
            return [self._commit_in(conn, sql, cte, replay, now) for cte in ctes]

    def _commit_in(self, conn: Connection, sql: _Statements, cte: CriticalTrackingEvent, replay: bool,
                   now: datetime) -> Outcome:
        key = idempotency_key(cte)
        # Step 1: the lot's head, locked. A new lot gets its row (seq 0); an existing one a no-op
        # update (seq = seq: nothing changes) whose row lock holds until this transaction ends.
        head = conn.execute(sql.lock_head, {"lot": cte.lot_key, "seq": 0, "commits": 0, "updated_at": now}).one()
        outcome: Outcome
        behind = cte.seq is not None and cte.seq <= head.seq  # an older event than the lot's head
        if (cte.seq is None or behind) and conn.execute(sql.find_event, {"find_key": key}).first() is not None:
            outcome = "deduplicated"  # step 2: a resend (only an event at or below the head, or with no seq, can be one)
        elif self.hold_lots and not replay and conn.execute(sql.lot_held, {"held_lot": cte.lot_key}).first():
            outcome = "held"  # an earlier event of the lot waits in the dead letters: nothing passes it
        elif behind and self.sequence_guard:
            conn.execute(sql.attempt, {"key": key, "lot": cte.lot_key, "seq": cte.seq, "head_seq": head.seq,
                                       "refused": True, "at": now})
            outcome = "out_of_order"  # step 3: refused; only the attempt is written
        else:
            if behind:  # unguarded (the write-up): committed behind a later event
                conn.execute(sql.attempt, {"key": key, "lot": cte.lot_key, "seq": cte.seq, "head_seq": head.seq,
                                           "refused": False, "at": now})
            seq = cte.seq if cte.seq is not None else head.seq + 1  # no seq sent: the lot's next, under its lock
            written = conn.execute(sql.insert_event, {
                "key": key, "lot": cte.lot_key, "seq": seq, "commit_no": head.commits + 1,
                "supplier": cte.supplier_id, "event_type": cte.event_type,
                "event_time": cte.event_time.astimezone(UTC),  # SQLite keeps no offset: store UTC
                "payload": cte.model_dump(mode="json"), "committed_at": now}).first()
            if written is None:  # the write-up's upsert on the key; under the lot's lock it never fires
                outcome = "deduplicated"
            else:
                conn.execute(sql.advance_head, {"head_lot": cte.lot_key, "head_seq": max(head.seq, seq),
                                                "head_commits": head.commits + 1, "head_at": now})
                outcome = "committed"  # step 4
        if self.fault is not None:
            self.fault(cte)  # the lab's hook: raising here rolls back everything above
        return outcome

    def _commit_dry(self, cte: CriticalTrackingEvent, key: str, replay: bool = False) -> Outcome:
        h, e = self.heads_table.c, self.events_table.c
        present = self._present()
        with self._transaction() as conn:
            stored = None
            if self.heads_table.name in present:
                stored = conn.execute(select(h.seq).where(h.lot == cte.lot_key)).scalar_one_or_none()
            already = key in self._would_commit or (self.events_table.name in present and conn.execute(
                select(e.key).where(e.key == key)).first() is not None)
            head = self._would_head.get(cte.lot_key, stored or 0)
            if self.fault is not None:
                self.fault(cte)
        outcome: Outcome
        if already:
            outcome = "deduplicated"
        elif self.hold_lots and not replay and cte.lot_key in {self._would_lot.get(k) for k in self._would_pending}:
            outcome = "held"
        elif cte.seq is not None and cte.seq <= head and self.sequence_guard:
            outcome = "out_of_order"
        else:
            outcome = "committed"
            self._would_commit.add(key)
            self._would_head[cte.lot_key] = max(head, cte.seq if cte.seq is not None else head + 1)
        log.info("dry run: %s lot %s seq %s (head %d) key %s", outcome, cte.lot_key, cte.seq, head, key[:12])
        return outcome

    def _pending_dry(self, key: str) -> bool:
        """Dry run: whether a dead letter with this key would be pending now."""
        if key in self._would_pending:
            return True
        return key not in self._would_replayed and self._exists(self.dead_letter_table, key, pending=True)

    def quarantine(self, bad: Quarantined) -> bool:
        """Keep an invalid payload aside with every problem; True when this call kept it, False when
        it was kept already (a redelivery)."""
        if self.dry_run:
            fresh = bad.key not in self._would_quarantine and not self._exists(self.quarantine_table, bad.key)
            self._would_quarantine.add(bad.key)
            log.info("dry run: would quarantine %s from %s: %s", bad.key[:12], bad.supplier,
                     ", ".join(sorted(bad.error_types)))
            return fresh
        q = self.quarantine_table.c
        stmt = (self._insert(self.quarantine_table).values(
            key=bad.key, supplier=bad.supplier, payload=bad.payload_text, errors=[dict(p) for p in bad.errors],
            quarantined_at=datetime.now(UTC)).on_conflict_do_nothing(index_elements=[q.key]).returning(q.key))
        with self._transaction() as conn:
            return conn.execute(stmt).first() is not None

    def dead_letter(self, key: str, payload: RawPayload, reason: str, supplier: str, lot: str | None = None) -> bool:
        """Set an event aside for a replay (its retries ran out, or it was refused). ``key`` is the
        event's idempotency key (``Quarantined.key`` for a payload that has none). True when this
        call made a pending dead letter; False when one was pending already (a redelivery). A dead
        letter already replayed becomes pending again, ``times`` one more."""
        text, supplier = Quarantined(payload, ()).payload_text, supplier_label(supplier)
        if self.dry_run:
            fresh = not self._pending_dry(key)
            self._would_pending.add(key)
            self._would_replayed.discard(key)
            if lot is not None:
                self._would_lot[key] = lot
            log.info("dry run: would dead-letter %s from %s: %s", key[:12], supplier, reason)
            return fresh
        d = self.dead_letter_table.c
        stmt = self._insert(self.dead_letter_table).values(
            key=key, supplier=supplier, lot=lot, payload=text, reason=reason, times=1, replayed=False,
            dead_lettered_at=datetime.now(UTC))
        stmt = stmt.on_conflict_do_update(
            index_elements=[d.key], set_={"times": d.times + 1, "replayed": False, "reason": stmt.excluded.reason,
                                          "dead_lettered_at": stmt.excluded.dead_lettered_at},
            where=d.replayed.is_(True)).returning(d.key)  # a pending one stays as it is
        with self._transaction() as conn:
            return conn.execute(stmt).first() is not None

    def pending_dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """Dead letters not replayed yet, oldest first."""
        d = self.dead_letter_table.c
        with self.engine.connect() as conn:
            rows = conn.execute(select(d.key, d.payload, d.reason, d.supplier, d.times, d.replayed,
                                       d.dead_lettered_at, d.lot).where(d.replayed.is_(False))
                                .order_by(d.dead_lettered_at, d.key).limit(limit)).all()
        return [DeadLetter(row.key, row.payload, row.reason, row.supplier, row.times, row.replayed,
                           utc(row.dead_lettered_at), row.lot) for row in rows]

    def mark_replayed(self, key: str) -> bool:
        """Mark a pending dead letter replayed; True when this call did (a second replayer gets False)."""
        if self.dry_run:
            pending = self._pending_dry(key)
            if pending:
                self._would_pending.discard(key)
                self._would_replayed.add(key)
                log.info("dry run: would mark %s replayed", key[:12])
            return pending
        d = self.dead_letter_table.c
        with self._transaction() as conn:
            return conn.execute(update(self.dead_letter_table).where(d.key == key, d.replayed.is_(False))
                                .values(replayed=True).returning(d.key)).first() is not None

    def _present(self) -> set[str]:
        """Dry run: the namespace's tables that exist (looked up once: a dry run creates none)."""
        if self._tables is None:
            with self.engine.connect() as conn:
                self._tables = set(inspect(conn).get_table_names()) & {t.name for t in self.metadata.sorted_tables}
        return self._tables

    def _exists(self, table: Table, key: str, pending: bool = False) -> bool:
        if table.name not in self._present():
            return False
        with self.engine.connect() as conn:
            query = select(table.c.key).where(table.c.key == key)
            if pending:
                query = query.where(table.c.replayed.is_(False))
            return conn.execute(query).first() is not None

    # What checks read.

    def counts(self) -> LedgerCounts:
        d = self.dead_letter_table.c
        with self.engine.connect() as conn:
            def count(table: Table, *where: Any) -> int:
                return conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one()
            return LedgerCounts(
                committed=count(self.events_table), quarantined=count(self.quarantine_table),
                dead_lettered=conn.execute(select(func.coalesce(func.sum(d.times), 0))).scalar_one(),
                dead_letters_pending=count(self.dead_letter_table, d.replayed.is_(False)),
                out_of_order_attempts=count(self.out_of_order_table),
                out_of_order_commits=self._out_of_order_commits(conn))

    def _out_of_order_commits(self, conn: Connection) -> int:
        """Events committed after an event of their lot with the same or a higher seq."""
        e = self.events_table.c
        before = func.max(e.seq).over(partition_by=e.lot, order_by=e.commit_no, rows=(None, -1))
        ordered = select(e.seq, before.label("before")).subquery()
        return conn.execute(select(func.count()).select_from(ordered)
                            .where(ordered.c.before.is_not(None), ordered.c.seq <= ordered.c.before)).scalar_one()

    def by_supplier(self) -> dict[tuple[str, str], int]:
        """(outcome, supplier) to count, for ``committed`` and ``quarantined`` (rows) and
        ``dead_lettered`` (times): the ledger's side of the metrics' ``cte_events_total``."""
        found: dict[tuple[str, str], int] = {}
        d = self.dead_letter_table.c
        with self.engine.connect() as conn:
            for outcome, table in (("committed", self.events_table), ("quarantined", self.quarantine_table)):
                rows = conn.execute(select(table.c.supplier, func.count()).group_by(table.c.supplier)).all()
                found.update({(outcome, supplier): n for supplier, n in rows})
            rows = conn.execute(select(d.supplier, func.sum(d.times)).group_by(d.supplier)).all()
            found.update({("dead_lettered", supplier): n for supplier, n in rows})
        return found

    def lot_sequences(self) -> dict[str, list[int]]:
        """Per lot, the seq of its committed events in commit order."""
        e = self.events_table.c
        found: dict[str, list[int]] = {}
        with self.engine.connect() as conn:
            for lot, seq in conn.execute(select(e.lot, e.seq).order_by(e.lot, e.commit_no)):
                found.setdefault(lot, []).append(seq)
        return found

    def lot_keys(self) -> dict[str, list[str]]:
        """Per lot, the idempotency keys of its committed events in commit order."""
        e = self.events_table.c
        found: dict[str, list[str]] = {}
        with self.engine.connect() as conn:
            for lot, key in conn.execute(select(e.lot, e.key).order_by(e.lot, e.commit_no)):
                found.setdefault(lot, []).append(key)
        return found

    def lot_head(self, lot: str) -> int | None:
        """The lot's last committed seq; None when nothing of it was committed."""
        h = self.heads_table.c
        with self.engine.connect() as conn:
            seq = conn.execute(select(h.seq).where(h.lot == lot, h.commits > 0)).scalar_one_or_none()
        return seq

    def quarantined(self) -> dict[str, list[dict[str, Any]]]:
        """Quarantined payload text to its problems."""
        q = self.quarantine_table.c
        with self.engine.connect() as conn:
            return {payload: errors for payload, errors in conn.execute(select(q.payload, q.errors))}
