"""Synthetic ``Observations`` (no broker): the event streams of a fixed and a broken run.

``fixed_run()`` holds every ending a timeline draws: ok, raised error, killed and
redelivered, dead-lettered, retried then ok, retries exhausted, soft and hard
timeouts, a process killed at its time limit, a chord ``notify`` that sends and a duplicate that busy-retries then
skips; ``sided_run()`` adds its side chords (``fixed_sides``): heads that expired or
were revoked before they ran, a poison ``notify`` the drain dead-lettered, a poison
member behind foreign letters the drain parked. ``broken_run()`` is a run stopped on its symptom: a
pinned slot, a kill the run did not outlive, a retry still to come, no ``notify``.
``weak_sides_run()`` is FM-3's hard variant before its fix, side chords included (an
expired head that hangs its chord, a poison body kept in silence, a member the drain
never reached); ``member_failure_run()`` FM-6's: chord members Celery stored as FAILURE
outside the body, one after its result store stalled.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shared.envelope import Result
from lab.observe import Event
from lab.runner import Observations, Outcome, SideRun

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


EXPIRED_ERROR = "UpstreamFailed: fetch_document expired before it ran"
POISON_BODY = "notify dead-lettered by the broker (delivery_limit) after 3 deliveries, 3 started"
FOREIGN = 5  # letters no drain can place, put in the DLQ before the side chord "behind"


def side(tag: str, docs: tuple[str, ...], events: list[Event], chord: Outcome, *, submitted: bool = True,
         heads: dict[str, str] | None = None, claim: str | None = None, members: dict[str, Outcome] | None = None) -> SideRun:
    attempts = {d: sum(1 for e in events if e.kind == "attempt_start" and e.get("doc") == d) for d in docs}
    fetches = {d: sum(1 for e in events if e.kind == "fetch_start" and e.get("doc") == d) for d in docs}
    emails = tuple(f"chord|pipeline 120000-abc123-{tag}" for e in events if e.kind == "email")
    return SideRun(tag, f"120000-abc123-{tag}", docs, submitted, chord, members or {}, heads or {d: "SUCCESS" for d in docs}, attempts,
                   fetches, tuple(events), emails, claim)


def poison_deliveries(t: float) -> list[Event]:
    """Three deliveries of a ``notify`` the mail API kills, 0.2 s apart."""
    return [x for k in range(3) for x in (ev(t + 0.2 * k, "notify_start", role="chord"),
                                          ev(t + 0.2 * k + 0.001, "crash", role="chord", when="poison_mail"))]


def fixed_sides() -> dict[str, SideRun]:
    sent = [ev(0.05, "notify_start", role="chord"), ev(0.052, "email", role="chord"),
            ev(0.053, "notify_end", role="chord", outcome="ok", sent=True)]
    expired = side("expired", ("doc31", "doc34"),
                   [ev(-0.004, "revoked", doc="doc31", expired=True), ev(0.002, "revoked", doc="doc34", expired=False), *sent],
                   summary_outcome([], [("doc31", "expired", EXPIRED_ERROR),
                                        ("doc34", "revoked", "UpstreamFailed: fetch_document was revoked before it ran")]),
                   heads={"doc31": "REVOKED", "doc34": "REVOKED"})
    body = side("body", ("doc32",), [ev(0.01, "fetch_start", doc="doc32", attempt=1), start(0.02, "doc32", 1),
                                     end(0.021, "doc32", 1), *poison_deliveries(0.1),
                                     ev(0.8, "dead_lettered", role="chord", death="delivery_limit")],
                Outcome("SUCCESS", Result[Any].failure(POISON_BODY, "dead_lettered", 1, 3), None, None))
    behind = side("behind", ("doc33",), [start(1.1, "doc33", 1), start(1.2, "doc33", 2), start(1.3, "doc33", 3),
                                         ev(1.45, "dead_lettered", doc="doc33", death="delivery_limit"),
                                         ev(1.5, "notify_start", role="chord"), ev(1.51, "email", role="chord"),
                                         ev(1.52, "notify_end", role="chord", outcome="ok", sent=True)],
                  summary_outcome([], [("doc33", "dead_lettered", "parse_document dead-lettered by the broker")]),
                  claim="sent:x")
    return {s.tag: s for s in (expired, body, behind)}


def foreign_letters(parked: bool) -> list[Event]:
    """The runner's foreign letters (event ``foreign_letters``), and the drain parking each (``dead_letter_parked``)."""
    parks = [ev(1.01 + 0.001 * i, "dead_letter_parked", role="chord", why="not JSON (text/plain)") for i in range(FOREIGN)]
    return [ev(1.0, "foreign_letters", count=FOREIGN), *(parks if parked else [])]


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


def sided_run(doc1_error: str = "PermanentError: doc1 is malformed") -> Observations:
    """``fixed_run`` with its side chords, and the foreign letters the drain parked ahead of the side ``behind``."""
    obs = fixed_run(doc1_error)
    return replace(obs, events=(*obs.events, *foreign_letters(parked=True)), sides=fixed_sides(), parked=FOREIGN)


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


def weak_sides_run() -> Observations:
    """FM-3's hard variant before its fix (fm3w), with its side chords: doc9's and the poison body's letters kept,
    doc33 never reached behind the foreign letters (none parked), and an expired head that hangs its chord."""
    pending = Outcome("PENDING", None, None, None)
    expired = side("expired", ("doc31",), [ev(0.003, "revoked", doc="doc31", expired=True)], pending, heads={"doc31": "REVOKED"})
    body = side("body", ("doc32",), [start(0.02, "doc32", 1), end(0.021, "doc32", 1), *poison_deliveries(0.1),
                                     ev(0.75, "dead_letter_kept", role="chord", why="not a chord member"),
                                     ev(0.95, "dead_letter_kept", role="chord", why="not a chord member")], pending)
    behind = side("behind", ("doc33",), [start(1.1, "doc33", 1), start(1.2, "doc33", 2), start(1.3, "doc33", 3)], pending)
    obs = kept_letter_run()
    return replace(obs, events=(*obs.events, *foreign_letters(parked=False)), dlq_depth=FOREIGN + 3, parked=0,
                   sides={s.tag: s for s in (expired, body, behind)})


def member_failure_run() -> Observations:
    """FM-6's hard variant before its fix (fm6w): Celery stored FAILURE for doc11's member (killed at its time_limit, in
    C code) and for doc28's (its body returned at 0.7 s, its result store stalled, the soft limit fired in the store);
    the chord waits."""
    events = [start(0.02, "doc2", 1), end(0.03, "doc2", 1), start(0.05, "doc11", 1),
              start(0.1, "doc28", 1), ev(0.8, "store_stall", doc="doc28", seconds="1.0"), end(1.1, "doc28", 1)]
    members = {"doc2": summary_outcome([], []), "doc11": Outcome("FAILURE", None, "TimeLimitExceeded", "TimeLimitExceeded(3,)"),
               "doc28": Outcome("FAILURE", None, "SoftTimeLimitExceeded", "SoftTimeLimitExceeded()")}
    obs = observations(events, Outcome("PENDING", None, None, None), fm="fm6w", stopped_by="doc11 and doc28 failed outside",
                       elapsed=2.0)
    return replace(obs, docs=("doc2", "doc11", "doc28"), members=members)
