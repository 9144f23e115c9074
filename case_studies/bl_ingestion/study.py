"""Case study 2's scenarios, guarantees and write-up symptoms, and one run of them.

Every scenario submits one IFCSUM manifest (``MANIFEST_UNITS`` consignments from
a seed; the carrier's deviations in it: ``RFF+BN`` only, no reference, a bad
container check digit, release characters) and plays one fault:

- ``exhausted``: one unit's registry refuses five connections (1 + 4 retries);
- ``replay``: two units' containers are unknown to the registry at first (it
  lags behind the booking); both are dead-lettered, then the replay job runs
  and is killed after taking its first record, and runs again ``STALE_SECONDS``
  later, as an operator (or a beat) would. The manifest has no deviations, so
  the dead list holds exactly those two;
- ``resend``: the carrier sends the same manifest again under a new batch id
  (on the write-up, whose split on ``CNI+`` text makes 41 units of the 40
  consignments, the check is exact on every unit it makes up);
- ``aggregate_crash``: ``aggregate_batch`` is killed after claiming the batch
  (write-up) or in the middle of forwarding (fixed: the harder crash);
- ``slow_parse``: a unit with a bad check digit takes 2.5 s at the registry;
- ``outage``: the whole container registry refuses every connection until
  every unit has used its attempts, longer than either program's whole
  backoff; once it is back, the operator runs the replay once;
- ``poison_replay``: the operator runs the replay once after the batch; the
  write-up's dead list holds a unit with a bad check digit, which no replay
  can mend.

Guarantees (fixed), in every scenario, exact:

- BL1: forwarded + dead-lettered == consignments: every unit is booked, in the
  dead list or in the rejected list, and those lists hold exactly the units the
  manifest and the faults say, each rejection with its precise reason;
- BL2: each B/L is booked by the terminal exactly once (across retries,
  redeliveries, replays and the re-sent manifest);
- BL3: one JSON log line per dead-letter and rejection, per refused container,
  per replayed unit and per aggregate, with ``batch_id`` and ``bl_number``;
- BL4..BL8, one per scenario: what its fault needs (the attempts; the lists empty
  after the replay; the second batch booked nothing; the crashed aggregate's
  redelivery forwarded; the slow parse ran once; every unit of the outage
  dead-lettered, then booked by the replay).

``STUDY`` is this case study behind the lab's lesson interface (``lab.lesson.CaseStudy``), registered in
``lessons``; its ``run_one(cell, kind, on_stage)`` is what the harness calls for a cell
``bl_ingestion/<scenario>``: kind ``fixed`` runs ``fixed.py``, ``broken`` the
write-up (``writeup.py``).

One piece: this case study's scenarios, the faults each plays and the checks on their runs read together as
its specification; its domain code sits beside it.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Generator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, cast

from celery.result import AsyncResult
from celery.states import READY_STATES

from case_studies.bl_ingestion.dead_letters import DeadLetters
from case_studies.bl_ingestion.logs import event_log_path, read_events
from case_studies.bl_ingestion.manifest import Deviations, Manifest, generate
from case_studies.bl_ingestion.stand_ins import (CrashStep, Terminal, end_outage, plan_crash, plan_outage,
                                                 registry_calls, unit_name)
from lab import records
from lab.lesson import FolderStudy, Programs
from lab.running import checked, run_case
from lab.records import Check, Collector
from lab.faults import FAIL, FLAKY, SOFT_HANG, Fault, document_text
from lab.fm import ROOT, Fm, load_module
from lab.observe import Reader
from lab.pipeline import store_document
from lab.runner import NOT_RUN_WINDOW, new_run_id
from lab.records import Observations, Outcome
from lab.waiting import wait_until
from shared.backend import backend_redis

NAME = "bl_ingestion"
SEED, MANIFEST_UNITS = 20261130, 40
SCENARIO_CHUNK = 8  # fixed.py's chunks in the scenarios: five of them
DEVIATE_EVERY = 7  # units 6, 13, 20, 27, 34: booking only, no reference, bad check digit, escaped text, malformed
RUN_TIMEOUT = 45.0
STALE_SECONDS = 2.0  # fixed.STALE_SECONDS: the operator's second replay comes after it
WRITEUP_BACKOFF = 0.1 + 0.2 + 0.4 + 0.8
"""The write-up's whole backoff at the lab's scale (its 10 + 20 + 40 + 80 s)."""
FIXED_BACKOFF_MAX = 3.0
"""The fixed program's whole backoff at most: four jittered delays below 0.2, 0.4, 0.8 and 1.6 s."""


