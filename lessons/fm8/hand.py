"""FM-8 by hand: the attendee stops and starts the result backend, cued by the submitter (``lab.hand``).

Before the run: both shells' result backend is the lab's by-hand Redis (``python -m lab.hand backend start``, a
``redis-server`` of the namespace's own, its data kept across a stop), the observations stay on the shared Redis
(``RCL_OBSERVATIONS_URL``); ``unmet`` prints the exact commands when that is not so.

1. ``stop the backend``: when the side chord ``outage`` is due, the submitter says to have the stop command typed;
   once its slow documents are sent, to run it. Seen once the backend does not answer while slow documents were
   still to end (their results then cannot be stored).
2. ``start it again``: once a store failed (the observer's ``store_failed``) or ``OUTAGE_SECONDS`` passed. Seen once it
   answers. While it is down the run is paused: the submitter reads no result, as a ``result.get()`` would wait.
"""

from __future__ import annotations

import os
import time

from lab.hand import HAND_BACKEND, Hand, HandInjector, Steps, backend_command
from lab.injector import RunView, SideView
from lab.owned import OwnedRedis
from lab.settings import DEFAULT_BACKEND_URL, backend_url
from lessons.fm8.outage import OUTAGE_SECONDS

STOP = "stop the backend"
START = "start it again"
LOOK_SECONDS = 0.1


class HandOutage(HandInjector):
    """The outage by hand while the side ``outage`` runs (see the module docstring)."""

    steps = 2

    def __init__(self, hand: Hand) -> None:
        super().__init__(hand)
        self.say = Steps(hand, self.steps, "the outage")
        self.server = OwnedRedis(HAND_BACKEND)
        self.down_at: float | None = None
        self.looked = 0.0
        self.armed = False

    def unmet(self) -> str | None:
        url = self.server.url
        shared = os.environ.get("RCL_OBSERVATIONS_URL") or (backend_url() if backend_url() != url else DEFAULT_BACKEND_URL)
        if backend_url() == url and shared != url and self.server.answers():
            return None
        return ("this lesson stops the result backend, so it must be a Redis of your own. Start the lab's, in this "
                f"namespace:\n  {backend_command('start')}\nthen, in this shell and in the worker's before you start it:"
                f"\n  export CELERY_RESULT_BACKEND={url} RCL_OBSERVATIONS_URL={shared}")

    def ready(self, run: RunView, side: SideView) -> bool:
        if not self.armed:
            self.armed = True
            self.hand.say(f">>> the outage is next: have `{backend_command('stop')}` typed in a shell; run it when told")
        return True

    def _answers(self, now: float) -> bool | None:
        """Does the backend answer (None: not looked at this time)?"""
        if now - self.looked < LOOK_SECONDS:
            return None
        self.looked = now
        return self.server.answers()

    def step(self, run: RunView) -> None:
        side = run.side("outage")
        if side is None or not side.sent or START in self.say.done:
            return
        now = time.monotonic()
        if STOP not in self.say.cued:
            self.say.cue(side.reader, STOP, "stop the result backend now, while the slow documents run (about 3 s)",
                         backend_command("stop"), now)
            return
        if STOP not in self.say.done:
            events = side.reader.events()
            if self._answers(now) is False:
                self.down_at = now
                ended = sum(1 for e in events if e.kind == "attempt_end")
                self.say.seen(side.reader, STOP, f"the result backend at {self.server.url} does not answer, "
                              f"{now - self.say.cued[STOP]:.1f}s after the cue; {ended} parses had ended")
                side.reader.rec.event("backend_gone_by_hand")
            elif any(e.kind == "notify_start" for e in events):
                self.say.missed(side.reader, STOP, "the backend still answered when every slow document had ended")
                self.say.done.add(START)
            elif self.say.late(STOP, now):
                self.say.missed(side.reader, STOP, f"the backend still answers {self.hand.seconds:.0f}s after the cue")
                self.say.done.add(START)
            return
        if START not in self.say.cued:
            failed = any(e.kind == "store_failed" for e in side.reader.events())
            if self.down_at is not None and (failed or now - self.down_at >= OUTAGE_SECONDS):
                self.say.cue(side.reader, START, "start the result backend again (its data is kept)",
                             backend_command("start"), now)
            return
        if self._answers(now):
            self.say.seen(side.reader, START, f"the result backend answers again, {now - self.say.cued[START]:.1f}s "
                          "after the cue")
            self.down_at = None
        elif self.say.late(START, now):
            self.say.missed(side.reader, START, f"the backend is still down {self.hand.seconds:.0f}s after the cue")
            self.down_at = None  # the run reads on, and ends at its deadline if the backend stays gone

    def paused(self) -> bool:
        return self.down_at is not None

    def busy(self, run: RunView) -> bool:
        return STOP in self.say.cued and START not in self.say.done
