"""Submit one scenario's chord to a running worker and observe what happens.

``run_scenario`` returns a typed ``Observations``; it never sleeps blindly: it
polls Redis (the run's events and counters) and the result backend until the
run's stop condition holds or its deadline passes. The stop condition is the
chord's result being ready, unless the caller gives another (a broken run
whose chord never completes stops on its symptom instead).

Before it submits, the runner writes the run's documents into the lab's
document store (``lab.pipeline``), each with the fault the scenario gives it in
its text; the FM's own ``submit(doc_ids, pipeline_id)`` then sends the chord,
with document ids ``<run_id>/<doc>`` and the run id as the pipeline id.

FM-5's burst: once every document of the scenario's burst waits to retry, the
runner sends a probe task and notes when it comes back (``burst_probe``).

FM-4's interleaving is made deterministic with a gate: every ``notify`` that
reaches "send" waits until the runner opens it (``lab.pipeline.send_email``); the
runner fires the duplicate ``notify`` only when the chord's own ``notify`` is
waiting, and opens the gate only when the duplicate has met the claim (its first
busy-retry) or, without a claim, reached the gate itself.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone
from collections.abc import Callable
from typing import Any, cast

from celery import chain, chord, group
from celery.result import AsyncResult
from kombu import Producer

from lab.outage import BackendOutage
from lab.connloss import LinkedBroker
from lab.deploys import RollingDeploy
from lab.faults import document_text
from lab.fm import Fm
from lab.observe import BURST_PROBE, FOREIGN_RUN_HEADER, Reader
from lab.records import Observations, Outcome, SideRun
from lab.pipeline import store_documents
from lab.settings import observations_url
from shared.backend import GONE
from lab.scenarios import Scenario, Side
from lab.waiting import wait_until
from shared.claim import NotifyClaim
from shared.dlq import DRAIN_BATCH, parked_queue
from shared.manifest import write_manifest

NOT_RUN_WINDOW = 0.5
"""To show that ``notify`` did not run, the runner watches this long after the chord ended."""
END_RECORD_WINDOW = 5.0
"""How long the runner waits, after a SUCCESS chord, for its ``notify``'s end to be recorded. Celery
stores the body's result before ``task_postrun`` runs, so the result can be ready before the
observer has written ``notify_end`` (seen on a loaded machine: G1 counted 0 ends of a ``notify``
that had sent its email)."""
DLQ_SETTLE_SECONDS = 5.0
"""Once a chord finished, how long the runner waits for the FM's DLQ to be empty before it reads it: letters
the drain kept while the result backend was gone (FM-8: a ``notify`` rejected with its RETRY state unstored)
go back on its first pass after the return, which may come just after the chord's end."""


def foreign_letters(fm: Fm) -> int:
    """FM-3's hard variant: letters the drain cannot place, put in the DLQ before the side ``behind``:
    one more than the drains the worker may run at once (one per pool process) read in a pass each,
    so that no drain that puts them back can reach a letter behind them."""
    return fm.concurrency * DRAIN_BATCH + 1


StopCondition = Callable[[Reader], bool]
"""``reader -> stop now?``, asked at every look at the run."""


def new_run_id() -> str:
    return time.strftime("%H%M%S-") + uuid.uuid4().hex[:6]


def probe_seconds(fm: Fm, timeout: float) -> float | None:
    """Round trip of one probe task (None if it did not come back in time).

    Its result is read (``ready``: a GET), not awaited on the backend's subscription: after scenario 8's
    outage the harness's subscription connection is one the restart closed, and a result published before
    Celery subscribes again is never heard (a probe answered in 3 ms was "lost" once that way)."""
    started = time.monotonic()
    res = fm.probe.apply_async()

    def back() -> bool:
        try:
            return res.ready()
        except GONE:  # a connection the backend's restart closed: the next look opens another
            return False

    try:
        if not wait_until(back, timeout, interval=0.01):
            return None
    finally:
        try:
            res.forget()
        except GONE:
            pass
    return time.monotonic() - started


def dlq_depth(fm: Fm, parked: bool = False) -> int | None:
    """Messages in the FM's DLQ (``parked``: in its parking queue; 0 when the drain never declared it)."""
    dlq = fm.dead_letter_queue
    if dlq is None:
        return None
    queue = parked_queue(dlq) if parked else dlq
    with fm.app.connection_for_write() as conn:
        try:
            declared = cast(Any, queue.bind(conn.default_channel).queue_declare(passive=True))
        except conn.channel_errors:  # 404: the parking queue exists only once the drain parked something
            if parked:
                return 0
            raise
        return int(declared.message_count)


