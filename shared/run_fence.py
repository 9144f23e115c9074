"""``fence_redeliveries``: a redelivered message starts only once the run it interrupted has ended.

Why. RabbitMQ requeues a message as soon as the connection that held it unacked is gone, and hands it to the
next free consumer at once; the worker that lost the connection cancels the running body only when it notices
(FM-9's ``worker_cancel_long_running_tasks_on_connection_loss``; during FM-7's soft wait,
``shared/soft_wait.py``). Which comes first is a race of milliseconds that no worker-side cancel can win for
sure: on a loaded machine the copy sometimes began before the first body had stopped.

How. Each run of the app's tasks holds a lease in the result backend's Redis, ``<prefix>running:<task id>``
(the host and pid of its pool process), from Celery's ``task_prerun`` to its ``task_postrun`` (a cancelled or
failed body too: the observer's and any other ``task_postrun`` receiver connected before this call runs first).
In the worker's main process, a message the broker marks redelivered (``delivery_info['redelivered']``) of
such a task goes to Celery's strategy (``Task.Strategy``, which receives it, ``task_received`` included) only
once no live run holds its lease: until then it waits on the worker's timer, every ``POLL_SECONDS``, its
message unacked and its prefetch slot taken, without blocking the event loop. A lease whose holder is a dead
process of the same host is stale and ignored; any other expires after the task's hard time limit (its own,
else ``task_time_limit``, else ``DEFAULT_LIMIT_SECONDS``) plus ``MARGIN_SECONDS``, the longest a run can hold it.

Call it once, after every task is defined (a later task is not fenced), with a Redis result backend.

Costs and limits:

- two Redis writes per run (a ``SET`` at its start, a compare-and-delete at its end), one ``GET`` per
  redelivered message and per ``POLL_SECONDS`` while it waits; all with ``SOCKET_SECONDS`` timeouts;
- a redelivery whose first run died on another host without its ``task_postrun`` (SIGKILL, a lost machine)
  waits until the lease expires: up to the task's time limit plus ``MARGIN_SECONDS``;
- the backend's Redis unreachable: no fence (fail open, as without it), said once per process in the log;
- only messages the broker marks redelivered are fenced: a retry or a second publish of the same id is not.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable
from typing import Any, cast

import redis
from celery import Celery
from celery.backends.redis import RedisBackend
from celery.signals import task_postrun, task_prerun
from kombu.utils.imports import symbol_by_name

logger = logging.getLogger(__name__)

POLL_SECONDS = 0.02
"""How often a fenced redelivery looks whether the lease is gone."""
MARGIN_SECONDS = 5.0
"""A lease outlives its task's hard time limit by this (the store and the ack after the body)."""
DEFAULT_LIMIT_SECONDS = 1800.0
"""The lease of a task with no hard time limit at all: RabbitMQ's default consumer timeout (FM-9)."""
SOCKET_SECONDS = 0.5
"""Every Redis call of the fence gives up after this (and the fence with it: fail open)."""

_RELEASE = """if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0"""
_clients: dict[tuple[int, str], tuple[redis.Redis, str]] = {}
_fenced: dict[str, tuple[Celery, float]] = {}  # task name -> (its app, its lease in seconds)
_said: set[int] = set()
_connected: list[bool] = []


def fence_redeliveries(app: Celery) -> None:
    """Fence every task ``app`` has now (Celery's own ``celery.*`` excepted): see the module's docstring."""
    for name, task in list(app.tasks.items()):
        if name.startswith("celery.") or name in _fenced:
            continue
        limit = cast(float | None, task.time_limit) or cast(float | None, app.conf.task_time_limit) or DEFAULT_LIMIT_SECONDS
        _fenced[name] = (app, float(limit) + MARGIN_SECONDS)
        setattr(task, "Strategy", _fenced_strategy(cast(str | Callable[..., Any], getattr(task, "Strategy"))))
    if not _connected:
        task_prerun.connect(_take, weak=False)
        task_postrun.connect(_release, weak=False)
        _connected.append(True)


