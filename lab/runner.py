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

What the lab does to the run from outside (a duplicate ``notify``, a probe, letters in the DLQ, deploys,
an outage, a cut connection) is done by the scenario's fault injectors (``lab.injector``), which the runner
starts, steps at every look and stops, without knowing what they do; a side chord (``lab.scenarios.SideChord``)
is sent with the run's own chord, or once what it comes ``after`` is over and its injector is ready.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, cast

from celery.result import AsyncResult
from kombu import Queue

from lab.faults import Fault, document_text
from lab.fm import Fm
from lab.injector import Injector
from lab.observe import Reader
from lab.records import Observations, Outcome, SideRun
from lab.pipeline import store_documents
from lab.settings import observations_url
from shared.backend import GONE
from lab.scenarios import MAIN, Scenario, SideChord
from lab.waiting import wait_until
from shared.claim import NotifyClaim
from shared.dlq import DeadLetteringQueue, parked_queue

NOT_RUN_WINDOW = 0.5
"""To show that ``notify`` did not run, the runner watches this long after the chord ended."""
END_RECORD_WINDOW = 5.0
"""How long the runner waits, after a SUCCESS chord, for its ``notify``'s end to be recorded. Celery
stores the body's result before ``task_postrun`` runs, so the result can be ready before the
observer has written ``notify_end`` (seen on a loaded machine: G1 counted 0 ends of a ``notify``
that had sent its email)."""
DLQ_SETTLE_SECONDS = 5.0
"""Once a chord finished, how long the runner waits for the FM's DLQ to be empty before it reads it: letters
the drain kept while the result backend was gone (a ``notify`` rejected with its RETRY state unstored)
go back on its first pass after the return, which may come just after the chord's end."""


StopCondition = Callable[[Reader], bool]
"""``reader -> stop now?``, asked at every look at the run."""


def new_run_id() -> str:
    return time.strftime("%H%M%S-") + uuid.uuid4().hex[:6]


