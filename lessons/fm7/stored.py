"""FM-7's hard variant: a member ended after its result is stored and before its chord counts it, two ways.

A deploy's SIGKILL at the grace's end (or its cold shutdown's cancel, or FM-9's connection-loss cancel) can land
in the window of every late-acked chord member between ``Backend.mark_as_done``'s store of SUCCESS and its call of
``on_chord_part_return``, which counts the member in the chord's join. The window is short (the count's encoding of
the result), so the run does not wait for a millisecond to hit it: the side chord ``stored``'s marked member
(``lab.faults.HOLD_AFTER_STORE``) is held there by the lab's result backend (``lab.backend``), which records
``stored_uncounted`` (the pool process's pid) in the side's stream and waits for the runner; ``KillAfterStore``
sees it, SIGKILLs that pool process (``killed_after_store``) and tells the backend it acted. The marked member is
then exactly where a SIGKILL in that window leaves it: SUCCESS stored, not counted, its message unacked.

What follows is Celery's: 5.5 and 5.6 requeue the message (reject on worker lost) and its redelivery is acked
without running by ``worker_deduplicate_successful_tasks``; 5.7 acks it at once ("succeeded before the worker was
lost"). Without ``count_stored_members`` (``lessons/fm7/before_hard_fix.py``) no one counts the member: the chord
waits for ever, in silence. With it, the member is counted once.

The second way is FM-7's own fix: the side chord ``cancelled``'s marked member is held there too, and a deploy of
its own (``DeployOnHeld``, after the deploys' three) SIGTERMs the worker that holds it; after the 0.3 s soft wait,
the cold shutdown's ``Request.cancel`` ends its process there. The
stored state stays SUCCESS (claim C38 reads it on each version), so the redelivery is deduplicated like the
SIGKILLed member's, and only ``count_stored_members`` counts it. The same two
ways, and FM-9's connection-loss cancel, are claims C38 to C42 (``tests/test_stored_members.py``) on each version.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from lab.backend import held_ended, release_held
from lab.injector import Injector, RunView, SideView
from lab.waiting import wait_until
from lab.workers import KILL_WAIT_SECONDS, Worker, group_alive, pid_alive, signal_group
from lessons.fm7.deploy import GRACE_SECONDS, RollingDeploy

STORED = "stored"
"""The side chord's tag."""
CANCELLED = "cancelled"
"""The side chord whose marked member a deploy's cold shutdown cancels after its store."""


class KillAfterStore(Injector):
    """SIGKILL the pool process of a member the backend holds between its store and its count (see above)."""

    def __init__(self) -> None:
        self.done: set[str] = set()

    def step(self, run: RunView) -> None:
        side = run.side(STORED)
        if side is None or not side.sent:
            return
        reader = side.reader
        for e in reader.events():
            doc = e.get("doc")
            if e.kind != "stored_uncounted" or doc in self.done:
                continue
            self.done.add(doc)
            pid = int(e.get("pid"))
            alive = pid_alive(pid)
            if alive:
                os.kill(pid, signal.SIGKILL)  # the grace's SIGKILL, landing after the store and before the count
            reader.rec.event("killed_after_store", doc=doc, task=e.get("task"), child=str(pid),
                             killed="yes" if alive else "no: gone already")
            release_held(reader.rec, doc)  # the held member, if alive, goes on


