"""FM-7's checks: G7 (rolling deploys: every document accounted once, none dead-lettered, none parsed twice at
once, none killed mid-body at a grace's end whose start the worker had read by its SIGTERM) and S7 (one of these
broken). A body whose start the worker had not read by then (it began as the SIGTERM came) is beyond Celery's
cancel: it is killed at the grace and its message runs again, once; G7 lists it (``unread_at_term``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from lab.checks import overlaps, side_done, side_of, side_state, summary_of_side
from lab.fm import Fm
from lab.hand import by_hand, expect_steps
from lab.lesson import LessonChecks, Stop
from lab.observe import Event, Reader, short_doc
from lab.records import Check, Collector, Observations, SideRun
from lessons.fm7.hand import NEW, TERM
from lessons.fm7.scenario import CANCELLED_DOCS, DEPLOY, DEPLOYS, STORED_DOCS
from lessons.fm7.stored import CANCELLED, STORED


MIN_DEPLOYS = 2
"""G7: the runner aims at the scenario's 3 deploys; each needs a new worker booted while slow documents
remain (1 to 5 s on the lab's loaded two-core machine), so a run with 2 counts (the issue's "at least two")."""


def _deploys_of(obs: Observations) -> int:
    return DEPLOYS if "deploy" in obs.sides else 0


@dataclass(frozen=True)
class DeployFindings:
    """What scenario 7's side chord ``deploy`` shows about its deploys (``lessons.fm7.deploy``)."""

    terms: list[Event]
    ends: list[str]  # per deploy: "exited after 1.234s" or "SIGKILLed after 0.600s"
    lost: list[str]  # documents whose body ran at a SIGTERM and was still running when its SIGKILL came
    unread: list[str]  # of those, the ones whose start the old main process had not read by the SIGTERM (see below)
    overtaken: list[str]  # of the others, the ones its cold shutdown had in hand when the SIGKILL came (see below)
    late: list[str]  # documents whose body began after a SIGTERM and was killed at its grace's end
    dead: list[str]  # documents dead-lettered, with what the drain wrote
    overlaps: list[str]  # documents parsed in two processes at once
    sent_back: list[str]  # documents the drain found innocent at their delivery limit and published again (FM-7)
    repeated: list[str]  # documents whose fetch or parse ran again after it had ended ok (its ack never sent)
    cancels: list[str]  # per deploy: the bodies the old worker cancelled, each with how long after its SIGTERM


def deploy_findings(side: SideRun, soft_timeout: float) -> DeployFindings:
    """``soft_timeout``: the program's ``worker_soft_shutdown_timeout`` (see ``cancelled_before_kill``)."""
    events = side.events
    terms = [e for e in events if e.kind == "deploy_term"]
    finals = {e.get("n"): e for e in events if e.kind in ("deploy_exit", "deploy_kill")}
    ends = [f"{'SIGKILLed' if (f := finals.get(t.get('n'))) is not None and f.kind == 'deploy_kill' else 'exited'}"
            f" after {f.get('seconds') if f is not None else '?'}s" for t in terms]
    lost, late = killed_at_grace(events)
    unread = unread_at_term(events, lost)
    overtaken = cancelled_before_kill(events, [d for d in lost if d not in unread], soft_timeout)
    dead = [f"{d} ({(side.failed(d) or {}).get('error', 'its chord member had already ended ok: counted twice')})" for d in side.docs
            if any(e.kind == "dead_lettered" and e.get("doc") == d for e in events)]
    sent_back = [f"{e.get('doc')} ({e.get('why')})" for e in events if e.kind == "sent_back"]
    return DeployFindings(terms, ends, lost, unread, overtaken, late, dead, overlaps(events), sent_back, _repeats(events),
                          cancels_after_term(events))


def sigterm_sent(term: Event) -> float:
    """When a deploy's SIGTERM was sent (``sent``; a record from before it was kept: the event's own, later, time)."""
    return float(term.get("sent") or term.t)


