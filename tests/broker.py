"""What the tests ask RabbitMQ directly (one helper, shared by the test files that wait on a consumer)."""

from __future__ import annotations

from typing import Any, cast

from kombu import Connection

from lab.settings import broker_url


def consumers(queue: str) -> int:
    """How many consumers ``queue`` has now (0 when it does not exist)."""
    with Connection(broker_url()) as conn:
        try:
            return int(cast(Any, conn.default_channel).queue_declare(queue=queue, passive=True).consumer_count)
        except Exception:
            return 0
