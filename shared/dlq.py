"""Bounded redelivery and the dead-letter drain (the FM-3 fix).

The topology is plain RabbitMQ, declared where the reader sees it (``fm3``):

- the task queue is a quorum queue with ``x-delivery-limit``: when a message has
  been returned to the queue more often than the limit (a worker died holding
  it), RabbitMQ dead-letters it instead of delivering it again;
- ``x-dead-letter-exchange`` and ``x-dead-letter-routing-key`` route it to a
  dead-letter queue that no worker consumes as a task queue. That queue must
  exist before any message dies: RabbitMQ drops a dead letter whose exchange does
  not exist or routes it nowhere. ``DeadLetteringQueue`` is a kombu ``Queue`` that
  declares its ``dead_letters`` queue whenever it is declared itself (by the
  worker at start, by a publisher, by the lab's reset), so the two cannot part.

How many deliveries: RabbitMQ 3.x counts every return of the message to the
queue (Celery returns a lost worker's message with ``basic.reject(requeue=True)``);
with ``x-delivery-limit = L`` the message is delivered ``L + 1`` times, then
dead-lettered (G3 measures it on the broker you run: 3 deliveries for L = 2).
RabbitMQ 4.0 changes the default: every quorum queue gets a delivery limit of 20
when none is set, and only ``x-delivery-limit: -1`` at declaration removes it;
so on 4.x a queue without this fix still dead-letters (or drops, without a
dead-letter exchange) a poison message after 20 deliveries. Later 4.x releases
also changed which returns count (4.3 counts ``basic.reject`` and ``basic.nack``
differently), so measure the bound again when you upgrade. (Stated from
RabbitMQ's documentation; the lab runs 3.x only.)

What RabbitMQ 3.x hands the DLQ: the message with its Celery headers, plus
``x-death``, ``x-first-death-queue`` and ``x-first-death-reason: delivery_limit``;
it does not carry ``x-delivery-count`` over, so the envelope states the source
queue's bound (its ``x-delivery-limit`` + 1, read from the app's ``task_queues``).

The drain (``drain``): a beat task reads the DLQ with ``basic_get``, and for
each message that is a chord member it writes a SUCCESS-state ``Result``
(reason ``dead_lettered``) through ``backend.mark_as_done`` with a request
rebuilt from the message headers. ``celery.backends.base.Backend.mark_as_done``
then calls the backend's ``on_chord_part_return``, the member counts, and the
chord body fires. A message that is not a chord member (or cannot be decoded)
is acked and logged: the drain never crashes on it. Each finalised member is
announced on the ``dead_lettered`` signal (``sender`` the app, ``letter`` a
``DeadLetter``): attach an alert or a metric there.

Celery 5.7 note: a quorum queue in ``task_queues`` makes the worker include the
``DelayedDelivery`` bootstep (``celery.worker.consumer.delayed_delivery``, see
its ``include_if``), which declares broker-wide ``celery_delayed_*`` exchanges
and queues and binds every app queue to them. The lab never touches names
outside its namespace, so its apps run without that step (``lab.app``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from celery import Celery
from celery.app.task import Context
from celery.utils.dispatch import Signal
from kombu import Queue
from kombu.message import Message

from shared.envelope import Result

log = logging.getLogger(__name__)

dead_lettered = Signal(name="dead_lettered", providing_args=["letter"])
"""Sent by ``drain`` for each chord member it finalised (``sender=app, letter=DeadLetter``)."""


class DeadLetteringQueue(Queue):
    """A task queue that declares its dead-letter queue (``dead_letters``) with itself."""

    attrs = (*Queue.attrs, ("dead_letters", None))

    def __init__(self, *args: Any, dead_letters: Queue | None = None, **kwargs: Any) -> None:
        self.dead_letters = dead_letters
        super().__init__(*args, **kwargs)

    def declare(self, nowait: bool = False, channel: Any = None) -> str | None:
        if self.dead_letters is not None and not getattr(self, "no_declare", False):
            self.dead_letters.bind(channel or self.channel).declare(nowait=nowait)
        return super().declare(nowait=nowait, channel=channel)


def bound_of(queue: Queue) -> int | None:
    """Deliveries before RabbitMQ 3.x dead-letters a message of ``queue``: its
    ``x-delivery-limit + 1`` (None when it has no limit)."""
    limit = (queue.queue_arguments or {}).get("x-delivery-limit")
    return limit + 1 if isinstance(limit, int) else None


def delivery_bound(app: Celery, queue_name: str) -> int | None:
    """``bound_of`` the app's task queue named ``queue_name``."""
    found = [q for q in cast(list[Queue], list(app.conf.task_queues or [])) if q.name == queue_name]
    return bound_of(found[0]) if found else None


@dataclass(frozen=True)
class DeadLetter:
    """One dead-lettered chord member, as the drain read it."""

    task_id: str
    task_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    death_reason: str  # x-first-death-reason: "delivery_limit" for a poison message


def drain(app: Celery, dlq: Queue, batch: int = 100) -> int:
    """Finalise what sits in ``dlq``; return how many chord members it finalised."""
    finalised = 0
    with app.connection_for_write() as conn:
        queue = dlq.bind(conn.default_channel)
        queue.declare()
        for _ in range(batch):
            message = queue.get(no_ack=False, accept=["json"])
            if message is None:
                break
            try:
                letter = _finalise(app, message)
            except Exception:  # a message the drain cannot read must not stop the drain
                log.exception("dead letter %r could not be finalised; acked and dropped", message.headers)
                letter = None
            message.ack()
            if letter is not None:
                finalised += 1
                dead_lettered.send(sender=app, letter=letter)
    return finalised


def _finalise(app: Celery, message: Message) -> DeadLetter | None:
    headers = cast(Mapping[str, Any], message.headers or {})
    body = message.decode()
    if not (isinstance(body, list) and len(cast(list[Any], body)) == 3):
        log.warning("dead letter with a body that is not a Celery task message: %r", headers)
        return None
    args, kwargs, embed = cast(tuple[list[Any], dict[str, Any], dict[str, Any]], tuple(cast(list[Any], body)))
    task_id, chord = headers.get("id"), embed.get("chord")
    if not task_id or not chord:
        log.warning("dead letter %s (%s) is not a chord member; acked", task_id, headers.get("task"))
        return None
    death = str(headers.get("x-first-death-reason") or "unknown")
    letter = DeadLetter(str(task_id), str(headers.get("task")), args, kwargs, death)
    # RabbitMQ 3.x does not carry x-delivery-count into the dead letter; when the reason is
    # delivery_limit, the message was delivered exactly its source queue's bound.
    bound = delivery_bound(app, str(headers.get("x-first-death-queue") or ""))
    attempts = bound if death == "delivery_limit" and bound is not None else 0
    envelope = Result[Any].failure(f"dead-lettered by the broker ({death}) after {attempts} deliveries", "dead_lettered", attempts)
    request = Context(
        id=task_id,
        task=headers.get("task"),
        group=headers.get("group"),
        group_index=headers.get("group_index"),
        root_id=headers.get("root_id"),
        parent_id=headers.get("parent_id"),
        chord=chord,
        args=args,
        kwargs=kwargs,
    )
    app.backend.mark_as_done(task_id, envelope.to_wire(), request=request)
    return letter
