"""``shared.backend.backend_redis`` connects as the app's result backend does (issue 38, item 4)."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from redis.sentinel import SentinelConnectionPool

from shared.backend import backend_redis


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A TCP port that accepts connections and never answers (a Redis that hangs)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield int(server.getsockname()[1])
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    server.close()


def _app(url: str, **conf: Any) -> Celery:
    app = Celery("t-backend-client", backend=url, set_as_current=False)
    app.conf.update(**conf)
    return app


def test_a_backend_that_hangs_times_out_as_celerys_settings_say(silent_port: int) -> None:
    app = _app(f"redis://127.0.0.1:{silent_port}/0", redis_socket_timeout=0.5, redis_socket_connect_timeout=0.5)
    outcome: list[BaseException | None] = []

    def ask() -> None:
        try:
            r, _ = backend_redis(app)
            r.get("anything")
            outcome.append(None)
        except BaseException as exc:  # what the primitive's caller would get
            outcome.append(exc)

    began = time.monotonic()
    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    thread.join(5)  # from_url without timeouts waited here for ever
    assert not thread.is_alive(), "the client waited past 5 s on a server that never answers"
    assert len(outcome) == 1 and isinstance(outcome[0], redis.TimeoutError), outcome
    assert time.monotonic() - began < 2.0


def test_ssl_and_sentinel_come_from_celerys_settings() -> None:
    tls = _app("rediss://127.0.0.1:6390/0", redis_socket_timeout=3.0,
               redis_backend_use_ssl={"ssl_cert_reqs": ssl.CERT_REQUIRED, "ssl_ca_certs": "/etc/rcl-test/ca.pem"})
    r, _ = backend_redis(tls)
    pool: Any = r.connection_pool
    assert issubclass(pool.connection_class, redis.SSLConnection)
    assert pool.connection_kwargs["ssl_ca_certs"] == "/etc/rcl-test/ca.pem"
    assert pool.connection_kwargs["socket_timeout"] == 3.0 and pool.connection_kwargs["decode_responses"] is True
    watched = _app("sentinel://127.0.0.1:26390/0", result_backend_transport_options={"master_name": "mymaster"})
    r, _ = backend_redis(watched)
    watched_pool: Any = r.connection_pool
    assert isinstance(watched_pool, SentinelConnectionPool)  # built, not connected: no Sentinel runs here
    assert getattr(watched_pool, "service_name") == "mymaster"
