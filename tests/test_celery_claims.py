"""Runs that prove claims the docstrings make about Celery and RabbitMQ (real services).

One piece: the claims ``make matrix`` runs on every Celery version share their variants, workers and namespace
set-up.
"""

from __future__ import annotations

import gc
import json
import os
import signal
import time
import uuid
import warnings
from collections.abc import Callable
from typing import Any, cast

import pytest
from celery import chord, group
from celery.app.task import Context
from kombu import Connection, Exchange, Producer, Queue

from lab import harness, variants, workers
from lab.checks import overlaps
from lessons.fm8.checks import BACKEND_RETURN_SECONDS
from lab.faults import HARD_HANG, SLOW, SOFT_HANG, document_text
from lab.fm import Fm
from lab.harness import running_worker
from lab.observe import Reader, doc_id, short_doc
from lessons.fm8.outage import owned_backend
from lab.pipeline import store_document
from lab.queues import queue_depth
from lab.runner import StopCondition, _member_results, dlq_depth, new_run_id, run_scenario  # pyright: ignore[reportPrivateUsage]
from lab.records import Observations
from lessons import scenario
from lab.settings import broker_url
from lab.waiting import wait_until
from lab.versions import CELERY
from lab.workers import Worker
from shared import dlq
from shared.envelope import Result
from shared.manifest import ManifestMissing, read_manifest, write_manifest

pytestmark = pytest.mark.usefixtures("real_services")

HARD_TIMEOUT_LINE = "@hard_timeout(1.5, soft=1)  # FM-6: SIGALRM asks (SoftTimeLimitExceeded) at 1 s, raises HardTimeout at 1.5 s\n"


def run_variant(fm: Fm, n: int, label: str, stop: tuple[str, StopCondition] | None = None,
                sides: bool = False) -> Observations:
    """Scenario ``n`` on a variant's own worker, its namespace reset before and after."""
    harness.reset(fm)
    run_id = new_run_id()
    with running_worker(fm, run_id, label, grace=0.5):
        sc = scenario(n)
        obs = run_scenario(fm, sc, run_id, timeout=60, stop=stop, probe_after=False, sides=sides,
                           injectors=sc.injectors_by_hand())
    harness.reset(fm)
    return obs


@pytest.mark.claim("C1", "Celery's time_limit alone fails the chord (fm6)")
def test_celery_time_limit_alone_fails_the_chord() -> None:
    """docs/failure-modes.md (FM-6): without @hard_timeout the hard time limit breaks the chord."""
    fm = variants.derive("fm6_task_timeouts", "fm6t_backstop_only",
                         [(HARD_TIMEOUT_LINE, ""), ("@app.task(bind=True, time_limit=3, Request=BackstopRequest)  # FM-6: the backstop; its kill",
                                                      "@app.task(bind=True, time_limit=2)  # FM-6: the backstop; its kill")])
    assert fm.hard_timeout is None
    obs = run_variant(fm, 6, "variant-fm6-backstop-only")
    assert obs.chord.state == "FAILURE" and obs.chord.error_type == "ChordError"
    assert "TimeLimitExceeded" in (obs.chord.error or "")
    assert obs.notify_runs["chord"] == 0


def test_a_variant_edit_must_match_exactly_once() -> None:
    with pytest.raises(ValueError, match="occurs 0 times"):
        variants.derive("fm6_task_timeouts", "fm6t_nothing", [("no such line\n", "")])


def _publish_to_dlq(fm: Fm, body: Any, headers: dict[str, Any]) -> None:
    queue = fm.dead_letter_queue
    assert queue is not None and queue.exchange is not None
    with Connection(broker_url()) as conn:
        Producer(conn.default_channel).publish(
            json.dumps(body), exchange=queue.exchange, routing_key=queue.routing_key,
            content_type="application/json", content_encoding="utf-8", headers=headers,
        )


@pytest.mark.claim("C2", "the drain finalises a lone task, parks what is no task (fm3)")
def test_the_drain_finalises_a_lone_task_and_parks_what_it_cannot_place() -> None:
    """shared/dlq.py: a task message that leads to no chord member gets a dead_lettered envelope as its
    own result; a message that is no Celery task is parked, announced once, never back in the DLQ; the
    drain as it first stood (``bodies=False, park=False``) puts all of them back, pass after pass."""
    fm = harness.load("fm3")
    harness.reset(fm)
    assert fm.dead_letter_queue is not None
    kept: list[str] = []
    parked: list[str] = []

    def on_kept(sender: object = None, why: str = "", **_: object) -> None:
        kept.append(why)

    def on_parked(sender: object = None, why: str = "", **_: object) -> None:
        parked.append(why)

    def publish_three(tag: str) -> None:
        _publish_to_dlq(fm, [[], {}, {"chord": None}], {"id": f"{tag}-lone-task", "task": "fm3.parse_document"})
        _publish_to_dlq(fm, {"not": "a task message"}, {"id": f"{tag}-not-a-task"})
        _publish_to_dlq(fm, [[], {}, {"chain": [{"task": "x", "options": {}}]}], {"id": f"{tag}-chain-without-member"})

    dlq.dead_letter_kept.connect(on_kept, weak=False)
    dlq.dead_letter_parked.connect(on_parked, weak=False)
    try:
        publish_three("old")
        assert dlq.drain(fm.app, fm.dead_letter_queue, bodies=False, park=False) == 0
        assert dlq_depth(fm) == 3  # all three back in the DLQ, at its head
        assert dlq.drain(fm.app, fm.dead_letter_queue, bodies=False, park=False) == 0  # the next pass: same, quiet
        assert dlq_depth(fm) == 3 and len(kept) == 3
        harness.reset(fm)
        publish_three("new")
        assert dlq.drain(fm.app, fm.dead_letter_queue) == 2
        assert dlq_depth(fm) == 0 and dlq_depth(fm, parked=True) == 1
        for task_id in ("new-lone-task", "new-chain-without-member"):
            envelope = Result.from_wire(fm.app.AsyncResult(task_id).get(timeout=5))
            assert envelope.reason == "dead_lettered" and envelope.error is not None and "dead-lettered" in envelope.error
        assert dlq.drain(fm.app, fm.dead_letter_queue) == 0 and dlq_depth(fm, parked=True) == 1
    finally:
        dlq.dead_letter_kept.disconnect(on_kept)
        dlq.dead_letter_parked.disconnect(on_parked)
    assert parked == ["not a Celery task message"]
    harness.reset(fm)


@pytest.mark.claim("C13", "a backend gone stops the drain; nothing parked (fm3)")
def test_a_backend_that_does_not_answer_stops_the_pass_and_parks_nothing() -> None:
    """shared/dlq.py: only a backend that does not answer stops a pass; its letters stay in the DLQ,
    in their order, for the next pass, and none is parked as if it could never be placed."""
    fm = variants.derive("fm3_dlq_reconciliation", "fm3x_backend_gone", [
        ("app = lab_app(__name__)  # JSON only; queue, exchanges and result keys under the FM's namespace\n",
         "app = lab_app(__name__)\napp.conf.result_backend = 'redis://127.0.0.1:9/0'  # nothing listens there\n")])
    harness.reset(fm)
    assert fm.dead_letter_queue is not None
    try:
        death = {"queue": str(fm.task_queues[0].name), "reason": "delivery_limit", "count": 1,
                 "exchange": str(fm.task_queues[0].name), "routing-keys": [str(fm.task_queues[0].name)]}
        for n in range(3):
            _publish_to_dlq(fm, [[], {}, {"chord": None}], {"id": f"gone-{n}", "task": "fm3x.parse_document",
                                                           "x-death": [death]})
        assert dlq.drain(fm.app, fm.dead_letter_queue) == 0
        assert dlq_depth(fm) == 3 and dlq_depth(fm, parked=True) == 0
        # FM-7's send-back asks the backend for the letter's starts and ends first: no answer, the same
        assert dlq.drain(fm.app, fm.dead_letter_queue, send_back=True) == 0
        with Connection(broker_url()) as conn:
            assert dlq_depth(fm) == 3 and dlq_depth(fm, parked=True) == 0
            assert queue_depth(conn, str(fm.task_queues[0].name)) == 0  # none sent back
    finally:
        harness.reset(fm)


