"""FM-5's checks: G5 (transient errors retried with growing gaps, then given up; a burst of waiting retries
does not hold new work), S5 (a transient error is terminal) and S5 hard (the burst holds a probe).
"""

from __future__ import annotations

from lab.checks import failed_detail
from lab.fm import Fm
from lab.lesson import LessonChecks, Stop
from lab.records import Check, Collector, Observations
from lessons.fm5.scenario import BURST


BURST_PROBE_SECONDS = 0.5
"""G5: a probe sent while the burst's retries wait is taken off the broker by the worker
(``burst_probe_received``, the worker's ``task_received``) within this, or before the first of
the burst's retries ended: the waiting retries are not in its prefetch. A prefetch full of them
keeps the probe on the broker until one has run and been acked (fm5w: taken after 1.24 s), so a
held probe fails both. Its round trip is reported, not bounded: it also waits for a free pool
process, which scenario 6's hangs and a loaded machine hold (round trips of 0.63 to 0.97 s were
seen in fm6 runs with a load average near 5; in one measured, a round trip of 0.84 s, the worker
took the probe after 0.25 s, and in another, 0.66 s).
S5 hard: a held probe is taken only after the first of the retries ended (no time bound: see s5_hard)."""


BURST_WAITING = 8
"""G5: when the probe is sent, at least this many burst retries still wait: the prefetch
of the lab's worker (``worker_concurrency`` 2 x ``worker_prefetch_multiplier`` 4)."""


def g5(obs: Observations, fm: Fm) -> Check:
    c = Collector("G5")
    a5, a6 = obs.attempts.get("doc5", 0), obs.attempts.get("doc6", 0)
    c.expect("doc5" in obs.ok_docs() and a5 == 3, f"doc5 {'ok' if 'doc5' in obs.ok_docs() else 'failed'} after {a5}", "ok after 3")
    policy = fm.retry_policy
    reason, _ = failed_detail(obs, "doc6")
    limit = policy.max_retries + 1 if policy else -1
    c.expect(reason == "retries_exhausted" and a6 == limit, f"doc6 {reason or 'not failed'} after {a6}", f"retries_exhausted after {limit}")
    if policy is None:
        c.expect(False, "no retry policy", "a RetryPolicy")
        return c.result()
    for doc in ("doc5", "doc6"):
        planned = [float(e.get("delay")) for e in obs.events if e.kind == "retry" and e.get("doc") == doc]
        times = obs.attempt_times(doc)
        gaps = [b - a for a, b in zip(times, times[1:])]
        c.expect(len(planned) == len(gaps), f"{doc} {len(planned)} retries, {len(gaps)} gaps", "one retry per gap")
        for k, (delay, gap) in enumerate(zip(planned, gaps)):
            low, high = policy.bounds(k)
            # The planned delay follows the configured curve exactly; the observed gap
            # cannot be shorter (a busy pool may make it longer, never shorter).
            c.expect(low <= delay < high, f"{doc} retry {k + 1} planned {delay:.3f}s", f"in [{low:.3f}, {high:.3f})")
            c.expect(gap >= delay, f"{doc} gap {k + 1} {gap:.3f}s", f">= planned {delay:.3f}s")
    # The hard variant: a burst of waiting retries must not hold up new work.
    burst = [d for d in BURST if d in obs.docs]
    ok = [d for d in burst if d in obs.ok_docs() and obs.attempts.get(d) == 2]
    c.expect(len(ok) == len(burst), f"burst {len(ok)} of {len(burst)} ok after 2 attempts", f"all {len(burst)}")
    sent, back = obs.burst_probe or (0.0, None)
    waiting = _waiting_at(obs, burst, sent)
    received = next((e.t for e in obs.events if e.kind == "burst_probe_received"), None)
    c.expect(obs.burst_probe is not None and waiting >= BURST_WAITING,
             f"probe sent while {waiting} of the burst's retries waited", f">= {BURST_WAITING} (the prefetch)")
    # Not held behind the waiting retries: the worker took it at once, or before any retry that was
    # still waiting when it was sent had run and been acked (S5 hard: it came back only after the first
    # retry ran). A retry already due then is ahead of the probe in the queue, rightly: on a loaded
    # machine the burst's first attempts can spread over more than the retry delay.
    first_end = _first_retry_end(obs, burst, due_after=sent)
    c.expect(back is not None and received is not None
             and (received - sent <= BURST_PROBE_SECONDS or first_end is None or received < first_end),
             f"probe during the burst {'lost' if back is None else f'back in {back - sent:.3f}s'}, taken by the worker "
             + ("never" if received is None else f"{received - sent:.3f}s after it was sent")
             + ("" if received is None or first_end is None else f", {first_end - received:+.3f}s before the first retry ended"),
             f"taken within {BURST_PROBE_SECONDS}s, or before any of the burst's retries due after it ended")
    return c.result()


