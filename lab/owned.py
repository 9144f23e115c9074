"""A service the lab owns for one scenario: a ``redis-server`` of its own that it may stop and start.

DESIGN.md §4: a scenario that stops or reconfigures a service never touches the shared ones.
A lesson whose result backend goes away mid-chord needs one the lab may stop, so the lab starts its own ``redis-server``:

- its own port (chosen once per name and namespace from the free ones in ``PORTS``, then kept,
  so that a restart answers at the same URL the workers hold);
- its data under ``.lab/<namespace>/owned/redis-<name>/`` (``persist=True``: the append-only
  file, fsynced on every write, so a stop and a start keep every key, as a production Redis with
  AOF would; ``persist=False``: nothing on disk, a restart comes back empty);
- ``start()`` waits until it answers PING, ``stop()`` sends SIGTERM (Redis writes what it must and
  exits) and waits until the process is gone, SIGKILL after ``STOP_SECONDS``;
- a pid file beside the data, and the pid of the process that started it (``owner``):
  ``stop_leftovers(orphans_only=True)`` (before a run starts its own) kills a server
  whose owner is gone (a killed run's), and ``stop_leftovers()`` (``run_all_fms.py --down``, which
  refuses while a run holds the namespace) every one; each found by that file and checked by its
  command line, never any other process.

``available()`` says whether ``redis-server`` is installed; a machine without it gets
``OwnedServiceMissing``, whose words the scenario's cells print as their reason to skip.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import zlib
from pathlib import Path
from types import TracebackType
from typing import Any

import redis

from lab.settings import NAMESPACE
from lab.waiting import wait_until
from lab.workers import STATE_DIR

OWNED_DIR = STATE_DIR / "owned"
PORTS = range(16400, 17000)
"""Where an owned server's port is looked for, from a point the namespace and name choose."""
READY_SECONDS = 10.0
STOP_SECONDS = 10.0


class OwnedServiceMissing(Exception):
    """The binary an owned service needs is not installed (its cells are skipped, saying so)."""


def available() -> str | None:
    """The ``redis-server`` to run, or None when it is not installed."""
    return shutil.which("redis-server")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as redis-server binds: a port whose last server just stopped keeps its clients' closed
        # connections in TIME_WAIT for a minute; they do not stop a restart, so they must not count
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


FAILED_DIR = OWNED_DIR / "failed"
"""Where the logs of a start that failed are kept (``remove_failed``, from ``--down`` and ``--clean``, deletes them)."""
LOG_LINES = 5
"""How many last lines of its log a failed start's message quotes."""


class StartFailed(OSError):
    """An owned service did not come up (twice: once more on another port); the message says why and where its
    logs are kept."""


def _pick_port(folder: Path, seed: str, pair: bool, avoid: set[int]) -> int:
    """A free port (with ``pair``, its ``+ DIST_OFFSET`` too) from a point ``seed`` chooses, none of ``avoid``;
    kept in ``folder/port``."""
    start = zlib.crc32(seed.encode()) % len(PORTS)
    for i in range(len(PORTS)):
        port = PORTS[(start + i) % len(PORTS)]
        if port not in avoid and _free(port) and (not pair or _free(port + DIST_OFFSET)):
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "port").write_text(str(port))
            return port
    raise OSError(f"no free port for an owned service in {PORTS.start}..{PORTS.stop - 1}")


