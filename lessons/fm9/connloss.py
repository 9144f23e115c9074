"""Scenario 9: the broker drops the worker's connection, and a member outlives ``consumer_timeout``.

Neither may touch the shared broker (DESIGN.md §4), so scenario 9's two side chords run on a RabbitMQ
node the lab owns (``lab.owned.OwnedRabbit``: its own node name, ports and data under ``.lab/``), started
with a consumer timeout of ``CONSUMER_TIMEOUT_MS`` checked every ``TICK_MS`` (RabbitMQ 3.10 checks it on
the channel's tick, 60 s by default), and are served by a second worker of the same FM, which reaches
that node through a ``lab.link.BrokerLink`` and is told the node's timeout (``RCL_CONSUMER_TIMEOUT``).
The main worker, the main chord and the other sides stay on the shared broker.

- ``connloss``: one slow member and two quick ones. Once the slow one's parse has run ``CUT_AFTER``
  seconds with nothing else of the side running, the runner cuts the link: the worker's connections end
  as in a network blip, RabbitMQ requeues the running member's message and the worker reconnects through
  the link at once, with a pool slot free for the redelivery while the first run goes on.
- ``overlong``: a member stuck in C code (``C_HANG``), which only Celery's ``time_limit`` ends, and a slow
  one. fm6's ``time_limit`` (3 s) is above the node's consumer timeout, so without FM-9's fix the broker
  closes the worker's channel (406 PRECONDITION_FAILED) first.

``LinkedBroker`` records ``link_cut`` (how many connections, which member ran) and ``worker_exit`` (the
second worker's exit status) in the side's stream, which ``lab.checks`` reads for G9 and S9.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator
from contextlib import contextmanager
from typing import Any

from celery import Celery
from kombu import Connection

from lab.backend import held_ended
from lab.fm import Fm
from lab.link import BrokerLink
from lab.observe import Reader
from lab.owned import OwnedRabbit, stop_leftovers
from lab.owned_shared import unshare
from lab.queues import queue_consumers
from lab.waiting import wait_until
from lab.workers import READY_TIMEOUT, Worker, WorkerFailed, pid_alive

OWNED_NAME = "broker"
"""The owned node's name, then the id of the run that starts it (the runs of scenario 9 made at once share it:
``lab.owned_shared``)."""
CONSUMER_TIMEOUT_MS = 2400
"""The owned node's ``consumer_timeout``: below fm6's ``time_limit`` (3 s) by more than a tick and the
time a delivery takes to reach the pool, so that a member stuck in C code meets it first on fm8's code;
twice fm9's limits on that node (``shared.consumer_timeout``: 1.2 s), so that on fm9's the kill comes
first, by over a second."""
TICK_MS = 100
"""The owned node's ``channel_tick_interval``: how often a channel checks the consumer timeout."""
CUT_AFTER = 0.1
"""The cut comes once the side's slow member has run this long alone (its body takes 0.8 s)."""
LINKED = "linked"
"""The second worker's part name (its log: ``<label>-linked-<run id>.log``)."""


def point_broker(app: Celery, url: str) -> None:
    """Make ``app`` (in this process) send to ``url`` from now on: the connection and producer pools are
    built from ``broker_url`` when first used and kept; dropped here, as Celery does after a fork
    (``Celery._after_fork``, 5.5 to 5.7)."""
    found: Any = app
    app.conf.update(broker_url=url)
    found._pool = None
    amqp: Any = found.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None


