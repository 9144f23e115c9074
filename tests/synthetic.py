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
outside the body, one after its result store stalled. ``large_fixed_run()``, ``large_broken_run()`` and
``large_weak_run()`` are as big as real fm6's: 30 documents (a burst of 16 retried once after 1.5 s), the side
chords, FM-4's notify story late in the run, a hung fetch (``fetch_start``, no ``fetch_end``, no parse).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from shared.envelope import Result
from lab.observe import Event
from lab.records import Observations, Outcome, SideRun

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


# ---- a big run, as real fm6's: 30 documents, a burst of 16, the side chords, a broken run and a hard variant -------

BURST = tuple(f"doc{i}" for i in range(12, 28))
LARGE_DOCS = (*(f"doc{i}" for i in range(1, 12)), "doc28", "doc29", "doc30", *BURST)  # the order the lab lists them in
HARD = "HardTimeout: fm6_task_timeouts.parse_document ran past its hard timeout of 1.5s"
LIMIT = "TimeLimitExceeded: fm6_task_timeouts.parse_document ran past its time_limit of 3s, and its pool process is killed"
UPSTREAM = "UpstreamFailed: HardTimeout: fm6_task_timeouts.fetch_document ran past its hard timeout of 1.5s"
LARGE_CHECKS = {
    "G1": "chord notify finished 1x; chord state SUCCESS, envelope SUCCESS; ok 20 + failed 10 of 30; doc1 error 'PermanentError: "
          "doc1 is malformed'; expired head: chord SUCCESS envelope SUCCESS, doc31 expired 'UpstreamFailed: fetch_document "
          "expired before it ran', head REVOKED",
    "G2": "doc3 attempts 2; doc2 attempts 1; doc3 ok",
    "G3": "doc4 attempts 3; doc4 dead_lettered 'parse_document dead-lettered by the broker (delivery_limit) after 3 deliveries, "
          "3 started'; doc9 fetched 3x, parsed 0x; doc9 dead_lettered 'fetch_document dead-lettered by the broker "
          "(delivery_limit) after 3 deliveries, 3 started'; DLQ depth 0, kept []; poison body: chord SUCCESS envelope FAILURE "
          "dead_lettered 'notify dead-lettered by the broker (delivery_limit) after 3 deliveries, 3 started', emails 0; behind "
          "201 foreign letters: chord SUCCESS envelope SUCCESS, doc33 dead_lettered, emails 1; parked 201 (announced 201)",
    "G4": "emails 1; mail API calls 2; chord notify started 3x, killed ['before_send', 'after_send']; email 0.44s after the owner "
          "died; duplicate returned sent=False; duplicate saw the claim; the dead-lettered body's claim released",
    "G5": "doc5 ok after 3; doc6 retries_exhausted after 4; doc5 2 retries, 2 gaps; doc5 retry 1 planned 0.148s; doc5 gap 1 "
          "7.071s; doc5 retry 2 planned 0.322s; doc5 gap 2 1.391s; doc6 3 retries, 3 gaps; doc6 retry 1 planned 0.183s; doc6 "
          "gap 1 7.331s; doc6 retry 2 planned 0.325s; doc6 gap 2 1.116s; doc6 retry 3 planned 0.483s; doc6 gap 3 0.507s; burst "
          "16 of 16 ok after 2 attempts; probe sent while 16 of the burst's retries waited; probe during the burst back in "
          "1.337s, taken by the worker 1.208s after it was sent, +0.119s before the first retry ended",
    "G6": f"doc7 soft_timeout; doc8 hard_timeout; doc10 hard_timeout; doc11 time_limit '{LIMIT}'; doc28 ok, its store stalled; "
          f"doc30 time_limit '{LIMIT}'; doc29 hard_timeout '{UPSTREAM}'; probe 0.04s",
}
"""A real fm6 fixed run's checks, as long as theirs (the section's cells are as tall)."""
LARGE_BROKEN_CHECK = "doc8 still running after 2.55s; notify ran 0x"
LARGE_WEAK_CHECK = ("doc11's member FAILURE TimeLimitExceeded; doc28's member FAILURE 'SoftTimeLimitExceeded: "
                    "SoftTimeLimitExceeded()'; doc29's fetch running after 12.00s; chord PENDING")


def _large(events: list[Event], chord: Outcome, stopped_by: str, elapsed: float, emails: tuple[str, ...] = ()) -> Observations:
    obs = observations(events, chord, stopped_by=stopped_by, elapsed=elapsed, emails=emails)
    count = {k: {d: sum(1 for e in events if e.kind == k and e.get("doc") == d) for d in LARGE_DOCS}
             for k in ("attempt_start", "fetch_start")}
    return replace(obs, docs=LARGE_DOCS, attempts=count["attempt_start"], fetch_attempts=count["fetch_start"])


