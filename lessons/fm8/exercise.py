"""FM-8's exercise (``run_all_fms.py --exercise fm8``): the task, what must hold, the hints (``lab.exercise``)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from lab.exercise import Stated, Task
from lab.lesson import Stop
from lab.observe import Reader
from lessons.fm8.checks import BACKEND_RETURN_SECONDS
from lessons.fm8.scenario import OUTAGE, OUTAGE_DOCS


def _not_done_after_return(r: Reader) -> bool:
    """The backend is up again (as often as it went), the lesson's bound has passed since its last return, and the
    outage's chord body has not ended."""
    side = r.side_readers.get(OUTAGE)
    events = side.events() if side is not None else []
    downs = sum(1 for e in events if e.kind == "backend_down")
    ups = [e.t for e in events if e.kind == "backend_up"]
    return bool(ups) and len(ups) >= downs and time.time() - ups[-1] > BACKEND_RETURN_SECONDS \
        and not any(e.kind == "notify_end" for e in events)


def _early(stated: Stated) -> Sequence[Stop]:
    return ((f"the outage's chord was not done {BACKEND_RETURN_SECONDS:.0f} s after the backend came back",
             _not_done_after_return),)

EXERCISE = Task(
    symptom=f"The run's result backend is a Redis of the lab's own. While {len(OUTAGE_DOCS)} slow documents parse, "
            "the lab stops it for a few seconds, then starts it again with its data. A parse that ends in those "
            "seconds cannot store its result, yet its message is acked: the work is done, its outcome is nowhere, "
            "and the chord stays PENDING for ever.",
    must_hold=(
        f"The outage's chord completes within {BACKEND_RETURN_SECONDS:.0f} s of the backend's return, every "
        "document in it accounted once, and one email.",
        "No message is acked whose outcome was not stored: a member whose store failed runs again, or is "
        "finalised once the backend is back.",
        "notify, which meets the backend's Redis gone while it claims its email, waits for it rather than failing.",
    ),
    hints=(
        "The failure is outside the body: Celery stores the result after the body returned, then acks. Look at "
        "what happens to a late-acked message whose result could not be stored, and where it could go instead.",
        "shared/backend.py's reject_unstored(app) (a message whose outcome was not stored is rejected into the "
        "dead-letter exchange), the drain's send_back_rejected=True in shared/dlq.py, and a RetryPolicy on "
        "redis.ConnectionError for notify's claim (shared/retry.py).",
    ),
    early=_early,
    needs=("redis-server",),
)
