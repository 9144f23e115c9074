"""FM-6's exercise (``run_all_fms.py --exercise fm6``): the task, what must hold, the hints (``lab.exercise``)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from lab.exercise import Stated, Task
from lab.lesson import Stop
from lab.observe import Reader

DEADLINE = 1.5
"""The lesson's bound: a hung document, or a hung fetch, ends within this many seconds of its start."""


def _outlived(r: Reader, doc: str, seconds: float, start: str, end: str) -> bool:
    """``doc`` began (``start``) more than ``seconds`` and a half ago, and has not ended (``end``)."""
    events = r.events()
    began = [e.t for e in events if e.kind == start and e.get("doc") == doc]
    ended = any(e.kind == end and e.get("doc") == doc for e in events)
    return bool(began) and not ended and time.time() - began[0] > seconds + 0.5


def _early(stated: Stated) -> Sequence[Stop]:
    deadline = stated.hard_timeout or DEADLINE
    return (
        (f"doc8 ran past {deadline} s and did not end (its slot is pinned)",
         lambda r: _outlived(r, "doc8", deadline + 3, "attempt_start", "attempt_end")),
        ("a chord member was stored FAILURE by Celery's own limit (doc11 or doc28): the chord cannot complete",
         lambda r: "FAILURE" in (r.member_state("doc11"), r.member_state("doc28"))),
    )


EXERCISE = Task(
    symptom="doc8 hangs and ignores every polite request to stop. Its pool slot stays pinned while it hangs and "
            "notify never runs. The check stops once doc8 has run well past its deadline.",
    must_hold=(
        "A hang that cooperates (doc7) ends with reason soft_timeout; one that ignores every request (doc8), or "
        f"swallows Exception (doc10), ends with reason hard_timeout, within {DEADLINE} s.",
        "A hang in C code that no signal reaches (doc11) still ends as an envelope with reason time_limit "
        "(TimeLimitExceeded), never as a FAILURE state that breaks the chord; so does a Celery limit that lands "
        "while a result is being stored (doc30); a body that returned in time is ok even when storing its result "
        "stalls (doc28).",
        f"A hung fetch at the head of a chain (doc29) ends with reason hard_timeout within {DEADLINE} s too.",
        "Afterwards the worker serves a probe task within 2 s (no pinned slot).",
    ),
    hints=(
        "Nothing inside the task bodies has a deadline. Look at the decorator stack of each task, and ask what "
        "happens to the chord when Celery's own limit kills a process, or fires after the body returned.",
        "shared/timeouts.py's @hard_timeout(seconds, soft=...) inside @enveloped (SIGALRM, prefork only), on every "
        "task; Celery's time_limit as a backstop, with Request=BackstopRequest so its kill is still an envelope.",
    ),
    stated=Stated(hard_timeout=DEADLINE, fetch_hard_timeout=DEADLINE),
    early=_early,
)
