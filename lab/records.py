"""What a run of the lab records, apart from what runs it: the vocabulary the harness, the display,
the metrics and the case studies share.

- ``Observations`` (with ``Outcome`` and ``SideRun``): what one scenario's run saw, as the runner
  (``lab.runner``) or a case study's own scenario returns it;
- ``Check``, and ``Collector`` that builds one: a guarantee or symptom, held or not, with what was seen;
- ``RunReport``: one cell of the matrix (a program, a scenario, a kind of run) with its checks, its
  observations, its log and its verdict; ``MatrixRow`` and ``matrix`` group them per FM;
- ``Kind``, ``Stage``, ``OnStage``; ``HarnessError`` (the user must fix something: exit 2) and
  ``RunBroken`` (a run cannot go on).

It imports nothing that runs anything (no harness, runner or display), so every one of those can
import it without a circle.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal, cast

from celery.result import AsyncResult
from celery.states import READY_STATES

from lab.observe import Event, short_doc
from shared.envelope import Result

Kind = Literal["fixed", "broken", "weak", "bug"]
Stage = Literal["resetting", "starting the worker", "waiting for the worker", "running the scenario",
                "stopping the worker", "checking", "cleaning up"]
OnStage = Callable[[Stage], None]
"""Told each stage of a run as it begins (``print`` will do; ``lab.show.progress`` draws it)."""


class HarnessError(Exception):
    """Something the user must fix (exit 2), said without a traceback."""


class RunBroken(Exception):
    """The run cannot go on: its worker died or a service stopped answering."""


@dataclass(frozen=True)
class Check:
    label: str  # "G3", "S2", ...
    ok: bool
    detail: str  # what was observed (and, on failure, what was expected)


class Collector:
    """What a check saw, and what it wanted where the two differ: one ``Check`` in the end."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.problems: list[str] = []
        self.seen: list[str] = []

    def expect(self, cond: bool, seen: str, wanted: str = "") -> None:
        self.seen.append(seen)
        if not cond:
            self.problems.append(f"{seen} (expected {wanted})" if wanted else seen)

    def result(self) -> Check:
        return Check(self.label, not self.problems, "; ".join(self.problems or self.seen))


@dataclass(frozen=True)
class Outcome:
    """How one ``notify`` (chord body or duplicate) ended."""

    state: str  # Celery state: SUCCESS, FAILURE, PENDING (never finished) ...
    envelope: Result[Any] | None  # the value, when it is a Result envelope
    error_type: str | None  # the exception class, when the state is FAILURE
    error: str | None

    @staticmethod
    def of(res: AsyncResult[Any]) -> Outcome:
        state = str(res.state)
        if not res.ready():
            return Outcome(state, None, None, None)
        return Outcome._ended(state, cast(object, res.result))

    @staticmethod
    def of_meta(meta: Mapping[str, Any]) -> Outcome:
        """The outcome a stored meta (``status``, ``result`` decoded by the backend) says, as ``of`` reads it."""
        state = str(meta["status"])
        if state not in READY_STATES:
            return Outcome(state, None, None, None)
        return Outcome._ended(state, cast(object, meta.get("result")))

    @staticmethod
    def _ended(state: str, value: object) -> Outcome:
        if state == "SUCCESS":
            try:
                return Outcome(state, Result.from_wire(value), None, None)
            except ValueError:
                return Outcome(state, None, None, repr(value))
        if isinstance(value, BaseException):
            return Outcome(state, None, type(value).__name__, str(value))
        return Outcome(state, None, None, repr(value))


def summary_of(chord_outcome: Outcome) -> Mapping[str, Any] | None:
    """The body's summary (``lab.pipeline.Summary``) when the chord ended in a SUCCESS envelope."""
    env = chord_outcome.envelope
    return cast(Mapping[str, Any], env.payload) if env is not None and env.ok and env.payload else None


def failed_in(chord_outcome: Outcome, doc: str) -> Mapping[str, Any] | None:
    """What the body's summary says of ``doc``'s failure, if it failed."""
    summary = summary_of(chord_outcome)
    for f in cast(list[Mapping[str, Any]], summary.get("failed", []) if summary else []):
        if short_doc(str(f.get("doc"))) == doc:
            return f
    return None


@dataclass(frozen=True)
class SideRun:
    """What one side chord (``lab.scenarios.Side``) did: its own pipeline ``<run_id>-<tag>``."""

    tag: str
    run_id: str
    docs: tuple[str, ...]
    submitted: bool
    chord: Outcome
    members: Mapping[str, Outcome]  # each document's chord member (its parse)
    heads: Mapping[str, str]  # the Celery state of each document's fetch (the chain's head)
    attempts: Mapping[str, int]
    fetch_attempts: Mapping[str, int]
    events: tuple[Event, ...]
    emails: tuple[str, ...]
    claim: str | None  # the notify claim's value at the end (once a program claims it), None when there is none or it was released

    def failed(self, doc: str) -> Mapping[str, Any] | None:
        return failed_in(self.chord, doc)


