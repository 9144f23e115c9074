"""The ``Result`` envelope and ``@enveloped`` (the FM-1 fix).

Why: with the Redis result backend a chord counts its header members in
``celery.backends.redis.RedisBackend.on_chord_part_return`` (Celery 5.5 to 5.7).
When every member has returned it decodes their states (``_unpack_chord_result``);
one member in a FAILURE state turns the whole chord into ``ChordError`` through
``celery.backends.base.Backend.chord_error_from_stack``, which calls the
body's errbacks and stores the body as FAILURE. The body itself never runs.

``@enveloped`` makes every exit of a task body (a return, or an exception raised
in the pool process) a SUCCESS state whose value is a ``Result`` with ``status``
``"FAILURE"`` and a ``reason`` a dashboard can split on. The chord then fires its
body, and the body sees every failure.

What it cannot reach: outcomes the worker's main process decides, outside the
body. Celery's ``celery.worker.request.Request`` stores FAILURE for a hard
``time_limit`` (``on_failure`` and ``on_timeout``, both), for a lost worker that
is not requeued (``on_failure``): each of those fails the chord (Celery 5.5 to
5.7). A task revoked or expired before it ran is REVOKED (``_announce_revoked``):
a chord member so decided fails the chord (``mark_as_revoked`` counts it); a
chain's head is no member, so nothing reaches the rest of its chain and the
chord stays PENDING for ever (the lab runs it: FM-1's hard variant), unless
``envelope_revoked(app)`` hands the chain a FAILURE envelope. For
``Reject(requeue=False)`` Celery 5.7 stores FAILURE too (``on_failure``), which
fails the chord; 5.5 and 5.6 only reject the message and store nothing, so the
member never reports and the chord never completes, silently. The lab keeps the
lost worker from happening (FM-2 requeues a lost task, FM-3 bounds it) and turns
the time limit into an envelope as well (FM-6's ``shared.timeouts.BackstopRequest``).
The lab runs the time limit, the lost worker and ``Reject(requeue=False)``
(S2, S6 hard, ``tests/test_celery_claims.py`` on each version: ``make matrix``),
and an expired chain head (S1 hard, G1); a revoke by id is read in
``celery/worker/request.py`` of 5.5.3, 5.6.3 and 5.7.0, not run (the lab's
workers run without remote control, which a revoke travels by); it takes the
same ``_announce_revoked`` path as an expiry.

What passes through untouched: Celery's control-flow exceptions (``Retry``,
``Ignore``, ``Reject``) and a ``BaseException`` that is not an ``Exception``
unless its class declares an ``envelope_reason`` (``SystemExit``,
``KeyboardInterrupt`` and ``GeneratorExit`` pass; ``shared.timeouts.HardTimeout``,
a ``BaseException`` so that a body's ``except Exception`` cannot swallow it, is
recorded). Catching ``Retry`` would turn a retry into a terminal failure.

Reasons: an exception (its class, or the instance: ``UpstreamFailed`` carries the
reason of the envelope it met, so a document whose fetch timed out fails
``hard_timeout``, not ``error``) may carry ``envelope_reason``; Celery's
``SoftTimeLimitExceeded`` is ``soft_timeout``; anything else is ``error``. Four
reasons are written outside ``@enveloped``: ``dead_lettered`` by the DLQ drain
(``shared.dlq``), ``time_limit`` by ``shared.timeouts.BackstopRequest``, and
``expired`` and ``revoked`` by ``envelope_revoked``.

Attempts: whoever counts attempts better than Celery may call ``note_attempt(n)``
before the body runs (the lab's observer does, from ``task_prerun``: it counts
attempts per document in Redis, which survives redelivery); the note is good for
one body; otherwise the envelope says ``request.retries + 1``,
which does not count redeliveries.

The next task of a chain receives the envelope, not the bare payload:
``unwrap(envelope)`` gives the payload of a SUCCESS envelope and raises
``UpstreamFailed`` (carrying the upstream error) for a FAILURE one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Concatenate, Generic, Literal, ParamSpec, TypeVar, cast, get_args

from celery import Celery, Task, signature
from celery.exceptions import Ignore, Reject, Retry, SoftTimeLimitExceeded
from celery.signals import task_revoked

Status = Literal["SUCCESS", "FAILURE"]
Reason = Literal["error", "dead_lettered", "retries_exhausted", "soft_timeout", "hard_timeout", "time_limit", "expired",
                 "revoked"]
REASONS: tuple[Reason, ...] = get_args(Reason)
Wire = dict[str, Any]

P = TypeVar("P")
Params = ParamSpec("Params")

_attempt: ContextVar[int | None] = ContextVar("rcl_attempt", default=None)


def note_attempt(n: int | None) -> None:
    """Tell ``@enveloped`` which attempt the coming body is (1-based); ``None`` forgets it."""
    _attempt.set(n)


class UpstreamFailed(Exception):
    """``unwrap`` met a FAILURE envelope: the task before this one in the chain failed (its reason carries on)."""

    def __init__(self, message: str, reason: Reason = "error") -> None:
        super().__init__(message)
        self.envelope_reason = reason


@dataclass(frozen=True)
class Result(Generic[P]):
    """What every enveloped task returns, in a SUCCESS state."""

    status: Status
    payload: P | None
    error: str | None
    reason: Reason | None
    attempts: int  # bodies that started (see "Attempts" above)
    deliveries: int | None = None  # broker deliveries, when the broker said (a dead letter)

    @property
    def ok(self) -> bool:
        return self.status == "SUCCESS"

    @classmethod
    def success(cls, payload: P, attempts: int) -> Result[P]:
        return cls("SUCCESS", payload, None, None, attempts)

    @classmethod
    def failure(cls, error: str, reason: Reason, attempts: int, deliveries: int | None = None) -> Result[P]:
        return cls("FAILURE", None, error, reason, attempts, deliveries)

    def to_wire(self) -> Wire:
        """A JSON-ready dict (the lab accepts JSON only)."""
        return {
            "status": self.status,
            "payload": self.payload,
            "error": self.error,
            "reason": self.reason,
            "attempts": self.attempts,
            **({"deliveries": self.deliveries} if self.deliveries is not None else {}),
        }

    @staticmethod
    def from_wire(raw: object) -> Result[Any]:
        """Parse a wire dict; raises ``ValueError`` when ``raw`` is no envelope."""
        if not isinstance(raw, Mapping):
            raise ValueError(f"not an envelope: {raw!r}")
        data = cast(Mapping[str, Any], raw)
        status = data.get("status")
        reason = data.get("reason")
        attempts = data.get("attempts")
        if status not in ("SUCCESS", "FAILURE") or not isinstance(attempts, int):
            raise ValueError(f"not an envelope: {raw!r}")
        if reason is not None and reason not in REASONS:
            raise ValueError(f"unknown failure reason {reason!r}")
        error = data.get("error")
        deliveries = data.get("deliveries")
        return Result(
            status=status,
            payload=data.get("payload"),
            error=str(error) if error is not None else None,
            reason=reason,
            attempts=attempts,
            deliveries=deliveries if isinstance(deliveries, int) else None,
        )


def is_envelope(raw: object) -> bool:
    """Does ``raw`` look like a ``Result`` on the wire (as opposed to a bare payload)?"""
    return isinstance(raw, Mapping) and "status" in cast(Mapping[str, object], raw)


def unwrap(raw: object) -> Any:
    """The payload of a SUCCESS envelope; ``UpstreamFailed`` for a FAILURE one."""
    envelope = Result.from_wire(raw)
    if not envelope.ok:
        raise UpstreamFailed(envelope.error or "the previous task failed", envelope.reason or "error")
    return envelope.payload


def reason_of(exc: BaseException) -> Reason:
    """The envelope reason for an exception (see the module docstring)."""
    declared = getattr(exc, "envelope_reason", None)  # the instance's, else its class's
    for reason in REASONS:
        if declared == reason:
            return reason
    if isinstance(exc, SoftTimeLimitExceeded):
        return "soft_timeout"
    return "error"


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


PASS_THROUGH: tuple[type[BaseException], ...] = (Retry, Ignore, Reject)


def enveloped(
    fn: Callable[Concatenate[Task[Any, Any], Params], P],
) -> Callable[Concatenate[Task[Any, Any], Params], Wire]:
    """Wrap a bound task body so that it always returns a ``Result`` wire dict."""

    @functools.wraps(fn)
    def wrapper(task: Task[Any, Any], *args: Params.args, **kwargs: Params.kwargs) -> Wire:
        try:
            try:
                payload = fn(task, *args, **kwargs)
            except PASS_THROUGH:
                raise
            except BaseException as exc:  # every other exit becomes a FAILURE envelope ...
                if not isinstance(exc, Exception) and getattr(type(exc), "envelope_reason", None) is None:
                    raise  # ... but SystemExit, KeyboardInterrupt and GeneratorExit
                return Result[P].failure(describe(exc), reason_of(exc), _attempts(task)).to_wire()
            return Result[P].success(payload, _attempts(task)).to_wire()
        finally:
            _attempt.set(None)  # a note is good for one body

    return wrapper


def _attempts(task: Task[Any, Any]) -> int:
    noted = _attempt.get()
    if noted is not None:
        return noted
    return int(task.request.retries or 0) + 1


def send_next(app: Celery, request: Any, envelope: Wire) -> None:
    """Send what ``celery.app.trace`` sends after a body returns, before it stores the result (Celery 5.5
    to 5.7), with ``envelope`` as the value: the request's link callbacks, then its chain's next step.
    ``request`` is the task's ``Context`` (``chain`` lists the rest of the chain, last task first)."""
    task_id = str(request.id)
    root_id = request.root_id or task_id
    for callback in request.callbacks or ():
        signature(callback, app=app).apply_async((envelope,), parent_id=task_id, root_id=root_id)
    if chain := request.chain:
        signature(chain[-1], app=app).apply_async((envelope,), chain=chain[:-1], parent_id=task_id, root_id=root_id)


