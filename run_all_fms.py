"""Run the lab: every failure mode against the real RabbitMQ and Redis.

    python run_all_fms.py                      # fm1..fm6, each checks its guarantees
    python run_all_fms.py --only fm3           # one FM (short or full name)
    python run_all_fms.py --include-fm0        # also show fm0's bug (S1)
    python run_all_fms.py --case-studies       # also the case studies (--only severity_batch: that one)
    python run_all_fms.py --prove              # also run scenario N on FM N-1 (symptom SN)
    python run_all_fms.py --prove --include-fm0 --report
                                               # also write the workshop report (one HTML file,
                                               # .lab/<namespace>/report.html unless a PATH follows)
    python run_all_fms.py --json               # also write the results as JSON (for make matrix;
                                               # .lab/<namespace>/results.json unless a PATH follows)
    python run_all_fms.py --down               # stop what the lab started (not a live run's workers:
                                               # --down --force stops that run too)
    python run_all_fms.py --clean              # also delete the namespace's queues, exchanges and keys
    python run_all_fms.py --diff fm4           # the code change from fm3 to fm4 (FM-4's lesson)
    python run_all_fms.py --diff               # every step, fm0 -> fm1 -> ... -> fm6
    python run_all_fms.py --exercise fm3       # write lesson fm3's exercise (./exercises/, or a FOLDER after it)
    python run_all_fms.py --check FILE         # check your exercise under the lesson's faults
    python run_all_fms.py --hint fm3 2         # hint 2 of 3 (3: the lab's fix)
    python run_all_fms.py --jobs 1             # one run after another (default: up to 4 at once, as make
                                               # lab); the output, the report and the exit status are the same

While it works it shows the FM, the stage and the elapsed time (live on a
terminal, one line per stage elsewhere); after each FM, what happened to each
document of its runs (``lab.show.timeline``).

Every output path (``--report``, ``--json``) is opened for writing before anything runs
(a file made for that is removed again, and written at the end); with case studies selected,
a ledger URL of the user's (``RCL_LEDGER_URL``) must answer before anything runs too.

Exit status: 0 when every selected check holds; 1 when a check does not (a FAIL
or NOT REPRODUCED); 2 for bad input, missing services, a namespace another run
holds, an output path that cannot be written or a ledger that does not answer
(said before anything runs), and for ``--down`` refusing a live run; 3
when a run ended in ERROR (its worker died, a service stopped answering or its
deadline passed: the lab could not tell); 128 + the signal's number when
interrupted (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP), after stopping its
workers and emptying the queues of the run it interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import functools
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from rich.console import Console
from rich.syntax import Syntax

from lab import down, exercise, exercise_check, harness, owned, records, services, waiting, workers
from lab import metrics as lab_metrics
import lessons
from lab.fm import ROOT
from lab.records import HarnessError, RunReport
from lab.settings import NAMESPACE, backend_url, broker_url, mask_url
from lab.show import diff, report, results
from lab.show.progress import Board

DEFAULT_REPORT = workers.STATE_DIR / "report.html"
DEFAULT_JSON = workers.STATE_DIR / "results.json"
"""Where ``--report`` and ``--json`` without a PATH write (under ``.lab/``, which git ignores)."""


DEFAULT_JOBS = 4
"""Runs at once unless ``--jobs`` says otherwise: a lesson's three cells (fixed, broken, before its hard fix) run
different programs, each in its own namespace of queues and keys and with owned services of its own run. Four on
two cores: a run mostly waits (slow documents, time limits, deploys' graces, outages), and since the hang in C
code stopped spinning (``lab.faults.C_HANG``) four at once took ``make lab`` 33 s and the handout 57 s, against
36 to 38 s and 70 s for three (2026-12-07, idle two-core machine)."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="run_all_fms.py", description="reliable-celery-lab: run the failure modes")
    p.add_argument("--only", nargs="+", metavar="FM", help="FMs to run, short (fm3) or full (fm3_dlq_reconciliation) names")
    p.add_argument("--include-fm0", action="store_true", help="also run fm0 and expect its bug (S1)")
    p.add_argument("--case-studies", action="store_true", help="also run every case study (case_studies/), "
                   "with --prove its write-up's symptoms too")
    p.add_argument("--prove", action="store_true", help="also run scenario N on FM N-1's code and expect symptom SN")
    p.add_argument("--report", type=Path, nargs="?", const=DEFAULT_REPORT, metavar="PATH",
                   help="write the workshop report (one self-contained HTML file) to PATH "
                   f"(no PATH: {DEFAULT_REPORT.relative_to(ROOT)})")
    p.add_argument("--metrics", action="store_true", help="after the summary, print the runs' Prometheus metrics "
                   "(failures by envelope reason, attempts, DLQ depth and drain age; a case study's own series)")
    p.add_argument("--json", type=Path, nargs="?", const=DEFAULT_JSON, metavar="PATH",
                   help="write the results (the versions, each run's verdict and checks) as JSON to PATH "
                   f"(no PATH: {DEFAULT_JSON.relative_to(ROOT)})")
    p.add_argument("--down", action="store_true", help="stop workers and services the lab started, then exit; a run "
                   "that is live in the namespace is not stopped (exit 2) unless --force is given too")
    p.add_argument("--force", action="store_true", help="with --down: stop a live run too (SIGTERM: it stops its workers)")
    p.add_argument("--clean", action="store_true", help="stop this namespace's workers and delete its queues, "
                   "exchanges and Redis keys (nothing else), then exit")
    p.add_argument("--diff", nargs="*", metavar="FM", help="print the code change that makes each FM from the one before "
                   "(docstrings left out), then exit; no name: every step")
    p.add_argument("--exercise", nargs="+", metavar=("FM", "FOLDER"), help="write the exercise of lesson FM (the "
                   "program before it, its docstring now your task) into FOLDER (default ./exercises/), then exit; "
                   "an existing file is kept unless --force")
    p.add_argument("--check", type=Path, metavar="FILE", help="run the lesson's scenario and faults on your exercise "
                   "FILE and say which guarantee held; exit 0 only when all did")
    p.add_argument("--focus", nargs="+", metavar="NAME", default=[], help=argparse.SUPPRESS)  # the lab's own tests
    p.add_argument("--hint", nargs="+", metavar=("FM", "STEP"), help="hint STEP (1: where to look, 2: which setting or "
                   "primitive, 3: the lab's fix) for lesson FM's exercise, then exit")
    p.add_argument("--jobs", type=int, default=DEFAULT_JOBS, metavar="N",
                   help=f"run up to N runs at once, never two on the same code (default {DEFAULT_JOBS}: a lesson's fixed, "
                   "broken and hard-variant runs and one more; 1: one after another); timelines, report and results "
                   "come out as a serial run's")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error("--jobs takes a whole number from 1 up")
    if args.force and not (args.down or args.exercise):
        p.error("--force goes with --down (it stops a live run) or --exercise (it replaces your file)")
    if args.exercise is not None and len(args.exercise) > 2 or args.hint is not None and len(args.hint) > 2:
        p.error("--exercise takes FM [FOLDER], --hint FM [STEP]")
    if args.hint is not None and len(args.hint) == 2 and not args.hint[1].isdigit():
        p.error("--hint FM STEP: STEP is 1, 2 or 3")
    return args


def selected(args: argparse.Namespace) -> list[str]:
    chosen = harness.resolve(list(args.only)) if args.only else list(lessons.FMS)
    studies = [case.name for case in lessons.CASE_STUDIES] if args.case_studies else []
    return [*chosen, *(s for s in studies if s not in chosen)]


def summary_table(reports: list[RunReport], prove: bool) -> str:
    """One row per FM (and per case-study scenario): fixed, broken (for a case study: its
    write-up), and the hard variant before its fix."""
    rows = records.matrix(reports)
    width = max([5, *(len(r.fm) for r in rows)])
    head = f"{'broken / write-up (symptom)':<28} hard variant, before its fix" if prove else ""
    lines = [f"{'FM':<{width}} {'fixed (guarantees)':<34} {head}".rstrip()]
    for row in rows:
        fixed, broken, weak = row.fixed, row.broken, row.weak
        left = f"{fixed.verdict} {' '.join(c.label for c in fixed.checks)}" if fixed else "-"
        middle = f"{broken.verdict} {' '.join(c.label for c in broken.checks)} (on {broken.code})" if broken else ""
        right = f"{weak.verdict} {' '.join(c.label for c in weak.checks)} (on {weak.code})" if weak else ""
        lines.append(f"{row.fm:<{width}} {left:<34} {middle:<28} {right}".rstrip())
    return "\n".join(lines)


def check_output(path: Path, option: str = "--report", example: str = "lab-report.html") -> None:
    """Refuse, before the run, an output path that cannot be written, by opening it for writing
    (permission bits say nothing to root, nor about /proc or a read-only mount). A file made by
    this test is removed again; the run writes it at the end."""
    if path in (DEFAULT_REPORT, DEFAULT_JSON):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HarnessError(f"{option}: cannot make {path.parent} ({exc.strerror or exc}); give a PATH") from None
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise HarnessError(f"{option} {path} is a folder; give a file name, e.g. {path / example}")
    if not folder.is_dir():
        raise HarnessError(f"{option} {path}: the folder {folder} does not exist")
    existed = path.exists()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)  # no O_TRUNC: a file there stays as it is until the end
    except OSError as exc:
        raise HarnessError(f"{option} {path}: cannot write there ({exc.strerror or exc}); give a file in a folder "
                           f"you can write to, or {option} alone for {(workers.STATE_DIR / example).relative_to(ROOT)}"
                           ) from None
    os.close(fd)
    if not existed:
        path.unlink(missing_ok=True)


