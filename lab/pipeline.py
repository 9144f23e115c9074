"""The teaching pipeline's business code and the two services it talks to.

Not a fix and not the lesson: what a production codebase would have in its own
domain modules, kept small. The FM files import it and hold the Celery code.

- ``Fetched``, ``Parsed``, ``Summary``: what the tasks return (JSON-ready dicts);
- ``parse(document)``: the parsing itself (it counts words);
- ``summarise(results, doc_ids)``: the chord body's aggregation of ok and failed
  documents, from envelopes (once a program envelopes its tasks) or bare payloads (the naive program);
- ``fetch_text(doc_id)``: the document store (Redis stands in for S3 or an HTTP
  API); the runner writes each run's documents there, faults included; a
  ``FETCH_POISON`` document kills the process that reads it (``lab.faults``);
- ``send_email(pipeline_id, summary, idempotency_key=None)``: the mail API
  stand-in. It records each call and each email it delivers. Given an
  idempotency key it delivers once per key: a later call with the same key
  delivers nothing and answers with the first message's id, the way mail and
  payment APIs that take an idempotency key behave (for as long as they keep
  the key). It also plays two parts of the scenario, because they must happen
  exactly between "decided to send" and "sent":
  - the claim's interleaving: when the scenario fires a duplicate ``notify``, callers
    wait at the runner's gate until it opens, so the duplicate is certain to
    arrive while the first caller holds the claim;
  - the claim's hard variant: the scenario's crash plan, one step per call in call
    order: ``before_send`` kills the caller's process after it claimed and
    before the email goes out; ``after_send`` kills it once the email is out,
    before ``notify`` marks the claim sent;
  - the dead-letter drain's hard variant: in a pipeline marked ``poison_mail``, every call kills
    its caller, so the chord body dies on every delivery.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict, cast

from celery import current_task

from lab.faults import CRASH_AFTER_SECONDS, fetch_fault, kill_self
from lab.observe import TTL_SECONDS, RunRecorder, doc_id, short_doc, split_doc_id
from lab.waiting import wait_until
from shared.envelope import Result, is_envelope

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


class DocumentMissing(Exception):
    """The document store has no such document (its run expired, or the id is wrong)."""


class GateTimeout(Exception):
    """Nobody opened the gate in time (the runner died or forgot)."""


def store_document(run_id: str, doc: str, text: str) -> str:
    """Put a run's document into the store; returns its id."""
    RunRecorder(run_id).put(f"doc:{doc}", text)
    return doc_id(run_id, doc)


def store_documents(run_id: str, texts: Mapping[str, str]) -> list[str]:
    """``store_document`` of each document, in one round trip; returns their ids in order."""
    rec = RunRecorder(run_id)
    pipe: Any = cast(Any, rec.r).pipeline(transaction=False)
    for doc, text in texts.items():
        pipe.set(f"{rec.prefix}doc:{doc}", text, ex=TTL_SECONDS)
    pipe.execute()
    return [doc_id(run_id, doc) for doc in texts]


def fetch_text(doc_id: str) -> str:
    found = split_doc_id(doc_id)
    text = RunRecorder(found[0]).get(f"doc:{found[1]}") if found else None
    if text is None:
        raise DocumentMissing(f"no document {doc_id!r} in the store")
    fetch_fault(text)  # the lab: a FETCH_POISON document kills its reader
    return text


def parse(document: Fetched) -> Parsed:
    words = document["text"].splitlines()[-1].split()
    return {"doc": document["doc"], "words": len(words)}


def summarise(results: Sequence[object], doc_ids: Sequence[str]) -> Summary:
    """Aggregate the chord header's results (envelopes, or bare payloads in the naive program).

    The Redis backend hands a chord body its header's results in header order
    (``result_chord_ordered``, on by default), so result ``i`` is ``doc_ids[i]``: the pipeline's
    manifest (``shared.manifest``), as ``submit`` wrote it.
    """
    ok: list[str] = []
    failed: list[Failed] = []
    for i, raw in enumerate(results):
        doc = short_doc(doc_ids[i]) if i < len(doc_ids) else "?"
        if is_envelope(raw):
            envelope = Result.from_wire(raw)
            if envelope.ok:
                ok.append(doc)
            else:
                failed.append({"doc": doc, "reason": envelope.reason or "error", "error": envelope.error or ""})
        else:
            ok.append(doc)
    return {"ok": ok, "failed": failed, "sent": False}


def send_email(pipeline_id: str, summary: Summary, idempotency_key: str | None = None) -> str:
    """The side effect that must happen once per pipeline; returns the message id.

    The lab's pipeline id is its run id, so the run's record is the mailbox.
    """
    run = RunRecorder(pipeline_id)
    task_id = str(cast(Any, current_task).request.id) if current_task else ""
    crash = run.pop("crash_plan")  # this call's step of the scenario's crash plan, if any
    if run.get("poison_mail") is not None:  # the drain's hard variant: the chord body is the poison
        run.event("crash", task=task_id, when="poison_mail")
        # Mid-task, as the lab's other kills (CRASH_AFTER_SECONDS). Killed at once, one run counted
        # 4 starts for 3 deliveries (two pool processes died on one delivery); not yet explained.
        time.sleep(CRASH_AFTER_SECONDS)
        kill_self()
    if run.get("gated") is not None and not run.gate_open():
        run.event("gate_wait", task=task_id)
        if not wait_until(run.gate_open, GATE_TIMEOUT_SECONDS, interval=0.01):
            raise GateTimeout(f"gate not opened within {GATE_TIMEOUT_SECONDS:.0f}s")
    if crash == "before_send":
        run.event("crash", task=task_id, when=crash)
        kill_self()
    run.append("mail_calls", task_id)
    message_id = f"{pipeline_id}/{task_id}"
    if idempotency_key is not None and not run.claim_once(f"mail-key:{idempotency_key}", message_id):
        run.event("email_deduplicated", task=task_id)
        return run.get(f"mail-key:{idempotency_key}") or message_id
    run.append("emails", f"{task_id}|pipeline {pipeline_id}: {len(summary['ok'])} ok, {len(summary['failed'])} failed")
    run.event("email", task=task_id)
    if crash == "after_send":
        run.event("crash", task=task_id, when=crash)
        kill_self()
    return message_id