@pytest.mark.claim("C3", "the task queue declares its DLQ (fm3)")
def test_declaring_the_task_queue_declares_its_dead_letter_queue() -> None:
    """shared/dlq.py: a DeadLetteringQueue cannot be declared without its DLQ."""
    fm = harness.load("fm3")
    harness.reset(fm)
    dead = fm.dead_letter_queue
    assert dead is not None
    with Connection(broker_url()) as conn:
        channel = cast(Any, conn.default_channel)
        channel.queue_delete(queue=dead.name)
        fm.task_queues[0].bind(channel).declare()
        assert int(cast(Any, dead.bind(channel).queue_declare(passive=True)).message_count) == 0
    harness.reset(fm)


@pytest.mark.claim("C4", "reset replaces a queue of other arguments")
def test_reset_replaces_a_lab_queue_declared_with_other_arguments() -> None:
    """A queue left from an older lab version (classic, not quorum) would fail the
    worker's declare with PRECONDITION_FAILED; reset deletes and re-declares it."""
    fm = harness.load("fm3")
    name = str(fm.task_queues[0].name)
    with Connection(broker_url()) as conn:
        channel = cast(Any, conn.default_channel)
        channel.queue_delete(queue=name)
        Queue(name, Exchange(name, type="direct"), routing_key=name).bind(channel).declare()
    harness.reset(fm)
    with Connection(broker_url()) as conn:
        fm.task_queues[0].bind(conn.default_channel).declare()  # the worker's declare: no PRECONDITION_FAILED
    harness.reset(fm)


@pytest.mark.claim("C5", "task_retry_on_worker_lost: bounded, chord breaks (fm3)")
def test_task_retry_on_worker_lost_bounds_the_poison_loop_and_still_breaks_the_chord() -> None:
    """docs/failure-modes.md (FM-3): Celery 5.7's own bound for a lost worker (``task_retry_on_worker_lost``)
    stops the loop after ``max_retries`` and then marks the member FAILURE: ChordError.
    Celery 5.5 and 5.6 have no such setting (an unknown ``app.conf`` key is ignored, and the
    poison message loops as on fm2): not applicable there."""
    if CELERY < (5, 7):
        pytest.skip("no task_retry_on_worker_lost before Celery 5.7.0 (celery.app.defaults; "
                    "celery.worker.request.Request._retry_worker_lost): the setting is ignored, the loop goes on")
    fm = variants.derive("fm2_worker_crash", "fm2r_retry_on_worker_lost", [
        ("app.conf.task_reject_on_worker_lost = True", "app.conf.task_reject_on_worker_lost = True\n"
         "app.conf.task_retry_on_worker_lost = True  # Celery 5.7: retry a lost task, max_retries times"),
        ("@app.task(bind=True)\n@enveloped  # FM-1\ndef parse_document",
         "@app.task(bind=True, default_retry_delay=0)\n@enveloped  # FM-1\ndef parse_document"),
        ("@app.task(bind=True)\n@enveloped  # FM-1: every exit is a SUCCESS-state envelope\ndef fetch_document",
         "@app.task(bind=True, default_retry_delay=0)\n@enveloped  # FM-1: every exit is a SUCCESS-state envelope\n"
         "def fetch_document"),
    ])
    obs = run_variant(fm, 3, "variant-fm2-retry-on-worker-lost")
    assert obs.attempts["doc4"] == 4  # the first attempt and max_retries (3) retries
    assert obs.fetch_attempts["doc9"] == 4  # the same bound for the poison fetch
    assert obs.chord.state == "FAILURE" and obs.chord.error_type == "ChordError"
    assert "WorkerLostError" in (obs.chord.error or "")
    assert obs.notify_runs["chord"] == 0


# ---- FM-4's hard variant: the claim's owner dies ----------------------------------------


# fm4's claim as it first stood (``lessons/fm4/before_hard_fix.py``), as edits of fm4's file for the variants below
_FM4_RESUME_AND_BUDGET = (
    "    claim = NotifyClaim.of(app, pipeline_id, owner=self.request.id)  # FM-4: SET NX; the owner's redelivery resumes it\n"
    "    if (state := claim.acquire()) == \"busy\":  # FM-4: another notify is sending; it may still fail\n"
    "        raise BUSY.retry(self, ClaimBusy(pipeline_id), claim.policy.poll)  # FM-4: ask again later; outlast the claim's TTL\n",
    "    claim = NotifyClaim.of(app, pipeline_id, owner=self.request.id, policy=ClaimPolicy(resume=False))\n"
    "    if (state := claim.acquire()) == \"busy\":\n"
    "        raise self.retry(countdown=0.05, max_retries=400)\n",
)
_FM4_IMPORT = ("from shared.claim import ClaimBusy, NotifyClaim, busy_waits, release_when_dead_lettered\n",
           "from shared.claim import ClaimBusy, ClaimPolicy, NotifyClaim, busy_waits, release_when_dead_lettered\n")
_FM4_NO_KEY = ("send_email(pipeline_id, summary, idempotency_key=claim.key)  # FM-4: the mail API delivers a key once",
           "send_email(pipeline_id, summary)")


def _fm4_variant(name: str, edits: list[tuple[str, str]]) -> Fm:
    return variants.derive("fm4_duplicated_runs", name, edits)


@pytest.mark.claim("C12", "a dead-lettered notify keeps its claim unless released (fm4)")
def test_without_the_release_a_dead_lettered_notify_keeps_its_claim() -> None:
    """docs/failure-modes.md (FM-4): the poison body (side chord "body") dies holding its claim; without
    ``release_when_dead_lettered`` the claim is still ``claimed`` once the drain has finalised it."""
    fm = _fm4_variant("fm4r_no_release", [
        ("release_when_dead_lettered(app, notify)  # FM-4: a notify the drain finalised as dead-lettered releases its claim\n", "")])
    obs = run_variant(fm, 3, "variant-fm4-no-release", sides=True)
    body = obs.sides["body"]
    env = body.chord.envelope
    assert env is not None and env.reason == "dead_lettered"  # finalised by the drain, as on fm4
    assert body.claim is not None and body.claim.startswith("claimed:")


@pytest.mark.claim("C6", "a busy budget under the claim TTL: no email (fm4)")
def test_a_busy_retry_budget_shorter_than_the_claim_ttl_sends_no_email() -> None:
    """shared/claim.py: the owner killed before sending, its redelivery busy on its own claim,
    and a budget (20 x 50 ms) that ends long before the claim's 60 s TTL: no email at all, and
    the chord still reports SUCCESS, with notify's MaxRetriesExceededError in the envelope."""
    resume, budget = _FM4_RESUME_AND_BUDGET
    fm = _fm4_variant("fm4b_short_budget", [_FM4_IMPORT, (resume, budget.replace("max_retries=400", "max_retries=20"))])
    obs = run_variant(fm, 4, "variant-fm4-short-budget")
    assert obs.emails == () and obs.mail_calls == 0
    env = obs.chord.envelope
    assert obs.chord.state == "SUCCESS" and env is not None and not env.ok
    assert "MaxRetriesExceededError" in (env.error or "")