def check_ledger(fms: list[str]) -> None:
    """With a case study selected, a ledger URL of the user's (``RCL_LEDGER_URL``) must answer now."""
    if not any(harness.is_case(fm) for fm in fms):
        return
    from case_studies.ledger_base import ledger_problem  # SQLAlchemy only when a case study runs

    if (problem := ledger_problem()) is not None:
        raise HarnessError(problem)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.down:
        return down.down(force=args.force)
    if args.exercise is not None:
        return exercise.exercise_command(args.exercise[0], Path(args.exercise[1]) if len(args.exercise) > 1 else None,
                                         args.force)
    if args.hint is not None:
        return exercise.hint_command(args.hint[0], int(args.hint[1]) if len(args.hint) > 1 else 1)
    if args.diff is not None:
        try:
            return print_diffs(harness.resolve(list(args.diff)) if args.diff else [])
        except HarnessError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if sys.__stderr__ is not None:  # `kill -USR1 <pid>` prints where every thread of the lab is waiting
        faulthandler.register(signal.SIGUSR1, file=sys.__stderr__.fileno(), all_threads=True)
    handlers = {sig: signal.signal(sig, waiting.interrupt) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        return exercise_check.check_command(args.check, args.focus) if args.check is not None else _run(args)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        waiting.forget_interrupts()


def _run(args: argparse.Namespace) -> int:
    try:
        fms = selected(args)
        if args.report is not None:
            check_output(args.report, "--report", "report.html")
        if args.json is not None:
            check_output(args.json, "--json", "results.json")
        check_ledger(fms)
        services.ensure()
        with workers.NamespaceLock():
            try:
                workers.stop_leftovers()
                for name in owned.stop_leftovers():
                    print(f"stopped the lab's own {name} left running by an earlier run in namespace {NAMESPACE}")
                workers.prune_logs()
                if args.clean:
                    harness.clean()
                    if failed := owned.remove_failed():
                        print(f"namespace {NAMESPACE}: removed what failed starts of the lab's own services left: "
                              f"{', '.join(failed)}")
                    return 0
                print(f"namespace {NAMESPACE}: broker {mask_url(broker_url())}, backend {mask_url(backend_url())}", flush=True)
                runs = harness.plan(fms, args.include_fm0, args.prove)
                harness.refuse_busy_queues(harness.codes_of(runs))
                try:
                    reports = run_plan(runs, args.jobs)
                finally:
                    workers.wait_stopped()  # no worker outlives the command
            except KeyboardInterrupt as exc:
                return _interrupted(exc)
    except (HarnessError, services.ServiceError, workers.NamespaceBusy) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # before the lock was taken: nothing started yet
        return _interrupted(exc)
    print()
    print(summary_table(reports, args.prove))
    print(f"namespace {NAMESPACE}; worker logs in {workers.LOG_DIR}")
    if args.metrics:
        print()
        print(lab_metrics.exposition(reports), end="")
    if args.report is not None:
        try:
            print(f"report: {report.write(args.report, reports)}")
        except OSError as exc:
            print(f"error: cannot write the report: {exc}", file=sys.stderr)
            return 2
    if args.json is not None:
        try:
            print(f"results: {results.write(args.json, reports)}")
        except OSError as exc:
            print(f"error: cannot write the results: {exc}", file=sys.stderr)
            return 2
    if any(r.error is not None for r in reports):
        return 3
    return 0 if reports and all(r.ok for r in reports) else 1


def _interrupted(exc: KeyboardInterrupt) -> int:
    """Ctrl-C, SIGTERM or SIGHUP: stop this namespace's workers, empty the interrupted run's queues.

    A second interruption during this cleanup cuts it short (the workers are killed
    first, so none is left either way)."""
    waiting.forget_interrupts()  # this one is being handled
    try:
        workers.stop_leftovers(say=lambda _: None)
        for interrupted in harness.interrupted_fms():
            harness.empty_interrupted(interrupted)  # its messages (a poison one too) go with its queues
    except KeyboardInterrupt:
        workers.stop_leftovers(say=lambda _: None)
        print("interrupted again: queues not emptied", file=sys.stderr)
    except Exception as cleanup:  # a dead service must not turn Ctrl-C into a traceback
        print(f"could not empty the interrupted run's queues: {cleanup}", file=sys.stderr)
    signum = exc.signum if isinstance(exc, waiting.Interrupted) else signal.SIGINT
    print(f"interrupted by {signal.Signals(signum).name}: workers stopped", file=sys.stderr)
    return 128 + signum


def print_diffs(fms: list[str], out: TextIO | None = None) -> int:
    """Each FM's change from the one before: coloured on a terminal, plain in a pipe."""
    console = Console(file=out or sys.stdout, highlight=False, soft_wrap=True)
    wanted = [s for s in diff.steps() if not fms or s.fm in fms]
    for fm in fms:
        if fm == "fm0":
            console.print("fm0 is where the lab starts: it has no previous FM to differ from.")
    for s in wanted:
        title = f"{s.fm}: {s.before}.py -> {s.after}.py ({len(s.added)} lines added, {len(s.removed)} removed)"
        if console.is_terminal:
            console.rule(f"{s.fm}: {s.after}.py (+{len(s.added)} -{len(s.removed)})", style="bold")
            console.print(Syntax(s.text, "diff", theme="ansi_dark", background_color="default", word_wrap=False))
        else:
            console.print(f"== {title}\n{s.text}\n", markup=False)
    return 0


def run_plan(runs: list[tuple[str, records.Kind]], jobs: int = 1) -> list[RunReport]:
    """Every run of the plan, with live progress, and each FM's timelines once its runs are done
    (in the plan's order, whatever order the runs end in). ``jobs`` > 1: that many runs at once."""
    reports: list[RunReport | None] = [None] * len(runs)
    shown = 0  # the FMs whose timelines are out, in the plan's order
    fms = list(dict.fromkeys(fm for fm, _ in runs))

    with Board(len(runs)) as board:

        def run(i: int) -> None:
            fm, kind = runs[i]
            bug = next((r for r in reports if r is not None and r.kind == "bug"), None)
            if kind == "broken" and fm == "fm1" and bug is not None:  # fm0's run is fm1's broken cell
                r = dataclasses.replace(bug, fm="fm1", kind="broken")
            else:
                r = harness.run_one(fm, kind, functools.partial(board.stage, fm, kind))
            reports[i] = r
            board.finished(harness.describe(r), r.ok, (fm, kind))

        def show_done() -> None:
            nonlocal shown
            while shown < len(fms) and all(r is not None for r, (fm, _) in zip(reports, runs) if fm == fms[shown]):
                board.timelines(fms[shown], [r for r, (fm, _) in zip(reports, runs) if fm == fms[shown] and r is not None])
                shown += 1

        if jobs == 1:
            for i in range(len(runs)):
                run(i)
                show_done()
        else:
            run_at_once(runs, jobs, run, show_done)
    return [r for r in reports if r is not None]


JOIN_SECONDS = 15.0
"""How long an interrupted --jobs run waits for its runs to see the interruption (each does at its next look)."""


def run_at_once(runs: list[tuple[str, records.Kind]], jobs: int, run: Callable[[int], None],
                 after_each: Callable[[], None]) -> None:
    """``run(i)`` for every run, up to ``jobs`` at once on threads, never two runs of the same code
    at once (they share its queues and keys); the longest scenarios first. fm1's broken cell is fm0's
    run, so it follows it (the same code). An interruption reaches every run through
    ``lab.waiting``; the first error of a run (a ``HarnessError``) ends the plan once the others stop."""
    left = sorted(range(len(runs)), key=lambda i: (-_weight(runs[i]), i))
    busy: dict[int, tuple[threading.Thread, str]] = {}
    errors: list[BaseException] = []
    done = threading.Event()

    def body(i: int) -> None:
        try:
            run(i)
        except BaseException as exc:  # an interruption or a HarnessError: the main thread raises it
            errors.append(exc)
        finally:
            done.set()

    try:
        while left or busy:
            for i in list(left):
                if len(busy) >= jobs or errors:
                    break
                code = _resource(runs[i])
                if code in (c for _, c in busy.values()):
                    continue
                left.remove(i)
                thread = threading.Thread(target=body, args=(i,), name=f"run-{runs[i][0]}-{runs[i][1]}", daemon=True)
                busy[i] = (thread, code)
                thread.start()
            done.wait(waiting.POLL_SECONDS * 5)
            done.clear()
            waiting.raise_if_interrupted()
            for i in [i for i, (t, _) in busy.items() if not t.is_alive()]:
                del busy[i]
            after_each()
            if errors and not busy:
                raise errors[0]
    except KeyboardInterrupt:  # each run raises it too at its next look; their workers are stopped after
        for thread, _ in list(busy.values()):
            thread.join(JOIN_SECONDS)
        raise


def _resource(run: tuple[str, records.Kind]) -> str:
    """What two runs must not use at once: an FM's code (its queues and keys); every case study's cells
    go one after another."""
    fm, kind = run
    return "case studies" if harness.is_case(fm) else harness.code_of(fm, kind)


def _weight(run: tuple[str, records.Kind]) -> int:
    """Which runs to start first: scenario N's grow with N; a case study's go after the FMs'."""
    fm, _ = run
    return -1 if harness.is_case(fm) else max(harness.number(fm), 1)  # fm0 before fm1's broken cell, its copy


if __name__ == "__main__":
    sys.exit(main())
