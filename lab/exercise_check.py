"""``run_all_fms.py --check FILE`` (DESIGN.md §11): a lesson's scenario on an attendee's program, judged and said in words.

It runs the lesson's scenario (with its hard variants' documents and side chords) on the program in FILE, with the
lab's faults, in the caller's namespace, and judges the lesson's guarantee and the earlier ones, each held to the
bounds the lesson states (``lab.exercise.Stated``), never to the program's own: a fix written with Celery's own
settings or with ``shared/`` passes alike. A run whose symptom shows (``Task.early``) stops at once: a wrong answer
whose chord never ends gets its verdict then, not at the run's deadline. For a guarantee that did not hold, it
prints what was seen and what was expected, and the timelines (``lab.show.timeline``) of the documents it names.
Afterwards the program's queues and exchanges are deleted: nothing of a check stays on the broker.

No lesson is named here: what a lesson says lives in its folder (``lessons/<lesson>/exercise.py``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path

import lessons
from lab import harness, owned
from lab.exercise import ExerciseError, early, held, lesson_names, needs, number_of, shown, stated, SYMPTOM_SEEN
from lab.fm import ROOT, Fm, load_module
from lab.injector import Harnessed, Injector
from lab.owned import OwnedServiceMissing
from lab.queues import queue_consumers
from lab.running import forget_names, remember_names
from lab.records import Check, Observations, RunReport
from lab.runner import StopCondition, new_run_id, run_scenario
from lab.scenarios import Scenario
from lab.show import timeline, timeline_text
from lab.workers import LOG_DIR, STOP_GRACE, Worker, wait_stopped


# ---- checking ------------------------------------------------------------------------------------------------

EXERCISE_FILE = re.compile(r"^(?P<lesson>fm[0-9]+)[a-z]*_[a-z0-9_]+$")
"""A program the check can judge: ``<lesson><mark>_<name>.py`` (an exercise, a wrong answer, the lab's own)."""


def program_at(path: Path) -> tuple[str, Fm]:
    """The lesson a file is an exercise of (from its name) and its program, read as the harness reads an FM."""
    if not path.is_file() or path.suffix != ".py":
        raise ExerciseError(f"{path}: no such Python file")
    path = path.resolve()
    match = EXERCISE_FILE.match(path.stem)
    if match is None or match["lesson"] not in lesson_names():
        raise ExerciseError(f"{path.name}: not an exercise's name (<lesson>x_<name>.py, as --exercise writes it); "
                            f"lessons with an exercise: {', '.join(lesson_names())}")
    module, folder = _module_of(path)
    _on_worker_path(folder)
    try:
        program = harness.checked(load_module(module, folder))
    except harness.HarnessError:
        raise
    except Exception as exc:
        raise ExerciseError(f"{path.name} does not load: {type(exc).__name__}: {exc}") from exc
    return str(match["lesson"]), program


def _module_of(path: Path) -> tuple[str, Path]:
    """The module name of ``path`` and the folder to import it from (a package under the repository keeps its name)."""
    try:
        rel = path.relative_to(ROOT).with_suffix("")
    except ValueError:
        rel = None
    if rel is not None and all((ROOT / Path(*rel.parts[:i]) / "__init__.py").exists() for i in range(1, len(rel.parts))):
        return ".".join(rel.parts), ROOT
    return path.stem, path.parent


def _on_worker_path(folder: Path) -> None:
    """Workers the harness starts import the program from ``folder`` too (``lab.workers`` adds ``PYTHONPATH``)."""
    if folder == ROOT:  # a program of the lab's own (lessons/...): every lab worker imports from ROOT already
        return
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(folder) not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(folder), *parts])
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))


def focused(sc: Scenario, keep: Sequence[str]) -> Scenario:
    """``sc`` with only the documents, side chords and injectors named in ``keep`` (a wrong answer's quick verdict)."""
    wanted = set(keep)
    unknown = wanted - set(sc.docs) - {s.tag for s in sc.sides} - set(sc.injectors)
    if unknown:
        raise ExerciseError(f"--focus {', '.join(sorted(unknown))}: not in the lesson's scenario (documents: "
                            f"{', '.join(sc.docs)}; side chords: {', '.join(s.tag for s in sc.sides)}; "
                            f"injectors: {', '.join(sc.injectors)})")
    sides = tuple(s for s in sc.sides if s.tag in wanted)
    driving = {s.injector for s in sides if s.injector is not None}
    return Scenario(sc.number, {d: f for d, f in sc.faults.items() if d in wanted}, sides,
                    {n: m for n, m in sc.injectors.items() if n in wanted or n in driving},
                    {d: w for d, w in sc.what.items() if d in wanted})


INSTALLED: dict[str, Callable[[], object]] = {"redis-server": lambda: owned.available(),
                                             "rabbitmq-server": lambda: owned.rabbit_available()}
