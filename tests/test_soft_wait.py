"""``shared.soft_wait``: the soft shutdown wait cancels at once when the broker socket closes, and otherwise waits as
Celery does. No broker: a socket pair stands in for the consumer's connection, a stand-in request for a running body."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pytest
from celery import Celery
from celery.worker import state
from celery.worker.worker import WorkController

from shared.soft_wait import broker_socket, cancel_when_lost_in_soft_wait, closed

SOFT_WAIT = 0.6
"""The stand-in worker's ``worker_soft_shutdown_timeout``."""


@dataclass(eq=False)
class Running:
    """A running late-ack request, as the soft wait's cancel sees it."""

    acks_late: bool = True
    acknowledged: bool = False
    cancelled_at: list[float] = field(default_factory=lambda: [])

    @property
    def task(self) -> SimpleNamespace:
        return SimpleNamespace(acks_late=self.acks_late)

    def cancel(self, pool: object) -> None:
        self.cancelled_at.append(time.monotonic())


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, broker = socket.socketpair()
    yield ours, broker
    ours.close()
    broker.close()


def _worker(app: Celery, sock: socket.socket) -> WorkController:
    amqp = SimpleNamespace(sock=sock)
    connection = SimpleNamespace(connected=True, connection=amqp)
    return cast(WorkController, SimpleNamespace(app=app, consumer=SimpleNamespace(connection=connection, pool=object())))


def _app(watch: bool, cancel_on_loss: bool = True) -> Celery:
    app = Celery("soft-wait-test", set_as_current=False)
    app.conf.worker_soft_shutdown_timeout = SOFT_WAIT
    app.conf.worker_cancel_long_running_tasks_on_connection_loss = cancel_on_loss
    if watch:
        cancel_when_lost_in_soft_wait(app)
    return app


def _soft_wait(worker: WorkController, running: list[Running], monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(state, "active_requests", set(running))
    started = time.monotonic()
    cast(Any, WorkController).wait_for_soft_shutdown(worker)
    return started


def test_closed_sees_the_peer_close_even_behind_unread_frames(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, broker = pair
    assert not closed(ours, 0.01)
    broker.sendall(b"a frame nobody reads during the wait")
    assert not closed(ours, 0.01)
    broker.shutdown(socket.SHUT_RDWR)
    assert closed(ours, 1.0)


def test_broker_socket_never_connects_and_needs_a_socket() -> None:
    assert broker_socket(SimpleNamespace(connection=None)) is None
    assert broker_socket(SimpleNamespace(connection=SimpleNamespace(connected=False))) is None
    assert broker_socket(SimpleNamespace(connection=SimpleNamespace(connected=True, connection=object()))) is None


def test_a_connection_lost_in_the_soft_wait_cancels_the_running_late_ack_bodies_at_once(
        pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch) -> None:
    ours, broker = pair
    body, acked, early = Running(), Running(acknowledged=True), Running(acks_late=False)
    broker.close()  # the broker's side is gone before the wait begins: the watch sees it at its first look
    started = _soft_wait(_worker(_app(watch=True), ours), [body, acked, early], monkeypatch)
    waited = time.monotonic() - started
    assert len(body.cancelled_at) == 1 and body.cancelled_at[0] - started < SOFT_WAIT / 2, (body.cancelled_at, started)
    assert acked.cancelled_at == [] and early.cancelled_at == []  # as Celery's own cancel on a lost connection
    assert waited >= SOFT_WAIT  # the wait itself is Celery's, unchanged


def test_a_live_connection_waits_as_celery_does_and_cancels_nothing(
        pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch) -> None:
    ours, _ = pair
    body = Running()
    started = _soft_wait(_worker(_app(watch=True), ours), [body], monkeypatch)
    assert time.monotonic() - started >= SOFT_WAIT and body.cancelled_at == []


@pytest.mark.parametrize("watch, cancel_on_loss", [(False, True), (True, False)])
def test_an_app_not_watched_or_not_cancelling_on_loss_keeps_celery_s_plain_wait(
        pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch, watch: bool, cancel_on_loss: bool) -> None:
    ours, broker = pair
    body = Running()
    broker.close()
    _soft_wait(_worker(_app(watch, cancel_on_loss), ours), [body], monkeypatch)
    assert body.cancelled_at == []
