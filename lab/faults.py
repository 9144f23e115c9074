"""Fault sentinels, and ``lab_fault``: the lab's one line in every ``parse_document``.

A scenario maps documents to faults; the fault travels with the work itself, in
the document's text (a first line ``x-lab-fault: POISON``, written by the runner
into the lab's document store), so the same task code meets every fault
unchanged and no task signature carries the lab. On the wire a fault is a short
string: ``FAIL``, ``CRASH_ONCE``, ``POISON``, ``FLAKY:2``, ``FLAKE_FOREVER``,
``SOFT_HANG``, ``HARD_HANG``.

``lab_fault(task, document)`` reads the sentinel and misbehaves as it says, on
the attempt the observer counted (``lab.observe.current_attempt``).

Limits: ``CRASH_ONCE`` and ``POISON`` SIGKILL the current process, which under
the prefork pool is one pool child. Under ``--pool solo`` they would kill the
worker itself; the lab always runs prefork.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from celery import Task
from celery.exceptions import SoftTimeLimitExceeded

from lab.observe import current_attempt, short_doc
from shared.retry import TransientError

Kind = Literal["FAIL", "CRASH_ONCE", "POISON", "FLAKY", "FLAKE_FOREVER", "SOFT_HANG", "HARD_HANG"]
KINDS: tuple[Kind, ...] = ("FAIL", "CRASH_ONCE", "POISON", "FLAKY", "FLAKE_FOREVER", "SOFT_HANG", "HARD_HANG")

SOFT_HANG_SECONDS = 2.0
"""How long ``SOFT_HANG`` sleeps when nothing interrupts it (well past fm6's soft limit)."""
CRASH_AFTER_SECONDS = 0.1
"""How long ``CRASH_ONCE``/``POISON`` work before the kill: the crash comes mid-task."""
HARD_HANG_CAP_SECONDS = 60.0
"""``HARD_HANG`` gives up after this long, so a forgotten worker does not hang for ever."""


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
FLAKE_FOREVER = Fault("FLAKE_FOREVER")
SOFT_HANG = Fault("SOFT_HANG")
HARD_HANG = Fault("HARD_HANG")


def FLAKY(times: int) -> Fault:  # noqa: N802 - reads like the other sentinels
    return Fault("FLAKY", times)


def inject(fault: Fault | None, attempt: int, *, doc: str = "") -> None:
    """Misbehave as ``fault`` says on this (1-based) ``attempt``; return when it is over."""
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
        case "SOFT_HANG":
            time.sleep(SOFT_HANG_SECONDS)  # a soft time limit interrupts this sleep
        case "HARD_HANG":
            _hang_ignoring_soft_limit()


def _sigkill_self(after: float) -> None:
    time.sleep(after)  # the work done before the crash
    os.kill(os.getpid(), signal.SIGKILL)


def _hang_ignoring_soft_limit() -> None:
    deadline = time.monotonic() + HARD_HANG_CAP_SECONDS
    while (left := deadline - time.monotonic()) > 0:
        try:
            time.sleep(left)
        except SoftTimeLimitExceeded:
            continue  # the badly behaved code this fault stands for swallows it
    raise RuntimeError(f"HARD_HANG gave up after {HARD_HANG_CAP_SECONDS:.0f}s")


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
    inject(fault_in(str(document.get("text", ""))), current_attempt(task.request.id), doc=short_doc(str(document.get("doc", ""))))
