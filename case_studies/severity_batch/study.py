"""Case study 1's scenarios, guarantees and write-up symptoms, and one run of them.

Three scenarios over one batch (2,000 claims from a seed, chunks of 250: eight
chunks; every 97th row poison, every 89th without features):

- ``batch``: the faults the write-up handles. ``chunk001``'s feature store
  answers 503 twice; ``chunk003``'s process is SIGKILLed after its writes on
  attempt 1; then the same run is submitted a second time. SB1: the manifest
  is signed with the exact counts; SB2: the ledger holds each scored row once
  and each poison row once; SB3: ``chunk001`` took 3 attempts with growing
  gaps, ``chunk003`` 2; SB4: the second submission changed nothing.
- ``dead_chunk``: ``chunk002``'s feature store never answers. SB5 (fixed):
  ``reconcile`` runs, fails closed and flags the exact imbalance; nothing is
  signed. SB5 write-up: the chord fails, ``reconcile`` never runs, the run is
  neither signed nor flagged.
- ``straggler``: ``chunk007`` returns 10 s after the chunk before it. SB6
  (fixed): signed within the deadline. SB6 write-up: its ``result_expires`` (8 s
  in the lab) has let the chord's size key expire, ``reconcile`` never runs,
  nothing is signed or flagged.

``STUDY`` is this case study behind the lab's lesson interface (``lab.lesson.CaseStudy``), registered in
``lessons``; its ``run_one(cell, kind, on_stage)`` is what the harness calls for a cell
``severity_batch/<scenario>``: kind ``fixed`` runs ``fixed.py``, ``broken`` the
write-up (``writeup.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from celery.result import AsyncResult

from case_studies.logs import clear_event_logs
from case_studies.severity_batch.claims import generate
from case_studies.severity_batch.ledger import Flag, Ledger, LedgerCounts, Manifest
from case_studies.severity_batch.stand_ins import RunSpec, chunk_name
from lab import records
from lab.lesson import FolderStudy, Programs
from lab.running import checked, run_case
from lab.records import Check, Collector
from lab.faults import CRASH_ONCE, FLAKE_FOREVER, FLAKY, SOFT_HANG, Fault, document_text
from lab.fm import Fm, load_module
from lab.observe import Reader, attempt_starts
from lab.pipeline import store_document
from lab.runner import NOT_RUN_WINDOW, new_run_id
from lab.records import Observations, Outcome
from lab.waiting import wait_until

NAME = "severity_batch"
SEED, CLAIMS, CHUNK_SIZE, POISON_EVERY, FEATURELESS_EVERY = 20261130, 2000, 250, 97, 89
RUN_TIMEOUT = 60.0


@dataclass(frozen=True)
class Scenario:
    name: str
    number: int
    faults: Mapping[int, Fault]  # chunk index -> fault
    resubmit: bool = False


SCENARIOS: dict[str, Scenario] = {
    "batch": Scenario("batch", 1, {1: FLAKY(2), 3: CRASH_ONCE}, resubmit=True),
    "dead_chunk": Scenario("dead_chunk", 2, {2: FLAKE_FOREVER}),
    "straggler": Scenario("straggler", 3, {7: SOFT_HANG}),
}
WRITEUP_SHOWS = ("dead_chunk", "straggler")
"""The scenarios ``--prove`` also runs on the write-up's code."""


def program(kind: records.Kind) -> Fm:
    module = "writeup" if kind == "broken" else "fixed"
    loaded = load_module(f"case_studies.{NAME}.{module}", member="score_chunk", body="reconcile")
    return checked(loaded)


CODES: dict[str, records.Kind] = {"sb": "fixed", "sbw": "broken"}
"""The namespace codes of the two programs (their queues are ``<namespace>.sb.tasks``, ...)."""


def code_of(kind: records.Kind) -> str:
    return "sbw" if kind == "broken" else "sb"


def clear_ledger() -> None:
    """Delete this namespace's rows from the ledger and its decision logs (``run_all_fms.py --clean``)."""
    open_ledger(clear=True)
    clear_event_logs("sb")


# ---- one run --------------------------------------------------------------------


