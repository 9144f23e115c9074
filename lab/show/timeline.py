"""What happened to each document of one run, rebuilt from its ``Observations``.

``build(obs)`` turns the run's event stream into a ``Timeline``: per document
every attempt of ``parse_document`` (start and end in seconds since the chord was
submitted) and how it ended, the DLQ drain's finalisation, and the document's
final state; then every ``notify`` execution (roles ``chord`` and ``duplicate``)
and every email. The console (``lab.show.timeline_text``) and the HTML report
(``lab.show.swimlanes``) draw the same model, with the same ``MARKS``.

How an attempt ends (``Attempt.end``):

- ``ok``: the body returned;
- ``raised``: the body raised; ``reason`` is what ``@enveloped`` calls it
  (``error``, ``soft_timeout``, ``hard_timeout``, ``time_limit``) and ``error`` the exception;
- ``retried``: it raised and ``@transient_retryable`` planned a retry in ``retry_in`` s;
- ``killed``: no end was recorded, yet the run went on without it: a later attempt
  of the same document, the DLQ drain finalising it (or keeping its dead letter), or
  the chord finishing. The process died under it (a SIGKILL, an OOM kill, Celery's
  own ``time_limit``);
- ``running``: no end was recorded and nothing followed: still running when the
  run stopped (a pinned slot, or a kill the run did not live to see).

A document's final state (``DocTimeline.final``) comes from the chord's summary
when ``notify`` ran (it holds the envelope reason, e.g. ``retries_exhausted``);
otherwise from its events: ``kept`` (dead-lettered, and the drain kept the letter in
the DLQ instead of finalising it: the drain's hard variant, a poison chain head), ``revoked``
(its chain's head was revoked, or expired, before it ran, and nothing followed),
``killed`` (the process died and nothing redelivered the message), ``running`` (a fetch
that started and never ended, with no parse after it, is a hung chain head: ``hung``),
``retrying`` (a retry not yet served) or ``not started``. While the chord is unfinished,
a document whose chord member Celery stored as FAILURE (``Observations.members``: a
limit that landed outside the body, a time limits' hard variant) is ``member failure``, whatever
its events say: Celery's record is what holds the chord; and one whose member holds an
envelope (a revoked head's failure passed down its chain, say) ended as the envelope
says. A stall of the result store after the body returned (event ``store_stall``) is
kept as a ``Stall``.

Side chords (``Observations.sides``: a hard variant's own chord, pipeline
``<run_id>-<tag>``) are built the same way, on the run's time base, each as a
``SideTimeline``: what it is for, its chord's outcome and its body's fate in words
(dead-lettered, kept, sent), its documents and its body's deliveries.

A chord's body (``Timeline.body``: ``notify`` in every FM, ``reconcile`` or
``aggregate_batch`` in a case study, ``RunReport.body``) runs once per delivery
(``NotifyRun``); a delivery that started and was followed by another start of the same
role, with no end between, was killed; the chord's last delivery, with no end seen,
returned if the chord's result (its return value) is stored. Emails are the FMs' notion
(``Timeline.counts_emails``): a case study's body sends none.

One piece: one pass over a run's event stream builds every lane's story (documents, body, side chords,
workers), which the text and the HTML displays both draw.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

from shared.envelope import REASONS
import lessons
from lab.observe import Event
from lab.records import Observations, SideRun
from lab.scenarios import SideChord

End = Literal["ok", "raised", "retried", "killed", "running"]
UNSTORED = "its body ended ok; its result could not be stored"
"""A backend outage: the error of an attempt whose result store failed after its body (the observer's ``store_failed``)."""
Final = Literal["ok", "failed", "kept", "revoked", "member failure", "killed", "running", "retrying", "not started"]
NotifyEnd = Literal["sent", "skipped", "ended", "retried", "killed", "running"]


@dataclass(frozen=True)
class Mark:
    """How one kind of ending looks: a glyph for the terminal, a colour for both."""

    glyph: str
    colour: str
    label: str


MARKS: Mapping[str, Mark] = {
    "ok": Mark("✓", "#2e7d32", "ok: the attempt returned"),
    "error": Mark("✗", "#d32f2f", "error: raised (reason error)"),
    "retries_exhausted": Mark("⊗", "#ef6c00", "retries_exhausted: the last retry failed too"),
    "soft_timeout": Mark("◔", "#c79100", "soft_timeout: the soft deadline asked, the body gave up"),
    "hard_timeout": Mark("◆", "#ad1457", "hard_timeout: @hard_timeout raised inside the body"),
    "time_limit": Mark("■", "#4e342e", "time_limit: Celery's time_limit killed the process; the backstop recorded it"),
    "dead_lettered": Mark("⊘", "#6a1b9a", "dead_lettered: the broker gave up, the drain finalised it"),
    "expired": Mark("⌛", "#5d4037", "expired: the chain's head expired before it ran"),
    "revoked": Mark("⊖", "#455a64", "revoked: the chain's head was revoked before it ran"),
    "kept": Mark("⊡", "#ab47bc", "kept: dead-lettered, the drain kept the letter in the DLQ (nothing finalised it)"),
    "killed": Mark("†", "#212121", "killed: the process died mid-attempt"),
    "retried": Mark("↻", "#1565c0", "retried: a retry was planned after a delay"),
    "member_failure": Mark("☒", "#b71c1c", "member FAILURE: Celery stored it outside the body; the chord can only break"),
    "store_stall": Mark("∥", "#9e9d24", "store stalled: the result store stalled after the body returned"),
    "running": Mark("…", "#757575", "running: no end when the run stopped"),
    "email": Mark("✉", "#00838f", "email sent"),
    "deduplicated": Mark("⊜", "#4db6ac", "deduplicated: the mail API dropped a repeat (same idempotency key)"),
    # What the runner does to the run from outside (its injectors), drawn on the lanes it hits
    "delivered": Mark("↓", "#78909c", "delivered: the broker handed the message to a worker (again: a return counts)"),
    "worker_up": Mark("▲", "#43a047", "worker up: a new worker took its first message (deploy)"),
    "sigterm": Mark("⏻", "#f57c00", "SIGTERM: the deploy told the old worker to stop"),
    "sigkill": Mark("☠", "#000000", "SIGKILL: the grace ended, the old worker's processes killed"),
    "worker_exit": Mark("⏏", "#6d4c41", "worker exited: it ended by itself (after a SIGTERM, or on a closed channel)"),
    "backend_down": Mark("▒", "#fbc02d", "backend down: the result backend stopped, the band until it answered again"),
    "link_cut": Mark("✂", "#e64a19", "connection cut: the worker's broker connections dropped (the line across the lanes)"),
    "consumer_timeout": Mark("⌚", "#7b1fa2", "consumer_timeout: the broker's deadline for an unacked delivery"),
}
"""Every mark, keyed by an envelope reason (``shared.envelope.REASONS``) or an ending."""


@dataclass(frozen=True)
class Attempt:
    n: int
    start: float  # seconds since submission
    end: float | None  # None: no end recorded (killed or running)
    how: End
    reason: str | None = None  # for ``raised``: error, soft_timeout, hard_timeout
    error: str = ""
    retry_in: float | None = None  # for ``retried``: the planned delay in seconds
    stage: str = "parse"  # "fetch": a fetch that never led to a parse (a poison chain head)

    @property
    def mark(self) -> str:
        return (self.reason or "error") if self.how == "raised" else self.how


@dataclass(frozen=True)
class Stall:
    """The result store stalled after the body returned (event ``store_stall``), from ``start`` for ``seconds``;
    ``until``: when it ended as seen (the attempt's end cuts it short: a limit that fired in it, the run's end)."""

    start: float
    seconds: float
    until: float

    @property
    def cut(self) -> bool:
        return self.until < self.start + self.seconds - 0.005


@dataclass(frozen=True)
class DocTimeline:
    doc: str
    attempts: tuple[Attempt, ...]
    dead_lettered_at: float | None
    final: Final
    reason: str | None = None  # the envelope reason when ``final`` is failed
    error: str = ""
    kept_at: float | None = None  # when the DLQ drain kept its dead letter instead of finalising it
    kept_why: str = ""
    revoked_at: float | None = None  # when the worker discarded its chain's head, revoked or expired, before it ran
    expired: bool = False  # that head had expired (not revoked)
    member_error: str = ""  # for ``member failure``: the exception Celery stored for the chord member
    stalls: tuple[Stall, ...] = ()
    delivered: tuple[float, ...] = ()  # when a worker received its parse message (the observer's ``received``)

    @property
    def mark(self) -> str:
        if self.final == "failed":
            return self.reason or "error"
        if self.final == "kept":
            return "kept"
        if self.final == "revoked":
            return "expired" if self.expired else "revoked"
        if self.final == "member failure":
            return "member_failure"
        return {"retrying": "retried", "not started": "running"}.get(self.final, self.final)

    @property
    def unstored(self) -> bool:
        """A backend outage: its last attempt's body ended ok and its result could not be stored."""
        return bool(self.attempts) and self.attempts[-1].error.startswith(UNSTORED)

    @property
    def hung(self) -> bool:
        """Its chain's head, a fetch, started once and never ended, and no parse began: a hung (or killed) head
        (a fetch killed before, then running again, is a poison head redelivered: not hung)."""
        return self.final == "running" and len(self.attempts) == 1 and self.attempts[0].stage == "fetch"

    @property
    def member_words(self) -> str:
        return f"member FAILURE: {self.member_error or 'an error'}, stored by Celery outside the body"


@dataclass(frozen=True)
class NotifyRun:
    role: str  # chord or duplicate
    start: float
    end: float | None
    how: NotifyEnd
    gate_wait: float | None = None  # when it began waiting at the runner's gate
    retry_in: float | None = None  # for ``retried``: the planned delay (a busy claim)
    crash: str | None = None  # for ``killed`` by the scenario: before_send or after_send (None: it just died)
    outcome: str = ""  # for ``ended``: ok, or the envelope's reason
    deduplicated_at: float | None = None  # the mail API dropped this delivery's email (a repeat key)
    returned: bool = False  # ended: known from the chord's stored result, its own end event not seen


@dataclass(frozen=True)
class Email:
    t: float
    role: str


@dataclass(frozen=True)
class Timeline:
    fm: str  # the FM whose code ran
    run_id: str
    scenario: int
    docs: tuple[DocTimeline, ...]
    notifies: tuple[NotifyRun, ...]
    emails: tuple[Email, ...]
    span: float  # seconds from submission to the last thing seen
    stopped_by: str
    chord: str  # the chord result in a few words
    body: str = "notify"  # the chord body's task name (a case study's ``reconcile``, ``aggregate_batch``)
    sides: tuple[SideTimeline, ...] = ()  # the run's side chords (hard variants with a chord of their own)

    @property
    def has_chord(self) -> bool:
        """Whether the run had documents in a chord to follow (case study 3's per-event tasks have none)."""
        return bool(self.docs)

    @property
    def counts_emails(self) -> bool:
        """Emails are the FMs' notion: their ``notify`` sends one; a case study's body sends none."""
        return self.body == "notify"


@dataclass(frozen=True)
class Injected:
    """What the runner did to a side chord from outside at ``t`` (until ``until``: a band), as its events say:
    ``backend_down`` (a result backend outage, ``lab.outage``: events ``backend_down``, ``backend_up``), ``link_cut``
    and ``worker_exit`` (a connection cut and the linked worker's exit, ``lab.connloss``: events ``link_cut``,
    ``worker_exit``), ``consumer_timeout`` (the owned node's deadline for the over-long member, from its first
    delivery; ``fired``: its message came back while its body ran, the broker closed the channel)."""

    kind: str  # a key of MARKS
    t: float
    until: float | None = None
    doc: str = ""  # the document whose lane it hits ("": every lane of the side's block)
    words: str = ""
    fired: bool = True


@dataclass(frozen=True)
class Slotted:
    """One attempt on a worker's lane: its document, the attempt, the pool slot it ran in and when it stopped there."""

    doc: str
    attempt: Attempt
    slot: int
    until: float


@dataclass(frozen=True)
class WorkerLife:
    """One worker of a rolling deploy (``lab.deploys``: events ``deploy_start``, ``deploy_term``,
    ``deploy_exit``, ``deploy_kill``; the observer's ``received`` says which worker took a message)."""

    name: str  # ``worker`` (the run's own), ``deploy1`` ...
    pid: str  # its main process
    started: float | None  # its deploy started it (None: the run's worker, there before the side)
    up: float | None  # it took its first message
    term: float | None = None  # SIGTERM
    gone: float | None = None  # it exited, or was SIGKILLed at the grace's end
    how: str = ""  # killed, exited, "" (still serving)
    running: tuple[str, ...] = ()  # at its SIGTERM: the bodies it ran
    waiting: tuple[str, ...] = ()  # ... and the messages it held unstarted (prefetched)
    lost: tuple[str, ...] = ()  # at its SIGKILL: the bodies still running in a live pool process
    attempts: tuple[Slotted, ...] = ()


BodyFate = Literal["sent", "ended", "dead_lettered", "kept", "running", "never ran", "not sent"]


class Fact(NamedTuple):
    """One thing a side chord's heading says, with the key of its mark in ``MARKS`` (None: no mark)."""

    text: str
    mark: str | None = None


@dataclass(frozen=True)
class SideTimeline:
    """One side chord of a run: what it is for, how its chord and its body ended, and its own timeline
    (documents and the body's deliveries, in seconds since the run's main chord was submitted)."""

    tag: str
    purpose: str  # what the side chord is for, in a few words ("a poison notify")
    run_id: str  # its pipeline, ``<run_id>-<tag>``
    state: str  # its chord's Celery state (SUCCESS, PENDING ...), NOT SENT when the runner never sent it
    head: str  # its chord's outcome in a few words ("chord SUCCESS (envelope FAILURE dead_lettered)")
    facts: tuple[Fact, ...]  # its body's fate, its letters', its documents', its claim's, in words
    body: BodyFate
    timeline: Timeline
    deliveries: int = 0  # deliveries of its body that started
    body_at: float | None = None  # when the body's fate was seen (dead-lettered, first kept)
    start: float = 0.0  # its first event, in seconds since the main chord was submitted
    end: float = 0.0  # its last event
    injected: tuple[Injected, ...] = ()  # what the runner did to it from outside (outages, cuts)
    workers: tuple[WorkerLife, ...] = ()  # rolling deploys: the workers they started and stopped, in order
    scenario: int = 0  # the first scenario that has it (``lessons.first_scenario``; 0: not a side the lab knows)

    @property
    def hit(self) -> bool:
        """Whether the runner acted on it from outside (deploys, an outage, a cut, a consumer timeout)."""
        return bool(self.injected or self.workers)

    @property
    def joint(self) -> str:
        """What joins the head to the facts: a colon where the facts say why (the body's fate), else a semicolon."""
        return ": " if self.body in ("dead_lettered", "kept", "not sent") else "; "

    @property
    def outcome(self) -> str:
        """The heading's words: ``chord SUCCESS (envelope FAILURE dead_lettered): body dead-lettered after ...``."""
        return self.head + (self.joint + "; ".join(f.text for f in self.facts) if self.facts else "")

    @property
    def mark(self) -> str:
        """The mark of how the side chord ended: its body's fate when that is what it is about."""
        if self.body in ("dead_lettered", "kept"):
            return self.body
        if self.state == "SUCCESS":
            return "ok"
        return "running"


def build(obs: Observations, body: str = "notify") -> Timeline:
    events = sorted(obs.events, key=lambda e: e.t)
    at = obs.submitted_at
    last = max((e.t - at for e in [*events, *(e for s in obs.sides.values() for e in s.events)]), default=0.0)
    span = max(obs.elapsed, last)
    tl = _chord(obs, events, span, body)
    exits = _exits(obs)
    return replace(tl, sides=tuple(_side(obs, side, span, body, exits.get(side.tag, [])) for side in obs.sides.values()))


def _exits(obs: Observations) -> dict[str, list[Event]]:
    """A linked worker (a broker node of the lab's own) serves two sides one after the other; the runner records its exit (``worker_exit``)
    in whichever side it looked at first: each exit goes to the linked side that was last sent before it."""
    starts = {tag: min((e.t for e in s.events), default=float("inf")) for tag, s in obs.sides.items()
              if any(e.kind == "linked" for e in s.events)}
    out: dict[str, list[Event]] = {}
    for e in (e for s in obs.sides.values() for e in s.events if e.kind == "worker_exit"):
        tag = max((t for t in starts if starts[t] <= e.t), key=lambda t: starts[t], default=None)
        if tag is not None:
            out.setdefault(tag, []).append(e)
    return out


def _chord(obs: Observations, events: list[Event], span: float, body: str) -> Timeline:
    at = obs.submitted_at
    chord_over = obs.chord.state in ("SUCCESS", "FAILURE")
    by_doc: dict[str, list[Event]] = {}  # one pass over the events, not one per document
    for e in events:
        by_doc.setdefault(e.get("doc"), []).append(e)
    docs = tuple(_doc(obs, doc, by_doc.get(doc, []), at, chord_over, span) for doc in obs.docs)
    notifies = _returned(_notifies(events, at), obs)
    emails = tuple(Email(e.t - at, e.get("role")) for e in events if e.kind == "email")
    return Timeline(obs.fm, obs.run_id, obs.scenario, docs, notifies, emails, span, obs.stopped_by, _chord_words(obs), body)


def _doc(obs: Observations, doc: str, events: list[Event], at: float, chord_over: bool, span: float) -> DocTimeline:
    starts = [e for e in events if e.kind == "attempt_start"]
    ends = {e.get("attempt"): e for e in events if e.kind == "attempt_end"}
    retries = {e.get("retry"): e for e in events if e.kind == "retry"}
    dead = next((e.t - at for e in events if e.kind == "dead_lettered"), None)
    kept = next((e for e in events if e.kind == "dead_letter_kept"), None)
    revoked = next((e for e in events if e.kind == "revoked"), None)
    member = obs.members.get(doc)
    # Celery stored FAILURE for the member while the chord waits: a limit that landed outside the body (a time limits' hard variant)
    member_failed = not chord_over and member is not None and member.state == "FAILURE"
    settled = dead is not None or kept is not None or chord_over or member_failed  # the run went on past its last attempt
    attempts: list[Attempt] = []
    unstored = [e for e in events if e.kind == "store_failed" and e.get("stage") == "parse_document"]  # a backend outage
    for i, start in enumerate(starts):
        n = int(start.get("attempt") or i + 1)
        end = ends.get(str(n))
        attempt = _attempt(n, start.t - at, end, retries.get(str(n)), at, i + 1 < len(starts) or settled)
        # reported after its start (before its end with the outage's fix, after it without) and before the next start
        lost = next((e for e in unstored if e.get("task") == start.get("task") and end is not None and e.t >= start.t
                     and (i + 1 == len(starts) or e.t <= starts[i + 1].t)), None)
        if lost is not None and attempt.how == "ok":  # its body ended ok; the result store after it failed
            attempt = Attempt(n, attempt.start, attempt.end, "raised", "error", f"{UNSTORED} ({lost.get('error')})")
        attempts.append(attempt)
    if not starts:  # no parse ever began: show the fetches, the chain's head (they died, or are running)
        fetches = [e for e in events if e.kind == "fetch_start"]
        for i, f in enumerate(fetches):
            followed = i + 1 < len(fetches) or settled
            attempts.append(Attempt(i + 1, f.t - at, None, "killed" if followed else "running", stage="fetch"))
        hung = bool(attempts) and attempts[-1].how == "running" and not any(
            e.kind == "fetch_end" and e.t >= fetches[-1].t for e in events)  # started, never ended: a hung (or killed) head
        attempts = attempts if len(fetches) > 1 or dead is not None or kept is not None or hung else []
    final, reason, error = _final(obs, doc, attempts, dead)
    if kept is not None and dead is None and final != "ok":
        final, reason, error = "kept", None, ""
    if revoked is not None and not attempts and final == "not started":
        final = "revoked"  # nothing after its head: the chord waits for a member that will never run
    stored = member.envelope if member is not None and member.state == "SUCCESS" else None
    if stored is not None and obs.summary() is None and final in ("not started", "revoked", "running", "killed"):
        # the chord waits for its body, yet Celery holds this member's envelope: that is how the document ended
        final, reason, error = ("ok", None, "") if stored.ok else ("failed", stored.reason or "error", stored.error or "")
    if member_failed and final != "failed":
        final, reason, error = "member failure", None, ""
    if final == "failed" and attempts and attempts[-1].error.startswith(UNSTORED):
        final, reason, error = "killed", None, ""  # an outage unfixed: acked with no outcome stored, the work lost
    return DocTimeline(doc, tuple(attempts), dead, final, reason, error,
                       None if kept is None else kept.t - at, kept.get("why") if kept is not None else "",
                       None if revoked is None else revoked.t - at, revoked is not None and revoked.get("expired") == "True",
                       (member.error_type or "") if member_failed and member is not None else "",
                       _stalls(events, attempts, at, span), tuple(e.t - at for e in events if e.kind == "received"))


def _stalls(events: list[Event], attempts: list[Attempt], at: float, span: float) -> tuple[Stall, ...]:
    """Each ``store_stall``, cut at the end of the attempt it happened in (a limit fired in it) or the run's end."""
    out: list[Stall] = []
    for e in events:
        if e.kind != "store_stall":
            continue
        start, seconds = e.t - at, float(e.get("seconds") or 0.0)
        ends = [a.end for a in attempts if a.start <= start and a.end is not None and a.end >= start]
        out.append(Stall(start, seconds, min([start + seconds, span, *ends])))
    return tuple(out)


def _attempt(n: int, start: float, end: Event | None, retry: Event | None, at: float, followed: bool) -> Attempt:
    if end is None:
        return Attempt(n, start, None, "killed" if followed else "running")
    outcome, t = end.get("outcome"), end.t - at
    if outcome == "ok":
        return Attempt(n, start, t, "ok")
    reason = outcome if outcome in REASONS else "error"
    if retry is not None:
        return Attempt(n, start, t, "retried", reason, end.get("error"), float(retry.get("delay") or 0.0))
    return Attempt(n, start, t, "raised", reason, end.get("error"))


def _final(obs: Observations, doc: str, attempts: list[Attempt], dead: float | None) -> tuple[Final, str | None, str]:
    summary = obs.summary()
    if summary is not None:
        failed = obs.failed(doc)
        if failed is not None:
            return "failed", str(failed.get("reason") or "error"), str(failed.get("error") or "")
        if obs.is_ok(doc):
            return "ok", None, ""
    if dead is not None:
        return "failed", "dead_lettered", "dead-lettered by the broker"
    if not attempts:
        return "not started", None, ""
    last = attempts[-1]
    if last.how == "ok":
        return "ok", None, ""
    if last.how == "retried":
        return "retrying", None, ""  # its retry was not due (or not served) before the run stopped
    if last.how == "raised":
        return "failed", last.reason or "error", last.error
    return last.how, None, ""


def _notifies(events: list[Event], at: float) -> tuple[NotifyRun, ...]:
    done: list[NotifyRun] = []
    open_runs: dict[str, NotifyRun] = {}
    for e in events:
        role = e.get("role")
        current = open_runs.get(role)
        if e.kind == "notify_start":
            if current is not None:  # a new start before an end: the earlier delivery died (no end recorded)
                done.append(replace(current, how="killed"))
            open_runs[role] = NotifyRun(role, e.t - at, None, "running")
        elif current is None:
            continue
        elif e.kind == "notify_retry":
            done.append(replace(current, end=e.t - at, how="retried", retry_in=float(e.get("delay") or 0.0)))
            del open_runs[role]
        elif e.kind == "gate_wait":
            open_runs[role] = replace(current, gate_wait=e.t - at)
        elif e.kind == "email_deduplicated":
            open_runs[role] = replace(current, deduplicated_at=e.t - at)
        elif e.kind == "crash":  # the scenario killed it (the claim's hard variant); the email may be out
            done.append(replace(current, end=e.t - at, how="killed", crash=e.get("when")))
            del open_runs[role]
        elif e.kind == "notify_end":
            sent = e.get("sent")  # a body with no "sent" (a case study's reconcile) just ended
            how: NotifyEnd = "sent" if sent == "True" else "skipped" if sent == "False" else "ended"
            done.append(replace(current, end=e.t - at, how=how, outcome=e.get("outcome")))
            del open_runs[role]
    done.extend(replace(r, end=None) for r in open_runs.values())
    return tuple(sorted(done, key=lambda r: r.start))


def _returned(runs: tuple[NotifyRun, ...], obs: Observations) -> tuple[NotifyRun, ...]:
    """The chord's last delivery of its body, with no end seen, returned when the chord's result is stored:
    that result is the body's return value (its end event came after the run's last look)."""
    chord = [i for i, n in enumerate(runs) if n.role == "chord"]
    if not chord or obs.chord.state != "SUCCESS" or runs[chord[-1]].how != "running":
        return runs
    env = obs.chord.envelope
    outcome = "ok" if env is None or env.ok else str(env.reason or "error")
    return tuple(replace(n, how="ended", outcome=outcome, returned=True) if i == chord[-1] else n for i, n in enumerate(runs))


def _side(obs: Observations, run: SideRun, span: float, body: str, exits: list[Event] | None = None) -> SideTimeline:
    """A side chord, built as a chord of its own on the run's time base (``exits``: the linked worker's exits that
    belong to it, ``_exits``)."""
    side_obs = replace(obs, run_id=run.run_id, docs=run.docs, attempts=run.attempts, fetch_attempts=run.fetch_attempts,
                       events=run.events, emails=run.emails, chord=run.chord, duplicate=None, members=run.members, sides={},
                       stopped_by=obs.stopped_by)
    own: list[Event] = [e for e in run.events if e.kind != "worker_exit"] if exits is not None else list(run.events)
    mine: list[Event] = [*own, *(exits or [])]
    events = sorted(mine, key=lambda e: e.t)
    tl = _chord(side_obs, events, span, body)
    at = obs.submitted_at
    deliveries = sum(1 for n in tl.notifies if n.role == "chord")
    dead = next((e.t - at for e in events if e.kind == "dead_lettered" and not e.get("doc")), None)
    # a body's letter kept while the backend was gone and sent back on its return was not kept for good (an outage)
    resent = any(e.kind == "sent_back" and not e.get("doc") for e in events)
    kept = [] if resent else [e for e in events if e.kind == "dead_letter_kept" and not e.get("doc")]
    fate: BodyFate
    if not run.submitted:
        fate, seen = "not sent", None
    elif dead is not None:
        fate, seen = "dead_lettered", dead
    elif kept:
        fate, seen = "kept", kept[0].t - at
    elif not tl.notifies:
        fate, seen = "never ran", None
    else:
        last = [n for n in tl.notifies if n.role == "chord"][-1:]
        fate = "sent" if last and last[0].how == "sent" else "ended" if last and last[0].how in ("ended", "skipped") else "running"
        seen = None
    purpose = _purpose(_spec(run.tag), obs)
    workers = _workers(events, at, tl, obs.run_id)
    head, facts = _side_words(obs, run, tl, fate, deliveries, kept, workers, events)
    first = min((e.t - at for e in events), default=span)
    last = max((e.t - at for e in events), default=span)
    return SideTimeline(run.tag, purpose, run.run_id, run.chord.state, head, facts, fate, tl, deliveries, seen,
                        first, last if run.chord.state in ("SUCCESS", "FAILURE") else max(last, span),
                        _injected(events, at, tl, span), workers, lessons.first_scenario(run.tag))


def _injected(events: list[Event], at: float, tl: Timeline, span: float) -> tuple[Injected, ...]:
    """What the runner did to a side from outside, read off its events (see ``Injected``)."""
    out: list[Injected] = []
    downs = [e for e in events if e.kind == "backend_down"]
    ups = [e for e in events if e.kind == "backend_up"]
    for i, down in enumerate(downs):
        up = ups[i] if i < len(ups) else None
        until = span if up is None else _since(up, at)
        while_ = "members stored" if down.get("phase") == "members" else "notify held its claim"
        held = f"{up.get('seconds')} s" if up is not None else "until the run stopped"
        out.append(Injected("backend_down", down.t - at, max(until, down.t - at),
                            words=f"result backend down {held} while {while_}"))
    for cut in (e for e in events if e.kind == "link_cut"):
        out.append(Injected("link_cut", cut.t - at, doc=cut.get("doc") or cut.get("running"),
                            words=f"the worker's broker connections cut ({cut.get('connections')}) while "
                                  f"{cut.get('running')} ran"))
    for gone in (e for e in events if e.kind == "worker_exit"):
        out.append(Injected("worker_exit", gone.t - at, words=f"the linked worker exited (status {gone.get('code')})"))
    # a side served by a broker node of the lab's own: its event ``linked`` names the node's consumer_timeout and the
    # member that meets it (``overlong``)
    linked = next((e for e in events if e.kind == "linked"), None)
    overlong = str(linked.get("overlong") or "") if linked is not None else ""
    hung = [e for e in events if e.kind == "received" and overlong and e.get("doc") == overlong]
    if linked is not None and linked.get("consumer_timeout") and hung and any(d.doc == overlong for d in tl.docs):
        seconds = float(linked.get("consumer_timeout") or 0)
        deadline = hung[0].t - at + seconds
        back = hung[1].t - at if len(hung) > 1 else None
        gone = next((e.t - at for e in events if e.kind == "worker_exit" and e.t - at >= deadline), None)
        after = f"consumer_timeout ({seconds:g} s after its delivery)"
        words = (f"{after}: the broker closed the channel, its message back at {back:.2f}s while its body ran"
                 if back is not None else f"{after}: the broker closed the channel, the worker exited (seen at {gone:.2f}s)"
                 if gone is not None else f"{after} not reached: nothing came back")
        out.append(Injected("consumer_timeout", deadline, back if back is not None else gone, overlong, words,
                            fired=back is not None or gone is not None))
    return tuple(sorted(out, key=lambda i: i.t))


def _since(up: Event, at: float) -> float:
    """When the backend answered again: ``since`` (the server started, a waiting task may have used it), else the event."""
    try:
        return float(up.get("since") or up.t) - at
    except ValueError:
        return up.t - at


def _workers(events: list[Event], at: float, tl: Timeline, run_id: str) -> tuple[WorkerLife, ...]:
    """A rolling deploy's workers, in the order they served, each with the attempts it ran in its pool's slots."""
    starts = [e for e in events if e.kind == "deploy_start"]
    if not starts:
        return ()
    terms = {e.get("n"): e for e in events if e.kind == "deploy_term"}
    ends = {e.get("n"): e for e in events if e.kind in ("deploy_exit", "deploy_kill")}
    received = [e for e in events if e.kind == "received"]
    first = terms.get("1")
    names = [first.get("old") if first is not None else "", *(e.get("new") for e in starts)]
    pids = {e.get("old"): e.get("old_pid") for e in terms.values()}
    for start in starts:  # a worker never told to stop: the one that took messages no other worker holds
        if start.get("new") not in pids:
            known = set(pids.values())
            pids[start.get("new")] = next((r.get("pid") for r in received if r.t >= start.t and r.get("pid") not in known), "")
    holder: dict[tuple[str, str], str] = {}  # (doc, attempt) -> the main pid of the worker that ran it
    for e in events:
        if e.kind == "attempt_start":
            took = [r for r in received if r.get("task") == e.get("task") and r.t <= e.t]
            if took:
                holder[(e.get("doc"), e.get("attempt"))] = took[-1].get("pid")
    docs = {d.doc: d for d in tl.docs}
    out: list[WorkerLife] = []
    for i, name in enumerate(names):
        pid = pids.get(name, "")
        term = next((e for e in terms.values() if e.get("old") == name), None)
        end = ends.get(term.get("n")) if term is not None else None
        gone = end.t - at if end is not None else None
        mine = sorted(((doc, a) for (doc, n), p in holder.items() if p == pid and doc in docs
                       for a in docs[doc].attempts if str(a.n) == n), key=lambda x: x[1].start)
        slots: list[float] = []
        placed: list[Slotted] = []
        for doc, a in mine:
            until = a.end if a.end is not None else _next_start(docs[doc], a, gone if gone is not None else tl.span)
            slot = next((k for k, free in enumerate(slots) if free <= a.start + 1e-6), len(slots))
            if slot == len(slots):
                slots.append(until)
            else:
                slots[slot] = until
            placed.append(Slotted(doc, a, slot, until))
        up = next((r.t - at for r in received if r.get("pid") == pid), None) if pid else None
        out.append(WorkerLife(
            name=_worker_name(name, run_id), pid=pid, started=starts[i - 1].t - at if i else None, up=up,
            term=term.t - at if term is not None else None, gone=gone,
            how="" if end is None else "killed" if end.kind == "deploy_kill" else "exited",
            running=_listed(term.get("running")) if term is not None else (),
            waiting=_listed(term.get("waiting")) if term is not None else (),
            lost=_listed(end.get("lost")) if end is not None else (), attempts=tuple(placed)))
    return tuple(out)


def _next_start(d: DocTimeline, a: Attempt, fallback: float) -> float:
    """Where an attempt with no end stops on its worker's lane: the document's next attempt, else ``fallback``."""
    later = [b.start for b in d.attempts if b.start > a.start]
    return min([*later, fallback]) if later else fallback


def _listed(value: str) -> tuple[str, ...]:
    return tuple(v for v in value.split(",") if v)


def _worker_name(name: str, run_id: str) -> str:
    """``<label>-deploy1-<run id>`` -> ``deploy1``; the run's own worker (``<label>-<run id>``) -> ``worker``."""
    part = name.removesuffix(f"-{run_id}")
    return part.split("-", 1)[1] if "-" in part else "worker"


FOREIGN = "{foreign}"
"""In a side chord's purpose: the number of letters no drain can place put in the DLQ before it."""


def _spec(tag: str) -> SideChord | None:
    """The side chord ``tag`` of the scenarios (the last scenario has them all)."""
    return lessons.scenario(len(lessons.FMS)).side(tag)


def _purpose(side: SideChord | None, obs: Observations) -> str:
    if side is None or not side.purpose:
        return ""
    count = _foreign(obs)
    return side.purpose.replace(f"{FOREIGN} ", f"{count} " if count is not None else "")


def _foreign(obs: Observations) -> int | None:
    """How many letters no drain can place the runner put in the DLQ (its event ``foreign_letters``)."""
    found = next((e for e in obs.events if e.kind == "foreign_letters"), None)
    return int(found.get("count") or 0) if found is not None else None


def _has_claim(fm: str) -> bool:
    """Whether program ``fm``'s ``notify`` holds a claim (the registry knows which lesson adds it)."""
    return lessons.holds_claim(fm)


def _side_words(obs: Observations, run: SideRun, tl: Timeline, fate: BodyFate, deliveries: int,
                kept: list[Event], workers: tuple[WorkerLife, ...] = (),
                events: list[Event] | None = None) -> tuple[str, tuple[Fact, ...]]:
    """(``chord SUCCESS (envelope FAILURE dead_lettered)``, its facts: ``body dead-lettered after 3 deliveries``, ...)."""
    if not run.submitted:
        return "not sent", (Fact("the run stopped before the runner sent it"),)
    env = run.chord.envelope
    head = f"chord {run.chord.state}" + (f" {run.chord.error_type}" if run.chord.error_type else "")
    if env is not None and not env.ok:
        head += f" (envelope {env.status} {env.reason or ''})".replace(" )", ")")
    facts: list[Fact] = []
    after = f"after {deliveries} deliver{'y' if deliveries == 1 else 'ies'}"
    if fate == "dead_lettered":
        facts.append(Fact(f"body dead-lettered {after}, finalised by the drain", "dead_lettered"))
    elif fate == "kept":
        passes = f", {len(kept)} passes" if len(kept) > 1 else ""
        facts.append(Fact(f"body dead-lettered {after}, kept in the DLQ in silence ({kept[0].get('why') or 'kept'}{passes})",
                          "kept"))
    if (spec := _spec(run.tag)) is not None and FOREIGN in spec.purpose:  # sent behind letters no drain can place
        facts.append(_letters_words(obs))
    if stopped := [w for w in workers if w.term is not None]:  # the runner's rolling deploys
        killed = [w for w in stopped if w.how == "killed"]
        lost = sorted({d for w in stopped for d in w.lost})
        facts.append(Fact(f"{len(stopped)} deploy{'s' if len(stopped) > 1 else ''}: SIGTERM, "
                          + (f"SIGKILL at the grace's end ({len(killed)}x)" if killed else "the old worker exited")
                          + (f", work lost: {', '.join(lost)}" if lost else ""), "sigterm"))
    for up in (e for e in run.events if e.kind == "backend_up"):  # the runner's outages of the result backend
        while_ = "members stored" if up.get("phase") == "members" else "notify held its claim"
        facts.append(Fact(f"result backend stopped while {while_}, back after {up.get('seconds')}s", "backend_down"))
    if stores := sum(1 for e in run.events if e.kind == "store_failed"):
        facts.append(Fact(f"{stores} result store{'s' if stores > 1 else ''} failed outside the body", "error"))
    for cut in (e for e in run.events if e.kind == "link_cut"):  # the runner cut the linked worker's connections
        facts.append(Fact(f"the worker's broker connections cut ({cut.get('connections')}) while {cut.get('running')} "
                          "ran", "link_cut"))
    for gone in (e for e in (run.events if events is None else events) if e.kind == "worker_exit"):  # the linked worker ended
        facts.append(Fact(f"its worker exited (status {gone.get('code')})", "worker_exit"))
    facts += _grouped([(d.doc, _side_doc_words(d, run)) for d in tl.docs if d.final != "ok"])  # an ok one says nothing new
    if fate == "sent":
        facts.append(Fact("email sent", "email"))
    elif fate == "ended":
        facts.append(Fact(f"{tl.body} ended", "ok"))
    elif fate in ("never ran", "running") and all(d.final in ("ok", "failed") for d in tl.docs):
        # every member ended: the chord waits for its body (a document still out says what holds it instead)
        facts.append(Fact(f"{tl.body} {'never ran' if fate == 'never ran' else 'still running'}", "running"))
    if _has_claim(obs.fm) and fate in ("dead_lettered", "kept"):
        facts.append(Fact("claim released" if run.claim is None else f"claim left {run.claim.split(':', 1)[0]}"))
    return head, tuple(facts)


def _grouped(found: list[tuple[str, Fact]]) -> list[Fact]:
    """Documents that tell the same (``doc68 never finalised by the drain``, ``doc69 ...``) as one fact, in the order
    of the first: ``doc68–doc73 never finalised by the drain``; a fact of its own stays as it is."""
    same: dict[tuple[str, str | None], list[str]] = {}
    for doc, fact in found:
        same.setdefault((fact.text.removeprefix(doc), fact.mark), []).append(doc)
    return [Fact(_doc_list(docs) + rest, mark) if len(docs) > 1 else Fact(docs[0] + rest, mark)
            for (rest, mark), docs in same.items()]


def _doc_list(docs: list[str]) -> str:
    """``doc68–doc73, doc75``: runs of three or more consecutive numbers as a range, the rest one by one."""
    numbered = [(int(m.group(2)), m.group(1)) for d in docs if (m := re.fullmatch(r"(\D+)(\d+)", d))]
    if len(numbered) != len(docs) or len({p for _, p in numbered}) != 1:
        return ", ".join(docs)
    prefix, runs = numbered[0][1], [[numbered[0][0]]]
    for n, _ in numbered[1:]:
        if n == runs[-1][-1] + 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    return ", ".join(f"{prefix}{r[0]}–{prefix}{r[-1]}" if len(r) > 2 else ", ".join(f"{prefix}{n}" for n in r) for r in runs)


def _side_doc_words(d: DocTimeline, run: SideRun) -> Fact:
    head = run.heads.get(d.doc)
    if d.final == "failed":
        return Fact(f"{d.doc} failed: {d.reason}" + (f" (head {head})" if head == "REVOKED" else ""), d.mark)
    if d.final == "revoked":
        return Fact(f"{d.doc}'s head {head or 'REVOKED'} ({'expired' if d.expired else 'revoked'}), nothing ran after it", d.mark)
    if d.dead_lettered_at is None and d.kept_at is None and d.attempts and all(a.how != "ok" for a in d.attempts):
        return Fact(f"{d.doc} never finalised by the drain", "running")
    return Fact(f"{d.doc} {d.final}", d.mark)


def _letters_words(obs: Observations) -> Fact:
    """What became of the letters the runner put in the DLQ ahead of the side ``behind``."""
    foreign = _foreign(obs)
    parked = sum(1 for e in obs.events if e.kind == "dead_letter_parked")
    if foreign is None:
        return Fact("no foreign letters put in the DLQ")
    if parked:
        return Fact(f"all {foreign} foreign letters parked" if parked == foreign else f"{parked} of {foreign} foreign letters parked")
    left = f" (DLQ: {obs.dlq_depth} ready at the end)" if obs.dlq_depth is not None else ""
    return Fact(f"none of {foreign} foreign letters parked{left}", "kept")


def _chord_words(obs: Observations) -> str:
    ch = obs.chord
    if ch.state == "SUCCESS":
        env = ch.envelope
        return "SUCCESS envelope" if env is not None and env.ok else f"SUCCESS {ch.error or ''}".strip()
    if ch.state == "FAILURE":
        return f"FAILURE {ch.error_type or ''}: {ch.error or ''}".strip()
    return f"not finished ({ch.state})"
