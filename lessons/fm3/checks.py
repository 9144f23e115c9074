"""FM-3's checks: G3 (poison dead-lettered at the broker's bound and finalised, in a member, a chain head, a
chord body, and behind letters no drain can place), S3 (redelivered past the bound) and S3 hard (the drain as
first written: the chord never completes).
"""

from __future__ import annotations

from lab.checks import delivery_bound, failed_detail, notify_never, side_done, side_state
from lab.fm import Fm
from lab.lesson import LessonChecks, Stop
from lab.observe import Reader, drain_passes
from lab.records import Check, Collector, Observations
from lab.runner import StopCondition
from lab.settings import redis_prefix
from lessons.fm3.scenario import foreign_letters


def g3(obs: Observations, fm: Fm) -> Check:
    """Judged by what happened, never by the words of the lab's drain: a fix written with RabbitMQ's own queue
    arguments and a drain of its own passes when it holds. The program's own bound is held exactly; a bound the
    lesson states (an exercise's check, ``lab.exercise.Held``) is a ceiling: delivered at most that often."""
    c = Collector("G3")
    bound, ceiling = delivery_bound(fm), fm.bounds_stated

    def within(n: int) -> bool:
        return 1 <= n <= bound if ceiling else n == bound

    said = (f"at most {bound} (the lesson's bound)" if ceiling else f"the broker's bound {bound}") if bound else \
        "a bound (no dead-letter policy)"
    a4 = obs.attempts.get("doc4", 0)
    c.expect(bool(bound) and within(a4), f"doc4 attempts {a4}", said)
    reason, error = failed_detail(obs, "doc4")
    c.expect(reason == "dead_lettered", f"doc4 {reason or 'not failed'} {error!r}",
             "failed in the chord's summary, reason dead_lettered")
    # The hard variant: doc9's poison is its fetch, the chain's head, not the chord member.
    f9, a9 = obs.fetch_attempts.get("doc9", 0), obs.attempts.get("doc9", 0)
    c.expect(bool(bound) and within(f9) and a9 == 0, f"doc9 fetched {f9}x, parsed {a9}x", f"fetched {said}, parsed 0x")
    reason, error = failed_detail(obs, "doc9")
    c.expect(reason == "dead_lettered", f"doc9 {reason or 'not failed'} {error!r}",
             "failed in the chord's summary, reason dead_lettered")
    kept = [e.get("doc") for e in obs.events if e.kind == "dead_letter_kept"]
    c.expect(not kept and obs.dlq_depth == 0, f"DLQ depth {obs.dlq_depth}, kept {kept}", "0, nothing kept")
    # The hard variants, each a chord of its own: a poison chord body (side "body") ends visibly, as
    # its chord's result; letters the drain cannot place (more than a pass reads) are set apart
    # and do not delay a poison member behind them (side "behind").
    if (body := obs.sides.get("body")) is not None:
        env = body.chord.envelope
        c.expect(body.chord.state == "SUCCESS" and env is not None and env.reason == "dead_lettered" and not body.emails,
                 f"poison body: chord {side_state(body)} {env.reason if env else ''} {env.error if env else None!r}, "
                 f"emails {len(body.emails)}", "SUCCESS, its envelope dead_lettered, no email")
    if (behind := obs.sides.get("behind")) is not None:
        f33 = behind.failed("doc33") or {}
        announced, foreign = sum(1 for e in obs.events if e.kind == "dead_letter_parked"), foreign_letters(fm)
        c.expect(side_done(behind) and f33.get("reason") == "dead_lettered" and len(behind.emails) == 1,
                 f"behind {foreign} foreign letters: chord {side_state(behind)}, doc33 "
                 f"{f33.get('reason') or 'not failed'}, emails {len(behind.emails)}",
                 "SUCCESS, doc33 dead_lettered, 1 email")
        c.expect(obs.parked == foreign, f"parked {obs.parked} (announced {announced})",
                 f"the {foreign} foreign letters, out of the DLQ and kept")
    return c.result()


def s3(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S3")
    a4, bound = obs.attempts.get("doc4", 0), delivery_bound(fixed)
    c.expect(a4 > bound, f"doc4 attempts {a4}", f"past the bound {bound}")
    notify_never(c, obs)
    return c.result()


def s3_hard(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S3 hard")
    bound, f9 = delivery_bound(fixed), obs.fetch_attempts.get("doc9", 0)
    c.expect(f9 == bound, f"doc9 fetched {f9}x", f"{bound}x, then dead-lettered")
    kept = any(e.kind == "dead_letter_kept" and e.get("doc") == "doc9" for e in obs.events)
    c.expect(kept, f"doc9's dead letter {'kept in the DLQ' if kept else 'not seen'}", "kept: no chord member to finalise")
    c.expect(obs.chord.state == "PENDING", f"chord {obs.chord.state}", "PENDING (never completes)")
    notify_never(c, obs)
    body, behind = obs.sides.get("body"), obs.sides.get("behind")
    if body is None or behind is None:
        c.expect(False, "no side chords 'body' and 'behind'", "both")
        return c.result()
    body_kept = any(e.kind == "dead_letter_kept" and not e.get("doc") for e in body.events)
    c.expect(body_kept and body.chord.state == "PENDING" and not body.emails,
             f"poison body: {'kept in the DLQ' if body_kept else 'not kept'}, chord {body.chord.state}, emails {len(body.emails)}",
             "kept in silence: PENDING, no email")
    a33 = behind.attempts.get("doc33", 0)
    reached = any(e.kind == "dead_lettered" for e in behind.events)
    c.expect(a33 == bound and not reached and behind.chord.state == "PENDING",
             f"doc33 behind {foreign_letters(fixed)} foreign letters: attempts {a33}, "
             f"{'finalised' if reached else 'never reached by the drain'}, chord {behind.chord.state}",
             f"{bound}, never reached, PENDING")
    return c.result()


def _drain_blocked(fixed: Fm, weak: Fm | None) -> StopCondition:
    """doc9 and the poison body kept, doc33 dead-lettered behind the foreign letters, and three more
    passes of the drain since, none of which reached it."""
    bound, prefix = delivery_bound(fixed), redis_prefix(weak.short if weak is not None else fixed.short)
    seen: list[int] = []

    def blocked(r: Reader) -> bool:
        body, behind = r.side_readers.get("body"), r.side_readers.get("behind")
        if body is None or behind is None or not r.has_event("dead_letter_kept", doc="doc9"):
            return False
        if behind.attempts("doc33") < bound or not any(e.kind == "dead_letter_kept" and not e.get("doc") for e in body.events()):
            return False
        if not seen:
            seen.append(drain_passes(prefix))
        return drain_passes(prefix) >= seen[0] + 3

    return blocked


def _symptom_stop(fixed: Fm, program: Fm) -> Stop | None:
    bound = delivery_bound(fixed)
    return ("doc4 passed the bound", lambda r: r.attempts("doc4") > bound)


def _hard_stop(fixed: Fm, program: Fm) -> Stop | None:
    return ("the drain kept doc9 and the poison body, and never reached doc33", _drain_blocked(fixed, program))


CHECKS = LessonChecks(
    guarantee=g3, symptom=s3, symptom_stop=_symptom_stop, hard_symptom=s3_hard, hard_stop=_hard_stop,
    words={
        "G3": "poison dead-lettered at the bound; body; letters parked",
        "S3": "poison redelivered past the bound",
        "S3 hard": "drain as first built: head, poison body, blocked letters",
    },
)
