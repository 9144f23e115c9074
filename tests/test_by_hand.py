"""An FM run by hand, as its docstring says: a worker started with the docstring's command in
one "shell", ``.venv/bin/python fmN_*.py`` in another (real services, real subprocesses).

What is checked: the submitter prints the harness's verdict and timeline; it is refused while a
lab run holds the namespace; Ctrl-C ends it with one line and exit 130 and leaves nothing that
slows the next run; the worker's window says the lab's own kills as expected, in one line each,
and shows the recoveries at Celery's default log level.
"""

from __future__ import annotations

import ast
import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from billiard.exceptions import WorkerLostError

import lessons
from lab import harness, worker_log
from lab.fm import ROOT, Fm
from lab.observe import client
from lab.settings import NAMESPACE
from lab.waiting import wait_until
from tests.broker import consumers

STARTED = "running the scenario"
READY_SECONDS = 60.0



class Shell:
    """A command typed in a shell of its own (its own process group), its output read as it comes."""

    def __init__(self, command: str, namespace: str, log: Path | None = None) -> None:
        self.log = log
        out: Any = log.open("wb") if log is not None else subprocess.PIPE
        words = command.split()
        first = next(i for i, w in enumerate(words) if "=" not in w)  # FM-7: REMAP_SIGTERM=SIGQUIT .venv/bin/celery ...
        assigned = dict(w.split("=", 1) for w in words[:first])
        self.proc = subprocess.Popen(words[first:], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True,
                                     env={**os.environ, **assigned, "RCL_NAMESPACE": namespace})
        self.lines: list[str] = []

    def read_until(self, words: str, timeout: float = READY_SECONDS) -> None:
        stream = self.proc.stdout
        assert stream is not None
        deadline = time.monotonic() + timeout
        for raw in stream:  # the submitter prints each stage as it begins, then exits
            self.lines.append(raw.decode(errors="replace"))
            if words in self.lines[-1] or time.monotonic() > deadline:
                break
        assert words in self.text, self.text

    def finish(self, timeout: float = 120.0) -> int:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
        if out:
            self.lines.append(out.decode(errors="replace"))
        return int(self.proc.returncode)

    @property
    def text(self) -> str:
        return "".join(self.lines)


@pytest.fixture
def hand_worker(real_services: None, tmp_path: Path) -> Iterator[Callable[..., Shell]]:
    """``start(fm, namespace)``: the FM's worker, started with its docstring's command, ready once it
    consumes the FM's queue; stopped as Ctrl-C stops it (SIGINT to its group), then its log is whole."""
    started: list[Shell] = []

    def start(fm: Fm, namespace: str, extra: str = "") -> Shell:
        worker = Shell(f"{fm.worker_command()}{extra}", namespace,
                       tmp_path / f"{fm.short}-{namespace}-worker{len(started)}.log")
        started.append(worker)
        queue = str(fm.task_queues[0].name).replace(f"{NAMESPACE}.", f"{namespace}.", 1)
        assert wait_until(lambda: consumers(queue) >= len(started) or worker.proc.poll() is not None, READY_SECONDS)
        assert worker.proc.poll() is None, worker.log.read_text() if worker.log else ""
        return worker

    yield start
    for worker in started:
        stop(worker)


def stop(worker: Shell) -> str:
    """Ctrl-C in the worker's window; its whole log once it has exited."""
    if worker.proc.poll() is None:
        os.killpg(worker.proc.pid, signal.SIGINT)
        try:
            worker.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.proc.pid, signal.SIGKILL)
            worker.proc.wait()
    return worker.log.read_text(errors="replace") if worker.log is not None else ""


def clean(namespace: str) -> None:
    assert subprocess.run([".venv/bin/python", "run_all_fms.py", "--clean"], cwd=ROOT, capture_output=True,
                          env={**os.environ, "RCL_NAMESPACE": namespace}, timeout=120).returncode == 0


# ---- the docstrings' commands ----------------------------------------------------------------


def _docstring_commands(path: Path) -> list[str]:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    return [line.strip() for line in doc.splitlines() if re.match(r"^    (\w+=\S+ )*\S*(celery|python)\b", line)]


