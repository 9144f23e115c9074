"""``retry_in_place``: bounded retries with backoff and jitter that keep the message where it is.

``@transient_retryable`` (FM-5) retries by publishing the task again: the retry waits in the
broker and comes back behind whatever was queued meanwhile. Where the queue's order is the
contract (one queue per shard of lots, one consumer), that re-publish reorders it. Here the
call is retried inside the task, the message unacknowledged, so nothing behind it runs first.

Knobs: the same ``RetryPolicy`` (``shared.retry``): ``retry_on``, ``max_retries`` (so at most
``max_retries + 1`` calls), ``base``, ``factor``, ``cap`` and the jitter in ``[1, 2)`` times
the delay. ``on_retry(k, exc)`` hears each retry before its wait (a metric, a log line).

On exhaustion it raises ``RetriesExhausted`` from the last error: the caller decides where
the work goes (a dead-letter store), not the broker.

Limits: the wait is a ``time.sleep`` in the worker process. The queue behind waits the whole
backoff (head-of-line blocking: the price of order); the longest wait is the sum of the
policy's delays, at most ``2 x (sum of min(cap, base x factor^k))``, which must stay below the
task's time limit and the broker's consumer timeout (RabbitMQ's ``consumer_timeout``, 30 min
by default since RabbitMQ 3.8.17, closes the channel of a consumer that holds a message longer:
RabbitMQ's documentation, and FM-9's node shows it with a timeout of 2.4 s).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from shared.retry import RetriesExhausted, RetryPolicy

T = TypeVar("T")


def retry_in_place(call: Callable[[], T], policy: RetryPolicy,
                   on_retry: Callable[[int, Exception], object] = lambda _k, _e: None) -> T:
    """``call()``, retried in this process on ``policy.retry_on`` errors, with backoff and jitter."""
    for k in range(policy.max_retries + 1):
        try:
            return call()
        except policy.retry_on as exc:
            if k == policy.max_retries:
                raise RetriesExhausted(f"{policy.max_retries + 1} attempts: {type(exc).__name__}: {exc}") from exc
            on_retry(k, exc)
            time.sleep(policy.delay(k))  # the backoff itself: the message waits here, unacknowledged
    raise AssertionError("unreachable")  # the loop returns or raises
