"""Case study 2 end to end, through the harness, on the real Redis as broker and backend:
every cell of its matrix with its exact checks; and the dead-letter store's own promises,
on the real Redis, one by one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from case_studies.bl_ingestion import study
from case_studies.bl_ingestion.dead_letters import DeadLetters
from lab import records
from lab.records import RunReport
from tests.cells import passing
from lab.observe import client
from lab.settings import NAMESPACE

pytestmark = pytest.mark.usefixtures("real_services")


def cell(name: str, kind: records.Kind) -> RunReport:
    return passing(f"bl_ingestion/{name}", kind)


@pytest.mark.parametrize("name", list(study.SCENARIOS))
def test_each_scenario_holds_on_the_fixed_program_and_shows_its_symptom_on_the_writeup(name: str) -> None:
    fixed, writeup = cell(name, "fixed"), cell(name, "broken")
    number = study.SCENARIOS[name].number
    assert [c.label for c in fixed.checks] == ["BL1", "BL2", "BL3", f"BL{3 + number}"]
    assert [c.label for c in writeup.checks] == [f"BL{3 + number} write-up"] and writeup.code == "blw"


def test_the_writeups_scale_is_only_for_its_own_worker() -> None:
    import os

    before = os.environ.get("BULK_VISIBILITY_TIMEOUT")
    with study.writeup_scale():
        assert os.environ["BULK_VISIBILITY_TIMEOUT"] == "1"
    assert os.environ.get("BULK_VISIBILITY_TIMEOUT") == before


# ---- DeadLetters, on the real Redis ------------------------------------------------


@pytest.fixture
def letters() -> Iterator[DeadLetters]:
    store = DeadLetters(client(), f"{NAMESPACE}:bltest:")
    yield store
    r: Any = client()
    r.delete(store.list, store.processing, store.since, store.index)


def test_a_key_is_dead_lettered_once_until_it_is_replayed(letters: DeadLetters) -> None:
    assert letters.put("k1", {"unit": 1}) and not letters.put("k1", {"unit": 1, "again": True})
    assert letters.depth() == 1
    item = letters.take()
    assert item is not None and json.loads(item) == {"unit": 1, "key": "k1"}
    assert letters.depth() == 0 and letters.in_processing() == 1
    assert letters.done(item) and letters.in_processing() == 0
    assert letters.put("k1", {"unit": 1})  # replayed: the same unit may be dead-lettered again


def test_take_is_oldest_first_and_never_leaves_a_record_in_neither_list(letters: DeadLetters) -> None:
    for n in range(3):
        letters.put(f"k{n}", {"n": n})
    first = letters.take()
    assert first is not None and json.loads(first)["n"] == 0
    assert letters.depth() + letters.in_processing() == 3


def test_a_dead_replayers_record_goes_back_once_stale_and_only_then(letters: DeadLetters) -> None:
    letters.put("k1", {"n": 1})
    letters.put("k2", {"n": 2})
    taken = letters.take()  # the replayer dies here: no done()
    assert taken is not None
    assert letters.reap(stale_after=60) == 0 and letters.in_processing() == 1  # not stale yet
    assert letters.reap(stale_after=0) == 1
    assert letters.in_processing() == 0 and letters.depth() == 2
    records = [r["n"] for r in letters.records()]
    assert sorted(records) == [1, 2]
    again = letters.take()  # the returned record is taken next: it went to the front of the line
    assert again is not None and json.loads(again)["n"] == 1