@pytest.mark.claim("C7", "a waiting notify takes over an expired claim (fm4)")
def test_a_waiting_notify_takes_over_once_a_dead_owners_claim_expires() -> None:
    """shared/claim.py: the busy-retry budget outlasts the claim's TTL, so when the owner dies
    and never comes back (here: nothing requeues a lost task), the duplicate sends once the
    claim has expired. A 2 s TTL stands for the 60 s one; the chord's own notify, lost,
    is stored FAILURE by Celery, and the duplicate's email is the pipeline's one."""
    fm = _fm4_variant("fm4t_owner_gone", [
        _FM4_IMPORT,
        ("@app.task(bind=True)\n@enveloped  # FM-1\ndef notify",  # notify alone: a lost notify is not requeued
         "@app.task(bind=True, reject_on_worker_lost=False)\n@enveloped  # FM-1\ndef notify"),
        ("NotifyClaim.of(app, pipeline_id, owner=self.request.id)",
         "NotifyClaim.of(app, pipeline_id, owner=self.request.id, policy=ClaimPolicy(claim_ttl=2))"),
    ])
    obs = run_variant(fm, 4, "variant-fm4-owner-gone", stop=("the email is out", lambda r: r.has_event("email")))
    assert [e.get("when") for e in obs.events if e.kind == "crash"][:1] == ["before_send"]
    claimed_by = next(e.t for e in obs.events if e.kind == "notify_start" and e.get("role") == "chord")
    emails = [e for e in obs.events if e.kind == "email"]
    assert len(obs.emails) == 1 and [e.get("role") for e in emails] == ["duplicate"]
    assert emails[0].t - claimed_by >= 2.0  # not before the claim (taken after this start) expired
    assert obs.notify_runs["chord"] == 1  # the owner was never delivered again


@pytest.mark.claim("C8", "no idempotency key: two emails (fm4)")
def test_without_the_idempotency_key_the_owner_killed_after_sending_sends_twice() -> None:
    """docs/failure-modes.md (FM-4): the claim cannot stop the resend of an owner that died after sending;
    the mail API's idempotency key does (G4: 2 calls, 1 email)."""
    fm = _fm4_variant("fm4k_no_key", [_FM4_NO_KEY])
    obs = run_variant(fm, 4, "variant-fm4-no-key")
    assert obs.mail_calls == 2 and len(obs.emails) == 2
    assert [e.get("when") for e in obs.events if e.kind == "crash"] == ["before_send", "after_send"]


# ---- FM-3: deliveries are not attempts --------------------------------------------------


@pytest.mark.claim("C9", "a whole-worker kill costs every held message a delivery (fm3)")
def test_a_whole_worker_kill_charges_a_delivery_to_every_message_it_held() -> None:
    """shared/dlq.py: a worker killed whole returns every message it held, started or only
    prefetched, and RabbitMQ counts each return. Eight members that each sleep 2 s, two pool
    processes, a prefetch of eight: three kills dead-letter all eight, though only two ran
    per round; the envelope tells deliveries from starts."""
    fm = harness.load("fm3")
    harness.reset(fm)
    run_id = new_run_id()
    bound = fm.delivery_bound
    assert bound == 3
    docs = [f"hang{i}" for i in range(1, 9)]
    fetched = [Result[Any].success({"doc": store_document(run_id, d, document_text(d, SOFT_HANG)), "text":
                                    document_text(d, SOFT_HANG)}, 1).to_wire() for d in docs]
    reader = Reader(run_id)
    header = group(fm.parse_document.s(f) for f in fetched)
    write_manifest(fm.app, run_id, [doc_id(run_id, d) for d in docs])
    result = chord(header)(fm.notify.s(run_id))

    members = [str(r.id) for r in cast(Any, result.parent).results]

    def started() -> int:  # what the drain will report: count_starts, per task id
        return sum(dlq.starts_of(fm.app, m) for m in members)

    for round_ in range(1, bound + 1):
        worker = Worker(fm, run_id, harness.LOG_DIR / f"variant-fm3-killed-whole-{run_id}-{round_}.log")
        worker.start()
        try:
            assert wait_until(lambda: started() >= 2 * round_, 30), f"round {round_}: two slots never started"
        finally:
            assert worker.proc is not None
            workers.signal_group(worker.proc.pid, signal.SIGKILL)  # the whole worker: main process, pool, beat
            worker.proc.wait(10)
    assert started() == 2 * bound
    with running_worker(fm, run_id, "variant-fm3-after-kills", grace=0.5):  # its beat drains the DLQ
        summary = result.get(timeout=30)
    payload = cast(dict[str, list[dict[str, str]]], Result.from_wire(summary).payload)
    failed = {short_doc(f["doc"]): f for f in payload["failed"]}
    assert set(failed) == set(docs)
    starts = {d: dlq.starts_of(fm.app, m) for d, m in zip(docs, members)}
    assert starts == {d: reader.attempts(d) for d in docs}  # the lab's own count agrees
    for d in docs:
        assert failed[d]["reason"] == "dead_lettered"
        assert failed[d]["error"] == (f"parse_document dead-lettered by the broker (delivery_limit) after {bound} "
                                      f"deliveries, {starts[d]} started")
    assert sum(starts.values()) == 2 * bound and sum(1 for n in starts.values() if n == 0) >= len(docs) - 2 * bound
    harness.reset(fm)


@pytest.mark.claim("C10", "Reject(requeue=False) fails the chord (envelope)")
def test_reject_without_requeue_passes_the_envelope_and_fails_the_chord(limit: Callable[[str], None]) -> None:
    """shared/envelope.py: ``Reject`` passes through ``@enveloped`` (a control-flow exception),
    and Celery 5.7's ``Request.on_failure`` stores FAILURE for ``Reject(requeue=False)``: ChordError.
    Celery 5.5 and 5.6 only reject the message (``Request.on_failure``: ``self.reject(requeue=False)``,
    no result stored): the member never reports and the chord never completes, no error either.
    Both are watched for 2 s after the last member started, on every version."""
    fm = variants.derive("fm1_mid_pipeline_error", "fm1j_reject", [
        ("    lab_fault(self, document)  # the lab: what the scenario does to this document\n",
         "    raise Reject(\"beyond repair\", requeue=False)  # every document: the worker drops its message\n"),
        ("from celery import Task, chain, chord, group\n", "from celery import Task, chain, chord, group\nfrom celery.exceptions import Reject\n"),
    ])
    docs = scenario(1).docs
    all_started: list[float] = []

    def settled(reader: Reader) -> bool:  # every member started once, and 2 s have passed since
        if not all_started and all(reader.attempts(d) >= 1 for d in docs):
            all_started.append(time.monotonic())
        return bool(all_started) and time.monotonic() - all_started[0] >= 2.0

    obs = run_variant(fm, 1, "variant-fm1-reject", stop=("2 s after every member started", settled))
    assert all(obs.attempts[d] == 1 for d in docs)  # a rejected message is not delivered again
    assert obs.notify_runs["chord"] == 0
    if CELERY < (5, 7):
        assert obs.chord.state == "PENDING", obs.chord
        limit("before 5.7: celery.worker.request.Request.on_failure only rejects a Reject(requeue=False) and "
              "stores nothing: the chord stays PENDING, no error (5.7.0 stores FAILURE)")
        return
    assert obs.chord.state == "FAILURE" and obs.chord.error_type == "ChordError"
    assert "reject requeue=False: beyond repair" in (obs.chord.error or "")