def put_foreign_letters(fm: Fm, run_id: str, count: int) -> None:
    """Put ``count`` messages that are no Celery task into the FM's DLQ (FM-3's hard variant): what a
    producer that is not Celery, or a tool, leaves there. Each names the run in a header, for the observer."""
    dlq = fm.dead_letter_queue
    if dlq is None:
        return
    with fm.app.connection_for_write() as conn:
        producer = Producer(conn.default_channel)
        for i in range(count):
            producer.publish(f"foreign letter {i} of run {run_id}".encode(), exchange=dlq.exchange,
                             routing_key=dlq.routing_key, content_type="text/plain", content_encoding="utf-8",
                             headers={FOREIGN_RUN_HEADER: run_id}, serializer=None, declare=[dlq], retry=True)


def side_run_id(run_id: str, tag: str) -> str:
    return f"{run_id}-{tag}"


class _SideChord:
    """One side chord while the run goes on."""

    def __init__(self, fm: Fm, side: Side, run_id: str) -> None:
        self.fm, self.side = fm, side
        self.run_id = side_run_id(run_id, side.tag)
        self.reader = Reader(self.run_id)
        self.result: AsyncResult[Any] | None = None

    def submit(self) -> None:
        doc_ids = store_documents(self.run_id, {doc: document_text(doc, fault) for doc, fault in self.side.docs.items()})
        if self.side.poison_mail:
            self.reader.rec.put("poison_mail", "1")
        if self.side.expired_head and self.fm.fetch_document is not None:
            # The FM's own chord, its heads sent with an expiry already passed (Celery then sends AMQP
            # expiration 0: a consumer with room takes it at once, and the worker finds it expired).
            fetch, parse, notify = self.fm.fetch_document, self.fm.parse_document, self.fm.notify
            header = group(chain(fetch.s(d).set(expires=datetime.now(timezone.utc) - timedelta(seconds=1)), parse.s()) for d in doc_ids)
            write_manifest(self.fm.app, self.run_id, doc_ids)  # as the FM's submit does
            self.result = chord(header)(notify.s(self.run_id))
        else:
            self.result = self.fm.submit(doc_ids, self.run_id)

    def ready(self) -> bool:
        return self.result is not None and self.result.ready()

    def pending(self) -> bool:
        """Still to wait for: sent and not finished, or the side ``behind``, not yet sent, on an FM with a DLQ."""
        if self.result is None:
            return (self.side.behind_letters and self.fm.dead_letter_queue is not None) or self.side.last
        return not self.result.ready()

    def observed(self) -> SideRun:
        docs = tuple(self.side.docs)
        members, heads = _members(self.result, docs)
        found = NotifyClaim.of(self.fm.app, self.run_id, owner=None)
        claim = cast(str | None, found.r.get(found.key))
        return SideRun(
            tag=self.side.tag, run_id=self.run_id, docs=docs, submitted=self.result is not None,
            chord=Outcome.of(self.result) if self.result is not None else Outcome("NOT SENT", None, None, None),
            members=members, heads=heads,
            attempts=self.reader.attempts_of(docs),
            fetch_attempts=self.reader.attempts_of(docs, "fetch-attempts"),
            events=tuple(self.reader.events()), emails=tuple(self.reader.emails()), claim=claim)


def _members(body: AsyncResult[Any] | None, docs: tuple[str, ...]) -> tuple[dict[str, Outcome], dict[str, str]]:
    """Each document's chord member (the last task of its chain) and the state of its chain's head."""
    found = _member_results(body, docs) if body is not None else {}
    parents = {doc: cast("AsyncResult[Any] | None", member.parent) for doc, member in found.items()}
    metas = _metas(body.backend if body is not None else None,
                   [m.id for m in found.values()] + [p.id for p in parents.values() if p is not None])
    if metas is None:  # a backend with no MGET: one look per result
        return ({doc: Outcome.of(m) for doc, m in found.items()},
                {doc: str(p.state) if p is not None else "?" for doc, p in parents.items()})
    return ({doc: Outcome.of_meta(metas[m.id]) for doc, m in found.items()},
            {doc: str(metas[p.id]["status"]) if p is not None else "?" for doc, p in parents.items()})


def _metas(backend: Any, task_ids: list[str]) -> dict[str, dict[str, Any]] | None:
    """The stored state of each of ``task_ids``, read in one MGET from a key-value backend (Celery's
    ``BaseKeyValueStoreBackend``: ``get_key_for_task``, ``mget``, ``decode_result``), as
    ``AsyncResult`` reads one (PENDING when nothing is stored); None for another backend. Issue 26: two
    GETs per document, one after another, were most of the run's final reads at 3,000 documents."""
    if backend is None or not all(hasattr(backend, name) for name in ("get_key_for_task", "mget", "decode_result")):
        return None
    values = cast(list[Any], backend.mget([backend.get_key_for_task(t) for t in task_ids])) if task_ids else []
    return {t: cast(dict[str, Any], backend.decode_result(v)) if v else {"status": "PENDING", "result": None}
            for t, v in zip(task_ids, values)}


