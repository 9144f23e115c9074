"""FM-8's checks: G8 (the result backend goes away and comes back: the chord completes, nothing acked whose
outcome was not stored) and S8 (members acked and lost, the chord not done).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from lab.checks import overlaps, side_done, side_of, side_state, summary_of_side
from lab.fm import Fm
from lab.hand import expect_steps
from lab.lesson import LessonChecks, Stop
from lab.observe import Event, Reader, short_doc
from lab.records import Check, Collector, Observations, SideRun
from lessons.fm8.hand import START, STOP


BACKEND_RETURN_SECONDS = 12.0
"""G8: the side chord ``outage`` is done (its ``notify`` ended) within this of the backend's last return.
What is then left to do: the members the drain sends back run again (a pass every 0.25 s, 0.8 s a
body), and ``notify``, whose claim met the outage, waits out its retry's backoff (fm8's
``BACKEND_GONE``: a delay of 0.5 x 2^k to twice that, k the retries so far; the 2 s outage fits in
k = 0..1, so the retry after the return may be up to 4 s away, and one of the 10 s an outage may last
on a loaded machine (``lessons.fm8.outage.OUTAGE_MAX_SECONDS``) in k = 0..3, up to 8 s), then sends once
more, the mail API deduplicating on the claim's key."""


@dataclass(frozen=True)
class OutageFindings:
    """What scenario 8's side chord ``outage`` shows (``lessons.fm8.outage``)."""

    downs: list[Event]  # backend_down, per phase
    ups: list[Event]  # backend_up, per phase
    failed: list[Event]  # store_failed: a body ended and its result could not be stored
    lost: list[str]  # what failed to store and never ran again: its message was acked, its outcome lost
    done_after: float | None  # seconds from the last backend_up to the end of the side's notify


def outage_findings(side: SideRun) -> OutageFindings:
    events = side.events
    downs = [e for e in events if e.kind == "backend_down"]
    ups = [e for e in events if e.kind == "backend_up"]
    failed = [e for e in events if e.kind == "store_failed"]
    # What must follow a failed store: a member or notify runs again; a chain head's outcome travels in the
    # parse it sent before its store (celery.app.trace), so that parse must have started, before or after.
    lost = [f"{e.get('doc') or 'notify'} ({e.get('stage')})" for e in failed
            if not any(later.get("doc") == e.get("doc") and (
                later.kind == "attempt_start" if e.get("stage") == "fetch_document" else
                later.kind == ("attempt_start" if e.get("stage") == "parse_document" else "notify_start") and later.t > e.t)
                for later in events)]
    ends = [e.t for e in events if e.kind == "notify_end"]
    back = float(ups[-1].get("since") or ups[-1].t) if ups else None  # the server started, not the event written
    done_after = max(ends) - back if ends and back is not None and max(ends) > back else None
    return OutageFindings(downs, ups, failed, lost, done_after)


def g8(obs: Observations, fm: Fm) -> Check:
    c = Collector("G8")
    if (side := side_of(c, obs, "outage")) is None:
        return c.result()
    f = outage_findings(side)
    by_hand = not f.downs  # the harness stops the backend itself; by hand the outage is yours (lessons.fm8.hand)
    if by_hand:
        expect_steps(c, side.events, [STOP, START])
    else:
        held = ", ".join(f"{e.get('phase')} {e.get('seconds')}s" for e in f.ups)
        c.expect([e.get("phase") for e in f.ups] == ["members", "notify"], f"backend stopped and started again: {held}",
                 "once while members stored, once while notify held its claim")
    c.expect(any(e.get("stage") == "parse_document" for e in f.failed),
             f"{'by hand: ' if by_hand else ''}stores that failed: {len(f.failed)} "
             f"({', '.join(sorted({e.get('doc') or 'notify' for e in f.failed})) or 'none'})",
             "at least one member's (stop the backend while the side chord runs)" if by_hand
             else "at least one member's (the outage must meet a store)")
    summary = summary_of_side(side)
    n_ok, n_failed = len(summary.get("ok", [])), len(summary.get("failed", []))
    once = sorted(short_doc(str(d)) for d in summary.get("ok", [])) == sorted(side.docs)
    c.expect(side_done(side) and once and n_failed == 0 and len(side.emails) == 1,
             f"outage chord {side_state(side)}: {n_ok} ok, {n_failed} failed of {len(side.docs)}, emails {len(side.emails)}",
             f"SUCCESS, all {len(side.docs)} ok, 1 email")
    after = f.done_after
    c.expect(by_hand or (after is not None and after <= BACKEND_RETURN_SECONDS),
             f"done {'never' if after is None else f'{after:.2f}s'} after the backend's last return",
             f"within {BACKEND_RETURN_SECONDS:.0f}s")
    c.expect(not f.lost, f"acked with its outcome unstored: {', '.join(f.lost) or 'none'}", "none")
    twice = overlaps(side.events)
    c.expect(not twice, f"parsed twice at once: {'; '.join(twice) or 'none'}", "none")
    return c.result()


def s8(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S8")
    if (side := side_of(c, obs, "outage")) is None:
        return c.result()
    f = outage_findings(side)
    back = f.ups[0].t if f.ups else None
    c.expect(back is not None and bool(f.lost) and not side_done(side),
             f"{len(f.failed)} stores failed; acked with the outcome unstored: {', '.join(f.lost) or 'none'}; "
             f"outage chord {side_state(side)}",
             "members acked and lost, the chord not done after the backend was back")
    return c.result()


def _outage_outlived(r: Reader) -> bool:
    """S8's stop: G8's bound has passed since the backend came back from the members' outage."""
    side = r.side_readers.get("outage")
    ups = [e.t for e in side.events() if e.kind == "backend_up"] if side is not None else []
    return bool(ups) and time.time() - ups[0] > BACKEND_RETURN_SECONDS


def _symptom_stop(fixed: Fm, program: Fm) -> Stop | None:
    return (f"the outage chord not done {BACKEND_RETURN_SECONDS:.0f}s after the backend's return", _outage_outlived)


CHECKS = LessonChecks(
    guarantee=g8, symptom=s8, symptom_stop=_symptom_stop,
    words={
        "G8": "backend outage mid-chord: every member whose store failed runs again, chord whole, one email",
        "S8": "backend outage: members acked with no result, chord PENDING",
    },
)
