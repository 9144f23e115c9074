"""A Celery app whose worker ``test_within_consumer_timeout_never_raises_a_limit`` starts (real RabbitMQ and Redis).

``LIM_TASK_TIME_LIMIT`` (``task_time_limit``, empty for none) and ``LIM_CONSUMER_TIMEOUT`` (the seconds
given to ``within_consumer_timeout``, empty to leave it out) configure the worker's side. ``publisher`` is
the sender's side, an app that never calls ``within_consumer_timeout`` and whose ``lim.sleep`` says
``time_limit=30``, as a process with older code or no cap would: every message it sends carries 30 s.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery, Task

from lab.settings import NAMESPACE, backend_url, broker_url
from shared.consumer_timeout import within_consumer_timeout
from shared.envelope import Wire, enveloped
from shared.timeouts import BackstopRequest

QUEUE = f"{NAMESPACE}.lim.tasks"
PREFIX = f"{NAMESPACE}:lim:"


def _app(name: str) -> Celery:
    app = Celery(name, broker=broker_url(), backend=backend_url(), set_as_current=False)
    app.conf.update(
        task_serializer="json", result_serializer="json", accept_content=["json"], result_accept_content=["json"],
        task_acks_late=True, worker_prefetch_multiplier=1, worker_concurrency=1,
        task_default_queue=QUEUE, task_default_exchange=QUEUE, task_default_routing_key=QUEUE,
        result_backend_transport_options={"global_keyprefix": PREFIX}, result_extended=False,
        broker_connection_retry_on_startup=True, worker_enable_remote_control=False, worker_send_task_events=False)
    return app


def _limit(name: str) -> float | None:
    value = os.environ.get(name, "")
    return float(value) if value else None


app = _app("rcl-limits")
app.conf.task_time_limit = _limit("LIM_TASK_TIME_LIMIT")


@app.task(name="lim.sleep", shared=False)
def sleep(seconds: float) -> float:
    """Runs ``seconds`` of Python (a kill ends it wherever it is)."""
    time.sleep(seconds)
    return seconds


@app.task(bind=True, name="lim.backstop", shared=False, Request=BackstopRequest)
@enveloped
def backstop(task: Task[Any, Any], seconds: float) -> float:
    time.sleep(seconds)
    return seconds


_cap = _limit("LIM_CONSUMER_TIMEOUT")
if _cap is not None:
    within_consumer_timeout(app, _cap)

publisher = _app("rcl-limits-publisher")


@publisher.task(name="lim.sleep", shared=False, time_limit=30)
def sleep_30(seconds: float) -> float:  # never runs here: the worker's app runs lim.sleep
    return seconds


@publisher.task(name="lim.backstop", shared=False, time_limit=30)
def backstop_30(seconds: float) -> Wire:  # never runs here
    raise NotImplementedError
