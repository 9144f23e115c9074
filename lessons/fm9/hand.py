"""FM-9 by hand: the attendee cuts the worker's broker connection, cued by the submitter (``lab.hand``).

Before the run: the worker reaches the broker through the lab's link (``python -m lab.link`` in a shell of its own,
its ``export CELERY_BROKER_URL=...`` in each worker's shell, not the submitter's); ``unmet`` prints the commands when no
link runs in the namespace.

``cut the connection``: when the side chord ``connloss`` is due (after the deploy by hand, if the run has one), the
submitter asks for ``python -m lab.link --cut``. A slow member runs for 0.8 s, shorter than anyone types: the command
asks the link for the cut, and the submitter carries it out (SIGUSR1 to the namespace's link) once the slow member has
run ``CUT_AFTER`` alone, as the harness aims its own. Seen once the link wrote the cut down, with connections closed,
and the worker consumes again. The side ``overlong`` runs on the shared broker here, whose consumer timeout is
RabbitMQ's default: its member ends at its ``time_limit``, as with the lab's own node.
"""

from __future__ import annotations

import time

from lab import link
from lab.hand import Hand, HandInjector, Steps, consumers, pid_gone
from lab.injector import RunView, SideView
from lessons.fm9.connloss import CUT_AFTER

CUT = "cut the connection"
CONNLOSS = "connloss"
CUT_COMMAND = ".venv/bin/python -m lab.link --cut"
RECONNECT_SECONDS = 10.0
"""After the cut, the worker consumes again within this (it reconnects through the link at once)."""


class HandCut(HandInjector):
    """The cut by hand while the side ``connloss`` runs (see the module docstring)."""

    def __init__(self, hand: Hand) -> None:
        super().__init__(hand)
        self.say = Steps(hand, self.steps, "the cut")
        self.cued_wall = 0.0
        self.fired_at: float | None = None
        self.cuts_before = 0
        self.running = ""
        self.made: tuple[float, int] | None = None
        self.link_pid: int | None = None

    def unmet(self) -> str | None:
        if link.registered() is not None:
            return None
        return ("this lesson cuts the worker's broker connection, so the worker must reach the broker through the "
                "lab's link. In a shell of its own:\n  .venv/bin/python -m lab.link\nthen, in the worker's shell only "
                "(not this one), the `export CELERY_BROKER_URL=...` line it prints.")

    def ready(self, run: RunView, side: SideView) -> bool:
        if side.tag != CONNLOSS:
            return True
        before = run.side("deploy")
        if before is not None and not before.ready():
            return False  # one step at a time: the deploy by hand first
        now = time.monotonic()
        if CUT not in self.say.cued:
            self.cued_wall = time.time()
            self.say.cue(side.reader, CUT, "cut the worker's broker connection; the submitter carries the cut out the "
                         "moment the next slow document runs (0.8 s: too short to aim by hand)", CUT_COMMAND, now)
        asked = link.requested()
        if asked is not None and asked >= self.cued_wall - 1.0:
            return True
        if self.say.late(CUT, now):
            self.say.missed(side.reader, CUT, f"no cut asked for within {self.hand.seconds:.0f}s of the cue")
            return True
        return False

    def step(self, run: RunView) -> None:
        side = run.side(CONNLOSS)
        if side is None or not side.sent or CUT in self.say.done:
            return
        now = time.monotonic()
        events = side.reader.events()
        if self.link_pid is None:  # the namespace's link, found once (its probe is a connection through it)
            found = link.registered()
            self.link_pid = found[0] if found is not None else None
        linked = self.link_pid is not None and not pid_gone(str(self.link_pid))
        if self.fired_at is None:
            ended = {(e.get("doc"), e.get("attempt")) for e in events if e.kind == "attempt_end"}
            running = [e for e in events if e.kind == "attempt_start" and (e.get("doc"), e.get("attempt")) not in ended]
            if self.link_pid is None or not linked:
                self.say.missed(side.reader, CUT, "the link stopped before the cut")
            elif len(running) == 1 and time.time() - running[0].t >= CUT_AFTER:
                self.cuts_before, self.running = len(link.cuts()), running[0].get("doc")
                self.fired_at = now
                link.fire(self.link_pid)
            elif any(e.kind == "notify_start" for e in events):
                self.say.missed(side.reader, CUT, "the side's documents ended with no moment to cut at")
            return
        if self.made is None:
            made = link.cuts()[self.cuts_before:]
            if made:
                self.made = made[0]
                side.reader.rec.event("link_cut", connections=str(self.made[1]), running=self.running)
                if self.made[1] == 0:
                    self.say.missed(side.reader, CUT, "the cut closed no connection: the worker does not go through the "
                                    "link (its CELERY_BROKER_URL must be the one the link printed)")
            elif now - self.fired_at > RECONNECT_SECONDS:
                self.say.missed(side.reader, CUT, f"the link did not answer the cut ({link.describe(self.link_pid or 0)})")
            return
        if consumers(self.hand.fm) >= 1:
            self.say.seen(side.reader, CUT, f"the link closed {self.made[1]} connection(s) of the worker while "
                          f"{self.running} ran; the worker consumes again")
        elif now - self.fired_at > RECONNECT_SECONDS:
            self.say.missed(side.reader, CUT, f"the worker did not consume again within {RECONNECT_SECONDS:.0f}s")

    def busy(self, run: RunView) -> bool:
        return CUT in self.say.cued and CUT not in self.say.done
