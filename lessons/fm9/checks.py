"""FM-9's checks: G9 (a dropped connection, also during a cold shutdown's soft wait, and a member past the consumer
timeout: nothing runs twice at once, the worker serves again, the member ends as an envelope), S9 and S9 hard (the
program before its hard fixes: the member past the consumer timeout comes back; a cut in the soft wait runs a member
twice at once).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from lab.checks import overlaps, side_done, side_of, side_state, summary_of_side
from lab.fm import Fm
from lab.hand import expect_steps
from lab.lesson import LessonChecks, Stop
from lab.observe import Event, Reader, short_doc
from lab.records import Check, Collector, Observations, SideRun
from lessons.fm9.hand import CUT
from lessons.fm9.scenario import CONNLOSS_DOCS, CUTSTORED, CUTSTORED_DOCS, HUNG_DOC
from lessons.fm9.softcut import SOFTCUT, SOFTCUT_DOC


@dataclass(frozen=True)
class ConnlossFindings:
    """What scenario 9's sides ``connloss`` and ``overlong`` show (``lessons.fm9.connloss``)."""

    cuts: list[Event]  # link_cut: the worker's connections dropped, and which member ran then
    overlaps: list[str]  # documents parsed in two processes at once (connloss)
    ran_on: list[str]  # runs that went on to their end after the cut, their message given back meanwhile (connloss)
    exits: list[Event]  # worker_exit: the linked worker ended during the run
    hung_starts: int  # how many times the over-long member's parse began
    hung_back: int  # how many times its message came back to a worker (the broker's timeout closed its channel)
    hung_cut: int  # how many of its runs Celery cancelled on a lost connection (that timeout's 406 closed the channel)
    hung_end: str  # how the over-long member ended in its chord's summary


def connloss_findings(connloss: SideRun | None, overlong: SideRun | None) -> ConnlossFindings:
    events = [*(connloss.events if connloss else ()), *(overlong.events if overlong else ())]
    failed = overlong.failed(HUNG_DOC) if overlong is not None else None
    return ConnlossFindings(
        cuts=[e for e in events if e.kind == "link_cut"],
        overlaps=overlaps(connloss.events) if connloss else [],
        ran_on=_ran_on(connloss.events) if connloss else [],
        exits=[e for e in events if e.kind == "worker_exit"],
        hung_starts=sum(1 for e in (overlong.events if overlong else ()) if e.kind == "attempt_start" and e.get("doc") == HUNG_DOC),
        hung_back=max(0, sum(1 for e in (overlong.events if overlong else ()) if e.kind == "received" and e.get("doc") == HUNG_DOC) - 1),
        hung_cut=sum(1 for e in (overlong.events if overlong else ()) if e.kind == "cancelled" and e.get("doc") == HUNG_DOC),
        hung_end=f"failed {failed.get('reason')}" if failed is not None else "no outcome")


def _ran_on(events: Sequence[Event]) -> list[str]:
    """The parses running at a cut that were not stopped: each ended after it other than ``cancelled``, while its
    message had come back to the worker (``received`` again) before that end, or ``RAN_ON_SECONDS`` or more after the
    cut. The cut closes the connection, and RabbitMQ gives back every message it held unacked there and then (fm8's
    run shows the copy received 0.08 s after the cut); with ``fence_redeliveries`` the copy is read only once the
    first run has ended, so its ``received`` cannot be the only sign. The margin lets a body that ended in the
    moment before Celery read the loss go."""
    found: list[str] = []
    for cut in (e for e in events if e.kind == "link_cut"):
        started = {e.get("task"): e for e in events if e.kind == "attempt_start" and e.t <= cut.t}
        for e in events:
            if e.kind != "attempt_end" or e.t <= cut.t or e.get("outcome") == "cancelled" or e.get("task") not in started \
                    or started[e.get("task")].get("attempt") != e.get("attempt"):
                continue
            back = [r.t for r in events if r.kind == "received" and r.get("task") == e.get("task") and cut.t < r.t < e.t]
            if back:
                found.append(f"{e.get('doc')} attempt {e.get('attempt')} ran on {e.t - cut.t:.2f}s after the cut to its end "
                             f"({e.get('outcome')}), its message back {back[0] - cut.t:.2f}s after the cut")
            elif e.t - cut.t >= RAN_ON_SECONDS:
                found.append(f"{e.get('doc')} attempt {e.get('attempt')} ran on {e.t - cut.t:.2f}s after the cut to its end "
                             f"({e.get('outcome')}), its message given back by the cut")
    return found