class LinkedBroker:
    """The owned node, the link to it and the worker it serves, for one run (see the module's docstring)."""

    def __init__(self, fm: Fm, node: OwnedRabbit, link: BrokerLink, spawn: Callable[[dict[str, str]], Worker]) -> None:
        self.fm, self.node, self.link, self.spawn = fm, node, link, spawn
        self.worker: Worker | None = None
        self.shared = str(fm.app.conf.broker_url)
        self.cut_done = False
        self.exit_seen = False

    @contextmanager
    def pointed(self) -> Generator[None, None, None]:
        """The harness's app sends to the owned node meanwhile (its results stay where they were)."""
        point_broker(self.fm.app, self.node.url)
        try:
            yield
        finally:
            point_broker(self.fm.app, self.shared)

    def submit(self, send: Callable[[], None]) -> None:
        """Send a side chord to the owned node, its worker started and ready first."""
        with self.pointed():
            if self.worker is None:
                self.worker = self.spawn({"CELERY_BROKER_URL": self.link.url(self.node.url),
                                          "RCL_CONSUMER_TIMEOUT": f"{CONSUMER_TIMEOUT_MS / 1000:g}"})
                self.worker.wait_ready()
            send()

    def start_worker(self, timeout: float = READY_TIMEOUT) -> None:
        """Start its worker and wait until the node counts its consumer on the program's task queue. It publishes
        nothing and leaves the harness's app alone, so it may run on a thread while the run goes on (``submit``
        then finds the worker started)."""
        worker = self.spawn({"CELERY_BROKER_URL": self.link.url(self.node.url),
                             "RCL_CONSUMER_TIMEOUT": f"{CONSUMER_TIMEOUT_MS / 1000:g}"})
        self.worker = worker
        name = str(self.fm.task_queues[0].name)

        def consuming() -> bool:
            proc = worker.proc
            if proc is not None and proc.poll() is not None:
                raise WorkerFailed(f"the worker {worker.name} exited ({proc.returncode}) before it consumed; log tail:\n"
                                   f"{worker.tail()}")
            return queue_consumers(conn, name) >= 1

        with Connection(self.node.url) as conn:
            if not wait_until(consuming, timeout, interval=0.05, interruptible=False):
                raise WorkerFailed(f"the worker {worker.name} did not consume within {timeout:.0f}s; log tail:\n{worker.tail()}")

    def step(self, side: Reader, drop: bool) -> None:
        """One look at a side served here: its worker's exit, and (``drop``) the cut when its moment came."""
        worker = self.worker
        if worker is not None and worker.proc is not None and not self.exit_seen and worker.proc.poll() is not None:
            self.exit_seen = True
            side.rec.event("worker_exit", code=str(worker.proc.returncode))
        if not drop or self.cut_done:
            return
        events = side.events()
        ended = {(e.get("doc"), e.get("attempt")) for e in events if e.kind == "attempt_end"}
        running = [e for e in events if e.kind == "attempt_start" and (e.get("doc"), e.get("attempt")) not in ended]
        if len(running) == 1 and time.time() - running[0].t >= CUT_AFTER:
            self.cut_done = True
            side.rec.event("link_cut", connections=str(self.link.cut()), running=running[0].get("doc"))

    def cut_when_held(self, side: Reader) -> None:
        """The side ``cutstored``: cut the link once its member is held after its store (``stored_uncounted``, the
        lab's result backend: ``lab.backend``), record ``ended_after_store`` once that process is gone (Celery's
        connection-loss cancel), and release the hold."""
        events = side.events()
        held = [e for e in events if e.kind == "stored_uncounted"]
        if not held:
            return
        doc, pid = held[0].get("doc"), int(held[0].get("pid"))
        if not any(e.kind == "link_cut" for e in events):
            side.rec.event("link_cut", connections=str(self.link.cut()), running=doc, held="1")
        elif not any(e.kind == "ended_after_store" for e in events) and not pid_alive(pid):
            held_ended(side.rec, doc, pid)

    def close(self, grace: float) -> None:
        """Its worker stopped, the link closed, and the node given back (``lab.owned_shared.unshare``: stopped and its
        data removed, unless another run of this process still uses it)."""
        try:
            if self.worker is not None:
                self.worker.stop(grace)
        finally:
            self.link.close()
            unshare(self.node)


@contextmanager
def linked_broker(fm: Fm, run_id: str, spawn: Callable[[dict[str, str]], Worker],
                  grace: float) -> Generator[LinkedBroker, None, None]:
    """A started ``LinkedBroker`` for the run; everything of it stopped and removed at the end."""
    stop_leftovers(orphans_only=True)  # what a killed run left running
    node = OwnedRabbit(f"{OWNED_NAME}-{run_id}", consumer_timeout=CONSUMER_TIMEOUT_MS, channel_tick_interval=TICK_MS)
    node.start()
    broker = LinkedBroker(fm, node, BrokerLink.to(node.url), spawn)
    try:
        yield broker
    finally:
        broker.close(grace)