def cancels_after_term(events: Sequence[Event]) -> list[str]:
    """Per deploy, the bodies its old worker's cold shutdown cancelled (``cancelled``, ``lab.observe``), each with
    how long after the SIGTERM: the soft wait, then what the main process took to get to its cancel."""
    out: list[str] = []
    terms = [e for e in events if e.kind == "deploy_term"]
    for term in terms:
        pid, n, sent = term.get("old_pid"), term.get("n"), sigterm_sent(term)
        done = [e for e in events if e.kind in ("deploy_exit", "deploy_kill") and e.get("n") == n]
        end = done[0].t if done else float("inf")
        cut = [f"{e.get('doc')} {'waited' if e.kind == 'soft_wait' else 'cancelled'} at {e.t - sent:.2f}s"
               for e in events if e.kind in ("soft_wait", "cancelled") and e.get("pid") == pid and sent <= e.t <= end]
        out.append(f"deploy {n}: {', '.join(cut) or 'none'}")
    return out


_STAGES = {"fetch_start": "fetch", "fetch_end": "fetch", "attempt_start": "parse", "attempt_end": "parse"}


def killed_at_grace(events: Sequence[Event]) -> tuple[list[str], list[str]]:
    """The documents a deploy's SIGKILL killed mid-body: those whose body ran at its SIGTERM (the soft
    shutdown should have cut them), and those whose body began after it (Celery cannot cancel those)."""
    running = {e.get("n"): set(e.get("running").split(",")) for e in events if e.kind == "deploy_term"}
    killed = [(doc, e.get("n")) for e in events if e.kind == "deploy_kill" for doc in e.get("lost").split(",") if doc]
    return ([doc for doc, n in killed if doc in running.get(n, set())],
            [doc for doc, n in killed if doc not in running.get(n, set())])


def unread_at_term(events: Sequence[Event], lost: Sequence[str]) -> list[str]:
    """Of the bodies a deploy's SIGKILL killed though they ran at its SIGTERM, those whose start the old worker's
    main process had not read by then: no ``accepted`` event (``lab.observe``) of the delivery it ran, from that
    worker, before the SIGTERM. A cold shutdown's cancel reaches only the requests the main process has read as
    started (it walks ``active_requests``: ``Consumer.cancel_all_unacked_requests`` in 5.5.3,
    ``cancel_active_requests`` in 5.6.3 and 5.7.0), and in the soft wait it sleeps, reading nothing: such a body runs
    on to the SIGKILL, whoever won the race by a millisecond."""
    terms = {e.get("n"): e for e in events if e.kind == "deploy_term"}
    found: list[str] = []
    for kill in (e for e in events if e.kind == "deploy_kill"):
        term = terms.get(kill.get("n"))
        if term is None:
            continue
        sent = sigterm_sent(term)
        for doc in (d for d in kill.get("lost").split(",") if d in lost):
            if (delivery := _delivery_at_term(events, doc, term)) is None:
                continue
            task, since = delivery.get("task"), delivery.t
            if not any(e.kind == "accepted" and e.get("task") == task and e.get("pid") == term.get("old_pid")
                       and since <= e.t < sent for e in events):
                found.append(doc)
    return found


def _delivery_at_term(events: Sequence[Event], doc: str, term: Event) -> Event | None:
    """The delivery of ``doc`` the old worker of ``term`` held at its SIGTERM (its last ``received`` before)."""
    found = [e for e in events if e.kind == "received" and e.get("doc") == doc and e.get("pid") == term.get("old_pid")
             and e.t < term.t]
    return found[-1] if found else None


