"""Benchmark: case study 2 (``case_studies/bl_ingestion``), the write-up's program and the fixed one, on this machine.

    RCL_NAMESPACE=mine python bench/bench_bl.py              # 4,000 consignments, 3 pairs of runs
    RCL_NAMESPACE=mine python bench/bench_bl.py --units 400  # a smoke run

Like with like: one manifest of ``--units`` consignments from the study's seed, with its carrier
deviations (one in seven: booking only, no reference, bad check digit, escaped text,
malformed), the same bytes (``manifest.encode_interchange``: the manifest is ASCII, so the
write-up's UTF-8 decoding reads what the fixed program's ``UNB`` character set reads), goes to
each program's own ``submit`` as the lab runs it: its Redis keys reset (``lab.harness.reset``),
its own worker (2 pool processes, prefetch 1, acks late, on the Redis broker) started by
``lab.harness.running_worker``, ``BULK_VISIBILITY_TIMEOUT`` unset (the write-up's hour). Timed
from the call to ``submit``:

- dispatch: the program's ``dispatch_manifest`` task has split the text and sent the chord: the
  write-up splits on ``CNI+`` text and sends one ``parse_bl`` per piece (4,114 pieces for 4,000
  consignments: every ``escaped_text`` consignment makes a phantom one); the fixed program
  splits with pydifact (``manifest.split``) and sends one ``parse_units`` per chunk of 50;
- end to end: until ``aggregate_batch`` has returned (every B/L forwarded to the terminal
  stand-in).

The work counted is the same for both: the manifest's consignments, and the rate is consignments
of the manifest per second. A run counts only if every item is accounted for, exactly, by its own
program's semantics:

- fixed: the terminal booked exactly the B/L numbers of the parsable consignments, each once;
  the rejected list holds exactly the other consignments, each with the reason the manifest's
  ground truth gives; the dead list is empty;
- write-up: its split makes as many pieces as the ground truth predicts (``study.naive_pieces``);
  each piece's expected fate is computed here with the write-up's own functions (its B/L
  regular expression and fallback number, its ISO 6346 check); the dead list holds exactly the
  pieces that fail the check, the aggregate returned ``forwarded`` + ``dead_lettered`` = the
  pieces, and the terminal booked exactly the distinct B/L numbers of the other pieces, each
  once (made-up ``<batch>-<index>`` numbers among them: what the write-up books).

Anything else is printed as FAILED, with no time. The runs are ``--pairs`` pairs, the order
alternating (fixed first in the first pair, the write-up first in the next). It runs in the
namespace ``RCL_NAMESPACE`` names (the user's; ``rclbench`` only when it is not set) and cleans
that namespace when it ends: give it one of its own. A measurement, not a test: nothing fails on
time.
"""

from __future__ import annotations

import argparse
import os
import statistics
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

from case_studies.bl_ingestion import writeup  # noqa: E402
from case_studies.bl_ingestion.dead_letters import DeadLetters  # noqa: E402
from case_studies.bl_ingestion.manifest import Deviations, Manifest, encode_interchange, generate  # noqa: E402
from case_studies.bl_ingestion.stand_ins import Terminal  # noqa: E402
from case_studies.bl_ingestion.study import DEVIATE_EVERY, SEED, naive_pieces, program  # noqa: E402
from lab import harness, records, services, workers  # noqa: E402
from lab.fm import Fm  # noqa: E402
from lab.runner import new_run_id  # noqa: E402
from lab.settings import NAMESPACE  # noqa: E402
from lab.waiting import wait_until  # noqa: E402
from shared.backend import backend_redis  # noqa: E402

DRAIN_TIMEOUT = 600.0
NAMES: dict[records.Kind, str] = {"fixed": "fixed", "broken": "write-up"}


@dataclass(frozen=True)
class Measured:
    kind: records.Kind
    units: int  # consignments in the manifest
    pieces: int  # units the program sent to its parse task (the write-up's split makes more)
    dispatch_seconds: float
    total_seconds: float | None  # submit to the aggregate's return; None when not exact
    booked: int  # distinct B/L numbers the terminal booked
    parked: int  # records in the program's list: the rejected list (fixed), the dead list (write-up)
    problem: str