"""How to tell whether a service a lesson's scenario starts is installed (``lab.owned``)."""


def run_check(lesson: str, program: Fm, focus: Sequence[str] = (), say: Callable[[str], None] = print) -> RunReport:
    """The lesson's scenario on ``program``, judged by the lesson's guarantee and the earlier ones."""
    n, bounds = number_of(lesson), stated(lesson)
    sc = lessons.scenario(n)
    if focus:
        sc = focused(sc, focus)
    report = RunReport(lesson, "fixed", program.short, n)
    started = time.monotonic()
    label = f"{lesson}-check-{program.short}"
    try:
        missing = [name for name in needs(lesson) if not INSTALLED[name]()]
        if missing:  # said before anything starts (the scenario would meet it only when its injector acts)
            raise OwnedServiceMissing(f"needs {' and '.join(missing)}, to run a service of the lab's own")
        run_id = new_run_id()
        say("resetting the program's queues and keys")
        remember_names(program)  # before anything is declared: --clean finds them if this check never ends
        harness.reset(program)
        report.log = LOG_DIR / f"{label}-{run_id}.log"
        harness.set_current(program)
        symptom, seen = early(lesson, bounds)
        obs = _run(program, sc, run_id, label, symptom, say)
        if obs.stopped_by == SYMPTOM_SEEN and seen:
            obs = dataclasses.replace(obs, stopped_by=seen[0])
        report.observations = obs
        judged = held(program, bounds)
        judging = lessons.FMS[n - 1:n] if focus else lessons.FMS[:n]  # focused: the lesson's own guarantee alone
        report.checks = [lessons.lesson(name).checks.guarantee(obs, judged) for name in judging]
        if obs.stopped_by == "deadline":
            report.error = harness.blame_services(f"the scenario did not end within {harness.RUN_TIMEOUT:.0f}s; "
                                                  f"worker log: {report.log}")
    except harness.HarnessError:
        raise
    except OwnedServiceMissing as exc:  # this machine cannot run the lesson's scenario: said, never a pass
        report.skipped = f"the lesson's scenario needs a service of the lab's own that is not installed here ({exc})"
    except Exception as exc:  # the run could not say: its worker died, a service went away
        report.error = harness.run_error(exc)
    try:  # nothing of the check stays on the broker (its timelines are in the report)
        wait_stopped(program.short)
        harness.delete_names(program.queue_names, program.exchange_names, program)
        forget_names(program)
    except Exception as exc:
        report.error = report.error or f"could not delete the check's queues: {harness.run_error(exc)}"
    harness.set_current(None)
    report.seconds = time.monotonic() - started
    return report


def _run(program: Fm, sc: Scenario, run_id: str, label: str, symptom: tuple[str, StopCondition] | None,
         say: Callable[[str], None]) -> Observations:
    def spawn(fm: Fm, part: str, env: Mapping[str, str] | None) -> Worker:
        worker = Worker(fm, run_id, LOG_DIR / f"{label}-{part}-{run_id}.log", part=part, env=dict(env or {}))
        worker.start()
        return worker

    def serving(injectors: Mapping[str, Injector], first: Worker) -> Worker:
        for injector in injectors.values():
            first = injector.serving(first)
        return first

    with ExitStack() as stack:
        injectors = {name: make() for name, make in sc.injectors.items()}
        harnessed = Harnessed(run_id, stack, spawn, STOP_GRACE)
        lab = program
        for injector in injectors.values():
            lab = injector.prepare(lab, harnessed)
        served = lab
        say("starting the worker")
        worker = stack.enter_context(harness.running_worker(
            lab, run_id, label, STOP_GRACE, wait=False,
            after=lambda: None if serving(injectors, worker) is not worker else harness.purge(served)))
        for injector in injectors.values():
            injector.attach(worker)
        live = harness.Liveness(worker)

        def watch() -> None:
            for injector in injectors.values():
                injector.watch()
            live.worker = serving(injectors, worker)
            live()

        say("running the lesson's scenario (its documents, faults and hard variants) on your program")
        try:
            return run_scenario(lab, sc, run_id, harness.RUN_TIMEOUT, sides=True, watch=watch, injectors=injectors,
                                early=symptom)
        finally:
            for injector in injectors.values():
                injector.stop()
                for spawned in injector.workers():
                    last = spawned is serving(injectors, worker)
                    spawned.stop(STOP_GRACE, wait=False, after=(lambda: harness.purge(served)) if last else None)


# ---- the verdict in words --------------------------------------------------------------------------------------

DOC = re.compile(r"\bdoc[0-9]+\b")


