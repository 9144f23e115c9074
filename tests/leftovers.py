"""What a test session leaves on the shared services, and its deletion (``conftest.py`` calls both).

For the session's namespace and every one derived from it (``tests/namespaces.py``):

- Redis: the keys ``<namespace>:*`` (SCAN; deleted by name, never a flush);
- RabbitMQ: the queues and exchanges the lab may make there (``lab.harness.namespace_names``, the
  session's names with the namespace swapped in), asked one by one with a passive declare; and,
  where ``rabbitmqctl`` answers for the default local broker, every queue and exchange whose name
  starts with ``<namespace>.``, whatever made it;
- PostgreSQL (the tests' database, ``conftest.postgres_url``): the tables ``<namespace>_*`` (a
  namespace has no ``_``, so the part of a table's name before its first ``_`` is its namespace).

``clean`` deletes all of that (on the broker, the names the lab knows); ``leftovers`` lists what is
still there, one line each.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from typing import Any, cast

from kombu import Connection
from sqlalchemy import MetaData, create_engine, inspect

from case_studies.ledger_base import normal_url
from lab import harness
from lab.observe import client
from lab.settings import NAMESPACE, broker_is_default, broker_url
from tests.namespaces import every


def amqp_names(namespaces: list[str]) -> tuple[list[str], list[str]]:
    """The queue and exchange names the lab may make in each of ``namespaces``."""
    queues, exchanges = harness.namespace_names()

    def swapped(names: list[str]) -> list[str]:
        return [f"{ns}{name[len(NAMESPACE):]}" for ns in namespaces for name in names]

    return swapped(queues), swapped(exchanges)


def _exists(conn: Connection, declare: Callable[[Any], object]) -> bool:
    channel = cast(Any, conn.channel())  # a passive declare of a missing name closes its channel
    try:
        declare(channel)
        return True
    except Exception:
        return False
    finally:
        try:
            channel.close()
        except Exception:
            pass


def broker_listing() -> tuple[list[str], list[str]] | None:
    """Every queue and exchange name of the local broker, by ``rabbitmqctl`` (None where it does not answer)."""
    ctl = shutil.which("rabbitmqctl")
    if ctl is None or not broker_is_default():
        return None
    found: list[list[str]] = []
    for what in ("list_queues", "list_exchanges"):
        try:
            done = subprocess.run([ctl, "-q", what, "name", "--no-table-headers"], capture_output=True, text=True,
                                  timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        if done.returncode != 0:
            return None
        found.append(done.stdout.split())
    return found[0], found[1]


def _keys(namespaces: list[str]) -> list[str]:
    scan = cast(Callable[..., Iterator[Any]], cast(Any, client()).scan_iter)
    return sorted(str(k) for ns in namespaces for k in scan(match=f"{ns}:*", count=1000))


def _tables(url: str, namespaces: list[str]) -> list[str]:
    engine = create_engine(normal_url(url), connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as conn:
            return sorted(t for t in inspect(conn).get_table_names() if t.split("_", 1)[0] in namespaces)
    finally:
        engine.dispose()


def leftovers(postgres_url: str | None, services: bool = True, namespaces: list[str] | None = None) -> list[str]:
    """What is still there, one line each (``services``: Redis and RabbitMQ; ``postgres_url``: its tables),
    in ``namespaces`` (default: the session's and every one derived from it)."""
    namespaces = every() if namespaces is None else namespaces
    found: list[str] = []
    if services:
        found += [f"Redis key {k}" for k in _keys(namespaces)]
        listed = broker_listing()
        if listed is not None:  # the broker's own list: every name, whatever made it
            prefixes = tuple(f"{ns}." for ns in namespaces)
            found += [f"{kind} {n}" for kind, names in zip(("queue", "exchange"), listed) for n in names
                      if n.startswith(prefixes)]
        else:  # no rabbitmqctl here: the names the lab may make, asked one by one
            queues, exchanges = amqp_names(namespaces)
            with Connection(broker_url()) as conn:
                found += [f"queue {q}" for q in queues
                          if _exists(conn, lambda ch, q=q: ch.queue_declare(queue=q, passive=True))]
                found += [f"exchange {e}" for e in exchanges
                          if _exists(conn, lambda ch, e=e: ch.exchange_declare(exchange=e, type="direct", passive=True))]
    if postgres_url is not None:
        found += [f"PostgreSQL table {t}" for t in _tables(postgres_url, namespaces)]
    return found


def clean(postgres_url: str | None, services: bool = True, namespaces: list[str] | None = None) -> None:
    """Delete what ``leftovers`` would list: the keys, the tables, and the broker's names the lab knows (a name
    it does not know, which only ``rabbitmqctl`` lists, stays: the final look names it, for its maker to fix)."""
    namespaces = every() if namespaces is None else namespaces
    others = [ns for ns in namespaces if ns != NAMESPACE]
    if services:
        if NAMESPACE in namespaces:
            harness.clean(say=lambda _: None)  # the session's own namespace: its names, keys and ledger rows
        queues, exchanges = amqp_names(others)
        listed = broker_listing() if others else None
        if listed is not None:  # of the names the lab knows, those the broker has: one delete each, not thousands
            there_queues, there_exchanges = set(listed[0]), set(listed[1])
            queues, exchanges = [q for q in queues if q in there_queues], [e for e in exchanges if e in there_exchanges]
        harness.delete_names(queues, exchanges)
        for ns in others:
            harness.delete_keys(f"{ns}:*")
    if postgres_url is not None:
        tables = _tables(postgres_url, namespaces)
        if tables:
            engine = create_engine(normal_url(postgres_url))
            try:
                with engine.begin() as conn:
                    found = MetaData()
                    found.reflect(conn, only=tables)
                    found.drop_all(conn)  # in the order their foreign keys need
            finally:
                engine.dispose()
