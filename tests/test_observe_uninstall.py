"""``lab.observe.uninstall``: the observer off, the production shape the benchmark measures
(``bench/bench_chord.py``). Celery's own signals are sent as a worker sends them; the observer's
record is its Redis attempt counter and event stream (real Redis, keys under the test namespace)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any, cast

import pytest
from celery.signals import task_postrun, task_prerun

from lab import observe
from lab.observe import doc_id, run_prefix

pytestmark = pytest.mark.usefixtures("real_services")


@pytest.fixture
def observer_back() -> Iterator[None]:
    """Whatever a test does, the process's observer is connected again afterwards (other tests need it)."""
    yield
    observe.install()


class _Task:
    """A task as the signals' sender (hashable, as Celery's signal cache needs)."""

    name = "fm7_rolling_deploys.parse_document"


def _one_attempt(run: str, task_id: str) -> None:
    task = _Task()
    args = [doc_id(run, "doc2")]
    task_prerun.send(sender=task, task_id=task_id, task=task, args=args, kwargs={})
    task_postrun.send(sender=task, task_id=task_id, task=task, args=args, kwargs={}, retval={"doc": args[0], "words": 4},
                      state="SUCCESS")


def _connected(sig: Any, handler: object) -> bool:
    """Is ``handler`` among the signal's receivers (connected with ``weak=False``: the function itself)?"""
    return any(receiver is handler for _, receiver in cast(list[tuple[object, object]], sig.receivers))


def _recorded(run: str) -> tuple[int, int]:
    r: Any = observe.client()
    attempts = int(cast(str, r.get(f"{run_prefix(run)}attempts:doc2") or 0))
    return attempts, int(r.xlen(f"{run_prefix(run)}events"))


def test_uninstall_disconnects_every_signal_and_install_connects_them_again(observer_back: None) -> None:
    run = f"test-uninstall-{uuid.uuid4().hex[:8]}"
    observe.install()
    _one_attempt(run, "t1")
    assert _recorded(run) == (1, 2)  # attempt_start and attempt_end, one attempt counted

    observe.uninstall()
    _one_attempt(run, "t2")
    assert _recorded(run) == (1, 2)  # nothing more: no INCR, no event
    assert not any(_connected(sig, handler) for sig, handler in observe._connections())  # pyright: ignore[reportPrivateUsage]

    observe.install()
    _one_attempt(run, "t3")
    assert _recorded(run) == (2, 4)
    assert all(_connected(sig, handler) for sig, handler in observe._connections())  # pyright: ignore[reportPrivateUsage]
    observe.client().delete(f"{run_prefix(run)}attempts:doc2", f"{run_prefix(run)}events")


def test_uninstall_twice_is_harmless(observer_back: None) -> None:
    observe.uninstall()
    observe.uninstall()
    run = f"test-uninstall-{uuid.uuid4().hex[:8]}"
    _one_attempt(run, "t1")
    assert _recorded(run) == (0, 0)


def test_uninstall_gives_back_the_methods_it_wrapped_and_install_wraps_them_once(observer_back: None) -> None:
    from celery.worker.request import Request
    from celery.worker.worker import WorkController

    def methods() -> list[object]:
        return [Request.on_accepted, Request.cancel, WorkController.wait_for_soft_shutdown]

    observe.uninstall()
    own = methods()  # Celery's, or another wrapper's the observer had beneath it (shared.soft_wait, in fm9)
    observe.install()
    wrapped = methods()  # the observer's on top, or a wrapper that went on top of it and stayed (shared.soft_wait)
    assert all(getattr(m, "__module__", "") == "lab.observe" or m is o for m, o in zip(wrapped, own))
    observe.install()  # once: the second call wraps nothing again
    assert methods() == wrapped and len(observe._celery_methods) == 3  # pyright: ignore[reportPrivateUsage]
    observe.uninstall()
    assert methods() == own


def test_uninstall_leaves_a_wrapper_that_went_on_top_of_the_observers(observer_back: None) -> None:
    """``shared.soft_wait`` wraps the soft wait too, maybe after the observer did: the observer's uninstall must not
    take it away (a test of the soft wait that ran after one of the observer's once found its watch gone)."""
    from celery.worker.worker import WorkController

    observe.install()
    beneath = WorkController.wait_for_soft_shutdown

    def on_top(self: WorkController) -> None:
        beneath(self)

    setattr(WorkController, "wait_for_soft_shutdown", on_top)
    try:
        observe.uninstall()
        assert WorkController.wait_for_soft_shutdown is on_top
        observe.install()
        assert WorkController.wait_for_soft_shutdown is on_top  # the observer's, beneath it, reports again
    finally:
        setattr(WorkController, "wait_for_soft_shutdown", beneath)


class _Pool:
    def __init__(self) -> None:
        self.terminated: list[tuple[int, int]] = []

    def terminate_job(self, pid: int, signum: int) -> None:
        self.terminated.append((pid, signum))


class _Running:
    """What ``Request.cancel`` reads of a running request, and its own announcement (the pool's part is ``_Pool``)."""

    name = "fm7_rolling_deploys.parse_document"
    id = "t-running"
    time_start = 1.0
    worker_pid = 4242
    _apply_result = None

    def __init__(self, run: str) -> None:
        self.args = [doc_id(run, "doc2")]
        self.announced = 0

    def _announce_cancelled(self, emit_retry: bool = True) -> None:
        self.announced += 1


def test_a_report_that_fails_inside_celerys_cancel_leaves_the_cancel_to_happen(observer_back: None,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The observations' Redis gone at a cold shutdown: the observer logs it, and the body is cancelled all the same."""
    import redis
    from celery.worker.request import Request

    def gone(*_: object, **__: object) -> None:
        raise redis.ConnectionError("the observations' Redis is gone")

    observe.install()
    run, pool = f"test-cancel-{uuid.uuid4().hex[:8]}", _Pool()
    request = _Running(run)
    monkeypatch.setattr(observe.RunRecorder, "event", gone)
    Request.cancel(cast(Any, request), cast(Any, pool))
    assert (pool.terminated, request.announced) == ([(4242, request_signal())], 1)


def request_signal() -> int:
    """The signal Celery's cancel sends a running body's process: billiard's TERM_SIGNAME (SIGTERM here)."""
    from billiard.common import TERM_SIGNAL
    return int(TERM_SIGNAL)