def _tail(path: Path, lines: int = LOG_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    last = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(last) if last else "(empty log)"


def _why(proc: subprocess.Popen[bytes], waited: float, log: Path) -> str:
    status = proc.poll()
    said = f"it exited with status {status}" if status is not None else f"it did not answer within {waited:g} s"
    return f"{said}; the end of its log: {_tail(log)}"


def _keep_logs(folder: Path, port: int, logs: list[Path]) -> Path:
    """Copy ``logs`` out of ``folder`` (which ``remove()`` deletes) into ``FAILED_DIR``; the copy's folder."""
    kept = FAILED_DIR / f"{folder.name}-{port}-{time.strftime('%Y%m%d-%H%M%S')}"
    kept.mkdir(parents=True, exist_ok=True)
    for log in logs:
        if log.is_file():
            shutil.copy2(log, kept / log.name)
    return kept


def _twice(service: Any, first_try: Any) -> None:
    """``first_try()``; when it fails on the service's first start, once more on another port (a later start
    must keep its port: the workers hold its URL). Both failures in the message."""
    first = not (service.folder / "started").exists()
    try:
        first_try()
    except StartFailed as exc:
        if not first:
            raise
        failed = service.port
        (service.folder / "port").unlink(missing_ok=True)
        service.avoid.add(failed)
        try:
            first_try()
        except StartFailed as again:
            raise StartFailed(f"{exc}; tried once more on port {service.port}: {again}") from again
    (service.folder / "started").write_text("")


def remove_failed() -> list[str]:
    """Delete the logs kept of failed starts and every owned folder of a server that never came up (no pid
    file, no ``started`` mark: a failed start's); their names. A server that came up once keeps its folder
    (its port, its data) for its next start. ``run_all_fms.py --down`` and ``--clean`` call it, under the
    namespace's lock, so no start of this namespace is under way."""
    removed: list[str] = []
    for folder in sorted(OWNED_DIR.iterdir()) if OWNED_DIR.exists() else []:
        if folder.is_dir() and (folder == FAILED_DIR
                                or not (folder / "pid").exists() and not (folder / "started").exists()):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder.name)
    return removed


