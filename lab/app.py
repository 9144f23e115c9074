"""``lab_app``: the Celery app every FM file starts from (JSON only, namespaced).

What it sets, so that an FM file shows only the settings its fixes add:

- broker and backend from ``CELERY_BROKER_URL`` and ``CELERY_RESULT_BACKEND``
  (``lab.settings``); JSON only, for tasks and results;
- every name inside the FM's namespace (shown here for the default namespace
  ``rcl``): the task queue, its exchange and routing key ``rcl.<short>.tasks`` (``task_default_queue``, and ``task_queues`` with that one
  queue, which an FM may replace), the control and event exchanges
  ``rcl.<short>.control`` / ``rcl.<short>.events``, and the result keys ``rcl:<short>:...``
  (the Redis backend's ``global_keyprefix``);
- the ``redis://`` result backend is ``lab.backend.LabRedisBackend``: Celery's
  ``RedisBackend`` with one hook, a scenario's fault that stalls the store of one
  result after its body returned (a time limits' lesson's first hard variant);
- ``worker_pool = "lab.pool:LabPool"``: Celery's prefork pool, noticing a dead pool
  process sooner (``lab.pool`` says why and what does not change);
- ``worker_consumer = "lab.app:NamespacedConsumer"``: Celery's consumer without the
  ``DelayedDelivery`` step (Celery 5.5 to 5.7), which for a quorum queue would declare broker-wide
  ``celery_delayed_*`` names outside the namespace (``shared.dlq``);
- ``worker_enable_remote_control = False``: the harness talks to workers through
  tasks, and remote control declared a ``<namespace>.<fm>.control.pidbox`` exchange
  per FM that stayed on the broker (seen in ``rabbitmqctl list_exchanges``);
- ``redis_socket_timeout`` and ``redis_socket_connect_timeout`` of 5 s, and a
  backend ``retry_policy`` of 3 retries within 1.5 s: a Redis that stops answering
  is an error within seconds, not a hang;
- the app's name ``<namespace>_<fm>`` (``rcl_fm3``; the worker's banner shows it as ``app:``);
- a ``probe`` task the harness sends to learn that a worker is ready, and ``idle``, the
  barrier a by-hand run sends, one per pool slot, to learn that the worker has finished
  what an interrupted run left it (``lab.by_hand``);
- the lab's observer on Celery's signals (``lab.observe``), which records what the
  tasks do without a line of it in their bodies;
- in a worker, what its window prints (``lab.worker_log``): the lab's own kills and
  hangs as one ``expected:`` line each, and every recovery, at any ``--loglevel``; and
  (``lab.quiet_log``) each line a deploy, an outage or a cut causes, said once;
- in a worker the harness started (``RCL_HARNESS_PID`` set), a watch on the
  harness: when it dies, however, the worker kills its own process group
  (``lab.workers`` says why a watch). A worker you start by hand has no watch.

The FM's short name comes from its module name: ``<short>_<what>`` is ``<short>``.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Literal, cast

from celery import Celery
from celery.signals import worker_init
from celery.worker.consumer import Consumer
from kombu import Exchange, Queue

from lab import observe, quiet_log, worker_log
from lab.settings import NAMESPACE, amqp_name, backend_url, broker_url, redis_prefix
from lab.waiting import wait_until


class NamespacedConsumer(Consumer):
    """Celery's consumer without ``DelayedDelivery`` (see the module docstring)."""

    class Blueprint(Consumer.Blueprint):
        # A list in Celery (the stubs say set): keep its order, drop one step.
        default_steps = cast(Any, [s for s in Consumer.Blueprint.default_steps if not s.endswith(":DelayedDelivery")])


BACKEND_RETRY_POLICY = {"max_retries": 3, "interval_start": 0, "interval_step": 0.5, "interval_max": 1}
"""How the Redis result backend retries a lost connection (``celery.backends.redis.RedisBackend.ensure``, 5.5 to 5.7,
and its result consumer's reconnect): 3 times within 1.5 s, not Celery's 20 times a second apart,
so that a Redis gone mid-run is an ERROR within seconds (measured on 5.7: 19 s with Celery's policy)."""


BEFORE_HARD_FIX = "before_hard_fix"
"""The module of a lesson's program as it stood before its hard fix (``lessons/<lesson>/before_hard_fix.py``);
its namespace is the lesson's name and ``w`` (``<short>w``), apart from the program's own."""