def probe_seconds(fm: Fm, timeout: float) -> float | None:
    """Round trip of one probe task (None if it did not come back in time).

    Its result is read (``ready``: a GET), not awaited on the backend's subscription: after an outage of
    the result backend the harness's subscription connection is one the restart closed, and a result published before
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
    """Messages in the FM's DLQ (``parked``: set apart from it: in the lab drain's parking queue, or in the other
    queues a program written without ``shared/dlq`` declares beside its DLQ; 0 when none was declared yet)."""
    dlq = fm.dead_letter_queue
    if dlq is None:
        return None
    if not parked:
        return _depth(fm, dlq, missing_is_empty=False)
    if any(q is dlq for q in fm.declared) and not any(isinstance(q, DeadLetteringQueue) for q in fm.task_queues):
        return sum(_depth(fm, q, missing_is_empty=True) for q in fm.declared if q is not dlq)
    return _depth(fm, parked_queue(dlq), missing_is_empty=True)


def _depth(fm: Fm, queue: Queue, missing_is_empty: bool) -> int:
    with fm.app.connection_for_write() as conn:
        try:
            declared = cast(Any, queue.bind(conn.default_channel).queue_declare(passive=True))
        except conn.channel_errors:  # 404: a parking queue exists only once something was parked
            if missing_is_empty:
                return 0
            raise
        return int(declared.message_count)


def side_run_id(run_id: str, tag: str) -> str:
    return f"{run_id}-{tag}"


class _SideChord:
    """One side chord while the run goes on (what an injector sees of it: ``lab.injector.SideView``)."""

    def __init__(self, fm: Fm, spec: SideChord, run_id: str, injector: Injector | None) -> None:
        self.fm, self.spec, self.injector = fm, spec, injector
        self.run_id = side_run_id(run_id, spec.tag)
        self.reader = Reader(self.run_id)
        self.result: AsyncResult[Any] | None = None

    @property
    def tag(self) -> str:
        return self.spec.tag

    @property
    def docs(self) -> tuple[str, ...]:
        return tuple(self.spec.faults)

    @property
    def sent(self) -> bool:
        return self.result is not None

    def submit(self) -> None:
        self.submit_with(lambda doc_ids: self.fm.submit(doc_ids, self.run_id))

    def submit_with(self, send: Callable[[list[str]], AsyncResult[Any]]) -> None:
        doc_ids = store_documents(self.run_id, {doc: document_text(doc, fault) for doc, fault in self.spec.faults.items()})
        self.result = send(doc_ids)

    def ready(self) -> bool:
        return self.result is not None and self.result.ready()

    def pending(self, run: _Run) -> bool:
        """Still to wait for: sent and not finished, or not yet sent and to be sent (it comes after something,
        or its injector says the run must wait for it)."""
        if self.result is None:
            return bool(self.spec.after) or (self.injector is not None and self.injector.busy(run))
        return not self.result.ready()

    def observed(self) -> SideRun:
        docs = self.docs
        members, heads = _members(self.result, docs)
        found = NotifyClaim.of(self.fm.app, self.run_id, owner=None)
        claim = cast(str | None, found.r.get(found.key))
        return SideRun(
            tag=self.tag, run_id=self.run_id, docs=docs, submitted=self.result is not None,
            chord=Outcome.of(self.result) if self.result is not None else Outcome("NOT SENT", None, None, None),
            members=members, heads=heads,
            attempts=self.reader.attempts_of(docs),
            fetch_attempts=self.reader.attempts_of(docs, "fetch-attempts"),
            events=tuple(self.reader.events()), emails=tuple(self.reader.emails()), claim=claim)


class _Run:
    """The run, as its injectors see it (``lab.injector.RunView``)."""

    def __init__(self, fm: Fm, sc: Scenario, run_id: str, reader: Reader, sides: list[_SideChord]) -> None:
        self.fm, self.sc, self.run_id, self.reader, self.sides = fm, sc, run_id, reader, sides
        self.chord: AsyncResult[Any] | None = None

    @property
    def faults(self) -> Mapping[str, Fault | None]:
        return self.sc.faults

    def side(self, tag: str) -> _SideChord | None:
        return next((s for s in self.sides if s.tag == tag), None)


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
    injectors: Mapping[str, Injector] | None = None,
    early: tuple[str, StopCondition] | None = None,
) -> Observations:
    """Submit ``sc`` through ``fm.submit`` and observe it until it ends or ``timeout`` passes.

    ``watch`` is called at every look; it raises to end the run at once (the harness's
    watch on its worker and the services: a dead worker is not a slow scenario).
    ``sides``: submit the scenario's side chords too (a run without a stop condition then
    waits for them as well). ``injectors``: the scenario's fault injectors (``lab.injector``),
    by the names the scenario gives them, made for this run (a side chord whose injector is not
    among them is sent plainly); the runner starts them before the run's own chord, steps them at
    every look (while one pauses the run, only that one) and stops them at the end. The caller
    made them and prepared those that need its workers and services. ``early``: a verdict the run may reach
    before its chord ends (a symptom seen): the run then stops at once, else it ends as without it.
    """
    given = dict(injectors or {})
    driving = {side.injector for side in sc.sides if side.injector is not None}
    active = {name: inj for name, inj in given.items() if sides or name not in driving}  # no side chord, none of theirs
    reader = Reader(run_id)
    side_chords = [_SideChord(fm, side, run_id, active.get(side.injector) if side.injector else None)
                   for side in sc.sides] if sides else []
    run = _Run(fm, sc, run_id, reader, side_chords)
    own = [inj for name, inj in active.items() if name not in driving]  # the run's own chord's (a duplicate, a probe)
    reader.side_readers = {side.tag: side.reader for side in side_chords}
    try:
        return _run(fm, sc, run, list(active.values()), own, timeout, stop, probe_after, watch, early)
    finally:
        for inj in given.values():
            inj.stop()


def _run(fm: Fm, sc: Scenario, run: _Run, injectors: list[Injector], own: list[Injector], timeout: float,
         stop: tuple[str, StopCondition] | None, probe_after: bool, watch: Callable[[], None] | None,
         early: tuple[str, StopCondition] | None = None) -> Observations:
    reader, side_chords, run_id = run.reader, run.sides, run.run_id

    def send(side: _SideChord) -> None:
        if side.injector is not None:
            side.injector.send(run, side)
        else:
            side.submit()

    for side in side_chords:  # before the run's own chord, while the worker has room: an expired head is taken at once
        if not side.spec.after and (side.injector is None or side.injector.ready(run, side)):
            send(side)
    doc_ids = store_documents(run_id, {doc: document_text(doc, fault) for doc, fault in sc.faults.items()})
    for inj in injectors:
        inj.start(run)
    submitted_at = time.time()
    started = time.monotonic()
    body_result = fm.submit(doc_ids, run_id)
    run.chord = body_result
    reader.members = _member_results(body_result, sc.docs)

    def over(tag: str) -> bool:
        """``MAIN``: the run's own chord ended, its injectors rest and the sides sent with it are over; a tag: that side."""
        if tag == MAIN:
            return body_result.ready() and not any(inj.busy(run) for inj in own) \
                and not any(s.pending(run) for s in side_chords if not s.spec.after)
        side = run.side(tag)
        return side is None or (side.sent and not side.pending(run))

    def step() -> str | None:
        """One look at the run; returns why to stop, or None to go on."""
        pausing = [inj for inj in injectors if inj.paused()]
        for inj in pausing or injectors:  # while one pauses the run (a backend gone), only it acts
            inj.step(run)
        if any(inj.paused() for inj in injectors):
            return None  # every look at a result waits for the pause to end
        for side in side_chords:
            if not side.sent and all(over(tag) for tag in side.spec.after) \
                    and all(over(other.tag) for other in side_chords if side.tag in other.spec.before) \
                    and (side.injector is None or side.injector.ready(run, side)):
                send(side)
        if stop is not None:
            return stop[0] if stop[1](reader) else None
        if early is not None and early[1](reader):
            return early[0]
        if any(side.pending(run) for side in side_chords):
            return None
        if body_result.ready() and not any(inj.busy(run) for inj in injectors):
            return "chord finished"
        return None

    reasons: list[str] = []

    away = str(fm.app.conf.result_backend) != observations_url()  # a backend apart from the run's record (one that may go)

    def should_stop() -> bool:
        if watch is not None:
            watch()
        try:
            reason = step()
        except GONE:
            if not away:
                raise
            reason = None  # by hand: the result backend you stopped; the record says the rest (deadline holds)
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
    healthy = stop is None and stopped_by != "deadline" and (early is None or stopped_by != early[0])
    obs = Observations(
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
        duplicate=None,
        dlq_depth=dlq_depth(fm),
        probe_seconds=probe_seconds(fm, timeout=10.0) if probe_after and healthy else None,
        burst_probe=None,
        stopped_by=stopped_by,
        submitted_at=submitted_at,
        elapsed=time.monotonic() - started,
        members=_members(body_result, sc.docs)[0],
        sides={side.tag: side.observed() for side in side_chords},
        parked=dlq_depth(fm, parked=True),
    )
    added: dict[str, Any] = {k: v for inj in injectors for k, v in inj.observed().items()}
    return dataclasses.replace(obs, **added) if added else obs


def _member_results(body: AsyncResult[Any], docs: tuple[str, ...]) -> dict[str, AsyncResult[Any]]:
    header = cast(Any, body.parent)
    return dict(zip(docs, cast("list[AsyncResult[Any]]", list(header.results) if header is not None else [])))
