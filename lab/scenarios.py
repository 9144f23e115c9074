"""Scenarios (DESIGN.md §2): which document meets which fault.

Scenario N is cumulative: it holds every fault of scenarios 1..N, the hard
variants included (a fault of the fetch, the owner of the ``notify`` claim
killed twice, a burst of waiting retries, a body that swallows ``Exception``, a
hang in C code, a result store that stalls after the body, a hang in the fetch).
Some hard variants need a chord of their own (``Side``): a chain head that expired
(from scenario 1), a poison chord body and a poison member queued behind more dead
letters than the drain reads in a pass (from scenario 3). Scenario 7's rolling deploys
have one too (``deploy``): slow but healthy documents, sent once the rest of the run is
over, so that a deploy meets none of the earlier faults and scenarios 1..6 stay as fast;
and so has scenario 8's backend outage (``outage``), sent after the deploys' side, and scenario 9's
dropped connection (``connloss``) and over-long member (``overlong``), sent after it, one after the other,
to a broker of the lab's own. The runner
writes each fault into its document's text (``lab.faults.document_text``), so the
code under test meets the fault as it is: an earlier FM's code gets a later
scenario with no switch and no extra argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lab.faults import (C_HANG, CRASH_ONCE, FAIL, FETCH_HANG, FETCH_POISON, FLAKE_FOREVER, FLAKY, HARD_HANG, LATE_FINISH,
                        POISON, SLOW, SOFT_HANG, STALL_PAST_LIMIT, SWALLOW_HANG, THROTTLED, Fault)

# (document, fault, first scenario that has it), in the order of submission. The burst
# goes last but for doc29 (scenario 6), so that its probe meets pool processes that the hangs
# no longer hold (a busy pool delays any new work; the burst is about the prefetch).
_TABLE: tuple[tuple[str, Fault | None, int], ...] = (
    ("doc1", FAIL, 1),
    ("doc2", None, 1),
    ("doc3", CRASH_ONCE, 2),
    ("doc4", POISON, 3),
    ("doc5", FLAKY(2), 5),
    ("doc6", FLAKE_FOREVER, 5),
    ("doc7", SOFT_HANG, 6),
    ("doc8", HARD_HANG, 6),
    ("doc9", FETCH_POISON, 3),  # the hard variant of scenario 3: the poison is the chain's head
    ("doc10", SWALLOW_HANG, 6),  # the hard variants of scenario 6: a body that swallows Exception,
    ("doc11", C_HANG, 6),  # and one stuck in C code
    # More hard variants of scenario 6: a body that ends inside its deadline while the result store
    # stalls past the soft limit (doc28) and past the time limit (doc30); a hang in the chain's head
    # (doc29, last).
    ("doc28", LATE_FINISH, 6),
    ("doc30", STALL_PAST_LIMIT, 6),
    # The hard variant of scenario 5: a burst of waiting retries, twice what the prefetch
    # (worker_concurrency 2 x worker_prefetch_multiplier 4) holds, so that the probe queues
    # behind more of them than the short retries of doc5 and doc6 can cycle through.
    *((f"doc{n}", THROTTLED, 5) for n in range(12, 28)),
    # After the burst: without its fix (fm6w) the hung fetch holds a pool slot for good, and the
    # earlier documents have had both slots by then.
    ("doc29", FETCH_HANG, 6),
)
BURST: tuple[str, ...] = tuple(f"doc{n}" for n in range(12, 28))
"""Scenario 5's burst: the runner sends a probe task once all of them wait to retry."""
DUPLICATE_NOTIFY_FROM = 4
CRASH_PLAN: tuple[str, ...] = ("before_send", "after_send")
"""Scenario 4's hard variant: the first ``notify`` to reach the mail API is killed
after claiming and before sending, the second once the email is out and before it
marks the claim sent (``lab.pipeline.send_email`` plays it)."""
SCENARIOS = range(1, 10)
DEPLOY_DOCS: tuple[str, ...] = tuple(f"doc{n}" for n in range(34, 34 + 32))
"""Scenario 7's slow but healthy documents (``SLOW``), a side chord of their own (``deploy``): 12.8 s of
work on two processes, room for three deploys when a worker boots in 0.6 s (idle) and for two when it takes
4 s (loaded; ``lab.checks.MIN_DEPLOYS``)."""
OUTAGE_DOCS: tuple[str, ...] = tuple(f"doc{n}" for n in range(66, 66 + 12))
"""Scenario 8's slow but healthy documents, the side chord ``outage``: 4.8 s of work on two processes, so
that bodies still run, and end, while the result backend is gone (``lab.outage``)."""
CONNLOSS_DOCS: dict[str, Fault | None] = {"doc78": SLOW, "doc79": None, "doc80": None}
"""Scenario 9's side ``connloss``: the runner cuts the worker's connections while the slow one runs alone
(``lab.connloss``)."""
HUNG_DOC = "doc81"
OVERLONG_DOCS: dict[str, Fault | None] = {HUNG_DOC: C_HANG, "doc82": SLOW}
"""Scenario 9's side ``overlong``: a member stuck in C code outlives the owned node's consumer timeout
unless a ``time_limit`` below it ends it first."""


