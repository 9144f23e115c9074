"""A lesson the lab does not ship proves the seams (issue 37): its documents and faults, a side chord, a fault
injector and its checks are defined here alone, and it runs through the lab's unchanged reset, worker, runner and
injector interface, on a fixed program and on a broken one. Its lesson: a worker process killed once loses its
document unless the message is acked late (FM-2's, told again by a lesson of its own)."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from lab import harness
from lab.checks import chord_error, notify_never
from lab.faults import CRASH_ONCE
from lab.fm import Fm
from lab.injector import Injector, RunView, SideView
from lab.lesson import FolderLesson, Lesson, LessonChecks, Programs
from lab.records import Check, Collector, Observations
from lab.runner import new_run_id, run_scenario
from lab.scenarios import MAIN, Doc, Part, SideChord, cumulative

pytestmark = pytest.mark.usefixtures("real_services")


class Marker(Injector):
    """Says in the run's record that it was started, what it saw, when it sent its side chord, and stopped."""

    def __init__(self) -> None:
        self.saw_end = False
        self.stopped = False

    def start(self, run: RunView) -> None:
        run.reader.rec.event("marker_start")

    def step(self, run: RunView) -> None:
        if not self.saw_end and run.reader.has_event("attempt_end"):
            self.saw_end = True
            run.reader.rec.event("marker_saw_end")

    def send(self, run: RunView, side: SideView) -> None:
        run.reader.rec.event("marker_sent", chord_ready=str(run.chord is not None and run.chord.ready()))
        side.submit()

    def stop(self) -> None:
        self.stopped = True

    def observed(self) -> Mapping[str, object]:
        return {}


PART = Part(
    docs=(Doc("t1", None, "a healthy document"), Doc("t2", CRASH_ONCE, "its process SIGKILLed on the first attempt")),
    sides=(SideChord("later", (Doc("t3", None, "a healthy document, sent once the run's own chord is over"),),
                     "a healthy chord sent after the run's own", injector="marker", after=(MAIN,)),),
    injectors={"marker": Marker},
)


def guarantee(obs: Observations, fm: Fm) -> Check:
    c = Collector("T")
    c.expect(obs.attempts.get("t2") == 2 and obs.is_ok("t2"), f"t2 attempts {obs.attempts.get('t2')}", "2, ok")
    env = obs.chord.envelope
    c.expect(obs.chord.state == "SUCCESS" and env is not None and env.ok, f"chord {obs.chord.state}", "a SUCCESS envelope")
    later = obs.sides.get("later")
    c.expect(later is not None and later.chord.state == "SUCCESS", f"side chord {later.chord.state if later else 'missing'}",
             "SUCCESS")
    sent = [e for e in obs.events if e.kind == "marker_sent"]
    c.expect([e.get("chord_ready") for e in sent] == ["True"], f"side sent {len(sent)}x", "once, after the run's chord")
    c.expect(any(e.kind == "marker_start" for e in obs.events) and any(e.kind == "marker_saw_end" for e in obs.events),
             "the injector started and stepped", "both")
    return c.result()


def symptom(obs: Observations, fixed: Fm) -> Check:
    c = Collector("T broken")
    c.expect(obs.attempts.get("t2") == 1, f"t2 attempts {obs.attempts.get('t2')}", "1")
    chord_error(c, obs, "WorkerLostError")
    notify_never(c, obs)
    return c.result()


LESSON: Lesson = FolderLesson("killed_once", Programs("fm2_worker_crash", "fm1_mid_pipeline_error"), PART,
                              LessonChecks(guarantee, symptom))


def run(program: str) -> tuple[Observations, Marker]:
    """The lesson's scenario on ``program``, through the harness's reset and worker and the lab's runner."""
    fm = harness.load(program)
    run_id = new_run_id()
    harness.reset(fm)
    sc = cumulative(1, [LESSON.part])
    made = {name: make() for name, make in sc.injectors.items()}
    with harness.running_worker(fm, run_id, f"own-lesson-{program}", 2.0, wait=False,
                                after=lambda: harness.purge(fm)) as worker:
        obs = run_scenario(fm, sc, run_id, 60.0, sides=True, watch=harness.Liveness(worker), injectors=made)
    marker = made["marker"]
    assert isinstance(marker, Marker)
    return obs, marker


def test_a_lesson_of_its_own_holds_its_guarantee_on_its_fixed_program() -> None:
    obs, marker = run("fm2")
    check = LESSON.checks.guarantee(obs, harness.load("fm2"))
    assert check.ok, check.detail
    assert marker.stopped and obs.docs == ("t1", "t2") and sorted(obs.sides) == ["later"]


def test_a_lesson_of_its_own_shows_its_symptom_on_its_broken_program() -> None:
    obs, marker = run("fm1")
    check = LESSON.checks.symptom(obs, harness.load("fm2"))
    assert check.ok, check.detail
    assert marker.stopped