def cancelled_before_kill(events: Sequence[Event], read: Sequence[str], soft_timeout: float) -> list[str]:
    """Of the bodies a deploy's SIGKILL killed though the old worker had read their start by its SIGTERM, those its cold
    shutdown had cancelled by then (``cancelled``, ``lab.observe``: ``Request.cancel`` was about to signal the
    body's pool process), each with when. The cancel comes at ``worker_soft_shutdown_timeout`` after the SIGTERM
    plus what the main process takes to get there (0.30 to 0.31 s in the lab's runs at a load of 9); the body's
    process then still has to be scheduled to die, and on a loaded machine the SIGKILL can overtake it. Those too
    whose soft wait had them (``soft_wait``: the cancel would reach them) when the SIGKILL came before the cancel,
    though the cancel was due before it (``soft_timeout`` after the wait began; a soft wait as long as the grace
    never cancels in time, and that fails G7): the main process had not got there within the grace (one fm9 run with
    the machine idle: no cancel 0.51 s after the SIGTERM, where the other deploys of the run cancelled at 0.36 s;
    Celery 5.7's cold shutdown does its blocking work in the signal handler, ``lab/hand.py`` says two ways it can
    hang there). Either way its message goes back unacknowledged and runs again once; what G7 asks of the fix is a
    cold shutdown that has each read body in hand, and this is it."""
    terms = {e.get("n"): e for e in events if e.kind == "deploy_term"}
    found: list[str] = []
    for kill in (e for e in events if e.kind == "deploy_kill"):
        term = terms.get(kill.get("n"))
        if term is None:
            continue
        sent = sigterm_sent(term)
        for doc in (d for d in kill.get("lost").split(",") if d in read):
            delivery = _delivery_at_term(events, doc, term)
            cancel = [e for e in events if delivery is not None and e.kind == "cancelled"
                      and e.get("task") == delivery.get("task") and e.get("pid") == term.get("old_pid")
                      and sent <= e.t <= kill.t]
            held = [e for e in events if delivery is not None and e.kind == "soft_wait"
                    and e.get("task") == delivery.get("task") and e.get("pid") == term.get("old_pid")
                    and sent <= e.t <= kill.t]
            if cancel:
                found.append(f"{doc} (cancelled {cancel[0].t - sent:.2f}s after its SIGTERM, SIGKILLed at "
                             f"{kill.t - sent:.2f}s)")
            elif held and held[0].t + soft_timeout < kill.t:  # its cancel was due within the grace (a soft wait as
                found.append(f"{doc} (in the cold shutdown's hands {held[0].t - sent:.2f}s after its SIGTERM, its "
                             f"cancel not reached by the SIGKILL at {kill.t - sent:.2f}s)")
    return found


def _repeats(events: Sequence[Event]) -> list[str]:
    """Documents whose fetch or parse began again after one had ended ok: finished work done twice."""
    done: dict[tuple[str, str], float] = {}  # (doc, stage) -> when its body first ended ok
    found: list[str] = []
    for e in events:
        stage = _STAGES.get(e.kind)
        if stage is None:
            continue
        key = (e.get("doc"), stage)
        if e.kind.endswith("_end") and e.get("outcome") == "ok":
            done.setdefault(key, e.t)
        elif e.kind.endswith("_start") and key in done:
            found.append(f"{key[0]}'s {stage} began again {e.t - done.pop(key):.2f}s after it had ended ok")
    return found