# ---- the chord's join: a member that reports twice ------------------------------------------


def _take_body(fm: Fm, deadline: float = 5.0) -> list[Any]:
    """The chord body's message in ``fm``'s task queue (no worker consumes it): its args[0], the header's results."""
    got: list[Any] = []
    with Connection(broker_url()) as conn:
        channel = cast(Any, conn.default_channel)

        def take() -> bool:
            message = channel.basic_get(queue=str(fm.task_queues[0].name), no_ack=True)
            if message is not None:
                got.append(json.loads(message.body)[0][0])
            return bool(got)

        assert wait_until(take, deadline), "the chord body was never sent"
    return cast(list[Any], got[0])


@pytest.mark.claim("C11", "a member that reports twice counts once (join)")
def test_a_chord_member_that_reports_twice_counts_once(limit: Callable[[str], None]) -> None:
    """shared/timeouts.py: a header member may report twice (a rerun after its result was stored,
    a finaliser that runs again with another envelope). Celery 5.7's Redis backend counts it once:
    ``RedisBackend.on_chord_part_return`` runs ``CHORD_PART_RETURN_LUA``, which records a result
    only for a task id and group index it has not seen. Celery 5.5 and 5.6 ``ZADD`` the encoded
    result to the join's sorted set, so a second, different result is one more member: the body
    is sent one member short, with the first member twice."""
    fm = harness.load("fm2")
    harness.reset(fm)
    backend = cast(Any, fm.app.backend)
    group_id, body = str(uuid.uuid4()), fm.notify.s("twice")  # never run: no worker consumes
    members = [Context(id=str(uuid.uuid4()), group=group_id, group_index=i, chord=body) for i in range(2)]
    backend.set_chord_size(group_id, 2)
    size_key = backend.get_key_for_group(group_id, ".s")
    first = Result[Any].failure("killed after its result was stored", "error", 1).to_wire()
    again = Result[Any].success({"doc": "a"}, 2).to_wire()
    other = Result[Any].success({"doc": "b"}, 1).to_wire()
    backend.mark_as_done(members[0].id, first, request=members[0])
    backend.mark_as_done(members[0].id, again, request=members[0])  # the same member, reported again
    if CELERY < (5, 7):
        assert not backend.client.exists(size_key)  # counted 2 of 2: the chord is done, its keys gone
        assert sorted(_take_body(fm), key=lambda r: r["attempts"]) == [first, again]  # member 1 never joined
        limit("before 5.7: celery.backends.redis.RedisBackend.on_chord_part_return ZADDs the encoded result: a "
              "member's second, different result counts again, the body goes one member short")
    else:
        assert backend.client.exists(size_key)  # counted 1 of 2: still waiting for member 1
        backend.mark_as_done(members[1].id, other, request=members[1])
        assert _take_body(fm) == [first, other]
    harness.reset(fm)


# ---- the chord's bytes: linear in N with the manifest ----------------------------------------


@pytest.mark.claim("C14", "every member's message carries the chord body (manifest)")
def test_every_members_message_carries_the_body_so_the_ids_go_in_the_manifest() -> None:
    """shared/manifest.py: Celery sends the chord body's signature inside every header task's message
    (``celery.canvas._chord.run``, ``group._freeze_group_tasks(chord=body)``): with every document id in
    the body's arguments a member's message grows with N (the chord's bytes as N squared); with the ids in
    the manifest it stays one size. Measured on the first member's message, no worker consuming."""
    fm = harness.load("fm1")

    def first_message_bytes(n: int, ids_in_body: bool) -> int:
        harness.reset(fm)
        pipeline = f"bytes-{n}-{ids_in_body}"
        ids = [doc_id(pipeline, f"doc{i}") for i in range(n)]
        header = group(fm.parse_document.s({"doc": d, "text": ""}) for d in ids)
        body = fm.notify.s(ids, pipeline) if ids_in_body else fm.notify.s(pipeline)  # the first: as before the fix
        chord(header)(body)
        with Connection(broker_url()) as conn:
            message = cast(Any, conn.default_channel).basic_get(queue=str(fm.task_queues[0].name), no_ack=True)
        assert message is not None, "the chord's members were never sent"
        return len(message.body) + len(json.dumps(message.headers))

    try:
        small, large = first_message_bytes(10, False), first_message_bytes(1000, False)
        assert abs(large - small) <= 8, (small, large)  # the member's own id is a few digits longer, no more
        before_small, before_large = first_message_bytes(10, True), first_message_bytes(1000, True)
        assert before_large - before_small >= 990 * len(doc_id("bytes-1000-True", "doc0")), (before_small, before_large)
    finally:
        harness.reset(fm)


# ---- FM-7's hard variant: broker heartbeats during a warm shutdown ------------------------------

_FM7_WARM = [
    ('WORKER_ENV = {"REMAP_SIGTERM": "SIGQUIT"}  # FM-7: SIGTERM starts the soft/cold shutdown (Celery reads it at start only)\n',
     "app.conf.broker_heartbeat = 1  # a heartbeat a second: RabbitMQ closes a silent connection after two missed\n"),
    ("@app.task(bind=True, time_limit=3, Request=BackstopRequest)  # FM-6: the backstop; its kill is still an envelope\n",
     "@app.task(bind=True, time_limit=15, Request=BackstopRequest)  # FM-6: the backstop; its kill is still an envelope\n"),
    ("@hard_timeout(1.5, soft=1)  # FM-6: SIGALRM asks (SoftTimeLimitExceeded) at 1 s, raises HardTimeout at 1.5 s\n",
     "@hard_timeout(6, soft=5)  # a body longer than two heartbeats\n"),
]
"""fm7 with SIGTERM as Celery's warm shutdown (no REMAP_SIGTERM), a broker heartbeat of 1 s and a parse deadline of 6 s."""


@pytest.mark.claim("C15", "warm shutdown stops heartbeats: the running task runs twice at once (fm7)")
def test_a_warm_shutdown_longer_than_two_heartbeats_has_the_running_task_run_twice_at_once(
        limit: Callable[[str], None]) -> None:
    """docs/failure-modes.md (FM-7) (the hard variant, celery#5998): during a warm shutdown Celery 5.5 stops firing its
    hub's timers, so py-amqp sends no heartbeat; RabbitMQ closes the connection after two missed ones and
    requeues the message of the body still running, and the new worker starts it too. From 5.6.1
    ``celery.concurrency.prefork.TaskPool.on_stop`` keeps firing the hub's timers (heartbeats included)
    while the pool drains: one attempt only, acknowledged when it ends."""
    fm = variants.derive("fm7_rolling_deploys", "fm7t_warm_heartbeat", _FM7_WARM)
    assert not fm.worker_env and fm.app.conf.broker_heartbeat == 1
    harness.reset(fm)
    run_id = new_run_id()
    doc = store_document(run_id, "doc8", document_text("doc8", HARD_HANG))  # hangs until the 6 s deadline
    reader = Reader(run_id)
    new = Worker(fm, run_id, workers.LOG_DIR / f"variant-fm7-heartbeat-new-{run_id}.log", part="new")
    try:
        with running_worker(fm, run_id, "variant-fm7-heartbeat-old", grace=10.0) as old:
            new.start()
            new.wait_ready()  # its probe may be taken by either worker: both serve the queue
            result = fm.submit([doc], run_id)
            assert wait_until(lambda: reader.attempts("doc8") >= 1, 30)
            assert old.proc is not None and new.proc is not None
            holder = next(e.get("pid") for e in reader.events() if e.kind == "received")
            first, second = (old, new) if holder == str(old.proc.pid) else (new, old)
            assert first.proc is not None
            first.proc.send_signal(signal.SIGTERM)  # the deploy: SIGTERM of the worker that runs doc8, its main process only
            gone = first.proc

            def settled() -> bool:
                """The old worker has exited and every delivery of doc8 a worker took has started its body (a
                redelivery after the connection closed is taken before the old worker's body ends, 6 s in)."""
                events = reader.events()
                taken = sum(1 for e in events if e.kind == "received")
                return gone.poll() is not None and taken <= sum(1 for e in events if e.kind == "attempt_start")

            wait_until(lambda: reader.attempts("doc8") >= 2 or settled(), 20)
            starts = [e for e in reader.events() if e.kind == "attempt_start"]
            ends = [e for e in reader.events() if e.kind == "attempt_end"]
            seen = f"starts {starts}, ends {ends}\nold worker:\n{first.tail()}\nnew worker:\n{second.tail()}"
            if CELERY < (5, 6):
                assert len(starts) == 2 and (not ends or ends[0].t > starts[1].t), seen
            else:
                limit("from 5.6.1 celery.concurrency.prefork.TaskPool.on_stop fires the hub's timers (py-amqp's "
                      "heartbeats) while the pool drains: RabbitMQ keeps the connection, doc8 runs once")
                assert len(starts) == 1 and len(ends) == 1, seen
            assert second.alive
            result.forget()
    finally:
        new.stop(grace=0.5)
        harness.reset(fm)


