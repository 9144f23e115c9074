"""Benchmark: case study 3 (``case_studies/cte_ingestion``), the write-up's program and the fixed one, on a burst.

    RCL_NAMESPACE=cte3 python bench/bench_cte.py                  # 10,000 events: the write-up, the fixed at 1, 2, 4 shards
    RCL_NAMESPACE=cte3 python bench/bench_cte.py --rounds 2       # twice, the order reversed in the second round
    RCL_NAMESPACE=cte3 python bench/bench_cte.py --postgres       # the ledger in PostgreSQL as well
    RCL_NAMESPACE=cte3 python bench/bench_cte.py --programs fixed --shards 4 --events 2000

Like with like: both programs take the same burst (``events.generate`` from the study's seed:
invalid payloads and resends in it, no ledger faults), each through its own ``submit``, each as
the lab runs it, with the same SQL ledger:

- the fixed program, every fix on: its shard queues reset (``x-single-active-consumer``), one
  worker per shard (``-Q`` its shard, ``-c 1``, prefetch 1, acks late) started by
  ``lab.harness.running_workers`` with ``CTE_SHARDS`` and a fresh ``PROMETHEUS_MULTIPROC_DIR``;
  messages of up to 50 events of one shard;
- the write-up's program as published: its Redis broker, its one queue ``cte.ingest`` and one
  worker at ``-c 2`` (prefetch 1, acks late), one message per event, its model (``CTEEvent``),
  the payloads under its field names (``stand_ins.as_published``: the same values).

Two times, from the call to ``submit``:

- accepted: until ``submit`` returned, every message handed to the broker (publisher confirms
  are off, as in Celery's default); the queue depth right after is printed with it;
- drained: until every payload is handled: the fixed program's metrics count an outcome for
  each (each process's counters gathered from the multiprocess folder); the write-up's queue is
  empty, every one of its tasks has a result (SUCCESS or FAILURE) and its quarantine holds
  every payload its model refuses (polled every 0.25 s).

The work counted is the same: the burst's payloads, and the rate is payloads per second. A run
counts only if every payload is accounted for, exactly, by its program's semantics; anything else
is printed as not exact, with its reasons:

- fixed: the ledger holds every valid distinct event once, quarantined equals the invalid
  payloads, no dead letter, each lot committed in the order produced, zero out-of-order commits
  or refusals, and the metrics' outcomes equal the ledger's;
- write-up: every task SUCCESS, returning ``committed`` once per distinct key its model takes
  (the valid events of the 5 CTE types it knows, and those with a wrong GS1 check digit or
  without a KDE their type requires: CT1 write-up; ``study.writeup_takes``), ``deduplicated``
  for each resend, nothing (``None``) for each payload its model refuses; the ledger's keys
  exactly those keys; its quarantine exactly the refused payloads as sent. Its out-of-order
  commits (CT2 write-up) are printed, a figure, not a failure.

The queue depth is printed about once a second while it falls. Each measurement runs in a process
of its own (``CTE_SHARDS`` is read when the program is imported) and prints one ``RESULT`` JSON
line; a summary ends the bench. The namespace (``RCL_NAMESPACE``: the user's; ``rclbench-cte``
only when it is not set) is cleaned at the end. A measurement, not a test: nothing fails on time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from case_studies.cte_ingestion.events import Stream
    from lab.fm import Fm

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("RCL_NAMESPACE", "rclbench-cte")  # before anything from lab is imported; workers inherit it

POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DRAIN_TIMEOUT = 300.0


def result(fields: dict[str, Any]) -> None:
    """The child's one result line (``RESULT {json}``), which the parent gathers into its summary."""
    print(f"RESULT {json.dumps(fields, sort_keys=True)}", flush=True)