def g7(obs: Observations, fm: Fm) -> Check:
    c = Collector("G7")
    if (side := side_of(c, obs, "deploy")) is None:
        return c.result()
    f, wanted = deploy_findings(side, float(fm.app.conf.worker_soft_shutdown_timeout or 0.0)), _deploys_of(obs)
    if any(e.kind == "deploy_start" for e in side.events):  # the harness deployed (each needs a new worker booted in time)
        c.expect(MIN_DEPLOYS <= len(f.terms) <= wanted, f"{len(f.terms)} deploys ({'; '.join(f.ends)})",
                 f"{MIN_DEPLOYS} to {wanted}")
    else:  # by hand: the deploy is yours (lessons.fm7.hand), each step cued and seen; and the work changed workers
        expect_steps(c, side.events, [NEW, TERM])
        workers = {e.get("pid") for e in side.events if e.kind == "received"}
        c.expect(len(workers) >= 2, f"by hand: the slow documents were taken by {len(workers)} worker(s)",
                 "at least 2 (start a second worker, then SIGTERM the first while they run)")
    summary = summary_of_side(side)
    n_ok, n_failed = len(summary.get("ok", [])), len(summary.get("failed", []))
    once = sorted(short_doc(str(d)) for d in summary.get("ok", [])) == sorted(side.docs)  # each once, none missing
    c.expect(side_done(side) and once and n_failed == 0 and len(side.emails) == 1,
             f"deploy chord {side_state(side)}: {n_ok} ok, {n_failed} failed of {len(side.docs)}, emails {len(side.emails)}",
             f"SUCCESS, all {len(side.docs)} ok, 1 email")
    c.expect(not f.dead, f"dead-lettered: {', '.join(f.dead) or 'none'}; sent back as innocent: "
             f"{', '.join(f.sent_back) or 'none'}", "none dead-lettered (no slow document is poison)")
    c.expect(not f.overlaps, f"parsed twice at once: {'; '.join(f.overlaps) or 'none'}", "none")
    c.seen.append(f"finished work run again (not a G7 condition: fm7's Tradeoffs): {'; '.join(f.repeated) or 'none'}")
    c.seen.append(f"cancelled by the cold shutdown, after its SIGTERM: {'; '.join(f.cancels) or 'no deploy'}")
    overtaken = {d.split(" ", 1)[0] for d in f.overtaken}
    read = [d for d in f.lost if d not in f.unread and d not in overtaken]
    c.expect(not read, f"bodies running at a SIGTERM, their start read by the worker, not in the cold shutdown's hands "
             f"when its grace ended (killed): {', '.join(read) or 'none'}", "none (the soft shutdown has each to cancel)")
    c.seen.append(f"in the cold shutdown's hands, then SIGKILLed before their cancel or their process ended (run again "
                  f"once, checked above): {', '.join(f.overtaken) or 'none'}")
    c.seen.append(f"running at a SIGTERM whose start the worker had not yet read, so beyond Celery's cancel, killed at the "
                  f"grace and run again once (checked above: each ok once, none twice at once): {', '.join(f.unread) or 'none'}")
    c.seen.append(f"begun after a SIGTERM, so not Celery's to cancel, and killed at the grace (run again; fm7's Tradeoffs): "
                  f"{', '.join(f.late) or 'none'}")
    _stored_guarantee(c, obs)
    _cancelled_guarantee(c, obs)
    return c.result()


@dataclass(frozen=True)
class StoredFindings:
    """What the hard variant's side ``stored`` shows (``lessons.fm7.stored``)."""

    held: list[Event]  # stored_uncounted: the member's SUCCESS stored, its count held
    kills: list[Event]  # killed_after_store: its pool process SIGKILLed there
    received: int  # deliveries of the held member's parse
    ok: list[str]  # the side chord's ok documents, in its summary
    dead: list[str]  # documents of the side dead-lettered


def stored_findings(side: SideRun) -> StoredFindings:
    events = side.events
    summary = summary_of_side(side)
    return StoredFindings(
        held=[e for e in events if e.kind == "stored_uncounted"],
        kills=[e for e in events if e.kind == "killed_after_store"],
        received=sum(1 for e in events if e.kind == "received" and e.get("doc") == STORED_DOCS[0]),
        ok=sorted(short_doc(str(d)) for d in summary.get("ok", [])),
        dead=[str(e.get("doc")) for e in events if e.kind == "dead_lettered"])


def _stored_guarantee(c: Collector, obs: Observations) -> None:
    """G7's part for the hard variant: the member killed between its store and its count is counted, once."""
    if (side := side_of(c, obs, STORED)) is None:
        return
    f = stored_findings(side)
    c.expect(len(f.held) == 1 and len(f.kills) == 1 and f.kills[0].get("killed") == "yes",
             f"{STORED_DOCS[0]} held after its store {len(f.held)}x, its process killed there {len(f.kills)}x",
             "1x, killed 1x")
    c.expect(side_done(side) and f.ok == sorted(side.docs) and len(side.emails) == 1 and not f.dead,
             f"{STORED} chord {side_state(side)}: ok {', '.join(f.ok) or 'none'}, emails {len(side.emails)}, "
             f"dead-lettered {', '.join(f.dead) or 'none'}",
             f"SUCCESS, ok {', '.join(sorted(side.docs))} (each once), 1 email, none dead-lettered")


@dataclass(frozen=True)
class CancelledFindings:
    """What the hard variant's side ``cancelled`` shows (``lessons.fm7.stored``)."""

    held: int  # stored_uncounted: the member's SUCCESS stored, its count held
    cancels: int  # Celery's cancel of the held member (``cancelled``, the observer's)
    in_hand: int  # the cold shutdown's soft wait had it in hand (``soft_wait``, the observer's)
    killed: int  # its worker SIGKILLed at the grace's end (``held_deploy_end``)
    ended: int  # ended_after_store: its process gone while held
    missed: int  # held_deploy_missed: its process gone before the deploy found its worker
    received: int  # deliveries of the held member's parse
    ok: list[str]
    dead: list[str]


