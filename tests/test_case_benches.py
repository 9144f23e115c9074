"""The case-study benches' accounting (``bench/bench_bl.py``, ``bench/bench_cte.py``): a run counts only when every
item is accounted for by its program's semantics. Checked here on the lab's own 40-consignment manifest and
2,000-event burst: what each write-up program must make of them, that an exact run passes, and that a run one item
off in any list does not (pure: a dict of lists stands in for the Redis lists the programs keep). Then each bench
runs for real at a small size, both programs, in a namespace of its own: every run exact.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from bench.bench_bl import fixed_problem, writeup_expected, writeup_problem
from bench.bench_cte import writeup_expected as cte_writeup_expected
from bench.bench_cte import writeup_problems as cte_writeup_problems
from case_studies.bl_ingestion.manifest import Deviations, Manifest, generate
from case_studies.bl_ingestion.study import DEVIATE_EVERY, MANIFEST_UNITS, SEED, naive_pieces
from case_studies.cte_ingestion import study as cte_study
from lab.fm import ROOT
from tests.namespaces import derived

PREFIX = "bench:"
BATCH = "B1"


class Lists:
    """The two Redis list reads ``DeadLetters.records`` and ``depth`` make, over a dict."""

    def __init__(self, lists: dict[str, list[dict[str, Any]]]) -> None:
        self.lists = {k: [json.dumps(r) for r in v] for k, v in lists.items()}

    def lrange(self, key: str, start: int, stop: int) -> list[str]:
        if (start, stop) != (0, -1):
            raise ValueError("only the whole list is read")
        return list(self.lists.get(key, []))

    def llen(self, key: str) -> int:
        return len(self.lists.get(key, []))


@pytest.fixture(scope="module")
def manifest() -> Manifest:
    return generate(SEED, MANIFEST_UNITS, Deviations(every=DEVIATE_EVERY), batch_id=BATCH)


def test_the_writeups_split_of_the_lab_manifest_is_predicted_piece_by_piece(manifest: Manifest) -> None:
    want = writeup_expected(manifest)
    assert want.pieces == naive_pieces(manifest)[0] == 41  # the TECNI+ in a shipper's name makes a 41st piece
    assert sorted(want.dead) == [20]  # consignment 20's container fails ISO 6346; nothing else in a piece does
    assert len(want.booked) == 40 and f"{BATCH}-28" in want.booked  # the phantom piece, booked under a made-up number


def writeup_state(manifest: Manifest) -> tuple[list[tuple[str, str]], Lists, dict[str, int]]:
    want = writeup_expected(manifest)
    bookings = [(bl, BATCH) for bl in sorted(want.booked)]
    dead = Lists({f"{PREFIX}dead": [{"unit": {"index": i}, "reason": "bad container"} for i in sorted(want.dead)]})
    return bookings, dead, {"forwarded": want.pieces - len(want.dead), "dead_lettered": len(want.dead)}


def test_a_writeup_run_counts_when_every_piece_is_booked_or_dead_lettered_once(manifest: Manifest) -> None:
    bookings, dead, returned = writeup_state(manifest)
    assert writeup_problem(manifest, bookings, dead, PREFIX, returned) == ""


@pytest.mark.parametrize("off", ["booking lost", "booking twice", "dead letter lost", "aggregate miscounted"])
def test_a_writeup_run_one_piece_off_does_not_count(manifest: Manifest, off: str) -> None:
    bookings, dead, returned = writeup_state(manifest)
    if off == "booking lost":
        bookings = bookings[1:]
    elif off == "booking twice":
        bookings = [*bookings, bookings[0]]
    elif off == "dead letter lost":
        dead = Lists({})
    else:
        returned = {**returned, "forwarded": returned["forwarded"] - 1}
    assert writeup_problem(manifest, bookings, dead, PREFIX, returned) != ""


def fixed_state(manifest: Manifest) -> tuple[list[tuple[str, str]], dict[str, list[dict[str, Any]]]]:
    bookings = [(str(t.bl_number), BATCH) for t in manifest.parsable]
    rejected = [{"unit": {"index": t.index}, "reason": str(t.reason)} for t in manifest.rejected]
    return bookings, {f"{PREFIX}rejected": rejected}


def test_a_fixed_run_counts_when_every_consignment_is_booked_once_or_rejected_with_its_reason(
        manifest: Manifest) -> None:
    bookings, lists = fixed_state(manifest)
    assert len(bookings) == 37 and len(lists[f"{PREFIX}rejected"]) == 3  # booking only, no reference, malformed
    assert fixed_problem(manifest, bookings, Lists(lists), PREFIX) == ""


@pytest.mark.parametrize("off", ["booking lost", "booking twice", "wrong reason", "a dead letter"])
def test_a_fixed_run_one_consignment_off_does_not_count(manifest: Manifest, off: str) -> None:
    bookings, lists = fixed_state(manifest)
    if off == "booking lost":
        bookings = bookings[1:]
    elif off == "booking twice":
        bookings = [*bookings, bookings[0]]
    elif off == "wrong reason":
        lists[f"{PREFIX}rejected"][0]["reason"] = "malformed_segment_or_other"
    else:
        lists[f"{PREFIX}dead"] = [{"unit": {"index": 0}}]
    assert fixed_problem(manifest, bookings, Lists(lists), PREFIX) != ""


def test_the_cte_writeups_run_is_predicted_payload_by_payload() -> None:
    s = cte_study.stream()
    want = cte_writeup_expected(s)
    loose = len(cte_study.loose(s))  # a wrong GS1 check digit, or a KDE its type requires missing: it cannot tell
    unknown = [p for p in range(len(s.payloads)) if s.payloads[p]["event_type"] not in cte_study.WRITEUP_CTE_TYPES]
    unknown_resent = [p for p in unknown if p in s.duplicates]  # its model knows 5 of the rule's 7 CTE types
    unknown_valid = [p for p in unknown if p not in s.invalid and p not in s.duplicates]
    seen_invalid = [p for p in s.invalid if p not in unknown and p not in cte_study.loose(s)]
    assert loose == 14 and len(unknown_valid) == 463 and len(unknown_resent) == 13
    assert dict(want.returned) == {
        "committed": s.valid_distinct - len(unknown_valid) + loose,
        "deduplicated": len(s.duplicates) - len(unknown_resent),
        "None": len(unknown) + len(seen_invalid)} == {"committed": 1466, "deduplicated": 35, "None": 499}
    assert len(want.keys) == 1466 and len(want.quarantined) == 486  # a resend's text is its original's


def test_a_cte_writeup_run_counts_only_when_every_payload_is_accounted() -> None:
    want = cte_writeup_expected(cte_study.stream())
    keys, quarantined = set(want.keys), set(want.quarantined)
    assert cte_writeup_problems(want, Counter(want.returned), keys, quarantined) == []
    lost = Counter({**want.returned, "committed": want.returned["committed"] - 1, "FAILURE": 1})
    assert len(cte_writeup_problems(want, lost, keys - {min(keys)}, quarantined)) == 2
    assert len(cte_writeup_problems(want, Counter(want.returned), keys, quarantined - {min(quarantined)})) == 1


def bench(script: str, *args: str, suffix: str) -> str:
    """Run ``bench/<script>`` in a namespace of the session's own; its output (it must exit 0: every run exact)."""
    env = {**os.environ, "RCL_NAMESPACE": derived(suffix)}
    env.pop("RCL_LEDGER_URL", None)  # the benches choose their ledgers
    done = subprocess.run([sys.executable, f"bench/{script}", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.usefixtures("real_services")
def test_bench_severity_runs_both_programs_on_the_same_extract_each_exact() -> None:
    out = bench("bench_severity.py", "--quick", "--only", "4", "--pairs", "1", suffix="bsev")
    assert "write-up: median" in out and "fixed: median" in out and out.count("(1 of 1 runs exact)") == 2
    assert "   1    write-up     10,000    500     20" in out and "   1    fixed        10,000    500     20" in out
    assert "0 run(s) not exact" in out


@pytest.mark.usefixtures("real_services")
def test_bench_bl_runs_both_programs_on_the_same_manifest_each_exact() -> None:
    out = bench("bench_bl.py", "--units", str(MANIFEST_UNITS), "--pairs", "1", suffix="bbl")
    assert "pair 1: fixed    40 consignments, 40 units" in out and "(booked 37, rejected 3)" in out
    assert "pair 1: write-up 40 consignments, 41 units" in out and "(booked 40, dead-lettered 1)" in out
    assert "FAILED" not in out and "0 run(s) not exact" in out


@pytest.mark.usefixtures("real_services")
def test_bench_cte_runs_both_programs_on_the_same_burst_each_exact() -> None:
    out = bench("bench_cte.py", "--events", "300", "--shards", "2", suffix="bcte")
    runs = [json.loads(line.removeprefix("RESULT ")) for line in out.splitlines() if line.startswith("RESULT ")]
    assert [(r["program"], r["shards"], r["events"], r["exact"]) for r in runs] == [("write-up", 0, 300, True),
                                                                                     ("fixed", 2, 300, True)]
    s = cte_study.stream(events=300)
    want = cte_writeup_expected(s)
    writeup, fixed = runs
    assert (writeup["messages"], writeup["committed"], writeup["quarantined"]) == (300, len(want.keys),
                                                                                    len(want.quarantined))
    assert (fixed["committed"], fixed["quarantined"], fixed["out_of_order"]) == (s.valid_distinct, len(s.invalid), 0)
