"""What FM-9's lesson adds to the scenarios: the worker's broker connection drops, also during a cold shutdown's soft
wait, and a member outlives the broker's ``consumer_timeout``.

Three side chords on a RabbitMQ node the lab owns, served by a worker of their own (``lessons.fm9.connloss``), sent one
after the other once the run's own chord is over (while the deploys run: neither touches the other's worker or
broker) and before the outage (which would stop the result backend their worker stores in): ``connloss``, whose
worker's connections ``ConnectionCut`` cuts while the slow member runs alone; ``softcut``, with a spare worker beside
it, whose worker running the slow member gets a SIGTERM and then the cut during its soft wait
(``lessons.fm9.softcut``; the worker left serves the node from then on); and ``overlong``, a member stuck in C code
(it cannot overlap the cuts: a cut would requeue the stuck member too).
"""

from __future__ import annotations

import threading

from lessons.fm9.connloss import CONSUMER_TIMEOUT_MS, LINKED, OWNED_NAME, TICK_MS, LinkedBroker
from lessons.fm9.hand import HandCut
from lab.faults import C_HANG, HOLD_AFTER_STORE, SLOW
from lab.fm import Fm
from lab.injector import Harnessed, Injector, RunView, SideView
from lab.link import BrokerLink
from lab.owned import OwnedRabbit, stop_leftovers
from lab.owned_shared import share_rabbit, unshare
from lab.workers import Worker
from lab.scenarios import MAIN, Doc, Needs, Part, SideChord
from lessons.fm9.softcut import SOFTCUT, SOFTCUT_DOC, SPARE, SoftWaitCut

CONNLOSS = "connloss"
OVERLONG = "overlong"
HUNG_DOC = "doc81"
"""The member stuck in C code (side ``overlong``)."""
CONNLOSS_DOCS: tuple[str, ...] = ("doc78", "doc79", "doc80")
CUTSTORED = "cutstored"
CUTSTORED_DOCS: tuple[str, ...] = ("doc88", "doc89")
"""The side ``cutstored``: a member held after its result's store, before its count, when the cut comes (FM-9's
cancel ends it there: ``count_stored_members`` counts its redelivery), and a healthy one."""


