"""A chord member that dies between its result's store and its count (``shared.stored_members``), with real
parts: RabbitMQ, the shared Redis as result backend, a prefork worker with acks late, reject on worker lost and
``worker_deduplicate_successful_tasks`` (``tests/stored_app.py``). The runner kills the member's pool process at
the place the gate holds it, from what it observes (the pid the member wrote there), never on a timer.

- killed after its store, before its count, without the fix: the redelivery is deduplicated (acked without
  running) and never counted: the body never runs, and nothing is left to run it;
- the same with ``count_stored_members``: the redelivery counts the stored result, the body runs once with
  every member's result;
- killed after its count, with the fix: the re-count does not count the member twice (the body runs once, with
  each member once). (Without the fix that member was counted: the chord completes, as the lab's runs show.)

A member killed by its own ``time_limit`` at the same places (FM-6's ``BackstopRequest`` settles it in the main
process, and acks it: no redelivery comes):

- before its count, with ``BackstopRequest`` as it stood (``UncountedBackstop``): it finds SUCCESS stored, stores
  nothing and acks: the member is never counted, the chord waits for ever;
- the same with ``BackstopRequest`` counting what it finds stored: the body runs once;
- after its count: not counted twice.

Celery's own cancels at the same place (FM-7's cold shutdown, FM-9's connection loss): the message comes back to a
stored SUCCESS and is deduplicated, never counted (C38, C40); ``count_stored_members`` counts it (C39, C41), and a
member the cut meets after its count is not counted twice (C42).

The last member to count, ended after its count and before it sent the body (SIGKILLed, or its time limit's kill):
the body never runs without the fix (C43); ``count_stored_members`` sends it once (C44, C45).

Celery 5.5 and 5.6 count into a sorted set of encoded results, 5.7 into a set of task ids (``make matrix`` runs
this file on each)."""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any, cast

import pytest
from celery import chord
from kombu import Connection

from lab.link import BrokerLink
from lab.queues import queue_consumers, queue_depth
from lab.settings import broker_url
from lab.versions import CELERY
from lab.waiting import wait_until
from lab.workers import pid_alive
from tests.app_worker import AppWorker
from tests.stored_app import PREFIX, QUEUE, TIME_LIMIT, app, body, member, shared, timed_member

NOT_RUN_WINDOW = 10.0
"""How long the body must stay unrun after the kill, to call it never run: the worker's main process notices a
lost pool process within about 5 s (seen here), and its redelivery (5.5, 5.6) is settled at once after that."""
pytestmark = pytest.mark.usefixtures("real_services")


def _worker(fix: bool, log: Path, env: dict[str, str] | None = None) -> AppWorker:
    def consuming(_: AppWorker) -> bool:
        with Connection(broker_url()) as conn:
            return queue_consumers(conn, QUEUE) > 0

    return AppWorker("tests.stored_app", {"SM_FIX": "1" if fix else "0", **(env or {})}, log, ready=consuming)


def _clean() -> None:
    r = shared()
    keys = list(r.scan_iter(match=f"{PREFIX}*", count=500))
    if keys:
        r.delete(*keys)
    with Connection(broker_url()) as conn:
        channel = cast(Any, conn.channel())
        channel.queue_delete(QUEUE)
        channel.exchange_delete(QUEUE)
        channel.close()


@pytest.fixture
def clean_stored_app() -> Any:
    _clean()
    yield
    _clean()


def _bodies(key: str) -> list[list[dict[str, int]]]:
    return [cast(list[dict[str, int]], json.loads(raw)) for raw in shared().lrange(f"{PREFIX}bodies:{key}", 0, -1)]


CASES = [
    pytest.param("before", False, id="dedup-only-before",
                 marks=pytest.mark.claim("C30", "a member killed between its store and its count is never counted "
                                                "with deduplication on: the chord waits for ever")),
    pytest.param("before", True, id="count-stored-members-before",
                 marks=pytest.mark.claim("C31", "count_stored_members counts a member killed between its store and "
                                                "its count: the body runs once")),
    pytest.param("after", True, id="count-stored-members-after",
                 marks=pytest.mark.claim("C32", "count_stored_members does not count twice a member killed after "
                                                "its count")),
]


