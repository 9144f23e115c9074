"""``cancel_when_lost_in_soft_wait``: a broker connection lost during a cold shutdown's soft wait cancels at once.

The window. A cold shutdown with a soft wait (``worker_soft_shutdown_timeout``, Celery 5.5+; FM-7 asks for it
with ``REMAP_SIGTERM=SIGQUIT``) runs inside the worker's signal handler: ``celery.apps.worker.on_cold_shutdown``
calls ``WorkController.wait_for_soft_shutdown``, a plain ``time.sleep`` in the main process (Celery 5.5.3, 5.6.3
and 5.7.0 alike). While it sleeps the event loop does not run, so ``Consumer.start`` cannot see a lost
connection and ``worker_cancel_long_running_tasks_on_connection_loss`` (FM-9) does not fire. If the broker
connection drops then, RabbitMQ requeues the running message at once, another worker starts it, and the
first body runs on until the wait is over: one message's work in two processes at once.

``cancel_when_lost_in_soft_wait(app)`` watches the consumer's broker socket while the soft wait sleeps. A
thread, started as the wait begins and joined before it returns, polls that socket for the peer's close
(``POLLRDHUP``, ``POLLHUP`` or ``POLLERR``: what the event loop itself would read as the connection's end).
When it comes, the thread does what Celery's ``Consumer.on_connection_error_after_connected`` does outside the
wait when ``worker_cancel_long_running_tasks_on_connection_loss`` is set: ``Request.cancel`` of every running
late-ack request not yet acknowledged. The soft wait then sleeps out its time as before and the cold
shutdown goes on as Celery's (its own cancel finds those requests gone).

Knobs: none; it does nothing for an app whose ``worker_cancel_long_running_tasks_on_connection_loss`` is off.
Call it once per app, at import (it wraps ``WorkController.wait_for_soft_shutdown`` for that app's workers only).

Costs and limits:

- one thread per soft wait, asleep in ``poll`` (woken every ``SLICE_SECONDS`` to see whether the wait is
  over); nothing at all outside a soft wait;
- AMQP through py-amqp only (the consumer's connection has a socket there); another transport (Redis) gets
  Celery's plain wait;
- where ``select.POLLRDHUP`` is missing (not Linux) the thread peeks at the socket every ``SLICE_SECONDS``
  instead, and sees the close only once the broker's unread frames are gone;
- it narrows the window to the time a cancel takes, as Celery's own handling does outside the wait: the
  broker may still hand the message to another worker before the cancel lands (1 of 8 of the lab's runs at
  a load of 13 on two cores: the copy began 17 ms before the cancelled body ended). ``shared/run_fence.py``
  closes that race. A peer that vanishes without a close (a cable pulled) is seen by neither, until TCP or
  the heartbeat gives up.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import weakref
from collections.abc import Callable
from typing import Any, cast

from celery import Celery
from celery.worker import state
from celery.worker.worker import WorkController

logger = logging.getLogger(__name__)

SLICE_SECONDS = 0.01
"""How often the watching thread looks whether the soft wait is over (the close itself wakes it at once): the wait
returns at most this late, since the cold shutdown's cancel comes after it and must land within a deploy's grace
(at 0.05 s the lab's cancels came 0.36 s after the SIGTERM instead of 0.30 s, with a grace of 0.5 s)."""

_apps: weakref.WeakSet[Celery] = weakref.WeakSet()
_celery_wait: list[Callable[[WorkController], None]] = []  # the method wrapped, once wrapped


def cancel_when_lost_in_soft_wait(app: Celery) -> None:
    """Have ``app``'s workers cancel their running late-ack requests as soon as the broker connection is lost
    during a cold shutdown's soft wait (see the module's docstring)."""
    _apps.add(app)
    if _celery_wait:
        return
    original = cast(Callable[[WorkController], None], WorkController.wait_for_soft_shutdown)
    _celery_wait.append(original)

    def wait_for_soft_shutdown(self: WorkController) -> None:
        worker_app = cast(Celery, cast(Any, self).app)
        if worker_app not in _apps or not worker_app.conf.worker_cancel_long_running_tasks_on_connection_loss:
            return original(self)
        watch = _Watch(self)
        try:
            original(self)
        finally:
            watch.stop()

    setattr(WorkController, "wait_for_soft_shutdown", wait_for_soft_shutdown)


def broker_socket(consumer: object) -> socket.socket | None:
    """The consumer's broker socket, when it is connected over py-amqp; None otherwise (never connects)."""
    conn = cast(Any, getattr(consumer, "connection", None))
    try:
        if conn is None or not conn.connected:  # kombu's ``connection`` property would connect: asked only if so
            return None
        sock = getattr(conn.connection, "sock", None)
    except Exception:  # a transport with no such thing, or one half torn down
        return None
    return sock if isinstance(sock, socket.socket) else None


def closed(sock: socket.socket, timeout: float) -> bool:
    """Whether the peer closed ``sock`` (or it failed), waiting up to ``timeout`` seconds for it to happen."""
    rdhup = getattr(select, "POLLRDHUP", None)
    if rdhup is not None:
        poller = select.poll()
        poller.register(sock.fileno(), rdhup | select.POLLHUP | select.POLLERR)
        return bool(poller.poll(timeout * 1000))
    threading.Event().wait(timeout)
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except (OSError, ValueError):  # reset, or a socket that cannot peek (TLS): gone, or not to be watched
        return True


class _Watch:
    """The thread that watches one soft wait's broker socket and cancels when it closes."""

    def __init__(self, worker: WorkController) -> None:
        self.worker = worker
        self.over = threading.Event()
        self.thread: threading.Thread | None = None
        consumer = getattr(worker, "consumer", None)
        sock = broker_socket(consumer)
        if sock is not None:
            self.thread = threading.Thread(target=self._run, args=(consumer, sock), name="soft-wait-watch", daemon=True)
            self.thread.start()

    def _run(self, consumer: object, sock: socket.socket) -> None:
        try:
            while not self.over.is_set():
                if closed(sock, SLICE_SECONDS):
                    break
            else:
                return
        except (OSError, ValueError):  # the socket went away under us: the same end
            pass
        if self.over.is_set():
            return
        pool = getattr(consumer, "pool", None)
        for req in tuple(state.active_requests):
            if req.task.acks_late and not req.acknowledged:
                try:
                    req.cancel(pool)  # first: the broker may be handing the message to another worker already
                except Exception:  # one cancel failing must not stop the others
                    logger.warning("could not cancel %r after the connection loss", req, exc_info=True)
                else:
                    logger.warning("broker connection lost during the soft shutdown wait: cancelled %r", req)

    def stop(self) -> None:
        self.over.set()
        if self.thread is not None:
            self.thread.join()
