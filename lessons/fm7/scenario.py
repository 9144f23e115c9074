"""What FM-7's lesson adds to the scenarios: rolling deploys while slow but healthy documents run.

A side chord of its own (``deploy``), sent once the run's own chord and the sides sent with it are over, so
that a deploy meets none of the earlier faults and the earlier scenarios stay as fast; ``RollingDeploys``
(``lessons.fm7.deploy``) rolls the worker while it runs. The hard variant's side chord (``stored``), sent at the
same moment (a program that never counts its member must not hold the deploys back): a member killed after its
result is stored and before its chord counts it (``lessons.fm7.stored``); and its second side chord
(``cancelled``), sent once the deploys are done and one more new worker consumes: a member held after its store,
which the cold shutdown of one more deploy cancels there.
"""

from __future__ import annotations

from lessons.fm7.deploy import RollingDeploy
from lessons.fm7.hand import HandDeploy
from lab.faults import HOLD_AFTER_STORE, SLOW_UNTIL_RELEASED, release
from lab.fm import Fm
from lab.injector import Harnessed, Injector, RunView, SideView
from lab.scenarios import MAIN, Doc, Needs, Part, SideChord
from lab.workers import Worker
from lessons.fm7.stored import CANCELLED, STORED, DeployOnHeld, KillAfterStore

DEPLOY = "deploy"
DEPLOY_DOCS: tuple[str, ...] = tuple(f"doc{n}" for n in range(34, 34 + 32))
"""The slow but healthy documents (``SLOW_UNTIL_RELEASED``): 12.8 s of work on two processes, room for three deploys
when a worker boots in 0.6 s (idle) and for two when it takes 4 s (loaded; ``lessons.fm7.checks.MIN_DEPLOYS``). Once
the last deploy's SIGTERM is sent, ``RollingDeploys`` releases them: the parses begun after it are quick, and the side
ends about a second after its last deploy instead of about five (on an idle machine three deploys take some 4 s of
the 12.8 s)."""
STORED_DOCS: tuple[str, ...] = ("doc83", "doc84")
"""The hard variant's side: the member killed between its store and its count, and a healthy one."""
CANCELLED_DOCS: tuple[str, ...] = ("doc86", "doc87")
"""The hard variant's second side: the member a deploy's cold shutdown cancels after its store, and a healthy one."""
DEPLOYS = 3
"""Deploys the harness makes while the side ``deploy`` runs."""


class RollingDeploys(Injector):
    """``DEPLOYS`` rolling deploys of the run's worker (``lessons.fm7.deploy.RollingDeploy``) while the side runs, then,
    when the scenario has the side ``cancelled``, one more at its held member (``lessons.fm7.stored.DeployOnHeld``)."""

    needs_harness = True

    def __init__(self) -> None:
        self.harnessed: Harnessed | None = None
        self.deploy: RollingDeploy | None = None
        self.on_held: DeployOnHeld | None = None
        self.released = False

    def prepare(self, fm: Fm, harnessed: Harnessed) -> Fm:
        self.harnessed = harnessed
        return fm

    def attach(self, worker: Worker) -> None:
        """The new versions run the worker's program as it was started (another injector may have moved its backend)."""
        fm, harnessed = worker.fm, self.harnessed
        if harnessed is not None:
            self.deploy = RollingDeploy(fm, worker, lambda part: harnessed.spawn(fm, part, None), DEPLOYS)
            self.on_held = DeployOnHeld(self.deploy)

    def ready(self, run: RunView, side: SideView) -> bool:
        return side.tag != CANCELLED or (self.on_held is not None and self.on_held.ready())

    def busy(self, run: RunView) -> bool:
        return self.on_held is not None and self.on_held.busy()

    def step(self, run: RunView) -> None:
        side = run.side(DEPLOY)
        if self.deploy is not None and side is not None and side.sent:
            self.deploy.step(side.reader)
            if self.deploy.state in ("finishing", "done") and not self.released:
                release(side.run_id)  # the deploys are made: what is left of the side need not be slow
                self.released = True
        if self.on_held is not None:
            # a run without the deploys' side (the hard variant's) makes only the deploy aimed at the held member
            self.on_held.step(run.side(CANCELLED), side is None or side.ready())

    def stop(self) -> None:
        if self.deploy is not None:
            self.deploy.close()

    def serving(self, worker: Worker) -> Worker:
        return self.deploy.current if self.deploy is not None else worker

    def workers(self) -> list[Worker]:
        return self.deploy.workers[1:] if self.deploy is not None else []

    def watch(self) -> None:
        if self.deploy is not None:
            self.deploy.watch()


PART = Part(
    sides=(SideChord(CANCELLED, (Doc(CANCELLED_DOCS[0], HOLD_AFTER_STORE, "healthy; held after its result is stored, "
                                     "before its chord counts it, until a deploy's cold shutdown cancels it"),
                                 Doc(CANCELLED_DOCS[1], None, "a healthy document")),
                     "a member a deploy cancels between its result's store and its count", injector="rolling deploys",
                     after=(MAIN,)),
           SideChord(DEPLOY, tuple(Doc(d, SLOW_UNTIL_RELEASED, "slow but healthy: 0.8 s of work until the last "
                                          "deploy, then quick") for d in DEPLOY_DOCS),
                     "slow but healthy documents, rolled over by deploys", injector="rolling deploys", after=(MAIN,)),
           SideChord(STORED, (Doc(STORED_DOCS[0], HOLD_AFTER_STORE, "healthy; its process killed after its result is "
                                  "stored, before its chord counts it"),
                              Doc(STORED_DOCS[1], None, "a healthy document")),
                     "a member killed between its result's store and its count", injector="kill after store",
                     after=(MAIN,))),
    injectors={"rolling deploys": RollingDeploys, "kill after store": KillAfterStore},
    by_hand={"rolling deploys": HandDeploy},  # by hand, the attendee deploys, cued (lessons.fm7.hand)
    # S7 reads the deploys' side, and its run stops once that side and ``stored`` are over: both, after one healthy
    # document; S7 hard reads ``stored`` and ``cancelled`` alone (the deploy aimed at the held member is its only one)
    symptom=Needs(docs=("doc2",), sides=(DEPLOY, STORED)),
    hard=Needs(docs=("doc2",), sides=(CANCELLED, STORED)),
)
