"""FM-7 by hand: the attendee deploys, the submitter cues each step and sees it happen (``lab.hand``).

1. ``start the new version``: when the side chord ``deploy`` is due, the submitter prints the worker's own command with
   ``-n new@%h`` (a second shell, same folder, same exports) and waits, before it sends the slow documents, until the
   broker counts a second consumer on the task queue (Kubernetes' readiness: the new version takes work);
2. ``SIGTERM the old worker``: once it has taken one of the slow documents, ``python -m lab.hand stop-worker <pid>``
   (SIGTERM, then SIGKILL at the grace's end, as a deploy does: ``lab.hand`` says why a bare ``kill -TERM`` is not
   enough), the pid of the worker that served the run until then (its main process, as the observer's ``received``
   events name it: this namespace's worker, never one found by a name pattern); seen once that process is gone while
   slow documents were still to end.

The slow documents take about 6 s on two workers: have the ``kill`` typed when step 1 is seen. A step not done within
its deadline is said as missing; G7 then fails, naming it.
"""

from __future__ import annotations

import time

from lab.hand import STOP_GRACE_SECONDS, Hand, HandInjector, Steps, consumers, pid_gone, stop_command, worker_pids
from lab.injector import RunView, SideView

NEW = "start the new version"
TERM = "SIGTERM the old worker"
LOOK_SECONDS = 0.25
"""How often the broker is asked for the queue's consumers."""


class HandDeploy(HandInjector):
    """The deploy by hand while the side ``deploy`` runs (see the module docstring)."""

    steps = 2

    def __init__(self, hand: Hand) -> None:
        super().__init__(hand)
        self.say = Steps(hand, self.steps, "the deploy")
        self.old = ""
        self.looked = 0.0
        self.term_cued = False

    def _queue(self) -> str:
        return str(self.hand.fm.task_queues[0].name)

    def ready(self, run: RunView, side: SideView) -> bool:
        if side.tag != "deploy":  # the hard variant's side ``cancelled``: no deploy is aimed at its member by hand
            return True
        now = time.monotonic()
        if NEW not in self.say.cued:
            pids = worker_pids(run.reader.events())
            self.old = pids[-1] if pids else ""
            self.say.cue(side.reader, NEW, f"start the new version of the worker in a second shell (same folder, same "
                         f"exports as the first); then have `{stop_command(self.old or '<pid>')}` typed in a shell",
                         f"{self.hand.fm.worker_command()} -n new@%h", now)
        if NEW in self.say.done:
            return True
        if self.say.late(NEW, now):
            self.say.missed(side.reader, NEW, f"no second consumer on {self._queue()} within {self.hand.seconds:.0f}s "
                            "of the cue")
            return True
        if now - self.looked >= LOOK_SECONDS:
            self.looked = now
            if (n := consumers(self.hand.fm)) >= 2:
                self.say.seen(side.reader, NEW, f"{n} consumers on {self._queue()}: the new version takes work")
                return True
        return False

    def step(self, run: RunView) -> None:
        side = run.side("deploy")
        if side is None or not side.sent or TERM in self.say.done:
            return
        now = time.monotonic()
        events = side.reader.events()
        if not self.term_cued:
            if NEW not in self.say.ok or not self.old:
                self.term_cued = True
                self.say.missed(side.reader, TERM, "no new version to deploy to, so no old worker to stop")
                return
            if not any(e.kind == "received" and e.get("pid") == self.old for e in events):
                if any(e.kind == "notify_start" for e in events):
                    self.term_cued = True
                    self.say.missed(side.reader, TERM, f"the old worker {self.old} took none of the slow documents")
                return  # the moment: the old worker holds one of them (it may still finish the run's last work)
            self.term_cued = True
            self.say.cue(side.reader, TERM, f"SIGTERM the old worker now (pid {self.old}, the one that ran the run so "
                         f"far), while the slow documents run (about 6 s); the command SIGKILLs what is left of it "
                         f"{STOP_GRACE_SECONDS:.0f} s later, as Kubernetes does at the grace's end",
                         stop_command(self.old), now)
            return
        if pid_gone(self.old):
            ended = sum(1 for e in events if e.kind == "attempt_end" and e.get("outcome") == "ok")
            if ended < len(side.docs):
                self.say.seen(side.reader, TERM, f"worker {self.old} is gone, {now - self.say.cued[TERM]:.1f}s after the "
                              f"cue, with {len(side.docs) - ended} of {len(side.docs)} slow documents still to end")
            else:
                self.say.missed(side.reader, TERM, f"worker {self.old} went away only after every slow document had ended")
        elif any(e.kind == "notify_start" for e in events):
            self.say.missed(side.reader, TERM, f"worker {self.old} was still running when every slow document had ended "
                            "(SIGTERM it while they run)")
        elif self.say.late(TERM, now):
            self.say.missed(side.reader, TERM, f"worker {self.old} still runs {self.hand.seconds:.0f}s after the cue")

    def busy(self, run: RunView) -> bool:
        return self.term_cued and TERM not in self.say.done
