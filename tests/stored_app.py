"""A chord whose first member dies between its result's store and its count (``tests/test_stored_members.py``).

Run by that test's worker (``celery -A tests.stored_app worker``): RabbitMQ is the broker (a classic queue
``<namespace>-sm``), the shared Redis the result backend (keys under ``<namespace>:sm:``), acks late, reject on
worker lost, ``worker_deduplicate_successful_tasks`` as fm7..fm9 set them; ``SM_FIX=1`` adds
``shared.stored_members.count_stored_members``. ``sm.timed_member`` is a member with Celery's ``time_limit`` and
FM-6's ``BackstopRequest``, whose settling in the main process counts a stored SUCCESS; with ``SM_FIX=0`` it runs
``BackstopRequest`` as it stood before that count (``UncountedBackstop``).

The gate (pool processes only): a member whose ``hold:<key>:<i>`` key says ``before`` stops after Celery stored
its SUCCESS and before ``on_chord_part_return`` counts it; ``after``, once it counted. It then writes its pid to
``held:<key>:<i>`` and waits to be killed (or for ``release:<key>``, which a failed test sets). ``last`` (member
0 only): it counts once the other two have (``counted:<key>``), and is held where it sends the chord's body. The other
members wait for ``go:<key>``, so that the test decides
when they count. Each delivery of a member is counted in ``received:<key>:<i>``. ``body`` appends what the chord gave it to ``bodies:<key>``.

A member whose ``hold:`` says ``signals`` holds its first run in its body with its signals held, as
``count_stored_members`` holds them around a count (a signal then waits for the block's end: here, the kill), and
runs its later runs through. ``SM_BLIND=1`` (with ``SM_FIX=1``) gives ``sm.timed_member`` ``BackstopRequest`` as it
stood before it left a request Celery had cancelled unsettled (``CancelBlindBackstop``); ``SM_FENCE=1`` adds FM-9's
``fence_redeliveries``.

The ways a fix of the lab's ends a body, set by the worker's environment: ``SM_COLD=1`` is FM-7's (a SIGTERM begins
a 0.3 s soft wait, then the cold shutdown cancels what still runs; the worker is started with ``REMAP_SIGTERM``);
``SM_CUT=1`` is FM-9's (the worker's broker is ``SM_BROKER``, a link the test cuts, and Celery cancels what runs
when its connection is lost)."""

from __future__ import annotations

import gc
import json
import os
from collections.abc import Callable
from typing import Any, cast

import redis
from celery import Celery
from celery.backends.redis import RedisBackend
from celery.signals import before_task_publish, task_received, worker_process_init

from lab.settings import NAMESPACE, backend_url, broker_url
from lab.waiting import wait_until
from shared.run_fence import fence_redeliveries
from shared import stored_members
from shared.stored_members import count_stored_members
from shared.timeouts import BackstopRequest

PREFIX = f"{NAMESPACE}:sm:"
QUEUE = f"{NAMESPACE}-sm"
WAIT_SECONDS = 60.0  # the most a member waits for "go", or a held member for its kill

BROKER = os.environ.get("SM_BROKER") or broker_url()  # SM_CUT: through the test's link
app = Celery("rcl-stored", broker=BROKER, backend=backend_url(), set_as_current=False)
app.conf.update(
    task_serializer="json", result_serializer="json", accept_content=["json"], result_accept_content=["json"],
    task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1, worker_concurrency=3,
    worker_deduplicate_successful_tasks=True,
    task_default_queue=QUEUE, task_default_exchange=QUEUE, task_default_routing_key=QUEUE,
    result_backend_transport_options={"global_keyprefix": PREFIX},
    broker_connection_retry_on_startup=True, worker_enable_remote_control=False, worker_send_task_events=False)
if os.environ.get("SM_FIX") == "1":
    count_stored_members(app)
if os.environ.get("SM_COLD") == "1":
    app.conf.worker_soft_shutdown_timeout = 0.3  # FM-7 (5.5+), with REMAP_SIGTERM=SIGQUIT in the worker's environment
if os.environ.get("SM_CUT") == "1":
    app.conf.broker_channel_error_retry = True  # FM-9 (5.3+)
    app.conf.worker_cancel_long_running_tasks_on_connection_loss = True  # FM-9 (5.1+)


def shared() -> Any:
    return cast(Any, redis.Redis).from_url(backend_url(), decode_responses=True)


@task_received.connect
def _received(request: Any = None, **_: Any) -> None:
    """In the worker's main process: count each delivery of a member (``received:<key>:<i>``)."""
    if request is not None and request.name in ("sm.member", "sm.timed_member"):
        key, index = cast(list[Any], request.args)
        shared().incr(f"{PREFIX}received:{key}:{index}")


