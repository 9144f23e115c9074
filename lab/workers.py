"""The worker processes the harness starts, and what keeps them from outliving it.

State, per namespace, under ``.lab/<namespace>/`` (two namespaces never touch each
other's): ``logs/`` (the last ``KEEP_LOGS`` worker logs), ``workers/<pgid>`` (one
JSON record per worker group still to stop), ``beat/`` (beat schedules) and ``lock``.

Lifetime. Each worker runs ``celery -A <module> worker ...`` in a process group of
its own, so one ``killpg`` takes its pool processes and its beat with it. It is
started with ``RCL_HARNESS_PID`` set, and ``lab.app`` then watches, from a thread
of the worker's main process, that its parent is still that harness: when the
harness dies, whatever killed it (TERM, HUP, INT, KILL), the worker kills its
own group within ``lab.app.PARENT_WATCH_SECONDS``. A watch, not Linux's
``prctl(PR_SET_PDEATHSIG)``: the death signal would need ``preexec_fn``
(which Python's documentation calls unsafe in a process with threads, and the
harness has threads), and it reaches only the worker's main process, whose warm
shutdown waits for the tasks that are running, a hung one as long as it hangs.

Registry and leftovers: ``leftovers()`` finds groups recorded in this namespace
whose process is still alive and still the worker recorded (its command line
names the run); a new run stops them first and says so.

Lock: ``NamespaceLock`` (``flock`` on ``lock``) admits one run per namespace; a
second is refused at once, naming the holder's pid.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from lab.fm import ROOT, Fm
from lab.settings import NAMESPACE
from lab.variants import VARIANTS_DIR
from lab.waiting import wait_until

STATE_DIR = ROOT / ".lab" / NAMESPACE
LOG_DIR = STATE_DIR / "logs"
WORKERS_DIR = STATE_DIR / "workers"
BEAT_DIR = STATE_DIR / "beat"
KEEP_LOGS = 60
READY_TIMEOUT = 60.0
STOP_GRACE = 5.0
HARNESS_PID_ENV = "RCL_HARNESS_PID"


class WorkerFailed(Exception):
    """The worker exited or never became ready; carries the tail of its log."""


class NamespaceBusy(Exception):
    """Another run holds this namespace's lock."""


def signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _after_comm(stat: str) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after "pid (comm) ": state ppid pgrp ..."""
    return stat[stat.rindex(")") + 2:].split()


def pid_alive(pid: int) -> bool:
    """Does process ``pid`` still run (a zombie waiting to be reaped does not)?"""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return _after_comm(Path(f"/proc/{pid}/stat").read_text())[0] not in ("Z", "X")
    except (OSError, ValueError, IndexError):  # no /proc to tell a zombie by: the kernel says it is there
        return True


def group_alive(pgid: int) -> bool:
    """Does any process of group ``pgid`` still run (zombies waiting to be reaped do not count)?"""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: ask the kernel, zombies included
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = _after_comm(stat)
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


KILL_WAIT_SECONDS = 5.0
"""How long a KILLed worker group may take to be gone before the harness goes on anyway."""


@dataclass
class Worker:
    fm: Fm
    run_id: str
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    queue: str | None = None  # only this queue (``-Q``), probed there; None: the program's own queues
    env: Mapping[str, str] = field(default_factory=lambda: {})  # added to the worker's environment
    part: str = ""  # tells apart several workers of one program and run (their names, their logs)

    @property
    def name(self) -> str:
        return f"{self.fm.short}{'-' + self.part if self.part else ''}-{self.run_id}"

    def start(self) -> None:
        for folder in (LOG_DIR, WORKERS_DIR, BEAT_DIR, self.log_path.parent):
            folder.mkdir(parents=True, exist_ok=True)
        fm = self.fm
        cmd = [sys.executable, "-m", "celery", "-A", fm.module, "worker", "--loglevel=INFO",
               "-n", f"{self.name}@%h", *fm.worker_args(), *(["-Q", self.queue] if self.queue else [])]
        if fm.beat:
            cmd += ["--schedule", str(BEAT_DIR / f"beat-{self.name}")]
        path = os.pathsep.join(p for p in (str(ROOT), str(VARIANTS_DIR), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, **dict(fm.worker_env), **self.env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path, HARNESS_PID_ENV: str(os.getpid())}
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env=env)
        record = {"fm": fm.short, "run": self.run_id, "name": self.name, "harness": os.getpid()}
        (WORKERS_DIR / str(self.proc.pid)).write_text(json.dumps(record))

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

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
        res = self.fm.probe.apply_async(queue=self.queue) if self.queue else self.fm.probe.apply_async()

        def answered() -> bool:
            if proc.poll() is not None:
                raise WorkerFailed(f"worker exited with {proc.returncode} before it was ready; log tail:\n{self.tail()}")
            return res.ready()

        if not wait_until(answered, timeout, interval=0.05):
            raise WorkerFailed(f"worker not ready after {timeout:.0f}s; log tail:\n{self.tail()}")
        res.forget()

    def stop(self, grace: float = STOP_GRACE, wait: bool = True, after: Callable[[], object] | None = None) -> None:
        """TERM to the main process (Celery's warm shutdown, or its cold one under ``REMAP_SIGTERM``), then KILL the
        whole group after ``grace`` seconds; then ``after()`` (the harness empties the run's queues there), its errors
        ignored. The TERM goes to the main process alone, as a deploy's does: sent to the group, it also reached a pool
        process running the beat's drain at the run's end, and the main process logged that process's death at ERROR
        (``Worker exited prematurely: signal 15``) in a fixed run's worker window (once, in a fresh-clone make test).

        With ``wait=False`` the TERM is sent at once and the rest happens on a thread, so
        the next run can start while this worker finishes its shutdown (about 0.8 s
        for Celery 5.7 even when idle: it has stopped consuming by then);
        ``wait_stopped()`` joins those threads, and the CLI calls it before it exits.
        """
        proc = self.proc
        if proc is None:
            return
        self.proc = None
        try:
            os.kill(proc.pid, signal.SIGTERM)
        except ProcessLookupError:  # the main process is gone: its group goes at the grace's end
            pass

        def finish() -> None:
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
            signal_group(proc.pid, signal.SIGKILL)  # pool children and beat too
            proc.wait()
            wait_until(lambda: not group_alive(proc.pid), KILL_WAIT_SECONDS, interruptible=False)  # on a thread
            (WORKERS_DIR / str(proc.pid)).unlink(missing_ok=True)
            if after is not None:
                try:
                    after()
                except Exception:  # a service gone by now: the next run's reset empties the queues
                    pass

        if wait:
            finish()
        else:
            stopper = threading.Thread(target=finish, name=f"stop-{proc.pid}", daemon=True)
            stopper.start()
            _stopping.append((self.fm.short, stopper))


_stopping: list[tuple[str, threading.Thread]] = []


def wait_stopped(fm: str | None = None) -> None:
    """Return once every worker stopped with ``wait=False`` (of FM ``fm`` only, if given)
    has exited and its ``after()`` has run. A run of an FM waits for the last worker of
    the same FM first: that worker's ``after()`` empties the queues the new run uses."""
    for entry in [e for e in _stopping if fm is None or e[0] == fm]:
        entry[1].join()
        if entry in _stopping:
            _stopping.remove(entry)


@dataclass(frozen=True)
class Recorded:
    pgid: int
    fm: str
    run: str
    name: str
    harness: int = 0  # the pid that started it


def _recorded() -> list[tuple[Path, Recorded | None]]:
    out: list[tuple[Path, Recorded | None]] = []
    for entry in sorted(WORKERS_DIR.glob("*")) if WORKERS_DIR.exists() else []:
        try:
            data = json.loads(entry.read_text())
            out.append((entry, Recorded(int(entry.name), str(data["fm"]), str(data["run"]), str(data.get("name", "")),
                                        int(data.get("harness") or 0))))
        except (OSError, ValueError, KeyError, TypeError):
            out.append((entry, None))
    return out


def _is_that_worker(r: Recorded) -> bool:
    """Is process ``r.pgid`` still the worker recorded (and not a reused pid)?"""
    try:
        cmdline = Path(f"/proc/{r.pgid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        stat = Path(f"/proc/{r.pgid}/stat").read_text()
    except OSError:
        return group_alive(r.pgid) and sys.platform != "linux"
    if "celery" in cmdline and r.run in cmdline:
        return True
    # Just started and not yet exec'd: still its starter's fork, leading the new group it was given.
    ppid, pgrp = (int(field) for field in stat.rsplit(")", 1)[1].split()[1:3])
    return ppid == r.harness and pgrp == r.pgid


def leftovers() -> list[Recorded]:
    """Recorded worker groups of this namespace that are still running; forgets the dead."""
    alive: list[Recorded] = []
    for entry, r in _recorded():
        if r is not None and _is_that_worker(r):
            alive.append(r)
        else:
            entry.unlink(missing_ok=True)
    return alive


def stop_leftovers(say: Callable[[str], None] = print, why: str = "left by an earlier run") -> int:
    """Kill every recorded worker group of this namespace that still runs, and say which."""
    found = leftovers()
    for r in found:
        signal_group(r.pgid, signal.SIGKILL)
    for r in found:  # gone, not only signalled: a dying process must not publish after the caller's cleanup
        wait_until(lambda: not group_alive(r.pgid), KILL_WAIT_SECONDS)
        (WORKERS_DIR / str(r.pgid)).unlink(missing_ok=True)
    if found:
        names = ", ".join(f"{r.fm} (run {r.run}, pid {r.pgid})" for r in found)
        say(f"stopped {len(found)} worker(s) {why} in namespace {NAMESPACE}: {names}")
    return len(found)


def prune_logs(keep: int = KEEP_LOGS) -> None:
    """Keep the newest ``keep`` worker logs of this namespace."""
    logs = sorted(LOG_DIR.glob("*.log"), key=lambda p: p.stat().st_mtime, reverse=True) if LOG_DIR.exists() else []
    for old in logs[keep:]:
        old.unlink(missing_ok=True)
    beats = sorted(BEAT_DIR.glob("beat-*"), key=lambda p: p.stat().st_mtime, reverse=True) if BEAT_DIR.exists() else []
    for old in beats[keep:]:
        old.unlink(missing_ok=True)


class NamespaceLock:
    """One run per namespace: ``flock`` on ``.lab/<namespace>/lock``, released when the process ends."""

    def __init__(self) -> None:
        self.path = STATE_DIR / "lock"
        self.fd: int | None = None

    def __enter__(self) -> NamespaceLock:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise NamespaceBusy(
                f"another run of the lab is using namespace {NAMESPACE!r} (pid {holder}); wait for it to end, "
                f"or run beside it with another namespace, e.g. RCL_NAMESPACE={NAMESPACE}-2") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.close(self.fd)  # closing the descriptor releases the lock
            self.fd = None