def one_fixed(events: int) -> int:
    """One measurement of the fixed program with ``CTE_SHARDS`` shards; prints one result line; 0 when exact."""
    from case_studies.cte_ingestion import stand_ins, study
    from case_studies.cte_ingestion.events import generate
    from case_studies.cte_ingestion.metrics import CteMetrics, exporter_registry, outcomes, read
    from lab import harness
    from lab.runner import new_run_id
    from lab.waiting import wait_until
    from lab.workers import STOP_GRACE

    fm = study.program("fixed")
    shards = len(fm.task_queues)
    harness.reset(fm)
    ledger = study.open_ledger(clear=True)
    stand_ins.plan_faults(fm.app, {})  # no ledger faults: the bench measures the drain
    stand_ins.set_outage(fm.app, False)
    run_id = new_run_id()
    folder = study.metrics_folder(fm.short, run_id)
    s = generate(study.SEED, events, invalid_every=study.INVALID_EVERY, duplicate_every=study.DUPLICATE_EVERY)
    payloads = list(s.payloads)
    specs = study.worker_specs(fm, study.SCENARIOS["burst"], folder)
    with harness.running_workers(fm, run_id, f"bench-cte-{shards}", specs, STOP_GRACE,
                                 after=lambda: harness.purge(fm)) as workers:
        watch = harness.Watch(workers)
        drain = study.Drain(fm, CteMetrics())
        started = time.monotonic()
        messages = cast(Any, fm.submit)(payloads)
        accepted = time.monotonic() - started
        first = sum(drain.sample())

        def handled() -> bool:
            watch()
            drain.sample()
            return sum(outcomes(read(exporter_registry(folder))).values()) >= len(payloads)

        done = wait_until(handled, DRAIN_TIMEOUT, interval=0.25)
        drained = time.monotonic() - started
        drain.sample()
        drain.close()
    counts = ledger.counts()
    got = outcomes(read(exporter_registry(folder)))
    dups = Counter(("deduplicated", str(s.payloads[p]["supplier_id"])) for p in s.duplicates)
    want = {**{k: v for k, v in ledger.by_supplier().items() if v}, **dups}
    seqs = ledger.lot_sequences()
    problems = [
        *([] if done else [f"not drained within {DRAIN_TIMEOUT:.0f}s"]),
        *([] if counts.committed == s.valid_distinct else [f"committed {counts.committed}/{s.valid_distinct}"]),
        *([] if counts.quarantined == len(s.invalid) else [f"quarantined {counts.quarantined}/{len(s.invalid)}"]),
        *([] if counts.dead_letters_pending == 0 else [f"dead letters {counts.dead_letters_pending}"]),
        *([] if counts.out_of_order_commits == counts.out_of_order_attempts == 0
          else [f"out of order {counts.out_of_order_commits}, refused {counts.out_of_order_attempts}"]),
        *([] if got == want else ["metrics != ledger"]),
        *([] if seqs == {lot: list(v) for lot, v in s.lot_sequences.items()} else ["a lot committed out of order"]),
    ]
    result({"program": "fixed", "shards": shards, "ledger": ledger.engine.dialect.name, "events": events,
            "messages": messages, "accepted": round(accepted, 2), "depth_after": first, "drained": round(drained, 2),
            "committed": counts.committed, "quarantined": counts.quarantined,
            "deduplicated": sum(dups.values()), "out_of_order": counts.out_of_order_commits,
            "exact": not problems, "problem": "; ".join(problems)})
    return 0 if not problems else 1


def _states(fm: Fm, ids: list[str]) -> dict[str, tuple[str, object]]:
    """Each task's (state, result) from its result key (PENDING when it has none), 1,000 keys a round trip."""
    backend = cast(Any, fm.app.backend)
    found: dict[str, tuple[str, object]] = {}
    for start in range(0, len(ids), 1000):
        part = ids[start:start + 1000]
        for task_id, raw in zip(part, cast(list[Any], backend.client.mget([backend.get_key_for_task(i) for i in part]))):
            meta = cast(dict[str, Any], json.loads(raw)) if raw else {"status": "PENDING", "result": None}
            found[task_id] = (str(meta["status"]), meta.get("result"))
    return found


@dataclass(frozen=True)
class WriteupExpected:
    """What the write-up's program must make of a burst, payload by payload, by its own model's rules."""

    keys: frozenset[str]  # the idempotency keys it commits: the valid events and those it lets through (CT1 write-up)
    quarantined: frozenset[str]  # the payloads (as sent to it, JSON with sorted keys) its model refuses
    returned: Mapping[str, int]  # its tasks' returns: committed, deduplicated, None (sent to quarantine)


