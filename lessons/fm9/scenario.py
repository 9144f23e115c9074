"""What FM-9's lesson adds to the scenarios: the worker's broker connection drops, and a member outlives the
broker's ``consumer_timeout``.

Two side chords on a RabbitMQ node the lab owns, served by a worker of their own (``lab.connloss``), sent one
after the other after the outage's: ``connloss``, whose worker's connections ``ConnectionCut`` cuts while the
slow member runs alone, and ``overlong``, a member stuck in C code.
"""

from __future__ import annotations

from lab.connloss import LINKED, LinkedBroker, linked_broker
from lab.faults import C_HANG, SLOW
from lab.fm import Fm
from lab.injector import Harnessed, Injector, RunView, SideView
from lab.scenarios import Doc, Part, SideChord

CONNLOSS = "connloss"
OVERLONG = "overlong"
HUNG_DOC = "doc81"
"""The member stuck in C code (side ``overlong``)."""
CONNLOSS_DOCS: tuple[str, ...] = ("doc78", "doc79", "doc80")


class ConnectionCut(Injector):
    """The owned node, the link to it and its worker (``lab.connloss.LinkedBroker``): the sides ``connloss`` and
    ``overlong`` are sent there, and the link is cut while ``connloss``'s slow member runs alone."""

    needs_harness = True

    def __init__(self) -> None:
        self.broker: LinkedBroker | None = None

    def prepare(self, fm: Fm, harnessed: Harnessed) -> Fm:
        self.broker = harnessed.stack.enter_context(linked_broker(
            fm, harnessed.run_id, lambda env: harnessed.spawn(fm, LINKED, env), harnessed.grace))
        return fm

    def send(self, run: RunView, side: SideView) -> None:
        broker = self.broker
        if broker is None:
            side.submit()
            return
        broker.submit(side.submit)  # to the lab's own node, served by its own worker
        side.reader.rec.event("linked", node=broker.node.node)

    def step(self, run: RunView) -> None:
        if self.broker is None:
            return
        for tag in (CONNLOSS, OVERLONG):
            side = run.side(tag)
            if side is not None and side.sent:
                self.broker.step(side.reader, drop=tag == CONNLOSS)


PART = Part(
    sides=(SideChord(CONNLOSS, (Doc("doc78", SLOW, "slow but healthy: runs alone when the connection drops"),
                                Doc("doc79", None, "a healthy document"), Doc("doc80", None, "a healthy document")),
                     "a chord whose worker's broker connection drops mid-member", injector="connection cut",
                     after=("outage",)),
           SideChord(OVERLONG, (Doc(HUNG_DOC, C_HANG, "a member stuck in C code, past the broker's consumer timeout"),
                                Doc("doc82", SLOW, "slow but healthy")),
                     "a member that outlives the broker's consumer_timeout", injector="connection cut",
                     after=(CONNLOSS,))),
    injectors={"connection cut": ConnectionCut},
)
