"""Benchmark: case study 1 (``case_studies/severity_batch``: ``fixed.py``, and ``writeup.py`` beside it) on this machine.

    python bench/bench_severity.py              # every figure, ledger in SQLite
    python bench/bench_severity.py --postgres   # items 1 and 4 against PostgreSQL too
    python bench/bench_severity.py --quick      # every claim count / 10: a smoke run

Each measurement runs one program (the fixed one; item 4 the write-up's too) as the lab runs it: its own queues and
Redis keys reset (``lab.harness.reset``), the ledger cleared, its own worker
(``celery -A case_studies.severity_batch.fixed worker ... -B``: 2 pool processes,
prefetch 1, acks late, quorum queue, beat with the DLQ drain and the deadline
watch) started by ``lab.harness.running_worker``, a ``RunSpec`` submitted through
the program's own ``submit``, and the chord body's result awaited with a deadline.
The time is from the call to ``submit`` until the body (``reconcile``, which signs
the manifest) is ready. A run counts only if it is exact: manifest signed with the
extract's counts and the ledger holding every scorable row and every poison row
once; anything else is printed as FAILED, with no time.

Figures:

1. 100,000 claims, chunks of 500, every fix on, no faults: wall time, claims/s,
   Redis memory (``INFO memory`` used_memory of the whole server, shared with
   anything else on it) before submission, peak (sampled every 0.2 s while
   waiting) and right after; with ``--postgres`` the same run with the ledger in
   PostgreSQL (``RCL_LEDGER_URL``, given to the worker too);
2. the per-claim chord (chunks of 1, one task per claim: the FMs' shape) against
   chunks of 500 on 5,000 claims, and the per-claim chord's cost curve
   (500 .. 5,000 claims, seconds per 1,000 claims);
3. a chunk-size sweep on 20,000 claims: chunks of 50, 500, 5,000;
4. like with like: the write-up's program (``writeup.py``, its own worker: no beat, ``result_expires``
   at the lab's 8 s) and the fixed one on the same extract (100,000 claims, chunks of 500, the same
   seed, the same ledger: SQLite, and PostgreSQL with ``--postgres``), ``--pairs`` pairs (3 by
   default), the order alternating (write-up first in the first pair, fixed first in the next),
   each run counted the same way: the body returned, the manifest signed with the extract's counts
   and the ledger holding every scorable row and every poison row once. The per-run times, each
   program's median and the ratio pair by pair are printed.

It runs in the namespace ``RCL_NAMESPACE`` names, the user's (``rclbench`` only when it is not
set): queues ``<namespace>.sb.*`` and ``<namespace>.sbw.*``, Redis keys ``<namespace>:*``, ledger
``.lab/<namespace>/severity-ledger.sqlite`` (tables ``<namespace>_severity_*`` on PostgreSQL), and
it cleans that namespace when it ends: give it one of its own. A measurement, not a test: nothing fails on time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("RCL_NAMESPACE", "rclbench")  # the user's, else rclbench; before lab is imported (workers inherit it)

from celery.result import AsyncResult  # noqa: E402

from case_studies.severity_batch.claims import generate  # noqa: E402
from case_studies.severity_batch.ledger import Ledger, ledger_url  # noqa: E402
from case_studies.severity_batch.stand_ins import RunSpec  # noqa: E402
from case_studies.severity_batch.study import FEATURELESS_EVERY, POISON_EVERY, SEED, program  # noqa: E402
from lab import harness, services, workers  # noqa: E402
from lab.fm import Fm  # noqa: E402
from lab.observe import client, run_prefix  # noqa: E402
from lab.runner import new_run_id  # noqa: E402
from lab.settings import NAMESPACE, mask_url  # noqa: E402
from lab.waiting import wait_until  # noqa: E402
from shared.envelope import Result, is_envelope  # noqa: E402

POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
SAMPLE_EVERY = 0.2
MB = 1024 * 1024


@dataclass(frozen=True)
class Measured:
    ledger: str  # sqlite | postgres
    claims: int
    chunk_size: int
    tasks: int
    submit_seconds: float  # the call to submit (publishing the chord) alone
    seconds: float | None  # submit to the signed manifest; None when the run was not exact
    problem: str  # why it is not exact ("" when it is)
    flags: tuple[str, ...]  # the ledger's flags on the run (a signed run may carry one: see the report)
    mem_before: int
    mem_peak: int
    mem_after: int
    keys_left: int  # the namespace's Redis keys once the run ended (results, counters, the run's events)

    @property
    def exact(self) -> bool:
        return self.seconds is not None


def used_memory() -> int:
    info = cast(dict[str, Any], cast(Any, client()).info("memory"))
    return int(info["used_memory"])


def namespace_keys() -> int:
    scan = cast(Callable[..., Any], cast(Any, client()).scan_iter)
    return sum(1 for _ in scan(match=f"{NAMESPACE}:*", count=1000))


def run_timeout(tasks: int) -> float:
    """Room for the slowest shape: the per-claim chord of 5,000 tasks gets about 10 minutes."""
    return 120.0 + 0.1 * tasks


def measure(fm: Fm, claims: int, chunk_size: int, url: str, ledger_name: str) -> Measured:
    """One run of ``claims`` claims in chunks of ``chunk_size``, on a fresh worker; exact or failed."""
    spec = RunSpec(run=new_run_id(), seed=SEED, claims=claims, chunk_size=chunk_size, poison_every=POISON_EVERY,
                   featureless_every=FEATURELESS_EVERY)
    batch = generate(SEED, claims, poison_every=POISON_EVERY, featureless_every=FEATURELESS_EVERY)
    tasks = -(-claims // chunk_size)
    harness.reset(fm)
    ledger = Ledger(url)
    ledger.create()
    ledger.clear()
    submit = cast("Callable[[RunSpec], AsyncResult[Any]]", fm.submit)
    label = f"bench-{ledger_name}-{claims}x{chunk_size}"
    previous = os.environ.get("RCL_LEDGER_URL")
    os.environ["RCL_LEDGER_URL"] = url  # the worker inherits it: the same ledger on both sides
    try:
        with harness.running_worker(fm, spec["run"], label, workers.STOP_GRACE, wait=True,
                                    after=lambda: harness.purge(fm)) as worker:
            alive = harness.Liveness(worker)
            mem_before = used_memory()
            peak, sampled = mem_before, time.monotonic()
            started = time.monotonic()
            body = submit(spec)
            submitted = time.monotonic() - started
            ended = 0.0

            def done() -> bool:
                nonlocal peak, sampled, ended
                alive()
                now = time.monotonic()
                if now - sampled >= SAMPLE_EVERY:
                    peak, sampled = max(peak, used_memory()), now
                if body.ready():
                    ended = now
                    return True
                return False

            finished = wait_until(done, run_timeout(tasks))
            elapsed = ended - started
            mem_after = used_memory()
            mem_peak = max(peak, mem_after)
            keys_left = namespace_keys()
            problem = "" if finished else f"the chord body was not ready after {run_timeout(tasks):.0f}s"
            if finished:
                problem = _inexact(body, ledger, spec["run"], claims, batch.scorable, len(batch.poison_ids),
                                   len(batch.featureless_ids))
            flags = tuple(f.reason for f in ledger.flags(spec["run"]))
    finally:
        if previous is None:
            os.environ.pop("RCL_LEDGER_URL", None)
        else:
            os.environ["RCL_LEDGER_URL"] = previous
        harness.delete_keys(f"{run_prefix(spec['run'])}*")  # the observer's record of the run
        ledger.dispose()
    return Measured(ledger_name, claims, chunk_size, tasks, submitted, None if problem else elapsed, problem, flags,
                    mem_before, mem_peak, mem_after, keys_left)


def _inexact(body: AsyncResult[Any], ledger: Ledger, run_id: str, claims: int, scorable: int, poison: int,
             skipped: int) -> str:
    """Why the run is not exact ("" when it is)."""
    state, value = body.state, cast(object, body.result)
    if state != "SUCCESS":
        return f"reconcile {state}: {value!r}"[:200]
    if is_envelope(value):  # the fixed program's reconcile returns an envelope; the write-up's, its counts
        env = Result.from_wire(value)
        if not env.ok:
            return f"reconcile failed: {env.error}"[:200]
    elif not isinstance(value, dict):
        return f"reconcile returned {value!r}"[:200]
    manifest, counts = ledger.manifest(run_id), ledger.counts(run_id)
    if manifest is None:
        return "no manifest"
    want = (claims, scorable, poison, skipped)
    got = (manifest.dispatched, manifest.scored, manifest.quarantined, manifest.skipped)
    if got != want:
        return f"manifest (dispatched, scored, quarantined, skipped) {got}, expected {want}"
    if (counts.scored, counts.quarantined) != (scorable, poison):
        return f"ledger rows scored {counts.scored}, quarantined {counts.quarantined}; expected {scorable}, {poison}"
    return ""


# ---- printing ------------------------------------------------------------------------


def secs(m: Measured) -> str:
    return f"{m.seconds:8.2f}s" if m.seconds is not None else "  FAILED"


def flag_note(m: Measured) -> str:
    notes = [f"flagged: {', '.join(m.flags)}"] if m.flags else []
    if m.problem:
        notes.append(m.problem)
    return f"  ({'; '.join(notes)})" if notes else ""


def mb(n: int) -> str:
    return f"{n / MB:7.1f}"


def report_end_to_end(runs: list[Measured]) -> None:
    print("1. end to end, every fix on (poison every 97, featureless every 89, no faults); target <= 30 s")
    print(f"   {'ledger':<9}{'claims':>9}{'chunk':>7}{'tasks':>7}{'submit':>9}{'total':>10}{'claims/s':>10}"
          f"  {'redis MB: before':>16}{'peak':>8}{'after':>8}{'growth peak':>13}{'after':>8}{'keys left':>10}")
    for m in runs:
        rate = f"{m.claims / m.seconds:10,.0f}" if m.seconds else f"{'-':>10}"
        print(f"   {m.ledger:<9}{m.claims:>9,}{m.chunk_size:>7,}{m.tasks:>7,}{m.submit_seconds:>8.2f}s{secs(m):>10}"
              f"{rate}  {mb(m.mem_before):>16}{mb(m.mem_peak):>8}{mb(m.mem_after):>8}"
              f"{mb(m.mem_peak - m.mem_before):>13}{mb(m.mem_after - m.mem_before):>8}{m.keys_left:>10,}"
              f"{flag_note(m)}")
    print("   redis MB: used_memory of the whole Redis server (shared; other clients count too); "
          "after = right when the manifest was signed")


def row(m: Measured, extra: str = "") -> str:
    return (f"   {m.claims:>9,}{m.chunk_size:>7,}{m.tasks:>7,}{m.submit_seconds:>8.2f}s{secs(m):>10}"
            f"{extra}{flag_note(m)}")


def report_per_claim(chunked: Measured, per_claim: list[Measured]) -> None:
    print("2. the per-claim chord (chunks of 1, one task per claim) against chunks of 500; "
          "target: chunked >= 20x faster")
    print(f"   {'claims':>9}{'chunk':>7}{'tasks':>7}{'submit':>9}{'total':>10}{'s / 1,000 claims':>18}")
    largest = per_claim[-1]
    for m in (largest, chunked):
        print(row(m, f"{m.seconds / m.claims * 1000:>18.3f}" if m.seconds else f"{'-':>18}"))
    if largest.seconds and chunked.seconds:
        print(f"   chunked is {largest.seconds / chunked.seconds:.1f}x faster "
              f"({largest.claims:,} claims: {largest.seconds:.2f}s one task per claim, {chunked.seconds:.2f}s in chunks of "
              f"{chunked.chunk_size:,})")
    else:
        print("   ratio: n/a (a run failed)")
    print("   cost curve of the per-claim chord:")
    print(f"   {'claims':>9}{'chunk':>7}{'tasks':>7}{'submit':>9}{'total':>10}{'s / 1,000 claims':>18}"
          f"{'tasks/s':>9}")
    for m in per_claim:
        extra = (f"{m.seconds / m.claims * 1000:>18.3f}{m.tasks / m.seconds:>9.0f}" if m.seconds
                 else f"{'-':>18}{'-':>9}")
        print(row(m, extra))


def report_like_with_like(pairs: list[tuple[Measured, Measured]]) -> None:
    """``pairs``: (write-up, fixed) per pair, whichever ran first; printed in the order they ran."""
    print(f"4. the write-up's program and the fixed one on the same extract, the order alternating pair by pair "
          f"(ledger: {pairs[0][0].ledger if pairs else '-'})")
    print(f"   {'pair':<5}{'program':<10}{'claims':>9}{'chunk':>7}{'tasks':>7}{'submit':>9}{'total':>10}{'claims/s':>10}")
    for i, (writeup, fixed) in enumerate(pairs):
        order = (("write-up", writeup), ("fixed", fixed)) if i % 2 == 0 else (("fixed", fixed), ("write-up", writeup))
        for name, m in order:
            rate = f"{m.claims / m.seconds:10,.0f}" if m.seconds else f"{'-':>10}"
            print(f"   {i + 1:<5}{name:<10}{m.claims:>9,}{m.chunk_size:>7,}{m.tasks:>7,}{m.submit_seconds:>8.2f}s"
                  f"{secs(m):>10}{rate}{flag_note(m)}")
    for name, runs in (("write-up", [w for w, _ in pairs]), ("fixed", [f for _, f in pairs])):
        times = sorted(m.seconds for m in runs if m.seconds is not None)
        if times:
            print(f"   {name}: median {statistics.median(times):.2f}s, min {times[0]:.2f}s, max {times[-1]:.2f}s "
                  f"({len(times)} of {len(runs)} runs exact)")
        else:
            print(f"   {name}: no exact run")
    done = [(w.seconds, f.seconds) for w, f in pairs if w.seconds and f.seconds]
    if done:
        ratios = sorted(f / w for w, f in done)
        print(f"   the fixed program took {ratios[0]:.2f}x to {ratios[-1]:.2f}x the write-up's time, pair by pair")


def report_sweep(sweep: list[Measured]) -> None:
    claims = sweep[0].claims if sweep else 0
    print(f"3. chunk-size sweep on {claims:,} claims")
    print(f"   {'claims':>9}{'chunk':>7}{'tasks':>7}{'submit':>9}{'total':>10}{'claims/s':>10}")
    for m in sweep:
        print(row(m, f"{m.claims / m.seconds:>10,.0f}" if m.seconds else f"{'-':>10}"))


# ---- main --------------------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser(description="Benchmark case study 1 (severity batch) on this machine.")
    p.add_argument("--postgres", action="store_true", help=f"items 1 and 4 against PostgreSQL too ({POSTGRES_URL})")
    p.add_argument("--quick", action="store_true", help="every claim count / 10 (a smoke run)")
    p.add_argument("--pairs", type=int, default=3, help="item 4: pairs of runs, write-up and fixed (default 3)")
    p.add_argument("--only", choices=("1", "2", "3", "4"), action="append",
                   help="run only these items (repeatable; default: all)")
    args = p.parse_args()
    scale = 10 if args.quick else 1
    items = set(args.only or ("1", "2", "3", "4"))
    for what, problem in (("broker", services.broker_problem()), ("Redis", services.backend_problem())):
        if problem is not None:
            print(f"error: the {what} {problem}", file=sys.stderr)
            return 2
    if "RCL_LEDGER_URL" in os.environ:
        print("note: RCL_LEDGER_URL is ignored; the bench uses SQLite (and PostgreSQL with --postgres)")
        os.environ.pop("RCL_LEDGER_URL")
    sqlite_url = ledger_url()
    bench_started = time.monotonic()
    fm = program("fixed")
    print(f"severity batch bench: namespace {NAMESPACE}, {os.cpu_count()} CPUs, {fm.concurrency} pool processes, "
          f"ledger {sqlite_url.removeprefix('sqlite:///')}"
          f"{f' and {mask_url(POSTGRES_URL)}' if args.postgres else ''}{', --quick (claims / 10)' if args.quick else ''}")
    t = time.perf_counter()
    generate(SEED, 100_000 // scale, poison_every=POISON_EVERY, featureless_every=FEATURELESS_EVERY)
    print(f"(for scale: generating the {100_000 // scale:,}-claim extract takes {time.perf_counter() - t:.2f}s here; "
          "each pool process generates its run's extract once, inside the timed run)\n", flush=True)
    failed = 0
    try:
        with workers.NamespaceLock():
            workers.stop_leftovers()
            harness.refuse_busy_queues([fm.short])

            def one(claims: int, chunk: int, url: str = sqlite_url, name: str = "sqlite", on: Fm = fm) -> Measured:
                nonlocal failed
                m = measure(on, claims // scale, chunk, url, name)
                failed += not m.exact
                print(f"   .. {on.short} {name} {m.claims:,} claims x {chunk:,}: {secs(m).strip()}{flag_note(m)}",
                      flush=True)
                return m

            if "1" in items:
                e2e = [one(100_000, 500)]
                if args.postgres:
                    e2e.append(one(100_000, 500, POSTGRES_URL, "postgres"))
                report_end_to_end(e2e)
                print(flush=True)
            if "2" in items:
                chunked = one(5_000, 500)
                curve = [one(n, 1) for n in (500, 1_000, 2_000, 5_000)]
                report_per_claim(chunked, curve)
                print(flush=True)
            if "3" in items:
                report_sweep([one(20_000, size) for size in (50, 500, 5_000)])
                print(flush=True)
            if "4" in items:
                writeup = program("broken")  # the write-up's own program (writeup.py)
                harness.refuse_busy_queues([writeup.short])
                ledgers = [(sqlite_url, "sqlite"), *([(POSTGRES_URL, "postgres")] if args.postgres else [])]
                for url, name in ledgers:
                    pairs: list[tuple[Measured, Measured]] = []
                    for i in range(args.pairs):
                        if i % 2 == 0:
                            w = one(100_000, 500, url, name, on=writeup)
                            pairs.append((w, one(100_000, 500, url, name)))
                        else:
                            f = one(100_000, 500, url, name)
                            pairs.append((one(100_000, 500, url, name, on=writeup), f))
                    report_like_with_like(pairs)
                    print(flush=True)
    finally:
        workers.wait_stopped()
        harness.clean(say=lambda line: print(f"cleanup: {line}"))
        if args.postgres:
            pg = Ledger(POSTGRES_URL)
            pg.metadata.drop_all(pg.engine)  # the namespace's own tables only (<namespace>_severity_*)
            pg.dispose()
            print(f"cleanup: dropped the {NAMESPACE}_severity_* tables in {mask_url(POSTGRES_URL)}")
    print(f"whole bench: {time.monotonic() - bench_started:.1f}s; {failed} run(s) not exact")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
