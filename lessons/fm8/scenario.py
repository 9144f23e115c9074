"""What FM-8's lesson adds to the scenarios: the result backend goes away while slow but healthy documents run.

The run's result backend is a Redis the lab owns (``lessons.fm8.outage.owned_backend``); ``BackendOutages`` stops and
starts it twice while the side chord ``outage`` runs (``lessons.fm8.outage.BackendOutage``), sent after the deploys'.
While the backend is down the runner reads nothing from it: the run is paused.
"""

from __future__ import annotations

from lab.faults import SLOW_UNTIL_RELEASED, release
from lab.fm import Fm
from lab.injector import Harnessed, Injector, RunView
from lessons.fm8.hand import HandOutage
from lessons.fm8.outage import BackendOutage, owned_backend
from lab.scenarios import Doc, Needs, Part, SideChord

OUTAGE = "outage"
OUTAGE_DOCS: tuple[str, ...] = tuple(f"doc{n}" for n in range(66, 66 + 8))
"""Slow but healthy documents: 3.2 s of work on two processes, so that bodies still run, and end, while the
result backend is gone (the outage begins once two have ended and lasts at least 2 s: in the runs here, the next
two pairs ended in it and their stores failed). Once the backend is back from that first outage, ``BackendOutages``
releases them (``SLOW_UNTIL_RELEASED``): the parses begun after it, the drain's sent-back ones among them, are quick."""


class BackendOutages(Injector):
    """The run's result backend on a Redis of the lab's own, stopped twice while the side ``outage`` runs."""

    needs_harness = True

    def __init__(self) -> None:
        self.outage: BackendOutage | None = None
        self.released = False

    def prepare(self, fm: Fm, harnessed: Harnessed) -> Fm:
        moved, server = harnessed.stack.enter_context(owned_backend(fm, harnessed.run_id))
        self.outage = BackendOutage(server)
        harnessed.stack.callback(self.outage.close)
        return moved

    def step(self, run: RunView) -> None:
        side = run.side(OUTAGE)
        if self.outage is not None and side is not None and side.sent:
            self.outage.step(side.reader)
            if self.outage.phase != "members" and not self.released:
                release(side.run_id)  # the members' stores have failed: what runs from now on need not be slow
                self.released = True

    def paused(self) -> bool:
        return self.outage is not None and self.outage.down

    def stop(self) -> None:
        if self.outage is not None:
            self.outage.close()


PART = Part(
    sides=(SideChord(OUTAGE, tuple(Doc(d, SLOW_UNTIL_RELEASED, "slow but healthy: 0.8 s of work until the backend's "
                                                "first return, then quick") for d in OUTAGE_DOCS),
                     "slow but healthy documents while the result backend goes away", injector="backend outage",
                     after=("deploy", "cancelled")),),  # the deploy aimed at cancelled's member stops a worker
    injectors={"backend outage": BackendOutages},
    by_hand={"backend outage": HandOutage},  # by hand, the attendee stops and starts the backend (lessons.fm8.hand)
    symptom=Needs(docs=("doc2",), sides=(OUTAGE,)),  # S8 reads the outage's side alone; a healthy chord before it
)