def g9(obs: Observations, fm: Fm) -> Check:
    c = Collector("G9")
    connloss, overlong = side_of(c, obs, "connloss"), side_of(c, obs, "overlong")
    if connloss is None or overlong is None:
        return c.result()
    f = connloss_findings(connloss, overlong)
    by_hand = not any(e.kind == "linked" for e in connloss.events)  # by hand the drop is yours, and the broker's timeout
    if by_hand:  # the cut asked for when the submitter said so, and carried out while a member ran (lessons.fm9.hand)
        expect_steps(c, connloss.events, [CUT])
    else:
        cuts = ", ".join(f"{e.get('connections')} connections while {e.get('running')} ran" for e in f.cuts)
        c.expect(len(f.cuts) == 1 and f.cuts[0].get("running") in CONNLOSS_DOCS, f"cut: {cuts or 'never'}",
                 "once, while a member ran")
    c.expect(not f.overlaps, f"parsed twice at once: {'; '.join(f.overlaps) or 'none'}", "none")
    c.expect(not f.ran_on, f"ran on after its message went back: {'; '.join(f.ran_on) or 'none'}", "none (cancelled)")
    for side in (connloss, overlong):
        summary = summary_of_side(side)
        ok = sorted(short_doc(str(d)) for d in summary.get("ok", []))
        wanted = sorted(d for d in side.docs if side is connloss or d != HUNG_DOC)
        c.expect(side_done(side) and ok == wanted and len(side.emails) == 1,
                 f"{side.tag} chord {side_state(side)}: ok {', '.join(ok) or 'none'}, emails {len(side.emails)}",
                 f"SUCCESS, ok {', '.join(wanted)} (each once), 1 email")
    c.expect(not f.exits, f"the linked worker exited: {', '.join(e.get('code') for e in f.exits) or 'no'}",
             "no: it reconnects and serves again")
    # its message back is read where Celery receives it: a copy FM-9's run fence holds until the first run ends may
    # come after the run is over; the cancel the broker's 406 brings is read at once (fm9a held G9 on "back 0x" so)
    c.expect(f.hung_starts == 1 and f.hung_back == 0 and f.hung_cut == 0 and f.hung_end == "failed time_limit",
             f"the over-long member parsed {f.hung_starts}x, its message back {f.hung_back}x, its run cancelled on a "
             f"lost connection {f.hung_cut}x, {f.hung_end}",
             "1x, never back, never cancelled, failed time_limit (its kill before the broker's consumer timeout)")
    if (cutstored := obs.sides.get(CUTSTORED)) is not None:
        _cut_after_store(c, cutstored, by_hand)
    if (softcut := obs.sides.get(SOFTCUT)) is not None:  # the cut in a soft shutdown wait (lessons.fm9.softcut)
        _soft_wait_cut(c, softcut, by_hand)
        if not by_hand:
            _soft_wait_cancel(c, softcut)
        twice = overlaps(softcut.events)
        c.expect(not twice, f"{SOFTCUT}: parsed twice at once: {'; '.join(twice) or 'none'}",
                 "none (cancelled at the cut, the copy held by the run fence until that run ended)")
        ok = sorted(short_doc(str(d)) for d in summary_of_side(softcut).get("ok", []))
        c.expect(side_done(softcut) and ok == [SOFTCUT_DOC] and len(softcut.emails) == 1,
                 f"{SOFTCUT} chord {side_state(softcut)}: ok {', '.join(ok) or 'none'}, emails {len(softcut.emails)}",
                 f"SUCCESS, ok {SOFTCUT_DOC}, 1 email")
    return c.result()


