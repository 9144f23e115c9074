"""lab/owned.py: a redis-server of the lab's own, stopped and started with its data, never orphaned.

The groundwork of FM-8's scenario (the result backend goes away); each test checks the process
table and the server's own answers, not the primitive's word."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, cast

import amqp
from amqp.exceptions import PreconditionFailed
import pytest
import redis
from kombu import Connection, Exchange, Queue

import run_all_fms
from lab import owned
from lab.fm import ROOT
from lab.waiting import wait_until
from tests.namespaces import derived

needs_redis = pytest.mark.skipif(owned.available() is None, reason="needs redis-server")


def _client(server: owned.OwnedRedis) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=server.port, decode_responses=True, socket_timeout=2)


@needs_redis
def test_a_persistent_owned_redis_keeps_its_keys_and_its_url_across_a_stop() -> None:
    with owned.OwnedRedis("t-persist") as server:
        url = server.url
        with _client(server) as r:
            r.set("k", "kept")
        server.stop()
        assert not server.answers()  # really gone: it does not answer at its port
        server.start()
        assert server.url == url
        with _client(server) as r:
            assert r.get("k") == "kept"
    assert not server.folder.exists()


@needs_redis
def test_an_owned_redis_without_persistence_comes_back_empty() -> None:
    with owned.OwnedRedis("t-empty", persist=False) as server:
        with _client(server) as r:
            r.set("k", "lost")
        server.stop()
        server.start()
        with _client(server) as r:
            assert r.get("k") is None


@needs_redis
def test_one_a_killed_run_left_running_is_stopped_by_the_next_run_or_down() -> None:
    ns = derived("owned")
    code = ("from lab import owned; s = owned.OwnedRedis('t-orphan'); s.start(); print(s.port, s.proc.pid, flush=True); "
            "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")  # the run dies; its server stays
    env = {**os.environ, "RCL_NAMESPACE": ns}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL, done.stderr
    port, pid = (int(x) for x in done.stdout.split())
    assert Path(f"/proc/{pid}").exists()
    said = subprocess.run([sys.executable, "run_all_fms.py", "--down"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)
    assert said.returncode == 0, said.stdout + said.stderr
    assert f"stopped the lab's own redis-t-orphan (a scenario's redis-server) left running in namespace {ns}" in said.stdout
    assert wait_until(lambda: not Path(f"/proc/{pid}").exists() or owned._zombie(pid), 10)  # pyright: ignore[reportPrivateUsage]
    assert (ROOT / ".lab" / ns / "owned" / "redis-t-orphan" / "port").read_text() == str(port)  # kept for the next start
    subprocess.run([sys.executable, "-c", "from lab import owned; owned.OwnedRedis('t-orphan').remove()"], cwd=ROOT,
                   env=env, check=True, timeout=60)


def test_a_machine_without_redis_server_is_told_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(owned, "available", lambda: None)
    with pytest.raises(owned.OwnedServiceMissing, match="needs redis-server"):
        owned.OwnedRedis("t-missing").start()


def _left_by_a_killed_run(server: str, env: dict[str, str], timeout: float = 60) -> int:
    """The pid of ``server`` (an ``owned`` constructor call), started by a process that then dies by SIGKILL."""
    code = (f"from lab import owned; s = {server}; s.start(); print(s.proc.pid, flush=True); "
            "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == -signal.SIGKILL, done.stderr
    return int(done.stdout)


@needs_redis
def test_the_next_scenario_8_run_stops_only_the_servers_whose_run_is_gone() -> None:
    """lessons/fm8/outage.py starts each run's backend after ``stop_leftovers(orphans_only=True)``: a server whose
    owner died goes (with its folder); one whose owner still runs (another ``--jobs`` run) stays."""
    ns = derived("orphans")
    env = {**os.environ, "RCL_NAMESPACE": ns}
    orphan = _left_by_a_killed_run("owned.OwnedRedis('t-dead-owner')", env)
    check = ("from lab import owned\nwith owned.OwnedRedis('t-live-owner') as s:\n"
             "    print(owned.stop_leftovers(orphans_only=True), s.answers(), flush=True)")
    said = subprocess.run([sys.executable, "-c", check], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert said.stdout.split("\n")[0] == "['redis-t-dead-owner'] True", said.stdout + said.stderr
    assert wait_until(lambda: not Path(f"/proc/{orphan}").exists() or owned._zombie(orphan), 10)  # pyright: ignore[reportPrivateUsage]
    assert not (ROOT / ".lab" / ns / "owned" / "redis-t-dead-owner").exists()


def test_a_machine_without_redis_server_skips_scenario_8_saying_why(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """issue 22: scenario 8's cells are skipped with a clear reason where redis-server is missing; the run's exit
    status stays 0 (nothing failed), the table says SKIPPED."""
    monkeypatch.setattr(owned, "available", lambda: None)
    assert run_all_fms.main(["--only", "fm8"]) == 0
    out = capsys.readouterr().out
    assert "fm8 fixed (scenario 8 on fm8, " in out and "): SKIPPED" in out, out
    assert "  skipped: scenario 8 stops and starts a redis-server of the lab's own; none is installed here " \
           "(needs redis-server (Debian: apt-get install redis-server))" in out, out
    assert "fm8   SKIPPED" in out, out


needs_rabbit = pytest.mark.skipif(owned.rabbit_available() is None, reason="needs rabbitmq-server")


@needs_rabbit
def test_an_owned_rabbitmq_node_times_a_consumer_out_within_seconds_and_leaves_nothing() -> None:
    """FM-9's node: its own name, ports and data; ``consumer_timeout`` and ``channel_tick_interval`` as given, so
    that a message held unacknowledged past the timeout closes its channel with 406 PRECONDITION_FAILED within
    about the timeout (RabbitMQ's default is 30 minutes, checked once a minute). Removed, nothing of it runs."""
    with owned.OwnedRabbit("t-timeout", consumer_timeout=2000, channel_tick_interval=500) as node:
        assert node.port != 5672 and node.node.endswith("-t-timeout@localhost")
        said = node.ctl("eval", "{application:get_env(rabbit, consumer_timeout), "
                                "application:get_env(rabbit, channel_tick_interval)}.").stdout.strip()
        assert said == "{{ok,2000},{ok,500}}", said
        pid = cast(subprocess.Popen[bytes], node.proc).pid
        with Connection(node.url) as conn:
            channel: Any = conn.channel()
            Queue("t.q", Exchange("t.q"), routing_key="t.q", channel=channel).declare()
            channel.basic_publish(amqp.Message("x"), exchange="t.q", routing_key="t.q")
            got: list[object] = []
            channel.basic_qos(0, 1, False)
            channel.basic_consume("t.q", callback=got.append, no_ack=False)
            started = time.monotonic()
            with pytest.raises(PreconditionFailed, match="delivery acknowledgement on channel"):
                while time.monotonic() - started < 15:
                    try:
                        conn.drain_events(timeout=0.5)
                    except TimeoutError:
                        continue
            took = time.monotonic() - started
        assert got and 2.0 <= took <= 2.0 + 0.5 + 2.0, took  # the timeout, one tick, and a loaded machine's slack
    assert wait_until(lambda: not owned._group(pid), 10)  # pyright: ignore[reportPrivateUsage]
    assert not node.folder.exists()


@needs_rabbit
def test_an_owned_node_a_killed_run_left_is_stopped_by_the_next_run() -> None:
    env = {**os.environ, "RCL_NAMESPACE": derived("orphan-rabbit")}
    pgid = _left_by_a_killed_run("owned.OwnedRabbit('t-orphan')", env, timeout=150)
    assert owned._group(pgid)  # pyright: ignore[reportPrivateUsage]
    said = subprocess.run([sys.executable, "-c", "from lab import owned; print(owned.stop_leftovers(orphans_only=True))"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert said.stdout.strip() == "['rabbit-t-orphan']", said.stdout + said.stderr
    assert wait_until(lambda: not owned._group(pgid), 10)  # pyright: ignore[reportPrivateUsage]


def test_a_machine_without_rabbitmq_server_skips_scenario_9_saying_why(monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """issue 23: scenario 9's sides need a RabbitMQ node of the lab's own; without rabbitmq-server the cell is
    skipped with the reason, before any worker starts, and the exit status stays 0."""
    monkeypatch.setattr(owned, "rabbit_available", lambda: None)
    assert run_all_fms.main(["--only", "fm9"]) == 0
    out = capsys.readouterr().out
    assert "fm9 fixed (scenario 9 on fm9, " in out and "): SKIPPED" in out, out
    assert "  skipped: scenario 9 runs a rabbitmq-server of the lab's own; none is installed here " \
           "(needs rabbitmq-server (Debian: apt-get install rabbitmq-server))" in out, out
    assert "fm9   SKIPPED" in out, out


@needs_redis
def test_a_first_start_on_a_taken_port_is_tried_once_more_on_another() -> None:
    """Issue 38: before, a port taken between its choice and the start ended the scenario (OSError)."""
    server = owned.OwnedRedis("t-taken", persist=False)
    taken = server.port
    with socket.socket() as holder:
        # as redis-server binds (and the lab's port check): a port an earlier owned server's closed connections
        # keep in TIME_WAIT is free to it; without this the test's own bind failed there (a fresh-clone CI, EADDRINUSE)
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", taken))
        holder.listen(1)
        try:
            server.start()
            assert server.port != taken and server.answers()
        finally:
            server.remove()
    assert not server.folder.exists()


def test_a_start_that_fails_twice_says_why_keeps_its_log_and_down_removes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 38: before, the message named a log that the caller's cleanup had deleted, said no reason, and
    the folder outlived --down."""
    fake = tmp_path / "redis-server"
    fake.write_text('#!/bin/sh\necho "boom: cannot listen on $2"\nexit 3\n')
    fake.chmod(0o755)
    monkeypatch.setattr(owned, "available", lambda: str(fake))
    server = owned.OwnedRedis("t-fails", persist=False)
    with pytest.raises(owned.StartFailed) as failed:
        server.start()
    said = str(failed.value)
    first, second = [int(p) for p in re.findall(r"did not come up on port (\d+)", said)]
    assert first != second and said.count("it exited with status 3") == 2, said
    assert f"boom: cannot listen on {first}" in said and f"boom: cannot listen on {second}" in said, said
    logs = [Path(p) for p in re.findall(r"log: (\S+redis\.log)", said)]
    assert len(logs) == 2 and all(p.is_file() for p in logs), said
    assert f"boom: cannot listen on {second}" in logs[1].read_text()
    assert not server.folder.exists()  # a first start that never came up leaves only its logs
    stale = owned.OWNED_DIR / "redis-t-stale"  # a folder an older failed start left, no server
    stale.mkdir(parents=True)
    (stale / "port").write_text("16999")
    removed = owned.remove_failed()
    assert "failed" in removed and "redis-t-stale" in removed
    assert not owned.FAILED_DIR.exists() and not stale.exists()


@pytest.mark.parametrize("flag", ["--down", "--clean"])
def test_down_and_clean_remove_a_failed_starts_leftovers(flag: str) -> None:
    ns = derived(f"failed{flag[2:]}")
    folder = ROOT / ".lab" / ns / "owned"
    (folder / "failed" / "redis-x-16400-1").mkdir(parents=True, exist_ok=True)  # (a run on older code left it)
    (folder / "failed" / "redis-x-16400-1" / "redis.log").write_text("boom\n")
    (folder / "rabbit-y").mkdir(parents=True, exist_ok=True)
    (folder / "rabbit-y" / "port").write_text("16500")
    env = {**os.environ, "RCL_NAMESPACE": ns}
    said = subprocess.run([sys.executable, "run_all_fms.py", flag], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert said.returncode == 0, said.stdout + said.stderr
    assert "failed, rabbit-y" in said.stdout, said.stdout
    assert not (folder / "failed").exists() and not (folder / "rabbit-y").exists()
