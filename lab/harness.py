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
REPRODUCED (fm0); one whose checks do not is FAIL / NOT REPRODUCED. A run that
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

import importlib
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import redis
from kombu import Connection
from kombu.exceptions import OperationalError

import lessons
from lab import services
from lab.fm import Fm, fm_modules, load_module
from lab.observe import client, drain_last_run
from lab.injector import Harnessed, Injector
from lab.owned import OwnedServiceMissing
from lab.queues import on_queue, queue_consumers
from lab.records import Check, HarnessError, Kind, Observations, OnStage, RunBroken, RunReport, Stage
from lab.runner import StopCondition, new_run_id, run_scenario
from lab.settings import NAMESPACE, amqp_name, backend_url, broker_url, mask_url, observations_url, redis_prefix
from lab.variants import VARIANTS_DIR
from lab.waiting import raise_if_interrupted, wait_until
from lab.workers import LOG_DIR, STOP_GRACE, Worker, WorkerFailed, wait_stopped

RUN_TIMEOUT = 90.0
SERVICE_CHECK_SECONDS = 1.0
"""How often the watch during a run asks the broker and Redis whether they answer."""



# ---- finding FMs -------------------------------------------------------------


CASE_STUDIES: dict[str, str] = {"severity_batch": "case_studies.severity_batch.study",
                                 "bl_ingestion": "case_studies.bl_ingestion.study",
                                 "cte_ingestion": "case_studies.cte_ingestion.study"}
"""Each case study (``case_studies/<name>/``) and the module that runs its scenarios."""


def study(name: str) -> Any:
    """The study module of a case study, of one of its cells (``severity_batch/batch``) or of its code."""
    base = name.split("/", 1)[0]
    for case, module in CASE_STUDIES.items():
        if base == case:
            return importlib.import_module(module)
    for module in CASE_STUDIES.values():
        found = importlib.import_module(module)
        if base in found.CODES:
            return found
    raise HarnessError(f"no case study {name!r}")


def is_case(name: str) -> bool:
    """A case study's name, one of its cells, or one of its programs' codes."""
    return name.split("/", 1)[0] in CASE_STUDIES or any(name in c for c in _case_codes())


def _case_codes() -> list[dict[str, Kind]]:
    return [importlib.import_module(m).CODES for m in CASE_STUDIES.values()]


def resolve(names: list[str]) -> list[str]:
    """Short names for ``--only`` arguments given as short or full names, each once, in order."""
    modules = fm_modules()
    short_of = {**{s: s for s in modules}, **{m: s for s, m in modules.items()}, **{c: c for c in CASE_STUDIES}}
    unknown = [n for n in names if n not in short_of]
    if unknown:
        valid = ", ".join([*(f"{s} ({m})" for s, m in modules.items()), *(f"{c} (case study)" for c in CASE_STUDIES)])
        raise HarnessError(f"unknown FM {', '.join(unknown)}; valid: {valid}")
    return list(dict.fromkeys(short_of[n] for n in names))


def load(short: str) -> Fm:
    """The FM ``short`` (``fm3``), read off its module; ``fm3w`` is fm3's program as it stood before its hard fix
    (``lessons/fm3/before_hard_fix.py``); ``sb`` and ``sbw`` are case study 1's programs."""
    if is_case(short):
        found = study(short)
        return cast(Fm, found.program(found.CODES[short]))
    before = lessons.before_hard_fix(short[:-1]) if short.endswith("w") else None
    if before is not None:
        return checked(load_module(before))
    return checked(load_module(fm_modules()[short]))


def checked(fm: Fm) -> Fm:
    """``fm``, once it is known to declare nothing outside its namespace."""
    own = amqp_name(fm.short, "")
    foreign = [n for n in (*fm.queue_names, *fm.exchange_names) if not n.startswith(own)]
    if foreign:
        raise HarnessError(f"{fm.short} declares names outside its namespace {own}*: {', '.join(foreign)}")
    return fm


def number(short: str) -> int:
    return int(short[2:].rstrip("w"))


# ---- namespace reset -----------------------------------------------------------


def reset(fm: Fm) -> None:
    """Delete the FM's own queues, exchanges and Redis keys (nothing else), then declare
    its queues afresh.

    Declaring again matters: kombu remembers, per connection, what it has declared
    (``maybe_declare``), so a publisher that used the queue before the reset would
    otherwise publish to a deleted exchange, and RabbitMQ would drop the message.
    A queue left with other arguments (``PRECONDITION_FAILED`` on declare) is gone too.
    First, the last worker of the same code must be gone: its ``after()`` empties these
    queues, and would otherwise empty them under the next worker (a lost probe, seen).
    """
    wait_stopped(fm.short)
    delete_names(fm.queue_names, fm.exchange_names, fm)
    delete_keys(f"{redis_prefix(fm.short)}*")  # before the declare: on a Redis broker the bindings are keys too
    with connect(fm) as conn:
        for queue in fm.task_queues:  # a DeadLetteringQueue declares its DLQ too
            queue.bind(conn.default_channel).declare()


