"""The harness behind ``run_all_fms.py`` (DESIGN.md §3).

It learns everything about an FM from the FM module itself (``lab.fm``: its
``app``, tasks and ``submit``): there is no second table of FM specs here. FM
modules are found by file name (``fm<N>_<name>.py`` next to ``run_all_fms.py``).

One run: reset the FM's own namespace (its queues and exchanges over AMQP, its
``rcl:<fm>:*`` Redis keys), start ``celery -A <module> worker`` with the FM's
flags (``lab.fm.Fm.worker_args``, the command its docstring gives) in its own process group, wait until it answers a probe task, run the
scenario, check, stop the worker (TERM, then KILL) and keep its log in
``.lab/<namespace>/logs/`` (``lab.workers``).

Verdicts: a run whose checks all hold is PASS (fixed), REPRODUCED (broken) or BUG
REPRODUCED (the naive program); one whose checks do not is FAIL / NOT REPRODUCED. A run that
could not say either is ERROR, with the cause: its worker died, a service
stopped answering (URL masked) or the scenario did not end before its deadline.
The watch during a run (``Liveness``) notices a dead worker at its next look
(every 20 ms) and a silent service within ``SERVICE_CHECK_SECONDS`` plus its
connect timeout, not at the run's deadline.

One piece: it is the one place that starts, watches and stops what a run needs (the namespace's reset,
workers, the injectors' services) and turns a run into its report; the records, the runner and the lessons it
calls live apart.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from typing import Any, cast

from kombu import Connection

import lessons
from lab.fm import Fm, load_module
from lab.observe import drain_last_run
from lab.injector import Harnessed, Injector
from lab.lesson import CaseStudy
from lab.owned import OwnedServiceMissing
from lab.queues import queue_consumers
from lab.records import Check, HarnessError, Kind, Observations, OnStage, RunBroken, RunReport, Stage
from lab.runner import StopCondition, new_run_id, run_scenario
from lab.running import (Liveness, blame_services, checked, consumers, delete_keys, delete_names, extra_names,
                         purge, remembered_names, reset, running_worker, run_error, set_current)
from lab.running import (SERVICE_CHECK_SECONDS as SERVICE_CHECK_SECONDS, Watch as Watch, connect as connect,
                         interrupted_fms as interrupted_fms, running_workers as running_workers,
                         service_problems as service_problems)  # what the CLI, by-hand runs and benches take here
from lab.settings import NAMESPACE, amqp_name as amqp_name, broker_url, redis_prefix
from lab.variants import VARIANTS_DIR
from lab.waiting import raise_if_interrupted, wait_until
from lab.workers import LOG_DIR, STOP_GRACE, Worker

RUN_TIMEOUT = 90.0
# ---- finding lessons and case studies (the registry: ``lessons``) -------------------------


def study(name: str) -> CaseStudy:
    """The case study named ``name``, or of one of its cells (``severity_batch/batch``) or of its programs' codes."""
    found = lessons.case_study(name)
    if found is None:
        raise HarnessError(f"no case study {name!r}")
    return found


def is_case(name: str) -> bool:
    """A case study's name, one of its cells, or one of its programs' codes."""
    return lessons.case_study(name) is not None


def resolve(names: list[str]) -> list[str]:
    """Short names for ``--only`` arguments given as short or full names, each once, in order."""
    modules = lessons.modules()
    cases = [c.name for c in lessons.CASE_STUDIES]
    short_of = {**{s: s for s in modules}, **{m: s for s, m in modules.items()}, **{c: c for c in cases}}
    unknown = [n for n in names if n not in short_of]
    if unknown:
        valid = ", ".join([*(f"{s} ({m})" for s, m in modules.items()), *(f"{c} (case study)" for c in cases)])
        raise HarnessError(f"unknown FM {', '.join(unknown)}; valid: {valid}")
    return list(dict.fromkeys(short_of[n] for n in names))


def load(short: str) -> Fm:
    """The program ``short`` (a lesson's short name), read off its module; ``<short>w`` is that lesson's program
    as it stood before its hard fix (``lessons/<short>/before_hard_fix.py``); a case study's codes (``sb``,
    ``sbw``) are its fixed program and its write-up's."""
    if (case := lessons.case_study(short)) is not None:
        return case.program(case.codes[short])
    before = lessons.before_hard_fix(short[:-1]) if short.endswith("w") else None
    if before is not None:
        return checked(load_module(before))
    return checked(load_module(lessons.modules()[short]))


