"""A ``celery -A <module> worker`` of a test's own small app, in its own process group, its output in a log.

``ready`` says when it serves (a queue's consumer count, where the broker can say; else what it printed); ``stop``
ends it with TERM, then KILL after 20 s, and nothing of it is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from lab.fm import ROOT
from lab.waiting import wait_until

READY = 60.0


class AppWorker:
    def __init__(self, module: str, env: Mapping[str, str], log: Path, ready: Callable[[AppWorker], bool]) -> None:
        self.log = log
        full = {**os.environ, **env, "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", module, "worker", "--loglevel=INFO", "-n",
                 f"{module.rsplit('.', 1)[-1]}-{uuid.uuid4().hex[:8]}@%h", "--without-gossip", "--without-mingle",
                 "--without-heartbeat"],
                cwd=ROOT, env=full, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        try:
            assert wait_until(lambda: ready(self) or self.proc.poll() is not None, READY), self.text()
            assert self.proc.poll() is None, self.text()
        except BaseException:
            self.stop()
            raise

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