@dataclass(frozen=True)
class WriteupExpected:
    """What the write-up's own code makes of the manifest: its pieces, the dead ones, the B/L numbers it books."""

    pieces: int
    dead: frozenset[int]
    booked: frozenset[str]


def writeup_expected(manifest: Manifest) -> WriteupExpected:
    pieces = writeup.split_units(manifest.text)  # the text it decodes from the same bytes (ASCII)
    dead: set[int] = set()
    booked: set[str] = set()
    for i, raw in enumerate(pieces):
        try:
            writeup.validate_containers(raw)
        except ValueError:
            dead.add(i)
            continue
        booked.add(writeup.bl_number_of(raw, manifest.batch_id, i))
    return WriteupExpected(len(pieces), frozenset(dead), frozenset(booked))


def fixed_problem(manifest: Manifest, bookings: list[tuple[str, str]], r: Any, prefix: str) -> str:
    """Why a fixed run is not exact ("" when every consignment is accounted for); ``bookings`` the terminal's,
    ``r`` and ``prefix`` where the program keeps its lists."""
    per_bl = Counter(bl for bl, _ in bookings)
    want_booked = {str(t.bl_number) for t in manifest.parsable}
    rejected = {int(rec["unit"]["index"]): str(rec["reason"]) for rec in DeadLetters(r, prefix, "rejected").records()}
    want_rejected = {t.index: str(t.reason) for t in manifest.rejected}
    dead = DeadLetters(r, prefix, "dead").depth()
    if set(per_bl) != want_booked or max(per_bl.values(), default=1) != 1:
        return (f"booked {len(per_bl)} B/Ls ({sum(per_bl.values())} bookings), want exactly the {len(want_booked)} "
                f"parsable ones once; {len(set(per_bl) ^ want_booked)} differ")
    if rejected != want_rejected:
        return f"rejected {len(rejected)} (want {len(want_rejected)} with their reasons)"
    if dead:
        return f"{dead} in the dead list, want 0"
    return ""


def writeup_problem(manifest: Manifest, bookings: list[tuple[str, str]], r: Any, prefix: str,
                    returned: object) -> str:
    """Why a write-up run is not exact ("" when every piece of its split is accounted for); ``returned`` is what
    its ``aggregate_batch`` returned."""
    want = writeup_expected(manifest)
    truth = naive_pieces(manifest)[0]
    if want.pieces != truth:
        return f"its split made {want.pieces} pieces, the ground truth says {truth}"
    per_bl = Counter(bl for bl, _ in bookings)
    dead = {int(rec["unit"]["index"]) for rec in DeadLetters(r, prefix, "dead").records()}
    depth = DeadLetters(r, prefix, "dead").depth()
    if dead != set(want.dead) or depth != len(want.dead):
        return f"dead list {depth} records of {len(dead)} pieces, want the {len(want.dead)} that fail ISO 6346"
    forwarded = want.pieces - len(want.dead)
    if returned != {"forwarded": forwarded, "dead_lettered": len(want.dead)}:
        return f"aggregate returned {returned!r}, want forwarded {forwarded}, dead_lettered {len(want.dead)}"
    if set(per_bl) != set(want.booked) or max(per_bl.values(), default=1) != 1:
        return (f"booked {len(per_bl)} B/Ls ({sum(per_bl.values())} bookings), want exactly the {len(want.booked)} "
                f"distinct numbers of the forwarded pieces once")
    return ""


