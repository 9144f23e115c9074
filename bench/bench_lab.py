"""Benchmark: run the whole lab N times and print wall times per FM and in all.

    python bench/bench_lab.py            # 5 runs of `python run_all_fms.py`
    python bench/bench_lab.py -n 10 --prove

Per FM it prints the minimum and the median of the run's own time (reset, worker
start, scenario, checks, worker stop), and for the whole command the same plus
how many runs passed. This is a measurement, not a test: nothing fails on time.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^(fm\d) (fixed|broken|bug) \(scenario \d on fm\d, ([\d.]+)s\): (.+)$")


def main() -> int:
    p = argparse.ArgumentParser(description="Run the whole lab N times and print wall times.")
    p.add_argument("-n", "--runs", type=int, default=5)
    p.add_argument("--prove", action="store_true", help="bench `run_all_fms.py --prove` instead")
    args = p.parse_args()
    cmd = [sys.executable, "run_all_fms.py", *(["--prove"] if args.prove else [])]
    per_cell: dict[str, list[float]] = {}
    whole: list[float] = []
    passed = 0
    for i in range(args.runs):
        started = time.monotonic()
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        whole.append(time.monotonic() - started)
        passed += done.returncode == 0
        for line in done.stdout.splitlines():
            if m := LINE.match(line):
                per_cell.setdefault(f"{m[1]} {m[2]}", []).append(float(m[3]))
        print(f"run {i + 1}/{args.runs}: {whole[-1]:.1f}s, exit {done.returncode}", flush=True)
    print(f"\n{'cell':<14} {'min':>7} {'median':>7}")
    for cell, times in per_cell.items():
        print(f"{cell:<14} {min(times):>6.1f}s {statistics.median(times):>6.1f}s")
    print(f"{'whole':<14} {min(whole):>6.1f}s {statistics.median(whole):>6.1f}s   ({passed}/{args.runs} runs passed: `{' '.join(cmd[1:])}`)")
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
