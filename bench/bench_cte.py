"""Benchmark: case study 3 (``case_studies/cte_ingestion/fixed.py``), a burst of CTEs on this machine.

    RCL_NAMESPACE=cte3 python bench/bench_cte.py                  # 10,000 events, 1, 2 and 4 shards, SQLite
    RCL_NAMESPACE=cte3 python bench/bench_cte.py --postgres       # the ledger in PostgreSQL as well
    RCL_NAMESPACE=cte3 python bench/bench_cte.py --shards 4 --events 2000

Each measurement runs the fixed program as the lab runs it, every fix on: its shard queues
reset (``x-single-active-consumer``), the ledger cleared, one worker per shard (``-Q`` its
shard, ``-c 1``, prefetch 1, acks late) started by ``lab.harness.running_workers`` with
``CTE_SHARDS`` and a fresh ``PROMETHEUS_MULTIPROC_DIR`` in their environment, then the burst
(``events.generate``: invalid payloads and resends in it, no ledger faults) published
through the program's own ``submit``. Two times:

- accepted: from the call to ``submit`` until it returned, every message handed to the broker
  (publisher confirms are off, as in Celery's default; the broker has them all once the
  channel's frames are written and the queues' depths add up, which the first sample shows);
- drained: from the same start until the metrics count every payload handled (each process's
  counters gathered from the multiprocess folder, polled every 0.25 s).

The queue depth per shard is printed about once a second while it falls. A run counts only if
it is exact: the ledger holds every valid distinct event once, quarantined equals the invalid
payloads, each lot committed in the order produced, zero out-of-order commits, and the metrics'
outcomes equal the ledger's; anything else is printed as FAILED. Each shard count runs in a
process of its own (``CTE_SHARDS`` is read when the program is imported). The namespace
(``RCL_NAMESPACE``, default ``rclbench-cte``) is cleaned at the end. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("RCL_NAMESPACE", "rclbench-cte")  # before anything from lab is imported; workers inherit it

POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def one(events: int) -> int:
    """One measurement with ``CTE_SHARDS`` shards; prints one result line; 0 when exact."""
    from case_studies.cte_ingestion import study
    from case_studies.cte_ingestion.events import generate
    from case_studies.cte_ingestion.metrics import CteMetrics, exporter_registry, outcomes, read
    from lab import harness
    from lab.runner import new_run_id
    from lab.settings import mask_url
    from lab.waiting import wait_until
    from lab.workers import STOP_GRACE

    fm = study.program("fixed")
    shards = len(fm.task_queues)
    harness.reset(fm)
    ledger = study.open_ledger(clear=True)
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

        done = wait_until(handled, 300, interval=0.25)
        drained = time.monotonic() - started
        drain.sample()
        drain.close()
    counts = ledger.counts()
    got = outcomes(read(exporter_registry(folder)))
    dups = Counter(("deduplicated", str(s.payloads[p]["supplier_id"])) for p in s.duplicates)
    want = {**{k: v for k, v in ledger.by_supplier().items() if v}, **dups}
    seqs = ledger.lot_sequences()
    exact = (done and counts.committed == s.valid_distinct and counts.quarantined == len(s.invalid)
             and counts.out_of_order_commits == 0 and counts.out_of_order_attempts == 0 and got == want
             and seqs == {lot: list(v) for lot, v in s.lot_sequences.items()})
    db = "postgresql" if ledger.engine.dialect.name == "postgresql" else "sqlite"
    verdict = "exact" if exact else (f"FAILED: committed {counts.committed}/{s.valid_distinct}, quarantined "
                                     f"{counts.quarantined}/{len(s.invalid)}, out of order {counts.out_of_order_commits}, "
                                     f"metrics {'==' if got == want else '!='} ledger")
    print(f"RESULT shards={shards} ledger={db} events={events} messages={messages} accepted={accepted:.2f}s "
          f"(depth {first} right after) drained={drained:.1f}s rate={events / drained:.0f}/s {verdict} "
          f"[{mask_url(ledger.url)}]", flush=True)
    return 0 if exact else 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=10_000)
    p.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--postgres", action="store_true", help="also with the ledger in PostgreSQL")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        return one(args.events)
    from lab import services
    services.ensure()
    ledgers: list[str | None] = [None, POSTGRES_URL] if args.postgres else [None]
    status = 0
    try:
        for url in ledgers:
            for shards in args.shards:
                env = {**os.environ, "CTE_SHARDS": str(shards)}
                if url:
                    env["RCL_LEDGER_URL"] = url
                else:
                    env.pop("RCL_LEDGER_URL", None)
                done = subprocess.run([sys.executable, __file__, "--one", "--events", str(args.events)], env=env,
                                      cwd=ROOT)
                status |= done.returncode
    finally:
        subprocess.run([sys.executable, "run_all_fms.py", "--clean"], cwd=ROOT, env=os.environ, check=False,
                       stdout=subprocess.DEVNULL)
    return status


if __name__ == "__main__":
    sys.exit(main())
