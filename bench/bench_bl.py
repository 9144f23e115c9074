"""Benchmark: case study 2 (``case_studies/bl_ingestion``) end to end on this machine.

    python bench/bench_bl.py              # 4,000 consignments, fixed and write-up
    python bench/bench_bl.py --units 400  # a smoke run

One manifest of ``--units`` consignments from the study's seed, with its carrier
deviations (one in seven: booking only, no reference, bad check digit, escaped
text, malformed), runs on each program as the lab runs it: its own Redis keys
reset (``lab.harness.reset``), its own worker (2 pool processes, prefetch 1, acks
late, on the Redis broker) started by ``lab.harness.running_worker``, then, timed
from the manifest's text:

- dispatch: the program's ``dispatch_manifest`` task has split the text and
  sent the chord: the write-up splits on ``CNI+`` text and sends one
  ``parse_bl`` per piece (4,114 of them for 4,000 consignments: every
  ``escaped_text`` consignment makes a phantom one); the fixed program splits
  with pydifact (``manifest.split``) and sends one ``parse_units`` per chunk of
  50;
- end to end: until ``aggregate_batch`` has returned (every B/L booked by the
  terminal stand-in).

A run counts only if it is exact: every parsable consignment booked once, the
rest rejected (fixed), or every piece of the write-up's split booked or
dead-lettered (write-up); anything else is printed as
FAILED. It runs in the namespace ``RCL_NAMESPACE`` names (``rclbench`` when it is
not set) and cleans that namespace when it ends: give it one of its own. A
measurement, not a test: nothing fails on time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("RCL_NAMESPACE", "rclbench")  # the user's, else rclbench; before lab is imported (workers inherit it)

from celery.result import AsyncResult  # noqa: E402
from celery.states import READY_STATES  # noqa: E402

from case_studies.bl_ingestion.dead_letters import DeadLetters  # noqa: E402
from case_studies.bl_ingestion.manifest import Deviations, generate  # noqa: E402
from case_studies.bl_ingestion.stand_ins import Terminal  # noqa: E402
from case_studies.bl_ingestion.study import DEVIATE_EVERY, SEED, naive_pieces, program  # noqa: E402
from lab import harness, services, workers  # noqa: E402
from lab.fm import Fm  # noqa: E402
from lab.runner import new_run_id  # noqa: E402
from lab.settings import NAMESPACE  # noqa: E402
from lab.waiting import wait_until  # noqa: E402
from shared.backend import backend_redis  # noqa: E402

DRAIN_TIMEOUT = 300.0


@dataclass(frozen=True)
class Measured:
    program: str
    units: int
    dispatch_seconds: float
    total_seconds: float | None  # text to the aggregate's return; None when not exact
    booked: int
    problem: str


def measure(kind: harness.Kind, units: int) -> Measured:
    fm: Fm = program(kind)
    harness.reset(fm)
    run_id = new_run_id()
    manifest = generate(SEED, units, Deviations(every=DEVIATE_EVERY), batch_id=f"B{run_id}")
    with harness.running_worker(fm, run_id, f"bench-bl-{kind}", grace=2.0):
        started = time.monotonic()
        dispatched = cast("AsyncResult[Any]", cast(Any, fm.submit)(manifest.text, manifest.batch_id, run_id))
        backend = cast(Any, fm.app.backend)
        done = wait_until(lambda: backend.get_task_meta(dispatched.id)["status"] in READY_STATES, DRAIN_TIMEOUT, 0.05)
        split_at = time.monotonic()  # the dispatch task has split the text and sent the chord
        body = fm.app.AsyncResult(str(backend.get_task_meta(dispatched.id)["result"]))
        done = done and wait_until(body.ready, DRAIN_TIMEOUT, interval=0.05)
        ended = time.monotonic()
    bookings = Terminal(run_id).bookings()
    per_bl = Counter(bl for bl, _ in bookings)
    r, prefix = backend_redis(fm.app)
    parked = DeadLetters(r, prefix, "rejected" if kind == "fixed" else "dead").depth()
    want_booked = len(manifest.parsable)
    # the write-up books units with no RFF+BM under a made-up number, and a malformed unit whose containers pass
    problem = "" if done else f"the aggregate did not return within {DRAIN_TIMEOUT:.0f}s"
    if not problem and kind == "fixed" and (len(per_bl) != want_booked or max(per_bl.values(), default=1) != 1
                                            or parked != len(manifest.rejected)):
        problem = f"booked {len(per_bl)} (want {want_booked}), rejected {parked} (want {len(manifest.rejected)})"
    pieces = naive_pieces(manifest)[0]  # the write-up's split: one unit per CNI+ in the text
    if not problem and kind == "broken" and len(per_bl) + parked != pieces:
        problem = f"booked {len(per_bl)} + dead-lettered {parked} != {pieces} pieces"
    harness.reset(fm)
    return Measured(fm.short, units, split_at - started,
                    None if problem else ended - started, len(per_bl), problem)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--units", type=int, default=4000)
    args = parser.parse_args()
    services.ensure()
    results: list[Measured] = []
    try:
        for kind in ("fixed", "broken"):
            m = measure(cast(harness.Kind, kind), args.units)
            results.append(m)
            total = f"{m.total_seconds:.1f} s, {m.units / m.total_seconds:.0f} consignments/s" if m.total_seconds else \
                f"FAILED: {m.problem}"
            print(f"{m.program:4} {m.units} consignments: dispatched (split, chord sent) after {m.dispatch_seconds:.1f} s,"
                  f" end to end {total} (booked {m.booked})", flush=True)
    finally:
        workers.stop_leftovers(say=lambda _: None)
        harness.clean(say=lambda _: None)
    fixed, writeup = results[0].total_seconds, results[1].total_seconds if len(results) > 1 else None
    if fixed and writeup:
        print(f"fixed / write-up: {fixed / writeup:.2f}x the write-up's time (namespace {NAMESPACE}, cleaned)")
    return 0 if all(m.total_seconds for m in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
