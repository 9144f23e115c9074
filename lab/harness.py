"""The harness behind ``run_all_fms.py`` (DESIGN.md §3).

It learns everything about an FM from the FM module itself (``lab.fm``: its
``app``, tasks and ``submit``): there is no second table of FM specs here. FM
modules are found by file name (``fm<N>_<name>.py`` next to ``run_all_fms.py``).

One run: reset the FM's own namespace (its queues and exchanges over AMQP, its
``rcl:<fm>:*`` Redis keys), start ``celery -A <module> worker`` with the FM's
flags (``lab.fm.Fm.worker_args``, the command its docstring gives) in its own process group, wait until it answers a probe task, run the
scenario, check, stop the worker (TERM, then KILL) and keep its log in
``.lab/logs/``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

from kombu import Connection

from lab import checks, services
from lab.checks import Check
from lab.fm import ROOT, Fm, NotAnFm, fm_modules, load_module
from lab.observe import client
from lab.runner import Observations, StopCondition, new_run_id, probe_seconds, run_scenario
from lab.scenarios import scenario
from lab.settings import amqp_name, broker_url, redis_prefix
from lab.variants import VARIANTS_DIR
from lab.waiting import wait_until

LAB_DIR = ROOT / ".lab"
LOG_DIR = LAB_DIR / "logs"
WORKERS_DIR = LAB_DIR / "workers"
READY_TIMEOUT = 60.0
RUN_TIMEOUT = 90.0
STOP_GRACE = 5.0

Kind = Literal["fixed", "broken", "bug"]
Stage = Literal["resetting", "starting the worker", "waiting for the worker", "running the scenario",
                "stopping the worker", "checking", "cleaning up"]
OnStage = Callable[[Stage], None]
"""Told each stage of a run as it begins (``print`` will do; ``lab.show.progress`` draws it)."""


class HarnessError(Exception):
    """Something the user must fix (exit 2), said without a traceback."""


class WorkerFailed(Exception):
    """The worker exited or never became ready; carries the tail of its log."""


# ---- finding FMs -------------------------------------------------------------


def resolve(names: list[str]) -> list[str]:
    """Short names for ``--only`` arguments given as short or full names."""
    modules = fm_modules()
    short_of = {**{s: s for s in modules}, **{m: s for s, m in modules.items()}}
    unknown = [n for n in names if n not in short_of]
    if unknown:
        valid = ", ".join(f"{s} ({m})" for s, m in modules.items())
        raise HarnessError(f"unknown FM {', '.join(unknown)}; valid: {valid}")
    return [short_of[n] for n in names]


def load(short: str) -> Fm:
    """The FM ``short`` (``fm3``), read off its module."""
    return checked(load_module(fm_modules()[short]))


def checked(fm: Fm) -> Fm:
    """``fm``, once it is known to declare nothing outside its namespace."""
    own = amqp_name(fm.short, "")
    foreign = [n for n in (*fm.queue_names, *fm.exchange_names) if not n.startswith(own)]
    if foreign:
        raise HarnessError(f"{fm.short} declares names outside its namespace {own}*: {', '.join(foreign)}")
    return fm


def number(short: str) -> int:
    return int(short[2:])


# ---- namespace reset -----------------------------------------------------------


def reset(fm: Fm) -> None:
    """Delete the FM's own queues, exchanges and Redis keys (nothing else), then declare
    its queues afresh.

    Declaring again matters: kombu remembers, per connection, what it has declared
    (``maybe_declare``), so a publisher that used the queue before the reset would
    otherwise publish to a deleted exchange, and RabbitMQ would drop the message.
    A queue left with other arguments (``PRECONDITION_FAILED`` on declare) is gone too.
    """
    with Connection(broker_url()) as conn:
        channel = cast(Any, conn.default_channel)  # amqp's Channel; kombu's stubs name only the base
        for name in fm.queue_names:
            channel.queue_delete(queue=name)
        for name in fm.exchange_names:
            channel.exchange_delete(exchange=name)
        for queue in fm.task_queues:  # a DeadLetteringQueue declares its DLQ too
            queue.bind(channel).declare()
    r = client()
    batch: list[str] = []
    scan = cast(Callable[..., Iterator[str]], cast(Any, r).scan_iter)
    for key in scan(match=f"{redis_prefix(fm.short)}*", count=500):
        batch.append(str(key))
        if len(batch) >= 500:
            r.delete(*batch)
            batch.clear()
    if batch:
        r.delete(*batch)


# ---- workers -------------------------------------------------------------------


@dataclass
class Worker:
    fm: Fm
    run_id: str
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        WORKERS_DIR.mkdir(parents=True, exist_ok=True)
        fm = self.fm
        cmd = [sys.executable, "-m", "celery", "-A", fm.module, "worker", "--loglevel=INFO",
               "-n", f"{fm.short}-{self.run_id}@%h", *fm.worker_args()]
        if fm.beat:
            cmd += ["--schedule", str(LAB_DIR / f"beat-{fm.short}-{self.run_id}")]
        path = os.pathsep.join(p for p in (str(ROOT), str(VARIANTS_DIR), os.environ.get("PYTHONPATH", "")) if p)
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path})
        (WORKERS_DIR / str(self.proc.pid)).write_text(json.dumps({"fm": fm.short, "run": self.run_id}))

    def tail(self, lines: int = 25) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Ready means: it took a probe task from the FM's queue and answered."""
        proc = self.proc
        if proc is None:
            raise WorkerFailed("worker was never started")
        res = self.fm.probe.apply_async()

        def answered() -> bool:
            if proc.poll() is not None:
                raise WorkerFailed(f"worker exited with {proc.returncode} before it was ready; log tail:\n{self.tail()}")
            return res.ready()

        if not wait_until(answered, timeout, interval=0.05):
            raise WorkerFailed(f"worker not ready after {timeout:.0f}s; log tail:\n{self.tail()}")
        res.forget()

    def stop(self, grace: float = STOP_GRACE, wait: bool = True) -> None:
        """TERM (Celery's warm shutdown), then KILL the whole group after ``grace`` seconds.

        With ``wait=False`` the TERM is sent at once and the rest happens on a thread, so
        the next run can start while this worker finishes its shutdown (about 0.8 s
        for Celery 5.7 even when idle: it has stopped consuming by then);
        ``wait_stopped()`` joins those threads, and the CLI calls it before it exits.
        """
        proc = self.proc
        if proc is None:
            return
        self.proc = None
        _signal_group(proc.pid, signal.SIGTERM)

        def finish() -> None:
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
            _signal_group(proc.pid, signal.SIGKILL)  # pool children and beat too
            proc.wait()
            (WORKERS_DIR / str(proc.pid)).unlink(missing_ok=True)

        if wait:
            finish()
        else:
            stopper = threading.Thread(target=finish, name=f"stop-{proc.pid}", daemon=True)
            stopper.start()
            _stopping.append(stopper)