def number(short: str) -> int:
    """The number of the lesson whose program ``short`` is (its weak variant's too); 0 for the naive program."""
    return lessons.number(short[:-1] if short.endswith("w") and short[:-1] in lessons.FMS else short)


# ---- runs ----------------------------------------------------------------------


def run_one(fm: str, kind: Kind, on_stage: OnStage) -> RunReport:
    """fixed: scenario N on FM N; broken: scenario N on FM N-1; weak: scenario N on FM N
    without the fix of its hard variant (``lessons/<fm>/before_hard_fix.py``); bug: the first scenario on the
    naive program (``lessons.NAIVE``). A case study's cell is the case study's own (``CaseStudy.run_one``).

    ``on_stage`` hears each stage as it begins: resetting, starting the worker,
    waiting for the worker, running the scenario, stopping the worker, checking
    (and cleaning up, after a broken run that left a looping message behind).
    """
    on_stage = _interruptible(on_stage)
    if is_case(fm):
        return study(fm).run_one(fm, kind, on_stage)
    n = number(fm)
    code = code_of(fm, kind)
    sc_n = 1 if kind == "bug" else n
    report = RunReport(fm, kind, code, sc_n)
    started = time.monotonic()
    try:
        lab = load(code)
        fixed = load(fm) if kind in ("broken", "weak") else lab
        stop: tuple[str, StopCondition] | None = lessons.stop_of(kind, n, fixed, lab)
        run_id = new_run_id()
        on_stage("resetting")
        reset(lab)  # after the last worker of this code is gone and its queues emptied
        label = f"{fm}-{kind}-{code}"
        report.log = LOG_DIR / f"{label}-{run_id}.log"
        set_current(lab)
        sc = lessons.scenario_for(kind, sc_n)  # a symptom's run: only the faults its check needs
        grace = 0.5 if stop else STOP_GRACE
        with ExitStack() as stack:
            injectors = {name: make() for name, make in sc.injectors.items()}
            harnessed = Harnessed(run_id, stack, lambda program, part, env: _spawn(program, run_id, label, part, env), grace)
            for injector in injectors.values():  # a backend or a broker node of the run's own, before the worker
                lab = injector.prepare(lab, harnessed)
            served = lab
            worker = stack.enter_context(running_worker(
                lab, run_id, label, grace, on_stage, wait=False,
                after=lambda: None if _serving(injectors, worker) is not worker else purge(served)))
            for injector in injectors.values():
                injector.attach(worker)
            on_stage("running the scenario")
            try:  # the hard variants' own chords; a broken run's too when its symptom is in a chord sent after its own
                obs = run_scenario(lab, sc, run_id, RUN_TIMEOUT, stop=stop,
                                   sides=kind in ("fixed", "weak") or any(side.after for side in sc.sides),
                                   watch=_watch(worker, injectors), injectors=injectors)
            finally:
                for injector in injectors.values():  # the workers they started, the serving one last (then the purge)
                    injector.stop()
                    for spawned in injector.workers():
                        last = spawned is _serving(injectors, worker)
                        spawned.stop(grace, wait=False, after=(lambda: purge(served)) if last else None)
        report.observations = obs
        report.drain_last_run = drain_last_run(redis_prefix(lab.short)) if lab.beat else None
        on_stage("checking")
        report.checks = _checks(kind, n, obs, fixed)
        if obs.stopped_by == "deadline":
            report.error = blame_services(f"the scenario did not end within {RUN_TIMEOUT:.0f}s; worker log: {report.log}")
        if stop is not None:
            on_stage("cleaning up")
            reset(lab)  # the looping message goes with the FM's own queues
    except HarnessError:
        raise
    except OwnedServiceMissing as exc:  # this machine cannot run the scenario: said, not failed
        what = "runs a rabbitmq-server" if "rabbitmq" in str(exc) else "stops and starts a redis-server"
        report.skipped = f"scenario {sc_n} {what} of the lab's own; none is installed here ({exc})"
    except Exception as exc:  # one broken run must not hide the others
        report.error = run_error(exc)
    set_current(None)  # not on an interruption: the CLI empties the interrupted FM's queues
    report.seconds = time.monotonic() - started
    return report