@dataclass(frozen=True)
class Scenario:
    name: str
    number: int
    faults: Mapping[str, Fault | None] = field(default_factory=lambda: {})  # role -> fault (None: a unit to follow)
    crash: Mapping[str, CrashStep] = field(default_factory=lambda: {})  # kind -> crash step
    deviations: bool = True
    resend: bool = False
    replays: int = 0
    outage: bool = False  # the whole registry refuses connections until every unit has used its attempts


SCENARIOS: dict[str, Scenario] = {
    "exhausted": Scenario("exhausted", 1, {"flaky": FLAKY(2), "exhausted": FLAKY(5)}),
    "replay": Scenario("replay", 2, {"lag_a": FAIL, "lag_b": FAIL}, {"fixed": "replay:after_take",
                                                                    "broken": "replay:after_take"},
                       deviations=False, replays=2),
    "resend": Scenario("resend", 3, resend=True),
    "aggregate_crash": Scenario("aggregate_crash", 4, crash={"fixed": "aggregate:mid_forward",
                                                             "broken": "aggregate:after_claim"}),
    "slow_parse": Scenario("slow_parse", 5, {"slow": SOFT_HANG}),
    "outage": Scenario("outage", 6, outage=True, replays=1),
    "poison_replay": Scenario("poison_replay", 7, {"poison": None}, replays=1),
}
WRITEUP_SHOWS = tuple(SCENARIOS)
"""The scenarios ``--prove`` also runs on the write-up's code: each shows one of its mistakes."""

CODES: dict[str, records.Kind] = {"bl": "fixed", "blw": "broken"}
"""The namespace codes of the two programs (their Redis keys are ``<namespace>:bl:...``)."""


def program(kind: records.Kind) -> Fm:
    module, member = ("writeup", "parse_bl") if kind == "broken" else ("fixed", "parse_units")
    return checked(load_module(f"case_studies.{NAME}.{module}", member=member, body="aggregate_batch"))


def code_of(kind: records.Kind) -> str:
    return "blw" if kind == "broken" else "bl"


def clear_ledger() -> None:
    """Delete the namespace's JSON event logs (``run_all_fms.py --clean``); the terminal's record and
    the lists are Redis keys of the namespace, which the clean deletes with the rest."""
    for path in event_log_path("x").parent.glob("bl-*.jsonl"):
        path.unlink(missing_ok=True)


# ---- one run --------------------------------------------------------------------


@dataclass(frozen=True)
class CaseRun:
    obs: Observations
    scenario: Scenario
    kind: records.Kind
    manifest: Manifest
    roles: Mapping[str, int]  # role -> unit index
    calls: Mapping[str, int]  # role -> the registry's calls for its unit: the unit's attempts
    bookings: tuple[tuple[str, str], ...]  # (B/L, batch)
    tos_calls: int
    dead: tuple[dict[str, Any], ...]  # the dead list's records (the write-up's one list)
    rejected: tuple[dict[str, Any], ...]
    processing: int
    events: tuple[Mapping[str, Any], ...]  # the JSON log lines
    bodies: tuple[Outcome, ...]  # every aggregate's outcome (the first submission's first)
    aggregate_runs: int
    outage_seconds: float = 0.0  # how long the registry was down (``outage``)


def _roles(sc: Scenario, manifest: Manifest) -> dict[str, int]:
    """The unit each role of the scenario's faults falls on: clean units for the registry's faults,
    a bad check digit for the slow one and the poison one (the write-up dead-letters it)."""
    clean = [t.index for t in manifest.truth if t.deviation is None]
    bad_digit = [t.index for t in manifest.truth if t.deviation == "bad_check_digit"]
    roles: dict[str, int] = {}
    for i, role in enumerate(sc.faults):
        roles[role] = bad_digit[0] if role in ("slow", "poison") else clean[3 + 5 * i]
    return roles


def _manifest(sc: Scenario, run_id: str, resend: int = 0) -> Manifest:
    """The scenario's manifest; its batch id is the run's (``B<run>``, ``B<run>R1`` for a re-send)."""
    return generate(SEED, MANIFEST_UNITS, Deviations(every=DEVIATE_EVERY if sc.deviations else 0), resend=resend,
                    batch_id=f"B{run_id}" + (f"R{resend}" if resend else ""))