# ---- FM-7's drain: a document cut by three deploys in a row is innocent -------------------------

_FM7_NO_SEND_BACK = [("    return drain(app, DLQ, send_back=True)  # FM-7: a letter whose deliveries were not its own attempts goes back\n",
                      "    return drain(app, DLQ)\n")]


DEPLOY_GRACE = 15.0
"""How long ``_deploy_away`` waits for a worker sent SIGTERM to exit before it SIGKILLs it."""


def _group_stacks(pgid: int) -> str:
    """Each live process of group ``pgid``: its /proc state and, when py-spy is installed, its Python stacks
    (what a worker that does not exit is waiting on)."""
    import shutil
    import subprocess
    import sys
    from pathlib import Path
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    lines: list[str] = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or workers._after_comm((entry / "stat").read_text())[2] != str(pgid):  # pyright: ignore[reportPrivateUsage]
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            lines.append(f"pid {entry.name}: {cmdline[:120]}")
            lines.append(f"  state {workers._after_comm((entry / 'stat').read_text())[0]}, wchan {(entry / 'wchan').read_text()}")  # pyright: ignore[reportPrivateUsage]
        except OSError:
            continue
        if Path(spy).exists():
            out = subprocess.run([spy, "dump", "--pid", entry.name], capture_output=True, text=True, timeout=20)
            lines.append(out.stdout + out.stderr)
    return "\n".join(lines)


def _deploy_away(fm: Fm, run_id: str, label: str, running: Callable[[], bool]) -> bool:
    """A worker of ``fm`` that serves until ``running()``, then gets SIGTERM (its main process: REMAP_SIGTERM
    makes it the soft, then cold shutdown); no other worker runs meanwhile. It exits in about 2 s; one that has
    not after ``DEPLOY_GRACE`` is SIGKILLed, as a deploy's grace ends, and the run warns with what each of its
    processes waited on (its log and stacks in a ``-stuck.txt`` beside its log): the callers' assertions on
    what the body recorded decide the claim, a slow exit alone does not. True when the worker exited by itself;
    False too when the body never started on it (a ``-nostart.txt``, with the queue's depth)."""
    worker = Worker(fm, run_id, workers.LOG_DIR / f"{label}-{run_id}.log", part=label.rsplit("-", 1)[-1])
    worker.start()
    try:
        worker.wait_ready()
        if not wait_until(running, 30):
            # the deploy before let its body run to its end (a cancel that missed it, or a hung cold shutdown): the
            # chord is done and nothing comes. Kept, with the queue, and the deploys go once more.
            with Connection(broker_url()) as conn:
                depth = queue_depth(conn, str(fm.task_queues[0].name))
            stuck = workers.LOG_DIR / f"{label}-{run_id}-nostart.txt"
            stuck.write_text(f"messages ready in the queue: {depth}\nthis worker's log:\n{worker.tail(80)}\n"
                             f"the run's logs: {sorted(p.name for p in workers.LOG_DIR.glob(f'*{run_id}*'))}\n")
            warnings.warn(f"{label}: the body never started on this worker within 30 s; its log and the queue: "
                          f"{stuck}", stacklevel=2)
            return False
        proc = worker.proc
        assert proc is not None
        proc.send_signal(signal.SIGTERM)
        if not wait_until(lambda: proc.poll() is not None, DEPLOY_GRACE):
            stuck = workers.LOG_DIR / f"{label}-{run_id}-stuck.txt"
            stuck.write_text(f"log:\n{worker.tail(80)}\nprocesses:\n{_group_stacks(proc.pid)}\n")
            warnings.warn(f"{label}: the worker had not exited {DEPLOY_GRACE:.0f} s after SIGTERM and is "
                          f"SIGKILLed as a deploy's grace ends; its log and stacks: {stuck}", stacklevel=2)
            return False
        return True
    finally:
        worker.stop(grace=0.5)


def accepted(reader: Reader, doc: str = "doc34") -> int:
    """How many of ``doc``'s runs the worker's main process read as begun (``lab.observe``'s ``accepted``): only those
    are in ``active_requests``, which a cold shutdown cancels. A SIGTERM sent at the body's own start instead met, in
    CI on 5.5.3, a run begun 12 ms before it and not yet read: the cancel missed it, and it ran to its end ok."""
    return sum(1 for e in reader.events() if e.kind == "accepted" and e.get("doc") == doc)


def _cut_three_times(fm: Fm, label: str) -> tuple[Reader, Any]:
    """One slow document, and three workers one after the other, each sent SIGTERM (REMAP_SIGTERM: the soft,
    then cold shutdown) while its body runs: three deliveries, three starts, three cuts. A fourth worker then
    serves (its beat drains the DLQ). Returns the run's reader and the chord's result once it is ready."""
    from lab.faults import SLOW
    for attempt in (1, 2):
        harness.reset(fm)
        run_id = new_run_id()
        doc = store_document(run_id, "doc34", document_text("doc34", SLOW))
        reader = Reader(run_id)
        result = fm.submit([doc], run_id)
        if all(_deploy_away(fm, run_id, f"{label}-{attempt}-{n}", lambda: accepted(reader) >= n) for n in (1, 2, 3)):
            break
        # a cold shutdown hung or aborted in Celery's signal handler (see C17; lab/hand.py says how, on 5.6.3 and
        # 5.7.0): that deploy cancelled nothing, so the body it met ran to its end, and this run shows three deploys
        # no more; once more
        result.forget()
    else:
        raise AssertionError("a deploy hung in Celery's cold shutdown, or its body never started, in both tries "
                             "(see the warnings' -stuck.txt and -nostart.txt files)")
    assert dlq.ends_of(fm.app, next(e.get("task") for e in reader.events() if e.kind == "attempt_start")) == 3
    # Each cut ends in SystemExit; task_postrun then reports the state Celery held before the body: None for
    # the first delivery, and for a redelivery the stored state worker_deduplicate_successful_tasks read.
    # On 5.5 the cancel also stores RETRY for the cut (lab.observe.Observer.retry), and that is what the
    # next delivery's deduplication check reads.
    stored = "RETRY" if CELERY < (5, 6) else "PENDING"
    cuts = [(e.get("outcome"), e.get("state")) for e in reader.events() if e.kind == "attempt_end"]
    assert cuts == [("cancelled", "None"), ("cancelled", stored), ("cancelled", stored)], cuts
    assert not any(e.kind == "retry" for e in reader.events()), "a cut is no retry"
    with running_worker(fm, run_id, f"{label}-4", grace=0.5):
        assert wait_until(lambda: result.ready(), 30), "the chord never completed"
    return reader, result


