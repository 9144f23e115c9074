"""The harness's own failure paths, against the real services: killed by any signal, a
worker or a service dying mid-run, two runs at once, a queue someone else consumes.

Each test bounds how long the harness may take to notice, and checks the process
table, not the harness's word, for workers left behind.
"""

from __future__ import annotations

import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from kombu import Connection

import run_all_fms
from lab import down, harness, owned, records, services, workers
from lab.fm import ROOT
from lab.observe import client
from lab.settings import NAMESPACE, broker_url
from lab.waiting import wait_until
from tests.broker import consumers
from tests.namespaces import derived

pytestmark = pytest.mark.usefixtures("real_services")

STARTED = "running the scenario"
NOTICE_SECONDS = 10.0
"""A dead worker or service must be reported within this long (the run's deadline is 90 s)."""


def quiet(_: str) -> None:
    pass


class Lab:
    """``run_all_fms.py`` as a subprocess whose output is read as it comes."""

    def __init__(self, *args: str, namespace: str = NAMESPACE, env: dict[str, str] | None = None) -> None:
        self.out: list[str] = []
        self.proc = subprocess.Popen([sys.executable, "run_all_fms.py", *args], cwd=ROOT, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env={**os.environ, "RCL_NAMESPACE": namespace, **(env or {})})
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        stream = self.proc.stdout
        assert stream is not None
        for line in stream:
            self.out.append(line)

    @property
    def text(self) -> str:
        return "".join(self.out)

    def wait_for(self, words: str, timeout: float = 60.0) -> None:
        assert wait_until(lambda: words in self.text or self.proc.poll() is not None, timeout), self.text
        assert words in self.text, self.text

    def finish(self, timeout: float = 120.0) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        self.reader.join(timeout=5)
        return rc


def celery_processes(namespace: str) -> list[int]:
    """Pids of celery processes whose command line belongs to ``namespace``'s runs (by worker name)."""
    pids: list[int] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if "celery" in cmd and " worker" in cmd and f"RCL_NAMESPACE={namespace}".encode() in env:
            pids.append(int(proc.name))
    return pids


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL])
def test_the_harness_killed_by_any_signal_leaves_no_worker(sig: signal.Signals) -> None:
    ns = derived(f"sig{int(sig)}")
    lab = Lab("--only", "fm6", namespace=ns)
    lab.wait_for(STARTED)
    assert celery_processes(ns), "the run's worker should be running"
    lab.proc.send_signal(sig)
    rc = lab.finish(timeout=30)
    assert rc == (-signal.SIGKILL if sig == signal.SIGKILL else 128 + sig), lab.text
    assert wait_until(lambda: not celery_processes(ns), timeout=NOTICE_SECONDS), f"left running: {celery_processes(ns)}"
    if sig != signal.SIGKILL:
        assert f"interrupted by {sig.name}: workers stopped" in lab.text
        assert not _queue_exists(f"{ns}.fm6.tasks")  # the interrupted run's messages went with its queue
    assert Lab("--clean", namespace=ns).finish() == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_runs_at_once_interrupted_leave_no_worker_and_none_of_their_queues(sig: signal.Signals) -> None:
    """--jobs: every run in progress sees the interruption; each one's workers and queues go (killed, the
    harness cannot clean up: its workers still end, and the next run of the namespace resets the queues)."""
    ns = derived(f"jobs{int(sig)}")
    lab = Lab("--only", "fm5", "fm6", "--jobs", "2", namespace=ns)
    assert wait_until(lambda: lab.text.count(STARTED) >= 2 or lab.proc.poll() is not None, 60), lab.text
    assert lab.text.count(STARTED) >= 2, lab.text
    assert len(celery_processes(ns)) >= 2, "both runs' workers should be running"
    lab.proc.send_signal(sig)
    assert lab.finish(timeout=30) == (-signal.SIGKILL if sig == signal.SIGKILL else 128 + sig), lab.text
    assert wait_until(lambda: not celery_processes(ns), timeout=NOTICE_SECONDS), f"left running: {celery_processes(ns)}"
    if sig != signal.SIGKILL:
        assert "interrupted by SIGTERM: workers stopped" in lab.text
        assert [q for q in (f"{ns}.fm5.tasks", f"{ns}.fm6.tasks") if _queue_exists(q)] == []
    assert Lab("--clean", namespace=ns).finish() == 0


