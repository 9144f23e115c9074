"""A lesson's steps by hand: what the attendee does to a running pipeline, cued by the submitter and seen happen.

The harness acts on a run itself (``lab.injector``: it starts a new worker, stops a service, cuts a connection).
A run by hand (``lab.by_hand``) has none of that: the attendee acts, in a shell of their own. A lesson declares its
by-hand injectors (``lab.scenarios.Part.by_hand``), each made with a ``Hand`` (the program, a line on the submitter's
console, the deadline of each step); each one:

- says before the run what must be set up (``HandInjector.unmet``: the exact commands), or nothing;
- at each step's moment, says what to do and the exact command (``Steps.cue``), with its deadline;
- watches for the action and says what it saw (``Steps.seen``: a new consumer on the queue, a worker gone, the
  backend not answering, the connection closed), or, once the deadline passed, what was missing (``Steps.missed``),
  and lets the run go on without it.

Each cue, sight and miss is an event of the side chord's stream (``hand_step``: ``step``, ``state``, ``text``), so
that the lesson's check can fail a run whose step was not done, saying which (``expect_steps``), rather than pass a
run the fault never met.

``RCL_HAND_SECONDS`` sets every step's deadline (default ``HAND_SECONDS``).

``python -m lab.hand stop-worker <pid>`` stops a worker as a deploy does (the rolling deploys' step by hand):
SIGTERM to its main process, then, if it still runs ``STOP_GRACE_SECONDS`` later, SIGKILL to it and every process
under it, as Kubernetes does at the end of ``terminationGracePeriodSeconds``. The grace is not a formality:
Celery's cold shutdown (``REMAP_SIGTERM=SIGQUIT``, 5.7.0) does its blocking work in the signal handler, on top of
whatever line the main process was at, and two such lines never let it end: between a job's header and its body
written to a pool process (``AsynPool._write_job``), the handler's pool join waits for that process, which waits
for the body; inside an AMQP frame's write (py-amqp's ``write_frame`` holds a non-reentrant ``buffer_lock``, here
for an ack), the handler's ``basic_cancel`` waits for that lock. Seen by hand (2026-12-06: a ``kill -TERM`` alone
left the old worker running 120 s; the by-hand cue comes the moment the worker receives a slow document, when it
writes jobs), and with py-spy in a stress of 24 bare SIGTERMs to a busy worker of the last lesson: 3 had not exited
30 s later, one over a half-written job, one on the ack's lock, and one in the pool join while a pool process
waited out billiard's check that its results were read (``Worker._ensure_messages_consumed``: 300 looks 0.1 s
apart). On 5.6.3 a fourth (C16's deploys, 2026-12-07, its traceback in the worker's log): the handler came inside
py-amqp's read of a message's header frame, and ``on_cold_shutdown``'s unguarded ``task_consumer.cancel()`` read
the next frame for its ``basic_cancel``: ``UnexpectedFrame: Received frame 3 while expecting type: 2`` left the
handler, the consumer took it for a lost connection and reconnected, and the worker served on (its body ran to its
end, a later delivery too) until the grace's SIGKILL. 5.7.0 calls that cancel through ``ignore_errors``; 5.5.3 does
not call it.

``python -m lab.hand backend start|stop`` starts and stops the result backend a by-hand run may stop: a
``redis-server`` of the lab's own in this namespace (``lab.owned.OwnedRedis``, named ``HAND_BACKEND``, its data
kept across a stop and a start, its port kept), found by its pid file, never by a name pattern.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

from lab.fm import Fm
from lab.injector import Injector
from lab.observe import Event, Reader
from lab.queues import queue_consumers
from lab.records import Collector

HAND_SECONDS = 120.0
"""How long the submitter waits for each step by hand, unless ``RCL_HAND_SECONDS`` says otherwise."""
STOP_GRACE_SECONDS = 10.0
"""By hand, the old worker's grace between SIGTERM and SIGKILL (``stop-worker``): Celery's cold shutdown of a
rolling deploy's worker takes 1.5 to 3.5 s on the lab's loaded machine when it does not hang."""
HAND_BACKEND = "by-hand"
"""The name of the by-hand result backend (``lab.owned``: ``.lab/<namespace>/owned/redis-by-hand/``)."""


def hand_seconds() -> float:
    return float(os.environ.get("RCL_HAND_SECONDS") or HAND_SECONDS)


@dataclass(frozen=True)
class Hand:
    """What a by-hand injector is made with: the program the attendee runs, a line on the submitter's console, and
    each step's deadline in seconds."""

    fm: Fm
    say: Callable[[str], None]
    seconds: float