@dataclass(frozen=True)
class Observations:
    fm: str
    run_id: str
    scenario: int
    docs: tuple[str, ...]
    attempts: Mapping[str, int]  # parse_document attempts per document
    fetch_attempts: Mapping[str, int]  # fetch_document attempts per document
    events: tuple[Event, ...]
    notify_runs: Mapping[str, int]  # role ("chord", "duplicate") -> executions
    emails: tuple[str, ...]  # delivered by the mail stand-in
    mail_calls: int  # calls of the mail stand-in (a deduplicated call delivers nothing)
    chord: Outcome
    duplicate: Outcome | None
    dlq_depth: int | None  # messages left in the DLQ, when the FM has one
    probe_seconds: float | None  # round trip of a probe task after the run
    burst_probe: tuple[float, float | None] | None  # a probe sent while the burst waited: (sent, back) wall times
    stopped_by: str  # "chord finished", a symptom's name, or "deadline"
    submitted_at: float
    elapsed: float
    members: Mapping[str, Outcome] = field(default_factory=lambda: {})  # each document's chord member, at the end
    sides: Mapping[str, SideRun] = field(default_factory=lambda: {})
    parked: int | None = None  # messages in the DLQ's parking queue, when the FM has one

    def summary(self) -> Mapping[str, Any] | None:
        return summary_of(self.chord)

    def failed(self, doc: str) -> Mapping[str, Any] | None:
        return self._failed_by_doc.get(doc)

    def ok_docs(self) -> list[str]:
        return list(self._ok_docs)

    def is_ok(self, doc: str) -> bool:
        """``doc in ok_docs()``, at the cost of one look (a timeline asks it of every document)."""
        return doc in self._ok_set

    # Indexes of the summary, built once per Observations (it is frozen, so they never go stale): a
    # 3,000-document timeline asked ok_docs() of every document, 9 million short_doc calls (issue 26).
    @cached_property
    def _ok_docs(self) -> tuple[str, ...]:
        summary = self.summary()
        return tuple(short_doc(str(d)) for d in cast(list[object], summary.get("ok", []))) if summary else ()

    @cached_property
    def _ok_set(self) -> frozenset[str]:
        return frozenset(self._ok_docs)

    @cached_property
    def _failed_by_doc(self) -> Mapping[str, Mapping[str, Any]]:
        summary = self.summary()
        failed = cast(list[Mapping[str, Any]], summary.get("failed", []) if summary else [])
        found: dict[str, Mapping[str, Any]] = {}
        for f in failed:
            found.setdefault(short_doc(str(f.get("doc"))), f)  # the first, as failed_in finds it
        return found

    def attempt_times(self, doc: str) -> list[float]:
        return list(self._starts_by_doc.get(doc, ()))

    @cached_property
    def _starts_by_doc(self) -> Mapping[str, list[float]]:
        """``attempt_starts`` of every document, in one pass (the checks ask it of every document)."""
        found: dict[str, list[float]] = {}
        for e in self.events:
            if e.kind == "attempt_start":
                found.setdefault(e.get("doc"), []).append(e.t)
        return found


@dataclass
class RunReport:
    fm: str  # the FM this cell belongs to (for a broken run: the later FM)
    kind: Kind
    code: str  # the FM whose code ran
    scenario: int
    checks: list[Check] = field(default_factory=lambda: [])
    observations: Observations | None = None
    error: str | None = None
    log: Path | None = None
    seconds: float = 0.0
    drain_last_run: float | None = None  # when the program's DLQ drain last ran (wall time), if it has one
    exposition: str | None = None  # a case study's own Prometheus metrics of the run, as scraped
    skipped: str | None = None  # why this machine cannot run it (a scenario that needs a redis-server of its own, none installed): not a failure
    body: str = "notify"  # the chord body's task name, short (a case study's own: reconcile, aggregate_batch ...)

    @property
    def ok(self) -> bool:
        if self.skipped is not None:
            return self.error is None
        return self.error is None and bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def verdict(self) -> str:
        if self.error is not None:
            return "ERROR"
        if self.skipped is not None:
            return "SKIPPED"
        if self.kind == "fixed":
            return "PASS" if self.ok else "FAIL"
        if self.kind == "bug":
            return "BUG REPRODUCED" if self.ok else "BUG NOT REPRODUCED"
        return "REPRODUCED" if self.ok else "NOT REPRODUCED"


@dataclass(frozen=True)
class MatrixRow:
    fm: str
    fixed: RunReport | None  # the fixed run (the naive program: its bug run)
    broken: RunReport | None
    weak: RunReport | None = None  # the hard variant on the FM without its hard fix


def matrix(reports: list[RunReport]) -> list[MatrixRow]:
    """One row per FM, in the order the runs came, with its fixed and broken cells."""
    cells: dict[str, dict[str, RunReport]] = {}
    for r in reports:
        cells.setdefault(r.fm, {})[r.kind] = r
    return [MatrixRow(fm, c.get("fixed") or c.get("bug"), c.get("broken"), c.get("weak")) for fm, c in cells.items()]
