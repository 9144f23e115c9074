"""The app's result-backend Redis, for primitives that keep state beside the results.

``backend_redis(app)`` gives one client per process and backend URL (prefork children get
their own after the fork) and the backend's ``global_keyprefix`` (Celery's option for the
Redis backend's keys), so that a claim or a counter lives, and is cleaned up, beside the
app's results. The client is built by the app's own backend (``RedisBackend._create_client``
with its ``connparams``, Celery 5.5.3 to 5.7.0; read there), so it connects as Celery's does:
``redis_socket_timeout``, ``redis_socket_connect_timeout``, ``redis_socket_keepalive``,
``redis_backend_health_check_interval``, ``redis_backend_use_ssl`` (or ``rediss://``) and a
``sentinel://`` URL with its ``master_name``; only ``decode_responses=True`` is added.
tests/test_backend_client.py runs the timeouts against a server that accepts and never
answers, and checks the SSL and Sentinel clients' connection classes (built, not connected).

What it does not take from Celery: the backend's ``retry_policy`` (``RedisBackend.ensure``
retries only the backend's own writes). A command of a primitive tries once and raises
``redis.ConnectionError`` or ``redis.TimeoutError`` on a backend that is gone or hangs, after at
most the socket timeouts above; Celery's default ``redis_socket_timeout`` is 120 s and its
``redis_socket_connect_timeout`` unset (the OS's connect timeout), so an app that wants the
primitives to give up sooner sets both (the lab's: 5 s each, ``lab.app``).
"""

from __future__ import annotations

import logging
import os
from typing import Any, cast

import redis
from celery import Celery, current_task
from celery.backends.redis import RedisBackend
from celery.exceptions import Reject
from celery.signals import task_postrun, task_prerun
from celery.utils.dispatch import Signal
from kombu.utils.imports import symbol_by_name

_clients: dict[tuple[int, str], redis.Redis] = {}
log = logging.getLogger(__name__)


def backend_redis(app: Celery) -> tuple[redis.Redis, str]:
    """``(client, key prefix)`` of ``app``'s Redis result backend, connected with the backend's settings."""
    url = str(app.conf.result_backend)
    key = (os.getpid(), url)
    if key not in _clients:
        backend: Any = app.backend
        if not isinstance(backend, RedisBackend):
            raise TypeError(f"the primitives need a Redis result backend, this app's is {type(backend).__name__}")
        made: Any = backend
        params = {**cast(dict[str, Any], made.connparams), "decode_responses": True}
        _clients[key] = cast(redis.Redis, made._create_client(**params))  # Celery's pool: its timeouts, SSL, Sentinel
    options = cast(dict[str, Any], app.conf.result_backend_transport_options or {})
    return _clients[key], str(options.get("global_keyprefix") or "")


# ---- FM-8: a task whose own result cannot be stored is rejected, not acked ----------------------

GONE: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError)
"""The errors of a Redis backend that does not answer."""


class ResultNotStored(Reject):
    """The running task's own outcome could not be stored (the backend is gone): Celery rejects its message
    without requeue, stores nothing and acks nothing; a dead-letter exchange keeps it (``reject_unstored``)."""


result_unstored = Signal(name="result_unstored", providing_args=["task_id", "state", "error"])
"""Sent (``sender`` the app) in the process whose store failed, before its message is rejected."""


def _own(task_id: str) -> bool:
    """Is ``task_id`` the task this process is running (not a result the drain or the main process writes)?"""
    request = getattr(current_task, "request", None) if current_task else None
    return bool(task_id) and getattr(request, "id", None) == task_id


