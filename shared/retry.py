"""``@transient_retryable``: bounded retries with exponential backoff and jitter (the FM-5 fix).

Knobs (``RetryPolicy``):

- ``retry_on``: the exception types worth another attempt (default ``TransientError``,
  defined here: raise it, or a subclass, for an error a later attempt may not meet);
  everything else goes straight through to ``@enveloped`` as a terminal failure;
- ``max_retries``: retries after the first attempt, so at most ``max_retries + 1`` attempts;
- ``base``, ``factor``, ``cap``: the delay before retry ``k`` (0-based) is
  ``min(cap, base * factor**k)`` times the jitter;
- ``jitter``: a random factor in ``[1, 2)``, proportional to the delay, which
  de-synchronises a fleet that failed together better than a fixed extra second.
  With ``factor >= 2`` the bands ``[d_k, 2 d_k)`` do not overlap below the cap:
  every delay is longer than the one before, whatever the jitter drew. Once the
  cap is reached the bands are all ``[cap, 2 cap)``, so capped delays no longer
  grow and a later one can be shorter.

The wrapper keeps its policy as ``retry_policy`` (what a check or a dashboard reads).

How: the retry is Celery's own ``Task.retry(countdown=...)``, which publishes the
same task id again (its chord membership with it) and raises ``Retry`` (Celery 5.5 to 5.7);
``@enveloped`` lets ``Retry`` through. On exhaustion it raises
``RetriesExhausted`` (``envelope_reason = "retries_exhausted"``) from the last
error, so ``@enveloped`` records why the document failed.

``TransientError(..., retry_after=s)``: an error that says when to come back (an
HTTP 429 or 503 with ``Retry-After``); the retry waits at least that long.

Where a waiting retry waits (``wait_in``). In Celery 5.5 to 5.7 (read in 5.5.3,
5.6.3 and 5.7.0, and the lab's S5 hard reproduces it on each), ``Task.retry(countdown=...)``
publishes an ETA message that the worker receiving it holds, unacknowledged, in
memory until it is due (``celery.worker.strategy.default``: ``qos.increment_eventually``,
then ``timer.call_at``). The prefetch count is meant to grow by one for each,
but on a quorum queue it cannot: ``celery.worker.consumer.tasks.Tasks.qos_global``
turns global QoS off when ``worker_detect_quorum_queues`` finds one, and RabbitMQ
applies a per-consumer ``basic.qos`` only to consumers created after it (RabbitMQ's
documentation of ``basic.qos``; the lab does not run that part alone). So
waiting retries fill the static prefetch (concurrency x ``worker_prefetch_multiplier``)
and new work queues behind them until they come due (measured on fm5's queue:
a probe waited as long as the burst's retries did, see ``--prove``). Celery's
native delayed delivery (there since 5.5) would hold them in the broker, but only for a topic or
fanout exchange (``Celery.send_task`` falls back to an ETA for a direct one) and
through broker-wide ``celery_delayed_*`` exchanges and queues that no prefix
confines (``celery.worker.consumer.delayed_delivery``), which the lab's namespace
rule forbids.

``wait_in=QUEUE`` keeps waiting retries in the broker instead: ``DelayQueues``
are classic queues ``QUEUE.retry.<b>.<s>``, bound to the task queue's direct
exchange under their own names, never consumed, each dead-lettering back to
``QUEUE``. The retry is published to one of them with ``countdown=0`` (falsy,
so no ETA header and no delayed-delivery branch; not ``None``, which
``Task.retry`` would replace by ``default_retry_delay``) and the AMQP
``expiration`` set to the delay (``celery.app.amqp.AMQP.send_task_message`` passes
it through to ``kombu.Producer.publish``; Celery 5.5 to 5.7, and G5 runs it on each). When it expires RabbitMQ moves it to
``QUEUE``, as a new message (a fresh ``x-delivery-limit`` count), with its
headers: ``request.retries`` and the chord membership are intact. RabbitMQ
expires a message only at the head of its queue (RabbitMQ's documentation of
per-message TTL; not proven by a run here), so a retry waits behind an
older one with a longer TTL; the queues are therefore split by delay, bucket
``b`` holding ``[base * 2**b, base * 2**(b+1))`` in ``slices`` equal parts, and a
retry runs at most a slice's width late, never early. A delay past the last
bucket (the policy's longest) waits in the last one and may hold up the retries
behind it. Every delay queue is declared when a retry is published to it.
Celery logs such a retry as "Retry in 0s"; the ``Retry`` raised carries the real
delay, which the ``task_retry`` signal sees. The task queue must be bound to a
direct exchange of its own name with its name as routing key (Celery's default
layout, and the lab's).

Retries count in ``request.retries``, a header of the message, which a
redelivery of the same message does not change.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

from celery import Task
from celery.exceptions import Retry
from kombu import Exchange, Queue

from shared.envelope import describe

P = ParamSpec("P")
R = TypeVar("R")


class TransientError(Exception):
    """A downstream hiccup (an HTTP 503, say) that a later attempt may not meet."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after  # seconds the downstream asked us to wait, if it said


