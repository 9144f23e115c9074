"""Bounded redelivery and the dead-letter drain (the FM-3 fix).

Topology, all inside the FM's namespace:

- the task queue is a RabbitMQ quorum queue with ``x-delivery-limit``: when a
  message has been returned to the queue more often than the limit (a worker
  died holding it), RabbitMQ dead-letters it instead of delivering it again;
- ``x-dead-letter-exchange`` routes it to ``<ns>.dlx`` and from there to the
  dead-letter queue ``<ns>.dlq``. No worker consumes the DLQ: it is not a task queue.

How many attempts: RabbitMQ 3.x counts every return of the message to the
queue (Celery returns a lost worker's message with ``basic.reject(requeue=True)``);
with ``x-delivery-limit = L`` the message is delivered ``L + 1`` times, then
dead-lettered (G3 measures it on the broker you run: 3 deliveries for L = 2).
RabbitMQ 4.0 changes the default: every quorum queue gets a delivery limit of 20
when none is set, and only ``x-delivery-limit: -1`` at declaration removes it;
so on 4.x a queue without this FM's fix still dead-letters (or drops, without a
dead-letter exchange) a poison message after 20 deliveries. Later 4.x releases
also changed which returns count (4.3 counts ``basic.reject`` and ``basic.nack``
differently), so measure the bound again when you upgrade.

What RabbitMQ 3.x hands the DLQ: the message with its Celery headers, plus
``x-death`` and ``x-first-death-reason: delivery_limit``; it does not carry
``x-delivery-count`` over, so the envelope states the policy's bound as attempts.

The drain (``drain``): a beat task reads the DLQ with ``basic_get``, and for
each message that is a chord member it writes a SUCCESS-state ``Result``
(reason ``dead_lettered``) through ``backend.mark_as_done`` with a request
rebuilt from the message headers. ``celery.backends.base.Backend.mark_as_done``
then calls the backend's ``on_chord_part_return``, the member counts, and the
chord body fires. A message that is not a chord member (or cannot be decoded)
is acked and logged: the drain never crashes on it.

Celery 5.7 note: a quorum queue in ``task_queues`` makes the worker include the
``DelayedDelivery`` bootstep (``celery.worker.consumer.delayed_delivery``, see
its ``include_if``), which declares broker-wide ``celery_delayed_*`` exchanges
and queues and binds every app queue to them. The lab never touches names
outside its namespace, so its apps run ``NamespacedConsumer`` without that step.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from celery import Celery
from celery.app.task import Context
from celery.worker.consumer import Consumer
from kombu import Exchange, Queue
from kombu.message import Message

from shared.envelope import Result
from shared.settings import amqp_name

log = logging.getLogger(__name__)


class NamespacedConsumer(Consumer):
    """Celery's consumer without ``DelayedDelivery`` (see the module docstring)."""

    class Blueprint(Consumer.Blueprint):
        # A list in Celery (the stubs say set): keep its order, drop one step.
        default_steps = cast(Any, [s for s in Consumer.Blueprint.default_steps if not s.endswith(":DelayedDelivery")])


@dataclass(frozen=True)
class DeadLetterPolicy:
    delivery_limit: int = 2
    drain_every: float = 0.25  # seconds between beat-driven drains

    @property
    def attempts_bound(self) -> int:
        """Deliveries before dead-lettering on RabbitMQ 3.x: ``x-delivery-limit + 1``."""
        return self.delivery_limit + 1


def dlx_exchange(fm: str) -> Exchange:
    return Exchange(amqp_name(fm, "dlx"), type="direct", durable=True)


def dead_letter_queue(fm: str) -> Queue:
    return Queue(amqp_name(fm, "dlq"), dlx_exchange(fm), routing_key=amqp_name(fm, "dlq"), durable=True)


def quorum_arguments(fm: str, policy: DeadLetterPolicy) -> dict[str, Any]:
    return {
        "x-queue-type": "quorum",
        "x-delivery-limit": policy.delivery_limit,
        "x-dead-letter-exchange": amqp_name(fm, "dlx"),
        "x-dead-letter-routing-key": amqp_name(fm, "dlq"),
    }


def declare_dead_letter_path(app: Celery, fm: str) -> None:
    """Declare the DLX and DLQ (idempotent): dead-lettering into nothing drops the message."""
    with app.connection_for_write() as conn:
        dead_letter_queue(fm).bind(conn.default_channel).declare()


@dataclass(frozen=True)
class DeadLetter:
    """One dead-lettered chord member, as the drain read it."""

    task_id: str
    task_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    death_reason: str  # x-first-death-reason: "delivery_limit" for a poison message


Finalised = Callable[[DeadLetter], None]


def drain(app: Celery, fm: str, policy: DeadLetterPolicy, on_finalised: Finalised | None = None, batch: int = 100) -> int:
    """Finalise what sits in the DLQ; return how many chord members it finalised."""
    finalised = 0
    with app.connection_for_write() as conn:
        queue = dead_letter_queue(fm).bind(conn.default_channel)
        queue.declare()
        for _ in range(batch):
            message = queue.get(no_ack=False, accept=["json"])
            if message is None:
                break
            try:
                letter = _finalise(app, message, policy)
            except Exception:  # a message the drain cannot read must not stop the drain
                log.exception("dead letter %r could not be finalised; acked and dropped", message.headers)
                letter = None
            message.ack()
            if letter is not None:
                finalised += 1
                if on_finalised is not None:
                    on_finalised(letter)
    return finalised


def _finalise(app: Celery, message: Message, policy: DeadLetterPolicy) -> DeadLetter | None:
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
    # RabbitMQ does not carry x-delivery-count into the dead letter; when the reason is
    # delivery_limit, the message was delivered exactly the policy's bound.
    attempts = policy.attempts_bound if death == "delivery_limit" else 0
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
