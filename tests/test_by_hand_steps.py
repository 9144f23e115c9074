"""FM-7, FM-8 and FM-9 by hand, as an attendee does them: the test reads only what the submitter prints and runs the
commands printed there (real broker and backend, real subprocesses), then checks the verdict. And one run per FM that
skips every step (fm9's, whose scenario holds the deploy, the outage and the cut): G7, G8 and G9 each fail, saying
what was missing.

The attendee: runs ``.venv/bin/python fmN_*.py``; when it refuses (exit 2), runs the indented commands it printed
(an ``export`` goes to its shell and the workers'; a ``celery ... worker`` is a shell of its own, the worker before it
stopped first, as the refusal says; ``python -m lab.link`` is a shell of its own, whose printed ``export`` goes to the
workers' shells only; any other command is run to its end) and runs it again; during the run, each cue (``>>> ..., step
i of n (within Ns): ...``) is followed by one command line, which the attendee runs at once, in a shell of its own. Afterwards every shell is closed as a person closes
it (Ctrl-C) and the by-hand backend is stopped and removed: nothing of the namespace is left running.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lab import harness, link
from lab.fm import ROOT, Fm
from lab.hand import HAND_BACKEND, expect_steps
from lab.observe import Event
from lab.records import Collector
from lab.owned import OwnedRedis
from lab.settings import NAMESPACE
from lab.waiting import wait_until
from lab.workers import group_alive
from tests.broker import consumers

CUE = re.compile(r"^>>> .*, step \d+ of \d+ \(within \d+s\): ")
READY_SECONDS = 90.0
SKIP_SECONDS = "4"
"""``RCL_HAND_SECONDS`` for the runs that skip their steps: each step's deadline, short."""


