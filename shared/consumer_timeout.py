"""``within_consumer_timeout``: every task's ``time_limit`` below the broker's ``consumer_timeout`` (FM-9).

RabbitMQ closes a channel whose consumer has held a delivery unacked longer than ``consumer_timeout``
(30 min by default since 3.8.17; checked on the channel's tick, ``channel_tick_interval``), with 406
PRECONDITION_FAILED, and requeues what that channel held unacked: the over-long message and every other
one the worker was running on that channel. With ``task_acks_late`` a task holds its message unacked
while it runs, so a task allowed to run longer than ``consumer_timeout`` gets its channel closed under
it. Celery cannot learn the broker's setting (AMQP does not carry it), so the app states it.

``within_consumer_timeout(app, seconds, share=0.5)`` lowers each of the app's own tasks' ``time_limit``
(Celery's kill, FM-6's backstop) to ``share * seconds`` where it is higher or unset, and its
``soft_time_limit`` to below that, and logs each change once, at import (a limit it lowers as a warning,
one it gives a task that had none at debug level): the process then ends as
FM-6's ``time_limit`` envelope before the broker's timeout can fire, and its message is acked. Half
leaves room for what also counts against the timeout: the time a delivery waits in the worker before
its body starts (prefetch), the store and ack after it, and the channel's tick. Celery reads the
task's own ``time_limit`` for a message that carries none (``Request.execute_using_pool``): set limits
per call with ``apply_async(time_limit=...)`` and this cannot lower them.

With RabbitMQ's default (1800 s) nothing of the lab changes (its longest limit is 15 s). The lab's own
node for scenario 9 runs with a consumer timeout of seconds, and the worker that serves it is told so.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery

logger = logging.getLogger(__name__)

DEFAULT_CONSUMER_TIMEOUT = 1800.0
"""RabbitMQ's ``consumer_timeout`` by default (since 3.8.17), in seconds."""


def within_consumer_timeout(app: Celery, seconds: float, share: float = 0.5) -> list[str]:
    """Lower the time limits of ``app``'s own tasks to ``share * seconds``; what was lowered, as text."""
    if not 0 < share < 1:
        raise ValueError(f"share must be between 0 and 1, not {share}")
    cap = share * seconds
    lowered: list[str] = []
    for name, task in sorted(app.tasks.items()):
        if name.startswith("celery."):
            continue  # Celery's own (chord_unlock, backend_cleanup, ...)
        found: Any = task
        limit = found.time_limit
        if limit is None or limit > cap:
            found.time_limit = cap
            lowered.append(f"{name}: time_limit {limit} -> {cap:g}s")
        soft = found.soft_time_limit
        if soft is not None and soft >= found.time_limit:
            found.soft_time_limit = None  # a soft limit at or past the kill could never ask first
            lowered.append(f"{name}: soft_time_limit {soft} dropped (not below {cap:g}s)")
    for change in lowered:  # a limit you set, lowered, is worth a warning; one you never set, given, is not
        logger.log(logging.DEBUG if " None -> " in change else logging.WARNING, "consumer_timeout %gs: %s", seconds, change)
    return lowered