@pytest.mark.claim("C16", "a document cut by three deploys is dead-lettered unless the drain sends it back (fm7)")
def test_a_document_cut_by_three_deploys_is_dead_lettered_unless_the_drain_sends_it_back() -> None:
    """docs/failure-modes.md (FM-7): each body a deploy cuts (Celery 5.5+'s cold shutdown, ``SystemExit`` in the body) is
    one more delivery, and RabbitMQ 3.x dead-letters the message at its third (``x-delivery-limit: 2``) though
    it never failed. fm7's drain counts the bodies that ended (``count_starts``: ``task_postrun``, which a crash
    never sends) and sends a letter whose crashes are below the bound back to its queue: the document ends ok on
    its fourth start. Without ``send_back`` it is finalised ``dead_lettered`` after 3 deliveries, 3 started.
    Also shown: a cut redelivery's ``task_postrun`` carries the stored state, not None
    (``celery.app.trace.build_tracer``'s deduplication check assigns it to the variable the signal reports):
    PENDING, or on 5.5 RETRY, which 5.5's cancel stores (and announces as a retry) for every cut."""
    weak_fm = variants.derive("fm7_rolling_deploys", "fm7t_no_send_back", _FM7_NO_SEND_BACK)
    try:
        reader, result = _cut_three_times(weak_fm, "variant-fm7-no-send-back")
        failed = cast(Any, Result[Any].from_wire(result.get(timeout=5)).payload)["failed"]
        assert [(f["doc"], f["reason"]) for f in failed] == [("doc34", "dead_lettered")], failed
        assert "after 3 deliveries, 3 started, 3 ended in a live process" in failed[0]["error"], failed
        assert not any(e.kind == "sent_back" for e in reader.events())
        result.forget()
    finally:
        harness.reset(weak_fm)
    fm = harness.load("fm7")
    try:
        reader, result = _cut_three_times(fm, "variant-fm7-send-back")
        payload = cast(Any, Result[Any].from_wire(result.get(timeout=5)).payload)
        assert [short_doc(str(d)) for d in payload["ok"]] == ["doc34"] and payload["failed"] == [], payload
        assert reader.attempts("doc34") == 4
        assert [e.get("doc") for e in reader.events() if e.kind == "sent_back"] == ["doc34"]
        assert not any(e.kind == "dead_lettered" for e in reader.events())
        result.forget()
    finally:
        harness.reset(fm)


@pytest.mark.claim("C17", "a deploy that cuts notify while it sends: the claim is released, one email (fm7)")
def test_a_deploy_that_cuts_notify_while_it_holds_the_claim_ends_in_one_email() -> None:
    """docs/failure-modes.md (FM-7): the chord body as a deploy's victim. ``notify`` waits inside ``claim.sending()`` (the
    mail API held by the lab's gate) when its worker gets SIGTERM: the cold shutdown ends it in ``SystemExit``,
    which ``sending()`` lets through after releasing the claim, and the message goes back. The next worker's
    ``notify`` takes the claim and sends once the gate opens: one email, ``sent=True``, the chord SUCCESS."""
    fm = harness.load("fm7")
    for attempt in (1, 2):
        harness.reset(fm)
        run_id = new_run_id()
        reader = Reader(run_id)
        reader.rec.put("gated", "1")  # the mail API waits until the runner opens the gate (FM-4's interleaving)
        result = fm.submit([store_document(run_id, "doc2", document_text("doc2", None))], run_id)
        if _deploy_away(fm, run_id, f"variant-fm7-notify-cut-{attempt}", lambda: reader.has_event("gate_wait")):
            break
        # Celery's cold shutdown hung in its signal handler (lab/hand.py says two ways: a 5.6.3 matrix run, its main
        # process asleep on a lock after "Initiating Soft Shutdown"): nothing cancelled notify, which ran on to its
        # soft limit and stored its envelope, so its redelivery is deduplicated. Not this claim: once more.
        result.forget()
    else:
        raise AssertionError("both deploys hung in Celery's cold shutdown (see the warnings' -stuck.txt files)")
    try:
        assert reader.emails() == []  # the cut notify had not sent
        with running_worker(fm, run_id, "variant-fm7-notify-cut-next", grace=0.5):
            assert wait_until(lambda: sum(1 for e in reader.events() if e.kind == "gate_wait") >= 2, 30)
            reader.rec.open_gate()
            assert wait_until(lambda: result.ready(), 30), "the chord never completed"
        ends = [e.get("outcome") for e in reader.events() if e.kind == "notify_end"]
        assert ends == ["cancelled", "ok"], ends
        payload = cast(Any, Result[Any].from_wire(result.get(timeout=5)).payload)
        assert payload["sent"] is True and [short_doc(str(d)) for d in payload["ok"]] == ["doc2"], payload
        assert len(reader.emails()) == 1
        result.forget()
    finally:
        harness.reset(fm)


@pytest.mark.claim("C18", "an idle worker needs Celery's pool stop, over the lab's grace, to exit (fm7)")
def test_an_idle_worker_exits_only_after_celerys_pool_stop() -> None:
    """docs/failure-modes.md (FM-7) and G7: why an old worker is still there when the lab's grace (0.5 s) ends though no body
    of it runs. An idle fm7 worker (REMAP_SIGTERM: the cold shutdown; nothing to wait for, nothing to cancel) is
    sent SIGTERM, and exits only after Celery's pool stop: ``TaskPool.on_stop`` joins billiard's pool, each of
    whose processes, told to stop, announces its death to the pool and then sleeps 1 s before it exits
    (``billiard.pool.Worker._do_exit``, billiard 4.3.2 under all three), and from 5.6.1 it also joins the timer
    thread it starts to keep heartbeats going, which sleeps 0.5 s between passes: the join waits out the pass it is in,
    0 to 0.5 s more (a 5.6 run exited after 1.33 s). So at least 1 s under all three: no grace below that lets a
    worker exit by itself, and a production grace must add it to the soft timeout and a body."""
    from lessons.fm7.deploy import GRACE_SECONDS
    fm = harness.load("fm7")
    assert dict(fm.worker_env) == {"REMAP_SIGTERM": "SIGQUIT"}
    floor = 1.0
    assert GRACE_SECONDS < floor
    harness.reset(fm)
    for n in (1, 2):  # twice: the floor is no accident of one run's timing
        worker = Worker(fm, new_run_id(), workers.LOG_DIR / f"variant-fm7-idle-stop-{n}.log", part=f"idle{n}")
        worker.start()
        try:
            worker.wait_ready()
            assert worker.proc is not None
            proc = worker.proc
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            assert wait_until(lambda: proc.poll() is not None, 15, interval=0.005), "the worker did not exit"
            exited = time.monotonic() - sent
            assert exited >= floor, f"exited after {exited:.3f}s (expected >= {floor}s)"
        finally:
            worker.stop(grace=0.5)
    harness.reset(fm)


