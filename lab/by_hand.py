"""``python fmN_*.py``: the FM's scenario against a worker you started, shown as the harness shows a run.

Each FM file ends with ``raise SystemExit(run_by_hand(__file__))`` under ``__main__``
(``run_by_hand`` here). With the FM's worker running in
another shell (the command its docstring gives), ``run``:

- takes the namespace's lock (``lab.workers.NamespaceLock``), the one a lab run holds
  while it runs: while ``run_all_fms.py`` uses the namespace, a by-hand run is refused
  (exit 2) and says which process holds it; while a by-hand run goes on, a lab run is
  refused the same way;
- empties the FM's queues of messages no run waits for (a purge; the worker keeps
  consuming them), and asks the worker for a probe, so that a missing worker is said at
  once (exit 2, with the command to start it);
- after an interrupted by-hand run, waits until the worker has finished what that run
  left it: one ``idle`` task per pool slot (``lab.app``), which returns once all of them
  run at the same time, i.e. once no slot still serves the old run;
- runs the scenario (``lab.runner.run_scenario``) and checks the FM's guarantees, with
  the harness's own console (``lab.show.progress.Board``): its stages while it works,
  then the verdict line and one line per check (``lab.harness.describe``), then what
  happened to each document (the same timeline the harness prints after each FM);
- watches, while the scenario runs, that a worker still consumes the FM's queue and that
  the services answer: a worker window closed mid-run is an ERROR (exit 3) within about a
  second, not a 90 s deadline.

Ctrl-C (or SIGTERM, SIGHUP) ends it with one line and exit status 128 + the signal's
number (130 for Ctrl-C), no traceback. Before it exits it cancels the run: it deletes
the run's documents from the lab's document store (a fetch not yet run fails at once),
opens the claim lesson's gate and drops its crash plan (a ``notify`` waiting there goes on, and no
more kills), purges the FM's queues (the run's messages not yet delivered, its waiting
retries and dead letters), and notes the run, so that the next by-hand run waits for the
few messages the worker had already taken (prefetched or running) before it submits.

Exit status: 0 every check holds; 1 a check does not; 2 bad input, services missing, a
namespace a lab run holds, or no worker; 3 the run ended in ERROR (its deadline, the
worker gone, a service silent); 128 + the signal's number when interrupted.
"""

from __future__ import annotations

import functools
import signal
import sys
import time
import uuid
from pathlib import Path

from lab import services, waiting, workers
from lab.app import IDLE_KEY_SECONDS
from lab.fm import Fm, NotAnFm, load_module
from lab.hand import Hand, HandInjector, hand_seconds
from lab.harness import RUN_TIMEOUT, SERVICE_CHECK_SECONDS, blame_services, checked, checks_of, connect, describe, purge, queue_consumers, run_error, service_problems
from lab.records import HarnessError, Kind, RunBroken, RunReport
from lab.observe import TTL_SECONDS, RunRecorder, client, run_prefix
from lab.runner import new_run_id, run_scenario
from lab.scenarios import Scenario
from lessons import scenario
from lab.settings import NAMESPACE, redis_prefix
from lab.show.progress import Board
from lab.waiting import Interrupted, wait_until

PROBE_SECONDS = 10.0
"""How long a by-hand run waits for the worker's first answer."""
RECONNECT_SECONDS = 5.0
"""A worker whose connection was cut (a lesson's step by hand) consumes again within this."""
IDLE_SECONDS = 30.0
"""How long a by-hand run waits for the worker to finish what an interrupted run left it."""


class NoWorker(Exception):
    """No worker answered on the FM's queue (exit 2, with the command that starts one)."""


def interrupted_key(fm: Fm) -> str:
    """Where an interrupted by-hand run of ``fm`` is noted (its run id), for the next run to wait on."""
    return f"{redis_prefix(fm.short)}by-hand:interrupted"