def measure(kind: records.Kind, units: int) -> Measured:
    fm: Fm = program(kind)
    harness.reset(fm)
    run_id = new_run_id()
    manifest = generate(SEED, units, Deviations(every=DEVIATE_EVERY), batch_id=f"B{run_id}")
    payload = encode_interchange(manifest.text)  # the carrier's bytes, the same for both programs
    pieces = writeup_expected(manifest).pieces if kind == "broken" else units
    body: AsyncResult[Any] | None = None
    with harness.running_worker(fm, run_id, f"bench-bl-{kind}", grace=2.0) as worker:
        alive = harness.Liveness(worker)
        backend = cast(Any, fm.app.backend)
        started = time.monotonic()
        dispatched = cast("AsyncResult[Any]", cast(Any, fm.submit)(payload, manifest.batch_id, run_id))

        def split_done() -> bool:
            alive()
            return backend.get_task_meta(dispatched.id)["status"] in READY_STATES

        done = wait_until(split_done, DRAIN_TIMEOUT, 0.05)
        split_at = time.monotonic()  # the dispatch task has split the text and sent the chord
        if done:
            body = fm.app.AsyncResult(str(backend.get_task_meta(dispatched.id)["result"]))
            chord_body = body

            def aggregated() -> bool:
                alive()
                return chord_body.ready()

            done = wait_until(aggregated, DRAIN_TIMEOUT, interval=0.05)
        ended = time.monotonic()
    bookings = Terminal(run_id).bookings()
    r, prefix = backend_redis(fm.app)
    parked = DeadLetters(r, prefix, "rejected" if kind == "fixed" else "dead").depth()
    problem = "" if done else f"the dispatch or the aggregate did not finish within {DRAIN_TIMEOUT:.0f}s"
    if not problem and body is not None and body.state != "SUCCESS":
        problem = f"aggregate {body.state}: {body.result!r}"[:200]
    if not problem:
        problem = (fixed_problem(manifest, bookings, r, prefix) if kind == "fixed"
                   else writeup_problem(manifest, bookings, r, prefix, cast(object, body.result if body else None)))
    harness.reset(fm)
    return Measured(kind, units, pieces, split_at - started, None if problem else ended - started,
                    len({bl for bl, _ in bookings}), parked, problem)


def line(m: Measured) -> str:
    total = (f"end to end {m.total_seconds:6.1f} s, {m.units / m.total_seconds:5.0f} consignments/s"
             if m.total_seconds else f"FAILED: {m.problem}")
    listed = "rejected" if m.kind == "fixed" else "dead-lettered"
    return (f"{NAMES[m.kind]:<9}{m.units:,} consignments, {m.pieces:,} units: dispatch (split, chord sent) "
            f"{m.dispatch_seconds:5.1f} s, {total} (booked {m.booked:,}, {listed} {m.parked:,})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--units", type=int, default=4000, help="consignments in the manifest (default 4,000)")
    parser.add_argument("--pairs", type=int, default=3, help="pairs of runs, fixed and write-up (default 3)")
    args = parser.parse_args()
    os.environ.pop("BULK_VISIBILITY_TIMEOUT", None)  # the write-up's default hour, as published (its workers inherit it)
    services.ensure()
    print(f"bl bench: namespace {NAMESPACE}, {os.cpu_count()} CPUs, {args.units:,} consignments, {args.pairs} pair(s)",
          flush=True)
    pairs: list[dict[records.Kind, Measured]] = []
    started = time.monotonic()
    try:
        with workers.NamespaceLock():
            workers.stop_leftovers()
            for i in range(args.pairs):
                pair: dict[records.Kind, Measured] = {}
                order: tuple[records.Kind, records.Kind] = ("fixed", "broken") if i % 2 == 0 else ("broken", "fixed")
                for kind in order:
                    harness.refuse_busy_queues([program(kind).short])
                    pair[kind] = m = measure(kind, args.units)
                    print(f"pair {i + 1}: {line(m)}", flush=True)
                pairs.append(pair)
    finally:
        workers.wait_stopped()
        harness.clean(say=lambda _: None)
    failed = sum(1 for p in pairs for m in p.values() if m.total_seconds is None)
    for kind in ("fixed", "broken"):
        times = sorted(t for p in pairs if (t := p[kind].total_seconds) is not None)
        splits = sorted(p[kind].dispatch_seconds for p in pairs if p[kind].total_seconds is not None)
        if times:
            print(f"{NAMES[kind]:<9}median end to end {statistics.median(times):.1f} s (min {times[0]:.1f}, max "
                  f"{times[-1]:.1f}), of it dispatch median {statistics.median(splits):.1f} s; "
                  f"{len(times)} of {len(pairs)} runs exact")
    ratios = sorted(f / w for p in pairs if (f := p["fixed"].total_seconds) and (w := p["broken"].total_seconds))
    if ratios:
        print(f"the fixed program took {ratios[0]:.2f}x to {ratios[-1]:.2f}x the write-up's time, pair by pair")
    print(f"whole bench {time.monotonic() - started:.0f} s; {failed} run(s) not exact; namespace {NAMESPACE} cleaned")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