@pytest.mark.parametrize(("where", "fix"), CASES)
def test_a_member_killed_around_its_count(where: str, fix: bool, tmp_path: Path, clean_stored_app: None) -> None:
    r = shared()
    key = uuid.uuid4().hex[:10]
    r.set(f"{PREFIX}hold:{key}:0", where, ex=300)
    worker = _worker(fix, tmp_path / "worker.log")
    try:
        result = chord(member.s(key, i) for i in range(3))(body.s(key))
        assert wait_until(lambda: bool(r.get(f"{PREFIX}held:{key}:0")), 30), worker.text()
        stored = cast(Any, app.backend).get_task_meta(cast(Any, result.parent).results[0].id, cache=False)
        assert stored["status"] == "SUCCESS"  # it is held after its store
        os.kill(int(r.get(f"{PREFIX}held:{key}:0")), signal.SIGKILL)
        r.delete(f"{PREFIX}hold:{key}:0")
        r.set(f"{PREFIX}go:{key}", "1", ex=300)  # the other two members count now
        everyone = [{"index": 0}, {"index": 1}, {"index": 2}]
        if where == "before" and not fix:
            if CELERY < (5, 7):  # requeued (reject on worker lost), then deduplicated: acked without running
                assert wait_until(lambda: int(r.get(f"{PREFIX}received:{key}:0") or 0) == 2, 30), worker.text()
            # 5.7.0 acks it once the main process sees the process gone ("succeeded before the worker was lost")
            assert not wait_until(lambda: bool(_bodies(key)), NOT_RUN_WINDOW), _bodies(key)  # never counted
            assert not result.ready()
            worker.stop()  # an unacked message would go back to the queue now
            with Connection(broker_url()) as conn:
                assert queue_depth(conn, QUEUE) == 0  # acked: nothing is left that could ever count it
        else:
            assert wait_until(lambda: bool(_bodies(key)), 30), worker.text()
            assert not wait_until(lambda: len(_bodies(key)) > 1, 1.0)
            assert _bodies(key) == [everyone]  # once, each member once
        assert int(r.get(f"{PREFIX}runs:{key}:0") or 0) == 1  # the member's work ran once
    finally:
        r.set(f"{PREFIX}release:{key}", "1", ex=300)  # a member still held (the test failed first) ends now
        worker.stop()


TIMED_CASES = [
    pytest.param("before", False, id="time-limit-uncounted-before",
                 marks=pytest.mark.claim("C35", "a member its time limit kills between its store and its count is "
                                                "acked and never counted: the chord waits for ever")),
    pytest.param("before", True, id="time-limit-counted-before",
                 marks=pytest.mark.claim("C36", "BackstopRequest counts a SUCCESS its time limit's kill left "
                                                "uncounted: the body runs once")),
    pytest.param("after", True, id="time-limit-counted-after",
                 marks=pytest.mark.claim("C37", "BackstopRequest does not count twice a member its time limit killed "
                                                "after its count")),
]