def writeup_expected(s: Stream) -> WriteupExpected:
    from case_studies.cte_ingestion import stand_ins, study
    payloads = [stand_ins.as_published(p) for p in s.payloads]
    kept = [p for p in range(len(payloads)) if study.writeup_takes(s, p)]  # its CTE types, invalid only unseen ways
    refused = list(study.writeup_refused(s))  # what it sees as invalid, and the 2 CTE types it lacks (resends too)
    keys = frozenset(study.raw_key(payloads[p]) for p in kept)
    return WriteupExpected(
        keys, frozenset(json.dumps(payloads[p], sort_keys=True, ensure_ascii=False) for p in refused),
        {"committed": len(keys), "deduplicated": len(kept) - len(keys), "None": len(refused)})


def writeup_problems(want: WriteupExpected, returned: Mapping[str, int], keys: set[str],
                     quarantined: set[str]) -> list[str]:
    """Why a write-up run is not exact (empty when every payload is accounted for as its model decides).
    ``returned``: its tasks' returns counted (``str`` of each result; a state for a task that did not succeed)."""
    problems: list[str] = []
    if {k: v for k, v in returned.items() if v} != {k: v for k, v in want.returned.items() if v}:
        problems.append(f"tasks returned {dict(returned)}, want {dict(want.returned)}")
    if frozenset(keys) != want.keys:
        problems.append(f"committed {len(keys)} keys ({len(keys ^ want.keys)} differ), want the {len(want.keys)} "
                        "its model takes")
    if frozenset(quarantined) != want.quarantined:
        problems.append(f"quarantined {len(quarantined)} ({len(quarantined ^ want.quarantined)} differ), want the "
                        f"{len(want.quarantined)} payloads its model refuses")
    return problems


def one_writeup(events: int) -> int:
    """One measurement of the write-up's program (one Redis queue, one worker at ``-c 2``, its model); 0 when exact."""
    from case_studies.cte_ingestion import stand_ins, study
    from case_studies.cte_ingestion.events import generate
    from case_studies.cte_ingestion.metrics import CteMetrics
    from lab import harness
    from lab.runner import new_run_id
    from lab.waiting import wait_until
    from lab.workers import STOP_GRACE
    from sqlalchemy import select

    fm = study.program("broken")
    harness.reset(fm)
    ledger = study.open_ledger(clear=True)
    stand_ins.plan_faults(fm.app, {})
    stand_ins.set_outage(fm.app, False)
    run_id = new_run_id()
    folder = study.metrics_folder(fm.short, run_id)
    s = generate(study.SEED, events, invalid_every=study.INVALID_EVERY, duplicate_every=study.DUPLICATE_EVERY)
    payloads = [stand_ins.as_published(p) for p in s.payloads]  # the same values, under its field names
    want = writeup_expected(s)
    specs = study.worker_specs(fm, study.SCENARIOS["burst"], folder)
    with harness.running_workers(fm, run_id, "bench-cte-writeup", specs, STOP_GRACE,
                                 after=lambda: harness.purge(fm)) as workers:
        watch = harness.Watch(workers)
        drain = study.Drain(fm, CteMetrics())
        started = time.monotonic()
        sent = cast("list[Any]", cast(Any, fm.submit)(payloads))
        accepted = time.monotonic() - started
        first = sum(drain.sample())
        ids = [str(r.id) for r in sent]
        pending = list(ids)

        def handled() -> bool:
            nonlocal pending
            watch()
            if sum(drain.sample()):  # messages still in its list: nothing to read yet
                return False
            states = _states(fm, pending)
            pending = [i for i in pending if states[i][0] not in ("SUCCESS", "FAILURE")]
            return not pending and ledger.counts().quarantined >= len(want.quarantined)

        done = wait_until(handled, DRAIN_TIMEOUT, interval=0.25)
        drained = time.monotonic() - started
        drain.close()
    counts = ledger.counts()
    final = _states(fm, ids)
    returned = Counter(str(r) if st == "SUCCESS" else st for st, r in (final[i] for i in ids))
    with ledger.engine.connect() as conn:
        keys = {str(k) for k in conn.execute(select(ledger.events_table.c.key)).scalars()}
    problems = [*([] if done else [f"not drained within {DRAIN_TIMEOUT:.0f}s"]),
                *writeup_problems(want, returned, keys, set(ledger.quarantined()))]
    result({"program": "write-up", "shards": 0, "ledger": ledger.engine.dialect.name, "events": events,
            "messages": len(sent), "accepted": round(accepted, 2), "depth_after": first, "drained": round(drained, 2),
            "committed": counts.committed, "quarantined": counts.quarantined,
            "deduplicated": returned["deduplicated"], "out_of_order": counts.out_of_order_commits,
            "exact": not problems, "problem": "; ".join(problems)})
    return 0 if not problems else 1


