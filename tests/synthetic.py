"""Synthetic ``Observations`` (no broker): the event streams of a fixed and a broken run.

``fixed_run()`` holds every ending a timeline draws: ok, raised error, killed and
redelivered, dead-lettered, retried then ok, retries exhausted, soft and hard
timeouts, a process killed at its time limit, a chord ``notify`` that sends and a duplicate that busy-retries then
skips. ``broken_run()`` is a run stopped on its symptom: a pinned slot, a kill
the run did not outlive, a retry still to come, no ``notify``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shared.envelope import Result
from lab.observe import Event
from lab.runner import Observations, Outcome

T0 = 1_000_000.0  # submission time (wall clock)
DOCS = (*(f"doc{i}" for i in range(1, 9)), "doc11")


def ev(t: float, kind: str, **fields: object) -> Event:
    return Event(T0 + t, kind, {k: str(v) for k, v in fields.items()})


def start(t: float, doc: str, n: int) -> Event:
    return ev(t, "attempt_start", doc=doc, attempt=n)


def end(t: float, doc: str, n: int, outcome: str = "ok", error: str = "") -> Event:
    return ev(t, "attempt_end", doc=doc, attempt=n, outcome=outcome, **({"error": error} if error else {}))


def observations(events: list[Event], chord: Outcome, *, fm: str = "fm6", stopped_by: str = "chord finished",
                 elapsed: float = 2.5, emails: tuple[str, ...] = ()) -> Observations:
    attempts = {d: sum(1 for e in events if e.kind == "attempt_start" and e.get("doc") == d) for d in DOCS}
    notify = {r: sum(1 for e in events if e.kind == "notify_start" and e.get("role") == r) for r in ("chord", "duplicate")}
    fetches = {d: sum(1 for e in events if e.kind == "fetch_start" and e.get("doc") == d) for d in DOCS}
    return Observations(fm=fm, run_id="120000-abc123", scenario=6, docs=DOCS, attempts=attempts, fetch_attempts=fetches,
                        events=tuple(events), notify_runs=notify, emails=emails, mail_calls=len(emails), chord=chord, duplicate=None, dlq_depth=0, probe_seconds=0.01, burst_probe=None,
                        stopped_by=stopped_by, submitted_at=T0, elapsed=elapsed)


def summary_outcome(ok: list[str], failed: list[tuple[str, str, str]]) -> Outcome:
    payload: dict[str, Any] = {"ok": ok, "failed": [{"doc": d, "reason": r, "error": e} for d, r, e in failed], "sent": True}
    return Outcome("SUCCESS", Result[Any].success(payload, 1), None, None)


def fixed_run(doc1_error: str = "PermanentError: doc1 is malformed") -> Observations:
    events = [
        start(0.02, "doc1", 1), end(0.021, "doc1", 1, "error", doc1_error),
        start(0.03, "doc2", 1), end(0.031, "doc2", 1),
        start(0.03, "doc3", 1), start(0.2, "doc3", 2), end(0.201, "doc3", 2),
        start(0.04, "doc4", 1), start(0.3, "doc4", 2), start(0.5, "doc4", 3), ev(0.9, "dead_lettered", doc="doc4", deliveries=3),
        start(0.25, "doc5", 1), end(0.251, "doc5", 1, "error", "TransientError: 503"), ev(0.252, "retry", doc="doc5", retry=1, delay="0.1400"),
        start(0.45, "doc5", 2), end(0.451, "doc5", 2, "error", "TransientError: 503"), ev(0.452, "retry", doc="doc5", retry=2, delay="0.2500"),
        start(0.75, "doc5", 3), end(0.751, "doc5", 3),
        start(0.26, "doc6", 1), end(0.261, "doc6", 1, "error", "TransientError: 503"), ev(0.262, "retry", doc="doc6", retry=1, delay="0.1800"),
        start(0.46, "doc6", 2), end(0.461, "doc6", 2, "error", "TransientError: 503"), ev(0.462, "retry", doc="doc6", retry=2, delay="0.3000"),
        start(0.8, "doc6", 3), end(0.801, "doc6", 3, "error", "TransientError: 503"), ev(0.802, "retry", doc="doc6", retry=3, delay="0.6000"),
        start(1.5, "doc6", 4), end(1.501, "doc6", 4, "error", "TransientError: 503"),
        start(0.27, "doc7", 1), end(0.77, "doc7", 1, "soft_timeout", "SoftTimeLimitExceeded"),
        start(0.28, "doc8", 1), end(1.48, "doc8", 1, "hard_timeout", "HardTimeout: past 1.2s"),
        start(0.29, "doc11", 1),  # killed at its time_limit: no end; the backstop wrote its envelope
        ev(1.6, "notify_start", role="chord"), ev(1.601, "gate_wait", role="chord"),
        ev(1.62, "notify_start", role="duplicate"), ev(1.621, "notify_retry", role="duplicate", delay="0.0500"),
        ev(1.64, "email", role="chord"), ev(1.641, "notify_end", role="chord", outcome="ok", sent=True),
        ev(1.68, "notify_start", role="duplicate"), ev(1.682, "notify_end", role="duplicate", outcome="ok", sent=False),
    ]
    chord = summary_outcome(["doc2", "doc3", "doc5"], [
        ("doc1", "error", doc1_error), ("doc4", "dead_lettered", "dead-lettered by the broker"),
        ("doc6", "retries_exhausted", "RetriesExhausted: gave up after 4 attempts"),
        ("doc7", "soft_timeout", "SoftTimeLimitExceeded"), ("doc8", "hard_timeout", "HardTimeout: past 1.2s"),
        ("doc11", "time_limit", "TimeLimitExceeded: past 3s")])
    return observations(events, chord, elapsed=1.7, emails=("chord|pipeline: 3 ok, 6 failed",))


def broken_run() -> Observations:
    events = [
        start(0.02, "doc1", 1), end(0.021, "doc1", 1, "error", "PermanentError: doc1 is malformed"),
        start(0.03, "doc2", 1), end(0.031, "doc2", 1),
        start(0.03, "doc3", 1),
        start(0.04, "doc4", 1), start(2.2, "doc4", 2),
        start(0.25, "doc5", 1), end(0.251, "doc5", 1, "error", "TransientError: 503"), ev(0.252, "retry", doc="doc5", retry=1, delay="0.1400"),
        start(0.27, "doc7", 1), end(2.27, "doc7", 1),
        start(0.28, "doc8", 1),
    ]
    return observations(events, Outcome("PENDING", None, None, None), fm="fm5",
                        stopped_by="doc8 outlived the hard deadline", elapsed=2.4)


def lost_run() -> Observations:
    """fm1's code on scenario 2: doc3's process dies, nothing delivers it again, the chord fails."""
    events = [start(0.02, "doc1", 1), end(0.021, "doc1", 1, "error", "PermanentError: doc1 is malformed"),
              start(0.03, "doc2", 1), end(0.031, "doc2", 1), start(0.03, "doc3", 1)]
    chord = Outcome("FAILURE", None, "ChordError", "Dependency x raised WorkerLostError('Worker exited prematurely')")
    return observations(events, chord, fm="fm1", elapsed=0.7)


def notify_story_run() -> Observations:
    """FM-4's story: the chord's notify is killed before sending, its redelivery sends and is killed,
    the third completes (the mail API drops its repeat); the duplicate busy-retries five times, then skips."""
    retries = [x for k in range(5) for x in (ev(1.02 + 0.06 * k, "notify_start", role="duplicate"),
                                             ev(1.025 + 0.06 * k, "notify_retry", role="duplicate", delay="0.0500"))]
    events = [
        start(0.02, "doc1", 1), end(0.021, "doc1", 1, "error", "PermanentError: doc1 is malformed"),
        start(0.03, "doc2", 1), end(0.031, "doc2", 1),
        ev(1.0, "notify_start", role="chord"), ev(1.005, "gate_wait", role="chord"),
        ev(1.07, "crash", role="chord", when="before_send"),
        ev(1.09, "notify_start", role="chord"), ev(1.095, "email", role="chord"), ev(1.096, "crash", role="chord", when="after_send"),
        *retries,
        ev(1.33, "notify_start", role="chord"), ev(1.34, "email_deduplicated", role="chord"),
        ev(1.35, "notify_end", role="chord", outcome="ok", sent=True),
        ev(1.37, "notify_start", role="duplicate"), ev(1.372, "notify_end", role="duplicate", outcome="ok", sent=False),
    ]
    chord = summary_outcome(["doc2"], [("doc1", "error", "PermanentError: doc1 is malformed")])
    obs = observations(events, chord, fm="fm4", elapsed=1.4, emails=("chord|pipeline: 1 ok, 1 failed",))
    return replace(obs, docs=("doc1", "doc2"))


def kept_letter_run() -> Observations:
    """FM-3's hard variant before its fix: doc9's fetch is poison, the drain keeps its dead letter, the chord waits."""
    events = [ev(0.02, "fetch_start", doc="doc9", attempt=1), ev(0.3, "fetch_start", doc="doc9", attempt=2),
              ev(0.6, "fetch_start", doc="doc9", attempt=3), ev(0.95, "dead_letter_kept", doc="doc9", why="not a chord member"),
              start(0.03, "doc2", 1), end(0.031, "doc2", 1)]
    obs = observations(events, Outcome("PENDING", None, None, None), fm="fm3w", stopped_by="doc9's dead letter was kept",
                       elapsed=1.0)
    return replace(obs, docs=("doc2", "doc9"), fetch_attempts={"doc9": 3})
