"""FM-8's guard on a Redis broker (``shared.backend.reject_unstored(app, requeue=True)``), with real parts:
the shared Redis as broker, a ``redis-server`` the test owns as result backend, stopped while a task is in
its body and started again.

- no guard: the store fails, Celery acks the message (``acks_on_failure``): after the backend's return
  the task never runs again and its result is nowhere (FM-8's symptom on a Redis broker);
- the guard as fm8 sets it (reject without requeue): the message is dropped as well, for a Redis broker has
  no dead-letter exchange to keep it (what the audit reports for such an app);
- the guard with requeue: the message goes back to its queue, runs again at once and again while the backend
  is gone (each a whole run), and the first run after the return stores the result; nothing is left."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, cast

import pytest
import redis

from lab import owned
from lab.waiting import wait_until
from tests.app_worker import AppWorker
from tests.requeue_app import PREFIX, QUEUE, producer, shared

pytestmark = pytest.mark.usefixtures("real_services")


def _meta(server: owned.OwnedRedis, task_id: str) -> str | None:
    client: Any = redis.Redis(host="127.0.0.1", port=server.port, decode_responses=True, socket_timeout=2)
    with client:
        return cast(str | None, client.get(f"{PREFIX}celery-task-meta-{task_id}"))


def _broker_empty() -> bool:
    r = shared()
    return not r.llen(f"{PREFIX}broker:{QUEUE}") and not r.hlen(f"{PREFIX}broker:unacked")


@pytest.mark.parametrize("guard", ["none", "drop", "requeue"])
def test_a_result_the_backend_cannot_store_on_a_redis_broker(guard: str, tmp_path: Path) -> None:
    if owned.available() is None:
        pytest.skip("redis-server is not installed")
    key = uuid.uuid4().hex[:10]
    r = shared()
    server = owned.OwnedRedis(f"t-requeue-{guard}-{os.getpid()}", persist=False)
    server.start()
    worker = AppWorker("tests.requeue_app", {"RQ_BACKEND": server.url, "RQ_GUARD": guard}, tmp_path / "worker.log",
                       ready=lambda w: "ready." in w.text())  # a Redis broker says no consumer count
    try:
        task_id = producer.send_task("rq.work", args=[key]).id
        runs = lambda: int(r.get(f"{PREFIX}runs:{key}") or 0)  # noqa: E731
        assert wait_until(lambda: runs() == 1, 30), worker.text()
        server.stop()  # the run is in its body: its store will fail
        r.set(f"{PREFIX}go:{key}", "1", ex=300)
        if guard == "requeue":
            assert wait_until(lambda: runs() >= 3, 30), worker.text()  # back at once, again while the backend is gone
            server.start()
            assert wait_until(lambda: _meta(server, task_id) is not None, 30), worker.text()
            meta = json_of(_meta(server, task_id))
            assert meta["status"] == "SUCCESS" and meta["result"] == runs(), (meta, runs())  # the last run stored it
            assert wait_until(_broker_empty, 10), worker.text()
        else:
            failed = "Exception raised outside body" if guard == "none" else ""  # (drop: silent)
            assert wait_until(lambda: _broker_empty() and failed in worker.text(), 30), worker.text()  # acked (none)
            # or rejected without requeue (drop): gone from the queue and from the unacked hash
            server.start()
            assert not wait_until(lambda: runs() > 1, 3), worker.text()  # nothing runs it again
            assert _meta(server, task_id) is None  # and its outcome is stored nowhere
    finally:
        worker.stop()
        server.remove()
        r.delete(f"{PREFIX}runs:{key}", f"{PREFIX}go:{key}")


def json_of(raw: str | None) -> dict[str, Any]:
    import json

    assert raw is not None
    return cast(dict[str, Any], json.loads(raw))


def test_a_retry_whose_retry_state_the_backend_cannot_store_runs_once_more_not_twice(tmp_path: Path) -> None:
    """``Task.retry`` has published the retry before the trace stores RETRY: a RETRY the backend cannot store is
    announced and its message acked, never rejected (a reject, with requeue here or into a dead-letter exchange on
    RabbitMQ, would run the task a second time beside its retry). The task runs twice in all: the run that retried
    and its retry, which stores the outcome once the backend is back."""
    if owned.available() is None:
        pytest.skip("redis-server is not installed")
    key = uuid.uuid4().hex[:10]
    r = shared()
    server = owned.OwnedRedis(f"t-retry-{os.getpid()}", persist=False)
    server.start()
    worker = AppWorker("tests.requeue_app", {"RQ_BACKEND": server.url, "RQ_GUARD": "requeue"}, tmp_path / "worker.log",
                       ready=lambda w: "ready." in w.text())
    try:
        task_id = producer.send_task("rq.retry_once", args=[key]).id
        runs = lambda: int(r.get(f"{PREFIX}runs:{key}") or 0)  # noqa: E731
        assert wait_until(lambda: runs() == 1, 30), worker.text()
        server.stop()  # the first run is in its body: it retries with the backend gone
        r.set(f"{PREFIX}go:{key}", "1", ex=300)
        assert wait_until(lambda: runs() == 2, 30), worker.text()  # the retry runs
        server.start()
        r.set(f"{PREFIX}go2:{key}", "1", ex=300)
        assert wait_until(lambda: _meta(server, task_id) is not None and _broker_empty(), 30), worker.text()
        assert (json_of(_meta(server, task_id))["result"], runs()) == (2, 2), worker.text()  # no third run
        assert "RETRY not stored" in worker.text()
    finally:
        worker.stop()
        server.remove()
        r.delete(f"{PREFIX}runs:{key}", f"{PREFIX}go:{key}", f"{PREFIX}go2:{key}")