class RejectUnstored:
    """A mixin over Celery's Redis backend (``reject_unstored`` applies it): see ``reject_unstored``."""

    app: Celery
    requeue_unstored: bool = False
    """Reject with requeue (a broker with no dead-letter exchange: ``reject_unstored(app, requeue=True)``)."""

    def _not_stored(self, task_id: str, state: str, exc: BaseException) -> ResultNotStored:
        error = f"{type(exc).__name__}: {exc}"
        result_unstored.send(sender=self.app, task_id=task_id, state=state, error=error)
        return ResultNotStored(f"{state} of {task_id} not stored, the result backend is gone ({error})",
                               requeue=self.requeue_unstored)

    def mark_as_done(self, task_id: str, result: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return cast(Any, super()).mark_as_done(task_id, result, *args, **kwargs)
        except GONE as exc:
            if not _own(task_id):
                raise
            if _successor.pop(task_id, False):  # a chain's head: its next step, sent already, carries the result
                error = f"{type(exc).__name__}: {exc}"
                result_unstored.send(sender=self.app, task_id=task_id, state="SUCCESS", error=error)
                log.warning("%s: SUCCESS not stored (%s); kept acked: its chain's next step carries its result", task_id,
                            error)
                return None
            raise self._not_stored(task_id, "SUCCESS", exc) from exc

    def mark_as_retry(self, task_id: str, exc: Exception, *args: Any, **kwargs: Any) -> Any:
        try:
            return cast(Any, super()).mark_as_retry(task_id, exc, *args, **kwargs)
        except GONE as gone:
            if not _own(task_id):
                raise
            # Task.retry published the retry before the trace stores RETRY (celery.app.task.Task.retry, then
            # celery.app.trace's handle_retry, 5.5 to 5.7): rejected, this message would run again beside it.
            error = f"{type(gone).__name__}: {gone}"
            result_unstored.send(sender=self.app, task_id=task_id, state="RETRY", error=error)
            log.warning("%s: RETRY not stored (%s); kept acked: its retry, published already, stores its outcome",
                        task_id, error)
            return None

    def mark_as_failure(self, task_id: str, exc: Exception, *args: Any, **kwargs: Any) -> Any:
        if isinstance(exc, ResultNotStored):  # the failure is the store itself: no outcome of the task to record
            return None  # (5.7's Request.on_failure records a Reject without requeue as FAILURE before it rejects)
        try:
            return cast(Any, super()).mark_as_failure(task_id, exc, *args, **kwargs)
        except GONE as gone:
            if not _own(task_id):
                raise
            raise self._not_stored(task_id, "FAILURE", gone) from gone


_successor: dict[str, bool] = {}
"""Per task id running in this process: did its message carry a next step (a chain's rest, callbacks)?"""


def _note_successor(sender: Any = None, task_id: str = "", task: Any = None, **_: Any) -> None:
    request = getattr(task or sender, "request", None)
    _successor[task_id] = bool(getattr(request, "chain", None) or getattr(request, "callbacks", None))


def _forget_successor(sender: Any = None, task_id: str = "", **_: Any) -> None:
    _successor.pop(task_id, None)


def reject_unstored(app: Celery, requeue: bool = False) -> None:
    """FM-8: a task whose own result (SUCCESS or FAILURE) its Redis backend cannot store raises
    ``ResultNotStored``, a ``Reject`` without requeue, instead of the backend's ``ConnectionError``.

    Why: ``celery.app.trace`` stores the result after the body; an error there is a failure outside the
    body, which ``Request.on_failure`` acks (``task_acks_on_failure_or_timeout``, True by default; 5.7:
    ``task_acks_on_failure``), and which Celery also tries to store as the task's FAILURE, with the backend's
    retries: in the pool (``celery.app.trace``'s ``handle_failure``), and in the main process only when the
    pool did not report the failure as handled (``Request.on_failure`` calls ``mark_as_failure`` when
    ``return_ok`` is False, 5.5.3 to 5.7.0, read); so a backend back within those retries records the
    member as failed and its chord fails. Which of the two stores a failed result store reaches on each
    version is not proven by a run here (issue 38 reports, from runs not repeated here: the main process
    stores only when the pool's own store failed too; on 5.5.3 the path is an internal error in the pool;
    ``task_failure`` is sent on 5.5 and 5.7, not 5.6). A ``Reject`` is what
    ``Request.on_failure`` rejects before anything else, on 5.5 to 5.7, storing nothing: the message goes
    to the queue's dead-letter exchange (FM-3), and ``drain(send_back_rejected=True)`` publishes it again
    once the backend answers. Applied to the app's ``redis://`` backend class (``loader.override_backends``,
    read by ``celery.app.backends.by_name``), whatever class that is; only a task's own result, in the
    process running it: the drain and the main process get the backend's own errors. One exception: a task
    whose message carried a next step (a chain's head) has sent it before its store (``celery.app.trace``,
    5.5 to 5.7), with the result in it; rejected, it would run again and send that step twice, so its
    lost store is only announced (``result_unstored``) and logged, and its message acked as Celery would. So
    is a lost RETRY: ``Task.retry`` has published the retry before the trace stores RETRY (5.5 to 5.7), and
    the retry stores the outcome; rejected, the task would run a second time beside it
    (tests/test_backend_requeue.py: three runs instead of two).

    ``requeue=True``, for a broker with no dead-letter exchange (Redis): the reject sends the message back
    to its queue instead (kombu's ``redis.QoS.reject`` restores it at the queue's head), where a reject
    without requeue would delete it. The price: no drain waits for the backend, so the message runs again
    at once, and again each time its store fails while the backend is gone, every run a whole run (the
    task must be idempotent). tests/test_backend_requeue.py runs both, and the guard's absence, on a
    Redis broker."""
    loader = cast(Any, app.loader)
    overrides = cast(dict[str, str], loader.override_backends or {})
    current = overrides.get("redis") or "celery.backends.redis:RedisBackend"
    base = cast(type, symbol_by_name(current))
    if issubclass(base, RejectUnstored):  # applied before: guard the class it guarded
        base = base.__mro__[2]
    name = f"RejectUnstored{'Requeue' * requeue}_{base.__module__.replace('.', '_')}_{base.__name__}"
    if name not in globals():
        globals()[name] = type(name, (RejectUnstored, base), {"requeue_unstored": requeue})
    loader.override_backends = {**overrides, "redis": f"{__name__}:{name}"}
    task_prerun.connect(_note_successor, weak=False, dispatch_uid="shared.backend.reject_unstored.prerun")
    task_postrun.connect(_forget_successor, weak=False, dispatch_uid="shared.backend.reject_unstored.postrun")