def run_by_hand(path: str) -> int:
    """The by-hand run of the FM file at ``path``; its exit status (module docstring)."""
    handlers = {sig: signal.signal(sig, waiting.interrupt) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        return _run(Path(path).stem)
    except KeyboardInterrupt as exc:  # before the scenario started: nothing to cancel
        return _said_interrupted(exc, "nothing was submitted")
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        waiting.forget_interrupts()


def _run(module: str) -> int:
    try:
        services.ensure()
        fm = checked(load_module(module))
        with workers.NamespaceLock():
            return _by_hand(fm)
    except workers.NamespaceBusy as exc:
        print(f"error: {exc} (for this command and its worker alike): a by-hand run needs the namespace to itself",
              file=sys.stderr)
        return 2
    except (services.ServiceError, HarnessError, NotAnFm) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except NoWorker as exc:
        print(str(exc), file=sys.stderr)
        return 2


def _by_hand(fm: Fm) -> int:
    kind: Kind = "fixed" if fm.number else "bug"
    sc = scenario(fm.scenario)
    with Board(1) as board:
        stage = functools.partial(board.stage, fm.short, kind)
        injectors = sc.injectors_by_hand(Hand(fm, board.say, hand_seconds()))
        hands = [inj for inj in injectors.values() if isinstance(inj, HandInjector)]
        unmet = [found for inj in hands if (found := inj.unmet()) is not None]
        if unmet:  # all at once, then the worker's command once: it must start (or start again) with what they set
            raise NoWorker("error: " + "\n".join(unmet) + "\nthen start the worker (stop it first if it runs):\n"
                           f"  {fm.worker_command()}")
        stage("waiting for the worker")
        purge(fm)  # messages no run waits for (an earlier run's leftovers) do not go before this run's
        if not _answers(fm, PROBE_SECONDS):
            raise NoWorker(f"no worker answers on {', '.join(str(q.name) for q in fm.task_queues)} (namespace "
                           f"{NAMESPACE}); start one in another shell, from the repository's folder:\n"
                           f"  {fm.worker_command()}")
        _wait_for_interrupted(fm, board)
        run_id = new_run_id()
        report = RunReport(fm.short, kind, fm.short, fm.scenario)
        started = time.monotonic()
        stage("running the scenario")
        try:
            steps = sum(inj.steps for inj in hands)  # the attendee's steps take their time, and their sides run after them
            timeout = RUN_TIMEOUT * (2 if steps else 1) + steps * hand_seconds()
            obs = run_scenario(fm, sc, run_id, timeout, watch=WorkerWatch(fm), sides=True, injectors=injectors)
            stage("checking")
            report.observations, report.checks = obs, checks_of(kind, fm.number, obs, fm)
            if obs.stopped_by == "deadline":
                report.error = blame_services(f"the scenario did not end within {timeout:.0f}s; see the worker's window")
        except KeyboardInterrupt as exc:
            cancel(fm, run_id, sc)
            return _said_interrupted(exc, f"run {run_id} cancelled, its queued messages purged; the next by-hand run "
                                          "first waits for the few the worker had already taken")
        except Exception as exc:  # the worker gone, a service silent: said as the harness says it
            cancel(fm, run_id, sc)
            report.error = run_error(exc)
        report.seconds = time.monotonic() - started
        board.finished(describe(report), report.ok)
        board.timelines(fm.short, [report])
    if report.error is not None:
        return 3
    return 0 if report.ok else 1


def _answers(fm: Fm, timeout: float) -> bool:
    """Does a worker take a probe from the FM's queue and answer within ``timeout`` (Ctrl-C still heard)?"""
    res = fm.probe.apply_async()
    try:
        return wait_until(res.ready, timeout, interval=0.05)
    finally:
        res.forget()


def _wait_for_interrupted(fm: Fm, board: Board) -> None:
    """After an interrupted run: wait until every pool slot is free of its work (one ``idle`` per slot)."""
    r = client()
    interrupted = r.get(interrupted_key(fm))
    if interrupted is None:
        return
    board.say(f"the last by-hand run ({interrupted}) was interrupted: waiting until the worker has finished what it "
              "had already taken of it")
    slots = fm.concurrency
    barrier = f"{redis_prefix(fm.short)}by-hand:idle:{uuid.uuid4().hex[:8]}"
    idle = fm.app.tasks[f"{fm.short}.idle"]
    results = [idle.apply_async((barrier, slots, IDLE_SECONDS)) for _ in range(slots)]
    try:
        done = wait_until(lambda: all(res.ready() for res in results), IDLE_SECONDS + PROBE_SECONDS, interval=0.05)
        if not done or not all(res.result is True for res in results):
            raise NoWorker(f"the worker still runs what the interrupted run {interrupted} left it after "
                           f"{IDLE_SECONDS:.0f}s (or runs fewer than {slots} pool processes); restart it:\n"
                           f"  {fm.worker_command()}")
    finally:
        r.set(barrier, slots, ex=IDLE_KEY_SECONDS)  # any idle task still waiting (Ctrl-C, a timeout) returns now
        for res in results:
            res.forget()
    purge(fm)  # what the old run's last tasks sent on (a requeue, a retry) before they ended
    r.delete(interrupted_key(fm))


def cancel(fm: Fm, run_id: str, sc: Scenario) -> None:
    """Cancel an interrupted run (module docstring); a service gone by now only leaves more for the worker."""
    try:
        r, prefix = client(), run_prefix(run_id)
        r.set(interrupted_key(fm), run_id, ex=TTL_SECONDS)
        r.delete(*(f"{prefix}doc:{doc}" for doc in sc.docs), f"{prefix}crash_plan")
        RunRecorder(run_id).open_gate()
        purge(fm)
    except Exception:
        pass


class WorkerWatch:
    """The watch while a by-hand scenario runs: ``RunBroken`` once no worker consumes the FM's queue,
    or a service does not answer (looked at every ``SERVICE_CHECK_SECONDS``)."""

    def __init__(self, fm: Fm, every: float = SERVICE_CHECK_SECONDS) -> None:
        self.fm, self.every = fm, every
        self.checked = time.monotonic()

    def __call__(self) -> None:
        if time.monotonic() - self.checked < self.every:
            return
        self.checked = time.monotonic()
        for named, problem in service_problems():
            raise RunBroken(f"{named} {problem} during the run")
        with connect(self.fm) as conn:
            names = [str(q.name) for q in self.fm.task_queues]
            if conn.transport.driver_type == "amqp" and not wait_until(
                    lambda: sum(queue_consumers(conn, name) for name in names) > 0, RECONNECT_SECONDS, interval=0.1):
                raise RunBroken(f"no worker consumes {', '.join(names)} any more: its worker stopped during the run")


def _said_interrupted(exc: KeyboardInterrupt, what: str) -> int:
    signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
    print(f"interrupted by {signal.Signals(signum).name}: {what}", file=sys.stderr)
    return 128 + signum

