"""Counts of one queue as the broker gives them, each on a channel of its own (a 404 closes it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from kombu import Connection


def on_queue(conn: Connection, op: Callable[[Any], object]) -> int:
    """``op(channel)`` on a channel of its own, as a count; 0 when the queue is missing.

    An operation on a missing queue (404) closes its channel, so each gets its own.
    """
    channel = cast(Any, conn.channel())
    try:
        return int(cast(Any, op(channel)) or 0)
    except Exception:
        return 0
    finally:
        try:
            channel.close()
        except Exception:
            pass


def queue_consumers(conn: Connection, name: str) -> int:
    """The broker's consumer count of queue ``name`` (0 when there is no such queue)."""
    return on_queue(conn, lambda ch: ch.queue_declare(queue=name, passive=True).consumer_count)


def queue_depth(conn: Connection, name: str) -> int:
    """Messages ready in queue ``name``, as the broker counts them (0 when there is no such queue)."""
    return on_queue(conn, lambda ch: ch.queue_declare(queue=name, passive=True).message_count)