def _early(doc3: bool = True) -> list[Event]:
    """doc1 malformed, doc2 ok, doc3 killed once and redelivered: the same in all three runs."""
    return [start(0.1, "doc1", 1), end(0.11, "doc1", 1, "error", "PermanentError: doc1 is malformed"),
            start(0.12, "doc2", 1), end(0.13, "doc2", 1), start(0.15, "doc3", 1), start(1.0, "doc3", 2), end(1.05, "doc3", 2)]


def _hung_doc4_to_doc6(t0: float) -> list[Event]:
    """What a stopped run left of doc4..doc6: doc4 killed once then running, doc5 and doc6 waiting for a retry."""
    return [start(0.2, "doc4", 1), start(2.5, "doc4", 2),
            start(0.3, "doc5", 1), end(0.31, "doc5", 1, "error", "TransientError: 503 from the parser service (attempt 1)"),
            ev(0.311, "retry", doc="doc5", retry=1, delay=f"{t0:.3f}"),
            start(0.32, "doc6", 1), end(0.33, "doc6", 1, "error", "TransientError: 503 from the parser service (attempt 1)"),
            ev(0.331, "retry", doc="doc6", retry=1, delay=f"{t0 - 0.03:.3f}")]


def _timeouts() -> list[Event]:
    """doc7..doc10 in a run with FM-6's deadlines: soft, hard, a poison fetch dead-lettered, hard again."""
    return [start(1.0, "doc7", 1), end(2.0, "doc7", 1, "soft_timeout", "SoftTimeLimitExceeded: SoftTimeLimitExceeded()"),
            start(1.1, "doc8", 1), end(2.6, "doc8", 1, "hard_timeout", HARD),
            ev(0.2, "fetch_start", doc="doc9", attempt=1), ev(0.55, "fetch_start", doc="doc9", attempt=2),
            ev(0.9, "fetch_start", doc="doc9", attempt=3), ev(6.47, "dead_lettered", doc="doc9", death="delivery_limit"),
            start(1.8, "doc10", 1), end(3.3, "doc10", 1, "hard_timeout", HARD)]


def large_fixed_run() -> Observations:
    """Real fm6's fixed run, as big: 30 documents, the 16 of the burst retried once after 1.5 s, FM-4's notify story
    late in the run, and the side chords (``fixed_sides``)."""
    transient = "TransientError: 503 from the parser service (attempt {})"
    burst = [x for i, d in enumerate(BURST) for x in (
        start(10.9 + 0.01 * i, d, 1), end(10.91 + 0.01 * i, d, 1, "error", "TransientError: 429 from the parser service, Retry-After 1.5"),
        ev(10.911 + 0.01 * i, "retry", doc=d, retry=1, delay="1.5"), start(12.42 + 0.005 * i, d, 2), end(12.43 + 0.005 * i, d, 2))]
    retries = [x for k in range(5) for x in (ev(11.3 + 0.2 * k, "notify_start", role="duplicate"),
                                             ev(11.302 + 0.2 * k, "notify_retry", role="duplicate", delay="0.0500"))]
    events = [
        *_early(), *_timeouts(),
        start(0.2, "doc4", 1), start(2.5, "doc4", 2), start(5.0, "doc4", 3), ev(7.87, "dead_lettered", doc="doc4", deliveries=3),
        start(0.3, "doc5", 1), end(0.31, "doc5", 1, "error", transient.format(1)), ev(0.311, "retry", doc="doc5", retry=1, delay="0.148"),
        start(7.38, "doc5", 2), end(7.39, "doc5", 2, "error", transient.format(2)), ev(7.391, "retry", doc="doc5", retry=2, delay="0.322"),
        start(8.78, "doc5", 3), end(8.79, "doc5", 3),
        start(0.32, "doc6", 1), end(0.33, "doc6", 1, "error", transient.format(1)), ev(0.331, "retry", doc="doc6", retry=1, delay="0.183"),
        start(7.66, "doc6", 2), end(7.67, "doc6", 2, "error", transient.format(2)), ev(7.671, "retry", doc="doc6", retry=2, delay="0.325"),
        start(8.78, "doc6", 3), end(8.79, "doc6", 3, "error", transient.format(3)), ev(8.791, "retry", doc="doc6", retry=3, delay="0.483"),
        start(9.3, "doc6", 4), end(9.31, "doc6", 4, "retries_exhausted", "RetriesExhausted: gave up after 4 attempts"),
        start(2.0, "doc11", 1),  # killed at its time_limit: no end; the backstop wrote its envelope
        start(2.3, "doc28", 1), ev(3.0, "store_stall", doc="doc28", seconds="1.0"), end(4.0, "doc28", 1),
        ev(0.22, "fetch_start", doc="doc29", attempt=1), ev(1.73, "fetch_end", doc="doc29", outcome="hard_timeout", error=HARD),
        start(3.5, "doc30", 1), ev(3.55, "store_stall", doc="doc30", seconds="6.0"), end(9.55, "doc30", 1),
        *burst,
        ev(11.08, "notify_start", role="chord"), ev(11.083, "gate_wait", role="chord"), ev(11.6, "crash", role="chord", when="before_send"),
        ev(12.0, "notify_start", role="chord"), ev(12.084, "email", role="chord"), ev(12.09, "crash", role="chord", when="after_send"),
        *retries,
        ev(12.3, "notify_start", role="chord"), ev(12.31, "email_deduplicated", role="chord"),
        ev(12.32, "notify_end", role="chord", outcome="ok", sent=True),
        ev(12.45, "notify_start", role="duplicate"), ev(12.46, "notify_end", role="duplicate", outcome="ok", sent=False),
    ]
    ok = ["doc2", "doc3", "doc5", "doc28", *BURST]
    chord = summary_outcome(ok, [
        ("doc1", "error", "PermanentError: doc1 is malformed"), ("doc4", "dead_lettered", "dead-lettered by the broker"),
        ("doc6", "retries_exhausted", "RetriesExhausted: gave up after 4 attempts"),
        ("doc7", "soft_timeout", "SoftTimeLimitExceeded: SoftTimeLimitExceeded()"), ("doc8", "hard_timeout", HARD),
        ("doc9", "dead_lettered", "fetch_document dead-lettered by the broker"), ("doc10", "hard_timeout", HARD),
        ("doc11", "time_limit", LIMIT), ("doc29", "hard_timeout", UPSTREAM), ("doc30", "time_limit", LIMIT)])
    obs = _large(events, chord, "chord finished", 12.61, emails=("chord|pipeline: 20 ok, 10 failed",))
    return replace(obs, events=(*obs.events, *foreign_letters(parked=True)), sides=fixed_sides(), parked=FOREIGN)