def run_scenario(
    fm: Fm,
    sc: Scenario,
    run_id: str,
    timeout: float,
    stop: tuple[str, StopCondition] | None = None,
    probe_after: bool = True,
    watch: Callable[[], None] | None = None,
    sides: bool = False,
    deploy: RollingDeploy | None = None,
    outage: BackendOutage | None = None,
    broker: LinkedBroker | None = None,
) -> Observations:
    """Submit ``sc`` through ``fm.submit`` and observe it until it ends or ``timeout`` passes.

    ``watch`` is called at every look; it raises to end the run at once (the harness's
    watch on its worker and the services: a dead worker is not a slow scenario).
    ``sides``: submit the scenario's side chords too (a run without a stop condition then
    waits for them as well); the side ``behind`` goes once the run's dead letters were handled,
    behind ``foreign_letters(fm)`` letters the drain cannot place; the side ``deploy`` once all
    else is over, and ``deploy`` (``lab.deploys``) then rolls the worker while it runs; the side
    ``outage`` after it, and ``outage`` (``lab.outage``) stops the result backend while it runs (the
    runner reads no result while it is down); the sides ``connloss`` and ``overlong`` after it, one after
    the other, through ``broker`` (``lab.connloss``), which cuts its worker's connections during ``connloss``.
    """
    reader = Reader(run_id)
    side_chords = [_SideChord(fm, side, run_id) for side in sc.sides] if sides else []
    for side in side_chords:
        if not side.side.behind_letters and not side.side.last:
            side.submit()  # before the main chord, while the worker has room: an expired head is taken at once
    reader.side_readers = {side.side.tag: side.reader for side in side_chords}
    doc_ids = store_documents(run_id, {doc: document_text(doc, fault) for doc, fault in sc.faults.items()})
    if sc.duplicate_notify:
        reader.rec.put("gated", "1")
    for crash in sc.crash_plan:
        reader.rec.append("crash_plan", crash)
    submitted_at = time.time()
    started = time.monotonic()
    body_result = fm.submit(doc_ids, run_id)
    reader.members = _member_results(body_result, sc.docs)
    duplicate: AsyncResult[Any] | None = None
    gate_opened = False
    burst_probe: AsyncResult[Any] | None = None
    burst_sent, burst_back = 0.0, None

    def step() -> str | None:
        """One look at the run; returns why to stop, or None to go on."""
        nonlocal duplicate, gate_opened, burst_probe, burst_sent, burst_back
        for side in side_chords:
            if side.result is not None and side.side.outage and outage is not None:
                outage.step(side.reader)
            if side.result is not None and side.side.linked and broker is not None:
                broker.step(side.reader, side.side.drop)  # FM-9
        if outage is not None and outage.down:
            return None  # FM-8: every look at a result waits for the backend's return
        if sc.burst:
            if burst_probe is None and _burst_waiting(reader, sc.burst):
                burst_sent = time.time()
                burst_probe = fm.probe.apply_async(task_id=f"{run_id}{BURST_PROBE}{uuid.uuid4()}")
                reader.rec.event("burst_probe_sent")
            elif burst_probe is not None and burst_back is None and burst_probe.ready():
                burst_back = time.time()
                reader.rec.event("burst_probe_back")  # a weak run may stop here (lab.checks.weak_stop)
        if sc.duplicate_notify:
            if duplicate is None and reader.has_event("gate_wait", role="chord"):
                duplicate = _fire_duplicate(fm, reader, body_result, run_id)
            elif duplicate is not None and not gate_opened and _duplicate_met_claim(reader):
                reader.rec.open_gate()
                gate_opened = True
        for i, side in enumerate(side_chords):
            if side.result is None and side.side.behind_letters and fm.dead_letter_queue is not None \
                    and _dead_letters_handled(reader, sc, side_chords):
                put_foreign_letters(fm, run_id, foreign_letters(fm))
                reader.rec.event("foreign_letters", count=foreign_letters(fm))
                side.submit()
            before = side_chords[:i] + [s for s in side_chords[i + 1:] if not s.side.last]  # the outage after the deploys
            if side.result is None and side.side.last and body_result.ready() \
                    and (duplicate is None or duplicate.ready()) and not any(s.pending() for s in before):
                if side.side.linked and broker is not None:
                    broker.submit(side.submit)  # FM-9: to the lab's own node, served by its own worker
                    side.reader.rec.event("linked", node=broker.node.node)
                else:
                    side.submit()  # FM-7, FM-8: the deploys and the outage meet only slow documents, none of the earlier faults
            if side.result is not None and side.side.deploys and deploy is not None:
                deploy.step(side.reader)
        if stop is not None:
            return stop[0] if stop[1](reader) else None
        if any(side.pending() for side in side_chords):
            return None
        if body_result.ready():
            # A failed chord never reaches the gate, so no duplicate will come.
            waiting_for_duplicate = sc.duplicate_notify and body_result.state == "SUCCESS"
            waiting_for_probe = burst_probe is not None and burst_back is None
            if (not waiting_for_duplicate or (duplicate is not None and duplicate.ready())) and not waiting_for_probe:
                return "chord finished"
        return None

    reasons: list[str] = []

    away = str(fm.app.conf.result_backend) != observations_url()  # FM-8: a backend apart from the run's record

    def should_stop() -> bool:
        if watch is not None:
            watch()
        try:
            reason = step()
        except GONE:
            if not away:
                raise
            reason = None  # FM-8 by hand: the result backend you stopped; the record says the rest (deadline holds)
        if reason is not None:
            reasons.append(reason)
        return reason is not None

    wait_until(should_stop, timeout)
    stopped_by = reasons[0] if reasons else "deadline"
    chord_outcome = Outcome.of(body_result)
    if chord_outcome.state != "SUCCESS":
        # Proving that the body did not run: watch a bounded window, then read.
        wait_until(lambda: reader.notify_runs("chord") > 0, NOT_RUN_WINDOW)
    elif stopped_by == "chord finished":
        wait_until(lambda: reader.has_event("notify_end", role="chord"), END_RECORD_WINDOW)
        if fm.dead_letter_queue is not None:
            wait_until(lambda: dlq_depth(fm) == 0, DLQ_SETTLE_SECONDS)
    healthy = stop is None and stopped_by != "deadline"
    return Observations(
        fm=fm.short,
        run_id=run_id,
        scenario=sc.number,
        docs=sc.docs,
        attempts=reader.attempts_of(sc.docs),
        fetch_attempts=reader.attempts_of(sc.docs, "fetch-attempts"),
        events=tuple(reader.events()),
        notify_runs={role: reader.notify_runs(role) for role in ("chord", "duplicate")},
        emails=tuple(reader.emails()),
        mail_calls=reader.mail_calls(),
        chord=chord_outcome,
        duplicate=Outcome.of(duplicate) if duplicate is not None else None,
        dlq_depth=dlq_depth(fm),
        probe_seconds=probe_seconds(fm, timeout=10.0) if probe_after and healthy else None,
        burst_probe=(burst_sent, burst_back) if burst_probe is not None else None,
        stopped_by=stopped_by,
        submitted_at=submitted_at,
        elapsed=time.monotonic() - started,
        members=_members(body_result, sc.docs)[0],
        sides={side.side.tag: side.observed() for side in side_chords},
        parked=dlq_depth(fm, parked=True),
    )