@pytest.mark.parametrize(("where", "fix"), TIMED_CASES)
def test_a_member_its_time_limit_kills_around_its_count(where: str, fix: bool, tmp_path: Path,
                                                         clean_stored_app: None) -> None:
    r = shared()
    key = uuid.uuid4().hex[:10]
    r.set(f"{PREFIX}hold:{key}:0", where, ex=300)
    r.set(f"{PREFIX}go:{key}", "1", ex=300)  # the other members count at once
    worker = _worker(fix, tmp_path / "worker.log")
    try:
        result = chord([timed_member.s(key, 0), member.s(key, 1), member.s(key, 2)])(body.s(key))
        assert wait_until(lambda: bool(r.get(f"{PREFIX}held:{key}:0")), 30), worker.text()
        stored = cast(Any, app.backend).get_task_meta(cast(Any, result.parent).results[0].id, cache=False)
        assert stored["status"] == "SUCCESS"  # it is held after its store
        held = int(r.get(f"{PREFIX}held:{key}:0"))
        assert wait_until(lambda: not pid_alive(held), 30), worker.text()  # Celery's time limit killed it
        r.delete(f"{PREFIX}hold:{key}:0")
        everyone = [{"index": 0}, {"index": 1}, {"index": 2}]
        if where == "before" and not fix:
            assert not wait_until(lambda: bool(_bodies(key)), NOT_RUN_WINDOW), _bodies(key)  # never counted
            assert not result.ready()
            worker.stop()  # an unacked message would go back to the queue now
            with Connection(broker_url()) as conn:
                assert queue_depth(conn, QUEUE) == 0  # acked: nothing is left that could ever count it
        else:
            assert wait_until(lambda: bool(_bodies(key)), 30), worker.text()
            assert not wait_until(lambda: len(_bodies(key)) > 1, 1.0)
            assert _bodies(key) == [everyone]  # once, each member once
        assert int(r.get(f"{PREFIX}runs:{key}:0") or 0) == 1  # the member's work ran once
        assert int(r.get(f"{PREFIX}received:{key}:0") or 0) == 1  # settled by the backstop: never delivered again
    finally:
        r.set(f"{PREFIX}release:{key}", "1", ex=300)  # a member still held (the test failed first) ends now
        worker.stop()



CANCEL_CASES = [
    pytest.param("cold", "before", False, id="cold-shutdown-uncounted-before",
                 marks=pytest.mark.claim("C38", "a member a deploy's cold shutdown cancels between its store and its "
                                                "count is never counted with deduplication on: the chord waits for ever")),
    pytest.param("cold", "before", True, id="cold-shutdown-counted-before",
                 marks=pytest.mark.claim("C39", "count_stored_members counts a member a cold shutdown cancelled between "
                                                "its store and its count: the body runs once")),
    pytest.param("cut", "before", False, id="connection-loss-uncounted-before",
                 marks=pytest.mark.claim("C40", "a member Celery cancels on a connection loss between its store and "
                                                "its count is never counted with deduplication on: the chord waits for "
                                                "ever")),
    pytest.param("cut", "before", True, id="connection-loss-counted-before",
                 marks=pytest.mark.claim("C41", "count_stored_members counts a member cancelled on a connection loss "
                                                "between its store and its count: the body runs once")),
    pytest.param("cut", "after", True, id="connection-loss-counted-after",
                 marks=pytest.mark.claim("C42", "count_stored_members does not count twice a member cancelled on a "
                                                "connection loss after its count")),
]
DEDUPLICATED_WINDOW = 3.0
"""How long the body must stay unrun once the pool serves again after the cancel (the other members counted), before
the worker is stopped and the queue read: the redelivery is deduplicated at once (no lost process to notice), and a
message still unsettled at the stop goes back to the queue, which fails the test rather than passing it. The cut's
cancel ends every pool process, and on a loaded machine the new ones took over 3 s to run anything (C40 failed so in
CI's make matrix on 5.6.3, and in 2 of 5 runs beside it)."""