def _cut_after_store(c: Collector, side: SideRun, by_hand: bool) -> None:
    """The cut that meets a member between its result's store and its count (the side ``cutstored``): Celery's cancel
    ends it there, its message comes back to a stored SUCCESS, and FM-7's ``count_stored_members`` counts it, once."""
    doc, events = CUTSTORED_DOCS[0], side.events
    held = sum(1 for e in events if e.kind == "stored_uncounted")
    cuts = sum(1 for e in events if e.kind == "link_cut")
    cancels = sum(1 for e in events if e.kind == "cancelled" and e.get("doc") == doc)
    ended = sum(1 for e in events if e.kind == "ended_after_store")
    received = sum(1 for e in events if e.kind == "received" and e.get("doc") == doc)
    runs = side.attempts.get(doc, 0)
    said = (f"{CUTSTORED}: {doc} held after its store {held}x, cut there {cuts}x, cancelled there {cancels}x, its "
            f"process gone there {ended}x, delivered {received}x, its body run {runs}x")
    if by_hand:  # no cut is aimed at it by hand: Celery's time limit ends its hold
        c.seen.append(f"by hand, no cut is aimed at {doc}: {said}")
    else:
        c.expect(held == 1 and cuts == 1 and cancels == 1 and ended == 1 and received >= 2 and runs == 1, said,
                 "held 1x, cut 1x, cancelled 1x, gone 1x, delivered 2x or more, its body run 1x (every redelivery "
                 "deduplicated)")
    ok = sorted(short_doc(str(d)) for d in summary_of_side(side).get("ok", []))
    c.expect(side_done(side) and ok == sorted(side.docs) and len(side.emails) == 1,
             f"{CUTSTORED} chord {side_state(side)}: ok {', '.join(ok) or 'none'}, emails {len(side.emails)}",
             f"SUCCESS, ok {', '.join(sorted(side.docs))} (each once), 1 email")


def _soft_wait_cut(c: Collector, softcut: SideRun, by_hand: bool) -> None:
    """The side ``softcut``'s own steps: a SIGTERM while its member ran, then the cut during the soft wait (by hand,
    where nobody stops a worker, the side is a slow member alone)."""
    if by_hand:
        return
    kinds = [e.kind for e in softcut.events if e.kind in ("soft_term", "soft_cut", "soft_missed")]
    c.expect(kinds == ["soft_term", "soft_cut"], f"{SOFTCUT}: {', '.join(kinds) or 'nothing done'}",
             "soft_term, soft_cut (SIGTERM while the member ran, the cut once the soft wait began)")


def _soft_wait_cancel(c: Collector, softcut: SideRun) -> None:
    """G9's rule for connloss, in the soft wait too: the body the cut met does not run on once its message has gone
    back. ``lab.observe`` records a cancel ``in_wait`` when it comes while Celery's soft wait still sleeps (the cold
    shutdown's own cancel comes after the wait, 0.3 s after the SIGTERM: the body ran on until then)."""
    cancels = [e for e in softcut.events if e.kind == "cancelled" and e.get("doc") == SOFTCUT_DOC]
    cut = next((e.t for e in softcut.events if e.kind == "soft_cut"), None)
    said = ", ".join(f"{'in the wait' if e.get('in_wait') else 'after the wait'} {max(0.0, e.t - cut):.2f}s after the cut"
                     if cut is not None else "before any cut" for e in cancels)
    c.expect(any(e.get("in_wait") for e in cancels),
             f"{SOFTCUT}: {SOFTCUT_DOC}'s run cancelled {said or 'never'}",
             "in the soft wait, at the cut (not only by the cold shutdown after the wait: the body ran on meanwhile, "
             "its message back in the broker)")


