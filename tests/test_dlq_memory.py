"""What the drain keeps in memory and in Redis stays bounded or outlives what it guards (issue 38, item 4)."""

from __future__ import annotations

import logging
import uuid
from typing import Any, cast

import pytest
from celery import Celery
from kombu import Queue
from kombu.message import Message

from lab.settings import NAMESPACE, backend_url
from shared import dlq
from shared.backend import backend_redis


def _letter(task_id: str, queue: str = "q") -> Message:
    headers: Any = {"id": task_id, "task": "t", "x-death": [
        {"reason": "delivery_limit", "queue": queue, "exchange": queue, "routing-keys": [queue], "count": 1}]}
    return Message(body="[[], {}, {}]", content_type="application/json", content_encoding="utf-8", headers=headers)


def test_the_kept_letters_remembered_are_bounded(local_app: Celery, monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Before: a set that grew by one id per letter kept, for the life of the process."""
    monkeypatch.setattr(dlq, "TOLD_LIMIT", 10, raising=False)
    monkeypatch.setattr(dlq, "_told", type(dlq._told)())  # pyright: ignore[reportPrivateUsage]
    with caplog.at_level(logging.WARNING, logger=dlq.__name__):
        for n in range(25):
            dlq._tell_kept(local_app, _letter(f"id{n}"), "why")  # pyright: ignore[reportPrivateUsage]
        dlq._tell_kept(local_app, _letter("id24"), "why")  # pyright: ignore[reportPrivateUsage]  (remembered)
        dlq._tell_kept(local_app, _letter("id0"), "why")  # pyright: ignore[reportPrivateUsage]  (forgotten)
    told = dlq._told  # pyright: ignore[reportPrivateUsage]
    assert len(told) == 10 and list(told)[-1] == "id0"
    assert [r.getMessage().split()[2] for r in caplog.records] == [f"id{n}" for n in range(25)] + ["id0"]


@pytest.mark.usefixtures("real_services")
def test_a_letter_the_drain_reads_keeps_its_counters() -> None:
    """Before: the counters expired a day after the last start, however long the letter waited in the DLQ,
    and a letter read after that counted 0 starts and went back as innocent. Now each read renews them."""
    app = Celery("t-dlq-ttl", backend=backend_url(), set_as_current=False)
    prefix = f"{NAMESPACE}:dlqttl:{uuid.uuid4().hex[:6]}:"
    app.conf.update(result_backend_transport_options={"global_keyprefix": prefix},
                    task_queues=[Queue("q", queue_arguments={"x-delivery-limit": 1})])
    dlq.count_starts(app)
    r, _ = backend_redis(app)
    client = cast(Any, r)
    tid = uuid.uuid4().hex
    try:
        client.set(f"{prefix}starts:{tid}", 2, ex=5)  # two crashes, their counter about to expire
        assert 0 < client.ttl(f"{prefix}starts:{tid}") <= 5
        assert dlq._innocent(app, _letter(tid)) is None  # pyright: ignore[reportPrivateUsage]  (2 crashes: bound 2)
        assert dlq.STARTS_TTL_SECONDS - 10 < client.ttl(f"{prefix}starts:{tid}") <= dlq.STARTS_TTL_SECONDS
        assert client.exists(f"{prefix}ends:{tid}") == 0  # a counter that was never made is not made by a read
    finally:
        client.delete(f"{prefix}starts:{tid}", f"{prefix}ends:{tid}")
