"""lab/owned_shared.py: the runs of one process that need the same owned RabbitMQ node at once share one start,
and the last to give it back removes it. A real node (its process, its folder, its AMQP answers)."""

from __future__ import annotations

import threading
from typing import Any, cast

import pytest

from lab import owned, owned_shared
from lab.owned_shared import share_rabbit, unshare
from lab.waiting import wait_until
from lab.workers import pid_alive

pytestmark = pytest.mark.skipif(owned.rabbit_available() is None, reason="needs rabbitmq-server")


def test_three_runs_at_once_share_one_node_and_the_last_removes_it() -> None:
    got: list[owned.OwnedRabbit] = []
    errors: list[BaseException] = []

    def use(name: str) -> None:
        try:
            got.append(share_rabbit(name, 2400, 500))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=use, args=(f"t-share-{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert len(got) == 3 and got[0] is got[1] is got[2]  # one node for the three
    node = got[0]
    started = [p for p in owned.OWNED_DIR.glob("rabbit-t-share-*") if p.is_dir()]
    assert started == [node.folder]  # one start: one folder
    assert node.proc is not None
    pid = node.proc.pid
    try:
        assert node.answers()
        unshare(node)
        unshare(node)
        assert pid_alive(pid) and node.answers()  # the third run still uses it
        assert share_rabbit("t-share-late", 2400, 500) is node  # a run that comes now joins it
        unshare(node)
    finally:
        unshare(node)  # the last
    assert not pid_alive(pid)
    assert not node.folder.exists()
    other = share_rabbit("t-share-next", 2400, 500)  # after the last, a new node
    try:
        assert other is not node and other.answers()
    finally:
        unshare(other)
    assert not other.folder.exists()


def test_runs_waiting_for_a_start_that_fails_get_its_error_and_leave_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()

    def fails(self: owned.OwnedRabbit) -> None:
        gate.wait(30)  # the others come while the first start runs
        raise owned.StartFailed(f"the owned RabbitMQ node {self.node} did not come up (a test's)")

    monkeypatch.setattr(owned.OwnedRabbit, "start", fails)
    errors: list[BaseException] = []

    def use(name: str) -> None:
        try:
            share_rabbit(name, 1000, 100)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=use, args=(f"t-fail-{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    shares = cast(dict[Any, Any], getattr(owned_shared, "_shares"))
    assert wait_until(lambda: sum(share.users for share in shares.values()) == 3, 10)  # all three wait on it
    gate.set()
    for thread in threads:
        thread.join(30)
    assert len(errors) == 3 and all(isinstance(e, owned.StartFailed) for e in errors)
    assert len({str(e) for e in errors}) == 1  # the one start's error
    assert list(owned.OWNED_DIR.glob("rabbit-t-fail-*")) == []
    monkeypatch.undo()
    node = share_rabbit("t-fail-after", 1000, 100)  # the failed share is gone: the next call starts afresh
    try:
        assert node.answers()
    finally:
        unshare(node)