@pytest.mark.parametrize(("way", "where", "fix"), CANCEL_CASES)
def test_a_member_cancelled_around_its_count(way: str, where: str, fix: bool, tmp_path: Path,
                                            clean_stored_app: None) -> None:
    """FM-7's cold-shutdown cancel (a deploy's SIGTERM: 0.3 s of soft wait, then ``Request.cancel``) and FM-9's
    connection-loss cancel land on a member held after its store, before (or after) its count. The state stays
    SUCCESS (5.6 and 5.7 cancel a late-acked task in a shutdown without ``mark_as_retry``; where Celery calls it, the
    test reads SUCCESS after it), so the message comes back to a stored SUCCESS, and the deduplication acks it
    without running it."""
    r = shared()
    key = uuid.uuid4().hex[:10]
    r.set(f"{PREFIX}hold:{key}:0", where, ex=300)  # the other two wait for go: the held member is never the last
    # to count (the last one is test_the_last_member_dies_before_it_sends_the_body's)
    with BrokerLink.to(broker_url()) as link:
        env = {"REMAP_SIGTERM": "SIGQUIT",  # fm7..fm9's worker environment
               **({"SM_COLD": "1"} if way == "cold" else {"SM_CUT": "1", "SM_BROKER": link.url(broker_url())})}
        workers = [_worker(fix, tmp_path / "worker.log", env)]
        try:
            result = chord(member.s(key, i) for i in range(3))(body.s(key))
            assert wait_until(lambda: bool(r.get(f"{PREFIX}held:{key}:0")), 30), workers[0].text()
            stored = cast(Any, app.backend).get_task_meta(cast(Any, result.parent).results[0].id, cache=False)
            assert stored["status"] == "SUCCESS"  # it is held after its store
            held = int(r.get(f"{PREFIX}held:{key}:0"))
            if way == "cold":
                os.kill(workers[0].proc.pid, signal.SIGTERM)  # a deploy's SIGTERM to the worker's main process
            else:
                assert link.cut() >= 1  # the worker's connections through the link
            assert wait_until(lambda: not pid_alive(held), 30), workers[0].text()  # Celery's cancel ended it
            if way == "cold" and not wait_until(lambda: workers[0].proc.poll() is not None, 30):
                os.killpg(workers[0].proc.pid, signal.SIGKILL)  # the grace's end, as a deploy's: the member's
                workers[0].proc.wait()  # process was cancelled already (above); its message comes back either way
            r.delete(f"{PREFIX}hold:{key}:0")
            r.set(f"{PREFIX}go:{key}", "1", ex=300)  # the other two (cancelled too, and run again) count now
            if way == "cold":
                workers.append(_worker(fix, tmp_path / "deployed.log", env))  # the new version takes the message
            assert wait_until(lambda: int(r.get(f"{PREFIX}received:{key}:0") or 0) == 2, 30), workers[-1].text()
            everyone = [{"index": 0}, {"index": 1}, {"index": 2}]
            if not fix:
                # the pool serves again: the other two, cancelled too, have run again and counted (5.6.3's pool took
                # over 3 s to run anything after the cancel, in 2 of 5 runs here)
                assert wait_until(lambda: int(r.get(f"{PREFIX}counted:{key}") or 0) >= 2, 30), workers[-1].text()
                assert not wait_until(lambda: bool(_bodies(key)), DEDUPLICATED_WINDOW), _bodies(key)  # never counted
                assert not result.ready()
                workers[-1].stop()  # an unacked message would go back to the queue now
                with Connection(broker_url()) as conn:
                    assert queue_depth(conn, QUEUE) == 0  # acked: nothing is left that could ever count it
            else:
                assert wait_until(lambda: bool(_bodies(key)), 30), workers[-1].text()
                assert not wait_until(lambda: len(_bodies(key)) > 1, 1.0)
                assert _bodies(key) == [everyone]  # once, each member once
            assert int(r.get(f"{PREFIX}runs:{key}:0") or 0) == 1  # the member's work ran once: deduplicated
            final = cast(Any, app.backend).get_task_meta(cast(Any, result.parent).results[0].id, cache=False)
            assert final["status"] == "SUCCESS"  # the cancel stored nothing over it
        finally:
            r.set(f"{PREFIX}release:{key}", "1", ex=300)  # a member still held (the test failed first) ends now
            for worker in workers:
                worker.stop()


LAST_CASES = [
    pytest.param("kill", False, id="last-killed-unsent",
                 marks=pytest.mark.claim("C43", "a chord's last member killed after its count, before it sent the "
                                                "body: the body never runs (5.7: past the dead process's claim too)")),
    pytest.param("kill", True, id="last-killed-sent",
                 marks=pytest.mark.claim("C44", "count_stored_members sends the body of a chord whose last member was "
                                                "killed after its count, before it sent it: once")),
    pytest.param("time_limit", True, id="last-time-limit-sent",
                 marks=pytest.mark.claim("C45", "BackstopRequest sends the body of a chord whose last member its time "
                                                "limit killed after its count, before it sent it: once")),
]
SENT_WITHIN = 60.0
"""How long the fix may take to send the body: 5.7 waits for the dead process's claim to expire (about 21 s with
Celery's default publish retries: ``RedisBackend._chord_publish_claim_expires``); 5.5 and 5.6 for
``shared.stored_members.RESEND_AFTER``."""


