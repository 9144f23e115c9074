"""Scenario 8: the result backend goes away mid-chord, at moments read off the run.

The run's result backend is a Redis the lab owns (``lab.owned``: its own ``redis-server``, its own
port, the append-only file fsynced on every write, so a stop and a start keep every key), never
the shared one (DESIGN.md §4). ``owned_backend`` starts it and points the FM's app at it for one
run: the worker gets it as ``CELERY_RESULT_BACKEND`` and keeps the lab's observations on the shared
Redis (``RCL_OBSERVATIONS_URL``), so the run can be read while its backend is gone; in the harness's
own process the app's backend is rebuilt on the owned URL, then on the shared one again.

``BackendOutage`` stops and starts that server twice while the side chord ``outage`` (slow but
healthy documents, sent once the rest of the run is over) runs:

1. ``members``: once ``MEMBERS_ENDED`` parse bodies of the side have ended and more still run, so
   that the running ones end while the backend is gone and their results cannot be stored; it
   starts again once ``OUTAGE_SECONDS`` have passed and at least one store failed (the observer's
   ``store_failed``), or after ``OUTAGE_MAX_SECONDS`` whatever happened;
2. ``notify``: the side's mail API holds the chord body's call (the lab's gate, FM-4's) until the
   backend is stopped: ``notify`` holds its claim and sends while the claim's Redis is gone, so
   marking the claim sent fails; the server starts again once ``OUTAGE_SECONDS`` have passed and
   that ``notify`` has ended (``notify_retry``, its retry sent, or ``notify_end``), or after
   ``OUTAGE_MAX_SECONDS``.

Each outage ends as soon as what it is for has happened: every second of it is a second of the
last lessons' runs (the side runs after the deploys', as it stops the backend every side stores in).

Each stop and start is an event of the side's stream (``backend_down``, ``backend_up``, with the
phase; ``backend_up`` says ``since`` when the server was started, before it answered and the event was
written, as a waiting task may already have used it), which the checks read (``lab.checks``: G8's bound
is counted from the last return).
While the backend is down the runner reads nothing from it (``down``): every look at a result
waits for its return, as a submitter's ``result.get()`` would.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Generator
from contextlib import contextmanager
from typing import Any, cast

from celery import Celery

from lab.fm import Fm
from lab.observe import Reader
from lab.owned import OwnedRedis, stop_leftovers
from lab.settings import observations_url

OWNED_NAME = "backend"
"""The owned server's name, then the run's id (``.lab/<namespace>/owned/redis-backend-<run id>/``): two runs
of scenario 8 at once (``--jobs``: fm8 on its code and on fm7's) each have their own."""
MEMBERS_ENDED = 2
"""The members phase stops the backend once this many of the side's parse bodies have ended."""
OUTAGE_SECONDS = 2.0
"""How long each outage lasts at least: longer than a slow document's parse (0.8 s) and than the
backend client's own retries (``lab.app.BACKEND_RETRY_POLICY``: 1.5 s), so that a store begun in it
fails rather than waits the outage out; each phase also waits for its failure to be seen."""
OUTAGE_MAX_SECONDS = 10.0
"""An outage ends by then whatever the run shows (a loaded machine may start no body in time)."""


def point_backend(app: Celery, url: str) -> None:
    """Make ``app`` (in this process) store and read its results at ``url`` from now on.

    Celery builds ``app.backend`` once per thread from ``app.backend_cls`` (the URL ``Celery(backend=...)``
    was given) before ``result_backend`` (``celery.app.base.Celery._get_backend``, 5.5 to 5.7), and keeps
    it (``_backend_cache`` for a thread-safe backend, else ``_local``): both are set, and the cached
    backend dropped, so the next use builds one on ``url``."""
    found: Any = app
    found.backend_cls = url
    app.conf.update(result_backend=url)
    if getattr(found, "_backend_cache", None) is not None:
        found._backend_cache = None
    cached = cast(dict[str, Any], vars(found._local))
    cached.pop("backend", None)


@contextmanager
def owned_backend(fm: Fm, run_id: str, persist: bool = True) -> Generator[tuple[Fm, OwnedRedis], None, None]:
    """``fm`` with its result backend on a started ``OwnedRedis`` of the run's own (see the module's
    docstring); the server is removed (stopped, its data deleted) and the app pointed back at the end."""
    stop_leftovers(orphans_only=True)  # what a killed run left running
    server = OwnedRedis(f"{OWNED_NAME}-{run_id}", persist=persist)
    server.start()
    shared = str(fm.app.conf.result_backend)
    env = (("CELERY_RESULT_BACKEND", server.url), ("RCL_OBSERVATIONS_URL", observations_url()))
    point_backend(fm.app, server.url)
    try:
        yield dataclasses.replace(fm, worker_env=(*fm.worker_env, *env)), server
    finally:
        _forget_subscriptions(fm.app)
        point_backend(fm.app, shared)
        server.remove()


def _forget_subscriptions(app: Celery) -> None:
    """Close the owned backend's result subscriptions while its server still runs.

    The Redis backend subscribes to a task's result channel when the task is sent
    (``RedisBackend.on_task_call``), and each ``AsyncResult`` unsubscribes when it is garbage
    collected (``AsyncResult.__del__``, ``ResultConsumer.cancel_for``). One that outlives the
    server would reconnect to a port nobody serves: on 5.5 with no end (seen: the harness hung in
    ``retry_over_time``). ``cancel_for`` does nothing once the consumer has no pubsub (5.5 to 5.7)."""
    consumer: Any = getattr(cast(Any, app).backend, "result_consumer", None)
    if consumer is None:
        return
    try:
        consumer.stop()
    except Exception:  # a pubsub that is already broken has nothing left to close
        pass
    consumer._pubsub = None


class BackendOutage:
    """The two outages of scenario 8, stepped by the runner while the side ``outage`` runs."""

    def __init__(self, server: OwnedRedis) -> None:
        self.server = server
        self.phase = "members"  # then "notify", then "done"
        self.down_since: float | None = None
        self.gate_set = False

    @property
    def down(self) -> bool:
        return self.down_since is not None

    def step(self, side: Reader) -> None:
        """One look at the side's record: stop or start the backend when its moment has come."""
        if not self.gate_set:  # the side's mail API waits for the runner (lab.pipeline.send_email)
            side.rec.put("gated", "1")
            self.gate_set = True
        events = side.events()
        if self.down_since is None:
            if self.phase == "members":
                ended = sum(1 for e in events if e.kind == "attempt_end")
                running = sum(1 for e in events if e.kind == "attempt_start") - ended
                if ended >= MEMBERS_ENDED and running > 0:
                    self._stop(side)
            elif self.phase == "notify" and any(e.kind == "gate_wait" for e in events):
                self._stop(side)
                side.rec.open_gate()  # it sends, then cannot mark its claim sent
            return
        held = time.monotonic() - self.down_since
        kinds = ("store_failed",) if self.phase == "members" else ("notify_retry", "notify_end")  # what it is for
        failed = any(e.kind in kinds and e.t >= self.down_wall for e in events)
        if held >= OUTAGE_MAX_SECONDS or (held >= OUTAGE_SECONDS and failed):
            starting = time.time()  # the return: workers may use it before start() has seen it answer
            self.server.start()
            side.rec.event("backend_up", phase=self.phase, seconds=f"{held:.2f}", since=repr(starting))
            self.down_since = None
            self.phase = "notify" if self.phase == "members" else "done"

    def _stop(self, side: Reader) -> None:
        self.server.stop()
        self.down_since, self.down_wall = time.monotonic(), time.time()
        side.rec.event("backend_down", phase=self.phase)

    def close(self) -> None:
        """The run ended (or failed): the backend answers again, for what the harness reads after."""
        if self.down_since is not None:
            self.server.start()
            self.down_since = None