def _spawn(fm: Fm, run_id: str, label: str, part: str, env: Mapping[str, str] | None = None) -> Worker:
    """A worker an injector starts (``lab.injector.Harnessed.spawn``): another of the same code (a deploy's, which
    waits for its consumer), or one with ``env`` (a broker node's URL), started."""
    worker = Worker(fm, run_id, LOG_DIR / f"{label}-{part}-{run_id}.log", part=part, env=dict(env or {}))
    worker.start()
    return worker


def _serving(injectors: Mapping[str, Injector], first: Worker) -> Worker:
    """The worker that serves the run now: the first, unless an injector replaced it (a deploy)."""
    worker = first
    for injector in injectors.values():
        worker = injector.serving(worker)
    return worker


def _watch(first: Worker, injectors: Mapping[str, Injector]) -> Callable[[], None]:
    """``Liveness`` that follows the serving worker, and each injector's own workers."""
    live = Liveness(first)

    def watch() -> None:
        for injector in injectors.values():
            injector.watch()
        live.worker = _serving(injectors, first)
        live()

    return watch


def _interruptible(on_stage: OnStage) -> OnStage:
    """``on_stage`` that first raises a recorded interruption (``lab.waiting``)."""

    def stage(s: Stage) -> None:
        raise_if_interrupted()
        on_stage(s)

    return stage


def empty_interrupted(fm: Fm, deadline: float = 5.0) -> None:
    """After an interruption (its workers already killed): delete ``fm``'s queues and exchanges.

    Deleted, not purged and not declared again. What was seen in the lab's tries
    (SIGHUP of ``run_all_fms.py --only <an FM>`` just as its scenario started): after a
    purge, or after a delete and a new declare, a message published just before the
    interruption (a ``fetch_document`` of ``submit``, a beat ``drain_dead_letters``)
    was still found in the queue in 1 of 5 to 1 of 12 tries; RabbitMQ orders frames
    per connection, not across connections. With no queue left, 20 of 20 tries
    ended with nothing behind. The next run (its reset), or a worker you start by
    hand, declares the queues again. Before deleting, it closes the harness's own
    connections (in a thread, given ``deadline``: a publish cut off mid-frame may
    never be answered) and waits until the broker counts no consumer on the FM's
    queues, i.e. has seen the killed workers' connections close.
    """
    closer = threading.Thread(target=lambda: cast(Any, fm.app.pool).force_close_all(close_pool=False), daemon=True)
    closer.start()
    closer.join(deadline)
    wait_until(lambda: consumers(fm) == 0, deadline, interval=0.05)
    delete_names(fm.queue_names, fm.exchange_names, fm)


def _checks(kind: Kind, n: int, obs: Observations, fixed: Fm) -> list[Check]:
    """fixed: G1..Gn of FM n; broken: Sn; weak: Sn hard; bug: S1 (the naive program's own bug): the lessons'."""
    return lessons.checks_of(kind, n, obs, fixed)


def describe(r: RunReport) -> str:
    """A run's verdict line and one line per check (and where its worker log is, if it failed)."""
    head = f"{r.fm} {r.kind} (scenario {r.scenario} on {r.code}, {r.seconds:.1f}s): {r.verdict}"
    body = [f"  {'ok  ' if c.ok else 'FAIL'} {c.label}: {c.detail}" for c in r.checks]
    if r.skipped:
        body.append(f"  skipped: {r.skipped}")
    if r.error:
        body.append(f"  error: {r.error}")
    if not r.ok and r.log is not None:
        body.append(f"  worker log: {r.log}")
    return "\n".join([head, *body])


def code_of(fm: str, kind: Kind) -> str:
    """The program a run runs: its lesson's own (fixed), the one before (broken), its weak variant, the naive
    program (bug); a case study's, by the code it gives that program."""
    if (case := lessons.case_study(fm)) is not None:
        return next(code for code, of in case.codes.items() if of == kind)
    if kind == "weak":
        return f"{fm}w"
    return fm if kind == "fixed" else lessons.broken_code(fm) if kind == "broken" else lessons.NAIVE


def codes_of(runs: list[tuple[str, Kind]]) -> list[str]:
    """The FMs whose code the runs run, each once."""
    return list(dict.fromkeys(code_of(fm, kind) for fm, kind in runs))


def refuse_busy_queues(codes: list[str]) -> None:
    """A lab queue that already has a consumer (a worker started by hand, another
    checkout) would take the run's messages: name it and stop, before anything starts."""
    busy: list[str] = []
    with Connection(broker_url()) as conn:
        for short in codes:
            for queue in load(short).task_queues:
                if n := queue_consumers(conn, str(queue.name)):
                    busy.append(f"{queue.name} ({n} consumer{'s' if n > 1 else ''})")
    if busy:
        raise HarnessError(f"{', '.join(busy)} already consumed: a worker started by hand, or a lab run from another "
                           "checkout, would take this run's messages. Stop it, or run in another namespace "
                           "(RCL_NAMESPACE=...).")