@pytest.mark.parametrize(("way", "fix"), LAST_CASES)
def test_the_last_member_dies_before_it_sends_the_body(way: str, fix: bool, tmp_path: Path,
                                                        clean_stored_app: None) -> None:
    """The member that counts last is held where it publishes the chord's body (5.7: holding the dispatch's claim)
    and dies there: SIGKILLed, or killed by its own time limit (``BackstopRequest`` settles it in the main process).
    The join is complete and no one sends the body: ``count_stored_members`` (and the backstop's count) watch such
    a join and send it once the dead dispatcher's claim expired (5.7) or the join stood
    ``RESEND_AFTER`` s (5.5, 5.6). The time limit's kill there is what left fm9's connloss chord PENDING in about one
    run in twenty on 5.7.0."""
    r = shared()
    key = uuid.uuid4().hex[:10]
    r.set(f"{PREFIX}hold:{key}:0", "last", ex=300)
    r.set(f"{PREFIX}go:{key}", "1", ex=300)  # the other two count at once; the held one after them
    worker = _worker(fix, tmp_path / "worker.log")
    try:
        first = timed_member.s(key, 0) if way == "time_limit" else member.s(key, 0)
        result = chord([first, member.s(key, 1), member.s(key, 2)])(body.s(key))
        assert wait_until(lambda: bool(r.get(f"{PREFIX}held:{key}:0")), 30), worker.text()
        held = int(r.get(f"{PREFIX}held:{key}:0"))
        if way == "kill":
            os.kill(held, signal.SIGKILL)
        assert wait_until(lambda: not pid_alive(held), 30), worker.text()  # killed, or Celery's time limit killed it
        everyone = [{"index": 0}, {"index": 1}, {"index": 2}]
        if not fix:
            claim = cast(Any, app.backend).get_key_for_group(cast(Any, result.parent).id, ".c")
            window = max(NOT_RUN_WINDOW, r.pttl(claim) / 1000 + 5)  # 5.7: beyond the dead process's claim
            assert not wait_until(lambda: bool(_bodies(key)), window), _bodies(key)
            assert not result.ready()
            worker.stop()  # an unacked message would go back to the queue now
            with Connection(broker_url()) as conn:
                assert queue_depth(conn, QUEUE) == 0  # acked: nothing is left that could ever send it
        else:
            assert wait_until(lambda: bool(_bodies(key)), SENT_WITHIN), worker.text()
            assert not wait_until(lambda: len(_bodies(key)) > 1, 1.0)
            assert _bodies(key) == [everyone]  # once, each member once
        assert int(r.get(f"{PREFIX}runs:{key}:0") or 0) == 1  # the member's work ran once
    finally:
        r.set(f"{PREFIX}release:{key}", "1", ex=300)  # a member still held (the test failed first) ends now
        worker.stop()


CANCELLED_CASES = [
    pytest.param(False, id="cancelled-then-time-limit-settled",
                 marks=pytest.mark.claim("C46", "5.7.0: a time limit that expires after Celery cancelled the request "
                                                "on a lost connection: BackstopRequest as it stood stores its "
                                                "envelope, and the redelivered copy is acked unrun; 5.5.3 and 5.6.3: "
                                                "that time limit never fires (the reconnect clears the timer)")),
    pytest.param(True, id="cancelled-then-time-limit",
                 marks=pytest.mark.claim("C47", "BackstopRequest leaves a request Celery cancelled unsettled: the "
                                                "redelivered copy runs and its result is stored")),
]
LIMIT_OUTLIVED = TIME_LIMIT + 3.0
"""5.5.3, 5.6.3: how long after the cut the cancelled run must still be alive to say its time limit (2 s from its
start) did not fire: billiard's kill follows the limit by 0.1 s."""


