"""``--clean`` deletes every queue an FM declares, the delay queues of every retry policy included (issue 38, item 5)."""

from __future__ import annotations

from typing import Any

import pytest
from kombu import Connection

from lab import harness
from lab.settings import NAMESPACE, broker_url

pytestmark = pytest.mark.usefixtures("real_services")


def _exists(conn: Connection, name: str) -> bool:
    try:
        channel: Any = conn.channel()
        channel.queue_declare(queue=name, passive=True)
        channel.close()
        return True
    except Exception:
        return False


def test_clean_deletes_the_notify_retry_delay_queues() -> None:
    """Before: only parse_document's policy was read; FM-8's and fm9's notify retries (buckets 3.1, 4.3, 5.3,
    where their waits went) stayed after --clean."""
    fm = harness.load("fm9")
    names = set(fm.queue_names)
    notify = [f"{NAMESPACE}.fm9.tasks.retry.{b}" for b in ("3.1", "4.3", "5.3")]
    assert set(notify) <= names, sorted(n for n in names if ".retry." in n)
    queues, _ = harness.namespace_names()
    assert set(notify) <= set(queues)
    with Connection(broker_url()) as conn:
        channel: Any = conn.channel()
        for name in notify:
            channel.queue_declare(queue=name, durable=True, auto_delete=False, arguments={
                "x-dead-letter-exchange": f"{NAMESPACE}.fm9.tasks", "x-dead-letter-routing-key": f"{NAMESPACE}.fm9.tasks"})
        assert [_exists(conn, n) for n in notify] == [True] * 3
        harness.clean(say=lambda _: None)
        assert [_exists(conn, n) for n in notify] == [False] * 3
