"""What FM-4's lesson adds to the scenarios: a second ``notify`` for the same pipeline, and its owner killed twice.

The interleaving is made deterministic with a gate: every ``notify`` that reaches "send" waits until the
runner opens it (``lab.pipeline.send_email``); ``DuplicateNotify`` fires the duplicate ``notify`` only when the
chord's own ``notify`` is waiting, and opens the gate only when the duplicate has met the claim (its first
busy-retry) or, without a claim, reached the gate itself. The hard variant: the first ``notify`` to reach the
mail API is killed after claiming and before sending, the second once the email is out and before it marks
the claim sent (``CRASH_PLAN``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any, cast

from celery.result import AsyncResult

from lab.injector import Injector, RunView
from lab.observe import Reader
from lab.records import Outcome
from lab.scenarios import Part

CRASH_PLAN: tuple[str, ...] = ("before_send", "after_send")
"""Where the first two ``notify`` deliveries that reach the mail API are killed."""


class DuplicateNotify(Injector):
    """Re-fires ``notify`` for the same pipeline while the chord's own holds the claim, as an operator (or a
    redelivery) would; the run's ``Observations.duplicate`` is how it ended."""

    def __init__(self) -> None:
        self.duplicate: AsyncResult[Any] | None = None
        self.gate_opened = False

    def start(self, run: RunView) -> None:
        run.reader.rec.put("gated", "1")
        for crash in CRASH_PLAN:
            run.reader.rec.append("crash_plan", crash)

    def step(self, run: RunView) -> None:
        reader, chord = run.reader, run.chord
        if chord is None:
            return
        if self.duplicate is None and reader.has_event("gate_wait", role="chord"):
            self.duplicate = _fire(run, chord)
        elif self.duplicate is not None and not self.gate_opened and _met_claim(reader):
            reader.rec.open_gate()
            self.gate_opened = True

    def busy(self, run: RunView) -> bool:
        """A chord that succeeded went through the gate, so a duplicate was fired: wait for it (a failed chord
        never reaches the gate, and no duplicate comes)."""
        chord = run.chord
        succeeded = chord is not None and chord.ready() and chord.state == "SUCCESS"
        return succeeded and (self.duplicate is None or not self.duplicate.ready())

    def observed(self) -> Mapping[str, object]:
        return {"duplicate": Outcome.of(self.duplicate)} if self.duplicate is not None else {}


def _fire(run: RunView, chord: AsyncResult[Any]) -> AsyncResult[Any]:
    header = cast(Any, chord.parent)  # the chord's header GroupResult
    members = cast("list[AsyncResult[Any]]", header.results if header is not None else [])
    results = [cast(object, r.result) for r in members]
    task_id = str(uuid.uuid4())
    run.reader.rec.put("duplicate", task_id)  # so the reader tells its events from the chord's notify
    return run.fm.notify.apply_async(args=(results, run.run_id), task_id=task_id)


def _met_claim(reader: Reader) -> bool:
    """The duplicate reached the gate (no claim) or was turned away busy by the claim (its first retry)."""
    return reader.has_event("gate_wait", role="duplicate") or reader.has_event("notify_retry", role="duplicate")


PART = Part(injectors={"duplicate notify": DuplicateNotify})