@dataclass(frozen=True)
class CaseRun:
    obs: Observations  # the lab's observations, a chunk standing for a document
    scenario: Scenario
    spec: RunSpec
    expected: LedgerCounts  # what the extract holds: scorable rows, poison rows
    skipped: int
    counts: LedgerCounts
    manifest: Manifest | None
    flags: list[Flag]
    resubmitted: tuple[LedgerCounts, Manifest | None, Outcome] | None  # after the second submission
    chord_size_key: bool | None  # did the chord's size key still exist when the run ended
    poison_ids: frozenset[str]  # what the extract holds malformed
    reasons: Mapping[str, str]  # the ledger's quarantine: claim id -> reason


def open_ledger(clear: bool = False) -> Ledger:
    """The ledger, its tables made (emptied of this namespace's rows, with ``clear``); a database
    that does not answer is a broken run that names it (URL masked)."""
    return Ledger().opened(clear)


def _spec(run_id: str) -> RunSpec:
    return RunSpec(run=run_id, seed=SEED, claims=CLAIMS, chunk_size=CHUNK_SIZE, poison_every=POISON_EVERY,
                   featureless_every=FEATURELESS_EVERY)


def run_scenario(fm: Fm, sc: Scenario, run_id: str, watch: Callable[[], None] | None = None) -> CaseRun:
    spec = _spec(run_id)
    batch = generate(SEED, CLAIMS, poison_every=POISON_EVERY, featureless_every=FEATURELESS_EVERY)
    n_chunks = -(-CLAIMS // CHUNK_SIZE)
    names = tuple(chunk_name(i) for i in range(n_chunks))
    for i, fault in sc.faults.items():
        store_document(run_id, names[i], document_text(names[i], fault))
    ledger = open_ledger()
    reader = Reader(run_id)
    submit = cast("Callable[[RunSpec], AsyncResult[Any]]", fm.submit)
    submitted_at, started = time.time(), time.monotonic()
    body = submit(spec)
    last = names[-1]

    def ended() -> bool:
        if watch is not None:
            watch()
        if body.ready():
            return True
        # a chord that will never complete: every chunk has ended (the write-up's straggler)
        return sc.name == "straggler" and reader.has_event("attempt_end", doc=last)

    wait_until(ended, RUN_TIMEOUT)
    stopped_by = "chord finished" if body.ready() else "deadline" if not reader.has_event("attempt_end", doc=last) \
        else f"{last} ended, the chord did not"
    if not body.ready():  # every chunk ended: a chord that completes sends its body now
        wait_until(body.ready, NOT_RUN_WINDOW + 1.5)
    if body.ready():
        stopped_by = "chord finished"
    size_key = _chord_size_key_exists(fm, body)
    outcome = Outcome.of(body)
    counts, manifest = ledger.counts(run_id), ledger.manifest(run_id)
    obs = Observations(  # the first submission's, before any second one adds its own attempts
        fm=fm.short, run_id=run_id, scenario=sc.number, docs=names,
        attempts={d: reader.attempts(d) for d in names}, fetch_attempts={}, events=tuple(reader.events()),
        notify_runs={role: reader.notify_runs(role) for role in ("chord", "duplicate")}, emails=(), mail_calls=0,
        chord=outcome, duplicate=None, dlq_depth=None, probe_seconds=None, burst_probe=None,
        stopped_by=stopped_by, submitted_at=submitted_at, elapsed=time.monotonic() - started)
    resubmitted = None
    if sc.resubmit and body.ready():
        again = submit(spec)

        def again_ready() -> bool:
            if watch is not None:
                watch()
            return again.ready()

        wait_until(again_ready, RUN_TIMEOUT)
        resubmitted = (ledger.counts(run_id), ledger.manifest(run_id), Outcome.of(again))
    expected = LedgerCounts(scored=batch.scorable, quarantined=len(batch.poison_ids))
    return CaseRun(obs, sc, spec, expected, len(batch.featureless_ids), counts, manifest, ledger.flags(run_id),
                   resubmitted, size_key, batch.poison_ids, ledger.reasons(run_id))


def _chord_size_key_exists(fm: Fm, body: AsyncResult[Any]) -> bool | None:
    parent = cast(Any, body.parent)
    if parent is None:
        return None
    backend = cast(Any, fm.app.backend)
    return bool(backend.client.exists(backend.get_key_for_group(parent.id, ".s")))


# ---- guarantees (fixed) and symptoms (write-up) ----------------------------------


def _manifest_words(m: Manifest | None) -> str:
    return "no manifest" if m is None else (f"manifest: dispatched {m.dispatched}, scored {m.scored}, "
                                            f"quarantined {m.quarantined}, skipped {m.skipped}")


def _signed(run: CaseRun) -> Check:
    c = Collector("SB1")
    m, e = run.manifest, run.expected
    want = (CLAIMS, e.scored, e.quarantined, run.skipped)
    got = (m.dispatched, m.scored, m.quarantined, m.skipped) if m is not None else None
    c.expect(got == want, _manifest_words(m), f"dispatched {want[0]}, scored {want[1]}, quarantined {want[2]}, skipped {want[3]}")
    c.expect(not run.flags, f"flags {[f.reason for f in run.flags]}", "none")
    return c.result()


def _ledger_exact(run: CaseRun) -> Check:
    c = Collector("SB2")
    got, want = run.counts, run.expected
    c.expect(got == want, f"ledger rows: scored {got.scored}, quarantined {got.quarantined}",
      f"scored {want.scored}, quarantined {want.quarantined} (each row once)")
    named = sum(1 for r in run.reasons.values() if r.strip())
    same = frozenset(run.reasons) == run.poison_ids
    c.expect(same and named == len(run.poison_ids),
      f"quarantined ids {'are' if same else 'are not'} the extract's poison rows, "
      f"{named} with a reason", "exactly the poison rows, each with its reason")
    return c.result()


def _retried(run: CaseRun) -> Check:
    c = Collector("SB3")
    a1, a3 = run.obs.attempts.get("chunk001", 0), run.obs.attempts.get("chunk003", 0)
    c.expect(a1 == 3, f"chunk001 attempts {a1}", "3 (two 503s, then ok)")
    starts = attempt_starts(run.obs.events, "chunk001")
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    c.expect(len(gaps) == 2 and all(g >= 0.1 * 2**k for k, g in enumerate(gaps)),
      f"chunk001 gaps {', '.join(f'{g:.3f}s' for g in gaps)}", ">= 0.1s, then >= 0.2s (backoff)")
    c.expect(a3 == 2, f"chunk003 attempts {a3}", "2 (killed after its writes, redelivered)")
    return c.result()


def _resubmitted(run: CaseRun) -> Check:
    c = Collector("SB4")
    if run.resubmitted is None:
        c.expect(False, "not resubmitted", "a second submission")
        return c.result()
    counts, manifest, outcome = run.resubmitted
    c.expect(counts == run.counts, f"after the second submission: scored {counts.scored}, quarantined {counts.quarantined}",
      "unchanged")
    c.expect(manifest == run.manifest and outcome.state == "SUCCESS",
      f"manifest {'unchanged' if manifest == run.manifest else 'changed'}, second reconcile {outcome.state}",
      "the first manifest, kept")
    return c.result()


def _imbalance_detail(run: CaseRun, failed: str) -> str:
    e, rows = run.expected, CHUNK_SIZE
    # the failed chunk's own rows are not accounted: recount the others from the extract
    batch = generate(SEED, CLAIMS, poison_every=POISON_EVERY, featureless_every=FEATURELESS_EVERY)
    index = int(failed.removeprefix("chunk"))
    lost = batch.rows[index * rows:(index + 1) * rows]
    ids = {r["claim_id"] for r in lost}
    q = e.quarantined - len(ids & batch.poison_ids)
    k = run.skipped - len(ids & batch.featureless_ids)
    s = e.scored - (len(lost) - len(ids & batch.poison_ids) - len(ids & batch.featureless_ids))
    return (f"dispatched {CLAIMS}, scored {s} + quarantined {q} + skipped {k} = {s + q + k}; "
            f"failed chunks 1: {run.spec['run']}/{failed}")


def _fails_closed(run: CaseRun) -> Check:
    c = Collector("SB5")
    wanted = _imbalance_detail(run, "chunk002")
    details = [f.detail for f in run.flags if f.reason == "imbalance"]
    c.expect(details == [wanted], f"flags {details}", repr([wanted]))
    c.expect(run.manifest is None, _manifest_words(run.manifest), "no manifest")
    env = run.obs.chord.envelope
    c.expect(env is not None and not env.ok and "BatchImbalance" in (env.error or ""),
      f"reconcile {run.obs.chord.state} {env.error if env else run.obs.chord.error_type}", "a BatchImbalance envelope")
    a2 = run.obs.attempts.get("chunk002", 0)
    c.expect(a2 == 6, f"chunk002 attempts {a2}", "6 (5 retries)")
    return c.result()


def _outlives_expiry(run: CaseRun) -> Check:
    c = Collector("SB6")
    c.expect(run.manifest is not None and run.manifest.dispatched == CLAIMS, _manifest_words(run.manifest), "signed")
    c.expect(run.obs.elapsed <= 20, f"signed after {run.obs.elapsed:.1f}s", "within the deadline, 20s")
    return c.result()


def _never_reconciled(c: Collector, run: CaseRun) -> None:
    runs = run.obs.notify_runs.get("chord", 0)
    c.expect(runs == 0, f"reconcile ran {runs}x", "0")
    c.expect(run.manifest is None and not run.flags, f"{_manifest_words(run.manifest)}, {len(run.flags)} flags",
      "neither signed nor flagged")


def _writeup_dead_chunk(run: CaseRun) -> Check:
    c = Collector("SB5 write-up")
    ch = run.obs.chord
    c.expect(ch.state == "FAILURE" and ch.error_type == "ChordError", f"chord {ch.state} {ch.error_type}", "FAILURE ChordError")
    _never_reconciled(c, run)
    return c.result()


def _writeup_straggler(run: CaseRun) -> Check:
    c = Collector("SB6 write-up")
    c.expect(run.chord_size_key is False, f"chord size key {'gone' if run.chord_size_key is False else 'present'}",
      "expired (result_expires)")
    c.expect(run.obs.chord.state == "PENDING", f"chord {run.obs.chord.state}", "PENDING (never completes)")
    _never_reconciled(c, run)
    return c.result()


def checks_of(kind: records.Kind, run: CaseRun) -> list[Check]:
    if kind == "broken":
        return [_writeup_dead_chunk(run) if run.scenario.name == "dead_chunk" else _writeup_straggler(run)]
    if run.scenario.name == "batch":
        return [_signed(run), _ledger_exact(run), _retried(run), _resubmitted(run)]
    return [_fails_closed(run)] if run.scenario.name == "dead_chunk" else [_outlives_expiry(run)]


# ---- the harness's cell --------------------------------------------------------


def run_one(cell: str, kind: records.Kind, on_stage: records.OnStage) -> records.RunReport:
    name = cell.split("/", 1)[1]
    sc = SCENARIOS[name]
    return run_case(
        records.RunReport(cell, kind, code_of(kind), sc.number), lambda: program(kind), f"{NAME}-{name}-{kind}",
        on_stage, lambda fm, run_id, watch: run_scenario(fm, sc, run_id, watch), lambda run: run.obs,
        lambda run: checks_of(kind, run), prepare=lambda _: open_ledger(clear=True))


def run_by_hand(kind: records.Kind) -> int:
    """Every scenario against a worker you started (``python -m case_studies.severity_batch.fixed``)."""
    fm = program(kind)
    ok = True
    for sc in SCENARIOS.values():
        if kind == "broken" and sc.name not in WRITEUP_SHOWS:
            continue
        open_ledger(clear=True)
        run = run_scenario(fm, sc, new_run_id())
        for check in checks_of(kind, run):
            ok = ok and check.ok
            print(f"{sc.name}: {'ok  ' if check.ok else 'FAIL'} {check.label}: {check.detail}")
    return 0 if ok else 1


STUDY = FolderStudy(NAME, Programs(f"case_studies.{NAME}.fixed", f"case_studies.{NAME}.writeup"), CODES,
                    tuple(SCENARIOS), WRITEUP_SHOWS, program, run_one, clear_ledger)
"""This case study, as the registry (``lessons``) lists it."""
