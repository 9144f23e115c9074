"""Fault sentinels, and ``lab_fault``: the lab's one line in every ``parse_document``.

A scenario maps documents to faults; the fault travels with the work itself, in
the document's text (a first line ``x-lab-fault: POISON``, written by the runner
into the lab's document store), so the same task code meets every fault
unchanged and no task signature carries the lab. On the wire a fault is a short
string: ``FAIL``, ``CRASH_ONCE``, ``POISON``, ``FETCH_POISON``, ``FLAKY:2``,
``FLAKE_FOREVER``, ``THROTTLED``, ``SOFT_HANG``, ``HARD_HANG``, ``SWALLOW_HANG``,
``C_HANG``, ``LATE_FINISH``, ``STALL_PAST_LIMIT``, ``FETCH_HANG``, ``SLOW``, ``SLOW_UNTIL_RELEASED``, ``HOLD_AFTER_STORE``. ``THROTTLED`` is a 429 with ``Retry-After`` on the first attempt
(``TransientError(retry_after=THROTTLE_SECONDS)``), then success: a burst of
them is a burst of waiting retries.

``lab_fault(task, document)`` reads the sentinel and misbehaves as it says, on
the attempt the observer counted (``lab.observe.current_attempt``).
``FETCH_POISON`` is the one fault of the fetch, not of the parse: the document
store stand-in (``lab.pipeline.fetch_text``) calls ``fetch_fault`` on the text it
read, so the chain's *head* dies, before ``parse_document`` exists for it.

The hangs, from polite to hopeless:

- ``SOFT_HANG`` sleeps; Celery's ``SoftTimeLimitExceeded`` ends it;
- ``HARD_HANG`` sleeps and swallows ``SoftTimeLimitExceeded``, nothing else;
- ``SWALLOW_HANG`` sleeps inside ``except Exception: continue``, the broad
  handler found in real code: it swallows every ``Exception`` raised into it;
- ``C_HANG`` blocks in one C call that never returns to the interpreter, so no
  Python signal handler runs until it ends (after ``HARD_HANG_CAP_SECONDS``); only
  killing the process stops it. The call is a second lock of a mutex the thread
  already holds, with a deadline (glibc's ``pthread_mutex_timedlock``, which a
  signal does not interrupt: POSIX forbids it EINTR): a C library stuck on a lock.
  It waits without using the CPU; where libc lacks that function (macOS) it spins
  in ``sum(range(n))`` instead, as a C computation that never ends would;
- ``FETCH_HANG`` is ``HARD_HANG`` in the fetch, the chain's head.

Outside the body (``lab.backend``): ``LATE_FINISH`` works 0.7 s, ends inside the time limits lesson's
soft deadline, and then the result store stalls for 1 s, as a slow Redis (a large
result, a snapshot's fork, a network hiccup) would; ``STALL_PAST_LIMIT`` stalls past
``time_limit``. A Celery limit that fires then lands outside the body.

``HOLD_AFTER_STORE``: a healthy parse whose member the lab's backend holds once after its result is stored and
before its chord counts it, until an injector has acted on it (``lab.backend``).
``SLOW`` is no fault at all: a healthy document that takes ``SLOW_SECONDS`` to parse, under
the time limits' soft deadline (the rolling deploys' lesson meets it running and waiting prefetched).
``SLOW_UNTIL_RELEASED`` is ``SLOW`` until an injector has done what the slow work was there for and says so
(``release(run_id)``, a key in the lab's Redis): the run's parses begun after that are quick, so the side's
chord ends soon after its last fault instead of working through the rest of its documents.

Limits: ``CRASH_ONCE``, ``POISON`` and ``FETCH_POISON`` SIGKILL the current process, which under
the prefork pool is one pool child. Under ``--pool solo`` they would kill the
worker itself; the lab always runs prefork.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, get_args

import redis
from celery import Task
from celery.exceptions import SoftTimeLimitExceeded

from lab.observe import TTL_SECONDS, client, current_attempt, run_prefix, split_doc_id
from shared.retry import TransientError

Kind = Literal["FAIL", "CRASH_ONCE", "POISON", "FETCH_POISON", "FLAKY", "FLAKE_FOREVER", "THROTTLED", "SOFT_HANG",
               "HARD_HANG", "SWALLOW_HANG", "C_HANG", "LATE_FINISH", "STALL_PAST_LIMIT", "FETCH_HANG", "SLOW",
               "SLOW_UNTIL_RELEASED", "HOLD_AFTER_STORE"]
KINDS: tuple[Kind, ...] = get_args(Kind)

SOFT_HANG_SECONDS = 2.0
"""How long ``SOFT_HANG`` sleeps when nothing interrupts it (well past the time limits' soft limit)."""
CRASH_AFTER_SECONDS = 0.1
"""How long ``CRASH_ONCE``/``POISON`` work before the kill: the crash comes mid-task."""
HARD_HANG_CAP_SECONDS = 60.0
"""``HARD_HANG`` and ``SWALLOW_HANG`` give up after this long, so a forgotten worker does not hang for ever."""
THROTTLE_SECONDS = 1.5
"""``THROTTLED``: the ``Retry-After`` of its 429, which the retry honours."""
C_HANG_ITERATIONS = 5 * 10**9
"""Where libc has no ``pthread_mutex_timedlock``, ``C_HANG`` sums this many integers in one C call: about a
minute of CPU on the lab's machine."""
LATE_FINISH_SECONDS = 0.7
"""``LATE_FINISH`` and ``STALL_PAST_LIMIT``: how long the body works before it returns (under the time limits'
soft deadline of 1 s)."""
SLOW_SECONDS = 0.8
"""``SLOW``: how long a slow but healthy document's parse works (under the time limits' soft deadline of 1 s, longer
than a rolling deploy's grace period, its lesson's ``GRACE_SECONDS``)."""
STORE_STALLS: dict[str, float] = {"LATE_FINISH": 1.0, "STALL_PAST_LIMIT": 6.0}
"""How long the result store stalls, once, after such a body returned (``lab.backend``): past the time limits'
soft deadline (1 s after the start), and past its ``time_limit`` (3 s)."""


class PermanentError(Exception):
    """A document that can never be parsed (``FAIL``)."""


@dataclass(frozen=True)
class Fault:
    kind: Kind
    times: int = 0  # FLAKY only: how many attempts fail before one succeeds

    def to_wire(self) -> str:
        return f"{self.kind}:{self.times}" if self.kind == "FLAKY" else self.kind

    @staticmethod
    def from_wire(text: str) -> Fault:
        kind, _, times = text.partition(":")
        for known in KINDS:
            if kind == known:
                if known == "FLAKY":
                    if not times.isdigit() or int(times) < 1:
                        raise ValueError(f"FLAKY needs a positive count: {text!r}")
                    return Fault("FLAKY", int(times))
                if times:
                    raise ValueError(f"{kind} takes no count: {text!r}")
                return Fault(known)
        raise ValueError(f"unknown fault {text!r}; known: {', '.join(KINDS)}")


FAIL = Fault("FAIL")
CRASH_ONCE = Fault("CRASH_ONCE")
POISON = Fault("POISON")
FETCH_POISON = Fault("FETCH_POISON")
FETCH_HANG = Fault("FETCH_HANG")
LATE_FINISH = Fault("LATE_FINISH")
STALL_PAST_LIMIT = Fault("STALL_PAST_LIMIT")
FLAKE_FOREVER = Fault("FLAKE_FOREVER")
THROTTLED = Fault("THROTTLED")
SOFT_HANG = Fault("SOFT_HANG")
HARD_HANG = Fault("HARD_HANG")
SWALLOW_HANG = Fault("SWALLOW_HANG")
C_HANG = Fault("C_HANG")
SLOW = Fault("SLOW")
SLOW_UNTIL_RELEASED = Fault("SLOW_UNTIL_RELEASED")
HOLD_AFTER_STORE = Fault("HOLD_AFTER_STORE")


def FLAKY(times: int) -> Fault:  # noqa: N802 - reads like the other sentinels
    return Fault("FLAKY", times)


def inject(fault: Fault | None, attempt: int, *, doc: str = "", run: str = "") -> None:
    """Misbehave as ``fault`` says on this (1-based) ``attempt`` of ``doc`` in run ``run``; return when it is over."""
    if fault is None:
        return
    match fault.kind:
        case "FAIL":
            raise PermanentError(f"{doc or 'document'} is malformed")
        case "CRASH_ONCE":
            if attempt == 1:
                _sigkill_self(CRASH_AFTER_SECONDS)
        case "POISON":
            _sigkill_self(CRASH_AFTER_SECONDS)
        case "FLAKY":
            if attempt <= fault.times:
                raise TransientError(f"503 from the parser service (attempt {attempt})")
        case "FLAKE_FOREVER":
            raise TransientError(f"503 from the parser service (attempt {attempt})")
        case "THROTTLED":
            if attempt == 1:
                raise TransientError(f"429 from the parser service, Retry-After {THROTTLE_SECONDS}s", THROTTLE_SECONDS)
        case "SOFT_HANG":
            time.sleep(SOFT_HANG_SECONDS)  # a soft time limit interrupts this sleep
        case "HARD_HANG":
            _hang_swallowing(SoftTimeLimitExceeded)
        case "SWALLOW_HANG":
            _hang_swallowing(Exception)
        case "C_HANG":
            _hang_in_one_c_call(HARD_HANG_CAP_SECONDS)  # no bytecode boundary for a signal handler to run at
        case "LATE_FINISH" | "STALL_PAST_LIMIT":
            time.sleep(LATE_FINISH_SECONDS)  # the work, ending inside the deadline; the store then stalls (lab.backend)
        case "SLOW":
            time.sleep(SLOW_SECONDS)  # the work of a big but healthy document
        case "SLOW_UNTIL_RELEASED":
            if not released(run):
                time.sleep(SLOW_SECONDS)  # as SLOW, while the injector still needs slow work
        case "FETCH_POISON" | "FETCH_HANG":
            pass  # the fetch's faults (fetch_fault); a parse never meets them
        case "HOLD_AFTER_STORE":
            pass  # a healthy body: the fault is outside it, between the store and the count (lab.backend)


def _sigkill_self(after: float) -> None:
    time.sleep(after)  # the work done before the crash
    kill_self()


def kill_self() -> NoReturn:
    """SIGKILL this process: no handler, no ``finally``, no ack (a pool child dies)."""
    os.kill(os.getpid(), signal.SIGKILL)
    raise AssertionError("unreachable: SIGKILL is not delivered late")


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _hang_in_one_c_call(seconds: float) -> None:
    """Block ``seconds`` in one C call: lock a mutex this thread already holds, with a deadline.

    A signal's C handler runs (CPython's only notes it); the call then waits on, and the Python handler runs when
    it returns. A 2 s call measured on glibc 2.36: SIGUSR1 and SIGALRM sent at 0.3 s and 0.5 s ran their Python
    handlers at 2.0 s, after 0.02 s of CPU."""
    libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(libc, "pthread_mutex_timedlock"):
        sum(range(C_HANG_ITERATIONS))  # no timed lock (macOS): spin in one C call instead
        return
    mutex = ctypes.create_string_buffer(64)  # zeroed: glibc's default mutex, unlocked (40 bytes on x86-64)
    if libc.pthread_mutex_lock(mutex) != 0:
        raise OSError(ctypes.get_errno(), "pthread_mutex_lock")
    deadline = time.time() + seconds  # the timed lock's deadline is on CLOCK_REALTIME
    when = _Timespec(int(deadline), int(deadline % 1 * 1e9))
    libc.pthread_mutex_timedlock(mutex, ctypes.byref(when))  # ETIMEDOUT at the deadline; no signal ends it


def _hang_swallowing(swallowed: type[BaseException]) -> None:
    deadline = time.monotonic() + HARD_HANG_CAP_SECONDS
    while (left := deadline - time.monotonic()) > 0:
        try:
            time.sleep(left)
        except swallowed:
            continue  # the badly behaved code this fault stands for swallows it
    raise RuntimeError(f"the hang gave up after {HARD_HANG_CAP_SECONDS:.0f}s")


def fetch_fault(text: str) -> None:
    """The fetch's faults: ``FETCH_POISON`` kills the process reading this document, every time;
    ``FETCH_HANG`` hangs it, swallowing ``SoftTimeLimitExceeded`` (the chain's head hangs)."""
    fault = fault_in(text)
    if fault is not None and fault.kind == "FETCH_POISON":
        _sigkill_self(CRASH_AFTER_SECONDS)
    if fault is not None and fault.kind == "FETCH_HANG":
        _hang_swallowing(SoftTimeLimitExceeded)


FAULT_LINE = "x-lab-fault: "


def document_text(doc: str, fault: Fault | None) -> str:
    """The text the document store holds for ``doc``: the fault's line, then the words."""
    words = f"the text of {doc}"
    return f"{FAULT_LINE}{fault.to_wire()}\n{words}" if fault is not None else words


def fault_in(text: str) -> Fault | None:
    first, _, _ = text.partition("\n")
    return Fault.from_wire(first[len(FAULT_LINE):]) if first.startswith(FAULT_LINE) else None


def lab_fault(task: Task[Any, Any], document: Mapping[str, Any]) -> None:
    """Do to this attempt what the scenario wrote into the document (nothing for most)."""
    found = split_doc_id(str(document.get("doc", "")))
    run, doc = found if found is not None else ("", str(document.get("doc", "")))
    inject(fault_in(str(document.get("text", ""))), current_attempt(task.request.id), doc=doc, run=run)


def _released_key(run_id: str) -> str:
    return f"{run_prefix(run_id)}slow-released"


def release(run_id: str) -> None:
    """From now on, ``SLOW_UNTIL_RELEASED`` parses of run ``run_id`` are quick."""
    client().set(_released_key(run_id), "1", ex=TTL_SECONDS)


def released(run_id: str) -> bool:
    """Whether run ``run_id``'s slow work was released (never, for a document of no run, or when the lab's
    Redis does not answer: then it stays slow, as ``SLOW``)."""
    if not run_id:
        return False
    try:
        return bool(client().exists(_released_key(run_id)))
    except redis.RedisError:
        return False
