"""FM-4's exercise (``run_all_fms.py --exercise fm4``): the task, what must hold, the hints (``lab.exercise``)."""

from __future__ import annotations

from collections.abc import Sequence

from lab.exercise import Stated, Task
from lab.lesson import Stop
from lab.observe import Reader
from lessons.fm4.checks import OWNER_RECOVERY_SECONDS


def _owner_turned_away(r: Reader) -> bool:
    events = r.events()
    died = next((e.t for e in events if e.kind == "crash" and e.get("when") == "before_send"), None)
    return died is not None and any(e.kind == "notify_retry" and e.get("role") == "chord" and e.t > died for e in events)


def _duplicate_did_not_wait(r: Reader) -> bool:
    """The duplicate ``notify`` ended without one busy-retry, though the first held the pipeline (the lab's gate
    keeps the first between its start and its send until the duplicate met it)."""
    return r.has_event("notify_end", role="duplicate") and not r.has_event("notify_retry", role="duplicate")


def _early(stated: Stated) -> Sequence[Stop]:
    return (("notify's redelivery, after it was killed before sending, was turned away by its own claim",
             _owner_turned_away),
            ("the duplicate notify ended without waiting for the first one, which was sending", _duplicate_did_not_wait))


EXERCISE = Task(
    symptom="A second notify for the same pipeline arrives while the first is sending, and the lab kills the sender "
            "once before it sends and once right after. Every call that reaches the mail API sends: three emails.",
    must_hold=(
        "Exactly one email per pipeline, however often notify runs.",
        "The duplicate notify, which arrives while the first holds the pipeline, waits (a busy-retry) and then "
        "returns sent=False.",
        f"notify killed before it sends is delivered again and sends the email within {OWNER_RECOVERY_SECONDS:.0f} s "
        "of the kill; killed right after sending, its next delivery calls the mail API once more, which must not be "
        "a second email (the mail API is called exactly twice in all; it delivers an idempotency key once).",
        "A notify that the dead-letter drain finalised leaves nothing that holds the pipeline.",
    ),
    hints=(
        "notify is where the email goes out: what tells one delivery of it that another already sent, or is "
        "sending, for the same pipeline? Think of a notify killed after it claimed the work and before it sent, "
        "and of one killed after it sent.",
        "A Redis key per pipeline set only if absent (SET NX) with an expiry: shared/claim.py's NotifyClaim "
        "(acquire, mark_sent), busy_waits for the wait, release_when_dead_lettered, and send_email's "
        "idempotency_key.",
    ),
    early=_early,
)