def envelope_revoked(app: Celery) -> None:
    """A task of ``app`` revoked or expired before it ran hands its chain a FAILURE envelope.

    Celery 5.5 to 5.7: the worker's main process decides it (``celery.worker.request.Request.revoked``,
    then ``_announce_revoked``): it stores REVOKED through ``backend.mark_as_revoked``, which passes the
    outcome on only to a chord the task itself belongs to, acks the message, and sends ``task_revoked``.
    A chain's head is no chord member: nothing reaches the rest of its chain, the chord member after it
    is never sent, and the chord stays PENDING for ever. On ``task_revoked`` this sends the rest of the
    chain with a FAILURE envelope (reason ``expired`` or ``revoked``), as if the head had returned it,
    so the member records the document as failed and the chord completes. The head's own result stays
    REVOKED, as Celery stored it. A chord member revoked itself is counted by Celery as a REVOKED
    member: the chord fails with ``ChordError`` (no signal comes before that count)."""

    def on_revoked(sender: object = None, request: Any = None, expired: bool = False, **_: object) -> None:
        if getattr(sender, "app", None) is not app or request is None or not (request.chain or request.callbacks):
            return
        name = str(getattr(sender, "name", "task")).rsplit(".", 1)[-1]
        said = f"{name} expired before it ran" if expired else f"{name} was revoked before it ran"
        send_next(app, request, Result[Any].failure(said, "expired" if expired else "revoked", 0).to_wire())

    task_revoked.connect(on_revoked, weak=False)