class HandInjector(Injector):
    """An injector of a run by hand: the attendee acts, the injector cues and watches (see the module docstring)."""

    steps: ClassVar[int] = 1
    """How many steps it cues (the run's deadline grows by a step's deadline for each)."""

    def __init__(self, hand: Hand) -> None:
        self.hand = hand

    def unmet(self) -> str | None:
        """What must be set up before the run, with the exact commands (the submitter adds the worker's); None when all
        is set."""
        return None


HandFactory = Callable[[Hand], HandInjector]
"""How a lesson names a by-hand injector: each run by hand makes its own."""


class Steps:
    """The steps of one by-hand injector, as the submitter says them and the side's stream records them."""

    def __init__(self, hand: Hand, total: int, what: str) -> None:
        self.hand, self.total, self.what = hand, total, what
        self.cued: dict[str, float] = {}  # step -> when it was cued (monotonic seconds from the event's time)
        self.done: set[str] = set()  # seen or missed
        self.ok: set[str] = set()  # seen
        self.numbers: dict[str, int] = {}

    def cue(self, side: Reader, step: str, text: str, command: str, now: float) -> None:
        self.numbers[step] = len(self.numbers) + 1
        self.cued[step] = now
        self.hand.say(f">>> {self.what}, step {self.numbers[step]} of {self.total} (within {self.hand.seconds:.0f}s): "
                      f"{text}:")
        self.hand.say(f"    {command}")
        side.rec.event("hand_step", step=step, state="cued", text=text, command=command)

    def late(self, step: str, now: float) -> bool:
        return step in self.cued and step not in self.done and now - self.cued[step] > self.hand.seconds

    def seen(self, side: Reader, step: str, text: str) -> None:
        self.done.add(step)
        self.ok.add(step)
        self.hand.say(f"    seen: {text}")
        side.rec.event("hand_step", step=step, state="seen", text=text)

    def missed(self, side: Reader, step: str, text: str) -> None:
        self.done.add(step)
        self.hand.say(f"    missed: {text}; the run goes on without it, and its check will fail")
        side.rec.event("hand_step", step=step, state="missed", text=text)


def hand_steps(events: Sequence[Event]) -> dict[str, tuple[str, str]]:
    """Each by-hand step of a side's stream: ``step -> (state, text)``, its last state (cued, seen, missed)."""
    return {e.get("step"): (e.get("state"), e.get("text")) for e in events if e.kind == "hand_step"}


def by_hand(events: Sequence[Event]) -> bool:
    """Was this side run by hand (its steps cued by the submitter)?"""
    return any(e.kind == "hand_step" for e in events)


def expect_steps(c: Collector, events: Sequence[Event], wanted: Sequence[str]) -> None:
    """A check by hand: each of ``wanted`` was seen done; else what was missing, in the submitter's words."""
    steps = hand_steps(events)
    for step in wanted:
        state, text = steps.get(step, ("never cued", ""))
        c.expect(state == "seen", f"by hand, {step}: {state}{f' ({text})' if text else ''}",
                 f"{step}, done when the submitter said so")


def consumers(fm: Fm) -> int:
    """How many consumers the broker counts on the program's task queue now."""
    with fm.app.connection_for_write() as conn:
        return queue_consumers(conn, str(fm.task_queues[0].name))


def worker_pids(events: Sequence[Event]) -> list[str]:
    """The main processes of the workers that received the run's messages (the observer's ``received``), in order."""
    return list(dict.fromkeys(e.get("pid") for e in events if e.kind == "received"))