def clean(say: Callable[[str], None] = print) -> None:
    """Delete every queue, exchange and Redis key of the namespace, and nothing else."""
    queues, exchanges = namespace_names()
    delete_names(queues, exchanges)
    deleted = delete_keys(f"{NAMESPACE}:*")
    for case in lessons.CASE_STUDIES:  # their ledgers' rows in this namespace (the tables stay)
        try:
            case.clear()
        except RunBroken as exc:  # a database that does not answer: said, and the rest is still cleaned
            say(f"namespace {NAMESPACE}: {exc}; its rows there are left")
    say(f"namespace {NAMESPACE}: deleted its queues and exchanges (of the {len(queues)} queue and {len(exchanges)} "
        f"exchange names the lab may have made, those that existed) and {deleted} Redis key(s)")


def namespace_names() -> tuple[list[str], list[str]]:
    """Every queue and exchange name the lab may have made in the namespace (FMs, variants, case studies, the
    exercises' wrong and right answers, the starting files in ``exercises/``, and the programs of checks that did
    not end, wherever their files lie: ``lab.running.remembered_names``)."""
    shorts = list(lessons.modules())
    fms = [load(s) for s in shorts] + [load(code) for case in lessons.CASE_STUDIES for code in case.codes]
    fms += [load(f"{s}w") for s in shorts if lessons.before_hard_fix(s) is not None]
    for path in sorted(VARIANTS_DIR.glob("fm*_*.py")) if VARIANTS_DIR.exists() else []:
        try:
            fms.append(checked(load_module(path.stem, VARIANTS_DIR)))
        except Exception:
            continue
    fms += _exercise_programs()
    queues = {name for fm in fms for name in fm.queue_names}
    exchanges = {name for fm in fms for name in fm.exchange_names}
    for short in {fm.short for fm in fms}:  # names earlier layouts of the lab and Celery's remote control used
        more_queues, more_exchanges = extra_names(short)
        queues.update(more_queues)
        exchanges.update(more_exchanges)
    checked_queues, checked_exchanges = remembered_names()
    return sorted(queues | set(checked_queues)), sorted(exchanges | set(checked_exchanges))


def _exercise_programs() -> list[Fm]:
    """The wrong and right answers kept in the lessons, and the starting files in the default exercises folder (an
    attendee's file that does not load is skipped: its names are remembered when it is checked)."""
    from lab.exercise import DEFAULT_FOLDER
    from lab.fm import ROOT

    found: list[Fm] = []
    for path in sorted([*lessons.HERE.glob("fm*/wrong/fm*_*.py"), *lessons.HERE.glob("fm*/right/fm*_*.py")]):
        found.append(checked(load_module(".".join(path.relative_to(ROOT).with_suffix("").parts))))
    for path in sorted(DEFAULT_FOLDER.glob("fm*_*.py")) if DEFAULT_FOLDER.is_dir() else []:
        try:
            found.append(checked(load_module(path.stem, DEFAULT_FOLDER)))
        except Exception:
            continue
    return found


def plan(selected: list[str], include_fm0: bool, prove: bool) -> list[tuple[str, Kind]]:
    """The runs of the selected lessons (with ``prove``, their broken and weak runs too) and case studies, the
    naive program's bug first when asked for (``include_fm0``, the CLI's option) or selected."""
    runs: list[tuple[str, Kind]] = []
    for fm in selected:
        if (case := lessons.case_study(fm)) is not None:
            runs.extend(lessons.study_cells(case, prove))
            continue
        n = number(fm)
        if n == 0:
            continue
        runs.append((fm, "fixed"))
        if prove:
            runs.append((fm, "broken"))
            if lessons.before_hard_fix(fm) is not None:
                runs.append((fm, "weak"))
    if include_fm0 or lessons.NAIVE in selected:
        runs.insert(0, lessons.NAIVE_BUG)
    return runs


def checks_of(kind: Kind, n: int, obs: Observations, fixed: Fm) -> list[Check]:
    """The checks of a run of ``kind`` on scenario ``n`` (``_checks``), for a run the harness did not start."""
    return _checks(kind, n, obs, fixed)