_stopping: list[threading.Thread] = []


def wait_stopped() -> None:
    """Return once every worker stopped with ``wait=False`` has exited (or been killed)."""
    while _stopping:
        _stopping.pop().join()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_leftover_workers(say: Callable[[str], None] = print) -> int:
    """Kill every worker group this harness started and did not stop (``--down``)."""
    stopped = 0
    for entry in sorted(WORKERS_DIR.glob("*")) if WORKERS_DIR.exists() else []:
        if entry.name.isdigit():
            _signal_group(int(entry.name), signal.SIGKILL)
            stopped += 1
        entry.unlink(missing_ok=True)
    if stopped:
        say(f"stopped {stopped} worker group(s)")
    return stopped


@contextmanager
def running_worker(fm: Fm, run_id: str, label: str, grace: float,
                   on_stage: OnStage = lambda _: None, wait: bool = True) -> Generator[Worker, None, None]:
    worker = Worker(fm, run_id, LOG_DIR / f"{label}-{run_id}.log")
    on_stage("starting the worker")
    worker.start()
    try:
        on_stage("waiting for the worker")
        worker.wait_ready()
        yield worker
    finally:
        on_stage("stopping the worker")
        worker.stop(grace, wait)


# ---- runs ----------------------------------------------------------------------


@dataclass
class RunReport:
    fm: str  # the FM this cell belongs to (for a broken run: the later FM)
    kind: Kind
    code: str  # the FM whose code ran
    scenario: int
    checks: list[Check] = field(default_factory=lambda: [])
    observations: Observations | None = None
    error: str | None = None
    log: Path | None = None
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def verdict(self) -> str:
        if self.kind == "fixed":
            return "PASS" if self.ok else "FAIL"
        if self.kind == "bug":
            return "BUG REPRODUCED" if self.ok else "BUG NOT REPRODUCED"
        return "REPRODUCED" if self.ok else "NOT REPRODUCED"


