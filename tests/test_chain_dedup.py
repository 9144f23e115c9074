"""A chain head whose message comes back after its SUCCESS is stored, under ``worker_deduplicate_successful_tasks``
(celery#9835), with real parts: RabbitMQ, the shared Redis as result backend, a prefork worker with acks late,
reject on worker lost and the deduplication on, as fm7..fm9 set them (``tests/chain_app.py``).

- stored outside the trace (a store that did not send the chain's next step, so no child is recorded with the
  result), then redelivered: Celery 5.5.3 acks it without running it and sends nothing (``build_tracer``'s
  deduplication returns at once): the chain's next step never runs, and nothing is left to run it. 5.6.3 and
  5.7.0 (PR #10159) send the stored result on to the next step when no child is recorded: it runs once;
- stored by the trace itself, its process killed right after the store (a deploy's SIGKILL, a cut): the trace
  sent the next step before it stored (``celery.app.trace``, 5.5 to 5.7), and recorded it as the result's child;
  the redelivery, deduplicated, sends nothing more on any version: the step runs once. Every store of a chain
  head's SUCCESS in fm7..fm9 is of this kind (the trace's, or ``BackstopRequest``'s, which sends the next step
  first too; the DLQ drain stores the chain's member, never its head), so on 5.5.3 they lose no chain this way.

The runner acts on what it observes (the message in its hands, the pid the held head wrote), never on a timer.
``make matrix`` runs this file on each version.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import celery
import pytest
from kombu import Connection

from lab.queues import queue_consumers, queue_depth
from lab.settings import broker_url
from lab.versions import CELERY
from lab.waiting import wait_until
from tests.app_worker import AppWorker
from tests.chain_app import PREFIX, QUEUE, app, head, shared, step

SENDS_THE_STEP = (int(celery.VERSION[0]), int(celery.VERSION[1]), int(celery.VERSION[2])) >= (5, 6, 3)
"""PR #10159 (celery#9835) is in 5.6.3: the deduplication sends the stored result on when no child is recorded."""
NOT_RUN_WINDOW = 8.0
"""How long the step must stay unrun after the redelivery was received, to call it never run: the deduplication
acks it in the pool process at once, and a step sent then is taken by the idle worker within a second (seen here)."""
pytestmark = pytest.mark.usefixtures("real_services")


def _worker(log: Path) -> AppWorker:
    def consuming(_: AppWorker) -> bool:
        with Connection(broker_url()) as conn:
            return queue_consumers(conn, QUEUE) > 0

    return AppWorker("tests.chain_app", {}, log, ready=consuming)


def _clean() -> None:
    r = shared()
    keys = list(r.scan_iter(match=f"{PREFIX}*", count=500))
    if keys:
        r.delete(*keys)
    with Connection(broker_url()) as conn:
        channel = cast(Any, conn.channel())
        channel.queue_delete(QUEUE)
        channel.exchange_delete(QUEUE)
        channel.close()


@pytest.fixture
def clean_chain_app() -> Any:
    _clean()
    yield
    _clean()


def _steps(key: str) -> list[dict[str, str]]:
    return [cast(dict[str, str], json.loads(raw)) for raw in shared().lrange(f"{PREFIX}steps:{key}", 0, -1)]


def _received(key: str) -> int:
    return int(shared().get(f"{PREFIX}received:{key}") or 0)


def _queue_left() -> int:
    with Connection(broker_url()) as conn:
        return queue_depth(conn, QUEUE)


@pytest.mark.claim("C33", "deduplication drops the chain of a head stored SUCCESS outside the trace (celery#9835)")
def test_a_redelivered_chain_head_stored_outside_the_trace(tmp_path: Path, clean_chain_app: None,
                                                           limit: Callable[[str], None]) -> None:
    r = shared()
    key = uuid.uuid4().hex[:10]
    result = (head.s(key) | step.s(key)).apply_async()  # no worker yet: the head's message waits in the queue
    head_id = cast(Any, result).parent.id
    with Connection(broker_url()) as conn:  # take it, as a worker would, and die holding it
        channel = cast(Any, conn.channel())
        assert wait_until(lambda: queue_depth(conn, QUEUE) == 1, 10)
        message = channel.basic_get(QUEUE, no_ack=False)
        assert message is not None and message.headers["id"] == head_id
        cast(Any, app.backend).store_result(head_id, {"head": key}, "SUCCESS")  # stored, its next step never sent
    # the connection closed with the message unacked: RabbitMQ requeues it, marked redelivered
    assert cast(Any, app.backend).get_task_meta(head_id, cache=False)["children"] in (None, [])
    worker = _worker(tmp_path / "worker.log")
    try:
        assert wait_until(lambda: _received(key) == 1, 30), worker.text()
        if not SENDS_THE_STEP:  # 5.5.3: acked without running, nothing sent
            assert not wait_until(lambda: bool(_steps(key)), NOT_RUN_WINDOW), _steps(key)
            worker.stop()  # an unacked message would go back to the queue now
            assert _queue_left() == 0  # acked: nothing is left that could ever run the step
        else:  # the stored result goes on to the next step (PR #10159)
            limit("from 5.6.3 celery.app.trace.build_tracer's deduplication sends the stored result on to the next "
                  "step when no child is recorded with it (PR #10159): the step runs once")
            assert wait_until(lambda: bool(_steps(key)), 30), worker.text()
            assert not wait_until(lambda: len(_steps(key)) > 1, 1.0)
            assert _steps(key) == [{"head": key}]
        assert int(r.get(f"{PREFIX}runs:{key}") or 0) == 0  # the head's body never ran: its result is the stored one
    finally:
        worker.stop()


@pytest.mark.claim("C34", "a chain head killed after the trace stored its SUCCESS: its next step runs once "
                          "(sent before the store), on 5.5.3 too")
def test_a_chain_head_killed_after_its_store_loses_no_step(tmp_path: Path, clean_chain_app: None) -> None:
    r = shared()
    key = uuid.uuid4().hex[:10]
    r.set(f"{PREFIX}hold:{key}", "1", ex=300)
    worker = _worker(tmp_path / "worker.log")
    try:
        result = (head.s(key) | step.s(key)).apply_async()
        head_id = cast(Any, result).parent.id
        assert wait_until(lambda: bool(r.get(f"{PREFIX}held:{key}")), 30), worker.text()
        meta = cast(Any, app.backend).get_task_meta(head_id, cache=False)
        assert meta["status"] == "SUCCESS" and len(meta["children"] or []) == 1  # held after its store; the step sent
        r.delete(f"{PREFIX}hold:{key}")
        os.kill(int(r.get(f"{PREFIX}held:{key}")), signal.SIGKILL)
        if CELERY < (5, 7):  # requeued (reject on worker lost), then deduplicated: acked without running
            assert wait_until(lambda: _received(key) == 2, 30), worker.text()
        # 5.7.0 acks it once the main process sees the process gone ("succeeded before the worker was lost")
        assert wait_until(lambda: bool(_steps(key)), 30), worker.text()
        assert not wait_until(lambda: len(_steps(key)) > 1, 2.0)  # not sent again by the redelivery (5.6.3+)
        assert _steps(key) == [{"head": key}]
        assert int(r.get(f"{PREFIX}runs:{key}") or 0) == 1
        worker.stop()
        assert _queue_left() == 0  # the head's message acked: it runs no more
    finally:
        r.set(f"{PREFIX}release:{key}", "1", ex=300)  # a head still held (the test failed first) ends now
        worker.stop()
