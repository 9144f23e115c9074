"""A Celery app whose result backend hangs, for ``tests/test_backstop_loop.py`` (real RabbitMQ).

``BS_BACKEND`` is the result backend's URL: a port that accepts and never answers. ``bs.slow``
(``BackstopRequest``, ``time_limit`` 1 s) outlives its limit, so the worker's main process settles it with
the backend; ``bs.quick`` stores nothing and writes when it started to the shared Redis."""

from __future__ import annotations

import os
import time
from typing import Any, cast

import redis
from celery import Celery

from lab.settings import NAMESPACE, backend_url, broker_url
from shared.timeouts import BackstopRequest

QUEUE = f"{NAMESPACE}.bs.tasks"
PREFIX = f"{NAMESPACE}:bs:"


def _app(backend: str | None) -> Celery:
    app = Celery("rcl-backstop", broker=broker_url(), backend=backend, set_as_current=False)
    app.conf.update(
        task_serializer="json", result_serializer="json", accept_content=["json"], result_accept_content=["json"],
        task_acks_late=True, worker_prefetch_multiplier=1, worker_concurrency=2,
        task_default_queue=QUEUE, task_default_exchange=QUEUE, task_default_routing_key=QUEUE,
        redis_socket_timeout=3.0, redis_socket_connect_timeout=3.0,
        result_backend_transport_options={"retry_policy": {"max_retries": 5, "interval_start": 1, "interval_step": 0,
                                                           "interval_max": 1}},
        broker_connection_retry_on_startup=True, worker_enable_remote_control=False, worker_send_task_events=False)
    return app


app = _app(os.environ.get("BS_BACKEND"))
producer = _app(None)


def shared() -> Any:
    return cast(Any, redis.Redis).from_url(backend_url(), decode_responses=True, socket_timeout=5)


@app.task(name="bs.slow", shared=False, time_limit=1, Request=BackstopRequest)
def slow(key: str) -> None:
    shared().rpush(f"{PREFIX}slow:{key}", time.time())
    time.sleep(30)


@app.task(name="bs.quick", shared=False, ignore_result=True)
def quick(key: str) -> None:
    shared().set(f"{PREFIX}quick:{key}", time.time())
