"""``run_all_fms.py --down``: stop what the lab started, never a live run's workers unless told to.

What is live: a run holds its namespace's lock (``lab.workers.NamespaceLock``, an ``flock`` on
``.lab/<namespace>/lock``, whose file names the holder's pid). ``live_runs()`` asks every namespace
of this checkout, without waiting: it takes a shared lock on the file for an instant and lets it go;
where that is refused, a run holds it. (A run that starts in that very instant is refused as if
another run held the namespace, and says so: run it again.)

``down(force)``:

- a run is live in this namespace: nothing is stopped, it says so and how to go on (``--force``),
  exit status 2; with ``force``, the run itself gets SIGTERM (the CLI's own handling: it stops its
  workers and empties the queues of its run, then exits 143) and ``down`` waits for it to let the
  lock go, then goes on;
- the namespace's recorded workers that still run (``lab.workers.leftovers``, those of a run
  that was killed before it could stop them) are killed, and named; so is a scenario's own
  ``redis-server`` left running (``lab.owned``);
- the services the lab started itself (``lab.services``, step 3) are stopped, unless a run of
  another namespace of this checkout is live (they serve it too): then they stay, and it says so
  (``force`` stops them anyway);
- it always says what it did, "nothing to stop" included; exit status 0.
"""

from __future__ import annotations

import fcntl
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lab import owned, services, workers
from lab.fm import ROOT
from lab.settings import NAMESPACE
from lab.waiting import wait_until

RUN_STOP_SECONDS = 30.0
"""How long a live run may take to stop its workers and let its lock go after SIGTERM."""


@dataclass(frozen=True)
class LiveRun:
    namespace: str
    pid: int | None  # None: the lock is held, the file does not name its holder (yet)

    @property
    def who(self) -> str:
        return f"pid {self.pid}" if self.pid is not None else "pid unknown"


def lock_held(path: Path) -> bool:
    """Does a process hold the ``flock`` on ``path``? (Asked without waiting; False when there is no file.)"""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing lets a lock this probe took go
    return False


def holder(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def live_runs(root: Path = ROOT / ".lab") -> list[LiveRun]:
    """Every namespace of this checkout whose lock a run holds now, this one first."""
    found = [LiveRun(lock.parent.name, holder(lock)) for lock in sorted(root.glob("*/lock")) if lock_held(lock)]
    return sorted(found, key=lambda r: r.namespace != NAMESPACE)


def down(force: bool = False, say: Callable[[str], None] = print) -> int:
    live = live_runs()
    here = next((r for r in live if r.namespace == NAMESPACE), None)
    if here is not None and not force:
        say(f"a run ({here.who}) is live in namespace {NAMESPACE}: not stopped; --down --force stops it")
        return 2
    did: list[str] = []
    if here is not None:
        did.append(stop_run(here))
    workers.stop_leftovers(say=did.append, why="left running")
    if gone := owned.stop_leftovers():
        kinds = " and ".join(k for k, m in (("redis-server", "redis-"), ("RabbitMQ node", "rabbit-"))
                             if any(g.startswith(m) for g in gone))
        did.append(f"stopped the lab's own {', '.join(gone)} (a scenario's {kinds}) left running in namespace {NAMESPACE}")
    if failed := owned.remove_failed():
        did.append(f"removed what failed starts of the lab's own services left in namespace {NAMESPACE}: {', '.join(failed)}")
    elsewhere = [r for r in live if r.namespace != NAMESPACE]
    started = services.started_by_lab()
    if started and elsewhere and not force:
        did.append(f"the lab's {' and '.join(started)} stay: a run ({elsewhere[0].who}) is live in namespace "
                   f"{elsewhere[0].namespace} and uses them; --down --force stops them too")
    elif started:
        services.stop_started(say=did.append)
    for line in did or [f"nothing to stop in namespace {NAMESPACE}: no worker of the lab runs there, "
                        "and the lab started no service"]:
        say(line)
    return 0


def stop_run(run: LiveRun) -> str:
    """SIGTERM to the live run, then wait until it has let its lock go (it stops its own workers)."""
    lock = ROOT / ".lab" / run.namespace / "lock"
    if run.pid is None:
        return f"the live run in namespace {run.namespace} names no pid: its workers are stopped instead"
    try:
        os.kill(run.pid, signal.SIGTERM)
    except ProcessLookupError:
        return f"the live run (pid {run.pid}) had already ended"
    if wait_until(lambda: not lock_held(lock), RUN_STOP_SECONDS, interval=0.05):
        return f"stopped the live run (pid {run.pid}) in namespace {run.namespace}: SIGTERM, it stopped its workers"
    return (f"the live run (pid {run.pid}) in namespace {run.namespace} did not end within {RUN_STOP_SECONDS:.0f}s "
            "of SIGTERM: its workers are stopped instead")
