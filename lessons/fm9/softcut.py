"""FM-9's second hard variant: the broker connection drops during a cold shutdown's soft wait (FM-7's).

While a worker's main process sleeps in ``WorkController.wait_for_soft_shutdown`` (inside its signal handler),
Celery's connection-loss handling cannot run, so FM-9's cancel does not fire: RabbitMQ requeues the running
message, another worker starts it, and the first body runs on until the wait is over (``shared/soft_wait.py``).

The side chord ``softcut``, on the lab's own node after ``overlong`` (``lessons.fm9.connloss``), one slow member.
Two workers serve it, each through a link of its own: the node's linked worker and a spare one started for this
side, so that whichever runs the slow member, the other is there, with free pool slots, to take its message back.
``SoftWaitCut.step``, acting on what the run shows:

1. the slow member's parse began at most ``FRESH_SECONDS`` ago on one of the two: SIGTERM to that worker's main
   process (a cold shutdown: fm9 sets ``REMAP_SIGTERM=SIGQUIT`` and a soft wait of 0.3 s), ``soft_term``;
2. that worker's observer records ``soft_wait`` (the wait has begun, with the member among the requests its cancel
   will reach): its link is cut, ``soft_cut``. The body has 0.5 s of work left at least, the wait 0.3 s at most:
   without a cancel at the cut, the requeued copy starts on the other worker while the first one still runs.

Nothing is timed against a race: the SIGTERM follows the body's start, the cut follows the soft wait's start, and
on the code before the fix the body runs on for the rest of the wait (about 0.25 s) after the cut.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

from kombu import Connection

from lab.link import BrokerLink
from lab.observe import Reader
from lab.owned import OwnedRabbit
from lab.queues import queue_consumers
from lab.waiting import wait_until
from lab.workers import READY_TIMEOUT, Worker, WorkerFailed

SOFTCUT = "softcut"
"""The side chord's tag."""
SOFTCUT_DOC = "doc85"
"""Its slow member."""
SPARE = "spare"
"""The spare worker's part name (its log: ``<label>-spare-<run id>.log``)."""
FRESH_SECONDS = 0.25
"""The SIGTERM goes to a worker whose slow member began at most this long ago (its body takes 0.8 s, the soft wait
0.3 s): the wait ends, and its cancel comes, while the body still has work left."""
EXIT_SECONDS = 10.0
"""The stopped worker exits by itself within this (its cold shutdown), or it is stopped (``soft_exit``, killed)."""
SOFT_WAIT_SECONDS = 2.0
"""After the SIGTERM, the soft wait is seen within this, or the run says it missed it (``soft_missed``)."""