def cancelled_findings(side: SideRun) -> CancelledFindings:
    events, doc = side.events, CANCELLED_DOCS[0]
    return CancelledFindings(
        held=sum(1 for e in events if e.kind == "stored_uncounted"),
        cancels=sum(1 for e in events if e.kind == "cancelled" and e.get("doc") == doc),
        in_hand=sum(1 for e in events if e.kind == "soft_wait" and e.get("doc") == doc),
        killed=sum(1 for e in events if e.kind == "held_deploy_end" and e.get("end") == "SIGKILLed"),
        ended=sum(1 for e in events if e.kind == "ended_after_store"),
        missed=sum(1 for e in events if e.kind == "held_deploy_missed"),
        received=sum(1 for e in events if e.kind == "received" and e.get("doc") == doc),
        ok=sorted(short_doc(str(d)) for d in summary_of_side(side).get("ok", [])),
        dead=[str(e.get("doc")) for e in events if e.kind == "dead_lettered"])


def cancelled_said(f: CancelledFindings) -> str:
    return (f"{CANCELLED_DOCS[0]} held after its store {f.held}x, cancelled there by a cold shutdown {f.cancels}x (in "
            f"its soft wait's hands {f.in_hand}x, its worker SIGKILLed at the grace {f.killed}x), its process gone there "
            f"{f.ended}x, delivered {f.received}x"
            + (f"; its process gone before the deploy found its worker {f.missed}x" if f.missed else ""))


def ended_by_the_deploy(f: CancelledFindings) -> bool:
    """Celery's cancel ended it, or the grace's SIGKILL did while the soft wait had it in hand (on a loaded machine
    the cancel, 0.3 s after the SIGTERM, can come after the SIGKILL at 0.5 s: G7's race, ``cancelled_before_kill``)."""
    return f.held == 1 and f.ended == 1 and (f.cancels == 1 or (f.in_hand == 1 and f.killed == 1))


def _cancelled_guarantee(c: Collector, obs: Observations) -> None:
    """G7's part for the hard variant's second way: the member a deploy's cold shutdown cancelled between its store
    and its count is counted, once."""
    if (side := side_of(c, obs, CANCELLED)) is None:
        return
    f = cancelled_findings(side)
    if by_hand(obs.sides[DEPLOY].events if DEPLOY in obs.sides else []):  # no deploy aimed at it: Celery's time
        c.seen.append(f"by hand, no deploy is aimed at {CANCELLED_DOCS[0]}: {cancelled_said(f)}")  # limit ends its hold
    else:
        runs = side.attempts.get(CANCELLED_DOCS[0], 0)
        c.expect(ended_by_the_deploy(f) and f.received >= 2 and runs == 1,
                 f"{cancelled_said(f)}, its body run {runs}x",
                 "held 1x, cancelled 1x (or in the soft wait's hands when the grace's SIGKILL came first), gone 1x, "
                 "delivered 2x or more (a redelivery may meet the stopping worker "
                 "first), its body run 1x (every redelivery deduplicated)")
    c.expect(side_done(side) and f.ok == sorted(side.docs) and len(side.emails) == 1 and not f.dead,
             f"{CANCELLED} chord {side_state(side)}: ok {', '.join(f.ok) or 'none'}, emails {len(side.emails)}, "
             f"dead-lettered {', '.join(f.dead) or 'none'}",
             f"SUCCESS, ok {', '.join(sorted(side.docs))} (each once), 1 email, none dead-lettered")


