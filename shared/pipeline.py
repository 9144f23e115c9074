"""The task bodies every FM registers: fetch, parse, notify (plain functions).

They know nothing about the fixes; ``shared.recipe`` wraps them with an FM's
decorators and options. Each body takes the bound task first and the run
context as ``ctx``; ``parse_document`` is the only place a fault is injected.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypedDict, cast

from celery import Task

from shared.envelope import Result, Wire, describe, is_envelope, note_attempt, reason_of
from shared.faults import inject
from shared.observe import Recorder
from shared.scenarios import RunContext
from shared.waiting import wait_until

GATE_TIMEOUT_SECONDS = 30.0
"""A ``notify`` waiting at the runner's gate gives up after this long (then fails)."""


class Fetched(TypedDict):
    doc: str
    text: str


class Parsed(TypedDict):
    doc: str
    words: int


class Failed(TypedDict):
    doc: str
    reason: str
    error: str


class Summary(TypedDict):
    ok: list[str]
    failed: list[Failed]
    sent: bool


class UpstreamFailed(Exception):
    """``parse_document`` got a failed ``fetch_document`` envelope."""


class GateTimeout(Exception):
    """Nobody opened the gate in time (the runner died or forgot)."""


def fetch_document(task: Task[Any, Any], doc: str, *, ctx: Wire) -> Fetched:
    return {"doc": doc, "text": f"the text of {doc}"}


def doc_of(fetched: object) -> str:
    """The document a ``parse_document`` call is about, from its first argument."""
    if is_envelope(fetched):
        envelope = Result.from_wire(fetched)
        if not envelope.ok:
            raise UpstreamFailed(envelope.error or "fetch failed")
        fetched = envelope.payload
    if isinstance(fetched, Mapping) and isinstance(doc := cast(Mapping[str, Any], fetched).get("doc"), str):
        return doc
    raise ValueError(f"parse_document got no document: {fetched!r}")


def doc_named_by(args: Sequence[object]) -> str:
    """``doc_of`` the first argument for a record, or ``?`` when it names none."""
    try:
        return doc_of(args[0]) if args else "?"
    except (UpstreamFailed, ValueError):
        return "?"


def parse_document(task: Task[Any, Any], fetched: Wire, *, ctx: Wire) -> Parsed:
    run = RunContext.from_wire(ctx)
    doc = doc_of(fetched)
    rec = Recorder(run.fm, run.run_id)
    attempt = rec.begin_attempt(doc)
    note_attempt(attempt)
    try:
        inject(run.fault_for(doc), attempt, doc=doc)
    except BaseException as exc:
        rec.event("attempt_end", doc=doc, attempt=attempt, outcome=reason_of(exc), error=describe(exc))
        raise
    rec.event("attempt_end", doc=doc, attempt=attempt, outcome="ok")
    return {"doc": doc, "words": len(f"the text of {doc}".split())}


def summarise(results: Sequence[object], docs: Sequence[str]) -> Summary:
    """Aggregate the chord header's results (envelopes, or raw payloads in fm0).

    The Redis backend hands a chord body its header's results in header order
    (``result_chord_ordered``, on by default), so result ``i`` is ``docs[i]``.
    """
    ok: list[str] = []
    failed: list[Failed] = []
    for i, raw in enumerate(results):
        doc = docs[i] if i < len(docs) else "?"
        if is_envelope(raw):
            envelope = Result.from_wire(raw)
            if envelope.ok:
                ok.append(doc)
            else:
                failed.append({"doc": doc, "reason": envelope.reason or "error", "error": envelope.error or ""})
        else:
            ok.append(doc)
    return {"ok": ok, "failed": failed, "sent": False}


def send_email(run: RunContext, rec: Recorder, role: str, summary: Summary) -> None:
    """The side effect that must happen once per pipeline.

    When the scenario fires a duplicate ``notify`` (scenario 4 on), the sender
    first waits at the runner's gate, so that the duplicate is certain to arrive
    while this one is between "decided to send" and "sent".
    """
    if run.duplicate_notify:
        rec.event("gate_wait", role=role)
        if not wait_until(rec.gate_is_open, GATE_TIMEOUT_SECONDS, interval=0.01):
            raise GateTimeout(f"gate not opened within {GATE_TIMEOUT_SECONDS:.0f}s")
    ok, failed = len(summary["ok"]), len(summary["failed"])
    rec.email(role, f"pipeline {run.pipeline_id}: {ok} ok, {failed} failed")