class Shell:
    """A command typed in a shell of its own (own process group), its output kept as it comes."""

    def __init__(self, words: list[str], env: dict[str, str], stdin: bool = False) -> None:
        self.proc = subprocess.Popen(words, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, start_new_session=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.decode(errors="replace").rstrip("\n"))

    def close(self, sig: signal.Signals = signal.SIGINT, timeout: float = 30.0) -> None:
        """Ctrl-C in its window (SIGKILL if it does not end in time)."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if group_alive(self.proc.pid):  # its main process ended (a deploy's SIGTERM): nothing of its group may stay
            os.killpg(self.proc.pid, signal.SIGKILL)
            assert wait_until(lambda: not group_alive(self.proc.pid), 10)
        self.reader.join(timeout=5)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


class Attendee:
    """The attendee's shells and what each holds (see the module docstring)."""

    def __init__(self, fm: Fm, extra: dict[str, str] | None = None) -> None:
        self.fm = fm
        self.env = {**os.environ, "RCL_NAMESPACE": NAMESPACE, **(extra or {})}
        self.env.pop("CELERY_RESULT_BACKEND", None)
        self.env.pop("RCL_OBSERVATIONS_URL", None)
        self.worker_env: dict[str, str] = {}  # exports for the workers' shells only
        self.shells: list[Shell] = []
        self.workers: list[Shell] = []  # the worker shells open now
        self.said: list[str] = []  # what each run of the submitter printed, for a failure's message

    def _words(self, command: str) -> tuple[dict[str, str], list[str]]:
        words = command.split()
        first = next(i for i, w in enumerate(words) if "=" not in w)
        return dict(w.split("=", 1) for w in words[:first]), words[first:]

    def do(self, command: str, worker_only: bool = False, wait: bool = True, restart: bool = False) -> None:
        """Run one printed command as a person would in a shell (see the module docstring)."""
        if command.startswith("export "):
            target = self.worker_env if worker_only else self.env
            target.update(dict(w.split("=", 1) for w in command.split()[1:]))
            return
        assigned, words = self._words(command)
        if " worker " in f" {command} ":
            if restart:  # set-up: "stop it first if it runs", Ctrl-C in its window
                for old in self.workers:
                    old.close()
                self.workers.clear()
            shell = Shell(words, {**self.env, **self.worker_env, **assigned})
            self.shells.append(shell)
            self.workers.append(shell)
            queue = str(self.fm.task_queues[0].name)
            assert wait_until(lambda: consumers(queue) >= 1 or shell.proc.poll() is not None, READY_SECONDS)
            assert shell.proc.poll() is None, shell.text[-3000:]
            return
        if words[-1] == "lab.link":  # the link's own shell: it prints the export for the worker's shell
            shell = Shell(words, {**self.env, **assigned}, stdin=True)
            self.shells.append(shell)
            assert wait_until(lambda: any(line.startswith("export ") for line in shell.lines), 30), shell.text
            self.do(next(line for line in shell.lines if line.startswith("export ")), worker_only=True)
            return
        if not wait:
            self.shells.append(Shell(words, {**self.env, **assigned}))
            return
        done = subprocess.run(words, cwd=ROOT, env={**self.env, **assigned}, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (command, done.stdout, done.stderr)

    def submit(self, act: bool = True, timeout: float = 600.0) -> tuple[int, str]:
        """The submitter, set up as it asks (its exit 2 lists the commands), then run to its end; each cue's command
        run at once when ``act``."""
        for _ in range(4):
            shell = Shell(self.fm.submit_command().split(), self.env)
            done = 0
            deadline = time.monotonic() + timeout
            while shell.proc.poll() is None or done < len(shell.lines):
                lines = shell.lines
                while done < len(lines):
                    line = lines[done]
                    done += 1
                    if act and CUE.match(line):
                        assert wait_until(lambda: len(shell.lines) > done, 10), shell.text
                        self.do(shell.lines[done].strip(), wait=False)
                        done += 1
                seen = done
                if not wait_until(lambda: len(shell.lines) > seen or shell.proc.poll() is not None,
                                  max(0.0, deadline - time.monotonic()), interval=0.02):
                    shell.close(signal.SIGKILL)
                    raise AssertionError(f"the submitter did not end within {timeout:.0f}s:\n{shell.text}")
            shell.close()
            self.said.append(shell.text)
            if shell.proc.returncode != 2:
                return shell.proc.returncode, "\n".join(self.said)
            commands = [line.strip() for line in shell.lines if line.startswith("  ") and not line.startswith("   ")]
            assert commands, shell.text
            for command in commands:
                self.do(command, restart=True)  # an export it prints is for its shell and the worker's
        raise AssertionError("the submitter kept refusing after its commands were run")

    def leave(self, logs: Path | None = None) -> None:
        """Every shell closed with Ctrl-C; the by-hand backend stopped and removed; each shell's window kept in ``logs``."""
        for i, shell in enumerate(reversed(self.shells)):
            shell.close()
            if logs is not None:
                (logs / f"shell{i}-{shell.proc.args[-1] if isinstance(shell.proc.args, list) else ''}.log").write_text(
                    shell.text)
        if logs is not None:
            (logs / "submitter.log").write_text("\n".join(self.said))
        subprocess.run([".venv/bin/python", "-m", "lab.hand", "backend", "stop"], cwd=ROOT, env=self.env,
                       capture_output=True, timeout=60)
        shutil.rmtree(OwnedRedis(HAND_BACKEND).folder, ignore_errors=True)


@pytest.fixture
def attendee(real_services: None) -> Iterator[list[Attendee]]:
    made: list[Attendee] = []
    yield made
    for a in made:
        a.leave()
    assert link.registered() is None


def _verdict(fm: str, out: str, ok: bool) -> None:
    verdict = "PASS" if ok else "FAIL"
    assert re.search(rf"^{fm} fixed \(scenario {fm[2:]} on {fm}, [\d.]+s\): {verdict}$", out, re.M), out


def _no_worker_left() -> None:
    """No process of the namespace's by-hand run is left: its workers (their command names the namespace's app), its
    link, its backend."""
    backend = OwnedRedis(HAND_BACKEND)
    assert not backend.answers()
    shutil.rmtree(backend.folder, ignore_errors=True)  # the port its look chose
    assert link.registered() is None


@pytest.mark.attendee  # make test-by-hand: about 300 s for the three, too slow for make test (README, "By hand")
@pytest.mark.parametrize("name", ["fm7", "fm8", "fm9"])
def test_an_attendee_who_does_what_the_submitter_says_passes(name: str, attendee: list[Attendee], tmp_path: Path) -> None:
    assert link.registered() is None, "a link of an earlier run still runs in the namespace"
    me = Attendee(harness.load(name))
    attendee.append(me)
    started = time.monotonic()
    rc, out = me.submit()
    took = time.monotonic() - started
    if rc != 0:
        me.leave(tmp_path)  # the windows, to read why
    assert rc == 0, out
    _verdict(name, out, ok=True)
    for label in ("G7", "G8", "G9")[: int(name[2:]) - 6]:
        assert re.search(rf"^  ok   {label}: by hand, ", out, re.M), out
    assert out.count("    seen: ") == {"fm7": 2, "fm8": 4, "fm9": 5}[name], out
    assert "missed:" not in out, out
    print(f"{name} by hand: {took:.1f}s")
    me.leave(tmp_path)
    _no_worker_left()
    assert len(me.workers) == 2  # the first and the new version
    for worker in me.workers:  # the worker windows: each fault said in words (lab.quiet_log), none as an error
        lines = worker.lines
        assert not [line for line in lines if "ERROR/" in line or "CRITICAL/" in line], worker.text[-4000:]
        assert not any(line.startswith("Traceback") for line in lines), worker.text[-4000:]
        assert "Hitting Ctrl+C again will terminate all running tasks!" not in worker.text  # a SIGTERM's, unexplained
    assert "lab: cold shutdown" in me.workers[0].text, me.workers[0].text[-3000:]  # the deploy's SIGTERM, in words


@pytest.fixture(scope="module")
def skipped(real_services: None) -> Iterator[tuple[int, str]]:
    """fm9 by hand, every step skipped (scenario 9 holds the deploy, the outage and the cut: one run shows all three
    checks failing), each step's deadline ``SKIP_SECONDS``."""
    me = Attendee(harness.load("fm9"), {"RCL_HAND_SECONDS": SKIP_SECONDS})
    try:
        started = time.monotonic()
        rc, out = me.submit(act=False)
        print(f"fm9 by hand, every step skipped: {time.monotonic() - started:.1f}s")
        yield rc, out
    finally:
        me.leave()
        _no_worker_left()


@pytest.mark.parametrize(("label", "missing"), [
    ("G7", "by hand, start the new version: missed (no second consumer on "),
    ("G8", "by hand, stop the backend: missed (the backend still answer"),
    ("G9", "by hand, cut the connection: missed (no cut asked for within "),
])
def test_an_attendee_who_skips_a_step_fails_its_check_saying_what_was_missing(
        label: str, missing: str, skipped: tuple[int, str]) -> None:
    rc, out = skipped
    assert rc == 1, out
    _verdict("fm9", out, ok=False)
    failed = next((line for line in out.splitlines() if line.startswith(f"  FAIL {label}: ")), "")
    assert missing in failed, out
    assert "Traceback" not in out, out


def _step(t: float, step: str, state: str, text: str) -> Event:
    return Event(t, "hand_step", {"step": step, "state": state, "text": text})


def test_a_check_by_hand_passes_only_the_steps_seen_and_names_each_missing_one() -> None:
    """No broker: ``lab.hand.expect_steps`` over a side's stream, as G7, G8 and G9 call it."""
    events = [_step(1.0, "a", "cued", "do a"), _step(2.0, "a", "seen", "a happened"),
              _step(3.0, "b", "cued", "do b"), _step(9.0, "b", "missed", "no b within 4s of the cue")]
    c = Collector("G")
    expect_steps(c, events, ["a"])
    assert c.result().ok and c.result().detail == "by hand, a: seen (a happened)"
    c = Collector("G")
    expect_steps(c, events, ["a", "b", "c"])
    check = c.result()
    assert not check.ok
    assert check.detail == ("by hand, b: missed (no b within 4s of the cue) (expected b, done when the submitter said so); "
                            "by hand, c: never cued (expected c, done when the submitter said so)")