class SoftWaitCut:
    """The spare worker and its link, and the SIGTERM then cut of the side ``softcut`` (see the module docstring)."""

    def __init__(self, node: OwnedRabbit, queue: str, spawn: Callable[[dict[str, str]], Worker], env: dict[str, str]) -> None:
        self.node, self.queue, self.spawn, self.env = node, queue, spawn, env
        self.link = BrokerLink.to(node.url)
        self.spare: Worker | None = None
        self.starting: threading.Thread | None = None
        self.failed: BaseException | None = None
        self.state = "idle"  # idle -> armed -> termed -> (cut | missed) -> done (the stopped worker gone)
        self.termed: tuple[Worker, BrokerLink, float] | None = None

    def ready(self) -> bool:
        """The spare started (on a thread) and consuming on the node beside the linked worker."""
        if self.starting is None:
            self.starting = threading.Thread(target=self._start, name="softcut-spare", daemon=True)
            self.starting.start()
        if self.starting.is_alive():
            return False
        if self.failed is not None:
            raise self.failed
        return True

    def _start(self) -> None:
        try:
            worker = self.spawn({**self.env, "CELERY_BROKER_URL": self.link.url(self.node.url)})
            self.spare = worker
            with Connection(self.node.url) as conn:
                if not wait_until(lambda: queue_consumers(conn, self.queue) >= 2, READY_TIMEOUT, interval=0.05,
                                  interruptible=False):
                    raise WorkerFailed(f"the spare worker {worker.name} did not consume within {READY_TIMEOUT:.0f}s; "
                                       f"log tail:\n{worker.tail()}")
            self.state = "armed"
        except BaseException as exc:  # said by ready(), on the run's own thread
            self.failed = exc

    def step(self, side: Reader, linked: tuple[Worker, BrokerLink] | None, on_term: Callable[[Worker], None],
             on_exit: Callable[[Worker, Worker | None], bool]) -> None:
        """One look at the side: the SIGTERM when its moment came, the cut once the soft wait has begun, then the
        stopped worker's exit (``on_exit(stopped, spare)`` true: the spare is handed over, no longer stopped here)."""
        if self.state == "armed":
            self._maybe_term(side, linked, on_term)
        elif self.state in ("cut", "missed") and self.termed is not None:
            worker, _, at = self.termed
            proc = worker.proc
            if proc is not None and proc.poll() is None and time.time() - at < EXIT_SECONDS:
                return
            side.rec.event("soft_exit", worker=worker.name, seconds=f"{time.time() - at:.3f}",
                           code=str(proc.returncode) if proc is not None and proc.returncode is not None else "killed")
            worker.stop(0.0)
            if on_exit(worker, self.spare):
                self.spare = None
            self.state = "done"
        elif self.state == "termed" and self.termed is not None:
            worker, link, at = self.termed
            pid = str(worker.proc.pid) if worker.proc is not None else ""
            waits = [e for e in side.events() if e.kind == "soft_wait" and e.get("doc") == SOFTCUT_DOC and e.get("pid") == pid]
            if waits:
                self.state = "cut"
                side.rec.event("soft_cut", worker=worker.name, connections=str(link.cut()), running=SOFTCUT_DOC,
                               after_wait=f"{time.time() - waits[0].t:.3f}")
            elif time.time() - at > SOFT_WAIT_SECONDS:
                self.state = "missed"
                side.rec.event("soft_missed", worker=worker.name, why=f"no soft wait {SOFT_WAIT_SECONDS:.0f}s after the SIGTERM")

    def _maybe_term(self, side: Reader, linked: tuple[Worker, BrokerLink] | None, on_term: Callable[[Worker], None]) -> None:
        events = side.events()
        holder = {e.get("task"): e.get("pid") for e in events if e.kind == "received"}
        ended = {(e.get("doc"), e.get("attempt")) for e in events if e.kind == "attempt_end"}
        starts = [e for e in events if e.kind == "attempt_start" and e.get("doc") == SOFTCUT_DOC
                  and (e.get("doc"), e.get("attempt")) not in ended]
        if not starts:
            return
        if time.time() - starts[-1].t > FRESH_SECONDS:  # looked too late (a loaded machine): nothing to show now
            self.state = "done"
            side.rec.event("soft_missed", why=f"the member began {time.time() - starts[-1].t:.2f}s ago before a look")
            return
        serving = [linked] if linked is not None else []
        if self.spare is not None:
            serving.append((self.spare, self.link))
        pid = holder.get(starts[-1].get("task"), "")
        found = next(((w, link) for w, link in serving if w.proc is not None and str(w.proc.pid) == pid), None)
        if found is None or found[0].proc is None:
            return
        worker, link = found
        on_term(worker)  # its exit is this variant's own doing, not the linked worker failing
        sent = time.time()  # the event's own time comes later: the worker may have recorded its soft wait by then
        os.kill(found[0].proc.pid, signal.SIGTERM)  # its main process only, as a deploy does
        self.termed, self.state = (worker, link, sent), "termed"
        side.rec.event("soft_term", worker=worker.name, pid=str(found[0].proc.pid), running=SOFTCUT_DOC,
                       since=f"{sent - starts[-1].t:.3f}", sent=repr(sent))

    def close(self, grace: float) -> None:
        try:
            if self.starting is not None:
                self.starting.join()
            if self.spare is not None:
                self.spare.stop(grace)
        finally:
            self.link.close()
