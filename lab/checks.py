"""What every lesson's checks are made of (DESIGN.md §2): the readings of ``Observations`` several lessons share
(a ``Check`` and the ``Collector`` that builds one are run records: ``lab.records``).

Each lesson's guarantee, symptom and hard-variant symptom are named predicates in its folder
(``lessons/<lesson>/checks.py``); the registry (``lessons``) says which run checks which. Every check is exact
where the behaviour is exact and names the observed numbers when it fails.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import cast

from lab.fm import Fm
from lab.observe import Event, Reader
from lab.records import Collector, Observations, SideRun


def side_of(c: Collector, obs: Observations, tag: str) -> SideRun | None:
    """The run's side chord ``tag``; a check that needs it fails when it is missing."""
    side = obs.sides.get(tag)
    if side is None:
        c.expect(False, f"no side chord '{tag}'", "one")
    return side


def failed_detail(obs: Observations, doc: str) -> tuple[str, str]:
    f = obs.failed(doc)
    return (str(f.get("reason")), str(f.get("error"))) if f else ("", "")


def side_done(side: SideRun) -> bool:
    env = side.chord.envelope
    return side.chord.state == "SUCCESS" and env is not None and env.ok


def side_state(side: SideRun) -> str:
    env = side.chord.envelope
    return f"{side.chord.state}" + (f" envelope {env.status}" if env is not None else f" {side.chord.error_type or ''}".rstrip())


def dead_letter_error(task: str, bound: int) -> str:
    """What the drain writes for a poison message (every delivery started its body)."""
    return f"{task} dead-lettered by the broker (delivery_limit) after {bound} deliveries, {bound} started"


def overlaps(events: Sequence[Event]) -> list[str]:
    """Documents whose attempt began while the one before still ran: it had not ended, and the worker
    that ran it (its main process, from ``received``) had not been stopped by a deploy before."""
    gone: dict[str, float] = {}  # worker main pid -> when a deploy saw it exit or killed it
    pids = {e.get("n"): e.get("old_pid") for e in events if e.kind == "deploy_term"}
    for e in events:
        if e.kind in ("deploy_exit", "deploy_kill"):
            gone[pids.get(e.get("n"), "")] = e.t
    holder: dict[str, str] = {}  # task id -> pid of the worker that received it last
    running: dict[str, tuple[str, float, str]] = {}  # doc -> (attempt, start, holder) of its latest attempt
    ended: set[tuple[str, str]] = set()
    found: list[str] = []
    for e in events:
        doc, task = e.get("doc"), e.get("task")
        if e.kind == "received":
            holder[task] = e.get("pid")
        elif e.kind == "attempt_end":
            ended.add((doc, e.get("attempt")))
        elif e.kind == "attempt_start":
            before = running.get(doc)
            if before is not None and (doc, before[0]) not in ended and gone.get(before[2], e.t + 1) > e.t:
                found.append(f"{doc} attempt {e.get('attempt')} began {e.t - before[1]:.2f}s after attempt {before[0]}, "
                             "which still ran")
            running[doc] = (e.get("attempt"), e.t, holder.get(task, ""))
    return found


def summary_of_side(side: SideRun) -> Mapping[str, list[object]]:
    """The side chord's body summary (``ok``, ``failed``) when it ended in a SUCCESS envelope, else empty."""
    env = side.chord.envelope
    payload = cast(object, env.payload if env is not None and env.ok else None)
    return cast(Mapping[str, list[object]], payload) if isinstance(payload, Mapping) else {}


def chord_error(c: Collector, obs: Observations, must_name: str) -> None:
    ch = obs.chord
    c.expect(
        ch.state == "FAILURE" and ch.error_type == "ChordError" and must_name in (ch.error or ""),
        f"chord result {ch.state} {ch.error_type}: {ch.error!r}",
        f"FAILURE ChordError naming {must_name}",
    )


def notify_never(c: Collector, obs: Observations) -> None:
    runs = obs.notify_runs.get("chord", 0)
    c.expect(runs == 0, f"notify ran {runs}x", "0")


def delivery_bound(fixed: Fm) -> int:
    """The deliveries before the broker dead-letters a message of ``fixed``'s (0: it has no bound)."""
    return fixed.delivery_bound or 0


def outlived(r: Reader, doc: str, seconds: float, kind: str = "attempt_start") -> bool:
    """``doc``'s first ``kind`` event (an attempt's start) is more than ``seconds`` (and half a second) ago."""
    starts = [e.t for e in r.events() if e.kind == kind and e.get("doc") == doc]
    return bool(starts) and time.time() - starts[0] > seconds + 0.5
