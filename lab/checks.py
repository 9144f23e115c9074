"""Guarantees G1..G8 and symptoms S1..S8 (DESIGN.md §2), checked on ``Observations``.

Every check is exact where the behaviour is exact and names the observed
numbers when it fails. ``guarantees(n, obs, fm)`` checks G1..Gn of FM n's
run; ``symptom(n, obs, fixed)`` checks Sn of scenario n on FM n-1's code, where
``fixed`` is FM n's program (it holds the bound or deadline the symptom passes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from lab.faults import HARD_HANG_CAP_SECONDS
from lab.fm import Fm
from lab.observe import Event, Reader, drain_passes, short_doc
from lab.runner import NOT_RUN_WINDOW, Observations, SideRun, StopCondition, foreign_letters
from lab.scenarios import BURST, CONNLOSS_DOCS, HUNG_DOC, scenario
from lab.settings import redis_prefix

PROBE_AT_ONCE_SECONDS = 2.0
"""G6: a probe task must come back within this after the run."""
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
OWNER_RECOVERY_SECONDS = 10.0
"""G4: the email is out within this after the claim's owner was killed before sending
(its redelivery resumes the claim; the lab's pool requeues a dead child's task at once).
Usually under 1 s; 3.11 s was measured at a load average of 13 on two cores (three --jobs runs
beside two other sessions' test runs), when a new pool process is slow to fork. Without the
resume (fm4w) the owner's redelivery is turned away by its own claim for the whole busy budget
(400 x 50 ms = 20 s) and no email goes out: twice this bound."""


@dataclass(frozen=True)
class Check:
    label: str  # "G3", "S2", ...
    ok: bool
    detail: str  # what was observed (and, on failure, what was expected)


class Collector:
    """What a check saw, and what it wanted where the two differ: one ``Check`` in the end."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.problems: list[str] = []
        self.seen: list[str] = []

    def expect(self, cond: bool, seen: str, wanted: str = "") -> None:
        self.seen.append(seen)
        if not cond:
            self.problems.append(f"{seen} (expected {wanted})" if wanted else seen)

    def result(self) -> Check:
        return Check(self.label, not self.problems, "; ".join(self.problems or self.seen))


def _side(c: Collector, obs: Observations, tag: str) -> SideRun | None:
    """The run's side chord ``tag``; a check that needs it fails when it is missing."""
    side = obs.sides.get(tag)
    if side is None:
        c.expect(False, f"no side chord '{tag}'", "one")
    return side


def _failed_detail(obs: Observations, doc: str) -> tuple[str, str]:
    f = obs.failed(doc)
    return (str(f.get("reason")), str(f.get("error"))) if f else ("", "")


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
    reason, error = _failed_detail(obs, "doc1")
    c.expect(reason == "error" and "PermanentError" in error, f"doc1 {reason or 'not failed'} {error!r}", "error PermanentError")
    # The hard variant: a chain head that expired before it ran (its own chord, side "expired").
    if (side := obs.sides.get("expired")) is not None:
        f31 = side.failed("doc31") or {}
        # With FM-7's prefetch 1 no consumer may have room when it arrives: RabbitMQ then expires it
        # itself (AMQP expiration 0) and dead-letters it, and the drain finalises its chain.
        by_broker = f31.get("reason") == "dead_lettered" and f31.get("error") == EXPIRED_LETTER and fm.prefetch_one
        c.expect(_side_done(side) and (by_broker or f31.get("reason") == "expired" and f31.get("error") == EXPIRED_ERROR
                                       and side.heads.get("doc31") == "REVOKED"),
                 f"expired head: chord {_side_state(side)}, doc31 {f31.get('reason') or 'not failed'} "
                 f"{f31.get('error')!r}, head {side.heads.get('doc31')}",
                 f"chord SUCCESS, doc31 expired {EXPIRED_ERROR!r}, head REVOKED (Celery's record)")
    return c.result()


EXPIRED_LETTER = "fetch_document dead-lettered by the broker (expired) after an unknown number of deliveries, 0 started"
"""G1 on a prefetch of 1 (FM-7 on): what the drain writes for the expired head RabbitMQ dead-lettered."""
EXPIRED_ERROR = "UpstreamFailed: fetch_document expired before it ran"
"""G1: what the expired head's document says (``shared.envelope.envelope_revoked``, through ``unwrap``)."""


def _side_done(side: SideRun) -> bool:
    env = side.chord.envelope
    return side.chord.state == "SUCCESS" and env is not None and env.ok


def _side_state(side: SideRun) -> str:
    env = side.chord.envelope
    return f"{side.chord.state}" + (f" envelope {env.status}" if env is not None else f" {side.chord.error_type or ''}".rstrip())


def g2(obs: Observations, fm: Fm) -> Check:
    c = Collector("G2")
    a3, a2 = obs.attempts.get("doc3", 0), obs.attempts.get("doc2", 0)
    c.expect(a3 == 2, f"doc3 attempts {a3}", "2")
    c.expect(a2 == 1, f"doc2 attempts {a2}", "1")
    c.expect("doc3" in obs.ok_docs(), f"doc3 {'ok' if 'doc3' in obs.ok_docs() else 'not ok'}", "ok")
    return c.result()


def g3(obs: Observations, fm: Fm) -> Check:
    c = Collector("G3")
    bound = _bound(fm)
    a4 = obs.attempts.get("doc4", 0)
    c.expect(a4 == bound, f"doc4 attempts {a4}", f"the broker's bound {bound}" if bound else "a bound (no dead-letter policy)")
    reason, error = _failed_detail(obs, "doc4")
    wanted = _dead_letter_error("parse_document", bound)
    c.expect(reason == "dead_lettered" and error == wanted, f"doc4 {reason or 'not failed'} {error!r}", repr(wanted))
    # The hard variant: doc9's poison is its fetch, the chain's head, not the chord member.
    f9, a9 = obs.fetch_attempts.get("doc9", 0), obs.attempts.get("doc9", 0)
    c.expect(f9 == bound and a9 == 0, f"doc9 fetched {f9}x, parsed {a9}x", f"fetched {bound}x (the bound), parsed 0x")
    reason, error = _failed_detail(obs, "doc9")
    wanted = _dead_letter_error("fetch_document", bound)
    c.expect(reason == "dead_lettered" and error == wanted, f"doc9 {reason or 'not failed'} {error!r}", repr(wanted))
    kept = [e.get("doc") for e in obs.events if e.kind == "dead_letter_kept"]
    c.expect(not kept and obs.dlq_depth == 0, f"DLQ depth {obs.dlq_depth}, kept {kept}", "0, nothing kept")
    # The hard variants, each a chord of its own: a poison chord body (side "body") ends visibly, as
    # its chord's result; letters the drain cannot place (more than a pass reads) are parked apart
    # and do not delay a poison member behind them (side "behind").
    if (body := obs.sides.get("body")) is not None:
        env = body.chord.envelope
        wanted = _dead_letter_error("notify", bound)
        said = env.error if env is not None else None
        c.expect(body.chord.state == "SUCCESS" and env is not None and env.reason == "dead_lettered" and said == wanted
                 and not body.emails,
                 f"poison body: chord {_side_state(body)} {env.reason if env else ''} {said!r}, emails {len(body.emails)}",
                 f"SUCCESS, its envelope dead_lettered {wanted!r}, no email")
    if (behind := obs.sides.get("behind")) is not None:
        f33 = behind.failed("doc33") or {}
        parked, foreign = sum(1 for e in obs.events if e.kind == "dead_letter_parked"), foreign_letters(fm)
        c.expect(_side_done(behind) and f33.get("reason") == "dead_lettered" and len(behind.emails) == 1,
                 f"behind {foreign} foreign letters: chord {_side_state(behind)}, doc33 "
                 f"{f33.get('reason') or 'not failed'}, emails {len(behind.emails)}",
                 "SUCCESS, doc33 dead_lettered, 1 email")
        c.expect(obs.parked == foreign and parked == foreign,
                 f"parked {obs.parked} (announced {parked})", f"the {foreign} foreign letters, each announced")
    return c.result()


def _dead_letter_error(task: str, bound: int) -> str:
    """What the drain writes for a poison message (every delivery started its body)."""
    return f"{task} dead-lettered by the broker (delivery_limit) after {bound} deliveries, {bound} started"


def g4(obs: Observations, fm: Fm) -> Check:
    c = Collector("G4")
    c.expect(len(obs.emails) == 1, f"emails {len(obs.emails)}", "exactly 1")
    # The hard variant: the owner dies before sending (its redelivery resumes the claim), then
    # once the email is out (the next redelivery sends again; the mail API drops the repeat key).
    c.expect(obs.mail_calls == 2, f"mail API calls {obs.mail_calls}", "2 (the second one deduplicated)")
    runs = obs.notify_runs.get("chord", 0)
    crashes = [e.get("when") for e in obs.events if e.kind == "crash" and e.get("role") == "chord"]
    c.expect(runs == 3 and crashes == ["before_send", "after_send"], f"chord notify started {runs}x, killed {crashes}",
             "3x, killed before_send then after_send")
    died = next((e.t for e in obs.events if e.kind == "crash" and e.get("when") == "before_send"), None)
    sent = next((e.t for e in obs.events if e.kind == "email"), None)
    took = sent - died if died is not None and sent is not None else None
    c.expect(took is not None and took <= OWNER_RECOVERY_SECONDS,
             f"email {'never sent' if took is None else f'{took:.2f}s'} after the owner died",
             f"<= {OWNER_RECOVERY_SECONDS}s")
    dup = obs.duplicate
    env = dup.envelope if dup else None
    payload = cast(object, env.payload if env is not None and env.ok else None)
    sent_flag = cast(Mapping[str, object], payload).get("sent") if isinstance(payload, Mapping) else None
    c.expect(sent_flag is False, f"duplicate returned sent={sent_flag}", "sent=False")
    # The gate holds the owner between claiming and sending, so the duplicate meets a
    # busy claim first: its busy-retry is the observable sign that it saw the claim.
    saw = any(e.kind == "notify_retry" and e.get("role") == "duplicate" for e in obs.events)
    c.expect(saw, f"duplicate {'saw' if saw else 'did not see'} the claim", "saw the claim (a busy-retry)")
    # The poison body (FM-3's side "body") won the claim before it died: the drain's finalising releases it.
    if (body := obs.sides.get("body")) is not None:
        c.expect(body.claim is None, f"the dead-lettered body's claim {body.claim or 'released'}", "released")
    return c.result()


def g5(obs: Observations, fm: Fm) -> Check:
    c = Collector("G5")
    a5, a6 = obs.attempts.get("doc5", 0), obs.attempts.get("doc6", 0)
    c.expect("doc5" in obs.ok_docs() and a5 == 3, f"doc5 {'ok' if 'doc5' in obs.ok_docs() else 'failed'} after {a5}", "ok after 3")
    policy = fm.retry_policy
    reason, _ = _failed_detail(obs, "doc6")
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


def g6(obs: Observations, fm: Fm) -> Check:
    c = Collector("G6")
    r7, _ = _failed_detail(obs, "doc7")
    r8, _ = _failed_detail(obs, "doc8")
    c.expect(r7 == "soft_timeout", f"doc7 {r7 or 'not failed'}", "soft_timeout")
    c.expect(r8 == "hard_timeout", f"doc8 {r8 or 'not failed'}", "hard_timeout")
    # The hard variants: a body that swallows Exception cannot swallow HardTimeout (a
    # BaseException); C code outlives every signal and ends at Celery's time_limit, which
    # the backstop request records as an envelope instead of a FAILURE state.
    r10, _ = _failed_detail(obs, "doc10")
    r11, e11 = _failed_detail(obs, "doc11")
    c.expect(r10 == "hard_timeout", f"doc10 {r10 or 'not failed'}", "hard_timeout")
    c.expect(r11 == "time_limit" and "TimeLimitExceeded" in e11, f"doc11 {r11 or 'not failed'} {e11!r}",
             "time_limit (TimeLimitExceeded)")
    # The late finisher: its body ends inside the soft deadline, then the result store stalls past it;
    # no limit fires outside the body (no Celery soft limit; the in-body timer ended with the body).
    stalled = any(e.kind == "store_stall" and e.get("doc") == "doc28" for e in obs.events)
    c.expect("doc28" in obs.ok_docs() and stalled, f"doc28 {'ok' if 'doc28' in obs.ok_docs() else _failed_detail(obs, 'doc28')}"
             f"{', its store stalled' if stalled else ', no stall seen'}", "ok after a stalled store")
    # A Celery limit that does land outside the body (time_limit, in the stalled store) is an envelope.
    r30, e30 = _failed_detail(obs, "doc30")
    c.expect(r30 == "time_limit" and "TimeLimitExceeded" in e30, f"doc30 {r30 or 'not failed'} {e30!r}", "time_limit")
    # A hang in the chain's head: the fetch has its own deadline.
    r29, e29 = _failed_detail(obs, "doc29")
    c.expect(r29 == "hard_timeout" and "fetch_document ran past its hard timeout" in e29,
             f"doc29 {r29 or 'not failed'} {e29!r}", "hard_timeout of its fetch")
    p = obs.probe_seconds
    c.expect(p is not None and p <= PROBE_AT_ONCE_SECONDS, f"probe {'lost' if p is None else f'{p:.2f}s'}", f"<= {PROBE_AT_ONCE_SECONDS}s")
    return c.result()


MIN_DEPLOYS = 2
"""G7: the runner aims at the scenario's 3 deploys; each needs a new worker booted while slow documents
remain (1 to 5 s on the lab's loaded two-core machine), so a run with 2 counts (the issue's "at least two")."""


def _deploys_of(obs: Observations) -> int:
    return max((side.deploys for side in scenario(obs.scenario).sides), default=0)


@dataclass(frozen=True)
class DeployFindings:
    """What scenario 7's side chord ``deploy`` shows about its deploys (``lab.deploys``)."""

    terms: list[Event]
    ends: list[str]  # per deploy: "exited after 1.234s" or "SIGKILLed after 0.600s"
    lost: list[str]  # documents whose body ran at a SIGTERM and was still running when its SIGKILL came
    late: list[str]  # documents whose body began after a SIGTERM and was killed at its grace's end
    dead: list[str]  # documents dead-lettered, with what the drain wrote
    overlaps: list[str]  # documents parsed in two processes at once
    sent_back: list[str]  # documents the drain found innocent at their delivery limit and published again (FM-7)
    repeated: list[str]  # documents whose fetch or parse ran again after it had ended ok (its ack never sent)


def deploy_findings(side: SideRun) -> DeployFindings:
    events = side.events
    terms = [e for e in events if e.kind == "deploy_term"]
    finals = {e.get("n"): e for e in events if e.kind in ("deploy_exit", "deploy_kill")}
    ends = [f"{'SIGKILLed' if (f := finals.get(t.get('n'))) is not None and f.kind == 'deploy_kill' else 'exited'}"
            f" after {f.get('seconds') if f is not None else '?'}s" for t in terms]
    lost, late = killed_at_grace(events)
    dead = [f"{d} ({(side.failed(d) or {}).get('error', 'its chord member had already ended ok: counted twice')})" for d in side.docs
            if any(e.kind == "dead_lettered" and e.get("doc") == d for e in events)]
    sent_back = [f"{e.get('doc')} ({e.get('why')})" for e in events if e.kind == "sent_back"]
    return DeployFindings(terms, ends, lost, late, dead, _overlaps(events), sent_back, _repeats(events))


_STAGES = {"fetch_start": "fetch", "fetch_end": "fetch", "attempt_start": "parse", "attempt_end": "parse"}


def killed_at_grace(events: Sequence[Event]) -> tuple[list[str], list[str]]:
    """The documents a deploy's SIGKILL killed mid-body: those whose body ran at its SIGTERM (the soft
    shutdown should have cut them), and those whose body began after it (Celery cannot cancel those)."""
    running = {e.get("n"): set(e.get("running").split(",")) for e in events if e.kind == "deploy_term"}
    killed = [(doc, e.get("n")) for e in events if e.kind == "deploy_kill" for doc in e.get("lost").split(",") if doc]
    return ([doc for doc, n in killed if doc in running.get(n, set())],
            [doc for doc, n in killed if doc not in running.get(n, set())])


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


def _overlaps(events: Sequence[Event]) -> list[str]:
    """Documents whose attempt began while the one before still ran: it had not ended, and the worker
    that ran it (its main process, from ``received``) had not been stopped by a deploy before."""
    gone: dict[str, float] = {}  # worker main pid -> when a deploy saw it exit or killed it
    pids = {e.get("n"): e.get("old_pid") for e in events if e.kind == "deploy_term"}
    for e in events:
        if e.kind in ("deploy_exit", "deploy_kill"):
            gone[pids.get(e.get("n"), "")] = e.t
    holder: dict[str, str] = {}  # task id -> pid of the worker that received it last
    running: dict[str, tuple[str, float, str]] = {}  # doc -> (attempt, start, holder) of its latest attempt
    ended: set[tuple[str, str]] = set()
    found: list[str] = []
    for e in events:
        doc, task = e.get("doc"), e.get("task")
        if e.kind == "received":
            holder[task] = e.get("pid")
        elif e.kind == "attempt_end":
            ended.add((doc, e.get("attempt")))
        elif e.kind == "attempt_start":
            before = running.get(doc)
            if before is not None and (doc, before[0]) not in ended and gone.get(before[2], e.t + 1) > e.t:
                found.append(f"{doc} attempt {e.get('attempt')} began {e.t - before[1]:.2f}s after attempt {before[0]}, "
                             "which still ran")
            running[doc] = (e.get("attempt"), e.t, holder.get(task, ""))
    return found


def g7(obs: Observations, fm: Fm) -> Check:
    c = Collector("G7")
    if (side := _side(c, obs, "deploy")) is None:
        return c.result()
    f, wanted = deploy_findings(side), _deploys_of(obs)
    if any(e.kind == "deploy_start" for e in side.events):  # the harness deployed (each needs a new worker booted in time)
        c.expect(MIN_DEPLOYS <= len(f.terms) <= wanted, f"{len(f.terms)} deploys ({'; '.join(f.ends)})",
                 f"{MIN_DEPLOYS} to {wanted}")
    else:  # by hand: the deploys are yours (SIGTERM of one of two workers); seen as the work changing workers
        workers = {e.get("pid") for e in side.events if e.kind == "received"}
        c.expect(len(workers) >= 2, f"by hand: the slow documents were taken by {len(workers)} worker(s)",
                 "at least 2 (start a second worker, then SIGTERM the first while they run)")
    summary = summary_of_side(side)
    n_ok, n_failed = len(summary.get("ok", [])), len(summary.get("failed", []))
    once = sorted(short_doc(str(d)) for d in summary.get("ok", [])) == sorted(side.docs)  # each once, none missing
    c.expect(_side_done(side) and once and n_failed == 0 and len(side.emails) == 1,
             f"deploy chord {_side_state(side)}: {n_ok} ok, {n_failed} failed of {len(side.docs)}, emails {len(side.emails)}",
             f"SUCCESS, all {len(side.docs)} ok, 1 email")
    c.expect(not f.dead, f"dead-lettered: {', '.join(f.dead) or 'none'}; sent back as innocent: "
             f"{', '.join(f.sent_back) or 'none'}", "none dead-lettered (no slow document is poison)")
    c.expect(not f.overlaps, f"parsed twice at once: {'; '.join(f.overlaps) or 'none'}", "none")
    c.seen.append(f"finished work run again (not a G7 condition: fm7's Tradeoffs): {'; '.join(f.repeated) or 'none'}")
    c.expect(not f.lost, f"bodies running at a SIGTERM and still when its grace ended (killed): {', '.join(f.lost) or 'none'}",
             "none")
    c.seen.append(f"begun after a SIGTERM, so not Celery's to cancel, and killed at the grace (run again; fm7's Tradeoffs): "
                  f"{', '.join(f.late) or 'none'}")
    return c.result()


BACKEND_RETURN_SECONDS = 12.0
"""G8: the side chord ``outage`` is done (its ``notify`` ended) within this of the backend's last return.
What is then left to do: the members the drain sends back run again (a pass every 0.25 s, 0.8 s a
body), and ``notify``, whose claim met the outage, waits out its retry's backoff (fm8's
``BACKEND_GONE``: a delay of 0.5 x 2^k to twice that, k the retries so far; a 4 s outage fits in
k = 0..3, so the retry after the return may be up to 8 s away), then sends once more, the mail API
deduplicating on the claim's key."""


@dataclass(frozen=True)
class OutageFindings:
    """What scenario 8's side chord ``outage`` shows (``lab.outage``)."""

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
    if (side := _side(c, obs, "outage")) is None:
        return c.result()
    f = outage_findings(side)
    by_hand = not f.downs  # the harness stops the backend itself; by hand the outage is yours
    if not by_hand:
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
    c.expect(_side_done(side) and once and n_failed == 0 and len(side.emails) == 1,
             f"outage chord {_side_state(side)}: {n_ok} ok, {n_failed} failed of {len(side.docs)}, emails {len(side.emails)}",
             f"SUCCESS, all {len(side.docs)} ok, 1 email")
    after = f.done_after
    c.expect(by_hand or (after is not None and after <= BACKEND_RETURN_SECONDS),
             f"done {'never' if after is None else f'{after:.2f}s'} after the backend's last return",
             f"within {BACKEND_RETURN_SECONDS:.0f}s")
    c.expect(not f.lost, f"acked with its outcome unstored: {', '.join(f.lost) or 'none'}", "none")
    overlaps = _overlaps(side.events)
    c.expect(not overlaps, f"parsed twice at once: {'; '.join(overlaps) or 'none'}", "none")
    return c.result()


@dataclass(frozen=True)
class ConnlossFindings:
    """What scenario 9's sides ``connloss`` and ``overlong`` show (``lab.connloss``)."""

    cuts: list[Event]  # link_cut: the worker's connections dropped, and which member ran then
    overlaps: list[str]  # documents parsed in two processes at once (connloss)
    ran_on: list[str]  # runs that went on to their end after the cut, their message given back meanwhile (connloss)
    exits: list[Event]  # worker_exit: the linked worker ended during the run
    hung_starts: int  # how many times the over-long member's parse began
    hung_back: int  # how many times its message came back to a worker (the broker's timeout closed its channel)
    hung_end: str  # how the over-long member ended in its chord's summary


def connloss_findings(connloss: SideRun | None, overlong: SideRun | None) -> ConnlossFindings:
    events = [*(connloss.events if connloss else ()), *(overlong.events if overlong else ())]
    failed = overlong.failed(HUNG_DOC) if overlong is not None else None
    return ConnlossFindings(
        cuts=[e for e in events if e.kind == "link_cut"],
        overlaps=_overlaps(connloss.events) if connloss else [],
        ran_on=_ran_on(connloss.events) if connloss else [],
        exits=[e for e in events if e.kind == "worker_exit"],
        hung_starts=sum(1 for e in (overlong.events if overlong else ()) if e.kind == "attempt_start" and e.get("doc") == HUNG_DOC),
        hung_back=max(0, sum(1 for e in (overlong.events if overlong else ()) if e.kind == "received" and e.get("doc") == HUNG_DOC) - 1),
        hung_end=f"failed {failed.get('reason')}" if failed is not None else "no outcome")


def _ran_on(events: Sequence[Event]) -> list[str]:
    """The parses running at a cut that were not stopped: each ended after it other than ``cancelled``, while
    its message had come back to the worker (``received`` again) before that end."""
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
    return found


def g9(obs: Observations, fm: Fm) -> Check:
    c = Collector("G9")
    connloss, overlong = _side(c, obs, "connloss"), _side(c, obs, "overlong")
    if connloss is None or overlong is None:
        return c.result()
    f = connloss_findings(connloss, overlong)
    by_hand = not any(e.kind == "linked" for e in connloss.events)  # by hand the drop is yours, and the broker's timeout
    if not by_hand:
        cuts = ", ".join(f"{e.get('connections')} connections while {e.get('running')} ran" for e in f.cuts)
        c.expect(len(f.cuts) == 1 and f.cuts[0].get("running") in CONNLOSS_DOCS, f"cut: {cuts or 'never'}",
                 "once, while a member ran")
    c.expect(not f.overlaps, f"parsed twice at once: {'; '.join(f.overlaps) or 'none'}", "none")
    c.expect(not f.ran_on, f"ran on after its message went back: {'; '.join(f.ran_on) or 'none'}", "none (cancelled)")
    for side in (connloss, overlong):
        summary = summary_of_side(side)
        ok = sorted(short_doc(str(d)) for d in summary.get("ok", []))
        wanted = sorted(d for d in side.docs if side is connloss or d != HUNG_DOC)
        c.expect(_side_done(side) and ok == wanted and len(side.emails) == 1,
                 f"{side.tag} chord {_side_state(side)}: ok {', '.join(ok) or 'none'}, emails {len(side.emails)}",
                 f"SUCCESS, ok {', '.join(wanted)} (each once), 1 email")
    c.expect(not f.exits, f"the linked worker exited: {', '.join(e.get('code') for e in f.exits) or 'no'}",
             "no: it reconnects and serves again")
    c.expect(f.hung_starts == 1 and f.hung_back == 0 and f.hung_end == "failed time_limit",
             f"the over-long member parsed {f.hung_starts}x, its message back {f.hung_back}x, {f.hung_end}",
             "1x, never back, failed time_limit (its kill before the broker's consumer timeout)")
    return c.result()


def summary_of_side(side: SideRun) -> Mapping[str, list[object]]:
    env = side.chord.envelope
    payload = cast(object, env.payload if env is not None and env.ok else None)
    return cast(Mapping[str, list[object]], payload) if isinstance(payload, Mapping) else {}


GUARANTEES: tuple[Callable[[Observations, Fm], Check], ...] = (g1, g2, g3, g4, g5, g6, g7, g8, g9)


def guarantees(n: int, obs: Observations, fm: Fm) -> list[Check]:
    """G1..Gn on FM n's run of scenario n."""
    return [check(obs, fm) for check in GUARANTEES[:n]]


# ---- symptoms: scenario n on FM n-1's code ----


def _chord_error(c: Collector, obs: Observations, must_name: str) -> None:
    ch = obs.chord
    c.expect(
        ch.state == "FAILURE" and ch.error_type == "ChordError" and must_name in (ch.error or ""),
        f"chord result {ch.state} {ch.error_type}: {ch.error!r}",
        f"FAILURE ChordError naming {must_name}",
    )


def _notify_never(c: Collector, obs: Observations) -> None:
    runs = obs.notify_runs.get("chord", 0)
    c.expect(runs == 0, f"notify ran {runs}x", "0")


def s1(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S1")
    _notify_never(c, obs)
    _chord_error(c, obs, "doc1 is malformed")
    return c.result()


def s2(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S2")
    a3 = obs.attempts.get("doc3", 0)
    c.expect(a3 == 1, f"doc3 attempts {a3}", "1")
    _chord_error(c, obs, "WorkerLostError")
    _notify_never(c, obs)
    return c.result()


def _bound(fixed: Fm) -> int:
    return fixed.delivery_bound or 0


def s3(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S3")
    a4, bound = obs.attempts.get("doc4", 0), _bound(fixed)
    c.expect(a4 > bound, f"doc4 attempts {a4}", f"past the bound {bound}")
    _notify_never(c, obs)
    return c.result()


def s4(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S4")
    # Without a claim every delivery that reaches the mail API sends: the duplicate, killed
    # once its email is out, its redelivery, and the owner's redelivery (the owner itself
    # was killed before sending). Without an idempotency key the API delivers them all.
    c.expect(len(obs.emails) == 3 and obs.mail_calls == 3, f"emails {len(obs.emails)} of {obs.mail_calls} calls", "3 of 3")
    return c.result()


def s5(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S5")
    reason, _ = _failed_detail(obs, "doc5")
    a5 = obs.attempts.get("doc5", 0)
    c.expect(bool(reason) and a5 == 1, f"doc5 {reason or 'not failed'} after {a5}", "failed after 1")
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
    _notify_never(c, obs)
    return c.result()


def s7(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S7")
    if (side := _side(c, obs, "deploy")) is None:
        return c.result()
    f = deploy_findings(side)
    c.expect(bool(f.terms) and bool(f.lost or f.dead or f.overlaps),
             f"{len(f.terms)} deploys ({'; '.join(f.ends)}); work lost to a SIGKILL: {', '.join(f.lost) or 'none'}; "
             f"innocent dead-lettered: {', '.join(f.dead) or 'none'}; parsed twice at once: {'; '.join(f.overlaps) or 'none'}",
             "a body killed at a grace's end, an innocent document dead-lettered, or one parsed twice at once")
    return c.result()


def s8(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S8")
    if (side := _side(c, obs, "outage")) is None:
        return c.result()
    f = outage_findings(side)
    back = f.ups[0].t if f.ups else None
    c.expect(back is not None and bool(f.lost) and not _side_done(side),
             f"{len(f.failed)} stores failed; acked with the outcome unstored: {', '.join(f.lost) or 'none'}; "
             f"outage chord {_side_state(side)}",
             "members acked and lost, the chord not done after the backend was back")
    return c.result()


def s9(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S9")
    connloss, overlong = _side(c, obs, "connloss"), _side(c, obs, "overlong")
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


SYMPTOMS: tuple[Callable[[Observations, Fm], Check], ...] = (s1, s2, s3, s4, s5, s6, s7, s8, s9)


# ---- hard variants: scenario n on FM n without its hard fix (lessons/<fm>/before_hard_fix.py) ----


def s1_hard(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S1 hard")
    if (side := _side(c, obs, "expired")) is None:
        return c.result()
    c.expect(side.heads.get("doc31") == "REVOKED", f"doc31's head {side.heads.get('doc31')}", "REVOKED (expired)")
    started = side.attempts.get("doc31", 0)
    c.expect(started == 0 and side.chord.state == "PENDING", f"doc31 parsed {started}x, its chord {side.chord.state}",
             "parsed 0x, PENDING (never completes)")
    return c.result()


def s3_hard(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S3 hard")
    bound, f9 = _bound(fixed), obs.fetch_attempts.get("doc9", 0)
    c.expect(f9 == bound, f"doc9 fetched {f9}x", f"{bound}x, then dead-lettered")
    kept = any(e.kind == "dead_letter_kept" and e.get("doc") == "doc9" for e in obs.events)
    c.expect(kept, f"doc9's dead letter {'kept in the DLQ' if kept else 'not seen'}", "kept: no chord member to finalise")
    c.expect(obs.chord.state == "PENDING", f"chord {obs.chord.state}", "PENDING (never completes)")
    _notify_never(c, obs)
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


def s4_hard(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S4 hard")
    died = next((e.t for e in obs.events if e.kind == "crash" and e.get("when") == "before_send"), None)
    own = [e for e in obs.events if e.kind == "notify_retry" and e.get("role") == "chord" and died is not None and e.t > died]
    c.expect(bool(own), f"the owner's redelivery {'busy-retried on its own claim' if own else 'was not turned away'}",
             "turned away by its own claim")
    c.expect(not obs.emails, f"emails {len(obs.emails)}", "0")
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


def s9_hard(obs: Observations, fixed: Fm) -> Check:
    c = Collector("S9 hard")
    if (overlong := _side(c, obs, "overlong")) is None:
        return c.result()
    f = connloss_findings(obs.sides.get("connloss"), overlong)
    overlaps = _overlaps(overlong.events)
    c.expect(f.hung_back >= 1, f"the over-long member's message back {f.hung_back}x (parsed {f.hung_starts}x, {f.hung_end})",
             "back at least once: the broker's timeout closed its channel before Celery's kill")
    c.seen.append(f"a run begun while one before had no end (a cancel cannot reach C code): {'; '.join(overlaps) or 'none'}")
    c.expect(not f.exits, f"the linked worker exited: {', '.join(e.get('code') for e in f.exits) or 'no'}",
             "no (broker_channel_error_retry)")
    return c.result()


WEAK: dict[int, Callable[[Observations, Fm], Check]] = {1: s1_hard, 3: s3_hard, 4: s4_hard, 5: s5_hard, 6: s6_hard, 9: s9_hard}


def weak_symptom(n: int, obs: Observations, fixed: Fm) -> Check:
    return WEAK[n](obs, fixed)


def weak_stop(n: int, fixed: Fm, weak: Fm | None = None) -> tuple[str, StopCondition] | None:
    """Where a weak run stops: its chords never complete (S1, S3, S6 hard), would wait long (S4 hard),
    or its symptom is over (S5 hard: the probe is back)."""
    if n == 1:
        return ("doc31's expired head was discarded, and its parse never came", _expired_head_left)
    if n == 3:
        return ("the drain kept doc9 and the poison body, and never reached doc33", _drain_blocked(fixed, weak))
    if n == 6:
        deadline = fixed.fetch_hard_timeout() or HARD_HANG_CAP_SECONDS
        return ("doc11 and doc28 failed outside their bodies, doc29's fetch outlived its deadline",
                lambda r: r.member_state("doc11") == "FAILURE" and r.member_state("doc28") == "FAILURE"
                and _outlived(r, "doc29", deadline, "fetch_start"))
    if n == 4:
        return ("the owner was turned away by its own claim", _owner_turned_away)
    if n == 5:
        return ("the burst's probe came back", lambda r: r.has_event("burst_probe_back"))
    if n == 9:
        return (f"the over-long member ran a second time, or had no outcome {HUNG_WAIT:.0f}s after it began",
                lambda r: _overlong_broke(r) or _hung_for(r, HUNG_WAIT))
    return None


HUNG_WAIT = 8.0
"""S9 hard's stop: the over-long member, stuck in C code, began this long ago and the run goes on (its
``time_limit`` is 3 s, the node's consumer timeout 2.4 s)."""


def _hung_for(r: Reader, seconds: float) -> bool:
    side = r.side_readers.get("overlong")
    starts = [e.t for e in side.events() if e.kind == "attempt_start" and e.get("doc") == HUNG_DOC] if side else []
    return bool(starts) and time.time() - starts[0] > seconds


def _expired_head_left(r: Reader) -> bool:
    side = r.side_readers.get("expired")
    revoked = [e.t for e in side.events() if e.kind == "revoked"] if side is not None else []
    return bool(revoked) and time.time() - revoked[0] > NOT_RUN_WINDOW


def _drain_blocked(fixed: Fm, weak: Fm | None) -> StopCondition:
    """doc9 and the poison body kept, doc33 dead-lettered behind the foreign letters, and three more
    passes of the drain since, none of which reached it."""
    bound, prefix = _bound(fixed), redis_prefix(weak.short if weak is not None else fixed.short)
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


def _owner_turned_away(r: Reader) -> bool:
    events = r.events()
    died = next((e.t for e in events if e.kind == "crash" and e.get("when") == "before_send"), None)
    return died is not None and any(e.kind == "notify_retry" and e.get("role") == "chord" and e.t > died for e in events)


def symptom(n: int, obs: Observations, fixed: Fm) -> Check:
    return SYMPTOMS[n - 1](obs, fixed)


def symptom_stop(n: int, fixed: Fm) -> tuple[str, StopCondition] | None:
    """Where a broken run stops when its chord never completes (S3, S6); else None."""
    if n == 3:
        bound = _bound(fixed)
        return ("doc4 passed the bound", lambda r: r.attempts("doc4") > bound)
    if n == 6:
        deadline = _hard_deadline(fixed)
        return ("doc8 outlived the hard deadline", lambda r: _outlived(r, "doc8", deadline))
    if n == 8:
        return (f"the outage chord not done {BACKEND_RETURN_SECONDS:.0f}s after the backend's return", _outage_outlived)
    if n == 9:
        return ("the linked worker exited, or the over-long member ran again", _overlong_broke)
    return None


def _overlong_broke(r: Reader) -> bool:
    """S9's stop: the side ``overlong``'s worker is gone, or its hung member began a second time."""
    sides = [r.side_readers.get(tag) for tag in ("connloss", "overlong")]
    events = [e for side in sides if side is not None for e in side.events()]  # the exit is seen by either
    return any(e.kind == "worker_exit" for e in events) or sum(
        1 for e in events if e.kind == "attempt_start" and e.get("doc") == HUNG_DOC) > 1


def _outage_outlived(r: Reader) -> bool:
    """S8's stop: G8's bound has passed since the backend came back from the members' outage."""
    side = r.side_readers.get("outage")
    ups = [e.t for e in side.events() if e.kind == "backend_up"] if side is not None else []
    return bool(ups) and time.time() - ups[0] > BACKEND_RETURN_SECONDS


def _outlived(r: Reader, doc: str, seconds: float, kind: str = "attempt_start") -> bool:
    starts = [e.t for e in r.events() if e.kind == kind and e.get("doc") == doc]
    return bool(starts) and time.time() - starts[0] > seconds + 0.5