class RetriesExhausted(Exception):
    envelope_reason = "retries_exhausted"


@dataclass(frozen=True)
class RetryPolicy:
    max_retries: int = 3
    base: float = 0.1
    factor: float = 2.0
    cap: float = 60.0
    retry_on: tuple[type[Exception], ...] = (TransientError,)

    def planned(self, k: int) -> float:
        """The delay before retry ``k`` (0-based), before jitter."""
        return min(self.cap, self.base * self.factor**k)

    def bounds(self, k: int) -> tuple[float, float]:
        """Where the jittered delay before retry ``k`` falls: ``[low, high)``."""
        d = self.planned(k)
        return d, 2 * d

    def delay(self, k: int, rng: random.Random | None = None) -> float:
        low, high = self.bounds(k)
        return (rng or random).uniform(low, high)


@dataclass(frozen=True)
class DelayQueues:
    """The broker-side waiting rooms of one task queue's retries (see the module docstring)."""

    queue: str  # the task queue; its direct exchange and routing key have the same name
    policy: RetryPolicy
    slices: int = 4
    stem: str = "retry"  # the delay queues are QUEUE.<stem>.<b>.<s>

    @property
    def buckets(self) -> int:
        """Doubling buckets from ``base`` up to the policy's longest jittered delay."""
        longest = 2 * self.policy.planned(max(self.policy.max_retries - 1, 0))
        return max(1, math.ceil(math.log2(longest / self.policy.base)))

    def queue_for(self, delay: float) -> Queue:
        ratio = max(delay / self.policy.base, 1.0)
        b = min(int(math.log2(ratio)), self.buckets - 1)
        low = self.policy.base * 2**b
        part = min(int((delay - low) / low * self.slices), self.slices - 1) if delay >= low else 0
        return self._queue(b, max(part, 0))

    def queues(self) -> list[Queue]:
        """Every delay queue (what a reset deletes beside the task queue)."""
        return [self._queue(b, p) for b in range(self.buckets) for p in range(self.slices)]

    def _queue(self, b: int, part: int) -> Queue:
        name = f"{self.queue}.{self.stem}.{b}.{part}"
        return Queue(name, Exchange(self.queue, type="direct"), routing_key=name,
                     queue_arguments={"x-dead-letter-exchange": self.queue, "x-dead-letter-routing-key": self.queue})

    def retry(self, task: Task[Any, Any], exc: Exception, delay: float) -> Retry:
        """Publish ``task``'s retry into the delay queue for ``delay``; return the ``Retry`` to raise."""
        waiting = self.queue_for(delay)
        through: dict[str, Any] = {"expiration": delay, "declare": [waiting]}  # to kombu's Producer.publish
        ret = task.retry(exc=exc, throw=False, countdown=0, max_retries=self.policy.max_retries,
                         exchange=self.queue, routing_key=waiting.routing_key, **through)
        setattr(ret, "when", delay)  # what the task_retry signal reports (Celery put the countdown, 0, there)
        return ret


def transient_retryable(
    policy: RetryPolicy, wait_in: str | None = None,
) -> Callable[[Callable[Concatenate[Task[Any, Any], P], R]], Callable[Concatenate[Task[Any, Any], P], R]]:
    """Retry ``policy.retry_on`` errors with backoff (Celery's ``task_retry`` signal sees each retry);
    with ``wait_in`` (the task queue's name), waiting retries wait in the broker (``DelayQueues``)."""
    delays = DelayQueues(wait_in, policy) if wait_in is not None else None

    def decorate(fn: Callable[Concatenate[Task[Any, Any], P], R]) -> Callable[Concatenate[Task[Any, Any], P], R]:
        @functools.wraps(fn)
        def wrapper(task: Task[Any, Any], *args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return fn(task, *args, **kwargs)
            except policy.retry_on as exc:
                done = int(task.request.retries or 0)
                if done >= policy.max_retries:
                    raise RetriesExhausted(f"gave up after {done + 1} attempts: {describe(exc)}") from exc
                delay = max(policy.delay(done), getattr(exc, "retry_after", None) or 0.0)
                if delays is not None:
                    raise delays.retry(task, exc, delay) from exc
                raise task.retry(exc=exc, countdown=delay, max_retries=policy.max_retries) from exc

        setattr(wrapper, "retry_policy", policy)
        setattr(wrapper, "delay_queues", delays)
        return wrapper

    return decorate
