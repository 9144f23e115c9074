"""``BackstopRequest`` keeps the worker's main loop free while the backend hangs (issue 38, item 4).

Before, the main process called the backend (``get_state``, then ``mark_as_done``) inside billiard's timeout
callback: with a backend that accepts and never answers (``redis_socket_timeout`` 3 s), the next message
started 6.10 s and 6.12 s after it was sent (two runs on the old code, Celery 5.7.0); now 0.10 s and 0.11 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection

from lab.fm import ROOT
from lab.settings import broker_url
from lab.waiting import wait_until
from tests.backstop_app import PREFIX, QUEUE, producer, shared
from tests.test_backend_client import silent_port  # noqa: F401  # pyright: ignore[reportUnusedImport]  (the fixture)

pytestmark = pytest.mark.usefixtures("real_services")


def _consumers(conn: Connection) -> int | None:
    try:
        channel: Any = conn.default_channel
        return int(channel.queue_declare(queue=QUEUE, passive=True).consumer_count)
    except Exception:
        conn.close()
        return None


def test_a_time_limit_kill_with_a_hanging_backend_leaves_the_main_loop_free(
        silent_port: int, tmp_path: Path) -> None:  # noqa: F811
    log = tmp_path / "worker.log"
    env = {**os.environ, "BS_BACKEND": f"redis://127.0.0.1:{silent_port}/0", "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.backstop_app", "worker", "--loglevel=INFO", "-n",
             f"bs-{uuid.uuid4().hex[:8]}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    key = uuid.uuid4().hex[:8]
    r = shared()
    try:
        with Connection(broker_url()) as conn:
            assert wait_until(lambda: proc.poll() is not None or _consumers(conn) == 1, 60), log.read_text()
        producer.send_task("bs.slow", args=[key])
        assert wait_until(lambda: "ran past its time_limit of 1" in log.read_text(errors="replace"), 30), log.read_text()
        sent = time.time()
        producer.send_task("bs.quick", args=[key])
        assert wait_until(lambda: r.exists(f"{PREFIX}quick:{key}"), 20), log.read_text()
        started = float(r.get(f"{PREFIX}quick:{key}"))
        print(f"quick started {started - sent:.2f}s after it was sent")
        assert started - sent < 1.5, (started - sent, log.read_text())  # before: 6.1 s, 6.1 s (two runs)
        assert wait_until(lambda: "time_limit envelope not stored" in log.read_text(errors="replace"), 40), \
            log.read_text()  # the store failed for good: the message is requeued, not acked
        assert wait_until(lambda: r.llen(f"{PREFIX}slow:{key}") == 2, 20), log.read_text()  # and runs again
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # its settling thread may still wait on the backend
            proc.wait()
        r.delete(f"{PREFIX}quick:{key}", f"{PREFIX}slow:{key}")
        with Connection(broker_url()) as conn:
            channel: Any = conn.default_channel
            channel.queue_delete(QUEUE)
            channel.exchange_delete(QUEUE)
