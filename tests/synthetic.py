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


# ---- scenarios 7 to 9: the side chords the runner acts on from outside (deploys, an outage, a cut, a consumer timeout) ----

RUN = "120000-abc123"


def _took(t: float, doc: str, pid: str, returned: int = 0) -> Event:
    """The observer's ``received``: worker ``pid`` (its main process) took ``doc``'s message (task id ``t-<doc>``)."""
    return ev(t, "received", task=f"t-{doc}", doc=doc, pid=pid, returned=returned)


def _ran(t0: float, t1: float | None, doc: str, n: int = 1, outcome: str = "ok", error: str = "") -> list[Event]:
    out = [ev(t0, "attempt_start", task=f"t-{doc}", doc=doc, attempt=n, pid=f"c{doc}")]
    if t1 is not None:
        out.append(ev(t1, "attempt_end", task=f"t-{doc}", doc=doc, attempt=n, outcome=outcome, **({"error": error} if error else {})))
    return out


def _sent(t: float) -> list[Event]:
    return [ev(t, "notify_start", role="chord"), ev(t + 0.002, "email", role="chord"),
            ev(t + 0.003, "notify_end", role="chord", outcome="ok", sent=True)]


DEPLOY_DOCS = tuple(f"doc{n}" for n in range(34, 42))


def deploy_side() -> SideRun:
    """Scenario 7's side: two deploys. The run's worker (pid 100) is SIGTERMed while doc36 runs and doc37 waits
    prefetched, and SIGKILLed at the grace's end (doc36 lost, run again on deploy1); deploy1 (pid 200) is SIGTERMed with
    nothing unstarted and exits by itself; deploy2 (pid 300) serves to the end."""
    cancelled = "SystemExit: the worker stopped the body (a shutdown, or its connection lost)"
    events = [
        _took(14.0, "doc34", "100"), *_ran(14.01, 14.81, "doc34"), _took(14.0, "doc35", "100"), *_ran(14.02, 14.82, "doc35"),
        ev(14.1, "deploy_start", n=1, new=f"fm7-deploy1-{RUN}"),
        _took(14.81, "doc36", "100"), *_ran(14.82, None, "doc36"), _took(14.83, "doc37", "100"),
        _took(15.0, "doc38", "200"), *_ran(15.01, 15.8, "doc38"),
        ev(15.05, "deploy_term", n=1, old=f"fm7-{RUN}", old_pid=100, new=f"fm7-deploy1-{RUN}", running="doc36", waiting="doc37:0"),
        ev(15.06, "deploy_start", n=2, new=f"fm7-deploy2-{RUN}"),
        ev(15.55, "deploy_kill", n=1, old=f"fm7-{RUN}", seconds="0.500", lost="doc36"),
        _took(15.81, "doc36", "200", 1), *_ran(15.82, 16.6, "doc36", 2), _took(15.83, "doc37", "200", 1),
        *_ran(15.84, 16.3, "doc37", 1, "cancelled", cancelled),
        _took(16.2, "doc39", "300"), *_ran(16.21, 17.0, "doc39"),
        ev(16.25, "deploy_term", n=2, old=f"fm7-deploy1-{RUN}", old_pid=200, new=f"fm7-deploy2-{RUN}", running="doc36,doc37",
           waiting=""),
        ev(16.7, "deploy_exit", n=2, old=f"fm7-deploy1-{RUN}", seconds="0.450"),
        _took(16.8, "doc37", "300", 1), *_ran(16.81, 17.6, "doc37", 2),
        *(e for i, d in enumerate(DEPLOY_DOCS[6:]) for e in (_took(17.0 + 0.01 * i, d, "300"), *_ran(17.01 + 0.01 * i, 17.8, d))),
        *_sent(18.0),
    ]
    return side("deploy", DEPLOY_DOCS, events, summary_outcome(list(DEPLOY_DOCS), []))


OUTAGE_DOCS = ("doc66", "doc67", "doc68", "doc69")
UNREACHABLE = "ConnectionError: Error 111 connecting to 127.0.0.1:16773. Connection refused."