@pytest.mark.parametrize("cell", ["fm6", "severity_batch/straggler", "bl_ingestion/slow_parse"])  # an FM, case studies
def test_a_worker_killed_mid_run_ends_the_run_as_error_at_once(cell: str) -> None:
    killed: list[float] = []

    def on_stage(stage: records.Stage) -> None:
        if stage == STARTED:
            def kill() -> None:
                for r in workers.leftovers():
                    workers.signal_group(r.pgid, signal.SIGKILL)
                killed.append(time.monotonic())
            threading.Timer(0.3, kill).start()

    report = harness.run_one(cell, "fixed", on_stage)
    assert killed, "the worker was never killed"
    assert report.verdict == "ERROR" and report.error is not None
    assert "the worker exited" in report.error
    assert time.monotonic() - killed[0] < NOTICE_SECONDS


@pytest.fixture
def private_redis() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A redis-server of the test's own (``lab.owned``), so that killing it harms nobody."""
    if owned.available() is None:
        pytest.skip("redis-server is not installed")
    with owned.OwnedRedis("t-dying", persist=False) as server:
        assert server.proc is not None
        yield server.url, server.proc


def test_redis_dying_mid_run_is_an_error_naming_it_with_a_terminal_attached(private_redis: tuple[str, subprocess.Popen[bytes]]) -> None:
    url, redis_proc = private_redis
    ns = derived("redis")
    master, slave = pty.openpty()
    env = {**os.environ, "RCL_NAMESPACE": ns, "CELERY_RESULT_BACKEND": url, "COLUMNS": "160", "TERM": "xterm"}
    proc = subprocess.Popen([sys.executable, "run_all_fms.py", "--only", "fm6"], cwd=ROOT, env=env,
                            stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    seen = bytearray()

    def read() -> bool:
        while select.select([master], [], [], 0)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return True
            if not chunk:
                return True
            seen.extend(chunk)
        return False

    try:
        assert wait_until(lambda: read() or STARTED.encode() in seen, timeout=60), seen.decode(errors="replace")
        redis_proc.kill()
        killed = time.monotonic()
        assert wait_until(lambda: read() or proc.poll() is not None, timeout=60), "the lab hung after Redis died"
        elapsed = time.monotonic() - killed
        proc.wait(timeout=30)
        read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        os.close(master)
    text = seen.decode(errors="replace")
    assert proc.returncode == 3, text
    assert f"Redis at {url}" in text and "ERROR" in text, text[-3000:]
    assert elapsed < 10, f"took {elapsed:.1f}s to end after Redis died"  # measured 3.0 s (19 s with Celery's retry policy)
    assert wait_until(lambda: not celery_processes(ns), timeout=NOTICE_SECONDS)
    assert Lab("--clean", namespace=ns).finish() == 0  # its queues live on the shared broker


@pytest.fixture
def private_broker() -> Iterator[tuple[str, Path]]:
    """A RabbitMQ node of the test's own (own port, own data), so that killing it harms nobody."""
    exe = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
    if not exe.exists():
        pytest.skip("rabbitmq-server is not installed")
    port = 5680 + os.getpid() % 300
    folder = Path(tempfile.mkdtemp(prefix="rcl-rabbit-"))
    for sub in ("mnesia", "log", "home"):
        (folder / sub).mkdir()
    (folder / "enabled_plugins").write_text("[].\n")
    env = {**os.environ, "HOME": str(folder / "home"), "RABBITMQ_NODENAME": f"rcltest-{port}@localhost",
           "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1", "RABBITMQ_NODE_PORT": str(port),
           "RABBITMQ_DIST_PORT": str(port + 20000), "RABBITMQ_MNESIA_BASE": str(folder / "mnesia"),
           "RABBITMQ_LOG_BASE": str(folder / "log"), "RABBITMQ_PID_FILE": str(folder / "pid"),
           "RABBITMQ_ENABLED_PLUGINS_FILE": str(folder / "enabled_plugins"),
           "RABBITMQ_CONFIG_FILE": str(folder / "rabbitmq")}
    subprocess.run([str(exe), "-detached"], env=env, check=True, capture_output=True, timeout=60)
    url = f"amqp://guest:guest@127.0.0.1:{port}//"
    pidfile = folder / "pid"
    try:
        assert wait_until(lambda: services.broker_answers(url, timeout=1.0), timeout=60), "private RabbitMQ did not start"
        yield url, pidfile
    finally:
        if pidfile.exists() and pidfile.read_text().strip().isdigit():
            try:
                os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(folder, ignore_errors=True)


def test_the_broker_dying_mid_run_is_an_error_naming_it(private_broker: tuple[str, Path]) -> None:
    url, pidfile = private_broker
    ns = derived("broker")
    lab = Lab("--only", "fm6", namespace=ns, env={"CELERY_BROKER_URL": url})
    lab.wait_for(STARTED)
    os.kill(int(pidfile.read_text().strip()), signal.SIGKILL)
    killed = time.monotonic()
    rc = lab.finish(timeout=60)
    assert rc == 3, lab.text
    masked = url.replace("guest:guest@", "guest:***@")
    assert f"ERROR\n  error: the broker at {masked} " in lab.text, lab.text  # "does not answer" or "stopped answering"
    assert "guest:guest@" not in lab.text
    assert time.monotonic() - killed < 30
    assert wait_until(lambda: not celery_processes(ns), timeout=NOTICE_SECONDS)


def test_two_namespaces_at_once_both_pass() -> None:
    a, b = Lab("--only", "fm2", namespace=derived("a")), Lab("--only", "fm2", namespace=derived("b"))
    assert (a.finish(), b.finish()) == (0, 0), a.text + b.text
    assert "fm2   PASS G1 G2" in a.text and "fm2   PASS G1 G2" in b.text
    for ns in (derived("a"), derived("b")):
        assert Lab("--clean", namespace=ns).finish() == 0


def test_the_same_namespace_twice_is_refused_at_once() -> None:
    ns = derived("twice")
    first = Lab("--only", "fm6", namespace=ns)
    first.wait_for(STARTED)
    started = time.monotonic()
    second = Lab("--only", "fm1", namespace=ns)
    assert second.finish(timeout=30) == 2, second.text
    assert time.monotonic() - started < 15
    assert f"another run of the lab is using namespace '{ns}' (pid {first.proc.pid})" in second.text
    first.proc.send_signal(signal.SIGTERM)
    assert first.finish(timeout=30) == 128 + signal.SIGTERM
    assert Lab("--clean", namespace=ns).finish() == 0


def test_a_queue_a_hand_started_worker_consumes_is_named_before_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    fm = harness.load("fm1")
    harness.reset(fm)
    by_hand = subprocess.Popen([sys.executable, "-m", "celery", "-A", fm.module, "worker", *fm.worker_args()],
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        assert wait_until(lambda: consumers(f"{NAMESPACE}.fm1.tasks") > 0, timeout=60)
        assert run_all_fms.main(["--only", "fm1"]) == 2
        err = capsys.readouterr().err
        assert f"{NAMESPACE}.fm1.tasks (1 consumer) already consumed" in err and "RCL_NAMESPACE" in err
    finally:
        os.killpg(by_hand.pid, signal.SIGKILL)
        by_hand.wait()



def test_a_worker_left_by_an_earlier_run_is_stopped_and_named() -> None:
    fm = harness.load("fm1")
    harness.reset(fm)
    left = workers.Worker(fm, "left-000000", workers.LOG_DIR / "left-behind.log")
    left.start()
    pid = left.proc.pid if left.proc is not None else 0
    left.proc = None  # forget it, as a harness killed before its cleanup would
    lab = Lab("--only", "fm1")
    assert lab.finish() == 0, lab.text
    assert f"stopped 1 worker(s) left by an earlier run in namespace {NAMESPACE}: fm1 (run left-000000, pid {pid})" in lab.text
    assert wait_until(lambda: not workers.group_alive(pid), timeout=NOTICE_SECONDS)


def test_refused_credentials_are_named_as_such(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CELERY_BROKER_URL", "amqp://guest:not-the-password@127.0.0.1:5672//")
    assert run_all_fms.main(["--only", "fm1"]) == 2
    err = capsys.readouterr().err
    assert "CELERY_BROKER_URL=amqp://guest:***@127.0.0.1:5672// refused the lab's credentials" in err
    assert "not-the-password" not in err


def test_a_report_path_that_cannot_be_written_is_refused_before_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    started = time.monotonic()
    assert run_all_fms.main(["--only", "fm1", "--report", "/no/such/folder/report.html"]) == 2
    assert "the folder /no/such/folder does not exist" in capsys.readouterr().err
    assert time.monotonic() - started < 5


def test_a_bad_or_empty_namespace_exits_2_stating_every_rule() -> None:
    for value in ("", "Has_Capitals", "9starts-with-a-digit", "x" * 32):
        done = subprocess.run([sys.executable, "run_all_fms.py", "--only", "fm1"], cwd=ROOT, capture_output=True,
                              text=True, env={**os.environ, "RCL_NAMESPACE": value}, timeout=60)
        assert done.returncode == 2, (value, done.stderr)
        assert "starts with a lowercase letter" in done.stderr and "1 to 31 characters" in done.stderr
        assert "Traceback" not in done.stderr


def test_clean_deletes_the_namespace_and_nothing_else() -> None:
    ns, other = derived("clean"), derived("keep")
    r = client()
    r.set(f"{ns}:fm1:x", "1")
    r.set(f"{other}:fm1:x", "1")
    try:
        with Connection(broker_url()) as conn:
            cast(Any, conn.default_channel).queue_declare(queue=f"{ns}.fm1.tasks", durable=True)
        assert Lab("--clean", namespace=ns).finish() == 0
        assert not r.exists(f"{ns}:fm1:x") and r.exists(f"{other}:fm1:x")
        assert consumers(f"{ns}.fm1.tasks") == 0 and not _queue_exists(f"{ns}.fm1.tasks")
    finally:
        r.delete(f"{ns}:fm1:x", f"{other}:fm1:x")


def _queue_exists(queue: str) -> bool:
    with Connection(broker_url()) as conn:
        try:
            cast(Any, conn.default_channel).queue_declare(queue=queue, passive=True)
            return True
        except Exception:
            return False


def test_duplicate_only_names_run_once() -> None:
    assert harness.resolve(["fm3", "fm3_dlq_reconciliation", "fm1", "fm3"]) == ["fm3", "fm1"]


def test_a_run_empties_its_queues_once_its_worker_is_gone() -> None:
    fm = harness.load("fm1")
    harness.reset(fm)
    worker = workers.Worker(fm, "purge-000000", workers.LOG_DIR / "purge-test.log")
    worker.start()
    worker.wait_ready()
    pid = worker.proc.pid if worker.proc is not None else 0
    seen: list[tuple[bool, int]] = []
    worker.stop(grace=5, wait=False, after=lambda: seen.append((workers.group_alive(pid), harness.purge(fm))))
    with Connection(broker_url()) as conn:  # a message that arrives while the worker shuts down
        conn.SimpleQueue(f"{NAMESPACE}.fm1.tasks", no_ack=True).put({"stray": True})
    workers.wait_stopped()
    assert seen and seen[0][0] is False  # emptied after the worker's group was gone
    assert harness.purge(fm) == 0


def test_the_report_names_the_namespace_and_the_masked_urls(tmp_path: Path) -> None:
    from lab.show import report

    page = report.write(tmp_path / "r.html", []).read_text()
    assert f"in namespace {NAMESPACE}; broker amqp://guest:***@127.0.0.1:5672//" in page and "guest:guest" not in page


def test_the_same_fm_twice_in_a_row_waits_for_its_last_worker_to_be_gone() -> None:
    """The first run's worker stops in the background and then empties its queues: the
    second run of the same code must not start until it has (its probe would be purged)."""
    first, second = harness.run_one("fm1", "fixed", quiet), harness.run_one("fm1", "fixed", quiet)
    assert (first.verdict, second.verdict) == ("PASS", "PASS"), (first.error, second.error)


def test_down_leaves_a_live_runs_worker_alone_and_force_stops_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The run is the session's namespace's (``--down`` is asked about this namespace); ``--force`` is
    asked in-process, with the lab's own services kept out of it (they may serve this very session)."""
    run = Lab("--only", "fm6")
    try:
        run.wait_for(STARTED)
        running = [r.pgid for r in workers.leftovers()]  # the run's worker groups (pool children come and go)
        assert running, "the run's worker should be running"
        refused = Lab("--down")
        assert refused.finish(timeout=30) == 2, refused.text
        assert refused.text == (f"a run (pid {run.proc.pid}) is live in namespace {NAMESPACE}: not stopped; "
                                "--down --force stops it\n")
        assert all(workers.group_alive(pgid) for pgid in running) and run.proc.poll() is None  # untouched
        monkeypatch.setattr(services, "started_by_lab", list[str])
        said: list[str] = []
        assert down.down(force=True, say=said.append) == 0
        assert said == [f"stopped the live run (pid {run.proc.pid}) in namespace {NAMESPACE}: SIGTERM, it stopped "
                        "its workers"]
        assert run.finish(timeout=30) == 128 + signal.SIGTERM, run.text
        assert wait_until(lambda: not celery_processes(NAMESPACE), timeout=NOTICE_SECONDS), celery_processes(NAMESPACE)
    finally:
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGTERM)
            run.finish(timeout=30)


def test_down_stops_a_worker_no_run_holds_and_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(services, "started_by_lab", list[str])
    fm = harness.load("fm1")
    harness.reset(fm)
    left = workers.Worker(fm, "down-000000", workers.LOG_DIR / "left-for-down.log")
    left.start()
    pid = left.proc.pid if left.proc is not None else 0
    left.proc = None  # forgotten, as by a harness killed before its cleanup
    said: list[str] = []
    assert down.down(say=said.append) == 0
    assert said == [f"stopped 1 worker(s) left running in namespace {NAMESPACE}: fm1 (run down-000000, pid {pid})"]
    assert not workers.group_alive(pid)