def large_broken_run() -> Observations:
    """fm5's code on it: doc8 hangs and pins its slot; the run stops at 6.98 s, doc29's fetch hung, the burst never began."""
    events = [*_early(), *_hung_doc4_to_doc6(0.137),
              start(1.0, "doc7", 1), end(3.0, "doc7", 1), start(1.1, "doc8", 1),
              ev(0.19, "fetch_start", doc="doc9", attempt=1), ev(0.59, "fetch_start", doc="doc9", attempt=2),
              ev(1.24, "fetch_start", doc="doc9", attempt=3), ev(0.27, "fetch_start", doc="doc29", attempt=1)]
    return replace(_large(events, Outcome("PENDING", None, None, None), "doc8 outlived the hard deadline", 6.98), fm="fm5")


def large_weak_run() -> Observations:
    """fm6 without its hard variant's fix (fm6w): doc11's and doc28's members stored as FAILURE outside their bodies,
    doc29's fetch hung (a fetch_start, no fetch_end, no parse), the burst never began; a side chord that waits on its
    poison body, and one the runner never sent."""
    events = [*_early(), *_timeouts(), *_hung_doc4_to_doc6(0.137),
              start(9.0, "doc11", 1), start(11.5, "doc28", 1), ev(11.8, "store_stall", doc="doc28", seconds="1.0"),
              end(12.3, "doc28", 1), ev(0.47, "fetch_start", doc="doc29", attempt=1), start(12.2, "doc30", 1)]
    pending = Outcome("PENDING", None, None, None)
    members = {"doc11": Outcome("FAILURE", None, "TimeLimitExceeded", "TimeLimitExceeded(3,)"),
               "doc28": Outcome("FAILURE", None, "SoftTimeLimitExceeded", "SoftTimeLimitExceeded()")}
    body = side("body", ("doc32",), [start(0.02, "doc32", 1), end(0.021, "doc32", 1)], pending)
    behind = side("behind", ("doc33",), [], Outcome("NOT SENT", None, None, None), submitted=False)
    expired = side("expired", ("doc31",), [ev(-0.01, "revoked", doc="doc31", expired=True)], pending, heads={"doc31": "REVOKED"},
                   members={"doc31": Outcome("SUCCESS", Result[Any].failure(EXPIRED_ERROR, "expired", 0, 1), None, None)})
    sides = {"expired": expired, "body": body, "behind": behind}  # as a real run can end: all three unfinished
    obs = _large(events, pending, "doc11 and doc28 failed outside their bodies, doc29's fetch outlived its deadline", 12.47)
    return replace(obs, fm="fm6w", members=members, sides=sides)
