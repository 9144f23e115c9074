"""The prefork pool the lab's workers run: Celery's, with a faster look for dead children.

Celery's prefork pool (``celery.concurrency.asynpool.AsynPool``, the same in 5.5 to 5.7) learns that a
pool process died from that process's sentinel, and also from
``AsynPool.maintain_pool``, which its ``timers`` property schedules every 5 s. In
the lab's runs the death of a *replacement* process (one forked after an earlier
SIGKILL) is at times noticed only by that timer, so a crash costs up to 5 s of
waiting before ``WorkerLostError`` is handled (requeue, or failure without acks late).

``LabPool`` runs the same ``maintain_pool`` every 0.25 s. Nothing else changes:
the same ``WorkerLostError``, the same ``Request.on_failure`` decisions; the lab
only waits less. Use it with ``-P lab.pool:LabPool`` or ``worker_pool``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery.concurrency.asynpool import AsynPool
from celery.concurrency.prefork import TaskPool

MAINTAIN_EVERY_SECONDS = 0.25


class LabAsynPool(AsynPool):
    @property
    def timers(self) -> dict[Callable[..., Any], float]:
        return {self.maintain_pool: MAINTAIN_EVERY_SECONDS}


class LabPool(TaskPool):
    Pool = LabAsynPool
