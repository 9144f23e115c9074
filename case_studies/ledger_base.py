"""What every case study's SQL ledger shares: where it lives, one engine per process, SQLite's pragmas.

- ``ledger_url(filename)``: ``RCL_LEDGER_URL``, or ``.lab/<namespace>/<filename>`` as SQLite (its
  folder made). A bare ``postgresql://`` URL means psycopg 3 (``normal_url``).
- ``SqlLedger``: the base of a ledger class. It keeps the URL (normalised) and the namespace
  (checked), and makes its engine lazily, one per process: a ledger built before a fork (a Celery
  prefork worker) never hands its parent's pooled connections to a child, and a child never closes
  its parent's. SQLite connections get ``busy_timeout`` and WAL (``sqlite_pragmas``); any dialect
  but SQLite and PostgreSQL is refused, because the ledgers' upserts are those two dialects'
  ``INSERT ... ON CONFLICT``.
- ``utc(moment)``: SQLite hands back naive datetimes; the ledgers write UTC, so say so.
- ``ledger_problem()``: why ``RCL_LEDGER_URL`` cannot serve as a ledger now (a database that does
  not answer within ``PROBE_SECONDS``, a URL SQLAlchemy cannot read, a dialect the ledgers do not
  speak), with the URL masked and what to do; ``run_all_fms.py`` asks it before a case study runs.

Limits: SQLite takes one writer at a time (WAL lets readers go on; a writer waits up to
``BUSY_TIMEOUT_MS`` for the lock, then fails with "database is locked").
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

from sqlalchemy import Engine, Table, create_engine, event, make_url
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError

from lab.records import RunBroken
from lab.settings import NAMESPACE, mask_url, namespace_problem

ROOT = Path(__file__).resolve().parent.parent
BUSY_TIMEOUT_MS = 30_000
PROBE_SECONDS = 3


def ledger_url(filename: str) -> str:
    """``RCL_LEDGER_URL``, or the namespace's SQLite file ``filename`` (its folder created)."""
    if url := os.environ.get("RCL_LEDGER_URL"):
        return url
    folder = ROOT / ".lab" / NAMESPACE
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / filename}"


def ledger_problem(url: str | None = None) -> str | None:
    """Why the ledger at ``url`` (default ``RCL_LEDGER_URL``) cannot be used now, or None when it answers
    (or when no URL is set: the SQLite files under ``.lab/<namespace>/``)."""
    url = url if url is not None else os.environ.get("RCL_LEDGER_URL")
    if not url:
        return None
    named, unset = f"RCL_LEDGER_URL={mask_url(url)}", f"or unset RCL_LEDGER_URL for SQLite under .lab/{NAMESPACE}/"
    try:
        normal = normal_url(url)
    except (SQLAlchemyError, ValueError) as exc:
        return f"{named} is not a database URL ({exc}); give one such as postgresql://user:password@host/db, {unset}"
    dialect = make_url(normal).get_backend_name()
    if dialect not in ("sqlite", "postgresql"):
        return f"{named}: the ledgers run on SQLite or PostgreSQL, not {dialect}; give a postgresql:// URL, {unset}"
    try:
        engine = create_engine(normal, connect_args={"connect_timeout": PROBE_SECONDS} if dialect == "postgresql" else {})
    except (SQLAlchemyError, ImportError) as exc:  # a driver that is not installed (psycopg2, ...)
        return f"{named}: its driver cannot be loaded ({exc}); give postgresql+psycopg:// (installed), {unset}"
    try:
        with engine.connect():
            pass
    except SQLAlchemyError as exc:
        said = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or ["no answer"])[0]
        return f"{named} does not answer: {said}; start that database or correct the URL, {unset}"
    finally:
        engine.dispose()
    return None


def normal_url(url: str) -> str:
    """``url`` with a bare ``postgresql`` driver made ``postgresql+psycopg`` (psycopg 3)."""
    parsed = make_url(url)
    if parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")  # first, so the WAL switch below waits too
    cursor.execute("PRAGMA journal_mode = WAL")  # readers never block the one writer, nor it them
    cursor.close()


def utc(moment: datetime) -> datetime:
    """SQLite hands back naive datetimes; the ledger writes UTC, so say so."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


class SqlLedger:
    """A namespace's tables in the database at ``url``, with one engine per process."""

    def __init__(self, url: str, namespace: str = NAMESPACE) -> None:
        if (problem := namespace_problem(namespace)) is not None:
            raise ValueError(problem)
        self.url = normal_url(url)
        self.namespace = namespace
        self._engines: dict[int, Engine] = {}  # by pid; a parent's engine stays untouched (never closed) in a child

    @property
    def engine(self) -> Engine:
        pid = os.getpid()
        if (engine := self._engines.get(pid)) is None:
            engine = create_engine(self.url)
            if engine.dialect.name == "sqlite":
                event.listen(engine, "connect", sqlite_pragmas)
            elif engine.dialect.name != "postgresql":
                raise ValueError(f"the ledger runs on SQLite or PostgreSQL, not {engine.dialect.name}: {mask_url(self.url)}")
            self._engines[pid] = engine
        return engine

    def create(self) -> None:
        """Make the ledger's tables (each ledger says which)."""
        raise NotImplementedError

    def clear(self) -> None:
        """Delete this namespace's rows (each ledger says from which tables)."""
        raise NotImplementedError

    def opened(self, clear: bool = False) -> Self:
        """This ledger with its tables made (and emptied of this namespace's rows, with ``clear``);
        a database that does not answer is a broken run that names it (URL masked)."""
        try:
            self.create()
            if clear:
                self.clear()
        except SQLAlchemyError as exc:
            said = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or ["no answer"])[0]
            raise RunBroken(f"the ledger at {mask_url(self.url)} does not answer: {said}") from exc
        return self

    def _insert(self, table: Table) -> sqlite.Insert | postgresql.Insert:
        """The dialect's own INSERT, the one that knows ON CONFLICT."""
        return sqlite.insert(table) if self.engine.dialect.name == "sqlite" else postgresql.insert(table)

    def dispose(self) -> None:
        """Close this process's connections (another process's engine is left alone)."""
        if (engine := self._engines.pop(os.getpid(), None)) is not None:
            engine.dispose()
