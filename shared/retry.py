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
same task id again (its chord membership with it) and raises ``Retry``;
``@enveloped`` lets ``Retry`` through. On exhaustion it raises
``RetriesExhausted`` (``envelope_reason = "retries_exhausted"``) from the last
error, so ``@enveloped`` records why the document failed.

Limits: a countdown is held, unacknowledged, in the memory of the worker that
received it until it is due (with quorum queues and a direct exchange, as in
this lab, Celery 5.7's ``Celery.send_task`` logs that native delayed delivery
does not apply and publishes the countdown as an ETA; the lab's fm5 test finds
that line in the worker's log). Retries count in ``request.retries``, a header
of the message, which a redelivery of the same message does not change.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar

from celery import Task

from shared.envelope import describe

P = ParamSpec("P")
R = TypeVar("R")


class TransientError(Exception):
    """A downstream hiccup (an HTTP 503, say) that a later attempt may not meet."""


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


def transient_retryable(
    policy: RetryPolicy,
) -> Callable[[Callable[Concatenate[Task[Any, Any], P], R]], Callable[Concatenate[Task[Any, Any], P], R]]:
    """Retry ``policy.retry_on`` errors with backoff (Celery's ``task_retry`` signal sees each retry)."""

    def decorate(fn: Callable[Concatenate[Task[Any, Any], P], R]) -> Callable[Concatenate[Task[Any, Any], P], R]:
        @functools.wraps(fn)
        def wrapper(task: Task[Any, Any], *args: P.args, **kwargs: P.kwargs) -> R:
            try:
                return fn(task, *args, **kwargs)
            except policy.retry_on as exc:
                done = int(task.request.retries or 0)
                if done >= policy.max_retries:
                    raise RetriesExhausted(f"gave up after {done + 1} attempts: {describe(exc)}") from exc
                raise task.retry(exc=exc, countdown=policy.delay(done), max_retries=policy.max_retries) from exc

        setattr(wrapper, "retry_policy", policy)
        return wrapper

    return decorate
