"""``shared.run_fence``: a run's lease, and a redelivered message held back while a live run holds it. On the real
Redis, under the session's namespace (its key prefix); the worker's strategy with a stand-in consumer and timer."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any, cast

import pytest
from celery import Celery

from lab.settings import NAMESPACE, backend_url
from shared import run_fence


@pytest.fixture
def app(real_services: None) -> Iterator[Celery]:
    made = Celery("fence-test", set_as_current=False, backend=backend_url())
    made.conf.result_backend_transport_options = {"global_keyprefix": f"{NAMESPACE}:fence-test:"}

    @made.task(name="fence_test.parse", time_limit=3)
    def parse() -> None:  # pragma: no cover - never run, only fenced
        return None

    run_fence.fence_redeliveries(made)
    yield made
    r, prefix = run_fence._redis(made)  # pyright: ignore[reportPrivateUsage]
    for key in cast(list[str], list(cast(Any, r).scan_iter(f"{prefix}running:*"))):
        r.delete(key)


def _lease(app: Celery, task_id: str, holder: str) -> None:
    r, prefix = run_fence._redis(app)  # pyright: ignore[reportPrivateUsage]
    r.set(run_fence.lease_key(prefix, task_id), holder, px=5000)


def test_a_run_holds_its_lease_from_its_start_to_its_end(app: Celery) -> None:
    task = app.tasks["fence_test.parse"]
    run_fence._take(sender=task, task_id="t1")  # pyright: ignore[reportPrivateUsage]
    assert run_fence.held(app, "t1")
    run_fence._release(sender=task, task_id="t1")  # pyright: ignore[reportPrivateUsage]
    assert not run_fence.held(app, "t1")


def test_a_lease_of_a_dead_process_of_this_host_is_stale_one_of_another_host_is_not(app: Celery) -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    _lease(app, "t2", f"{socket.gethostname()}:{done.stdout.strip()}")
    assert not run_fence.held(app, "t2")
    _lease(app, "t3", "another-host:1")
    assert run_fence.held(app, "t3")


class Timer:
    def __init__(self) -> None:
        self.due: list[Callable[[], None]] = []

    def call_after(self, secs: float, fun: Callable[[], None]) -> None:
        self.due.append(fun)


def _handler(app: Celery, timer: Timer, got: list[str]) -> Callable[..., Any]:
    def inner(task: Any, app: Any, consumer: Any) -> Callable[..., Any]:
        def on_message(message: SimpleNamespace, *args: object) -> None:
            got.append(str(cast(dict[str, str], message.headers)["id"]))

        return on_message

    strategy = run_fence._fenced_strategy(inner)  # pyright: ignore[reportPrivateUsage]
    return strategy(app.tasks["fence_test.parse"], app, SimpleNamespace(timer=timer))


def _message(task_id: str, redelivered: bool) -> SimpleNamespace:
    return SimpleNamespace(headers={"id": task_id}, delivery_info={"redelivered": redelivered})


def test_a_redelivered_message_waits_on_the_timer_until_its_first_run_has_ended(app: Celery) -> None:
    timer, got = Timer(), list[str]()
    handle = _handler(app, timer, got)
    _lease(app, "t4", "another-host:1")
    handle(_message("t4", redelivered=True), None, None, None, None)
    assert got == [] and len(timer.due) == 1
    timer.due.pop()()  # still held: it looks again later
    assert got == [] and len(timer.due) == 1
    r, prefix = run_fence._redis(app)  # pyright: ignore[reportPrivateUsage]
    r.delete(run_fence.lease_key(prefix, "t4"))  # the first run ended
    timer.due.pop()()
    assert got == ["t4"] and timer.due == []


def test_a_first_delivery_or_a_free_redelivery_goes_on_at_once(app: Celery) -> None:
    timer, got = Timer(), list[str]()
    handle = _handler(app, timer, got)
    _lease(app, "t5", "another-host:1")
    handle(_message("t5", redelivered=False), None, None, None, None)  # a retry or a second publish: not fenced
    handle(_message("t6", redelivered=True), None, None, None, None)  # no lease
    assert got == ["t5", "t6"] and timer.due == []