_FM7_PREFETCH = ("app.conf.worker_prefetch_multiplier = 1  # FM-7: a worker holds (nearly) only what it runs; a deploy "
                 "returns few unstarted\n", "")


def _three_deploys_of_eight(fm: Fm, label: str) -> dict[str, tuple[int, str]]:
    """Eight chord members that each hang (``HARD_HANG``: 1.5 s to fm7's hard timeout), two pool processes, and
    three workers one after the other, each sent SIGTERM (the soft, then cold shutdown) once two more bodies
    started: two cut per deploy. A fourth worker then serves (its beat drains the DLQ). Returns, per document,
    its starts and how the chord's summary ended it."""
    harness.reset(fm)
    run_id = new_run_id()
    docs = [f"doc{i}" for i in range(40, 48)]
    fetched = [Result[Any].success({"doc": store_document(run_id, d, document_text(d, HARD_HANG)), "text":
                                    document_text(d, HARD_HANG)}, 1).to_wire() for d in docs]
    write_manifest(fm.app, run_id, [doc_id(run_id, d) for d in docs])
    result = chord(group(fm.parse_document.s(f) for f in fetched))(fm.notify.s(run_id))
    members = [str(r.id) for r in cast(Any, result.parent).results]

    def started() -> int:
        return sum(dlq.starts_of(fm.app, m) for m in members)

    for n in (1, 2, 3):  # not _deploy_away: its readiness probe would wait behind a full prefetch (FM-5)
        worker = Worker(fm, run_id, workers.LOG_DIR / f"{label}-{n}-{run_id}.log", part=f"d{n}")
        worker.start()
        try:
            assert wait_until(lambda: started() >= 2 * n, 30), f"deploy {n}: two bodies never started"
            assert worker.proc is not None
            worker.proc.send_signal(signal.SIGTERM)
            assert wait_until(lambda: worker.proc is None or worker.proc.poll() is not None, 15), "it did not exit"
        finally:
            worker.stop(grace=0.5)
    assert started() == 6, started()
    with running_worker(fm, run_id, f"{label}-4", grace=0.5):
        summary = result.get(timeout=60)
    payload = cast(dict[str, list[Any]], Result[Any].from_wire(summary).payload)
    ended = {short_doc(str(d)): "ok" for d in payload["ok"]} | {short_doc(f["doc"]): f["reason"] for f in payload["failed"]}
    out = {d: (dlq.starts_of(fm.app, m) if ended.get(d) == "dead_lettered" else -1, ended.get(d, "missing"))
           for d, m in zip(docs, members)}
    result.forget()
    harness.reset(fm)
    return out


@pytest.mark.claim("C19", "with the default prefetch, deploys dead-letter messages that never ran (fm7)")
def test_with_the_default_prefetch_three_deploys_dead_letter_messages_that_never_ran() -> None:
    """docs/failure-modes.md (FM-7) (prefetch 1): a deploy hands back every message the old worker held, started or not,
    and RabbitMQ 3.x counts each return against ``x-delivery-limit: 2``. fm7 without the send-back (so that the
    count shows) and with Celery's default prefetch (4 x 2 processes holds all eight members): three deploys
    dead-letter all eight, and at least two of them never started (six starts in all, two per deploy), innocent
    letters that only the send-back saves, each spending one of its five sends. With fm7's prefetch of 1 a
    worker holds just the two it runs: every dead letter started at each of its deliveries."""
    no_send_back = ("    return drain(app, DLQ, send_back=True)  # FM-7: a letter whose deliveries were not its own "
                    "attempts goes back\n", "    return drain(app, DLQ)\n")
    default = variants.derive("fm7_rolling_deploys", "fm7t_default_prefetch", [no_send_back, _FM7_PREFETCH])
    assert default.app.conf.worker_prefetch_multiplier == 4
    ends = _three_deploys_of_eight(default, "variant-fm7-default-prefetch")
    dead = {d: s for d, (s, how) in ends.items() if how == "dead_lettered"}
    assert len(dead) == 8 and sum(dead.values()) == 6, ends
    assert sum(1 for s in dead.values() if s == 0) >= 2, ends
    one = variants.derive("fm7_rolling_deploys", "fm7t_prefetch_one", [no_send_back])
    assert one.app.conf.worker_prefetch_multiplier == 1
    ends = _three_deploys_of_eight(one, "variant-fm7-prefetch-one")
    dead = {d: s for d, (s, how) in ends.items() if how == "dead_lettered"}
    assert all(s == 3 for s in dead.values()), ends
    assert all(how in ("dead_lettered", "hard_timeout") for _, how in ends.values()), ends


# ---- FM-8's hard variant: the backend comes back empty ------------------------------------------


@pytest.mark.claim("C20", "a backend that comes back empty leaves the chord PENDING; a resubmission recovers (fm8)")
def test_a_backend_that_comes_back_empty_loses_the_chord_and_the_run_says_what_was_lost() -> None:
    """docs/failure-modes.md (FM-8) (the hard variant): the backend, without persistence, is stopped once two of twelve slow
    members have stored their results and started again empty. fm8 still sends back every member whose store
    failed, and each stores its result; but what the backend held before is gone: the results stored before
    the stop, the manifest (``ManifestMissing``) and the chord's size (the Redis backend's ``.s`` key, which
    ``set_chord_size`` wrote when the chord was sent): the join never completes, nothing fails, no email.
    The run's observations, on another Redis, still say that every body ended ok. A resubmission of the same
    pipeline recovers it: every document ok once, one email."""
    fm = harness.load("fm8")
    harness.reset(fm)
    run_id = new_run_id()
    docs = tuple(f"doc{n}" for n in range(66, 78))
    with owned_backend(fm, run_id, persist=False) as (moved, server), running_worker(moved, run_id, "c20", 2.0):
        ids = [store_document(run_id, d, document_text(d, SLOW)) for d in docs]
        first = moved.submit(ids, run_id)
        reader = Reader(run_id)

        def ends() -> list[str]:
            return [e.get("doc") for e in reader.events() if e.kind == "attempt_end" and e.get("outcome") == "ok"]

        assert wait_until(lambda: len(ends()) >= 2 and len(ends()) < len(docs), 30), "no member ended"
        server.stop()
        stored = set(ends())  # stored before the stop (their bodies ended while the backend answered)
        assert wait_until(lambda: any(e.kind == "store_failed" for e in reader.events()), 10), "no store met the outage"
        server.start()  # empty
        back = time.monotonic()
        def rerun() -> tuple[set[str], set[str]]:
            """The documents whose store failed, and those of them sent back and ended again since."""
            events = reader.events()
            failed = {e.get("doc") for e in events if e.kind == "store_failed"}
            resent = {e.get("doc"): e.t for e in events if e.kind == "sent_back"}
            again = {e.get("doc") for e in events if e.kind == "attempt_end" and e.get("doc") in resent and e.t > resent[e.get("doc")]}
            return failed, again

        assert wait_until(lambda: set(ends()) >= set(docs) and rerun()[0] == rerun()[1], 30), f"after the return: {rerun()}"
        failed = rerun()[0]
        assert failed and not failed & stored
        assert not wait_until(first.ready, BACKEND_RETURN_SECONDS - (time.monotonic() - back))
        states = {doc: str(m.state) for doc, m in _member_results(first, docs).items()}  # pyright: ignore[reportPrivateUsage]
        assert {d for d, s in states.items() if s == "PENDING"} == stored  # stored before the stop: lost
        assert {d for d, s in states.items() if s == "SUCCESS"} == set(docs) - stored  # stored after the return
        with pytest.raises(ManifestMissing):
            read_manifest(moved.app, run_id)
        assert reader.emails() == []
        again = moved.submit(ids, run_id)  # the remedy: the same pipeline once more
        assert wait_until(again.ready, 30), "the resubmitted chord did not complete"
        summary = cast(Any, again.result)["payload"]  # read, not awaited: no subscription outlives the server
        assert sorted(short_doc(str(d)) for d in summary["ok"]) == sorted(docs) and summary["failed"] == []
        assert len(reader.emails()) == 1
        del first, again  # Celery unsubscribes each from the backend when it goes: while the server still runs
        gc.collect()
    harness.reset(fm)


