"""``within_consumer_timeout``: no task of the app runs longer than a share of the broker's ``consumer_timeout`` (FM-9).

RabbitMQ closes a channel whose consumer has held a delivery unacked longer than ``consumer_timeout``
(30 min by default since 3.8.17), with 406 PRECONDITION_FAILED, and requeues what that channel held
unacked (RabbitMQ's documentation; tests/test_owned.py runs the 406 on the lab's own node, RabbitMQ
3.10, and fm9's hard variant, S9 hard, the message coming back). With ``task_acks_late`` a task holds its message unacked while it runs, so a task
allowed to run longer than ``consumer_timeout`` gets its channel closed under it. Celery cannot learn the
broker's setting (AMQP does not carry it), so the app states it.

``within_consumer_timeout(app, seconds, share=0.5)`` sets a cap of ``share * seconds`` on every task the
app has when it is called (Celery's own ``celery.*`` tasks excepted). For each message of such a task the
worker enforces the limit Celery would (the one the message carries, else the task's ``time_limit``,
else the worker's own default, ``task_time_limit`` or ``--time-limit``), or the cap where that is higher
or unset. So the cap never raises a limit, and it reaches every message, whoever published it and
whenever: a process that never called this function, one that called it after its first publish
(``Task.apply_async`` writes the publisher's ``time_limit`` into each message) and an explicit
``apply_async(time_limit=...)`` alike.

How: each task's ``Request`` class is replaced by one that derives from ``CappedRequest`` and from the
class the task had (``BackstopRequest`` included, which keeps recording the kill as its envelope).
``CappedRequest.time_limits`` is what the worker's ``Request.execute_using_pool`` (the one
``celery.worker.request.create_request_cls`` builds; Celery 5.5.3, 5.6.3 and 5.7.0) hands the pool as
the job's hard limit; the worker's own default is read from the ``worker_init`` signal's
``WorkController.time_limit`` (claim C22 runs ``task_time_limit``; ``--time-limit`` is read, not
run). The task's ``time_limit`` attribute is lowered to the cap as well where its effective limit
(its own, or ``task_time_limit`` where it has none) is higher or unset, so that the messages this
process publishes carry the cap too.

Soft limits are not lowered. A task's own ``soft_time_limit`` at or above the cap is dropped (set to
``None``), since ``Task.apply_async`` refuses a soft limit above the hard one (Celery 5.5.3 to 5.7.0);
the worker's default soft limit then applies. A soft limit a message carries at or past the enforced
kill never fires: billiard's ``TimeoutHandler.handle_timeouts`` checks the hard limit first (billiard
4.3.2; read, not proven by a run).

Logged once per task and process, as a warning: a task whose limit this function lowers (one that had
none, given the cap, at debug level), and, in the worker, the first message of a task whose own limit
the cap lowered. tests/test_celery_claims.py::test_within_consumer_timeout_never_raises_a_limit runs a
worker per case on Celery 5.5, 5.6 and 5.7.

Half leaves room for what also counts against the broker's timeout: the time a delivery waits in the
worker before its body starts (prefetch), the store and ack after it, and the broker's check interval.
Call it after every task is defined: a task defined later is not capped. With RabbitMQ's default
(1800 s) nothing of the lab changes (its longest limit is 15 s).
"""

from __future__ import annotations

import logging
from typing import Any, cast

from celery import Celery
from celery.signals import worker_init
from celery.worker.request import Request
from kombu.utils.imports import symbol_by_name

logger = logging.getLogger(__name__)

DEFAULT_CONSUMER_TIMEOUT = 1800.0
"""RabbitMQ's ``consumer_timeout`` by default (since 3.8.17), in seconds."""

_worker_limits: dict[int, tuple[float | None, float | None]] = {}
"""Per app (``id``), the worker's own hard and soft default limits, read at ``worker_init``."""
_told: set[tuple[str, str]] = set()
"""(where, task name) already logged in this process: one line per task, not per call or message."""


def _tell(where: str, name: str, level: int, text: str, *args: object) -> None:
    if (where, name) in _told:
        return
    _told.add((where, name))
    logger.log(level, text, *args)


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is not None:
        _worker_limits[id(app)] = (getattr(sender, "time_limit", None), getattr(sender, "soft_time_limit", None))


