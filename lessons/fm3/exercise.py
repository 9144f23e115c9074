"""FM-3's exercise (``run_all_fms.py --exercise fm3``): the task, what must hold, the hints (``lab.exercise``)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from lab.exercise import Stated, Task
from lab.lesson import Stop
from lab.observe import Reader

DELIVERIES = 3
"""The lesson's bound: a message that kills its worker is delivered this many times, then set aside."""
UNFINALISED_SECONDS = 15.0
"""A poison document delivered up to the bound and neither finalised nor kept by a drain this long after its last
delivery began is one no drain will finalise (the lab's drain runs every 0.25 s and finalises within about 1 s)."""


def _left_in_dlq(r: Reader, bound: int) -> bool:
    events = r.events()
    starts = [e.t for e in events if e.kind == "attempt_start" and e.get("doc") == "doc4"]
    handled = any(e.kind in ("dead_lettered", "dead_letter_kept") and e.get("doc") == "doc4" for e in events)
    return len(starts) >= bound and not handled and time.time() - starts[-1] > UNFINALISED_SECONDS


def _early(stated: Stated) -> Sequence[Stop]:
    bound = stated.delivery_bound or DELIVERIES
    return (
        (f"doc4 was delivered more than {bound} times", lambda r: r.attempts("doc4") > bound),
        (f"doc4 was delivered {bound} times and nothing finalised it within {UNFINALISED_SECONDS:.0f} s",
         lambda r: _left_in_dlq(r, bound)),
        ("doc9's dead letter stayed in the dead-letter queue: nothing finalised it",
         lambda r: r.has_event("dead_letter_kept", doc="doc9")),
    )


EXERCISE = Task(
    symptom=f"doc4's parse SIGKILLs its process on every delivery (a poison message). The broker delivers it again "
            f"after each kill, for ever: the chord never completes and notify never runs. The check stops as soon as "
            f"doc4 has been delivered more than {DELIVERIES} times.",
    must_hold=(
        f"A message that kills its process on every delivery is delivered exactly {DELIVERIES} times, then taken "
        f"off the task queue; its document ends as a failure with reason dead_lettered and the error "
        f"'parse_document dead-lettered by the broker (delivery_limit) after {DELIVERIES} deliveries, "
        f"{DELIVERIES} started', and the chord completes with one email.",
        f"The same when the poison is the chain's head (doc9: fetched {DELIVERIES} times, never parsed, "
        f"'fetch_document dead-lettered ...') and when it is the chord's body (a chord of its own whose notify kills "
        f"its caller: that chord's result is a SUCCESS envelope with reason dead_lettered, no email).",
        "Nothing is left in a dead-letter queue afterwards; 201 letters there that are no Celery task are set apart "
        "(parked, each announced) and do not hold up a poison document behind them.",
    ),
    hints=(
        "Where does a message go that the broker will not deliver again, and who turns it into a document's "
        "failure? The queue is declared in the app's configuration (task_queues); the chord waits for an outcome "
        "stored for every member.",
        "RabbitMQ quorum queues count deliveries (queue arguments x-queue-type=quorum, x-delivery-limit, and a "
        "dead-letter exchange). shared/dlq.py has DeadLetteringQueue, count_starts and drain, which a beat task "
        "(Celery's beat_schedule, the worker's -B) can run to finalise each dead letter.",
    ),
    stated=Stated(delivery_bound=DELIVERIES),
    early=_early,
)
