"""A chain ``head | step`` whose head's message comes back after its SUCCESS is stored (``tests/test_chain_dedup.py``).

Run by that test's worker (``celery -A tests.chain_app worker``): RabbitMQ is the broker (a classic queue
``<namespace>-cd``), the shared Redis the result backend (keys under ``<namespace>:cd:``), acks late, reject on
worker lost and ``worker_deduplicate_successful_tasks``, as fm7..fm9 set them.

The gate (pool processes only): a head whose ``hold:<key>`` key is set stops right after Celery stored its SUCCESS
(inside ``celery.app.trace``, which sent the chain's next step before that store), writes its pid to
``held:<key>`` and waits to be killed (or for ``release:<key>``, which a failed test sets). Each delivery of a head
is counted in ``received:<key>`` (the worker's main process); each run of its body in ``runs:<key>``; ``step``
appends what the head handed it to ``steps:<key>``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, cast

import redis
from celery import Celery
from celery.backends.redis import RedisBackend
from celery.signals import task_received, worker_process_init

from lab.settings import NAMESPACE, backend_url, broker_url
from lab.waiting import wait_until

PREFIX = f"{NAMESPACE}:cd:"
QUEUE = f"{NAMESPACE}-cd"
WAIT_SECONDS = 60.0  # the most a held head waits for its kill

app = Celery("rcl-chain", broker=broker_url(), backend=backend_url(), set_as_current=False)
app.conf.update(
    task_serializer="json", result_serializer="json", accept_content=["json"], result_accept_content=["json"],
    task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1, worker_concurrency=1,
    worker_deduplicate_successful_tasks=True,
    task_default_queue=QUEUE, task_default_exchange=QUEUE, task_default_routing_key=QUEUE,
    result_backend_transport_options={"global_keyprefix": PREFIX},
    broker_connection_retry_on_startup=True, worker_enable_remote_control=False, worker_send_task_events=False)


def shared() -> Any:
    return cast(Any, redis.Redis).from_url(backend_url(), decode_responses=True)


@task_received.connect
def _received(request: Any = None, **_: Any) -> None:
    """In the worker's main process: count each delivery of a head (``received:<key>``)."""
    if request is not None and request.name == "cd.head":
        shared().incr(f"{PREFIX}received:{cast(list[Any], request.args)[0]}")


@worker_process_init.connect
def _gate(**_: Any) -> None:
    """In each pool process: hold a head that ``hold:`` names right after its SUCCESS is stored."""
    stored = cast(Callable[..., Any], RedisBackend.store_result)

    def store_result(self: RedisBackend, task_id: str, result: Any, state: str, *args: Any, **kwargs: Any) -> Any:
        done = stored(self, task_id, result, state, *args, **kwargs)
        request: Any = kwargs.get("request") or (args[1] if len(args) > 1 else None)
        if state == "SUCCESS" and request is not None and getattr(request, "task", None) == "cd.head":
            key = str(cast(list[Any], request.args)[0])
            if shared().exists(f"{PREFIX}hold:{key}"):
                shared().set(f"{PREFIX}held:{key}", os.getpid(), ex=300)
                # the test kills this process here; a test that failed before says so with release:<key>
                wait_until(lambda: bool(shared().exists(f"{PREFIX}release:{key}")), WAIT_SECONDS)
        return done

    setattr(RedisBackend, "store_result", store_result)


@app.task(name="cd.head")
def head(key: str) -> dict[str, str]:
    shared().incr(f"{PREFIX}runs:{key}")
    return {"head": key}


@app.task(name="cd.step")
def step(previous: dict[str, str], key: str) -> int:
    return int(shared().rpush(f"{PREFIX}steps:{key}", json.dumps(previous)))
