"""FM-1's exercise (``run_all_fms.py --exercise fm1``): the task, what must hold, the hints (``lab.exercise``)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from celery.states import READY_STATES

from lab.exercise import Stated, Task
from lab.lesson import Stop
from lab.observe import Reader
from lab.runner import StopCondition

STRANDED_SECONDS = 5.0
"""A chain head the worker discarded as expired, and whose chord's body has not started this long after every member
of the run's own chord has its outcome, is one no part of the program will carry on: its chord stays PENDING for
ever. (Its side chord is sent before the run's own chord, so a program that carries it on has long done so; a clock
started at the discard could stop a right program whose worker is still busy with the run's own documents.)"""
LOOK_EVERY = 0.5
"""How often the members' outcomes are read (one result-backend read per document)."""


def _stranded() -> StopCondition:
    settled: list[float] = []  # when every member of the run's own chord was first seen with its outcome
    looked: list[float] = [0.0]

    def stranded(r: Reader) -> bool:
        side = r.side_readers.get("expired")
        if side is None or not side.events_of("revoked") or side.events_of("notify_start") or not r.members:
            return False
        now = time.monotonic()
        if not settled:
            if now - looked[0] < LOOK_EVERY:
                return False
            looked[0] = now
            if any(r.member_state(doc) not in READY_STATES for doc in r.members):
                return False
            settled.append(now)
        return now - settled[0] > STRANDED_SECONDS

    return stranded


def _early(stated: Stated) -> Sequence[Stop]:
    return ((f"doc31's chain head expired before it ran and its chord's notify had not started {STRANDED_SECONDS:.0f} "
             "s after every member of the run's own chord had its outcome (its chord stays PENDING)", _stranded()),)


EXERCISE = Task(
    symptom="doc1 raises on every attempt (a malformed document). notify never runs and no email goes out: the "
            "chord's result is a FAILURE holding a ChordError that names doc1's error, though doc2 parsed fine. "
            "And a chord whose chain head (doc31's fetch) expired before it ran never completes.",
    must_hold=(
        "notify runs exactly once per pipeline and sends its one email, whatever a document does; the chord's "
        "result is in the SUCCESS state and holds a successful envelope, the wire format lab/pipeline.py's "
        "summarise reads (a status, a payload, a reason).",
        "Every document is accounted for in notify's summary: ok plus failed equals the documents sent; doc1 is "
        "listed failed with reason error and its PermanentError, never as ok.",
        "A chain whose head expired before it ran still reaches notify: doc31 is listed failed with reason expired "
        "(Celery's own record of the head stays REVOKED), and its chord's result is a SUCCESS envelope.",
    ),
    hints=(
        "Ask what the result backend does when the last member of a chord returns and one member is in Celery's "
        "FAILURE state: it runs the body's errbacks, not the body. What state does each task end in, and can a "
        "task end in SUCCESS while saying that its document failed? Then: what runs after a chain head that the "
        "worker discarded unrun?",
        "shared/envelope.py: the enveloped decorator (every exit becomes a SUCCESS-state Result whose status may be "
        "FAILURE), unwrap for a task that receives the envelope of the task before it, and envelope_revoked(app) "
        "for a head revoked or expired before it ran (Celery's task_revoked signal).",
    ),
    early=_early,
)