def run_scenario(fm: Fm, sc: Scenario, kind: records.Kind, run_id: str,
                 watch: Callable[[], None] | None = None) -> CaseRun:
    manifest = _manifest(sc, run_id)
    roles = _roles(sc, manifest)
    for role, index in roles.items():
        name = unit_name(manifest.batch_id, index)
        store_document(run_id, name, document_text(name, sc.faults[role]))
    if kind in sc.crash:
        plan_crash(run_id, sc.crash[kind])
    reader = Reader(run_id)
    submit = cast("Callable[..., AsyncResult[Any]]", fm.submit)
    extra: dict[str, Any] = {"chunk_size": SCENARIO_CHUNK} if kind == "fixed" else {}
    replay = cast("Callable[[], AsyncResult[Any]]", getattr(importlib.import_module(fm.module), "replay", None))
    started, submitted_at = time.monotonic(), time.time()

    swept = [0.0]

    def ready(res: AsyncResult[Any]) -> Callable[[], bool]:
        def check() -> bool:
            if watch is not None:
                watch()
            if sc.name == "slow_parse" and time.monotonic() - swept[0] >= SWEEP_SECONDS:
                swept[0] = time.monotonic()
                sweep(fm, float(WRITEUP_VISIBILITY) if kind == "broken" else visibility_of(fm))
            return res.ready()
        return check

    def sent(manifest: Manifest) -> AsyncResult[Any]:
        """The manifest through the program's dispatch task, then its chord body."""
        dispatched = submit(manifest.text, manifest.batch_id, run_id, **extra).id
        wait_until(lambda: _done(fm, dispatched, watch), RUN_TIMEOUT)
        body = fm.app.AsyncResult(str(_meta(fm, dispatched).get("result")))
        wait_until(ready(body), RUN_TIMEOUT)
        return body

    if sc.outage:
        plan_outage(run_id)
    bodies: list[AsyncResult[Any]] = [sent(manifest)]
    if sc.resend:
        bodies.append(sent(_manifest(sc, run_id, resend=1)))
    if sc.name == "slow_parse":  # the write-up's first copy may still run after the chord: until every start ended
        wait_until(lambda: _settled(reader), SLOW_SETTLE)
    down = 0.0
    if sc.outage:  # the registry comes back once every unit has used all its attempts; then the operator replays
        pieces = naive_pieces(manifest)[0] if kind == "broken" else MANIFEST_UNITS
        wait_until(lambda: _all_exhausted(reader, pieces, fm), RUN_TIMEOUT)
        down = end_outage(run_id)
    for n in range(sc.replays):
        if n:  # the operator's second replay, once a dead replayer's record is stale (fixed) or at once
            wait_until(lambda: _stale_or_none(fm), STALE_SECONDS + 2)
        if kind == "broken":  # the write-up's replay is a function an operator or cron runs: a process of its own
            replay_process(watch)
            continue
        job = replay().id  # its meta is read, not its AsyncResult: that would build one for each task it sent
        wait_until(lambda: _done(fm, job, watch), RUN_TIMEOUT)
        made = _meta(fm, job).get("result")
        if isinstance(made, str):  # fixed: the replay's chord body
            body = fm.app.AsyncResult(made)
            bodies.append(body)
            wait_until(ready(body), RUN_TIMEOUT)
    if sc.replays and kind == "broken":  # the replayed units run outside any chord: until every start ended
        wait_until(lambda: _settled(reader), NOT_RUN_WINDOW + 3)
    tos = Terminal(run_id)
    r, prefix = backend_redis(fm.app)
    dead, rejected = DeadLetters(r, prefix, "dead"), DeadLetters(r, prefix, "rejected")
    names = tuple(dict.fromkeys(e.get("doc") for e in reader.events() if e.kind == "attempt_start"))
    obs = Observations(
        fm=fm.short, run_id=run_id, scenario=sc.number, docs=names,
        attempts={d: reader.attempts(d) for d in names}, fetch_attempts={}, events=tuple(reader.events()),
        notify_runs={role: reader.notify_runs(role) for role in ("chord", "duplicate")}, emails=(), mail_calls=0,
        chord=Outcome.of(bodies[0]), duplicate=None, dlq_depth=None, probe_seconds=None, burst_probe=None,
        stopped_by="chord finished" if bodies[0].ready() else "deadline", submitted_at=submitted_at,
        elapsed=time.monotonic() - started)
    calls = {role: registry_calls(run_id, unit_name(manifest.batch_id, i)) for role, i in roles.items()}
    return CaseRun(obs, sc, kind, manifest, roles, calls, tuple(tos.bookings()), tos.calls(),
                   tuple(dead.records()), tuple(rejected.records()), dead.in_processing(),
                   tuple(read_events(run_id)), tuple(Outcome.of(b) for b in bodies),
                   sum(1 for e in reader.events() if e.kind == "notify_start"), down)