class ConnectionCut(Injector):
    """The owned node, the link to it and its worker (``lessons.fm9.connloss.LinkedBroker``): the sides ``connloss`` and
    ``overlong`` are sent there, and the link is cut while ``connloss``'s slow member runs alone.

    The node (about 5 s to start on an idle machine, 12 s on a loaded one; one for the lesson's runs made at
    once, ``lab.owned_shared``) and its worker start on a thread while the run's own chord runs: its sides are
    ready once the worker consumes there."""

    needs_harness = True

    def __init__(self) -> None:
        self.broker: LinkedBroker | None = None
        self.starting: threading.Thread | None = None
        self.failed: BaseException | None = None
        self.soft: SoftWaitCut | None = None  # the side ``softcut``'s spare worker and its cut (lessons.fm9.softcut)
        self.node: OwnedRabbit | None = None

    def prepare(self, fm: Fm, harnessed: Harnessed) -> Fm:
        stop_leftovers(orphans_only=True)  # what a killed run left running

        def start() -> None:
            try:  # the node the lesson's other runs of this invocation use now, if one does (lab.owned_shared)
                node = self.node = share_rabbit(f"{OWNED_NAME}-{harnessed.run_id}", CONSUMER_TIMEOUT_MS, TICK_MS)
                self.broker = LinkedBroker(fm, node, BrokerLink.to(node.url), lambda env: harnessed.spawn(fm, LINKED, env))
                self.soft = SoftWaitCut(node, str(fm.task_queues[0].name), lambda env: harnessed.spawn(fm, SPARE, env),
                                        {"RCL_CONSUMER_TIMEOUT": f"{CONSUMER_TIMEOUT_MS / 1000:g}"})
                self.broker.start_worker()
            except BaseException as exc:  # said by ready(), on the run's own thread
                self.failed = exc

        self.starting = threading.Thread(target=start, name=f"owned-broker-{harnessed.run_id}", daemon=True)
        self.starting.start()
        harnessed.stack.callback(self._close)
        return fm

    def _close(self) -> None:
        """Everything it started stopped, and its use of the node given back (the last use removes the node; a
        start that failed gave it back already)."""
        if self.starting is not None:
            self.starting.join()
        if self.soft is not None:
            self.soft.close(0.0)
        if self.broker is not None:
            self.broker.close(0.0)  # no warm shutdown: the run is read; its queues go with the node
        elif self.node is not None:
            unshare(self.node)

    def ready(self, run: RunView, side: SideView) -> bool:
        if self.starting is not None and self.starting.is_alive():
            return False
        if self.failed is not None:
            raise self.failed
        if side.tag == SOFTCUT and self.soft is not None:
            return self.soft.ready()  # its spare worker consumes too
        if side.tag == OVERLONG and self.soft is not None and self.soft.state not in ("idle", "done"):
            return False  # the worker the soft wait's cut stopped is gone first: one worker serves the node again
        return True

    def send(self, run: RunView, side: SideView) -> None:
        broker = self.broker
        if broker is None:
            side.submit()
            return
        broker.submit(side.submit)  # to the lab's own node, served by its own worker
        side.reader.rec.event("linked", node=broker.node.node, consumer_timeout=CONSUMER_TIMEOUT_MS / 1000,
                              overlong=HUNG_DOC)  # the timeline draws the node's timeout on the member it meets

    def step(self, run: RunView) -> None:
        if self.broker is None:
            return
        for tag in (CONNLOSS, CUTSTORED, OVERLONG):
            side = run.side(tag)
            if side is not None and side.sent:
                self.broker.step(side.reader, drop=tag == CONNLOSS)
                if tag == CUTSTORED:
                    self.broker.cut_when_held(side.reader)
        side = run.side(SOFTCUT)
        if side is not None and side.sent and self.soft is not None:
            broker = self.broker
            linked = (broker.worker, broker.link) if broker.worker is not None else None

            def on_term(worker: Worker) -> None:
                if worker is broker.worker:
                    broker.exit_seen = True  # the SIGTERM's exit, not the linked worker failing (G9 reads worker_exit)

            def on_exit(worker: Worker, spare: Worker | None) -> bool:
                """The stopped worker is gone: the spare, if it was the linked one, serves the node from now on."""
                if worker is not broker.worker or spare is None:
                    return False
                broker.worker, broker.exit_seen = spare, False
                return True

            self.soft.step(side.reader, linked, on_term, on_exit)


PART = Part(
    sides=(SideChord(CONNLOSS, (Doc("doc78", SLOW, "slow but healthy: runs alone when the connection drops"),
                                Doc("doc79", None, "a healthy document"), Doc("doc80", None, "a healthy document")),
                     "a chord whose worker's broker connection drops mid-member", injector="connection cut",
                     after=(MAIN,), before=("outage",)),
           SideChord(CUTSTORED, (Doc(CUTSTORED_DOCS[0], HOLD_AFTER_STORE, "healthy; its worker's connection drops "
                                     "after its result is stored, before its chord counts it"),
                                 Doc(CUTSTORED_DOCS[1], None, "a healthy document")),
                     "a member whose connection drops between its result's store and its count", injector="connection cut",
                     after=(CONNLOSS,), before=("outage",)),
           SideChord(SOFTCUT, (Doc(SOFTCUT_DOC, SLOW, "slow but healthy: its worker's connection drops in its soft "
                                   "shutdown wait"),),
                     "a cold shutdown's soft wait whose broker connection drops", injector="connection cut",
                     after=(CONNLOSS, CUTSTORED), before=("outage",)),
           SideChord(OVERLONG, (Doc(HUNG_DOC, C_HANG, "a member stuck in C code, past the broker's consumer timeout"),
                                Doc("doc82", SLOW, "slow but healthy")),
                     "a member that outlives the broker's consumer_timeout", injector="connection cut",
                     after=(CONNLOSS, CUTSTORED, SOFTCUT), before=("outage",))),
    injectors={"connection cut": ConnectionCut},
    by_hand={"connection cut": HandCut},  # by hand, the attendee asks for the cut (lessons.fm9.hand)
    # S9 reads these two sides alone, S9 hard the over-long member's and the soft wait's cut (on the lab's own node,
    # not the deploys' or the outage's worker)
    symptom=Needs(docs=("doc2",), sides=(CONNLOSS, OVERLONG)),
    hard=Needs(docs=("doc2",), sides=(SOFTCUT, OVERLONG)),
)
