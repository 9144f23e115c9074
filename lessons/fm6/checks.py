"""FM-6's checks: G6 (every hang ends with its reason, the worker serves at once afterwards), S6 (a hang pins
its slot) and S6 hard (limits that land outside the body, a hung fetch).
"""

from __future__ import annotations

from lab.checks import failed_detail, notify_never, outlived
from lab.faults import HARD_HANG_CAP_SECONDS
from lab.fm import Fm
from lab.lesson import LessonChecks, Stop
from lab.records import Check, Collector, Observations


PROBE_AT_ONCE_SECONDS = 2.0
"""G6: a probe task must come back within this after the run."""


def g6(obs: Observations, fm: Fm) -> Check:
    c = Collector("G6")
    r7, _ = failed_detail(obs, "doc7")
    r8, _ = failed_detail(obs, "doc8")
    c.expect(r7 == "soft_timeout", f"doc7 {r7 or 'not failed'}", "soft_timeout")
    c.expect(r8 == "hard_timeout", f"doc8 {r8 or 'not failed'}", "hard_timeout")
    # The hard variants: a body that swallows Exception cannot swallow HardTimeout (a
    # BaseException); C code outlives every signal and ends at Celery's time_limit, which
    # the backstop request records as an envelope instead of a FAILURE state.
    r10, _ = failed_detail(obs, "doc10")
    r11, e11 = failed_detail(obs, "doc11")
    c.expect(r10 == "hard_timeout", f"doc10 {r10 or 'not failed'}", "hard_timeout")
    c.expect(r11 == "time_limit" and "TimeLimitExceeded" in e11, f"doc11 {r11 or 'not failed'} {e11!r}",
             "time_limit (TimeLimitExceeded)")
    # The late finisher: its body ends inside the soft deadline, then the result store stalls past it;
    # no limit fires outside the body (no Celery soft limit; the in-body timer ended with the body).
    stalled = any(e.kind == "store_stall" and e.get("doc") == "doc28" for e in obs.events)
    c.expect("doc28" in obs.ok_docs() and stalled, f"doc28 {'ok' if 'doc28' in obs.ok_docs() else failed_detail(obs, 'doc28')}"
             f"{', its store stalled' if stalled else ', no stall seen'}", "ok after a stalled store")
    # A Celery limit that does land outside the body (time_limit, in the stalled store) is an envelope.
    r30, e30 = failed_detail(obs, "doc30")
    c.expect(r30 == "time_limit" and "TimeLimitExceeded" in e30, f"doc30 {r30 or 'not failed'} {e30!r}", "time_limit")
    # Killed by its time limit after its result's store, before its count: BackstopRequest counts it (claims C35-C37).
    held = sum(1 for e in obs.events if e.kind == "stored_uncounted" and e.get("doc") == "doc90")
    received = sum(1 for e in obs.events if e.kind == "received" and e.get("doc") == "doc90")
    over = [e.get("why") for e in obs.events if e.kind == "hold_over" and e.get("doc") == "doc90"]
    c.expect("doc90" in obs.ok_docs() and held == 1 and received == 1 and not over,
             f"doc90 {'ok' if 'doc90' in obs.ok_docs() else 'not ok'}, held after its store {held}x, delivered "
             f"{received}x, its hold {'over: ' + ', '.join(over) if over else 'ended by its process killed there'}",
             "ok, held 1x, delivered 1x, its process killed in the hold (by its time limit: nothing else acts on the "
             "run's own chord), counted once")
    # A hang in the chain's head: the fetch has its own deadline.
    r29, e29 = failed_detail(obs, "doc29")
    c.expect(r29 == "hard_timeout" and "fetch_document ran past its hard timeout" in e29,
             f"doc29 {r29 or 'not failed'} {e29!r}", "hard_timeout of its fetch")
    p = obs.probe_seconds
    c.expect(p is not None and p <= PROBE_AT_ONCE_SECONDS, f"probe {'lost' if p is None else f'{p:.2f}s'}", f"<= {PROBE_AT_ONCE_SECONDS}s")
    return c.result()


def _hard_deadline(fixed: Fm) -> float:
    return fixed.hard_timeout or HARD_HANG_CAP_SECONDS


def s6(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S6")
    starts = obs.attempt_times("doc8")
    ended = any(e.kind == "attempt_end" and e.get("doc") == "doc8" for e in obs.events)
    deadline = _hard_deadline(fixed)
    ran_for = (obs.submitted_at + obs.elapsed - starts[0]) if starts else 0.0
    c.expect(
        bool(starts) and not ended and ran_for > deadline,
        f"doc8 {'still running' if starts and not ended else 'not running'} after {ran_for:.2f}s",
        f"running past {deadline}s",
    )
    notify_never(c, obs)
    return c.result()


def s6_hard(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S6 hard")
    m11, m28 = obs.members.get("doc11"), obs.members.get("doc28")
    # C code outlives every signal: Celery's time_limit kills it and stores FAILURE.
    c.expect(m11 is not None and m11.state == "FAILURE" and m11.error_type == "TimeLimitExceeded",
             f"doc11's member {m11.state if m11 else '?'} {m11.error_type if m11 else ''}", "FAILURE TimeLimitExceeded")
    # Celery's soft limit lands after the body returned, in the stalled store: FAILURE, not an envelope.
    said = f"{m28.error_type}: {m28.error}" if m28 is not None else ""
    c.expect(m28 is not None and m28.state == "FAILURE" and "SoftTimeLimitExceeded" in said,
             f"doc28's member {m28.state if m28 else '?'} {said!r}", "FAILURE naming SoftTimeLimitExceeded")
    # A hang in the chain's head: nothing ends the fetch.
    deadline = fixed.fetch_hard_timeout() or HARD_HANG_CAP_SECONDS
    starts = [e.t for e in obs.events if e.kind == "fetch_start" and e.get("doc") == "doc29"]
    ran_for = (obs.submitted_at + obs.elapsed - starts[0]) if starts else 0.0
    c.expect(bool(starts) and ran_for > deadline, f"doc29's fetch {'running' if starts else 'not started'} after {ran_for:.2f}s",
             f"running past the fetch's deadline {deadline}s")
    c.expect(obs.chord.state == "PENDING", f"chord {obs.chord.state}", "PENDING (never completes)")
    return c.result()


def _symptom_stop(fixed: Fm, program: Fm) -> Stop | None:
    deadline = _hard_deadline(fixed)
    return ("doc8 outlived the hard deadline", lambda r: outlived(r, "doc8", deadline))


def _hard_stop(fixed: Fm, program: Fm) -> Stop | None:
    deadline = fixed.fetch_hard_timeout() or HARD_HANG_CAP_SECONDS
    return ("doc11 and doc28 failed outside their bodies, doc29's fetch outlived its deadline",
            lambda r: r.member_state("doc11") == "FAILURE" and r.member_state("doc28") == "FAILURE"
            and outlived(r, "doc29", deadline, "fetch_start"))


CHECKS = LessonChecks(
    guarantee=g6, symptom=s6, symptom_stop=_symptom_stop, hard_symptom=s6_hard, hard_stop=_hard_stop,
    words={
        "G6": "deadlines in every task's body; time_limit backstop as an envelope",
        "S6": "a hang pins a slot, notify never runs",
        "S6 hard": "Celery's soft limit after the body; no backstop; hung head",
    },
)
