"""``no_connections``: while the audit imports and reads an app, no socket may connect.

The audit promises never to open a broker or backend connection: it reads settings,
queues and task options, all of which Celery keeps in memory. A Celery app can still
connect at import time (a module that pings Redis, a ``broker_connection_retry_on_startup``
check someone calls by hand); the guard turns any such attempt into ``ConnectionRefusedByAudit``
naming where it tried to go, so the audit stops with exit status 2 and says so, rather than
talking to a production broker from a CI job.

What it covers: ``socket.socket.connect`` and ``connect_ex`` (which every Python client, kombu,
py-amqp, redis-py, urllib, ends in) and ``socket.create_connection``, for every address family.
What it does not: a C extension that opens sockets without Python's ``socket`` module (librabbitmq,
a database driver's C client). ``tests/test_audit_guard.py`` proves it on the lab's own apps.
"""

from __future__ import annotations

import socket
from collections.abc import Generator
from contextlib import contextmanager
from typing import Any


class ConnectionRefusedByAudit(ConnectionError):
    """Something tried to connect while the audit held the guard."""

    def __init__(self, address: object) -> None:
        super().__init__(f"tried to connect to {address!r}; the audit opens no connection")
        self.address = address


@contextmanager
def no_connections() -> Generator[list[object]]:
    """Refuse every socket connection inside the block; yields the addresses that were tried."""
    tried: list[object] = []
    saved = (socket.socket.connect, socket.socket.connect_ex, socket.create_connection)

    def refuse(_sock: socket.socket, address: Any, *_: Any, **__: Any) -> Any:
        tried.append(address)
        raise ConnectionRefusedByAudit(address)

    def refuse_create(address: Any, *_: Any, **__: Any) -> Any:
        tried.append(address)
        raise ConnectionRefusedByAudit(address)

    socket.socket.connect = refuse  # type: ignore[method-assign]
    socket.socket.connect_ex = refuse  # type: ignore[method-assign]
    socket.create_connection = refuse_create  # type: ignore[assignment]
    try:
        yield tried
    finally:
        socket.socket.connect, socket.socket.connect_ex, socket.create_connection = saved  # type: ignore[method-assign]