@worker_process_init.connect
def _gate(**_: Any) -> None:
    """In each pool process: hold a member that ``hold:`` names at its place around the count."""
    counted = cast(Callable[..., None], RedisBackend.on_chord_part_return)

    def on_chord_part_return(self: RedisBackend, request: Any, state: Any, result: Any, **kwargs: Any) -> None:
        key, index = cast(list[Any], request.args)
        r = shared()  # one client: a client per look would be closed by the garbage collector, whose ``__del__``
        # swallows the SystemExit a cancel's signal raises there (Python ignores exceptions in finalisers), and the
        # held member would wait on, uncancelled (seen on 5.5.3 under a cold shutdown)
        where = r.get(f"{PREFIX}hold:{key}:{index}")
        if where == "after":
            counted(self, request, state, result, **kwargs)
        if where in ("before", "after"):
            gc.collect()  # no finaliser left to run during the hold (see above)
            r.set(f"{PREFIX}held:{key}:{index}", os.getpid(), ex=300)
            # the test kills or cancels this process here; a test that failed before says so with release:<key>
            wait_until(lambda: bool(r.exists(f"{PREFIX}release:{key}")), WAIT_SECONDS)
        if where != "after":
            counted(self, request, state, result, **kwargs)
        r.incr(f"{PREFIX}counted:{key}")

    setattr(RedisBackend, "on_chord_part_return", on_chord_part_return)
    before_task_publish.connect(_hold_the_body, weak=False)


def _hold_the_body(sender: Any = None, body: Any = None, **_: Any) -> None:
    """In a pool process: the member whose ``hold:`` says ``last`` counted last and now sends the chord's body
    (5.7: holding the dispatch's claim): it is held here, before the body is published, as the gate holds."""
    if sender != "sm.body":
        return
    key = cast(list[Any], cast(tuple[Any, ...], body)[0])[1]
    r = shared()
    if r.get(f"{PREFIX}hold:{key}:0") != "last":
        return
    gc.collect()
    r.set(f"{PREFIX}held:{key}:0", os.getpid(), ex=300)
    wait_until(lambda: bool(r.exists(f"{PREFIX}release:{key}")), WAIT_SECONDS)


@app.task(name="sm.member")
def member(key: str, index: int) -> dict[str, int]:
    r = shared()
    runs = int(r.incr(f"{PREFIX}runs:{key}:{index}"))
    where = r.get(f"{PREFIX}hold:{key}:{index}")
    if where == "signals" and runs == 1:  # its first run holds its signals, as count_stored_members's count does
        with getattr(stored_members, "_signals_held")():  # the primitive's own hold (private to it)
            r.set(f"{PREFIX}held:{key}:{index}", os.getpid(), ex=300)
            wait_until(lambda: bool(r.exists(f"{PREFIX}release:{key}")), WAIT_SECONDS)
    elif where is None:
        wait_until(lambda: bool(r.exists(f"{PREFIX}go:{key}")), WAIT_SECONDS)
    elif where == "last":  # it counts once the others have
        wait_until(lambda: int(r.get(f"{PREFIX}counted:{key}") or 0) >= 2, WAIT_SECONDS)
    return {"index": index}


class UncountedBackstop(BackstopRequest):
    """``BackstopRequest`` before it counted a SUCCESS the pool process stored before its time limit's kill."""

    def _count_stored(self) -> None:
        pass


class CancelBlindBackstop(BackstopRequest):
    """``BackstopRequest`` before it left a request Celery had cancelled unsettled."""

    def _cancelled(self) -> bool:
        return False


def _timed_request() -> type[BackstopRequest]:
    if os.environ.get("SM_FIX") != "1":
        return UncountedBackstop
    return CancelBlindBackstop if os.environ.get("SM_BLIND") == "1" else BackstopRequest


TIME_LIMIT = 2  # a held timed member is killed by Celery's time limit this long after it began


@app.task(name="sm.timed_member", time_limit=TIME_LIMIT,
          Request=_timed_request())
def timed_member(key: str, index: int) -> dict[str, int]:
    return cast(dict[str, int], member(key, index))


@app.task(name="sm.body")
def body(results: list[dict[str, int]], key: str) -> int:
    shared().rpush(f"{PREFIX}bodies:{key}", json.dumps(results))
    return len(results)


if os.environ.get("SM_FENCE") == "1":
    fence_redeliveries(app)  # FM-9's: a redelivered member waits until its first run's process has ended
