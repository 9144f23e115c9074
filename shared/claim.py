"""The ``notify`` claim: one email per pipeline under at-least-once delivery (the FM-4 fix).

A Redis key per pipeline, ``<prefix>claim:<pipeline_id>``, moves through two states:

- ``claimed:<owner>``: set with ``SET NX EX claim_ttl`` by the first ``notify``
  that wants to send (the owner is its task id); it expires if nobody finishes;
- ``sent:<owner>``: set, by the owner only, once the email is out; kept ``sent_ttl``
  (a day by default). The limit: a ``notify`` of the same pipeline that comes more
  than ``sent_ttl`` after the email (a letter sent back from the DLQ, a resubmission)
  finds no claim and sends again; set ``sent_ttl`` above the longest a message of
  the pipeline can wait (``shared.dlq.STARTS_TTL_SECONDS`` for letters the drain reads)
  (not proven by a run).

``acquire()`` answers:

- ``won``: send now. Also when the claim is already ``claimed:`` by this very task
  id: RabbitMQ delivers a message again only once its first delivery is over
  (the channel that held it closed, or the consumer rejected it with requeue, as
  FM-2's ``reject_on_worker_lost`` does for a pool process that died: AMQP 0-9-1,
  not proven by a run here), so a second delivery of the owner's own message means
  the first one died holding the claim, or its connection dropped (below), and this one resumes it. Without that, the owner's redelivery is turned away by
  its own claim ("busy") until the claim expires;
- ``busy``: someone else is sending: retry shortly, because they may still fail
  and release (``busy_waits``: the wait is spent in the broker, not in the worker). ``policy.busy_retries`` retries of ``policy.poll`` seconds outlast
  ``claim_ttl``, so a claim whose owner died and never comes back expires and the
  waiting ``notify`` takes over (a budget shorter than the TTL gives up first, and
  no email goes out at all);
- ``done``: already sent: skip.

``with claim.sending(): ...`` releases the claim when the block raises (a retry
or a duplicate may send instead) and marks it ``sent`` when it returns. Owner
checks are atomic Lua scripts, so a stale owner cannot overwrite a newer claim.

``NotifyClaim.of(app, pipeline_id, owner)`` keeps the claim in the app's result
backend Redis, under its key prefix (``shared.backend``).

Limits: the claim alone cannot make a side effect exactly-once.

- An owner that sends and dies before ``mark_sent`` leaves ``claimed``; its
  redelivery resumes the claim and sends again.
- A redelivery can also come while the first delivery still runs: RabbitMQ
  requeues a message when its consumer's *connection* drops, and Celery 5.5 to 5.7
  let the running task go on (``worker_cancel_long_running_tasks_on_connection_loss``
  defaults to False in ``celery/app/defaults.py`` of 5.5.3, 5.6.3 and 5.7.0; read,
  not run); both deliveries
  then hold the same owner and both send.
- An owner slower than ``claim_ttl`` loses its claim to a waiting duplicate.

In each case the second send carries the same ``idempotency_key`` (``claim.key``):
a receiver that deduplicates on it (mail and payment APIs that take an
idempotency key do, for as long as they keep the key) delivers once. That is
the end-to-end half of the fix; the claim keeps the calls to it to one in the
common cases.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, cast

import redis
from celery import Celery, Task

from shared.backend import backend_redis
from shared.dlq import DeadLetter, dead_lettered
from shared.retry import DelayQueues, RetryPolicy

State = Literal["won", "busy", "done"]

_MARK_SENT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


@dataclass(frozen=True)
class ClaimPolicy:
    claim_ttl: int = 60  # seconds a claim survives its owner's death
    sent_ttl: int = 86_400  # seconds "sent" is remembered
    poll: float = 0.05  # seconds between the busy-retries of a waiting notify
    resume: bool = True  # False: the owner's own redelivery is busy like anyone (fm4 before its hard variant)

    @property
    def busy_retries(self) -> int:
        """Busy-retries that outlast ``claim_ttl`` (each waits at least ``poll``)."""
        return math.ceil(self.claim_ttl / self.poll) + 1


class ClaimBusy(Exception):
    """Another ``notify`` holds the claim: this one waits and asks again (``busy_waits``)."""


def busy_waits(queue: str, policy: ClaimPolicy = ClaimPolicy()) -> DelayQueues:
    """Where a busy ``notify`` waits between two looks at the claim: in the broker, in delay queues
    ``QUEUE.busy.0.<s>`` (``shared.retry.DelayQueues``, FM-5's way), ``policy.poll`` seconds each time,
    up to ``policy.busy_retries`` times. Not ``Task.retry(countdown=...)``: on a quorum queue that is an
    ETA message the worker holds in its prefetch (Celery warns that a direct exchange gets no native
    delayed delivery, and the wait may block the worker), exactly what FM-5 shows."""
    waits = RetryPolicy(max_retries=policy.busy_retries, base=policy.poll, factor=1.0, cap=policy.poll)
    return DelayQueues(queue, waits, stem="busy")


def release_when_dead_lettered(app: Celery, task: Task[Any, Any], pipeline_arg: str = "pipeline_id") -> None:
    """When the DLQ drain (``shared.dlq``) finalises a dead-lettered call of ``task`` (a poison
    ``notify``: its process died on every delivery, holding the claim), release that call's claim,
    so that a re-fired ``notify`` sends at once instead of waiting out ``claim_ttl``. The claim's owner
    is the dead call's task id; a claim someone else holds, or one already ``sent``, is left alone."""
    run: Any = getattr(task, "run")
    parameters = inspect.signature(run)

    def on_dead_letter(sender: object = None, letter: DeadLetter | None = None, **_: object) -> None:
        if sender is not app or letter is None or letter.task_name != task.name:
            return
        try:
            bound = parameters.bind_partial(*letter.args, **letter.kwargs)
        except TypeError:  # not a call of this task's signature: nothing to release
            return
        pipeline = bound.arguments.get(pipeline_arg)
        if isinstance(pipeline, str):
            NotifyClaim.of(app, pipeline, owner=letter.task_id).release()

    dead_lettered.connect(on_dead_letter, weak=False)


class NotifyClaim:
    def __init__(self, r: redis.Redis, key: str, owner: str, policy: ClaimPolicy = ClaimPolicy()) -> None:
        self.r = r
        self.key = key
        self.owner = owner
        self.policy = policy

    @classmethod
    def of(cls, app: Celery, pipeline_id: str, owner: str | None, policy: ClaimPolicy = ClaimPolicy()) -> NotifyClaim:
        """The claim of ``pipeline_id`` in ``app``'s result backend Redis, under its key prefix."""
        r, prefix = backend_redis(app)
        return cls(r, f"{prefix}claim:{pipeline_id}", str(owner), policy)

    def acquire(self) -> State:
        mine = f"claimed:{self.owner}"
        if self.r.set(self.key, mine, nx=True, ex=self.policy.claim_ttl):
            return "won"
        current = cast(str | None, self.r.get(self.key))
        if current is None:  # expired between the two calls: try once more
            return "won" if self.r.set(self.key, mine, nx=True, ex=self.policy.claim_ttl) else "busy"
        if current.startswith("sent:"):
            return "done"
        return "won" if current == mine and self.policy.resume else "busy"  # mine: the owner's redelivery resumes

    def mark_sent(self) -> bool:
        script = self.r.register_script(_MARK_SENT)
        return bool(script(keys=[self.key], args=[f"claimed:{self.owner}", f"sent:{self.owner}", self.policy.sent_ttl]))

    def release(self) -> bool:
        script = self.r.register_script(_RELEASE)
        return bool(script(keys=[self.key], args=[f"claimed:{self.owner}"]))

    @contextmanager
    def sending(self) -> Generator[None]:
        """Around the side effect of a won claim: release on error, mark ``sent`` on success."""
        try:
            yield
        except BaseException:
            self.release()  # let a retry or a duplicate send instead
            raise
        self.mark_sent()