def short_name(module: str) -> str:
    """``<short>`` for ``<short>_<what>`` (and for ``__main__`` run from that file); ``<short>w`` for
    ``lessons.<short>.before_hard_fix``."""
    if module == "__main__":
        path = Path(str(getattr(sys.modules["__main__"], "__file__", "fm")))
        module = f"{path.parent.name}.{path.stem}"
    parts = module.split(".")
    if len(parts) >= 2 and parts[-1] == BEFORE_HARD_FIX:
        return f"{parts[-2]}w"
    return parts[-1].split("_", 1)[0]


def app_name(short: str) -> str:
    """The Celery app's name (``app.main``, the worker banner's ``app:``): ``<namespace>_<short>``, ``rcl_fm3``."""
    return f"{NAMESPACE}_{short}"


def short_of_app(main: str | None) -> str | None:
    """``<short>`` for an app named ``app_name("<short>")`` in this namespace; None for any other name."""
    prefix = app_name("")
    if not main or not main.startswith(prefix):
        return None
    return main[len(prefix):] or None


def lab_app(module: str, short: str | None = None, broker: Literal["amqp", "redis"] = "amqp") -> Celery:
    """The app of ``module``; ``short`` names its namespace when the module name does not (a case study).

    ``broker="redis"``: the broker is the lab's Redis (``CELERY_RESULT_BACKEND``'s server), its
    keys (queue lists, bindings, the unacked hash) under ``<namespace>:<short>:broker:`` (kombu's
    ``global_keyprefix`` transport option); the program adds its own transport options to
    ``broker_transport_options``."""
    fm = short or short_name(module)
    queue = amqp_name(fm, "tasks")
    app = Celery(app_name(fm), broker=broker_url() if broker == "amqp" else backend_url(), backend=backend_url())
    app.loader.override_backends = {"redis": "lab.backend:LabRedisBackend"}  # Celery's, with one fault hook (lab.backend)
    if broker == "redis":
        app.conf.broker_transport_options = {"global_keyprefix": f"{redis_prefix(fm)}broker:"}
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_default_queue=queue,
        task_default_exchange=queue,
        task_default_routing_key=queue,
        task_queues=[Queue(queue, Exchange(queue, type="direct"), routing_key=queue)],
        result_backend_transport_options={"global_keyprefix": redis_prefix(fm), "retry_policy": BACKEND_RETRY_POLICY},
        result_expires=3600,
        control_exchange=amqp_name(fm, "control"),
        event_exchange=amqp_name(fm, "events"),
        broker_connection_retry_on_startup=True,
        worker_enable_remote_control=False,
        redis_socket_timeout=5.0,
        redis_socket_connect_timeout=5.0,
        worker_consumer="lab.app:NamespacedConsumer",
        worker_pool="lab.pool:LabPool",
        worker_redirect_stdouts_level="INFO",
    )

    @app.task(name=f"{fm}.probe", shared=False, ignore_result=False)  # answers even where results are off
    def probe() -> str:
        return "pong"

    @app.task(name=f"{fm}.idle", shared=False, ignore_result=False)
    def idle(barrier: str, slots: int, timeout: float) -> bool:
        """True once ``slots`` of these run at the same time: that many pool slots were free of other work."""
        r = observe.client()
        r.incr(barrier)
        r.expire(barrier, IDLE_KEY_SECONDS)
        return wait_until(lambda: int(cast(str, r.get(barrier) or 0)) >= slots, timeout, interruptible=False)

    observe.install()
    worker_log.install()  # after the observer: its sink and signals come second
    quiet_log.install()  # the deploys', outages' and cuts' lines, each said once
    return app


IDLE_KEY_SECONDS = 120
"""How long the ``idle`` barrier's counter lives in Redis."""

PARENT_WATCH_SECONDS = 0.5
"""How often a harness-started worker looks whether the harness is still its parent."""


def _watch_parent(harness_pid: int) -> None:
    while os.getppid() == harness_pid:
        time.sleep(PARENT_WATCH_SECONDS)  # a watch: the condition is re-read every period, for as long as it runs
    os.killpg(os.getpgrp(), signal.SIGKILL)  # the harness is gone: this worker, its pool and its beat go too


@worker_init.connect(weak=False)
def _start_parent_watch(**_: object) -> None:
    harness = os.environ.get("RCL_HARNESS_PID", "")
    if harness.isdigit():
        threading.Thread(target=_watch_parent, args=(int(harness),), name="rcl-parent-watch", daemon=True).start()