def pid_gone(pid: str) -> bool:
    """Is process ``pid`` gone (or a zombie)?"""
    from lab.workers import pid_alive

    return not pid.isdigit() or not pid_alive(int(pid))


# ---- the by-hand result backend ---------------------------------------------------------------------------------


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def backend_command(action: str) -> str:
    return f".venv/bin/python -m lab.hand backend {action}"


def stop_command(pid: str) -> str:
    return f".venv/bin/python -m lab.hand stop-worker {pid}"


def _descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (its pool processes, its beat), read off ``/proc``."""
    from lab.workers import _after_comm  # pyright: ignore[reportPrivateUsage]

    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(_after_comm(f.read())[1]), []).append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    found: list[int] = []
    todo = [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def stop_worker(pid: int, grace: float = STOP_GRACE_SECONDS) -> int:
    """``stop-worker``: SIGTERM, then SIGKILL to what is left at the grace's end (see the module docstring)."""
    import time

    from lab.waiting import wait_until
    from lab.workers import pid_alive

    if "celery" not in _cmdline(pid) or " worker" not in _cmdline(pid):
        print(f"error: process {pid} is not a celery worker", file=sys.stderr)
        return 2
    under = _descendants(pid)
    sent = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    print(f"SIGTERM sent to worker {pid}; SIGKILL to what is left of it in {grace:.0f}s if it has not exited by then",
          flush=True)
    if wait_until(lambda: not pid_alive(pid), grace, interval=0.05):
        print(f"worker {pid} exited by itself {time.monotonic() - sent:.1f}s after its SIGTERM", flush=True)
        return 0
    left = [p for p in [pid, *under, *_descendants(pid)] if pid_alive(p)]
    for p in dict.fromkeys(left):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    print(f"worker {pid} still ran {grace:.0f}s after its SIGTERM (Celery's cold shutdown can hang: see lab/hand.py): "
          f"SIGKILL to it and {len(left) - 1} process(es) under it, as Kubernetes does at the grace's end; the broker "
          "returns what it held unacknowledged", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m lab.hand backend start|stop``: the by-hand result backend; ``python -m lab.hand stop-worker <pid>``:
    a worker stopped as a deploy does (see the module docstring)."""
    import argparse

    from lab.owned import OwnedRedis, StartFailed

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["stop-worker"]:
        w = argparse.ArgumentParser(prog="python -m lab.hand stop-worker", description=stop_worker.__doc__)
        w.add_argument("pid", type=int)
        return stop_worker(int(w.parse_args(argv[1:]).pid))
    p = argparse.ArgumentParser(prog="python -m lab.hand", description=main.__doc__)
    p.add_argument("service", choices=["backend"])
    p.add_argument("action", choices=["start", "stop"])
    args = p.parse_args(argv)
    server = OwnedRedis(HAND_BACKEND)
    if args.action == "start":
        if server.answers():
            print(f"the by-hand result backend already answers at {server.url}")
            return 0
        try:
            server.start()
        except (StartFailed, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(f"the by-hand result backend answers at {server.url} (its data in {server.folder})", flush=True)
        return 0
    pidfile = server.folder / "pid"
    pid = int(pidfile.read_text()) if pidfile.exists() and pidfile.read_text().isdigit() else None
    if pid is None or f"127.0.0.1:{server.port}" not in _cmdline(pid):
        pidfile.unlink(missing_ok=True)
        print(f"the by-hand result backend at {server.url} is not running")
        return 0
    os.kill(pid, signal.SIGTERM)  # Redis writes what it must and exits; the data stays for the next start
    from lab.waiting import wait_until

    if not wait_until(lambda: f"127.0.0.1:{server.port}" not in _cmdline(pid), 10.0, interval=0.05):
        os.kill(pid, signal.SIGKILL)
    pidfile.unlink(missing_ok=True)
    print(f"the by-hand result backend at {server.url} stopped", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