def connect(fm: Fm | None = None) -> Connection:
    """A broker connection: ``fm``'s own (a case study on a Redis broker, with its key prefix), else the lab's."""
    return fm.app.connection_for_write() if fm is not None else Connection(broker_url())


def delete_names(queues: Iterable[str], exchanges: Iterable[str], fm: Fm | None = None) -> None:
    """Delete these queues and exchanges (RabbitMQ 3.x: deleting a missing one is no error), on ``fm``'s broker."""
    with connect(fm) as conn:
        channel = cast(Any, conn.default_channel)  # amqp's Channel; kombu's stubs name only the base
        for name in queues:
            channel.queue_delete(queue=name)
        for name in exchanges:
            channel.exchange_delete(exchange=name)


def delete_keys(pattern: str, batch_size: int = 500) -> int:
    """Delete the Redis keys matching ``pattern`` (SCAN, never a flush); how many were deleted."""
    r = client()
    scan = cast(Callable[..., Iterator[str]], cast(Any, r).scan_iter)
    deleted, batch = 0, list[str]()
    for key in scan(match=pattern, count=batch_size):
        batch.append(str(key))
        if len(batch) >= batch_size:
            deleted += int(r.delete(*batch))
            batch.clear()
    if batch:
        deleted += int(r.delete(*batch))
    return deleted


# ---- workers (their processes: lab.workers) ------------------------------------


@contextmanager
def running_worker(fm: Fm, run_id: str, label: str, grace: float, on_stage: OnStage = lambda _: None,
                   wait: bool = True, after: Callable[[], object] | None = None) -> Generator[Worker, None, None]:
    worker = Worker(fm, run_id, LOG_DIR / f"{label}-{run_id}.log")
    on_stage("starting the worker")
    worker.start()
    try:
        on_stage("waiting for the worker")
        worker.wait_ready()
        yield worker
    finally:
        on_stage("stopping the worker")
        worker.stop(grace, wait, after)


@dataclass(frozen=True)
class WorkerSpec:
    """One of several workers of a program: its queue (``-Q``), extra environment, and a name part."""

    queue: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    part: str = ""


@contextmanager
def running_workers(fm: Fm, run_id: str, label: str, specs: list[WorkerSpec], grace: float,
                    on_stage: OnStage = lambda _: None, after: Callable[[], object] | None = None
                    ) -> Generator[list[Worker], None, None]:
    """Several workers of one program (a case study that runs one worker per shard queue), started
    in the order given and each ready before the next starts; all stopped (TERM, then KILL) at the end,
    ``after()`` once the last is gone."""
    started: list[Worker] = []
    on_stage("starting the worker")
    try:
        for spec in specs:
            worker = Worker(fm, run_id, LOG_DIR / f"{label}{'-' + spec.part if spec.part else ''}-{run_id}.log",
                            queue=spec.queue, env=dict(spec.env), part=spec.part)
            started.append(worker)
            worker.start()
            on_stage("waiting for the worker")
            worker.wait_ready()
        yield started
    finally:
        on_stage("stopping the worker")
        for worker in started:
            worker.stop(grace, wait=False, after=after if worker is started[-1] else None)


class Watch:
    """``Liveness`` over several workers: raises ``RunBroken`` when any died or a service went silent."""

    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers
        self.services = Liveness(workers[0])  # the services are asked once per period, not once per worker

    def __call__(self) -> None:
        for worker in self.workers:
            proc = worker.proc
            if proc is not None and proc.poll() is not None:
                raise RunBroken(f"the worker {worker.name} exited ({proc.returncode}) during the run; log tail:\n"
                                f"{worker.tail()}")
        self.services()


# ---- runs ----------------------------------------------------------------------


def run_one(fm: str, kind: Kind, on_stage: OnStage) -> RunReport:
    """fixed: scenario N on FM N; broken: scenario N on FM N-1; weak: scenario N on FM N
    without the fix of its hard variant (``lessons/<fm>/before_hard_fix.py``); bug: scenario 1 on fm0.

    ``on_stage`` hears each stage as it begins: resetting, starting the worker,
    waiting for the worker, running the scenario, stopping the worker, checking
    (and cleaning up, after a broken run that left a looping message behind).
    """
    on_stage = _interruptible(on_stage)
    if is_case(fm):
        return cast(RunReport, study(fm).run_one(fm, kind, on_stage))
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


_current: dict[int, Fm] = {}
"""The FM whose code each run in progress runs, by the thread that runs it (``--jobs``: several)."""