def s7(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S7")
    if (side := side_of(c, obs, "deploy")) is None:
        return c.result()
    f = deploy_findings(side, 0.0)  # S7 reads what was lost, never what the cold shutdown had in hand
    c.expect(bool(f.terms) and bool(f.lost or f.dead or f.overlaps),
             f"{len(f.terms)} deploys ({'; '.join(f.ends)}); work lost to a SIGKILL: {', '.join(f.lost) or 'none'}; "
             f"innocent dead-lettered: {', '.join(f.dead) or 'none'}; parsed twice at once: {'; '.join(f.overlaps) or 'none'}",
             "a body killed at a grace's end, an innocent document dead-lettered, or one parsed twice at once")
    return c.result()


def s7_hard(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S7 hard")
    if (side := side_of(c, obs, STORED)) is None:
        return c.result()
    f = stored_findings(side)
    member = side.members.get(STORED_DOCS[0])
    stored = member.state if member is not None else "no member"
    c.expect(len(f.kills) == 1 and f.kills[0].get("killed") == "yes",
             f"{STORED_DOCS[0]}'s process killed after its store, before its count: {len(f.kills)}x", "once")
    c.expect(stored == "SUCCESS" and not side_done(side) and not f.dead and not side.emails,
             f"{STORED} chord {side_state(side)}, {STORED_DOCS[0]} stored {stored}, delivered {f.received}x, "
             f"dead-lettered {', '.join(f.dead) or 'none'}, emails {len(side.emails)}",
             "the member stored SUCCESS, the chord never completes, in silence: nothing dead-lettered, no email")
    if (cancelled := side_of(c, obs, CANCELLED)) is None:
        return c.result()
    g = cancelled_findings(cancelled)
    member = cancelled.members.get(CANCELLED_DOCS[0])
    stored = member.state if member is not None else "no member"
    c.expect(ended_by_the_deploy(g), cancelled_said(g),
             "held 1x, cancelled 1x (or in the soft wait's hands when the grace's SIGKILL came first), gone 1x")
    c.expect(stored == "SUCCESS" and not side_done(cancelled) and not g.dead and not cancelled.emails,
             f"{CANCELLED} chord {side_state(cancelled)}, {CANCELLED_DOCS[0]} stored {stored}, "
             f"dead-lettered {', '.join(g.dead) or 'none'}, emails {len(cancelled.emails)}",
             "the member stored SUCCESS, the chord never completes, in silence")
    return c.result()


STORED_WAIT = 8.0
"""S7 hard's stop: the held member was killed this long ago and its chord has not completed (Celery settles its
message within about 5 s of the kill: 5.7 acks it at once, 5.5 and 5.6 deduplicate its redelivery)."""


def _stuck(r: Reader, tag: str, kind: str) -> bool:
    side = r.side_readers.get(tag)
    ends = [e.t for e in side.events() if e.kind == kind] if side else []
    return bool(ends) and time.time() - ends[0] > STORED_WAIT


def _stored_stuck(r: Reader) -> bool:
    return _stuck(r, STORED, "killed_after_store")


def _both_stuck(r: Reader) -> bool:
    """Both ways of the hard variant: the killed member's and the cancelled member's chords not counted."""
    return _stored_stuck(r) and _stuck(r, CANCELLED, "ended_after_store")


def _side_over(r: Reader, tag: str) -> bool:
    side = r.side_readers.get(tag)
    return side is not None and any(e.kind == "notify_end" for e in side.events())


def _symptom_stop(fixed: Fm, program: Fm) -> Stop | None:
    """S7's run (fm6's code) ends once the deploys' chord ended, and the hard variant's side ended or is stuck: fm6
    has no count for a member killed after its store (5.7 acks it at once: that side never ends there)."""
    return ("the deploys' chord ended; the member killed after its store counted or stuck",
            lambda r: _side_over(r, DEPLOY) and (_side_over(r, STORED) or _stored_stuck(r)))


def _hard_stop(fixed: Fm, program: Fm) -> Stop | None:
    return (f"the members killed and cancelled between their store and their count, {STORED_WAIT:.0f}s ago, still not "
            "counted", _both_stuck)


CHECKS = LessonChecks(
    guarantee=g7, symptom=s7, symptom_stop=_symptom_stop, hard_symptom=s7_hard, hard_stop=_hard_stop,
    words={
        "G7": "rolling deploys: all ok, no innocent dead letter, no overlap, each running body in the cold shutdown's hands",
        "S7": "warm shutdown past the grace: a body SIGKILLed, prefetch charged",
        "S7 hard": "a member killed, or cancelled by a deploy, between its result's store and its count: never "
                   "counted, chord PENDING",
    },
)