@dataclass(frozen=True)
class Side:
    """A chord of its own in the same run, for a hard variant that needs one (the runner submits it
    through the FM's ``submit`` as pipeline ``<run_id>-<tag>``, its documents in that pipeline's store)."""

    tag: str
    docs: Mapping[str, Fault | None]
    first: int  # the first scenario that has it
    poison_mail: bool = False  # every call of the mail API kills its caller: the chord body is the poison
    expired_head: bool = False  # each document's fetch, the chain's head, is sent already expired
    behind_letters: bool = False  # sent once the run's dead letters were handled, behind the runner's foreign letters in the DLQ
    deploys: int = 0  # sent once everything else of the run is over; the runner deploys this many times while it runs
    outage: bool = False  # sent once everything else is over; the runner stops the result backend twice (lab.outage)
    linked: bool = False  # sent once everything else is over, to a RabbitMQ node of the lab's own and its worker (lab.connloss)
    drop: bool = False  # the runner cuts that worker's broker connections while the side's slow member runs

    @property
    def last(self) -> bool:
        """Sent once everything else of the run is over (the deploys, the outage)."""
        return self.deploys > 0 or self.outage or self.linked


_SIDES: tuple[Side, ...] = (
    Side("expired", {"doc31": None}, 1, expired_head=True),  # FM-1's hard variant: a head that expired
    Side("body", {"doc32": None}, 3, poison_mail=True),  # FM-3's: a poison chord body
    Side("behind", {"doc33": POISON}, 3, behind_letters=True),  # FM-3's: a poison member behind letters the drain cannot place
    Side("deploy", {doc: SLOW for doc in DEPLOY_DOCS}, 7, deploys=3),  # FM-7: rolling deploys while slow documents run
    Side("outage", {doc: SLOW for doc in OUTAGE_DOCS}, 8, outage=True),  # FM-8: the result backend goes away
    Side("connloss", CONNLOSS_DOCS, 9, linked=True, drop=True),  # FM-9: the worker's connection drops mid-member
    Side("overlong", OVERLONG_DOCS, 9, linked=True),  # FM-9: a member outlives the broker's consumer_timeout
)


@dataclass(frozen=True)
class Scenario:
    number: int
    faults: Mapping[str, Fault | None]
    duplicate_notify: bool
    crash_plan: tuple[str, ...] = ()
    sides: tuple[Side, ...] = ()

    @property
    def burst(self) -> tuple[str, ...]:
        return tuple(d for d in BURST if self.faults.get(d) == THROTTLED)  # (a clean doc12 is no burst)

    @property
    def docs(self) -> tuple[str, ...]:
        return tuple(self.faults)


def scenario(number: int) -> Scenario:
    if number not in SCENARIOS:
        raise ValueError(f"no scenario {number}; there are {SCENARIOS.start}..{SCENARIOS.stop - 1}")
    faults = {doc: fault for doc, fault, first in _TABLE if first <= number}
    duplicate = number >= DUPLICATE_NOTIFY_FROM
    sides = tuple(side for side in _SIDES if side.first <= number)
    return Scenario(number, faults, duplicate, CRASH_PLAN if duplicate else (), sides)