class OwnedRedis:
    """A ``redis-server`` of the lab's own, named ``name`` in this namespace (see the module's docstring)."""

    def __init__(self, name: str, persist: bool = True) -> None:
        self.name, self.persist = name, persist
        self.folder = OWNED_DIR / f"redis-{name}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.avoid: set[int] = set()  # ports a start failed on

    @property
    def port(self) -> int:
        """Kept in the folder once chosen: the same URL across stops and starts."""
        kept = self.folder / "port"
        if kept.exists():
            return int(kept.read_text())
        return _pick_port(self.folder, f"{NAMESPACE}/{self.name}", False, self.avoid)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def answers(self) -> bool:
        try:
            client: Any = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=0.5, socket_timeout=0.5)
            with client:
                return bool(client.ping())
        except (redis.RedisError, OSError):
            return False

    def start(self) -> None:
        """Start it (its data as the last stop left it) and wait until it answers; a first start that fails is
        tried once more on another port; one that fails for good raises ``StartFailed``, saying why, its log
        kept under ``FAILED_DIR`` and its folder removed."""
        exe = available()
        if exe is None:
            raise OwnedServiceMissing("needs redis-server (Debian: apt-get install redis-server)")
        if self.proc is not None and self.proc.poll() is None:
            return
        try:
            _twice(self, lambda: self._start_once(exe))
        except StartFailed:
            if not (self.folder / "started").exists():
                self.remove()  # nothing of a first start that never came up is worth keeping but its logs
            raise

    def _start_once(self, exe: str) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        port = self.port
        log_path = self.folder / "redis.log"
        if not _free(port):
            kept = _keep_logs(self.folder, port, [log_path])
            raise StartFailed(f"the owned redis-server {self.name} cannot start: port {port} is taken; logs: {kept}")
        durability = (["--appendonly", "yes", "--appendfsync", "always"] if self.persist
                      else ["--appendonly", "no"])
        with log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [exe, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(self.folder), "--save", "",
                 *durability, "--daemonize", "no"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        (self.folder / "pid").write_text(str(self.proc.pid))
        (self.folder / "owner").write_text(str(os.getpid()))
        proc = self.proc
        if not wait_until(lambda: proc.poll() is not None or self.answers(), READY_SECONDS, interval=0.05) \
                or proc.poll() is not None:
            self.stop()
            why = _why(proc, READY_SECONDS, log_path)
            kept = _keep_logs(self.folder, port, [log_path])
            raise StartFailed(f"the owned redis-server {self.name} did not come up on port {port}: {why}; log: "
                              f"{kept / log_path.name}")

    def stop(self) -> None:
        """SIGTERM, wait until it is gone (SIGKILL after ``STOP_SECONDS``); the data stays."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        (self.folder / "pid").unlink(missing_ok=True)

    def remove(self) -> None:
        """Stop it and delete its folder (its data, its port)."""
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> OwnedRedis:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.remove()


def stop_leftovers(orphans_only: bool = False) -> list[str]:
    """Kill the owned servers a killed run left running (by their pid files, checked by their command
    lines: Redis shows ``redis-server 127.0.0.1:<port>`` there, a RabbitMQ node's Erlang VM its own
    ``-home`` folder), with ``orphans_only`` only those whose owner process is gone; returns their names.
    Their folders go too, with ``orphans_only``."""
    stopped: list[str] = []
    for pidfile in sorted(OWNED_DIR.glob("*/pid")) if OWNED_DIR.exists() else []:
        folder = pidfile.parent
        if orphans_only and _alive(folder / "owner"):
            continue
        try:
            pid, port = int(pidfile.read_text()), int((folder / "port").read_text())
        except (OSError, ValueError):
            pidfile.unlink(missing_ok=True)
            continue
        if folder.name.startswith("rabbit-"):  # a node: its script and its Erlang VM, one process group
            group = [p for p in _group(pid) if str(folder / "home") in _cmdline(p) or "rabbitmq-server" in _cmdline(p)]
            if group:
                _kill_group(pid, group)
                stopped.append(folder.name)
        elif "redis-server" in (cmd := _cmdline(pid)) and f"127.0.0.1:{port}" in cmd:
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: _gone(pid), STOP_SECONDS, interruptible=False)
            stopped.append(folder.name)
        pidfile.unlink(missing_ok=True)
        if orphans_only:
            shutil.rmtree(folder, ignore_errors=True)
    return stopped


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _gone(pid: int) -> bool:
    return not Path(f"/proc/{pid}").exists() or _zombie(pid)


def _kill_group(pgid: int, group: list[int]) -> None:
    """SIGKILL process group ``pgid`` and wait until ``group``, its processes, are gone."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    wait_until(lambda: all(_gone(p) for p in group), STOP_SECONDS, interruptible=False)


def _group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid``."""
    found: list[int] = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


def _alive(owner_file: Path) -> bool:
    """Does the process named in ``owner_file`` still run (not a zombie)?"""
    try:
        pid = int(owner_file.read_text())
    except (OSError, ValueError):
        return False
    return Path(f"/proc/{pid}").exists() and not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except (OSError, IndexError):
        return True


# ---- a RabbitMQ node of the lab's own -----------------------------------------------------------

RABBIT_READY_SECONDS = 90.0
"""A node boots in 3 to 10 s on the lab's two-core machine; a loaded one, longer."""
DIST_OFFSET = 10000
"""The node's Erlang distribution port is its AMQP port plus this (``RABBITMQ_DIST_PORT``)."""


def rabbit_available() -> str | None:
    """The ``rabbitmq-server`` script to run as the current user, or None when it is not installed
    (Debian's ``/usr/sbin`` wrappers switch to the rabbitmq user; the scripts behind them do not)."""
    direct = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
    return str(direct) if direct.exists() else shutil.which("rabbitmq-server")


class OwnedRabbit:
    """A RabbitMQ node of the lab's own, named ``name`` in this namespace: its own node name, AMQP port,
    distribution port, configuration and data under ``.lab/<namespace>/owned/rabbit-<name>/``.

    ``consumer_timeout`` (ms) and ``channel_tick_interval`` (ms, how often a channel checks it; 60 s by
    default in RabbitMQ 3.10) are written into its configuration, so that a lesson's consumer timeout fires
    within seconds. Started in the foreground of a session of its own (``stop()`` sends that session SIGTERM,
    then kills what is left); its pid and its owner's beside the data, for ``stop_leftovers``."""

    def __init__(self, name: str, consumer_timeout: int | None = None, channel_tick_interval: int | None = None) -> None:
        self.name = name
        self.consumer_timeout, self.channel_tick_interval = consumer_timeout, channel_tick_interval
        self.folder = OWNED_DIR / f"rabbit-{name}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.avoid: set[int] = set()  # ports a start failed on

    @property
    def node(self) -> str:
        return f"rcl-{NAMESPACE}-{self.name}@localhost"

    @property
    def port(self) -> int:
        kept = self.folder / "port"
        if kept.exists():
            return int(kept.read_text())
        return _pick_port(self.folder, f"{NAMESPACE}/rabbit/{self.name}", True, self.avoid)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def env(self) -> dict[str, str]:
        """The environment its scripts (``rabbitmq-server``, ``rabbitmqctl``) run with."""
        for sub in ("mnesia", "log", "home"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        (self.folder / "enabled_plugins").write_text("[].\n")  # no management plugin: no other port to take
        conf = [f"listeners.tcp.default = 127.0.0.1:{self.port}"]
        if self.consumer_timeout is not None:
            conf.append(f"consumer_timeout = {self.consumer_timeout}")
        (self.folder / "rabbitmq.conf").write_text("\n".join(conf) + "\n")
        tick = f"{{channel_tick_interval, {self.channel_tick_interval}}}" if self.channel_tick_interval else ""
        (self.folder / "advanced.config").write_text(f"[{{rabbit, [{tick}]}}].\n")
        return {
            **os.environ,
            "HOME": str(self.folder / "home"),  # an Erlang cookie of its own
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.port + DIST_OFFSET),
            "RABBITMQ_MNESIA_BASE": str(self.folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.folder / "log"),
            "RABBITMQ_PID_FILE": str(self.folder / "rabbitmq.pid"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.folder / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(self.folder / "rabbitmq"),  # rabbitmq.conf
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.folder / "advanced.config"),
        }

    def ctl(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """``rabbitmqctl -n <its node> args...`` (as the current user, with its cookie)."""
        exe = rabbit_available()
        if exe is None:
            raise OwnedServiceMissing("needs rabbitmq-server (Debian: apt-get install rabbitmq-server)")
        return subprocess.run([str(Path(exe).with_name("rabbitmqctl")), "-n", self.node, *args], env=self.env(),
                              capture_output=True, text=True, timeout=timeout)

    def answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                pass
        except OSError:
            return False
        from kombu import Connection  # a listening socket is not yet a broker that lets the lab in

        try:
            with Connection(self.url, connect_timeout=2) as conn:
                conn.connect()
            return True
        except Exception:
            return False

    def start(self) -> None:
        """Start it (its data as the last stop left it) and wait until the lab can connect; a first start that
        fails is tried once more on other ports; one that fails for good raises ``StartFailed``, saying why, its
        logs kept under ``FAILED_DIR`` and its folder removed."""
        exe = rabbit_available()
        if exe is None:
            raise OwnedServiceMissing("needs rabbitmq-server (Debian: apt-get install rabbitmq-server)")
        if self.proc is not None and self.proc.poll() is None:
            return
        try:
            _twice(self, lambda: self._start_once(exe))
        except StartFailed:
            if not (self.folder / "started").exists():
                self.remove()
            raise

    def _logs(self) -> list[Path]:
        return [self.folder / "server.log", *sorted((self.folder / "log").glob("*.log"))]

    def _start_once(self, exe: str) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        port = self.port
        if not (_free(port) and _free(port + DIST_OFFSET)):
            kept = _keep_logs(self.folder, port, self._logs())
            raise StartFailed(f"the owned RabbitMQ node {self.name} cannot start: port {port} or "
                              f"{port + DIST_OFFSET} is taken; logs: {kept}")
        env = self.env()
        with (self.folder / "server.log").open("ab") as log:
            self.proc = subprocess.Popen([exe], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, env=env)
        (self.folder / "pid").write_text(str(self.proc.pid))
        (self.folder / "owner").write_text(str(os.getpid()))
        proc = self.proc
        if not wait_until(lambda: proc.poll() is not None or self.answers(), RABBIT_READY_SECONDS, interval=0.2) \
                or proc.poll() is not None:
            self.stop()
            why = _why(proc, RABBIT_READY_SECONDS, self.folder / "server.log")
            kept = _keep_logs(self.folder, port, self._logs())
            raise StartFailed(f"the owned RabbitMQ node {self.node} did not come up on port {port}: {why}; logs: "
                              f"{kept}")

    def stop(self) -> None:
        """SIGTERM to its process group, wait until it is gone (the group killed after ``STOP_SECONDS``).

        The Erlang VM (OTP 20 and later) takes SIGTERM as ``init:stop()``: RabbitMQ stops its applications
        and the VM exits, as ``rabbitmqctl stop`` would have it do, without booting a second VM for
        ``rabbitmqctl`` (measured at load 24 on two cores: 1.6 s against 6.9 s)."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        (self.folder / "pid").unlink(missing_ok=True)

    def remove(self) -> None:
        """Kill its process group and delete its folder (its data, its ports). A node whose data goes next needs
        no orderly stop: ``stop``'s took 1.07 s of an idle node's removal, the SIGKILL a few milliseconds."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            _kill_group(proc.pid, _group(proc.pid))
            proc.wait()
        (self.folder / "pid").unlink(missing_ok=True)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> OwnedRabbit:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.remove()
