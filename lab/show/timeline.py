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
the DLQ instead of finalising it: FM-3's hard variant, a poison chain head), ``killed``
(the process died and nothing redelivered the message), ``running``, ``retrying`` (a
retry not yet served) or ``not started``.

A chord's body (``Timeline.body``: ``notify`` in every FM, ``reconcile`` or
``aggregate_batch`` in a case study, ``body_name``) runs once per delivery
(``NotifyRun``); a delivery that started and was followed by another start of the same
role, with no end between, was killed; the chord's last delivery, with no end seen,
returned if the chord's result (its return value) is stored. Emails are the FMs' notion
(``Timeline.counts_emails``): a case study's body sends none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Literal

from shared.envelope import REASONS
from lab import harness
from lab.observe import Event
from lab.runner import Observations

End = Literal["ok", "raised", "retried", "killed", "running"]
Final = Literal["ok", "failed", "kept", "killed", "running", "retrying", "not started"]
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
    "running": Mark("…", "#757575", "running: no end when the run stopped"),
    "email": Mark("✉", "#00838f", "email sent"),
    "deduplicated": Mark("⊜", "#4db6ac", "deduplicated: the mail API dropped a repeat (same idempotency key)"),
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
class DocTimeline:
    doc: str
    attempts: tuple[Attempt, ...]
    dead_lettered_at: float | None
    final: Final
    reason: str | None = None  # the envelope reason when ``final`` is failed
    error: str = ""
    kept_at: float | None = None  # when the DLQ drain kept its dead letter instead of finalising it
    kept_why: str = ""

    @property
    def mark(self) -> str:
        if self.final == "failed":
            return self.reason or "error"
        if self.final == "kept":
            return "kept"
        return {"retrying": "retried", "not started": "running"}.get(self.final, self.final)


@dataclass(frozen=True)
class NotifyRun:
    role: str  # chord or duplicate
    start: float
    end: float | None
    how: NotifyEnd
    gate_wait: float | None = None  # when it began waiting at the runner's gate
    retry_in: float | None = None  # for ``retried``: the planned delay (FM-4's busy claim)
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

    @property
    def has_chord(self) -> bool:
        """Whether the run had documents in a chord to follow (case study 3's per-event tasks have none)."""
        return bool(self.docs)

    @property
    def counts_emails(self) -> bool:
        """Emails are the FMs' notion: their ``notify`` sends one; a case study's body sends none."""
        return self.body == "notify"


def body_name(cell: str, code: str) -> str:
    """The chord body's name for a run of ``code`` in ``cell``: ``notify`` for an FM, else the program's own."""
    if not harness.is_case(cell):
        return "notify"  # DESIGN.md §1: every FM's body is notify
    return str(harness.load(code).notify.name).rsplit(".", 1)[-1]


def build(obs: Observations, body: str = "notify") -> Timeline:
    events = sorted(obs.events, key=lambda e: e.t)
    at = obs.submitted_at
    chord_over = obs.chord.state in ("SUCCESS", "FAILURE")
    docs = tuple(_doc(obs, doc, [e for e in events if e.get("doc") == doc], at, chord_over) for doc in obs.docs)
    notifies = _returned(_notifies(events, at), obs)
    emails = tuple(Email(e.t - at, e.get("role")) for e in events if e.kind == "email")
    last = max((e.t - at for e in events), default=0.0)
    return Timeline(obs.fm, obs.run_id, obs.scenario, docs, notifies, emails,
                    max(obs.elapsed, last), obs.stopped_by, _chord_words(obs), body)


def _doc(obs: Observations, doc: str, events: list[Event], at: float, chord_over: bool) -> DocTimeline:
    starts = [e for e in events if e.kind == "attempt_start"]
    ends = {e.get("attempt"): e for e in events if e.kind == "attempt_end"}
    retries = {e.get("retry"): e for e in events if e.kind == "retry"}
    dead = next((e.t - at for e in events if e.kind == "dead_lettered"), None)
    kept = next((e for e in events if e.kind == "dead_letter_kept"), None)
    settled = dead is not None or kept is not None or chord_over  # the run went on past its last attempt
    attempts: list[Attempt] = []
    for i, start in enumerate(starts):
        n = int(start.get("attempt") or i + 1)
        end = ends.get(str(n))
        attempts.append(_attempt(n, start.t - at, end, retries.get(str(n)), at, i + 1 < len(starts) or settled))
    if not starts:  # no parse ever began: show the fetches, the chain's head (they died, or are running)
        fetches = [e for e in events if e.kind == "fetch_start"]
        for i, f in enumerate(fetches):
            followed = i + 1 < len(fetches) or settled
            attempts.append(Attempt(i + 1, f.t - at, None, "killed" if followed else "running", stage="fetch"))
        attempts = attempts if len(fetches) > 1 or dead is not None or kept is not None else []
    final, reason, error = _final(obs, doc, attempts, dead)
    if kept is not None and dead is None and final != "ok":
        final, reason, error = "kept", None, ""
    return DocTimeline(doc, tuple(attempts), dead, final, reason, error,
                       None if kept is None else kept.t - at, kept.get("why") if kept is not None else "")


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
        if doc in obs.ok_docs():
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
        elif e.kind == "crash":  # the scenario killed it (FM-4's hard variant); the email may be out
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


def _chord_words(obs: Observations) -> str:
    ch = obs.chord
    if ch.state == "SUCCESS":
        env = ch.envelope
        return "SUCCESS envelope" if env is not None and env.ok else f"SUCCESS {ch.error or ''}".strip()
    if ch.state == "FAILURE":
        return f"FAILURE {ch.error_type or ''}: {ch.error or ''}".strip()
    return f"not finished ({ch.state})"