def s9(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S9")
    connloss, overlong = side_of(c, obs, "connloss"), side_of(c, obs, "overlong")
    if connloss is None or overlong is None:
        return c.result()
    f = connloss_findings(connloss, overlong)
    c.expect(bool(f.cuts) and bool(f.overlaps or f.ran_on),
             f"cut while {', '.join(e.get('running') for e in f.cuts) or 'nothing'} ran; parsed twice at once: "
             f"{'; '.join(f.overlaps) or 'none'}; ran on after its message went back: {'; '.join(f.ran_on) or 'none'}",
             "the running member not stopped: run twice at once, or on to its end with its message given back")
    c.expect(bool(f.exits) or f.hung_starts > 1,
             f"the linked worker exited: {', '.join(e.get('code') for e in f.exits) or 'no'}; "
             f"the over-long member parsed {f.hung_starts}x ({f.hung_end})",
             "the worker ends at the consumer timeout, or the member runs again")
    return c.result()


def s9_hard(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S9 hard")
    if (overlong := side_of(c, obs, "overlong")) is None:
        return c.result()
    f = connloss_findings(obs.sides.get("connloss"), overlong)
    twice = overlaps(overlong.events)
    c.expect(f.hung_back >= 1, f"the over-long member's message back {f.hung_back}x (parsed {f.hung_starts}x, {f.hung_end})",
             "back at least once: the broker's timeout closed its channel before Celery's kill")
    c.seen.append(f"a run begun while one before had no end (a cancel cannot reach C code): {'; '.join(twice) or 'none'}")
    c.expect(not f.exits, f"the linked worker exited: {', '.join(e.get('code') for e in f.exits) or 'no'}",
             "no (broker_channel_error_retry)")
    if (softcut := side_of(c, obs, SOFTCUT)) is None:
        return c.result()
    _soft_wait_cut(c, softcut, False)
    twice = overlaps(softcut.events)
    ran_on = _ran_on_after_soft_cut(softcut)
    left = wait_left_at_cut(softcut, float(fixed.app.conf.worker_soft_shutdown_timeout or 0.0))
    wanted = min(RAN_ON_SECONDS, left - WAIT_END_SLACK) if left is not None else RAN_ON_SECONDS
    c.expect(bool(twice) or (ran_on >= wanted and wanted >= MIN_TELLING),
             f"{SOFTCUT}: parsed twice at once: {'; '.join(twice) or 'none'}; the first run ended {ran_on:.2f}s after the "
             f"cut, {'?' if left is None else f'{left:.2f}'}s before the soft wait's end",
             f"its member begun again while the first run went on, or that run on to the soft wait's end "
             f"({wanted:.2f}s or more after the cut) with its message back in the broker: no cancel until then")
    return c.result()


RAN_ON_SECONDS = 0.15
"""S9 hard: without a cancel at the cut, the first run of the soft wait's member ends at the wait's end (0.3 s after the
SIGTERM, so about 0.25 s after the cut); with one, within the cancel's time (0.001 to 0.08 s in the runs here). On a
loaded machine the cut comes later in the wait (0.10 s before its end once at load 13): the run must then go on to
the wait's end, less ``WAIT_END_SLACK``; a cut less than ``MIN_TELLING`` + that slack before the end cannot tell."""
WAIT_END_SLACK = 0.03
MIN_TELLING = 0.05


def wait_left_at_cut(softcut: SideRun, soft_timeout: float) -> float | None:
    """How long the soft wait had still to run when its cut came (the SIGTERM's send, plus the wait, less the cut)."""
    term = next((e for e in softcut.events if e.kind == "soft_term"), None)
    cut = next((e.t for e in softcut.events if e.kind == "soft_cut"), None)
    if term is None or cut is None:
        return None
    return float(term.get("sent") or term.t) + soft_timeout - cut


def _ran_on_after_soft_cut(softcut: SideRun) -> float:
    """How long after the soft wait's cut the member's first run ended (0 when either is missing)."""
    cut = next((e.t for e in softcut.events if e.kind == "soft_cut"), None)
    end = next((e.t for e in softcut.events if e.kind == "attempt_end" and e.get("doc") == SOFTCUT_DOC
                and e.get("attempt") == "1"), None)
    return end - cut if cut is not None and end is not None else 0.0


HUNG_WAIT = 8.0
"""S9 hard's stop: the over-long member, stuck in C code, began this long ago and the run goes on (its
``time_limit`` is 3 s, the node's consumer timeout 2.4 s)."""


def _hung_for(r: Reader, seconds: float) -> bool:
    side = r.side_readers.get("overlong")
    starts = [e.t for e in side.events() if e.kind == "attempt_start" and e.get("doc") == HUNG_DOC] if side else []
    return bool(starts) and time.time() - starts[0] > seconds


def _overlong_broke(r: Reader) -> bool:
    """S9's stop: the side ``overlong``'s worker is gone, or its hung member began a second time."""
    sides = [r.side_readers.get(tag) for tag in ("connloss", "overlong")]
    events = [e for side in sides if side is not None for e in side.events()]  # the exit is seen by either
    return any(e.kind == "worker_exit" for e in events) or sum(
        1 for e in events if e.kind == "attempt_start" and e.get("doc") == HUNG_DOC) > 1


def _symptom_stop(fixed: Fm, program: Fm) -> Stop | None:
    return ("the linked worker exited, or the over-long member ran again", _overlong_broke)


def _hard_stop(fixed: Fm, program: Fm) -> Stop | None:
    return (f"the over-long member ran a second time, or had no outcome {HUNG_WAIT:.0f}s after it began",
            lambda r: _overlong_broke(r) or _hung_for(r, HUNG_WAIT))


CHECKS = LessonChecks(
    guarantee=g9, symptom=s9, symptom_stop=_symptom_stop, hard_symptom=s9_hard, hard_stop=_hard_stop,
    words={
        "G9": "connection cut mid-member: no run twice at once, worker serves on; over-long member an envelope",
        "S9": "connection cut: a running member not stopped (run twice at once); consumer timeout ends the worker",
        "S9 hard": "no limit below the consumer timeout: the stuck member's message comes back (406); a cut in a "
                   "soft shutdown wait: a member runs twice at once",
    },
)