def set_current(fm: Fm | None) -> None:
    """Say which FM's code this thread's run runs now (None: its run is over)."""
    if fm is None:
        _current.pop(threading.get_ident(), None)
    else:
        _current[threading.get_ident()] = fm


def interrupted_fms() -> list[Fm]:
    """The FMs whose runs were in progress when an interruption ended them (their queues are emptied)."""
    return list(_current.values())


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


def run_error(exc: Exception) -> str:
    """Why a run ended in ERROR, led by the service that does not answer, if one does not."""
    if isinstance(exc, (WorkerFailed, RunBroken)):
        return blame_services(str(exc))
    return blame_services(service_cause(exc) or f"{type(exc).__name__}: {exc}")


def case_cells(name: str, scenarios: Iterable[str], writeup_shows: Iterable[str], prove: bool) -> list[tuple[str, Kind]]:
    """A case study's cells: each scenario on its fixed program, and with ``prove`` on the write-up's."""
    shows = set(writeup_shows)
    runs: list[tuple[str, Kind]] = []
    for scenario_name in scenarios:
        runs.append((f"{name}/{scenario_name}", "fixed"))
        if prove and scenario_name in shows:
            runs.append((f"{name}/{scenario_name}", "broken"))
    return runs


def case_run(report: RunReport, run: Callable[[RunReport], None]) -> RunReport:
    """A case study's cell: ``run(report)`` fills the report in; a dead worker, a silent service or
    any other error of the run becomes its ``error`` (a ``HarnessError`` goes up), and the time taken."""
    started = time.monotonic()
    try:
        run(report)
    except HarnessError:
        raise
    except Exception as exc:  # one broken run must not hide the others
        report.error = run_error(exc)
    set_current(None)
    report.seconds = time.monotonic() - started
    return report


R = TypeVar("R")


def run_case(report: RunReport, program: Callable[[], Fm], label: str, on_stage: OnStage,
             scenario: Callable[[Fm, str, Callable[[], None]], R], observed: Callable[[R], Observations],
             checked_by: Callable[[R], list[Check]], prepare: Callable[[Fm], object] = lambda _: None,
             around: Callable[[], AbstractContextManager[object]] = nullcontext) -> RunReport:
    """A case study's cell on one worker, run as ``run_one`` runs an FM's: its program's namespace
    reset (and ``prepare``), its worker started (inside ``around``), ``scenario(fm, run_id, watch)``,
    the worker stopped, ``checked_by`` its result (``case_run`` turns a failure into an ERROR)."""

    def run(report: RunReport) -> None:
        fm = program()
        report.body = str(fm.notify.name).rsplit(".", 1)[-1]
        run_id = new_run_id()
        on_stage("resetting")
        reset(fm)
        prepare(fm)
        report.log = LOG_DIR / f"{label}-{run_id}.log"
        set_current(fm)
        with around(), running_worker(fm, run_id, label, STOP_GRACE, on_stage, wait=False,
                                      after=lambda: purge(fm)) as worker:
            on_stage("running the scenario")
            result = scenario(fm, run_id, Liveness(worker))
        report.observations = observed(result)
        on_stage("checking")
        report.checks = checked_by(result)

    return case_run(report, run)


def _interruptible(on_stage: OnStage) -> OnStage:
    """``on_stage`` that first raises a recorded interruption (``lab.waiting``)."""

    def stage(s: Stage) -> None:
        raise_if_interrupted()
        on_stage(s)

    return stage


def empty_interrupted(fm: Fm, deadline: float = 5.0) -> None:
    """After an interruption (its workers already killed): delete ``fm``'s queues and exchanges.

    Deleted, not purged and not declared again. What was seen in the lab's tries
    (SIGHUP of ``run_all_fms.py --only fm6`` just as its scenario started): after a
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


def consumers(fm: Fm) -> int:
    """Consumers on ``fm``'s queues, as the broker counts them (a Redis broker counts none)."""
    with connect(fm) as conn:
        return sum(queue_consumers(conn, name) for name in fm.queue_names)


def purge(fm: Fm) -> int:
    """Empty ``fm``'s queues (those that exist); how many messages were removed."""
    with connect(fm) as conn:
        return sum(on_queue(conn, lambda ch, q=name: ch.queue_purge(queue=q)) for name in fm.queue_names)


class Liveness:
    """The watch during a run: raises ``RunBroken`` when the worker died or a service went silent."""

    def __init__(self, worker: Worker, every: float = SERVICE_CHECK_SECONDS) -> None:
        self.worker, self.every = worker, every
        self.checked = time.monotonic()

    def __call__(self) -> None:
        proc = self.worker.proc
        if proc is not None and proc.poll() is not None:
            raise RunBroken(f"the worker exited ({proc.returncode}) during the run; log tail:\n{self.worker.tail()}")
        if time.monotonic() - self.checked < self.every:
            return
        self.checked = time.monotonic()
        for named, problem in service_problems():
            raise RunBroken(f"{named} {problem} during the run; worker log tail:\n{self.worker.tail(8)}")