def run_one(fm: str, kind: Kind, on_stage: OnStage) -> RunReport:
    """fixed: scenario N on FM N; broken: scenario N on FM N-1; bug: scenario 1 on fm0.

    ``on_stage`` hears each stage as it begins: resetting, starting the worker,
    waiting for the worker, running the scenario, stopping the worker, checking
    (and cleaning up, after a broken run that left a looping message behind).
    """
    n = number(fm)
    code = fm if kind == "fixed" else f"fm{n - 1}" if kind == "broken" else "fm0"
    sc_n = 1 if kind == "bug" else n
    report = RunReport(fm, kind, code, sc_n)
    started = time.monotonic()
    try:
        lab = load(code)
        fixed = load(fm) if kind == "broken" else lab
        stop: tuple[str, StopCondition] | None = checks.symptom_stop(n, fixed) if kind == "broken" else None
        run_id = new_run_id()
        on_stage("resetting")
        reset(lab)
        label = f"{fm}-{kind}-{code}"
        report.log = LOG_DIR / f"{label}-{run_id}.log"
        with running_worker(lab, run_id, label, 0.5 if stop else STOP_GRACE, on_stage, wait=False):
            on_stage("running the scenario")
            obs = run_scenario(lab, scenario(sc_n), run_id, RUN_TIMEOUT, stop=stop)
        report.observations = obs
        on_stage("checking")
        report.checks = _checks(kind, n, obs, fixed)
        if stop is not None:
            on_stage("cleaning up")
            reset(lab)  # the looping message goes with the FM's own queues
    except WorkerFailed as exc:
        report.error = str(exc)
    except HarnessError:
        raise
    except Exception as exc:  # one broken run must not hide the others
        report.error = f"{type(exc).__name__}: {exc}"
    report.seconds = time.monotonic() - started
    return report


def _checks(kind: Kind, n: int, obs: Observations, fixed: Fm) -> list[Check]:
    """fixed: G1..Gn of FM n; broken: Sn; bug: S1 (fm0's own bug)."""
    if kind == "fixed":
        return checks.guarantees(n, obs, fixed)
    return [checks.symptom(n if kind == "broken" else 1, obs, fixed)]


def describe(r: RunReport) -> str:
    """A run's verdict line and one line per check (and where its worker log is, if it failed)."""
    head = f"{r.fm} {r.kind} (scenario {r.scenario} on {r.code}, {r.seconds:.1f}s): {r.verdict}"
    body = [f"  {'ok  ' if c.ok else 'FAIL'} {c.label}: {c.detail}" for c in r.checks]
    if r.error:
        body.append(f"  error: {r.error}")
    if not r.ok and r.log is not None:
        body.append(f"  worker log: {r.log}")
    return "\n".join([head, *body])


@dataclass(frozen=True)
class MatrixRow:
    fm: str
    fixed: RunReport | None  # the fixed run (fm0: its bug run)
    broken: RunReport | None


def matrix(reports: list[RunReport]) -> list[MatrixRow]:
    """One row per FM, in the order the runs came, with its fixed and broken cells."""
    cells: dict[str, dict[str, RunReport]] = {}
    for r in reports:
        cells.setdefault(r.fm, {})[r.kind] = r
    return [MatrixRow(fm, c.get("fixed") or c.get("bug"), c.get("broken")) for fm, c in cells.items()]


def plan(selected: list[str], include_fm0: bool, prove: bool) -> list[tuple[str, Kind]]:
    runs: list[tuple[str, Kind]] = []
    for fm in selected:
        n = number(fm)
        if n == 0:
            continue
        runs.append((fm, "fixed"))
        if prove:
            runs.append((fm, "broken"))
    if include_fm0 or "fm0" in selected:
        runs.insert(0, ("fm0", "bug"))
    return runs


def run_by_hand(path: str) -> int:
    """``python fmN_*.py``: run scenario N against a worker the user started."""
    try:
        services.ensure()
        fm = checked(load_module(Path(path).stem))
    except (services.ServiceError, HarnessError, NotAnFm) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if probe_seconds(fm, timeout=10.0) is None:
        print(f"no worker answers on {', '.join(str(q.name) for q in fm.task_queues)}; start one in another shell:\n"
              f"  {fm.worker_command()}", file=sys.stderr)
        return 2
    kind: Kind = "fixed" if fm.number else "bug"
    started = time.monotonic()
    obs = run_scenario(fm, scenario(fm.scenario), new_run_id(), RUN_TIMEOUT)
    report = RunReport(fm.short, kind, fm.short, fm.scenario, _checks(kind, fm.number, obs, fm), obs,
                       seconds=time.monotonic() - started)
    print(describe(report))
    return 0 if report.ok else 1