def verdict(lesson: str, report: RunReport, focus: Sequence[str] = ()) -> tuple[str, int]:
    """What the attendee reads, and the exit status: 0 only when every guarantee held on the whole scenario."""
    words = lessons.words()
    n = number_of(lesson)
    out: list[str] = []
    obs = report.observations
    if obs is not None and obs.stopped_by not in ("chord finished", "deadline"):
        out.append(f"the run stopped early: {obs.stopped_by} (a symptom: your program shows it; no need to wait longer)")
    stopped_early = obs is not None and obs.stopped_by not in ("chord finished", "deadline")
    for c in report.checks:
        mine = "this lesson's guarantee" if c.label == f"G{n}" else "an earlier lesson's guarantee"
        said = words.get(c.label, "")
        if not c.ok and stopped_early and c.label != f"G{n}":
            out.append(f"  not judged {c.label} ({mine}): {said}; the run stopped at the symptom, before the chord "
                       "could complete")
        elif c.ok:
            out.append(f"  held      {c.label} ({mine}): {said}")
        else:
            out.append(f"  NOT HELD  {c.label} ({mine}): {said}")
            out.append(f"            seen, and (in brackets) what was expected instead: {c.detail}")
    if report.skipped:
        out.append(f"cannot check here: {report.skipped}")
    if report.error:
        out.append(f"the check could not judge your program: {report.error}")
    failed = [c for c in report.checks if not c.ok and not (stopped_early and c.label != f"G{n}")]
    if failed and obs is not None:
        out.append("")
        out.append("what happened to the documents those guarantees concern (seconds since the chord was sent):")
        out.extend(concerned(obs, failed))
    if report.log is not None and not report.ok:
        out.append(f"worker log: {report.log}")
    passed = report.ok and not report.skipped and not focus
    if focus:
        out.append(f"focused on {', '.join(focus)} alone: a focused check judges a wrong answer quickly and never "
                   "passes; run it without --focus to pass")
    out.append(f"{lesson} check of {report.code}: {'PASS' if passed else 'ERROR' if report.error else 'NOT PASSED'}"
               f" ({report.seconds:.1f}s)")
    return "\n".join(out), 0 if passed else 3 if report.error else 2 if report.skipped else 1


def concerned(obs: Observations, failed: Sequence[Check]) -> list[str]:
    """The timelines of the documents (and side chords) the failed checks name, and of the chord's body."""
    docs = {d for c in failed for d in DOC.findall(c.detail)}
    tags = {tag for c in failed for tag in obs.sides if re.search(rf"\b{re.escape(tag)}\b", c.detail)}
    tl = timeline.build(obs)
    sides = [s if s.tag in tags and not any(d.doc in docs for d in s.timeline.docs) else
             dataclasses.replace(s, timeline=dataclasses.replace(s.timeline, docs=tuple(d for d in s.timeline.docs
                                                                                         if d.doc in docs)))
             for s in tl.sides if s.tag in tags or any(d.doc in docs for d in s.timeline.docs)]
    mine = dataclasses.replace(tl, docs=tuple(d for d in tl.docs if d.doc in docs) or tl.docs, sides=tuple(sides))
    return ["  " + timeline_text.plain(line) for line in timeline_text.lines(mine, "")[1:]]



def refuse_busy(program: Fm) -> None:
    """A queue of the program that already has a consumer (a worker started by hand) would take the check's
    messages: say so before anything starts."""
    with harness.connect(program) as conn:
        busy = [str(q.name) for q in program.task_queues if queue_consumers(conn, str(q.name))]
    if busy:
        raise ExerciseError(f"{', '.join(busy)} already consumed: a worker of this program is running (started by "
                            "hand?); stop it, or check in another namespace (RCL_NAMESPACE=...)")


def check_command(path: Path, focus: Sequence[str] = ()) -> int:
    """``--check``: 0 only when the lesson's guarantee and the earlier ones held on the whole scenario; 1 when one
    did not; 2 for bad input or a service this machine lacks; 3 when the check could not judge (ERROR)."""
    from lab import owned, services, waiting, workers

    try:
        lesson, program = program_at(path)
        services.ensure()
        with workers.NamespaceLock():
            workers.stop_leftovers()
            for name in owned.stop_leftovers():
                print(f"stopped the lab's own {name} left running by an earlier run")
            refuse_busy(program)
            print(f"checking {shown(path)} against lesson {lesson} (program {program.short}, namespace "
                  f"{harness.NAMESPACE})", flush=True)
            try:
                report = run_check(lesson, program, focus, say=lambda s: print(f"  {s} ...", flush=True))
            except KeyboardInterrupt:
                workers.stop_leftovers(say=lambda _: None)
                harness.empty_interrupted(program)
                forget_names(program)
                print("interrupted: workers stopped, the program's queues emptied", file=sys.stderr)
                return 130
            finally:
                workers.wait_stopped()
    except (ExerciseError, harness.HarnessError, services.ServiceError, workers.NamespaceBusy) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        waiting.forget_interrupts()
    text, status = verdict(lesson, report, focus)
    print(text)
    return status