DOCSTRINGS = [ROOT / f"{module}.py" for module in lessons.modules().values()] + sorted(
    p for p in (ROOT / "case_studies").glob("*/*.py") if p.stem in ("fixed", "writeup"))


@pytest.mark.parametrize("path", DOCSTRINGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_a_docstring_gives_runs_from_the_projects_venv(path: Path) -> None:
    commands = _docstring_commands(path)
    bare = [c for c in commands if not re.match(r"^(\w+=\S+ )*\.venv/bin/(celery|python) ", c)]
    assert not bare, f"{path.name}: commands a fresh shell cannot run (no .venv/bin/): {bare}"
    if path.parent == ROOT:  # an FM: the worker and the submitter, both
        assert len(commands) == 2, commands


# ---- the worker's window ---------------------------------------------------------------------


def test_a_by_hand_fm3_run_prints_the_harness_timeline_and_its_worker_window_explains_every_kill(
        hand_worker: Callable[[Fm, str], Shell]) -> None:
    fm = harness.load("fm3")
    worker = hand_worker(fm, NAMESPACE)
    submitter = Shell(fm.submit_command(), NAMESPACE)
    assert submitter.finish() == 0, submitter.text
    out = submitter.text
    assert "fm3 fixed [" in out and "] running the scenario ..." in out  # the harness's stages, plain in a pipe
    assert re.search(r"^fm3 fixed \(scenario 3 on fm3, [\d.]+s\): PASS$", out, re.M), out
    for check in ("G1", "G2", "G3"):
        assert f"  ok   {check}: " in out
    assert "--- fm3: what happened to each document (seconds since submission) ---" in out
    # doc4 and doc9, then the side chords: doc33 (behind) and the poison body
    assert out.count("dead-lettered: finalised by the DLQ drain") == 4 and "email sent" in out

    log = stop(worker)
    assert f"app:         {NAMESPACE}_fm3:" in log  # the banner names the namespace
    assert "Traceback" not in log and "ERROR/" not in log and "WorkerLostError(" not in log, log
    kills = re.findall(r"expected: the lab killed pool process ForkPoolWorker-\d+ \(pid \d+\): scenario fault (\w+) on "
                       r"(doc\d+), (\w+) attempt \d", log)
    assert sorted(kills) == sorted([("CRASH_ONCE", "doc3", "parse_document")] + [("POISON", "doc4", "parse_document")] * 3
                                   + [("FETCH_POISON", "doc9", "fetch_document")] * 3
                                   + [("POISON", "doc33", "parse_document")] * 3), log  # doc33: side chord "behind"
    assert log.count("a poison chord body: the mail stand-in kills every notify") == 3, log
    lost = re.findall(r"expected: (doc\d+)'s \w+ lost its process \(WorkerLostError\): Celery requeues it", log)
    assert sorted(lost) == ["doc3", "doc33", "doc33", "doc33", "doc4", "doc4", "doc4", "doc9", "doc9", "doc9"], log
    assert log.count("that was delivery 3 of 3 (x-delivery-limit + 1): the broker dead-letters it") == 4  # and notify
    for recovery in ("lab: doc3 ok on attempt 2", "lab: doc4 dead-lettered (delivery_limit)",
                     "lab: doc9 dead-lettered (delivery_limit)", "lab: notify (chord) ended ok; the email is sent",
                     "lab: the chord's notify dead-lettered (delivery_limit)", "lab: doc33 dead-lettered (delivery_limit)"):
        assert recovery in log, log  # at Celery's default level (the docstring's command has no --loglevel)
    warnings = [line for line in log.splitlines() if "WARNING/" in line]
    assert warnings and all("dead letters in" in w and "which no drain can place: " in w for w in warnings), warnings


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("multiprocessing", logging.ERROR, __file__, 1, msg, args, None)


def test_a_death_the_lab_did_not_cause_stays_as_celery_wrote_it() -> None:
    expected = worker_log.ExpectedFaults()
    exited = _record("Process %r pid:%r exited with %r", "ForkPoolWorker-9", 999_999_999, "signal 9 (SIGKILL)")
    lost = _record("Task handler raised error: %r", WorkerLostError("Worker exited prematurely: signal 9 (SIGKILL) "
                                                                    "Job: 424242."))
    for record in (exited, lost):
        before = record.getMessage()
        assert expected.filter(record) is True
        assert record.getMessage() == before and record.levelno == logging.ERROR


# ---- the submitter: a held namespace, Ctrl-C ---------------------------------------------------


def test_a_by_hand_run_is_refused_while_a_lab_run_holds_the_namespace(real_services: None) -> None:
    ns = f"{NAMESPACE}-held"
    lab = Shell(".venv/bin/python run_all_fms.py --only fm6", ns)
    try:
        lab.read_until(STARTED)
        started = time.monotonic()
        submitter = Shell(harness.load("fm1").submit_command(), ns)
        assert submitter.finish(timeout=30) == 2, submitter.text
        assert time.monotonic() - started < 15, "refused at once, not after a run"
        assert f"error: another run of the lab is using namespace '{ns}' (pid {lab.proc.pid})" in submitter.text
        assert "for this command and its worker alike" in submitter.text and "Traceback" not in submitter.text
    finally:
        os.killpg(lab.proc.pid, signal.SIGTERM)
        lab.finish(timeout=60)
        clean(ns)


def _run_events(namespace: str) -> Callable[[], list[dict[str, str]]]:
    """The events of the one run ``namespace`` holds (its main chord's, not its side chords'), read from
    its stream once it exists."""
    r: Any = client()
    found: list[str] = []
    main = re.compile(rf"{re.escape(namespace)}:run:\d{{6}}-[0-9a-f]{{6}}:events")

    def events() -> list[dict[str, str]]:
        if not found:
            found.extend(str(k) for k in r.scan_iter(match=f"{namespace}:run:*:events") if main.fullmatch(str(k)))
        return [fields for key in found[:1] for _, fields in r.xrange(key)]

    return events


def test_ctrl_c_ends_a_by_hand_run_in_one_line_and_the_next_run_does_not_wait_for_it(
        hand_worker: Callable[[Fm, str], Shell]) -> None:
    ns = f"{NAMESPACE}-ctrlc"
    fm = harness.load("fm4")
    first: Shell | None = None
    try:
        hand_worker(fm, ns)
        first = Shell(fm.submit_command(), ns)
        first.read_until(STARTED)
        # Ctrl-C while the chord's notify waits at FM-4's gate, which only the submitter opens: the
        # submitter is stopped at the run's first event, long before the chord's last member, so the
        # notify that follows waits there for certain. Left so, it would hold a pool slot for
        # GATE_TIMEOUT_SECONDS (30 s), and the next run's two notifies would wait behind it.
        events = _run_events(ns)
        assert wait_until(lambda: bool(events()) or first.proc.poll() is not None, 60), first.text
        os.kill(first.proc.pid, signal.SIGSTOP)
        assert wait_until(lambda: any(e.get("kind") == "gate_wait" for e in events()), 60), [e.get("kind") for e in events()]
        assert not any(e.get("kind") == "notify_end" for e in events()), f"the gate should still be closed: {events()}"
        os.kill(first.proc.pid, signal.SIGINT)
        os.kill(first.proc.pid, signal.SIGCONT)
        assert first.finish(timeout=30) == 130, first.text
        assert "Traceback" not in first.text and "KeyboardInterrupt" not in first.text, first.text
        last = first.text.strip().splitlines()[-1]
        assert re.fullmatch(r"interrupted by SIGINT: run \S+ cancelled, its queued messages purged; .*", last), last

        started = time.monotonic()
        second = Shell(fm.submit_command(), ns)
        assert second.finish() == 0, second.text
        took = time.monotonic() - started
        assert "was interrupted: waiting until the worker has finished what it had already taken" in second.text
        assert re.search(r"^fm4 fixed \(scenario 4 on fm4, [\d.]+s\): PASS$", second.text, re.M), second.text
        assert took < 20, f"the run after Ctrl-C took {took:.1f}s"
    finally:
        if first is not None and first.proc.poll() is None:  # a failed assertion: no stopped submitter may hold the namespace
            first.proc.kill()
            first.proc.wait(timeout=10)
        clean(ns)
