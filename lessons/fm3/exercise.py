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
"""A poison document delivered up to the bound whose chord member has no stored outcome this long after its last
delivery began is one no drain will finalise (the lab's drain runs every 0.25 s and finalises within about 1 s)."""


def _left_in_dlq(r: Reader, doc: str, bound: int, kind: str) -> bool:
    """``doc``'s poison (its parse, ``kind="attempt_start"``, or its fetch, ``"fetch_start"``) was delivered up to
    the bound, and ``UNFINALISED_SECONDS`` later its chord member still has no stored outcome: judged on the result
    backend, whoever drains (the lab's drain's own word, when it kept the letter, counts too)."""
    starts = [e.t for e in r.events_of(kind) if e.get("doc") == doc]
    if len(starts) < bound or time.time() - starts[-1] <= UNFINALISED_SECONDS:
        return False
    return r.member_state(doc) != "SUCCESS" and not r.has_event("dead_lettered", doc=doc)


def _early(stated: Stated) -> Sequence[Stop]:
    bound = stated.delivery_bound or DELIVERIES
    return (
        (f"doc4 was delivered more than {bound} times", lambda r: r.attempts("doc4") > bound),
        (f"doc4 was delivered {bound} times and nothing finalised it within {UNFINALISED_SECONDS:.0f} s",
         lambda r: _left_in_dlq(r, "doc4", bound, "attempt_start")),
        (f"doc9's fetch was delivered {bound} times and nothing finalised it within {UNFINALISED_SECONDS:.0f} s",
         lambda r: _left_in_dlq(r, "doc9", bound, "fetch_start")),
        ("doc9's dead letter stayed in the dead-letter queue: nothing finalised it",
         lambda r: r.has_event("dead_letter_kept", doc="doc9")),
    )


EXERCISE = Task(
    symptom=f"doc4's parse SIGKILLs its process on every delivery (a poison message). The broker delivers it again "
            f"after each kill, for ever: the chord never completes and notify never runs. The check stops as soon as "
            f"doc4 has been delivered more than {DELIVERIES} times.",
    must_hold=(
        f"A message that kills its process on every delivery is delivered at most {DELIVERIES} times, then taken "
        f"off the task queue; its chord member is finalised as a failure envelope with reason dead_lettered (the "
        f"error's words are yours), and the chord completes with one email.",
        f"The same when the poison is the chain's head (doc9: fetched at most {DELIVERIES} times, never parsed) and "
        f"when it is the chord's body (a chord of its own whose notify kills its caller: that chord's result is a "
        f"SUCCESS envelope with reason dead_lettered, no email).",
        "Nothing is left in the dead-letter queue afterwards; 201 letters there that are no Celery task are set apart "
        "(kept, in a queue the program declares beside it) and do not hold up a poison document behind them. The "
        "check finds the dead-letter queue by the task queue's x-dead-letter-exchange and routing key, among the "
        "kombu Queues the module holds at its top level.",
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
