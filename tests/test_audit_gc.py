"""The audit reads an app inside a guard that refuses every connection; garbage the caller left (a Celery result
consumer that unsubscribes from Redis when collected) must not be finalized inside it: a full make test once failed
``test_fm0_breaks_every_rule_its_configuration_can`` with ``SystemError: AST constructor recursion depth mismatch``,
CPython 3.11's answer to a finalizer that raised (the guard's refusal) while ``ast.parse`` ran. No broker needed."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from audit import facts


def test_the_callers_garbage_is_collected_before_the_guard_and_none_while_it_holds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    finalized: list[str] = []

    class Cyclic:
        """Freed only by the collector (it refers to itself), like a result consumer held in a cycle."""

        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            finalized.append("finalized")

    seen: dict[str, Any] = {}

    def reading(app: Any, target: str) -> Any:
        seen.update(finalized=list(finalized), collector_on=gc.isenabled())
        return "facts"

    monkeypatch.setattr(facts, "_collect", reading)
    was = gc.isenabled()
    gc.disable()  # so that nothing but the audit collects the cycle before it reads
    try:
        Cyclic()
        assert facts.collect(object(), "proj:app") == "facts"  # type: ignore[arg-type]
    finally:
        if was:
            gc.enable()
    assert seen == {"finalized": ["finalized"], "collector_on": False}
