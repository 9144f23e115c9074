"""Scenario 7: rolling deploys, done the way Kubernetes does them, at moments read off the run.

One deploy: a new worker of the same code starts (``spawn``); once the broker counts its
consumer on the FM's task queue (it takes work), the old worker's main process, and only it
(Kubernetes signals the container's first process), gets SIGTERM; if it has not exited when
``GRACE_SECONDS`` have passed, its whole process group gets SIGKILL (the container is
killed), and so does what is left of the group once the main process exited by itself.

The moment of each SIGTERM is chosen from what the run shows, never from a timer: the old
worker is running a slow but healthy document (``lab.faults.SLOW``) that started at most
``FRESH_SECONDS`` ago, so its body cannot end within the grace; when one of the run's running
messages has been delivered more often than the others (cut by an earlier deploy), that one, so
that a deploy cuts the same document again (the one to dead-letter, innocent, at its delivery
limit); and when the old worker holds messages it has not started (its prefetch), one of them
is the one the broker has delivered most often so far (``x-delivery-count``, from the
observer's ``received`` events): a deploy takes that one back once more. If no such moment
comes within ``ARMED_SECONDS``, the next fresh slow document will do. The next deploy's new
worker starts as soon as the old one is told to stop (a rollout that follows another), and
counts as ready once the old one is gone.

What a deploy records, in the side chord's event stream: ``deploy_term`` (which worker,
what it ran and held, and ``sent``: when the SIGTERM was sent), then ``deploy_exit`` (the old main process exited by itself) or
``deploy_kill`` (SIGKILL at the grace's end, with the documents whose body was still
running in a live pool process then: their work is lost).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

from kombu import Connection

from lab.fm import Fm
from lab.observe import Event, Reader
from lab.queues import queue_consumers
from lab.workers import KILL_WAIT_SECONDS, Worker, WorkerFailed, group_alive, pid_alive, signal_group
from lab.waiting import wait_until

GRACE_SECONDS = 0.5
"""SIGTERM, then SIGKILL this long after (Kubernetes' ``terminationGracePeriodSeconds``, scaled down):
shorter than a slow document's parse (``lab.faults.SLOW_SECONDS``), and so shorter than Celery's own stop
(claim C18: 1 s at least), which is why an old worker is SIGKILLed even when it runs nothing by then."""
FRESH_SECONDS = 0.2
"""A slow document that started at most this long ago cannot end within the grace."""
ARMED_SECONDS = 2.0
"""How long a deploy waits for a moment when the old worker holds the most delivered message."""


@dataclass
class _Held:
    """One message as the run saw it: who holds it, since when, and what its body did there."""

    doc: str
    holder: str  # the pid of the main process of the worker that received it last
    received: float
    returned: int  # deliveries before this one, as the broker counts them
    started: float | None = None
    child: str = ""  # the pool process that runs its body
    ended: bool = False


def held(events: list[Event]) -> dict[str, _Held]:
    """Each parse message (by task id) as it stands: the last worker that received it, and its body there."""
    out: dict[str, _Held] = {}
    for e in events:
        task = e.get("task")
        if e.kind == "received":
            out[task] = _Held(e.get("doc"), e.get("pid"), e.t, int(e.get("returned") or 0))
        elif e.kind == "attempt_start" and task in out:
            out[task].started, out[task].child, out[task].ended = e.t, e.get("pid"), False
        elif e.kind == "attempt_end" and task in out:
            out[task].ended = True
    return out


class RollingDeploy:
    """``count`` deploys of ``fm``'s worker, one after the other, driven by ``step()``."""

    def __init__(self, fm: Fm, first: Worker, spawn: Callable[[str], Worker], count: int,
                 grace: float = GRACE_SECONDS) -> None:
        self.fm, self.spawn, self.count, self.grace = fm, spawn, count, grace
        self.current = first  # the worker that serves
        self.new: Worker | None = None  # started, not yet serving
        self.old: Worker | None = None  # told to stop
        self.workers: list[Worker] = [first]
        self.done_deploys = 0
        self.state = "waiting"  # waiting -> booting -> armed -> (booting ... | finishing -> done)
        self.since = 0.0
        self.term_at = 0.0
        self.conn: Connection | None = None

    @property
    def done(self) -> bool:
        return self.state == "done"

    def close(self) -> None:
        if self.conn is not None:
            self.conn.release()
            self.conn = None

    def watch(self) -> None:
        """Raise ``WorkerFailed`` when a worker that should serve has exited."""
        for worker in (self.current, self.new):
            proc = worker.proc if worker is not None else None
            if worker is not None and proc is not None and proc.poll() is not None:
                raise WorkerFailed(f"the worker {worker.name} exited ({proc.returncode}) during the run; log tail:\n"
                                   f"{worker.tail()}")

    def consumers(self) -> int:
        """Consumers on the program's task queue, as the broker counts them."""
        if self.conn is None:
            self.conn = self.fm.app.connection_for_write()
        return queue_consumers(self.conn, str(self.fm.task_queues[0].name))

    def step(self, reader: Reader) -> None:
        """One look: start, arm or signal the deploy in progress, and end the old worker's grace."""
        now = time.time()
        if self.old is not None:
            self._maybe_gone(reader, now)
        if self.state == "waiting":  # the side chord is sent: the next version rolls out
            self._spawn(reader, now)
        elif self.state == "booting":
            # The new worker consumes (Kubernetes' readiness); counted once the last old one is gone.
            if self.old is None and self.consumers() >= 2:
                self.state, self.since = "armed", now
        elif self.state == "armed":
            self._maybe_terminate(reader, now)
        elif self.state == "finishing" and self.old is None:
            self.state = "done"

    def _spawn(self, reader: Reader, now: float) -> None:
        self.new = self.spawn(f"deploy{self.done_deploys + 1}")
        self.workers.append(self.new)
        self.state, self.since = "booting", now
        reader.rec.event("deploy_start", n=self.done_deploys + 1, new=self.new.name)

    def _maybe_terminate(self, reader: Reader, now: float) -> None:
        old, new = self.current, self.new
        if old.proc is None or new is None:  # nothing to deploy from or to (the run is being stopped)
            return
        pid = str(old.proc.pid)
        messages = held(reader.events())
        mine = {t: h for t, h in messages.items() if h.holder == pid}
        running = {t: h for t, h in mine.items() if h.started is not None and not h.ended}
        waiting = {t: h for t, h in mine.items() if h.started is None}
        patient = now - self.since < ARMED_SECONDS
        fresh = [h for h in running.values() if h.started is not None and now - h.started <= FRESH_SECONDS]
        cut = max((h.returned for h in messages.values() if h.started is not None and not h.ended), default=0)
        if fresh and max(h.returned for h in fresh) < cut and patient:
            return  # the running message delivered most often (cut before) is elsewhere: wait for it to come here
        if not fresh:
            return
        most = max((h.returned for h in messages.values() if h.started is None), default=0)
        if waiting and max(h.returned for h in waiting.values()) < most and patient:
            return  # the most delivered waiting message is elsewhere: wait for it to come here
        sent = time.time()  # the event's own time comes later: the old worker may have answered the signal by then
        os.kill(old.proc.pid, signal.SIGTERM)  # the main process only, as Kubernetes does
        self.term_at = time.time()
        self.done_deploys += 1
        reader.rec.event("deploy_term", n=self.done_deploys, old=old.name, old_pid=old.proc.pid, new=new.name, sent=repr(sent),
                         running=",".join(sorted(h.doc for h in running.values())),
                         waiting=",".join(sorted(f"{h.doc}:{h.returned}" for h in waiting.values())))
        self.old, self.current, self.new = old, new, None
        if self.done_deploys < self.count:
            self._spawn(reader, time.time())  # the next version starts while this one drains
        else:
            self.state = "finishing"

    def _maybe_gone(self, reader: Reader, now: float) -> None:
        old = self.old
        if old is None or old.proc is None:
            self.old = None
            return
        proc = old.proc
        if proc.poll() is not None:
            reader.rec.event("deploy_exit", n=self.done_deploys, old=old.name, seconds=f"{now - self.term_at:.3f}")
        elif now - self.term_at >= self.grace:
            pid = str(proc.pid)
            lost = sorted(h.doc for h in held(reader.events()).values()
                          if h.holder == pid and h.started is not None and not h.ended and h.child.isdigit() and pid_alive(int(h.child)))
            reader.rec.event("deploy_kill", n=self.done_deploys, old=old.name, seconds=f"{now - self.term_at:.3f}",
                             lost=",".join(lost))  # recorded first: nothing of it can run again before this
            signal_group(proc.pid, signal.SIGKILL)
        else:
            return
        signal_group(proc.pid, signal.SIGKILL)  # what is left of the container goes with it
        proc.wait()
        wait_until(lambda: not group_alive(proc.pid), KILL_WAIT_SECONDS)
        self.old = None