def outage_side() -> SideRun:
    """Scenario 8's side: the backend stops while doc67 and doc68 run; their stores fail, their messages go back and
    run again once it answers; then it stops again while notify holds its claim."""
    events = [
        _took(19.0, "doc66", "100"), *_ran(19.01, 19.8, "doc66"),
        _took(19.81, "doc67", "100"), *_ran(19.82, 20.6, "doc67"), _took(19.81, "doc68", "100"), *_ran(19.83, 20.62, "doc68"),
        ev(20.0, "backend_down", phase="members"),
        ev(20.59, "store_failed", task="t-doc67", doc="doc67", stage="parse_document", error=UNREACHABLE),
        ev(20.61, "store_failed", task="t-doc68", doc="doc68", stage="parse_document", error=UNREACHABLE),
        ev(24.01, "backend_up", phase="members", seconds="4.01", since=repr(T0 + 24.0)),
        ev(24.1, "sent_back", task="t-doc67", doc="doc67", why="rejected with its outcome unstored"),
        ev(24.11, "sent_back", task="t-doc68", doc="doc68", why="rejected with its outcome unstored"),
        _took(24.2, "doc67", "100"), *_ran(24.21, 25.0, "doc67", 2), _took(24.2, "doc68", "100"), *_ran(24.22, 25.02, "doc68", 2),
        _took(25.03, "doc69", "100"), *_ran(25.04, 25.8, "doc69"),
        ev(25.9, "notify_start", role="chord"), ev(25.91, "gate_wait", role="chord"), ev(25.95, "backend_down", phase="notify"),
        ev(25.96, "email", role="chord"), ev(25.97, "notify_end", role="chord", outcome="retry"),
        ev(29.96, "backend_up", phase="notify", seconds="4.01", since=repr(T0 + 29.95)),
        ev(30.0, "notify_start", role="chord"), ev(30.01, "email_deduplicated", role="chord"),
        ev(30.02, "notify_end", role="chord", outcome="ok", sent=True),
    ]
    return side("outage", OUTAGE_DOCS, events, summary_outcome(list(OUTAGE_DOCS), []))


def connloss_side() -> SideRun:
    """Scenario 9's cut: the runner cuts the linked worker's connections while doc78 runs alone; the worker cancels it
    (fm9's fix) and its redelivery runs once."""
    events = [ev(31.0, "linked", node="rcl-broker", consumer_timeout="2.4", overlong="doc81"),
              _took(31.1, "doc79", "400"), *_ran(31.11, 31.15, "doc79"), _took(31.1, "doc80", "400"), *_ran(31.12, 31.16, "doc80"),
              _took(31.2, "doc78", "400"), *_ran(31.21, 31.4, "doc78", 1, "cancelled",
                                                  "SystemExit: the worker stopped the body (a shutdown, or its connection lost)"),
              ev(31.32, "link_cut", connections="4", running="doc78"),
              _took(31.45, "doc78", "400", 1), *_ran(31.46, 32.26, "doc78", 2), *_sent(32.4)]
    return side("connloss", ("doc78", "doc79", "doc80"), events, summary_outcome(["doc78", "doc79", "doc80"], []))


def overlong_side(fired: bool = False) -> SideRun:
    """Scenario 9's over-long member: doc81 hangs in C code; fm9's time_limit (1.2 s) kills it before the owned node's
    consumer timeout (2.4 s after its delivery); ``fired``: fm8's code, the broker closes the channel first, the message
    comes back and the linked worker exits."""
    events = [ev(32.5, "linked", node="rcl-broker", consumer_timeout="2.4", overlong="doc81"),
              _took(32.6, "doc81", "400"), *_ran(32.61, None, "doc81"), _took(32.6, "doc82", "400"), *_ran(32.62, 33.42, "doc82")]
    if fired:
        events += [_took(35.05, "doc81", "400", 1), ev(35.3, "worker_exit", code="1")]
        return side("overlong", ("doc81", "doc82"), events, Outcome("PENDING", None, None, None))
    events += _sent(33.9)
    return side("overlong", ("doc81", "doc82"), events, summary_outcome(["doc82"], [
        ("doc81", "time_limit", "TimeLimitExceeded: parse_document ran past its time_limit of 1.2s")]))


def lesson_run(n: int, *, broken: bool = False) -> Observations:
    """FM-n's run of scenario n (7, 8 or 9) as big as a real one: ``large_fixed_run``'s chord and side chords, then the
    sides the runner acts on from outside; ``broken``: scenario 9's on fm8's code (the consumer timeout fires)."""
    obs = large_fixed_run()
    sides = {**obs.sides, "deploy": deploy_side()}
    if n >= 8:
        sides["outage"] = outage_side()
    if n >= 9:
        sides["connloss"], sides["overlong"] = connloss_side(), overlong_side(fired=broken)
    return replace(obs, fm=f"fm{n}" if not broken else f"fm{n - 1}", scenario=n, sides=sides,
                   elapsed=max(e.t for s in sides.values() for e in s.events) - T0)