def child(args: list[str], env: dict[str, str]) -> tuple[int, dict[str, Any] | None]:
    """Run one measurement in a process of its own, echoing its output; its status and its result line."""
    proc = subprocess.Popen([sys.executable, __file__, "--one", *args], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    found: dict[str, Any] | None = None
    if proc.stdout is None:
        raise RuntimeError("the measurement's output was not piped")
    for line in proc.stdout:
        print(line, end="", flush=True)
        if line.startswith("RESULT "):
            found = cast(dict[str, Any], json.loads(line.removeprefix("RESULT ")))
    return proc.wait(), found


def summary(runs: list[dict[str, Any]]) -> None:
    print("\nsummary: drained seconds per run (exact runs only), median; the write-up's out-of-order commits")
    keys = sorted({(str(r["ledger"]), str(r["program"]), int(r["shards"])) for r in runs},
                  key=lambda k: (k[0], k[1] != "write-up", k[2]))
    for ledger, program, shards in keys:
        mine = [r for r in runs if (r["ledger"], r["program"], r["shards"]) == (ledger, program, shards)]
        times = [float(r["drained"]) for r in mine if r["exact"]]
        label = f"{program}{f' {shards} shard(s)' if program == 'fixed' else ' (1 queue, -c 2)'}"
        rest = (f"median {statistics.median(times):.1f}s, {mine[0]['events'] / statistics.median(times):.0f} events/s"
                if times else "no exact run")
        order = (f"; out-of-order commits {', '.join(str(r['out_of_order']) for r in mine)}" if program == "write-up"
                 else "")
        print(f"  {ledger:<10} {label:<24} {' / '.join(f'{t:.1f}' for t in times):<24} {rest}; "
              f"{len(times)} of {len(mine)} exact{order}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=10_000)
    p.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4], help="the fixed program's shard counts")
    p.add_argument("--programs", choices=("fixed", "write-up"), nargs="+", default=["write-up", "fixed"])
    p.add_argument("--rounds", type=int, default=1, help="rounds of every measurement, the order reversed each round")
    p.add_argument("--postgres", action="store_true", help="also with the ledger in PostgreSQL")
    p.add_argument("--one", choices=("fixed", "write-up"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one == "fixed":
        return one_fixed(args.events)
    if args.one == "write-up":
        return one_writeup(args.events)
    from lab import services, workers
    from lab.settings import NAMESPACE
    services.ensure()
    print(f"cte bench: namespace {NAMESPACE}, {os.cpu_count()} CPUs, {args.events:,} events, {args.rounds} round(s)",
          flush=True)
    ledgers: list[str | None] = [None, POSTGRES_URL] if args.postgres else [None]
    plan = [(program, shards) for program in args.programs
            for shards in (args.shards if program == "fixed" else [0])]
    status, runs = 0, list[dict[str, Any]]()
    started = time.monotonic()
    try:
        with workers.NamespaceLock():  # one run per namespace; the measurements' processes run under it
            workers.stop_leftovers()
            for r in range(args.rounds):
                for url in ledgers:
                    for program, shards in (plan if r % 2 == 0 else plan[::-1]):
                        env = {**os.environ}
                        if shards:
                            env["CTE_SHARDS"] = str(shards)
                        if url:
                            env["RCL_LEDGER_URL"] = url
                        else:
                            env.pop("RCL_LEDGER_URL", None)
                        code, found = child([program, "--events", str(args.events)], env)
                        status |= code
                        if found is not None:
                            runs.append(found)
    finally:  # once the lock is released: --clean takes it (and refuses a namespace another run holds)
        subprocess.run([sys.executable, "run_all_fms.py", "--clean"], cwd=ROOT, env=os.environ, check=False,
                       stdout=subprocess.DEVNULL)
    summary(runs)
    print(f"whole bench {time.monotonic() - started:.0f}s; {sum(1 for r in runs if not r['exact'])} run(s) not exact, "
          f"{len(plan) * len(ledgers) * args.rounds - len(runs)} without a result; namespace {NAMESPACE} cleaned")
    return status


if __name__ == "__main__":
    sys.exit(main())
