"""What FM-3's lesson adds to the scenarios: poison, in a chord member, in a chain head, in a chord body, and
behind letters no drain can place.

The side ``body``'s mail API kills every caller (the chord body is the poison); the side ``behind`` is sent once
the run's dead letters were handled, behind ``foreign_letters(fm)`` messages that are no Celery task, put in the
DLQ first (``ForeignLetters``), so that no drain that puts them back can reach the poison member behind them.
"""

from __future__ import annotations

from kombu import Producer

from lab.faults import FETCH_POISON, POISON
from lab.fm import Fm
from lab.injector import Injector, RunView, SideView
from lab.observe import FOREIGN_RUN_HEADER
from lab.scenarios import Doc, Part, SideChord
from shared.dlq import DRAIN_BATCH

BODY = "body"
"""The side chord whose chord body is the poison."""
BEHIND = "behind"
"""The side chord whose poison member waits behind the foreign letters."""
POISONED = ("POISON", "FETCH_POISON")
"""The faults whose messages the broker dead-letters at its delivery bound."""


def foreign_letters(fm: Fm) -> int:
    """The letters the drain cannot place put in the DLQ before the side ``behind``: one more than the drains the
    worker may run at once (one per pool process) read in a pass each, so that no drain that puts them back can
    reach a letter behind them."""
    return fm.concurrency * DRAIN_BATCH + 1


def put_foreign_letters(fm: Fm, run_id: str, count: int) -> None:
    """Put ``count`` messages that are no Celery task into the FM's DLQ: what a producer that is not Celery, or a
    tool, leaves there. Each names the run in a header, for the observer."""
    dlq = fm.dead_letter_queue
    if dlq is None:
        return
    with fm.app.connection_for_write() as conn:
        producer = Producer(conn.default_channel)
        for i in range(count):
            producer.publish(f"foreign letter {i} of run {run_id}".encode(), exchange=dlq.exchange,
                             routing_key=dlq.routing_key, content_type="text/plain", content_encoding="utf-8",
                             headers={FOREIGN_RUN_HEADER: run_id}, serializer=None, declare=[dlq], retry=True)


class PoisonMail(Injector):
    """Sends its side chord with every call of its mail API killing its caller (``lab.pipeline.send_email``)."""

    def send(self, run: RunView, side: SideView) -> None:
        side.reader.rec.put("poison_mail", "1")
        side.submit()


class ForeignLetters(Injector):
    """Once the drain has finalised, or kept, every letter the run's poison made (its documents', the poison
    body's), puts ``foreign_letters(fm)`` letters in the DLQ and sends its side chord behind them. A program
    with no DLQ gets neither."""

    def ready(self, run: RunView, side: SideView) -> bool:
        return run.fm.dead_letter_queue is not None and _dead_letters_handled(run)

    def busy(self, run: RunView) -> bool:
        side = run.side(BEHIND)
        return run.fm.dead_letter_queue is not None and side is not None and not side.sent

    def send(self, run: RunView, side: SideView) -> None:
        count = foreign_letters(run.fm)
        put_foreign_letters(run.fm, run.run_id, count)
        run.reader.rec.event("foreign_letters", count=count)
        side.submit()


def _dead_letters_handled(run: RunView) -> bool:
    """Every poison document's letter, and the poison body's, is handled: the lab's drain said so (finalised or kept),
    or, whoever drains, what it stands for has its outcome stored (the member's result, the body's chord result)."""
    handled = {e.get("doc") or "body" for e in run.reader.events() if e.kind in ("dead_lettered", "dead_letter_kept")}
    docs = [d for d, f in run.faults.items() if f is not None and f.kind in POISONED]
    if not all(d in handled or run.reader.member_state(d) == "SUCCESS" for d in docs):
        return False
    body = run.side(BODY)
    return body is None or not body.sent or body.ready() or any(
        e.kind in ("dead_lettered", "dead_letter_kept") and not e.get("doc") for e in body.reader.events())


PART = Part(
    docs=(Doc("doc4", POISON, "a poison member: SIGKILLs its process on every attempt"),
          Doc("doc9", FETCH_POISON, "a poison chain head: its fetch SIGKILLs its process on every attempt", "hard")),
    sides=(SideChord(BODY, (Doc("doc32", None, "a healthy document, in a chord whose body is the poison"),),
                     "a poison chord body: every call of its mail API kills its caller", purpose="a poison notify",
                     injector="poison mail"),
           SideChord(BEHIND, (Doc("doc33", POISON, "a poison member sent behind letters no drain can place"),),
                     "a poison member queued behind more dead letters than a drain reads in a pass",
                     purpose="a poison member behind {foreign} letters no drain can place", injector="foreign letters")),
    injectors={"poison mail": PoisonMail, "foreign letters": ForeignLetters},
)
