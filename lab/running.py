"""What one run needs started, watched and stopped, below the harness: the harness's runs and the case
studies' own cells both use it (the case studies are found through the lesson registry, which the harness
imports, so this cannot be the harness).

- the namespace of a program: ``checked`` (it declares nothing outside), ``reset`` (its queues, exchanges and
  Redis keys deleted, its queues declared afresh), ``purge``, ``consumers``, ``delete_names``, ``delete_keys``;
- its workers: ``running_worker`` and ``running_workers`` (started, ready, stopped: TERM, then KILL), and the
  watch during a run (``Liveness``, ``Watch``) that notices a dead worker at its next look (every 20 ms) and a
  silent service within ``SERVICE_CHECK_SECONDS`` plus its connect timeout, not at the run's deadline;
- why a run broke (``run_error``, led by the service that does not answer: ``blame_services``);
- which program each run in progress runs (``set_current``; the CLI empties its queues when interrupted);
- a case study's cell run as the harness runs a lesson's (``run_case``, ``case_run``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import redis
from kombu import Connection
from kombu.exceptions import OperationalError

from lab import services
from lab.fm import Fm
from lab.observe import client
from lab.queues import on_queue, queue_consumers
from lab.records import Check, HarnessError, Observations, OnStage, RunBroken, RunReport
from lab.runner import new_run_id
from lab.settings import amqp_name, backend_url, broker_url, mask_url, observations_url, redis_prefix
from lab.workers import LOG_DIR, STOP_GRACE, Worker, WorkerFailed, wait_stopped

SERVICE_CHECK_SECONDS = 1.0
"""How often the watch during a run asks the broker and Redis whether they answer."""


def checked(fm: Fm) -> Fm:
    """``fm``, once it is known to declare nothing outside its namespace."""
    own = amqp_name(fm.short, "")
    foreign = [n for n in (*fm.queue_names, *fm.exchange_names) if not n.startswith(own)]
    if foreign:
        raise HarnessError(f"{fm.short} declares names outside its namespace {own}*: {', '.join(foreign)}")
    return fm


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
        for queue in (*fm.task_queues, *fm.declared):  # a DeadLetteringQueue declares its DLQ too; a DLQ written
            queue.bind(conn.default_channel).declare()  # with kombu alone, and its companions, are the module's


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


CHECKED_NAMES = "checked-names"
"""``<namespace>:checked-names:queues`` / ``:exchanges``: the names of every program an exercise check is running
(``remember_names``), wherever its file lies; a check that ends deletes its names and forgets them, so only an
interrupted one leaves them here, for ``run_all_fms.py --clean``."""


def _checked_keys() -> tuple[str, str]:
    from lab.settings import NAMESPACE

    return f"{NAMESPACE}:{CHECKED_NAMES}:queues", f"{NAMESPACE}:{CHECKED_NAMES}:exchanges"


def extra_names(short: str) -> tuple[list[str], list[str]]:
    """Names a program's worker or an earlier layout of the lab may have made beside its own queues."""
    return [amqp_name(short, "dlq")], [amqp_name(short, s) for s in ("dlx", "control.pidbox", "events")]


def remember_names(fm: Fm) -> None:
    """Before a check declares anything: note its program's names (``CHECKED_NAMES``)."""
    queues, exchanges = extra_names(fm.short)
    r, (qkey, xkey) = cast(Any, client()), _checked_keys()
    r.sadd(qkey, *fm.queue_names, *queues)
    r.sadd(xkey, *fm.exchange_names, *exchanges)


def forget_names(fm: Fm) -> None:
    """Once a check has deleted its program's names: forget them (the keys go with their last name)."""
    queues, exchanges = extra_names(fm.short)
    r, (qkey, xkey) = cast(Any, client()), _checked_keys()
    r.srem(qkey, *fm.queue_names, *queues)
    r.srem(xkey, *fm.exchange_names, *exchanges)


def remembered_names() -> tuple[list[str], list[str]]:
    """The names of the checks that did not end (``CHECKED_NAMES``)."""
    r, (qkey, xkey) = cast(Any, client()), _checked_keys()
    return sorted(str(n) for n in r.smembers(qkey)), sorted(str(n) for n in r.smembers(xkey))


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


def run_error(exc: Exception) -> str:
    """Why a run ended in ERROR, led by the service that does not answer, if one does not."""
    if isinstance(exc, (WorkerFailed, RunBroken)):
        return blame_services(str(exc))
    return blame_services(service_cause(exc) or f"{type(exc).__name__}: {exc}")


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
    a lesson that stops a result backend of its own does so on purpose)."""
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