def _smallest(*limits: float | None) -> float | None:
    given = [float(limit) for limit in limits if limit]
    return min(given) if given else None


class CappedRequest(Request):
    """A ``Request`` whose hard limit is Celery's own (the message's, the task's, the worker's) at most the cap."""

    consumer_timeout_cap: float = 0.0
    """Set on each task's own subclass by ``within_consumer_timeout``."""

    @property
    def time_limits(self) -> tuple[float | None, float | None]:  # pyright: ignore[reportIncompatibleVariableOverride]
        carried = cast(tuple[Any, Any], self.__dict__.get("_carried_limits") or (None, None))
        task: Any = self.task
        worker_hard, worker_soft = _worker_limits.get(id(task.app), (task.app.conf.task_time_limit,
                                                                     task.app.conf.task_soft_time_limit))
        celerys = carried[0] or task.time_limit or worker_hard  # what execute_using_pool and the pool would enforce
        hard = _smallest(celerys, self.consumer_timeout_cap)
        if carried[0] and hard is not None and float(carried[0]) > hard:
            _tell("message", self.name, logging.WARNING, "consumer_timeout cap: %s's message asks for time_limit %s;"
                  " the worker enforces %gs", self.name, carried[0], hard)
        soft = carried[1] or task.soft_time_limit or worker_soft
        return hard, soft

    @time_limits.setter
    def time_limits(  # pyright: ignore[reportIncompatibleVariableOverride]
            self, value: tuple[float | None, float | None]) -> None:  # Request.__init__ sets the message's
        self.__dict__["_carried_limits"] = tuple(value)


def capped_request_class(base: object, cap: float) -> type[CappedRequest]:
    """``base`` (a ``Request`` class or its dotted name) with ``CappedRequest``'s limits at ``cap`` seconds."""
    found = cast(type, symbol_by_name(base) if isinstance(base, str) else base)
    found = cast(type, found.__dict__.get("capped_base") or found)  # capped before: cap what it capped
    return cast(type[CappedRequest], type(f"Capped{found.__name__}", (CappedRequest, found),
                                          {"consumer_timeout_cap": cap, "capped_base": found}))


def within_consumer_timeout(app: Celery, seconds: float, share: float = 0.5) -> list[str]:
    """Cap every task of ``app`` at ``share * seconds`` (see the module); what it lowered, as text."""
    if not 0 < share < 1:
        raise ValueError(f"share must be between 0 and 1, not {share}")
    cap = share * seconds
    worker_init.connect(_on_worker_init, weak=False, dispatch_uid="shared.consumer_timeout.worker_init")
    setting = cast(float | None, app.conf.task_time_limit)
    lowered: list[str] = []
    for name, task in sorted(app.tasks.items()):
        if name.startswith("celery."):
            continue  # Celery's own (chord_unlock, backend_cleanup, ...)
        found: Any = task
        found.Request = capped_request_class(found.Request, cap)
        own = cast(float | None, found.time_limit)
        effective = own or setting  # 5.5.3 and 5.6.3's Task.from_config does not copy task_time_limit
        if effective is None or effective > cap:
            found.time_limit = cap
            said = "time_limit " + (f"{own}" if own else f"{setting} (task_time_limit)" if setting else "None")
            lowered.append(f"{name}: {said} -> {cap:g}s")
            _tell("task", name, logging.DEBUG if effective is None else logging.WARNING,
                  "consumer_timeout %gs: %s: %s -> %gs", seconds, name, said, cap)
        soft = found.soft_time_limit
        if soft is not None and found.time_limit is not None and soft >= found.time_limit:
            found.soft_time_limit = None  # Task.apply_async refuses a soft limit above the hard one (5.5.3 to 5.7.0)
            lowered.append(f"{name}: soft_time_limit {soft} dropped (not below {cap:g}s)")
            _tell("soft", name, logging.WARNING, "consumer_timeout %gs: %s: soft_time_limit %s dropped (not below %gs)",
                  seconds, name, soft, cap)
    return lowered
