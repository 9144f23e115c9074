"""``make matrix``: the lab on every Celery version it supports, and one table of what holds where.

For each pin file ``matrix/celery-<X.Y>.txt`` (every package pinned: that Celery's latest
patch release, the kombu and redis-py it supports, the lab's other pins, pytest) it
builds ``.lab/matrix/celery-<X.Y>`` (a venv; kept while its pins are unchanged: a stamp
holds their hash), then runs, with that venv's Python, in the caller's namespace
(``RCL_NAMESPACE``; the lab steps one after the other and, beside them, the pytest steps one after the
other: ``lanes`` says why):

1. ``run_all_fms.py --prove --include-<naive> --case-studies --json ...``: every FM fixed,
   broken and weak, the naive program, and the case studies fixed and as its write-up has it;
2. ``pytest`` on ``CLAIMS_TESTS`` with ``RCL_CLAIMS_JSON``: the runs behind the
   docstrings' claims about Celery (``tests/conftest.py`` says how a claim reports);
3. the audit's tests (``AUDIT_TESTS``; no broker needed): row A1, since the audit reads the Celery it runs on.

Then it prints one table: a row per guarantee, symptom and claim (G1..G6, S1..S6, the
hard variants, SB1..SB6, C1..), a column per version, each cell ``pass``, ``fail`` (the
claim does not hold on that version, as its docstring says; the run checked what the
version does instead), ``n/a`` (it cannot apply there) or ``FAIL`` (it should have held
and did not), with a one-line reason under the table. The table is also written to
``.lab/matrix/table.txt``; worker logs and each step's output stay under ``.lab/``.

A run that ended in ERROR on one version fails, there, the checks it would have made: an FM's by
its number, a case study's cell those the same cell reported on the other versions; it does not
touch the other versions' cells.

Exit status: 0 when no cell is ``FAIL``; 1 when one is; 2 when an environment cannot be
built, the services do not answer, or ``--table-only`` finds no results yet (it says how to make them).

    python -m lab.matrix                  # every version (make matrix)
    python -m lab.matrix --only 5.5       # one version
    python -m lab.matrix --table-only     # print the table of the last runs again

One piece: the venvs, the steps run in them and the table read from their results share the same paths (``Version``,
``Outputs``); 40 of its lines are the table's few words per check (``TITLES``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import lessons
from lab.fm import ROOT

PINS_DIR = ROOT / "matrix"
ENVS_DIR = ROOT / ".lab" / "matrix"
TABLE_FILE = ENVS_DIR / "table.txt"
STAMP = "rcl-pins.sha256"
LAB_ARGS = ("--prove", f"--include-{lessons.NAIVE}", "--case-studies", "--jobs", "2")
"""Two runs at once (never two on the same program's code): make matrix within CI's 40 minutes with the backend outage's
lesson in. Three at once was no faster on 2026-12-07 (5.6.3's lab step 293 s, against 276 s with two the day before)."""
CLAIMS_TESTS = ("tests/test_celery_claims.py", "tests/test_stored_members.py", "tests/test_chain_dedup.py")
AUDIT_TESTS = ("tests/test_audit_rules.py", "tests/test_audit_lab.py", "tests/test_audit_corpus.py",
               "tests/test_audit_origins.py", "tests/test_audit_accept.py")
"""The audit's tests (issue 39): the audit reads the installed Celery, so they run on each version too (row A1)."""

State = Literal["pass", "fail", "n/a", "FAIL"]


@dataclass(frozen=True)
class Cell:
    state: State
    reason: str = ""


@dataclass(frozen=True)
class Row:
    label: str
    title: str
    cells: Mapping[str, Cell]  # version -> cell


TITLES: dict[str, str] = {
    "A1": "the audit's tests (tests/test_audit_*.py) pass on this Celery",
    **lessons.words(),  # each lesson's checks, in words (lessons/<name>/checks.py)
    "SB1": "batch signed with the exact counts",
    "SB2": "ledger holds each row once",
    "SB3": "chunk retries with growing gaps",
    "SB4": "a second submission changes nothing",
    "SB5": "a dead chunk: reconcile fails closed, flagged",
    "SB6": "a straggler past result_expires: still signed",
    "SB5 write-up": "dead chunk: ChordError, neither signed nor flagged",
    "SB6 write-up": "straggler: size key expired, never reconciled",
    "BL1": "booked + dead-lettered + rejected == consignments",
    "BL2": "each B/L booked once",
    "BL3": "one JSON line per dead-letter, replay, aggregate",
    "BL4": "retries run out: dead-lettered, the chord completes",
    "BL5": "a killed replayer loses nothing; lists empty",
    "BL6": "a re-sent manifest books nothing twice",
    "BL7": "an aggregate killed mid-forward: booked once",
    "BL8": "a parse past the deadline runs once",
    "BL9": "an outage past the backoff: replay books all",
    "BL10": "a replay never spins on what it cannot mend",
    "BL4 write-up": "retries run out: ChordError, nothing booked",
    "BL5 write-up": "replay: a unit lost, a replayed one never booked",
    "BL6 write-up": "41 units of 40; made-up B/Ls booked again",
    "BL7 write-up": "aggregate killed after SET NX: nothing booked",
    "BL8 write-up": "parse past visibility_timeout: runs again",
    "BL9 write-up": "outage past the backoff: ChordError, lost",
    "BL10 write-up": "replay spins one poison record 200 times",
    "CT1": "ledger rows == valid distinct events; quarantine",
    "CT2": "no out-of-order commit in any lot",
    "CT3": "retries, a crash, a dead letter replayed once",
    "CT4": "metrics == ledger",
    "CT5": "dry run writes nothing",
    "CT6": "no seq sent: each lot committed in the order produced",
    "CT7": "an outage past the backoff: dead-lettered, replayed once",
    "CT1 write-up": "digit patterns: wrong GS1 check digits committed",
    "CT2 write-up": "one shared queue reorders a lot",
    "CT3 write-up": "retries run out: the event is lost",
    "CT7 write-up": "outage past the backoff: FAILURE, acked, lost",
}
"""A few words per lab check (the checks themselves are ``lab.checks`` and the case study's ``study``)."""


# ---- versions and their environments -------------------------------------------------


@dataclass(frozen=True)
class Version:
    name: str  # "5.5"
    pins: Path

    @property
    def env(self) -> Path:
        return ENVS_DIR / f"celery-{self.name}"

    @property
    def python(self) -> Path:
        return self.env / "bin" / "python"

    @property
    def celery(self) -> str:
        """The exact Celery release its pins name (``5.5.3``)."""
        return pinned(self.pins.read_text(), "celery") or self.name


def versions(pins_dir: Path = PINS_DIR) -> list[Version]:
    """One per ``celery-<X.Y>.txt`` in ``pins_dir``, oldest first."""
    found = [Version(p.stem.removeprefix("celery-"), p) for p in pins_dir.glob("celery-*.txt")]
    return sorted(found, key=lambda v: tuple(int(x) for x in v.name.split(".")))


def pinned(pins: str, package: str) -> str | None:
    """The version ``pins`` (a requirements file's text) gives ``package``, or None."""
    wanted = re.sub(r"[-_.]+", "-", package).lower()
    for line in pins.splitlines():
        name, sep, ver = line.split("#", 1)[0].strip().partition("==")
        if sep and re.sub(r"[-_.]+", "-", name.split("[", 1)[0]).lower() == wanted:
            return ver.strip()
    return None


def stamp_of(pins: str) -> str:
    """What an environment built from ``pins`` by this Python records: rebuilt when it changes."""
    return hashlib.sha256(f"{pins}\n{sys.version}\n{sys.base_prefix}".encode()).hexdigest()


class EnvFailed(Exception):
    """An environment could not be built (pip's words follow)."""


def ensure_env(v: Version, say: Callable[[str], None] = print) -> bool:
    """Build ``v``'s venv unless one built from the same pins is there; True when it was built."""
    pins = v.pins.read_text()
    stamp = v.env / STAMP
    if v.python.exists() and stamp.exists() and stamp.read_text().strip() == stamp_of(pins):
        return False
    say(f"celery {v.name}: building {v.env.relative_to(ROOT)} from {v.pins.relative_to(ROOT)}")
    shutil.rmtree(v.env, ignore_errors=True)
    steps = [[sys.executable, "-m", "venv", str(v.env)],
             [str(v.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-r", str(v.pins)]]
    for cmd in steps:
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise EnvFailed(f"celery {v.name}: {' '.join(cmd[2:4])} failed ({done.returncode}):\n"
                            f"{(done.stdout + done.stderr).strip()[-2000:]}")
    stamp.write_text(stamp_of(pins) + "\n")
    return True


# ---- one version's runs ---------------------------------------------------------------


@dataclass(frozen=True)
class Outputs:
    lab: Path  # run_all_fms.py --json
    claims: Path  # RCL_CLAIMS_JSON
    lab_log: Path
    claims_log: Path
    audit: Path  # the audit tests' exit status (JSON)
    audit_log: Path


def outputs(v: Version) -> Outputs:
    base = ENVS_DIR / "results" / f"celery-{v.name}"
    return Outputs(Path(f"{base}-lab.json"), Path(f"{base}-claims.json"), Path(f"{base}-lab.log"),
                   Path(f"{base}-claims.log"), Path(f"{base}-audit.json"), Path(f"{base}-audit.log"))


def steps(v: Version, out: Outputs, env: Mapping[str, str]) -> list[tuple[str, list[str], Path, dict[str, str]]]:
    """What ``run_versions`` runs on ``v``: each step's name, command, log and environment. Only the claims' run
    writes the claims' results (``RCL_CLAIMS_JSON``): any other pytest run with it set would write its own,
    empty, over them."""
    pytest = [str(v.python), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    return [("lab", [str(v.python), "run_all_fms.py", *LAB_ARGS, "--json", str(out.lab)], out.lab_log, dict(env)),
            ("claims", [*pytest, *CLAIMS_TESTS], out.claims_log, {**env, "RCL_CLAIMS_JSON": str(out.claims)}),
            ("audit", [*pytest, *AUDIT_TESTS], out.audit_log, dict(env))]


def prepare(v: Version) -> None:
    """No output of ``v`` left from an earlier run (a step that fails to start leaves no stale result)."""
    out = outputs(v)
    out.lab.parent.mkdir(parents=True, exist_ok=True)
    for stale in (out.lab, out.claims, out.audit):
        stale.unlink(missing_ok=True)


def step_env() -> dict[str, str]:
    namespace = os.environ.get("RCL_NAMESPACE", "rcl")  # the claims' tests derive theirs from it (tests/namespaces.py)
    env = {**os.environ, "RCL_NAMESPACE": namespace, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)  # the venv's own packages, not the caller's
    env.pop("RCL_CLAIMS_JSON", None)
    return env


Step = tuple[Version, str, list[str], Path, dict[str, str]]


def run_step(step: Step, say: Callable[[str], None]) -> None:
    v, what, cmd, log, env = step
    started = time.monotonic()
    with log.open("w") as sink:
        code = subprocess.run(cmd, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL).returncode
    say(f"celery {v.name}: {what} exited {code} after {time.monotonic() - started:.0f}s "
        f"(output: {log.relative_to(ROOT)})")
    if what == "audit":
        outputs(v).audit.write_text(json.dumps({"exit": code, "tests": list(AUDIT_TESTS)}) + "\n")


def lanes(vs: Sequence[Version]) -> tuple[list[Step], list[Step]]:
    """Every version's steps in two lanes that run at once: the lab steps one after the other in the first, the pytest
    steps (claims, then audit) in the second, from the last version back so that the lanes mostly work on different
    versions.

    Why two lanes, each one step at a time: a lab step (two runs at once, about 45 % of two cores on average) keeps the
    CPU half busy, and a claims step (mostly waiting for time limits, graces and redeliveries, about 25 %) fits beside
    it; two lab steps at once would put four runs on two cores, where the lab's deadlines start to fail. The lab's runs
    use the caller's namespace and the tests ``<namespace>-t`` (``tests/namespaces.py``), so the lanes share no queue,
    key or owned server; each version's results go to files of its own."""
    env = step_env()
    per = {v: steps(v, outputs(v), env) for v in vs}
    lab = [(v, what, cmd, log, e) for v in vs for what, cmd, log, e in per[v] if what == "lab"]
    tests = [(v, what, cmd, log, e) for v in reversed(vs) for what, cmd, log, e in per[v] if what != "lab"]
    return lab, tests


def run_versions(vs: Sequence[Version], say: Callable[[str], None] = print) -> None:
    """The lab and the claims on each of ``vs`` (their venvs built), the two lanes of ``lanes`` at once; their JSON
    and logs go to ``outputs(v)``."""
    for v in vs:
        prepare(v)
    lock, stopped = threading.Lock(), threading.Event()

    def said(line: str) -> None:
        with lock:
            say(line)

    def lane(todo: list[Step]) -> None:
        for step in todo:
            if stopped.is_set():  # Ctrl+C: the running steps got it too; start no other
                return
            run_step(step, said)

    threads = [threading.Thread(target=lane, args=(todo,), name=f"matrix-lane-{i}") for i, todo in enumerate(lanes(vs))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            t.join()
    except KeyboardInterrupt:
        stopped.set()
        for t in threads:
            t.join()
        raise


# ---- from results to cells (pure) -------------------------------------------------------


def expected_labels(run: Mapping[str, Any], known: Mapping[tuple[str, str], Sequence[str]] | None = None) -> list[str]:
    """The checks a run of the lab would have reported, for a run that ended in ERROR: an FM's from its
    number; any other's (a case study's cell) as the same cell reported them on another version
    (``known``, ``reported_labels``), else the cell's own name."""
    fm, kind = str(run["fm"]), str(run["kind"])
    if not re.fullmatch(r"fm\d", fm):
        return list((known or {}).get((fm, kind), [])) or [f"{fm} ({kind})"]
    n = int(fm[2:])
    return {"fixed": [f"G{i}" for i in range(1, n + 1)], "broken": [f"S{n}"], "weak": [f"S{n} hard"],
            "bug": ["S1"]}.get(kind, [f"{fm} ({kind})"])


def reported_labels(datas: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """Each cell's (fm, kind) check labels, as the runs that did not end in ERROR reported them, on any version."""
    known: dict[tuple[str, str], list[str]] = {}
    for data in datas:
        for run in cast(list[dict[str, Any]], data.get("runs", [])):
            if not run.get("error"):
                labels = known.setdefault((str(run["fm"]), str(run["kind"])), [])
                labels.extend(str(c["label"]) for c in cast(list[dict[str, Any]], run.get("checks", []))
                              if str(c["label"]) not in labels)
    return known


def lab_cells(data: Mapping[str, Any], known: Mapping[tuple[str, str], Sequence[str]] | None = None) -> dict[str, Cell]:
    """``run_all_fms.py --json`` output -> one cell per check label, over every run that checks it
    (G1 is checked by every FM: it passes only where all of them hold). A run that ended in ERROR fails
    the checks it would have made (``expected_labels``, with ``known`` from the other versions)."""
    seen: dict[str, list[tuple[str, bool, str]]] = {}
    for run in cast(list[dict[str, Any]], data.get("runs", [])):
        where = f"{run['fm']} {run['kind']}"
        if run.get("error"):
            for label in expected_labels(run, known):
                seen.setdefault(label, []).append((where, False, f"ERROR: {str(run['error']).splitlines()[0]}"))
            continue
        for check in cast(list[dict[str, Any]], run.get("checks", [])):
            seen.setdefault(str(check["label"]), []).append((where, bool(check["ok"]), str(check["detail"])))
    cells: dict[str, Cell] = {}
    for label, found in seen.items():
        bad = [(where, detail) for where, ok, detail in found if not ok]
        if bad:
            cells[label] = Cell("FAIL", "; ".join(f"{where}: {detail}" for where, detail in bad))
        else:
            cells[label] = Cell("pass")
    return cells


def claim_cells(data: Mapping[str, Any]) -> tuple[dict[str, Cell], dict[str, str]]:
    """``RCL_CLAIMS_JSON`` output -> a cell per claim label, and each claim's title."""
    cells: dict[str, Cell] = {}
    titles: dict[str, str] = {}
    for claim in cast(list[dict[str, Any]], data.get("claims", [])):
        label, outcome = str(claim["label"]), str(claim["outcome"])
        titles[label] = str(claim["title"])
        if outcome == "passed":
            cells[label] = Cell("fail", str(claim["limit"])) if claim.get("limit") else Cell("pass")
        elif outcome == "skipped":
            cells[label] = Cell("n/a", str(claim.get("message") or "skipped"))
        else:
            cells[label] = Cell("FAIL", f"{outcome}: {claim.get('message') or ''}".strip(": "))
    return cells, titles


def label_key(label: str) -> tuple[int, int, str]:
    """Table order: G, S, S hard, SB, SB write-up, BL, BL write-up, CT, CT write-up, C, then anything else."""
    m = re.fullmatch(r"(SB|BL|CT|G|S|C)(\d+)( .*)?", label)
    if m is None:
        return (19, 0, label)
    prefix, number, rest = m.group(1), int(m.group(2)), (m.group(3) or "").strip()
    group = {"G": 0, "S": 1, "SB": 3, "BL": 5, "CT": 7, "C": 9}[prefix] + (1 if rest else 0)
    return (group, number, rest)


def rows(columns: Mapping[str, Mapping[str, Cell]], titles: Mapping[str, str]) -> list[Row]:
    """Every label any version reported, in table order; a label a version did not report is
    ``FAIL`` there (its run did not get so far)."""
    labels = sorted({label for cells in columns.values() for label in cells}, key=label_key)
    return [Row(label, titles.get(label, TITLES.get(label, "")),
                {v: cells.get(label, Cell("FAIL", "not reported: the run stopped before it")) for v, cells in columns.items()})
            for label in labels]


def failed(table: Iterable[Row]) -> bool:
    return any(cell.state == "FAIL" for row in table for cell in row.cells.values())


LEGEND = ("pass: holds as the lab states it.  n/a: cannot apply on that version.",
          "fail: does not hold on that version, as its docstring says (the run checked what it does instead).",
          "FAIL: should have held and did not (make matrix exits 1).")
NOTE_WIDTH = 100


def render(table: Sequence[Row], headers: Mapping[str, str]) -> str:
    """The grid (a cell with a reason carries a note number) and the numbered reasons under it."""
    notes: list[str] = []
    index: dict[str, int] = {}

    def cell_text(cell: Cell) -> str:
        if not cell.reason:
            return cell.state
        if cell.reason not in index:
            notes.append(cell.reason)
            index[cell.reason] = len(notes)
        return f"{cell.state} [{index[cell.reason]}]"

    body = [[f"{r.label:<12} {r.title}", *(cell_text(r.cells[v]) for v in headers)] for r in table]
    head = ["check", *headers.values()]
    widths = [max(len(line[i]) for line in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(text.ljust(w) for text, w in zip(line, widths)).rstrip() for line in [head, *body]]
    lines.extend(["", *LEGEND])
    for i, note in enumerate(notes, 1):
        lines.extend(textwrap.wrap(f"[{i}] {note}", NOTE_WIDTH, subsequent_indent="    ", break_on_hyphens=False))
    return "\n".join(lines)


def shown(path: Path) -> str:
    """``path`` as printed: from the repository's root when it is under it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def has_results(v: Version) -> bool:
    """Has ``v`` been run (its lab or claims results are there)?"""
    out = outputs(v)
    return out.lab.exists() or out.claims.exists()


def collect(vs: Sequence[Version]) -> tuple[list[Row], dict[str, str]]:
    """The table of the last runs of ``vs`` (their JSON under ``.lab/matrix/results``)."""
    columns: dict[str, dict[str, Cell]] = {}
    titles: dict[str, str] = {}
    headers: dict[str, str] = {}
    labs = {v.name: json.loads(outputs(v).lab.read_text()) for v in vs if outputs(v).lab.exists()}
    audited = any(outputs(v).audit.exists() for v in vs)  # runs from before the audit's row have none
    known = reported_labels(labs.values())
    for v in vs:
        out = outputs(v)
        cells: dict[str, Cell] = {}
        release = v.celery
        if v.name in labs:
            data = labs[v.name]
            release = str(data.get("versions", {}).get("celery", release))
            cells.update(lab_cells(data, known))
        else:
            cells["lab"] = Cell("FAIL", f"no results: see {shown(out.lab_log)}")
        if out.claims.exists():
            found, named = claim_cells(json.loads(out.claims.read_text()))
            cells.update(found or {"claims": Cell("FAIL", f"no claim reported: see {shown(out.claims_log)}")})
            titles.update(named)
        else:
            cells["claims"] = Cell("FAIL", f"no results: see {shown(out.claims_log)}")
        if audited:
            cells["A1"] = audit_cell(out)
        columns[v.name] = cells
        headers[v.name] = f"celery {release}"
    return rows(columns, titles), headers


def audit_cell(out: Outputs) -> Cell:
    """Row A1: the audit's tests on this version (pytest's exit status)."""
    if not out.audit.exists():
        return Cell("FAIL", f"no results: see {shown(out.audit_log)}")
    code = json.loads(out.audit.read_text()).get("exit")
    return Cell("pass") if code == 0 else Cell("FAIL", f"the audit's tests exited {code}: see {shown(out.audit_log)}")


# ---- the command ----------------------------------------------------------------------


EPILOG = """exit status:
  0  no cell is FAIL
  1  a cell is FAIL
  2  an environment cannot be built, the services do not answer, a version is unknown,
     or --table-only finds no results yet (it says how to make them: make matrix)"""


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m lab.matrix", description="the lab on every Celery version it supports",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", metavar="X.Y", help="these versions only (e.g. 5.5)")
    p.add_argument("--table-only", action="store_true", help="print the table of the last runs, run nothing "
                   "(versions not run yet are left out and named; none run yet: exit 2)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    vs = versions()
    if args.only:
        unknown = sorted(set(args.only) - {v.name for v in vs})
        if unknown:
            print(f"error: no pins for {', '.join(unknown)}; known: {', '.join(v.name for v in vs)}", file=sys.stderr)
            return 2
        vs = [v for v in vs if v.name in args.only]
    started = time.monotonic()
    if not args.table_only:
        from lab import services  # the services answer before anything is built or run

        try:
            services.ensure()
            for v in vs:
                built = time.monotonic()
                if ensure_env(v):
                    print(f"celery {v.name}: built in {time.monotonic() - built:.0f}s", flush=True)
            run_versions(vs, say=lambda s: print(s, flush=True))
        except (services.ServiceError, EnvFailed) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:  # the running steps got it too, and ended; none other was started
            print("interrupted (Ctrl+C): no table; the steps' logs are under .lab/matrix/results", file=sys.stderr)
            return 130
    if args.table_only:
        missing = [v for v in vs if not has_results(v)]
        if len(missing) == len(vs):
            print(f"no matrix results yet (none under {shown(ENVS_DIR / 'results')}): "
                  f"make matrix, or python -m lab.matrix{' --only ' + ' '.join(args.only) if args.only else ''}, "
                  "runs the lab on each version and makes them; --table-only prints them again", file=sys.stderr)
            return 2
        for v in missing:
            print(f"celery {v.name}: no results yet (python -m lab.matrix --only {v.name} makes them): left out")
        vs = [v for v in vs if v not in missing]
    table, headers = collect(vs)
    text = render(table, headers)
    TABLE_FILE.parent.mkdir(parents=True, exist_ok=True)
    TABLE_FILE.write_text(text + "\n")
    print()
    print(text)
    if not args.table_only:
        print(f"\nmatrix: {len(vs)} versions in {time.monotonic() - started:.0f}s; table in {TABLE_FILE.relative_to(ROOT)}")
    return 1 if failed(table) else 0


if __name__ == "__main__":
    sys.exit(main())
