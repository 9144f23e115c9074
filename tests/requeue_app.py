"""A Celery app on a Redis broker whose result backend ``tests/test_backend_requeue.py`` stops.

Run by that test's worker (``celery -A tests.requeue_app worker``): the broker is the shared Redis (its keys
under ``<namespace>:rq:broker:``), the result backend the URL in ``RQ_BACKEND`` (a ``redis-server`` the test
owns), and ``RQ_GUARD`` says which FM-8 guard the app sets: ``requeue`` (``reject_unstored(app,
requeue=True)``), ``drop`` (``reject_unstored(app)``, made for a queue with a dead-letter exchange) or none.
``work`` counts its runs on the shared Redis and returns once the test says ``go``, so that the test stops
the backend while a run is in its body: that run's store fails."""

from __future__ import annotations

import os
from typing import Any, cast

import redis
from celery import Celery

from lab.settings import NAMESPACE, backend_url
from lab.waiting import wait_until
from shared.backend import reject_unstored

PREFIX = f"{NAMESPACE}:rq:"
QUEUE = f"{NAMESPACE}-rq"
BODY_SECONDS = 60  # the most a run waits for "go"


def _app(backend: str | None) -> Celery:
    app = Celery("rcl-requeue", broker=backend_url(), backend=backend, set_as_current=False)
    app.conf.update(
        task_serializer="json", result_serializer="json", accept_content=["json"], result_accept_content=["json"],
        task_acks_late=True, worker_prefetch_multiplier=1, worker_concurrency=1,
        task_default_queue=QUEUE, task_default_exchange=QUEUE, task_default_routing_key=QUEUE,
        broker_transport_options={"global_keyprefix": f"{PREFIX}broker:"},
        result_backend_transport_options={"global_keyprefix": PREFIX,
                                          "retry_policy": {"max_retries": 1, "interval_start": 0.1,
                                                           "interval_step": 0.1, "interval_max": 0.1}},
        redis_socket_connect_timeout=1.0, redis_socket_timeout=2.0, broker_connection_retry_on_startup=True,
        worker_enable_remote_control=False, worker_send_task_events=False)
    return app


app = _app(os.environ.get("RQ_BACKEND"))
if os.environ.get("RQ_GUARD") in ("requeue", "drop"):
    reject_unstored(app, requeue=os.environ["RQ_GUARD"] == "requeue")
producer = _app(None)
"""The test's side: sends ``work`` with no result backend (nothing to subscribe to on the owned server)."""


def shared() -> Any:
    return cast(Any, redis.Redis).from_url(backend_url(), decode_responses=True)


@app.task(name="rq.work")
def work(key: str) -> int:
    r = shared()
    runs = int(r.incr(f"{PREFIX}runs:{key}"))
    wait_until(lambda: bool(r.exists(f"{PREFIX}go:{key}")), BODY_SECONDS)
    return runs


@app.task(name="rq.retry_once", bind=True)
def retry_once(self: Any, key: str) -> int:
    """Its first run waits for ``go``, then retries (``Task.retry`` publishes the retry, then the trace stores
    RETRY: with the backend stopped, that store fails); a later run waits for ``go2`` and returns its run's number."""
    r = shared()
    runs = int(r.incr(f"{PREFIX}runs:{key}"))
    if runs == 1:
        wait_until(lambda: bool(r.exists(f"{PREFIX}go:{key}")), BODY_SECONDS)
        raise self.retry(countdown=0, max_retries=3)
    wait_until(lambda: bool(r.exists(f"{PREFIX}go2:{key}")), BODY_SECONDS)
    return runs