def _waiting_at(obs: Observations, burst: list[str], t: float) -> int:
    """Burst documents whose retry was planned before ``t`` and had not started by then."""
    planned = {e.get("doc") for e in obs.events if e.kind == "retry" and e.get("doc") in burst and e.t <= t}
    ran = {e.get("doc") for e in obs.events if e.kind == "attempt_start" and e.get("attempt") == "2" and e.t <= t}
    return len(planned - ran)


def _first_retry_end(obs: Observations, burst: list[str], due_after: float) -> float | None:
    """When the first burst document whose retry came due after ``due_after`` ended its second attempt."""
    due = {e.get("doc"): e.t + float(e.get("delay") or 0) for e in obs.events if e.kind == "retry" and e.get("doc") in burst}
    ends = [e.t for e in obs.events if e.kind == "attempt_end" and e.get("doc") in burst and e.get("attempt") == "2"
            and due.get(e.get("doc"), 0.0) > due_after]
    return min(ends) if ends else None


def s5(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S5")
    reason, _ = failed_detail(obs, "doc5")
    a5 = obs.attempts.get("doc5", 0)
    c.expect(bool(reason) and a5 == 1, f"doc5 {reason or 'not failed'} after {a5}", "failed after 1")
    return c.result()


def s5_hard(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S5 hard")
    burst = [d for d in BURST if d in obs.docs]
    sent, back = obs.burst_probe or (0.0, None)
    waiting = _waiting_at(obs, burst, sent)
    c.expect(obs.burst_probe is not None and waiting >= BURST_WAITING,
             f"probe sent while {waiting} of the burst's retries waited", f">= {BURST_WAITING} (the prefetch)")
    # Held, judged by the worker's own take (its task_received), not by a time: a prefetch full of
    # waiting retries frees a slot only when one has come due, run and been acked, so the worker
    # takes the probe after the first retry ended. A timed bound raced the retries' own delay on a
    # loaded machine, where the burst's first attempts spread over most of it (a 5.5 matrix run:
    # taken 0.284 s after it was sent, every retry ahead of it).
    received = next((e.t for e in obs.events if e.kind == "burst_probe_received"), None)
    first_end = _first_retry_end(obs, burst, due_after=float("-inf"))
    c.expect(back is not None and received is not None and first_end is not None and received > first_end,
             f"probe during the burst {'lost' if back is None else f'back in {back - sent:.3f}s'}, taken by the worker "
             + ("never" if received is None else f"{received - sent:.3f}s after it was sent")
             + ("" if received is None or first_end is None else f", {received - first_end:+.3f}s after the first retry ended"),
             "taken only after the first of the burst's retries ended (the worker's prefetch held them)")
    return c.result()


def _hard_stop(fixed: Fm, program: Fm) -> Stop | None:
    return ("the burst's probe came back", lambda r: r.has_event("burst_probe_back"))


CHECKS = LessonChecks(
    guarantee=g5, symptom=s5, hard_symptom=s5_hard, hard_stop=_hard_stop,
    words={
        "G5": "bounded retries with backoff, probe not held",
        "S5": "a transient error fails for good",
        "S5 hard": "ETA retries fill the quorum prefetch",
    },
)