@pytest.mark.claim("C21", "chain heads that cannot store their results: each parse runs, the chord counts once (fm8)")
def test_chain_heads_that_cannot_store_their_results_are_not_run_again() -> None:
    """docs/failure-modes.md (FM-8) (``reject_unstored``'s one exception): ``celery.app.trace`` sends a chain's next step
    before it stores the head's result, so a head rejected and run again would send its parse twice (run
    twice, and on 5.5 and 5.6 counted twice in the chord, C11). The backend stopped as soon as the chord is
    sent, while the heads run: each head that could not store is kept acked (its parse carries its result),
    each parse that could not store is sent back by the drain, and the chord counts every document once."""
    fm = harness.load("fm8")
    harness.reset(fm)
    run_id = new_run_id()
    docs = tuple(f"doc{n}" for n in range(66, 78))
    with owned_backend(fm, run_id) as (moved, server), running_worker(moved, run_id, "c21", 2.0) as worker:
        ids = [store_document(run_id, d, document_text(d, SLOW)) for d in docs]
        assert worker.proc is not None
        os.kill(worker.proc.pid, signal.SIGSTOP)  # its main process takes nothing while the chord is sent
        try:
            chord_result = moved.submit(ids, run_id)  # the manifest and the chord's size stored
            server.stop()  # then the backend goes: every head runs while it is gone
        finally:
            os.kill(worker.proc.pid, signal.SIGCONT)
        reader = Reader(run_id)

        def failed(stage: str) -> set[str]:
            return {e.get("doc") for e in reader.events() if e.kind == "store_failed" and e.get("stage") == stage}

        assert wait_until(lambda: bool(failed("fetch_document")) and bool(failed("parse_document")), 20), reader.events()
        server.start()
        assert wait_until(chord_result.ready, 40), "the chord did not complete"
        summary = cast(Any, chord_result.result)["payload"]
        assert sorted(short_doc(str(d)) for d in summary["ok"]) == sorted(docs) and summary["failed"] == []
        events = reader.events()
        heads = failed("fetch_document")
        assert not {e.get("doc") for e in events if e.kind == "sent_back"} & heads - failed("parse_document")
        assert all(sum(1 for e in events if e.kind == "fetch_start" and e.get("doc") == d) == 1 for d in heads)
        assert overlaps(events) == []
        assert len(reader.emails()) == 1
        del chord_result
        gc.collect()
    harness.reset(fm)


def _limits_worker(log: Any, task_time_limit: str, consumer_timeout: str) -> Any:
    """A worker of ``tests.limits_app`` (prefork, one process), its output in ``log``."""
    import subprocess
    import sys

    from lab.fm import ROOT
    env = {**os.environ, "LIM_TASK_TIME_LIMIT": task_time_limit, "LIM_CONSUMER_TIMEOUT": consumer_timeout,
           "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.limits_app", "worker", "--loglevel=WARNING", "-n",
             f"lim-{uuid.uuid4().hex[:8]}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    return proc


@pytest.mark.claim("C22", "within_consumer_timeout never raises a limit and caps every message (fm9)")
@pytest.mark.parametrize(("task_time_limit", "consumer_timeout"), [("2", "20"), ("", "4")],
                         ids=["task_time_limit-2-cap-10", "no-setting-cap-2"])
def test_within_consumer_timeout_never_raises_a_limit(task_time_limit: str, consumer_timeout: str,
                                                       tmp_path: Any) -> None:
    """shared.consumer_timeout: the worker enforces Celery's own limit (the message's, else the task's, else
    the worker's default) or the cap where that is higher or unset; bodies of 5 s. ``task_time_limit=2``
    under a cap of 10 s: a message with no limit is killed at 2 s (on 5.5.3 and 5.6.3 the task's
    ``time_limit`` reads None, and the earlier code gave it the cap: the body ended ok), one that asks for
    1 s at 1 s. A cap of 2 s and no setting: messages that carry 30 s, from a publisher that never capped
    (``apply_async``) and given by hand (``send_task(time_limit=30)``), are killed at 2 s (the earlier code
    let them run 5 s); a ``BackstopRequest`` task keeps its envelope under the cap's request class. One
    warning per task whose message the cap lowered."""
    from celery.result import AsyncResult

    from tests.limits_app import PREFIX, QUEUE, publisher
    log = tmp_path / "worker.log"
    proc = _limits_worker(log, task_time_limit, consumer_timeout)
    sent: list[AsyncResult[Any]] = []
    try:
        with Connection(broker_url()) as conn:
            assert wait_until(lambda: proc.poll() is not None or _consumers(conn, QUEUE) == 1, 60), log.read_text()
        assert proc.poll() is None, log.read_text()
        if task_time_limit:
            sent = [publisher.send_task("lim.sleep", args=[5]),  # carries no limit
                    publisher.send_task("lim.sleep", args=[5], time_limit=1)]  # a lower one by hand
            killed_at = [(2.0,), (1.0,)]
        else:
            sent = [publisher.send_task("lim.sleep", args=[5]),
                    publisher.tasks["lim.sleep"].apply_async((5,)),  # carries the publisher's 30 s
                    publisher.send_task("lim.sleep", args=[5], time_limit=30),  # 30 s by hand
                    publisher.tasks["lim.backstop"].apply_async((5,))]  # 30 s, BackstopRequest
            killed_at = [(2.0,)] * 3
        assert wait_until(lambda: all(r.ready() for r in sent), 60), [r.state for r in sent]
        metas = [publisher.backend.get_task_meta(r.id) for r in sent]
        plain = metas[:len(killed_at)]
        assert [m["status"] for m in plain] == ["FAILURE"] * len(plain), metas
        assert [(type(m["result"]).__name__, m["result"].args) for m in plain] == [
            ("TimeLimitExceeded", at) for at in killed_at], metas
        text = log.read_text(errors="replace")
        if task_time_limit:
            assert "message asks for time_limit" not in text, text
            return
        envelope = cast(dict[str, Any], metas[3]["result"])
        assert metas[3]["status"] == "SUCCESS" and (envelope["status"], envelope["reason"]) == ("FAILURE", "time_limit")
        assert "its time_limit of 2.0s" in envelope["error"], envelope
        assert text.count("lim.sleep's message asks for time_limit 30;") == 1, text
        assert text.count("lim.backstop's message asks for time_limit 30;") == 1, text
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except Exception:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for r in sent:
            r.forget()
        with Connection(broker_url()) as conn:
            channel: Any = conn.default_channel
            channel.queue_delete(QUEUE)
            channel.exchange_delete(QUEUE)
        client = cast(Any, publisher.backend).client
        for key in client.scan_iter(f"{PREFIX}*"):
            client.delete(key)


def _consumers(conn: Connection, queue: str) -> int | None:
    try:
        channel: Any = conn.default_channel
        return int(channel.queue_declare(queue=queue, passive=True).consumer_count)
    except Exception:
        conn.close()  # a passive declare of a missing queue closes the channel: start again on the next look
        return None
