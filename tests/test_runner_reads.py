"""The runner's reads stay linear in a run's size (issue 26), and read what the one-by-one reads read:
the event stream read only where it grew, with roles made again only for a new duplicate; every document's
attempt starts indexed once; the members' and heads' states in one MGET. Real Redis: the run's record
and the lab's result backend."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery.result import AsyncResult

from lab import harness
from lab.observe import Reader, RunRecorder, attempt_starts
from lab.runner import _metas  # pyright: ignore[reportPrivateUsage]
from lab.records import Outcome
from lab.scenarios import Scenario
from lessons import scenario
from lessons.fm5.scenario import BURST
from shared.envelope import Result
from tests.synthetic import fixed_run, large_fixed_run

pytestmark = pytest.mark.usefixtures("real_services")


def _key(e: Any) -> tuple[float, str, tuple[tuple[str, str], ...]]:
    return e.t, e.kind, tuple(sorted(e.fields.items()))


def test_events_read_where_the_stream_grew_equal_a_fresh_read() -> None:
    run = f"t-reads-{uuid.uuid4().hex[:8]}"
    rec, reader = RunRecorder(run), Reader(run)
    rec.event("attempt_start", doc="doc1", attempt=1)
    rec.event("notify_start", task="n-1")
    first = reader.events()
    assert [e.kind for e in first] == ["attempt_start", "notify_start"] and first[1].get("role") == "chord"
    rec.event("notify_start", task="n-2")
    rec.event("email", task="n-2")
    grown = reader.events()
    assert [_key(e) for e in grown[:2]] == [_key(e) for e in first]  # what was read stays as read
    assert [_key(e) for e in grown] == [_key(e) for e in Reader(run).events()]
    assert reader.events() == grown  # nothing new: the same events
    rec.put("duplicate", "n-2")  # a duplicate named later: every notify's role again
    roles = [e.get("role") for e in reader.events() if e.kind == "notify_start"]
    assert roles == ["chord", "duplicate"]
    assert [_key(e) for e in reader.events()] == [_key(e) for e in Reader(run).events()]
    for kind in ("attempt_start", "notify_start", "email", "nothing"):  # the index by kind, after the roles changed
        assert [_key(e) for e in reader.events_of(kind)] == [_key(e) for e in reader.events() if e.kind == kind]
    assert reader.has_event("notify_start", role="duplicate") and not reader.has_event("email", role="chord")
    assert reader.notify_runs("chord") == 1 and reader.notify_runs("duplicate") == 1
    rec.r.delete(rec.prefix + "events", rec.prefix + "duplicate")


def test_the_burst_is_its_throttled_documents_not_their_names() -> None:
    """A scenario of clean documents named doc1..docN (the benchmark's) has no burst to wait for: the runner
    would read every retry event at every look for one that never comes."""
    assert scenario(5).burst == BURST
    assert Scenario(1, {f"doc{i}": None for i in range(1, 40)}).burst == ()


@pytest.mark.parametrize("made", [fixed_run, large_fixed_run])
def test_attempt_times_indexed_once_equal_the_scan(made: Any) -> None:
    obs = made()
    docs = {e.get("doc") for e in obs.events} | set(obs.docs) | {"nowhere"}
    assert {d: obs.attempt_times(d) for d in docs} == {d: attempt_starts(obs.events, d) for d in docs}
    assert any(obs.attempt_times(d) for d in docs)


def test_the_members_states_in_one_mget_equal_asyncresults_own_reads() -> None:
    backend: Any = harness.load("fm7").app.backend
    ok, failed, started = (f"t-reads-{name}-{uuid.uuid4().hex[:8]}" for name in ("ok", "failed", "started"))
    pending = f"t-reads-pending-{uuid.uuid4().hex[:8]}"
    backend.store_result(ok, Result[Any].success({"doc": "doc1"}, 1).to_wire(), "SUCCESS")
    backend.store_result(failed, ValueError("broken"), "FAILURE")
    backend.store_result(started, None, "STARTED")
    ids = [ok, failed, started, pending]
    try:
        metas = _metas(backend, ids)
        assert metas is not None
        assert {t: Outcome.of_meta(metas[t]) for t in ids} == {t: Outcome.of(AsyncResult(t, backend=backend)) for t in ids}
        assert [Outcome.of_meta(metas[t]).state for t in ids] == ["SUCCESS", "FAILURE", "STARTED", "PENDING"]
        assert _metas(object(), ids) is None  # no MGET: the caller reads one by one
    finally:
        backend.client.delete(*(backend.get_key_for_task(t) for t in ids))