class DeployOnHeld:
    """One more deploy, after ``RollingDeploy``'s, aimed at the side ``cancelled``'s held member (see above).

    A member is held inside its task's ``time_limit`` (3 s from its start), longer than a new worker's boot on a
    loaded machine, so the new worker is started first; once it consumes, the side is sent (``ready``); the member
    is held on whichever of the two took it, and that worker's main process gets the SIGTERM (the other serves on),
    then SIGKILL at the grace's end if it has not exited. Recorded in the side's stream: ``held_deploy_term``,
    ``held_deploy_end``, then ``ended_after_store`` once the held process is gone; ``held_deploy_missed`` when the held
    process was gone before its worker was found."""

    def __init__(self, deploy: RollingDeploy) -> None:
        self.deploy = deploy
        self.state = "idle"  # idle -> booting -> ready -> terminated -> gone -> done
        self.extra: Worker | None = None
        self.holder: Worker | None = None
        self.held_pid = 0
        self.term_at = 0.0

    def ready(self) -> bool:
        return self.state in ("ready", "terminated", "gone", "done")

    def busy(self) -> bool:
        """Its deploy is under way: the run waits for it to be recorded, even once every chord is done."""
        return self.state in ("terminated", "gone")

    def step(self, side: SideView | None, deploys_over: bool) -> None:
        """``deploys_over``: the deploys' side chord has completed (on a loaded machine its documents may all end
        before the third deploy: that deploy's new worker, booted or booting, is then this one's)."""
        deploy = self.deploy
        if side is None or not (deploy.done or (deploys_over and deploy.old is None)):
            return
        if self.state == "idle":
            if deploy.new is not None:  # a deploy that found no moment before its documents ended: its new worker
                self.extra, deploy.new = deploy.new, None
            else:
                self.extra = deploy.spawn("deploy-held")
                deploy.workers.append(self.extra)
            deploy.state = "done"  # no rolling deploy after this one
            self.state = "booting"
        elif self.state == "booting":
            if deploy.consumers() >= 2:
                self.state = "ready"
        elif self.state == "ready" and side.sent:
            self._terminate_holder(side)
        elif self.state == "terminated" and self.holder is not None and self.holder.proc is not None:
            proc = self.holder.proc
            exited = proc.poll() is not None
            if not exited and time.time() - self.term_at < GRACE_SECONDS:
                return
            side.reader.rec.event("held_deploy_end", old=self.holder.name, seconds=f"{time.time() - self.term_at:.3f}",
                                  end="exited" if exited else "SIGKILLed")
            signal_group(proc.pid, signal.SIGKILL)  # what is left of the container goes with it
            proc.wait()
            wait_until(lambda: not group_alive(proc.pid), KILL_WAIT_SECONDS)
            self.state = "gone"
        if self.state == "gone" and not pid_alive(self.held_pid):  # at once: the run may end before the next look
            held_ended(side.reader.rec, side_doc(side), self.held_pid)
            self.state = "done"

    def _terminate_holder(self, side: SideView) -> None:
        held = [e for e in side.reader.events() if e.kind == "stored_uncounted"]
        if not held:
            return
        self.held_pid = int(held[0].get("pid"))
        parent = parent_pid(self.held_pid)
        if parent == 0:
            # gone before a deploy came (its time limit, on a machine too loaded to send the side in time): G7 says so
            side.reader.rec.event("held_deploy_missed", doc=side_doc(side), child=str(self.held_pid))
            self.state = "done"
            return
        workers = [w for w in (self.deploy.current, self.extra) if w is not None and w.proc is not None]
        holder = next((w for w in workers if w.proc is not None and w.proc.pid == parent), None)
        if holder is None or holder.proc is None:
            return  # its parent not read yet
        other = next(w for w in workers if w is not holder)
        self.deploy.current, self.holder = other, holder  # the other one serves from now on
        sent = time.time()
        os.kill(holder.proc.pid, signal.SIGTERM)  # the main process only, as Kubernetes does
        self.term_at = time.time()
        side.reader.rec.event("held_deploy_term", old=holder.name, old_pid=holder.proc.pid, sent=repr(sent),
                              doc=side_doc(side), child=str(self.held_pid))
        self.state = "terminated"


def side_doc(side: SideView) -> str:
    """The held member of the side ``cancelled`` (its first document)."""
    return side.docs[0]


def parent_pid(pid: int) -> int:
    """The parent of process ``pid`` (0 when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])