def _member_results(body: AsyncResult[Any], docs: tuple[str, ...]) -> dict[str, AsyncResult[Any]]:
    header = cast(Any, body.parent)
    return dict(zip(docs, cast("list[AsyncResult[Any]]", list(header.results) if header is not None else [])))


POISONED = ("POISON", "FETCH_POISON")


def _dead_letters_handled(reader: Reader, sc: Scenario, side_chords: list[_SideChord]) -> bool:
    """Has the drain finalised, or kept, every letter the run's poison made (its documents', the poison body's)?"""
    handled = {e.get("doc") or "body" for e in reader.events() if e.kind in ("dead_lettered", "dead_letter_kept")}
    docs = [d for d, f in sc.faults.items() if f is not None and f.kind in POISONED]
    if not all(d in handled for d in docs):
        return False
    for side in side_chords:
        if side.side.poison_mail and not any(e.kind in ("dead_lettered", "dead_letter_kept") and not e.get("doc")
                                             for e in side.reader.events()):
            return False
    return True


def _fire_duplicate(fm: Fm, reader: Reader, body_result: AsyncResult[Any], pipeline_id: str) -> AsyncResult[Any]:
    """Re-fire ``notify`` for the same pipeline, as an operator (or a redelivery) would."""
    header = cast(Any, body_result.parent)  # the chord's header GroupResult
    members = cast("list[AsyncResult[Any]]", header.results if header is not None else [])
    results = [cast(object, r.result) for r in members]
    task_id = str(uuid.uuid4())
    reader.rec.put("duplicate", task_id)  # so the reader tells its events from the chord's notify
    return fm.notify.apply_async(args=(results, pipeline_id), task_id=task_id)


def _burst_waiting(reader: Reader, burst: tuple[str, ...]) -> bool:
    """Has every document of the burst planned its retry (so all of them wait now)?"""
    planned = {e.get("doc") for e in reader.events_of("retry")}
    return all(doc in planned for doc in burst)


def _duplicate_met_claim(reader: Reader) -> bool:
    """The duplicate reached the gate (no claim) or was turned away busy by the claim (its first retry)."""
    return reader.has_event("gate_wait", role="duplicate") or reader.has_event("notify_retry", role="duplicate")