@pytest.mark.parametrize("fix", CANCELLED_CASES)
def test_a_time_limit_after_a_connection_loss_cancel(fix: bool, tmp_path: Path, clean_stored_app: None) -> None:
    """FM-9's stack (the connection-loss cancel, ``fence_redeliveries``, deduplication) and a timed member whose
    first run holds its signals, as ``count_stored_members`` does around a count: the cut's cancel stores RETRY and
    sends its signal, which waits for the block's end.

    5.7.0: the member's time limit then kills it, and the main process settles the request it already cancelled.
    Its redelivered copy waits on the fence until the killed process is reaped, then meets what the settling stored
    (seen once in a handout's fm9 run: a healthy document's result was ``time_limit``).

    5.5.3 and 5.6.3 drop the time limits of what runs across a reconnect (5.5.3: ``Consumer.on_close`` clears the
    worker's timer; 5.6.3: ``asynloop`` clears the hub's timer on a connection error; 5.7.0 cancels only the loop's
    own entries): the cancelled run outlives its limit, and ends when its block does (here the test releases it);
    the fence lets its copy in then, and the copy runs."""
    r = shared()
    key = uuid.uuid4().hex[:10]
    r.set(f"{PREFIX}hold:{key}:0", "signals", ex=300)
    with BrokerLink.to(broker_url()) as link:
        env = {"REMAP_SIGTERM": "SIGQUIT", "SM_CUT": "1", "SM_BROKER": link.url(broker_url()), "SM_FENCE": "1",
               **({} if fix else {"SM_BLIND": "1"})}
        worker = _worker(True, tmp_path / "worker.log", env)
        try:
            task_id = timed_member.delay(key, 0).id  # not its AsyncResult: one left at exit unsubscribes from a
            # Redis Python is shutting down (an ignored exception's traceback)
            assert wait_until(lambda: bool(r.get(f"{PREFIX}held:{key}:0")), 30), worker.text()
            held = int(r.get(f"{PREFIX}held:{key}:0"))
            assert link.cut() >= 1
            if CELERY < (5, 7):
                assert not wait_until(lambda: not pid_alive(held), LIMIT_OUTLIVED), worker.text()  # no limit fired
                assert int(r.get(f"{PREFIX}received:{key}:0") or 0) == 1  # the fence holds its copy meanwhile
                r.set(f"{PREFIX}release:{key}", "1", ex=300)  # its block ends: the held cancel's signal ends it
            assert wait_until(lambda: int(r.get(f"{PREFIX}received:{key}:0") or 0) == 2, 30), worker.text()
            assert not pid_alive(held), worker.text()  # the fence let the copy in only once the first run was gone
            meta: dict[str, Any] = {}

            def settled() -> bool:
                meta.update(cast(Any, app.backend).get_task_meta(task_id, cache=False))
                return meta["status"] == "SUCCESS"

            assert wait_until(settled, 30), (meta, worker.text())
            if fix or CELERY < (5, 7):
                assert meta["result"] == {"index": 0}
                assert int(r.get(f"{PREFIX}runs:{key}:0") or 0) == 2  # the copy ran the work
                said = "nothing stored, its redelivered copy runs" in worker.text()
                assert said == (CELERY >= (5, 7))  # the limit fired after the cancel on 5.7.0 only
            else:
                assert meta["result"]["reason"] == "time_limit"  # the envelope over the cancel's RETRY
                assert wait_until(lambda: "already completed successfully" in worker.text(), 30), worker.text()
                worker.stop()  # an unacked copy would go back to the queue now
                with Connection(broker_url()) as conn:
                    assert queue_depth(conn, QUEUE) == 0  # the copy was acked unrun: deduplicated
                assert int(r.get(f"{PREFIX}runs:{key}:0") or 0) == 1
        finally:
            r.set(f"{PREFIX}release:{key}", "1", ex=300)
            worker.stop()
