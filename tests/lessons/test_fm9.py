"""FM-9, the broker drops the worker's connection (``fm9_connection_loss.py``)."""

from __future__ import annotations

from tests.lessons.runs import LabRuns, holds_every_guarantee_up_to_its_own, symptom_run


def test_a_dropped_connection_cancels_the_running_member_and_the_worker_serves_again(lab: LabRuns) -> None:
    obs = holds_every_guarantee_up_to_its_own(lab.of("fm9")["fixed"], 9)
    connloss, overlong = obs.sides["connloss"], obs.sides["overlong"]
    assert [e.get("running") for e in connloss.events if e.kind == "link_cut"] == ["doc78"]
    assert [e.get("outcome") for e in connloss.events if e.kind == "attempt_end" and e.get("doc") == "doc78"] == ["cancelled", "ok"]
    assert (overlong.failed("doc81") or {}).get("reason") == "time_limit" and len(overlong.emails) == 1
    assert not any(e.kind == "worker_exit" for e in (*connloss.events, *overlong.events))


def test_without_the_fix_a_member_runs_twice_at_once_or_the_worker_exits(lab: LabRuns) -> None:
    symptom_run(lab.of("fm9")["broken"], 9, "fm8", "S9")


def test_with_time_limits_above_the_consumer_timeout_the_broker_closes_the_channel_first(lab: LabRuns) -> None:
    report = lab.of("fm9")["weak"]
    symptom_run(report, 9, "fm9w", "S9 hard")
    assert report.log is not None and "PRECONDITION_FAILED" in (report.log.parent / report.log.name.replace(
        "-fm9w-", "-fm9w-linked-")).read_text()
