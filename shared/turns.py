"""``Turns``: the messages of one ordered queue taken in the order they were published, even after a
redelivery.

One active consumer and a prefetch of 1 read a queue in order until a message comes back: when a
pool process dies holding one, Celery rejects it with ``requeue=True``
(``task_reject_on_worker_lost``), and RabbitMQ 3.x does not promise to put it back at the head.
Seen in the lab (RabbitMQ 3.10, one consumer per queue, single-active-consumer): the next message
was delivered and run before the requeued one, committing a lot's events behind later ones.

So the producer numbers each message of a queue (``take``: ``INCR`` of the queue's counter in
Redis), and the consumer runs message ``n`` only once ``n - 1`` is done (``early``); an early
message is rejected back to the queue (``celery.exceptions.Reject(requeue=True)``) to come again
after the one it waits for. ``done(n)`` records the queue's progress once the work is written.

Knobs: the Redis client and key prefix (the app's backend, ``shared.backend``), the queue's name.

Limits: a number taken and never published (the producer died between the two) stops the queue for
good: ``skip(name, n)`` is the operator's way past it. ``done`` runs after the work: a process
killed between the two redoes the message (the work must be idempotent, as the ledger is). Each
early message costs a round trip to the broker; after one crash, the messages published behind
the requeued one may each come back once.
"""

from __future__ import annotations

from typing import Any, cast

import redis


class Turns:
    def __init__(self, r: redis.Redis, prefix: str) -> None:
        self.r, self.prefix = r, prefix

    def _key(self, name: str, what: str) -> str:
        return f"{self.prefix}turns:{name}:{what}"

    def take(self, name: str) -> int:
        """The next number of queue ``name`` (1, 2, ...), for the message about to be published."""
        return int(self.r.incr(self._key(name, "taken")))

    def last_done(self, name: str) -> int:
        return int(cast(Any, self.r.get(self._key(name, "done"))) or 0)

    def early(self, name: str, number: int) -> bool:
        """Does message ``number`` come before its predecessor is done?"""
        return number > self.last_done(name) + 1

    def done(self, name: str, number: int) -> None:
        """Message ``number`` of ``name`` is written: the next may run. Never moves back; one writer per
        queue (its one active consumer), so a read then a write is enough."""
        if number > self.last_done(name):
            self.r.set(self._key(name, "done"), number)

    def skip(self, name: str, number: int) -> None:
        """The operator's way past a number that will never come."""
        self.done(name, number)
