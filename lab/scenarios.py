"""Scenarios (DESIGN.md §2): which document meets which fault.

Scenario N is cumulative: it holds every fault of scenarios 1..N. The runner
writes each fault into its document's text (``lab.faults.document_text``), so the
code under test meets the fault as it is: an earlier FM's code gets a later
scenario with no switch and no extra argument.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from lab.faults import CRASH_ONCE, FAIL, FLAKE_FOREVER, FLAKY, HARD_HANG, POISON, SOFT_HANG, Fault

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
