"""What FM-6's lesson adds to the scenarios: hangs, from polite to hopeless, and stalls outside the body.

The hard variants: a body that swallows ``Exception``, a hang in C code, a body that ends inside its deadline
while the result store stalls past the soft limit and past the time limit, a member its time limit kills after
its result is stored and before its chord counts it (the lab's backend holds it there: ``lab.faults.HOLD_AFTER_STORE``;
``BackstopRequest`` counts it), and a hang in the chain's head,
sent last (without its fix the hung fetch holds a pool slot for good, and the earlier documents have had both
slots by then).
"""

from __future__ import annotations

from lab.faults import (C_HANG, FETCH_HANG, HARD_HANG, HOLD_AFTER_STORE, LATE_FINISH, SOFT_HANG, STALL_PAST_LIMIT,
                        SWALLOW_HANG)
from lab.scenarios import Doc, Part

PART = Part(docs=(
    Doc("doc7", SOFT_HANG, "a polite hang: sleeps past the soft limit, then cooperates"),
    Doc("doc8", HARD_HANG, "a stubborn hang: ignores the soft limit"),
    Doc("doc10", SWALLOW_HANG, "a hang inside `except Exception: continue`", "hard"),
    Doc("doc11", C_HANG, "a hang in one C call: no Python signal handler runs", "hard"),
    Doc("doc28", LATE_FINISH, "ends inside its deadline, then its result store stalls past the soft limit", "hard"),
    Doc("doc30", STALL_PAST_LIMIT, "its result store stalls past the time limit", "hard"),
    Doc("doc90", HOLD_AFTER_STORE, "ends ok; held after its result is stored, before its chord counts it, until its "
        "time limit kills it", "hard"),
    Doc("doc29", FETCH_HANG, "a stubborn hang in the chain's head (its fetch)", "after burst"),
))