def _redis(app: Celery) -> tuple[redis.Redis, str]:
    """``(client, key prefix)`` of ``app``'s Redis result backend, with the fence's own short timeouts."""
    key = (os.getpid(), str(app.conf.result_backend))
    if key not in _clients:
        if not isinstance(app.backend, RedisBackend):
            raise TypeError(f"the fence needs a Redis result backend, this app's is {type(app.backend).__name__}")
        backend: Any = app.backend
        params = {**cast(dict[str, Any], backend.connparams), "decode_responses": True,
                  "socket_timeout": SOCKET_SECONDS, "socket_connect_timeout": SOCKET_SECONDS}
        options = cast(dict[str, Any], app.conf.result_backend_transport_options or {})
        _clients[key] = (cast(redis.Redis, backend._create_client(**params)), str(options.get("global_keyprefix") or ""))
    return _clients[key]


def lease_key(prefix: str, task_id: str) -> str:
    return f"{prefix}running:{task_id}"


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _gone(exc: Exception) -> None:
    if os.getpid() not in _said:
        _said.add(os.getpid())
        logger.warning("run fence: the result backend's Redis did not answer (%r); no fence meanwhile", exc)


def _take(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
    found = _fenced.get(str(getattr(sender, "name", "")))
    if found is None or not task_id:
        return
    try:
        r, prefix = _redis(found[0])
        r.set(lease_key(prefix, task_id), _holder(), px=int(found[1] * 1000))
    except (redis.RedisError, OSError) as exc:
        _gone(exc)


def _release(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
    found = _fenced.get(str(getattr(sender, "name", "")))
    if found is None or not task_id:
        return
    try:
        r, prefix = _redis(found[0])
        r.eval(_RELEASE, 1, lease_key(prefix, task_id), _holder())
    except (redis.RedisError, OSError) as exc:
        _gone(exc)


def held(app: Celery, task_id: str) -> bool:
    """Whether a live run holds ``task_id``'s lease (a dead process of this host holds none)."""
    try:
        r, prefix = _redis(app)
        holder = cast(str | None, r.get(lease_key(prefix, task_id)))
    except (redis.RedisError, OSError) as exc:
        _gone(exc)
        return False
    if holder is None:
        return False
    host, _, pid = holder.rpartition(":")
    if host == socket.gethostname() and pid.isdigit():
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False  # died without its task_postrun (SIGKILL): its lease is stale
        except PermissionError:
            return True
    return True


def _task_id(message: Any) -> str:
    headers = cast(dict[str, Any], getattr(message, "headers", None) or {})
    found = headers.get("id")
    if found is None:  # protocol 1: the id is in the body
        found = cast(dict[str, Any], message.payload).get("id")
    return str(found or "")


def _fenced_strategy(inner: str | Callable[..., Any]) -> Callable[..., Any]:
    """Celery's strategy ``inner`` (``Task.Strategy``), each redelivered message of it held back while its lease is."""

    def strategy(task: Any, app: Any, consumer: Any, **kwargs: Any) -> Callable[..., Any]:
        make = cast(Callable[..., Any], symbol_by_name(inner) if isinstance(inner, str) else inner)
        handler = cast(Callable[..., Any], make(task, app, consumer, **kwargs))
        timer = consumer.timer
        lease = _fenced.get(str(task.name), (app, DEFAULT_LIMIT_SECONDS))[1]

        def on_message(message: Any, *args: Any, **kw: Any) -> Any:
            info = cast(dict[str, Any], getattr(message, "delivery_info", None) or {})
            task_id = _task_id(message) if info.get("redelivered") else ""
            if not task_id or not held(app, task_id):
                return handler(message, *args, **kw)
            until = time.monotonic() + lease
            logger.info("run fence: %s redelivered while its first run still holds it; waiting for its end", task_id)

            def again() -> None:
                if held(app, task_id) and time.monotonic() < until:
                    timer.call_after(POLL_SECONDS, again)
                else:
                    handler(message, *args, **kw)

            timer.call_after(POLL_SECONDS, again)
            return None

        return on_message

    return strategy
