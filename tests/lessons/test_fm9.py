"""FM-9, the broker drops the worker's connection (``fm9_connection_loss.py``)."""

from __future__ import annotations

from lab.checks import overlaps
from lab.records import RunReport, SideRun
from lessons.fm9.checks import RAN_ON_SECONDS, WAIT_END_SLACK, wait_left_at_cut
from tests.lessons.runs import LabRuns, holds_every_guarantee_up_to_its_own, symptom_run


def test_a_dropped_connection_cancels_the_running_member_and_the_worker_serves_again(lab: LabRuns) -> None:
    obs = holds_every_guarantee_up_to_its_own(lab.of("fm9")["fixed"], 9)
    connloss, overlong = obs.sides["connloss"], obs.sides["overlong"]
    assert [e.get("running") for e in connloss.events if e.kind == "link_cut"] == ["doc78"]
    assert [e.get("outcome") for e in connloss.events if e.kind == "attempt_end" and e.get("doc") == "doc78"] == ["cancelled", "ok"]
    assert (overlong.failed("doc81") or {}).get("reason") == "time_limit" and len(overlong.emails) == 1
    assert not any(e.kind == "worker_exit" for e in (*connloss.events, *overlong.events))


def test_a_member_its_connection_loss_cancels_between_its_store_and_its_count_is_counted_once(lab: LabRuns) -> None:
    obs = holds_every_guarantee_up_to_its_own(lab.of("fm9")["fixed"], 9)
    side = obs.sides["cutstored"]
    kinds = [e.kind for e in side.events if e.kind in ("stored_uncounted", "link_cut", "ended_after_store")
             or (e.kind == "cancelled" and e.get("doc") == "doc88")]  # doc89, healthy, may be running at the cut too
    # the runner records its cut once the cut is made: the worker's cancel may be recorded first
    assert kinds[0] == "stored_uncounted" and sorted(kinds[1:3]) == ["cancelled", "link_cut"] \
        and kinds[3:] == ["ended_after_store"], kinds
    assert side.chord.state == "SUCCESS" and len(side.emails) == 1
    assert side.attempts["doc88"] == 1  # its redelivery was deduplicated, and counted


def _soft_wait_cut(softcut: SideRun) -> tuple[float, float]:
    """The side ``softcut``: SIGTERM while its member ran, the cut once the soft wait began; (when the first body
    ended, when the copy began), each after the cut."""
    kinds = [e.kind for e in softcut.events if e.kind in ("soft_term", "soft_cut", "soft_missed")]
    assert kinds == ["soft_term", "soft_cut"], kinds
    sent = float(next(e.get("sent") for e in softcut.events if e.kind == "soft_term"))
    cut = next(e.t for e in softcut.events if e.kind == "soft_cut")
    waits = [e.t for e in softcut.events if e.kind == "soft_wait"]  # recorded by the worker: may precede soft_term's own record
    assert len(waits) == 1 and sent <= waits[0] <= cut, (sent, waits, cut)
    parses = [e for e in softcut.events if e.get("doc") == "doc85" and e.kind in ("attempt_start", "attempt_end")]
    assert [(e.kind, e.get("attempt")) for e in parses if e.kind == "attempt_start"] == [("attempt_start", "1"), ("attempt_start", "2")]
    first_end = next(e for e in parses if e.kind == "attempt_end" and e.get("attempt") == "1")
    copy = next(e for e in parses if e.kind == "attempt_start" and e.get("attempt") == "2")
    assert first_end.get("outcome") == "cancelled"
    return first_end.t - cut, copy.t - cut


def test_a_connection_dropped_in_the_soft_shutdown_wait_cancels_the_member_before_its_copy_begins(lab: LabRuns) -> None:
    obs = holds_every_guarantee_up_to_its_own(lab.of("fm9")["fixed"], 9)
    softcut = obs.sides["softcut"]
    ended, began = _soft_wait_cut(softcut)
    assert ended < began, (ended, began)
    # cancelled at the cut, while the wait still slept, not by the cold shutdown at the wait's end (0.3 s)
    assert [e.get("in_wait") for e in softcut.events if e.kind == "cancelled" and e.get("doc") == "doc85"][:1] == ["1"]
    assert not overlaps(softcut.events)
    assert [e.get("outcome") for e in softcut.events if e.kind == "attempt_end"] == ["cancelled", "ok"]
    assert len(softcut.emails) == 1


def test_without_the_fix_a_member_runs_twice_at_once_or_the_worker_exits(lab: LabRuns) -> None:
    symptom_run(lab.of("fm9")["broken"], 9, "fm8", "S9")


def _logs(report: RunReport) -> str:
    """The linked worker's log and the spare's (after the soft wait's cut, either may serve the lab's node)."""
    assert report.log is not None
    found = [report.log.parent / report.log.name.replace("-fm9w-", f"-fm9w-{part}-") for part in ("linked", "spare")]
    return "".join(path.read_text() for path in found if path.exists())


def test_with_time_limits_above_the_consumer_timeout_the_broker_closes_the_channel_first(lab: LabRuns) -> None:
    report = lab.of("fm9")["weak"]
    symptom_run(report, 9, "fm9w", "S9 hard")
    assert "PRECONDITION_FAILED" in _logs(report)


def test_without_the_soft_wait_watch_a_cut_in_the_soft_wait_runs_a_member_twice_at_once(lab: LabRuns) -> None:
    obs = symptom_run(lab.of("fm9")["weak"], 9, "fm9w", "S9 hard")
    softcut = obs.sides["softcut"]
    ended, began = _soft_wait_cut(softcut)
    left = wait_left_at_cut(softcut, 0.3)  # fm9w's worker_soft_shutdown_timeout
    assert left is not None and ended >= min(RAN_ON_SECONDS, left - WAIT_END_SLACK), (ended, left)  # the first body
    # ran on to the soft wait's end, its message back in the broker
    # the copy began meanwhile, two processes at once, unless the broker took longer than the rest of the wait to hand
    # it over (0.7 s once at a load of 15 on two cores)
    assert bool(overlaps(softcut.events)) is (began < ended), (ended, began)
    assert not any(e.get("in_wait") for e in softcut.events if e.kind == "cancelled")  # nothing cancels in the wait