def service_problems() -> list[tuple[str, str]]:
    """``(the service at its masked URL, what is wrong)`` for each service that does not answer now: the broker
    and the Redis of the run's record (the result backend's, unless ``RCL_OBSERVATIONS_URL`` names another:
    scenario 8 stops a result backend of its own on purpose)."""
    found: list[tuple[str, str]] = []
    for what, url, problem in (("the broker", broker_url(), services.broker_problem(timeout=2.0)),
                               ("Redis", observations_url(), services.backend_problem(observations_url(), timeout=2.0))):
        if problem is not None:
            found.append((f"{what} at {mask_url(url)}", problem))
    return found


def blame_services(error: str) -> str:
    """``error``, led by the service that does not answer now, if one does not: a worker
    that died because Redis went away is reported as Redis going away."""
    for named, problem in service_problems():
        if named not in error:
            return f"{named} {problem}; {error}"
    return error


def service_cause(exc: BaseException) -> str | None:
    """A service error in words, naming the service's URL (masked); None for anything else."""
    if isinstance(exc, redis.RedisError):
        return f"Redis at {mask_url(backend_url())} stopped answering: {type(exc).__name__}: {exc}"
    if isinstance(exc, (OperationalError, ConnectionError)):
        return f"the broker at {mask_url(broker_url())} stopped answering: {type(exc).__name__}: {exc}"
    return None


def _checks(kind: Kind, n: int, obs: Observations, fixed: Fm) -> list[Check]:
    """fixed: G1..Gn of FM n; broken: Sn; weak: Sn hard; bug: S1 (fm0's own bug): the lessons' (``lessons``)."""
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
    """The FM whose code a run runs: its own (fixed), the one before (broken), its weak variant, fm0 (bug)."""
    if is_case(fm):
        return cast(str, study(fm).code_of(kind))
    if kind == "weak":
        return f"{fm}w"
    return fm if kind == "fixed" else f"fm{number(fm) - 1}" if kind == "broken" else "fm0"


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
    for module in CASE_STUDIES.values():  # their ledgers' rows in this namespace (the tables stay)
        try:
            importlib.import_module(module).clear_ledger()
        except RunBroken as exc:  # a database that does not answer: said, and the rest is still cleaned
            say(f"namespace {NAMESPACE}: {exc}; its rows there are left")
    say(f"namespace {NAMESPACE}: deleted its queues and exchanges (of the {len(queues)} queue and {len(exchanges)} "
        f"exchange names the lab may have made, those that existed) and {deleted} Redis key(s)")


def namespace_names() -> tuple[list[str], list[str]]:
    """Every queue and exchange name the lab may have made in the namespace (FMs, variants, case studies)."""
    shorts = list(fm_modules())
    fms = [load(s) for s in shorts] + [load(code) for codes in _case_codes() for code in codes]
    fms += [load(f"{s}w") for s in shorts if lessons.before_hard_fix(s) is not None]
    for path in sorted(VARIANTS_DIR.glob("fm*_*.py")) if VARIANTS_DIR.exists() else []:
        try:
            fms.append(checked(load_module(path.stem, VARIANTS_DIR)))
        except Exception:
            continue
    queues = {name for fm in fms for name in fm.queue_names}
    exchanges = {name for fm in fms for name in fm.exchange_names}
    for short in {fm.short for fm in fms}:  # names earlier layouts of the lab and Celery's remote control used
        queues.update(amqp_name(short, s) for s in ("dlq",))
        exchanges.update(amqp_name(short, s) for s in ("dlx", "control.pidbox", "events"))
    return sorted(queues), sorted(exchanges)


def plan(selected: list[str], include_fm0: bool, prove: bool) -> list[tuple[str, Kind]]:
    runs: list[tuple[str, Kind]] = []
    for fm in selected:
        if is_case(fm):
            runs.extend(study(fm).cells(prove))
            continue
        n = number(fm)
        if n == 0:
            continue
        runs.append((fm, "fixed"))
        if prove:
            runs.append((fm, "broken"))
            if lessons.before_hard_fix(fm) is not None:
                runs.append((fm, "weak"))
    if include_fm0 or "fm0" in selected:
        runs.insert(0, ("fm0", "bug"))
    return runs


def checks_of(kind: Kind, n: int, obs: Observations, fixed: Fm) -> list[Check]:
    """The checks of a run of ``kind`` on scenario ``n`` (``_checks``), for a run the harness did not start."""
    return _checks(kind, n, obs, fixed)