SLOW_SETTLE = 6.0
SWEEP_SECONDS = 0.25


def visibility_of(fm: Fm) -> float:
    """The visibility timeout ``fm``'s own settings give its Redis transport (the fixed program sets a constant;
    read off its app so that this module need not import the program that runs it by hand)."""
    return float(cast(dict[str, Any], fm.app.conf.broker_transport_options)["visibility_timeout"])


def sweep(fm: Fm, visibility: float) -> int:
    """kombu's own restore sweep (``QoS.restore_visible`` in ``kombu/transport/redis.py``): every
    message unacked for longer than ``visibility`` goes back to its queue. A worker runs it when it
    starts and then about every 100 s (every 10 s, scanning every 10th time, in kombu 5.5 to 5.7);
    the lab runs it every ``SWEEP_SECONDS`` during ``slow_parse``, as a worker starting then would,
    so that a run shows what production shows within minutes. How many were unacked is returned."""
    with fm.app.connection_for_write() as conn:
        channel = cast(Any, conn.default_channel)
        channel.visibility_timeout = visibility  # the worker's, which the harness's copy of the app may not hold
        channel.qos.restore_visible(num=100, interval=1)
        return int(channel.client.zcard(channel.unacked_index_key))


def _all_exhausted(reader: Reader, units: int, fm: Fm) -> bool:
    """Every unit has ended its last attempt (1 + 4 retries): the write-up's parses, one per unit; the fixed
    program's chunks, which end only once each of their units has had its attempts (their aggregate returned)."""
    if fm.short == "bl":
        return reader.has_event("notify_end")
    ended = {e.get("doc") for e in reader.events() if e.kind == "attempt_end" and e.get("attempt") == "5"}
    return len(ended) >= units


def _done(fm: Fm, task_id: str, watch: Callable[[], None] | None) -> bool:
    if watch is not None:
        watch()
    return _meta(fm, task_id)["status"] in READY_STATES


def _meta(fm: Fm, task_id: str) -> dict[str, Any]:
    """A task's stored state and result (``PENDING`` until it has one)."""
    return cast(dict[str, Any], cast(Any, fm.app.backend).get_task_meta(task_id))


def _stale_or_none(fm: Fm) -> bool:
    """Nothing in the processing list, or its newest record older than ``STALE_SECONDS``."""
    r, prefix = backend_redis(fm.app)
    stamps = [float(x) for x in cast(list[str], r.hvals(DeadLetters(r, prefix, "dead").since))]
    return not stamps or time.time() - max(stamps) > STALE_SECONDS


def _settled(reader: Reader) -> bool:
    """Every parse that started in the run has ended."""
    kinds = Counter(e.kind for e in reader.events())
    return kinds["attempt_end"] >= kinds["attempt_start"]


# ---- guarantees (fixed) and symptoms (write-up) ----------------------------------


def naive_pieces(manifest: Manifest) -> tuple[int, set[int]]:
    """How many units the write-up's split on ``CNI+`` text makes of ``manifest``, and which of them carry no
    ``RFF+BM``, from the ground truth alone: a consignment without a B/L is one such unit; an ``escaped_text``
    consignment holds one ``CNI+`` in its text after its ``RFF+BM`` (``manifest._ESCAPED_TEXT``), so the split
    cuts it in two and the second piece is a phantom unit without one."""
    pieces, no_bm = 0, set[int]()
    for t in manifest.truth:
        if t.bl_number is None:
            no_bm.add(pieces)
        pieces += 1
        if t.deviation == "escaped_text":
            no_bm.add(pieces)
            pieces += 1
    return pieces, no_bm


