"""FM-1's checks: G1 (the body runs once, every document accounted, its chord a SUCCESS envelope), S1 (a
failed member: a ChordError, the body never runs) and S1 hard (a chain head that expired: its chord never completes).
"""

from __future__ import annotations

import time

from lab.checks import chord_error, failed_detail, notify_never, side_done, side_of, side_state
from lab.fm import Fm
from lab.lesson import LessonChecks, Stop
from lab.observe import Reader
from lab.records import Check, Collector, Observations
from lab.runner import NOT_RUN_WINDOW


def g1(obs: Observations, fm: Fm) -> Check:
    c = Collector("G1")
    # From scenario 4 on, deliveries of the chord's notify are killed on purpose (G4
    # counts them); whatever the deliveries, exactly one of them may finish.
    ends = sum(1 for e in obs.events if e.kind == "notify_end" and e.get("role") == "chord")
    c.expect(ends == 1, f"chord notify finished {ends}x", "exactly 1")
    env = obs.chord.envelope
    c.expect(
        obs.chord.state == "SUCCESS" and env is not None and env.ok,
        f"chord state {obs.chord.state}, envelope {env.status if env else obs.chord.error_type}",
        "a SUCCESS envelope",
    )
    summary = obs.summary()
    n_ok, n_failed = (len(summary["ok"]), len(summary["failed"])) if summary else (0, 0)
    c.expect(n_ok + n_failed == len(obs.docs), f"ok {n_ok} + failed {n_failed} of {len(obs.docs)}", "all accounted")
    reason, error = failed_detail(obs, "doc1")
    c.expect(reason == "error" and "PermanentError" in error, f"doc1 {reason or 'not failed'} {error!r}", "error PermanentError")
    # The hard variant: a chain head that expired before it ran (its own chord, side "expired").
    if (side := obs.sides.get("expired")) is not None:
        f31 = side.failed("doc31") or {}
        # With FM-7's prefetch 1 no consumer may have room when it arrives: RabbitMQ then expires it
        # itself (AMQP expiration 0) and dead-letters it, and the drain finalises its chain.
        # Judged by what happened (its reason, Celery's record of the head), not by the words the lab's
        # primitives write in the envelope: a fix of one's own passes alike.
        by_broker = f31.get("reason") == "dead_lettered" and fm.prefetch_one
        c.expect(side_done(side) and (by_broker or f31.get("reason") == "expired" and side.heads.get("doc31") == "REVOKED"),
                 f"expired head: chord {side_state(side)}, doc31 {f31.get('reason') or 'not failed'} "
                 f"{f31.get('error')!r}, head {side.heads.get('doc31')}",
                 "chord SUCCESS, doc31 failed with reason expired, head REVOKED (Celery's record)")
    return c.result()




def s1(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S1")
    notify_never(c, obs)
    chord_error(c, obs, "doc1 is malformed")
    return c.result()


def s1_hard(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S1 hard")
    if (side := side_of(c, obs, "expired")) is None:
        return c.result()
    c.expect(side.heads.get("doc31") == "REVOKED", f"doc31's head {side.heads.get('doc31')}", "REVOKED (expired)")
    started = side.attempts.get("doc31", 0)
    c.expect(started == 0 and side.chord.state == "PENDING", f"doc31 parsed {started}x, its chord {side.chord.state}",
             "parsed 0x, PENDING (never completes)")
    return c.result()


def _expired_head_left(r: Reader) -> bool:
    side = r.side_readers.get("expired")
    revoked = [e.t for e in side.events() if e.kind == "revoked"] if side is not None else []
    return bool(revoked) and time.time() - revoked[0] > NOT_RUN_WINDOW


def _hard_stop(fixed: Fm, program: Fm) -> Stop | None:
    return ("doc31's expired head was discarded, and its parse never came", _expired_head_left)


CHECKS = LessonChecks(
    guarantee=g1, symptom=s1, hard_symptom=s1_hard, hard_stop=_hard_stop,
    words={
        "G1": "notify once, chord SUCCESS, all accounted; expired head",
        "S1": "a raising member: ChordError, notify never runs",
        "S1 hard": "an expired chain head: its chord PENDING for ever",
    },
)
