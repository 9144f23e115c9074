"""Scenarios (DESIGN.md §2) and the run context that carries one to the tasks.

Scenario N is cumulative: it holds every fault of scenarios 1..N. The context
travels as the ``ctx`` keyword of every task, so the code under test meets the
fault as it is: an earlier FM's code gets a later scenario with no switch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from shared.faults import CRASH_ONCE, FAIL, FLAKE_FOREVER, FLAKY, HARD_HANG, POISON, SOFT_HANG, Fault

# (document, fault, first scenario that has it)
_TABLE: tuple[tuple[str, Fault | None, int], ...] = (
    ("doc1", FAIL, 1),
    ("doc2", None, 1),
    ("doc3", CRASH_ONCE, 2),
    ("doc4", POISON, 3),
    ("doc5", FLAKY(2), 5),
    ("doc6", FLAKE_FOREVER, 5),
    ("doc7", SOFT_HANG, 6),
    ("doc8", HARD_HANG, 6),
)
DUPLICATE_NOTIFY_FROM = 4
SCENARIOS = range(1, 7)


@dataclass(frozen=True)
class Scenario:
    number: int
    faults: Mapping[str, Fault | None]
    duplicate_notify: bool

    @property
    def docs(self) -> tuple[str, ...]:
        return tuple(self.faults)


def scenario(number: int) -> Scenario:
    if number not in SCENARIOS:
        raise ValueError(f"no scenario {number}; there are {SCENARIOS.start}..{SCENARIOS.stop - 1}")
    faults = {doc: fault for doc, fault, first in _TABLE if first <= number}
    return Scenario(number, faults, number >= DUPLICATE_NOTIFY_FROM)


@dataclass(frozen=True)
class RunContext:
    """What one run tells its tasks: who it is and which faults to inject."""

    run_id: str
    fm: str  # the FM whose code runs: its Redis prefix holds the observations
    scenario: int
    docs: tuple[str, ...] = ()
    faults: Mapping[str, str] = field(default_factory=lambda: {})
    duplicate_notify: bool = False

    @property
    def pipeline_id(self) -> str:
        """The business key of this pipeline (one email per pipeline)."""
        return self.run_id

    def fault_for(self, doc: str) -> Fault | None:
        wire = self.faults.get(doc)
        return Fault.from_wire(wire) if wire else None

    @staticmethod
    def for_scenario(run_id: str, fm: str, sc: Scenario) -> RunContext:
        faults = {doc: f.to_wire() for doc, f in sc.faults.items() if f is not None}
        return RunContext(run_id, fm, sc.number, sc.docs, faults, sc.duplicate_notify)

    def to_wire(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "fm": self.fm,
            "scenario": self.scenario,
            "docs": list(self.docs),
            "faults": dict(self.faults),
            "duplicate_notify": self.duplicate_notify,
        }

    @staticmethod
    def from_wire(raw: object) -> RunContext:
        if not isinstance(raw, Mapping):
            raise ValueError(f"not a run context: {raw!r}")
        data = cast(Mapping[str, Any], raw)
        faults = cast(object, data.get("faults") or {})
        if not isinstance(faults, Mapping):
            raise ValueError(f"faults must be a mapping: {faults!r}")
        return RunContext(
            run_id=str(data["run_id"]),
            fm=str(data["fm"]),
            scenario=int(data["scenario"]),
            docs=tuple(str(d) for d in cast(list[Any], data.get("docs") or [])),
            faults={str(k): str(v) for k, v in cast(Mapping[Any, Any], faults).items()},
            duplicate_notify=bool(data.get("duplicate_notify", False)),
        )