def replay_process(watch: Callable[[], None] | None, timeout: float = RUN_TIMEOUT) -> int:
    """Run the write-up's ``replay_dead_letters()`` in a child process, as its operator or cron would, until it
    ends (done, or killed by the lab's crash point); its exit status."""
    code = "from case_studies.bl_ingestion.writeup import replay_dead_letters; replay_dead_letters()"
    child = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=os.environ.copy(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def ended() -> bool:
        if watch is not None:
            watch()
        return child.poll() is not None

    try:
        if not wait_until(ended, timeout):
            raise TimeoutError(f"the write-up's replay ran past {timeout:.0f}s")
    finally:
        if child.poll() is None:
            child.kill()
        _, err = child.communicate()
    if child.returncode not in (0, -9):
        raise RuntimeError(f"the write-up's replay exited {child.returncode}: {err.decode(errors='replace')[-400:]}")
    return child.returncode


def _waited(run: CaseRun) -> float:
    """The longest a unit (write-up) or chunk (fixed) waited in backoff, by the retries' own delays."""
    waited: dict[str, float] = {}
    for e in run.obs.events:
        if e.kind == "retry":
            waited[e.get("doc")] = waited.get(e.get("doc"), 0.0) + float(e.get("delay") or 0)
    return max(waited.values(), default=0.0)


def _doc(run: CaseRun, role: str) -> str:
    """The unit name of the scenario's ``role`` (``B<run>-bl0008``)."""
    return unit_name(run.manifest.batch_id, run.roles[role])


def _bl(run: CaseRun, index: int) -> str:
    return str(run.manifest.truth[index].bl_number)


def _valid(run: CaseRun) -> list[int]:
    return [t.index for t in run.manifest.parsable]


def _invalid(run: CaseRun) -> dict[int, str]:
    return {t.index: str(t.reason) for t in run.manifest.rejected}


def _expected_dead(run: CaseRun) -> set[int]:
    sc = run.scenario
    if sc.name == "exhausted":
        return {run.roles["exhausted"]}
    return set()


def _balance(run: CaseRun) -> Check:
    c = Collector("BL1")
    valid, invalid = _valid(run), _invalid(run)
    want_dead = _expected_dead(run)
    want_booked = {_bl(run, i) for i in valid if i not in want_dead}
    booked = {bl for bl, _ in run.bookings}
    dead = {int(r["unit"]["index"]) for r in run.dead}
    rejected = {int(r["unit"]["index"]): str(r["reason"]) for r in run.rejected}
    total = len(booked) + len(dead) + len(rejected)
    c.expect(total == MANIFEST_UNITS, f"booked {len(booked)} + dead {len(dead)} + rejected {len(rejected)} = {total}",
             f"{MANIFEST_UNITS} consignments")
    c.expect(booked == want_booked, f"{len(booked ^ want_booked)} B/L(s) booked that should not be or not booked",
             "exactly the valid units' B/Ls")
    c.expect(dead == want_dead, f"dead list units {sorted(dead)}", f"{sorted(want_dead)}")
    c.expect(rejected == invalid, f"rejected {len(rejected)}: {sorted(set(rejected.values()))}",
             f"{len(invalid)} with their reasons: {sorted(set(invalid.values()))}")
    return c.result()


def _once(run: CaseRun) -> Check:
    c = Collector("BL2")
    per_bl = Counter(bl for bl, _ in run.bookings)
    twice = sorted(bl for bl, n in per_bl.items() if n > 1)
    c.expect(not twice, f"{len(twice)} B/L(s) booked more than once{': ' + ', '.join(twice[:3]) if twice else ''}",
             f"each of {len(per_bl)} booked once (terminal calls {run.tos_calls})")
    return c.result()


def _logged(run: CaseRun) -> Check:
    c = Collector("BL3")
    need = {"batch_id", "bl_number", "event", "timestamp"}
    lines = list(run.events)
    missing = [e for e in lines if not need <= set(e)]
    c.expect(not missing, f"{len(missing)} of {len(lines)} log lines without {sorted(need)}", "every line has them")
    letters = Counter((str(e["event"]), str(e["batch_id"]), int(e["unit"])) for e in lines
                      if e.get("event") in ("unit_dead_lettered", "unit_rejected"))
    want = {("unit_dead_lettered", str(r["unit"]["batch"]), int(r["unit"]["index"])) for r in run.dead}
    want |= {("unit_rejected", str(r["unit"]["batch"]), int(r["unit"]["index"])) for r in run.rejected}
    if run.scenario.replays:  # dead-lettered, then replayed: the records are gone, the lines stay
        replayed = {"replay": tuple(run.roles.values()), "outage": tuple(range(MANIFEST_UNITS))}.get(
            run.scenario.name, ())  # the units a replay took from the dead list
        want |= {("unit_dead_lettered", run.manifest.batch_id, i) for i in replayed}
    c.expect(set(letters) == want and all(n == 1 for n in letters.values()),
             f"dead-letter/rejection lines for {len(letters)} records, max {max(letters.values(), default=0)} each",
             f"one per record dead-lettered or rejected ({len(want)})")
    refused = sum(1 for e in lines if e.get("event") == "container_rejected" and e.get("reason") == "bad_check_digit")
    bad = sum(1 for t in run.manifest.truth if t.deviation == "bad_check_digit") * (2 if run.scenario.resend else 1)
    c.expect(refused == bad, f"{refused} container_rejected lines", f"{bad}: one per bad container per manifest sent")
    aggregates = sum(1 for e in lines if e.get("event") == "batch_aggregated")
    c.expect(aggregates == len(run.bodies), f"{aggregates} aggregate lines", f"{len(run.bodies)} (one per batch)")
    return c.result()


def _scenario_guarantee(run: CaseRun) -> Check:
    sc, a = run.scenario, run.calls
    if sc.name == "exhausted":
        c = Collector("BL4")
        c.expect(a["flaky"] == 3, f"flaky unit attempts {a['flaky']}", "3 (two refusals, then ok)")
        c.expect(a["exhausted"] == 5, f"exhausted unit attempts {a['exhausted']}", "5 (1 + 4 retries)")
        reasons = [r["reason"] for r in run.dead]
        c.expect(reasons == ["retries_exhausted"], f"dead-letter reasons {reasons}", "['retries_exhausted']")
        c.expect(run.bodies[0].state == "SUCCESS", f"aggregate {run.bodies[0].state}", "SUCCESS: the chord completed")
        return c.result()
    if sc.name == "replay":
        c = Collector("BL5")
        c.expect(not run.dead and run.processing == 0, f"dead {len(run.dead)}, processing {run.processing}",
                 "both empty after the replay")
        lagged = {_bl(run, i) for i in run.roles.values()}
        booked = Counter(bl for bl, _ in run.bookings)
        c.expect(all(booked[bl] == 1 for bl in lagged), f"replayed B/Ls booked {[booked[bl] for bl in sorted(lagged)]}",
                 "[1, 1]")
        crashes = sum(1 for e in run.obs.events if e.kind == "crash")
        c.expect(crashes == 1, f"replayer killed {crashes}x", "1 (after its first take)")
        return c.result()
    if sc.name == "resend":
        c = Collector("BL6")
        second = [bl for bl, batch in run.bookings if batch.endswith("R1")]
        c.expect(not second and len(run.bodies) == 2 and run.bodies[1].state == "SUCCESS",
                 f"the re-sent batch booked {len(second)}", "0: its consignments were booked already")
        return c.result()
    if sc.name == "aggregate_crash":
        c = Collector("BL7")
        c.expect(run.aggregate_runs == 2, f"aggregate started {run.aggregate_runs}x", "2 (killed mid-forward, redelivered)")
        c.expect(run.tos_calls > len(run.bookings), f"terminal calls {run.tos_calls}, bookings {len(run.bookings)}",
                 "more calls than bookings: the redelivery resent, the key held")
        return c.result()
    if sc.name == "outage":
        c = Collector("BL9")
        first = run.manifest.batch_id
        c.expect(run.outage_seconds > _waited(run), f"registry down {run.outage_seconds:.1f}s",
                 f"longer than the whole backoff a chunk waited ({_waited(run):.1f}s of at most {FIXED_BACKOFF_MAX}s)")
        exhausted = {int(e["unit"]) for e in run.events if e.get("event") == "unit_dead_lettered"
                     and e.get("batch_id") == first and e.get("reason") == "retries_exhausted"}
        c.expect(exhausted == set(range(MANIFEST_UNITS)), f"{len(exhausted)} units dead-lettered retries_exhausted",
                 f"all {MANIFEST_UNITS}: the outage outlasted every retry")
        aggregated = [(e.get("batch_id"), e.get("booked")) for e in run.events if e.get("event") == "batch_aggregated"]
        c.expect(len(aggregated) == 2 and aggregated[0] == (first, 0) and aggregated[1][1] == len(_valid(run)),
                 f"aggregates (batch, booked) {aggregated}",
                 f"the batch completes booking 0, then the replay's chord books {len(_valid(run))}")
        c.expect(not run.dead and run.processing == 0, f"dead {len(run.dead)}, processing {run.processing}",
                 "both empty after the replay")
        return c.result()
    if sc.name == "poison_replay":
        c = Collector("BL10")
        calls = run.calls["poison"]
        c.expect(calls == 1, f"the bad-check-digit unit asked the registry {calls}x", "1: booked, its container "
                 "refused; nothing in the dead list for the replay to spin on")
        c.expect(not run.dead and len(run.rejected) == len(_invalid(run)),
                 f"dead {len(run.dead)}, rejected {len(run.rejected)}",
                 f"0 and {len(_invalid(run))}: what only the carrier can mend is never replayed")
        return c.result()
    c = Collector("BL8")
    starts = run.calls["slow"]
    c.expect(starts == 1, f"slow unit parse started {starts}x", "1 (visibility_timeout above the deadline)")
    c.expect(run.tos_calls == len(run.bookings), f"terminal calls {run.tos_calls}, bookings {len(run.bookings)}",
             "equal: the terminal received each B/L once")
    return c.result()


def _writeup_symptom(run: CaseRun) -> Check:
    sc = run.scenario
    c = Collector(f"BL{3 + sc.number} write-up")
    booked = Counter(bl for bl, _ in run.bookings)
    if sc.name == "exhausted":
        ch = run.bodies[0]
        c.expect(ch.state == "FAILURE" and ch.error_type == "ChordError", f"chord {ch.state} {ch.error_type}",
                 "FAILURE ChordError (retries re-raise)")
        c.expect(not run.bookings, f"booked {len(run.bookings)}", "0: the whole batch is lost")
    elif sc.name == "replay":
        lagged = {_doc(run, "lag_a"), _doc(run, "lag_b")}
        replayed = {_doc(run, role) for role in ("lag_a", "lag_b") if run.calls[role] >= 2}
        in_dead = {unit_name(run.manifest.batch_id, int(r["unit"]["index"])) for r in run.dead}
        lost = lagged - replayed - in_dead
        c.expect(len(lost) == 1, f"lost {sorted(lost)}", "1 unit: popped by the killed replayer, never re-enqueued")
        never = [d for d in replayed if booked[_bl(run, int(d[-4:]))] == 0]
        c.expect(len(never) == 1, f"replayed and parsed but not booked: {sorted(never)}", "1: no aggregate saw it")
    elif sc.name == "resend":
        pieces, no_bm = naive_pieces(run.manifest)
        first, second = run.manifest.batch_id, f"{run.manifest.batch_id}R1"
        for batch in (first, second):  # every unit the split made was parsed: 41 of 40 consignments
            units = sum(1 for d in run.obs.docs if d.startswith(f"{batch}-bl"))
            c.expect(units == pieces, f"batch {batch[-2:]}: {units} units dispatched",
                     f"{pieces}: {MANIFEST_UNITS} consignments split on CNI+ text")
        made_up = {b: sorted(bl for bl, at in run.bookings if at == b and bl.startswith(f"{b}-")) for b in (first, second)}
        for batch in (first, second):
            want = sorted(f"{batch}-{i}" for i in no_bm)
            c.expect(made_up[batch] == want, f"booked under made-up numbers: {', '.join(made_up[batch])}",
                     f"{', '.join(want)}: the pieces without RFF+BM (a phantom one among them)")
        again = sorted(bl for bl, at in run.bookings if at == second and not bl.startswith(f"{second}-"))
        twice = sorted(bl for bl, n in booked.items() if n > 1)
        c.expect(not again and not twice, f"the re-sent batch booked {len(again)} real B/L(s); {len(twice)} twice",
                 "0: the TOS is keyed on the B/L number; only the made-up numbers book again")
    elif sc.name == "aggregate_crash":
        c.expect(run.aggregate_runs == 2 and not run.bookings,
                 f"aggregate started {run.aggregate_runs}x, booked {len(run.bookings)}",
                 "2 starts, 0 booked: the redelivery found SET NX taken")
    elif sc.name == "poison_replay":
        calls = run.calls["poison"]
        replayed = sum(1 for e in run.events if e.get("event") == "bl_replayed")
        c.expect(replayed == 200 and calls == 201, f"one replay run re-enqueued {replayed} records; the "
                 f"bad-check-digit unit was parsed {calls}x", "200 and 201: the same poison record popped, parsed, "
                 "dead-lettered again and popped again, up to the run's bound")
        c.expect(len(run.dead) == 1, f"dead list {len(run.dead)} after the replay", "1: the poison record, back")
    elif sc.name == "outage":
        ch = run.bodies[0]
        c.expect(run.outage_seconds > _waited(run) >= WRITEUP_BACKOFF - 1e-9, f"registry down {run.outage_seconds:.1f}s",
                 f"longer than the whole backoff a unit waited ({_waited(run):.1f}s, {WRITEUP_BACKOFF:.1f}s planned)")
        c.expect(ch.state == "FAILURE" and ch.error_type == "ChordError", f"chord {ch.state} {ch.error_type}",
                 "FAILURE ChordError: each unit's retries ran out inside the outage and re-raised")
        c.expect(not run.bookings and not run.dead, f"booked {len(run.bookings)}, dead list {len(run.dead)}",
                 "0 and 0: nothing booked and nothing for the replay to mend; the manifest is lost until re-sent")
    else:
        slow = _doc(run, "slow")
        starts = run.calls["slow"]
        letters = sum(1 for r in run.dead if unit_name(run.manifest.batch_id, int(r["unit"]["index"])) == slow)
        spans = [e for e in run.obs.events if e.get("doc") == slow and e.kind in ("attempt_start", "attempt_end")]
        first_end = next((e.t for e in spans if e.kind == "attempt_end" and e.get("attempt") == "1"), float("inf"))
        overlapping = sum(1 for e in spans if e.kind == "attempt_start" and e.get("attempt") != "1" and e.t < first_end)
        # how many copies: each one that waits unacked past the 1 s timeout is handed out again (2 in most runs)
        c.expect(starts >= 2 and overlapping >= 1, f"slow unit parse started {starts}x, {overlapping} while the "
                 "first still ran", ">= 2, a copy started while the first ran: redelivered while it ran")
        c.expect(letters == starts, f"slow unit dead-lettered {letters}x", f"{starts}: the side effect once per start")
    return c.result()


def checks_of(kind: records.Kind, run: CaseRun) -> list[Check]:
    if kind == "broken":
        return [_writeup_symptom(run)]
    return [_balance(run), _once(run), _logged(run), _scenario_guarantee(run)]


# ---- the harness's cell --------------------------------------------------------


WRITEUP_VISIBILITY = "1"
"""The write-up's ``visibility_timeout`` in its scenarios (``BULK_VISIBILITY_TIMEOUT``, which its worker reads),
but ``outage``, which keeps its default hour: at 1 s the retries a worker holds for their countdown are handed
out again too, and the lesson of a parse that outlives the timeout is ``slow_parse``'s."""


@contextmanager
def writeup_scale(scenario: str = "") -> Generator[None]:
    """The write-up's worker, started inside, reads ``BULK_VISIBILITY_TIMEOUT=1`` (the lab's scale of its hour;
    in ``outage`` its default, 3,600 s)."""
    before = os.environ.get("BULK_VISIBILITY_TIMEOUT")
    os.environ["BULK_VISIBILITY_TIMEOUT"] = "3600" if scenario == "outage" else WRITEUP_VISIBILITY
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("BULK_VISIBILITY_TIMEOUT", None)
        else:
            os.environ["BULK_VISIBILITY_TIMEOUT"] = before


def run_one(cell: str, kind: records.Kind, on_stage: records.OnStage) -> records.RunReport:
    name = cell.split("/", 1)[1]
    sc = SCENARIOS[name]
    return run_case(
        records.RunReport(cell, kind, code_of(kind), sc.number), lambda: program(kind), f"{NAME}-{name}-{kind}",
        on_stage, lambda fm, run_id, watch: run_scenario(fm, sc, kind, run_id, watch), lambda run: run.obs,
        lambda run: checks_of(kind, run), around=lambda: writeup_scale(name))


def run_by_hand(kind: records.Kind) -> int:
    """Every scenario against a worker you started (``python -m case_studies.bl_ingestion.fixed``)."""
    fm = program(kind)
    ok = True
    for sc in SCENARIOS.values():
        run = run_scenario(fm, sc, kind, new_run_id())
        for check in checks_of(kind, run):
            ok = ok and check.ok
            print(f"{sc.name}: {'ok  ' if check.ok else 'FAIL'} {check.label}: {check.detail}")
    return 0 if ok else 1


STUDY = FolderStudy(NAME, Programs(f"case_studies.{NAME}.fixed", f"case_studies.{NAME}.writeup"), CODES,
                    tuple(SCENARIOS), WRITEUP_SHOWS, program, run_one, clear_ledger)
"""This case study, as the registry (``lessons``) lists it."""
