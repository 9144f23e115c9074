"""Case study 3's scenarios, guarantees and write-up symptoms, and one run of them.

Both scenarios publish one burst: ``EVENTS`` payloads from a seed (``events.generate``: 6
suppliers with 8 lots open each, every ``INVALID_EVERY``-th payload invalid, every
``DUPLICATE_EVERY``-th a resend of a recent one), all at once, before the workers have
drained any of it.

- ``burst``: the ledger drops its connection twice for three events (``FLAKY:2``), a process
  is killed in the middle of one event's commit (``CRASH_ONCE``), and one event's commits
  fail until the operator mends the cause (``FLAKE_FOREVER``): its retries run out. Once
  drained, the operator mends it and replays the dead letters (fixed). Each fault falls on
  an event of a lot and a message of its own, of a CTE type both programs' models know.
  Guarantees (fixed), exact:
  - CT1: the ledger holds every valid distinct event once and nothing else; quarantined ==
    the invalid payloads, each kept as sent; no dead letter pending after the replay;
  - CT2: each lot's events were committed in the order produced (the ledger's commit order
    per lot equals the stream's), zero out-of-order commits, zero refusals by the guard;
  - CT3: the flaky events took 3 attempts, the crashed one 2; the exhausted event was
    dead-lettered with its payload, its lot's later events held behind it, and the replay
    committed each once (8 attempts: in its message's transaction, 1 + 5 alone, the replay's);
  - CT4: the metrics equal the ledger: events by outcome and supplier, retries (12), every
    shard's queue depth 0 at the end after falling during the drain, dead-letter depth 0.
  Write-up symptoms (``--prove``, the same burst on ``writeup.py``, on its Redis broker, each
  payload under its field names, ``stand_ins.as_published``):
  - CT1 write-up: its model lets through the 14 events the fixed contract refuses (10 whose GLN
    or GTIN fails its GS1 check digit: its patterns count digits; 4 without a KDE their CTE type
    requires: it reads none), each committed; it refuses the 23 other invalid payloads and all
    476 valid initial packing and first land-based receiving events (it knows 5 of the rule's 7
    CTE types), each quarantined as sent (486 payloads: 13 of the 499 are resends);
  - CT2 write-up: events committed behind later events of their lot;
  - CT3 write-up: the exhausted event is lost: FAILURE after 6 attempts, in no ledger
    table and in no dead-letter store.
- ``dry_run``: the workers run with ``CTE_DRY_RUN=1``. CT5: the ledger is untouched (no row
  in any table) and the metrics count exactly the outcomes a real run has on this stream.
- ``outage``: the first ``OUTAGE_EVENTS`` payloads of the stream, published while the ledger is
  down (every commit refused); the runner brings it back once the outage has outlasted an
  event's whole backoff (the write-up: a task FAILURE after its 1 + 5 attempts; fixed: an
  event dead-lettered ``retries_exhausted``), never on a timer. CT7 (fixed): every event whose
  retries ran out dead-lettered with its payload, its lot held behind it, the replay committing
  each once; every valid distinct event committed once, in each lot's order (CT1, CT2).
  CT7 write-up: each event whose retries ran out is FAILURE, acked, in no table and no
  dead-letter store; committed == the rest, exactly.
- ``no_seq``: the burst and its faults, every payload without ``seq`` (real feeds send none).
  CT6: each lot's events committed in the order produced (the ledger's commit order of their
  idempotency keys equals the stream's), the ledger's numbers 1..n per lot, assigned under the
  lot's lock, zero out-of-order commits; CT1, CT3 and CT4 as in ``burst``.

``STUDY`` is this case study behind the lab's lesson interface (``lab.lesson.CaseStudy``), registered in
``lessons``; its ``run_one(cell, kind, on_stage)`` is what the harness calls for a cell ``cte_ingestion/<scenario>``:
kind ``fixed`` runs ``fixed.py`` (one worker per shard), ``broken`` the write-up (one worker, two
processes on one queue).

One piece: this case study's scenarios, the faults each plays and the checks on their runs read together as
its specification; its domain code sits beside it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from celery.result import AsyncResult
from sqlalchemy import select

from case_studies.cte_ingestion import stand_ins
from case_studies.cte_ingestion.events import CteType, InvalidKind, RawEvent, Stream, generate, idempotency_key, validate
from case_studies.cte_ingestion.ledger import DeadLetter, Ledger, LedgerCounts
from case_studies.cte_ingestion.metrics import CteMetrics, exporter_registry, outcomes, read, render, reset_dir
from case_studies.logs import clear_event_logs
from lab import records
from lab.lesson import FolderStudy, Programs
from lab.running import Watch, WorkerSpec, case_run, checked, connect, purge, reset, running_workers, set_current
from lab.records import Check, Collector
from lab.faults import CRASH_ONCE, FLAKE_FOREVER, FLAKY, Fault
from lab.fm import Fm, load_module
from lab.queues import queue_depth
from lab.runner import new_run_id
from lab.records import Observations, Outcome
from lab.waiting import wait_until
from lab.workers import LOG_DIR, STATE_DIR, STOP_GRACE
from shared.backend import backend_redis

NAME = "cte_ingestion"
SEED, EVENTS, INVALID_EVERY, DUPLICATE_EVERY = 20261130, 2000, 53, 41
RUN_TIMEOUT = 90.0
METRICS_DIR = STATE_DIR / "metrics"
FLAKY_TIMES = 2
EXHAUSTED_ATTEMPTS = {"fixed": 8, "broken": 6}
"""fixed: once in its message's transaction, 1 + 5 retries alone, then the replay's; write-up: 1 + 5 retries."""
EXPECTED_RETRIES = 3 * FLAKY_TIMES + 6
"""fixed: per flaky event, its message's transaction and its own first attempt; for the exhausted one, its
message's transaction and its 5 retries."""


@dataclass(frozen=True)
class Scenario:
    name: str
    number: int
    faults: bool = False
    dry_run: bool = False
    no_seq: bool = False  # every payload without seq: the ledger numbers each lot's events as it commits them
    outage: bool = False  # the ledger down from the publish until the outage outlasted an event's backoff


SCENARIOS: dict[str, Scenario] = {
    "burst": Scenario("burst", 1, faults=True),
    "dry_run": Scenario("dry_run", 2, dry_run=True),
    "no_seq": Scenario("no_seq", 3, faults=True, no_seq=True),
    "outage": Scenario("outage", 4, outage=True),
}
WRITEUP_SHOWS = ("burst", "outage")
"""The scenarios ``--prove`` also runs on the write-up's code."""

CODES: dict[str, records.Kind] = {"ct": "fixed", "ctw": "broken"}
"""The namespace codes of the two programs (their queues are ``<namespace>.ct.shard.<k>``, ...)."""


def program(kind: records.Kind) -> Fm:
    if kind == "broken":
        return checked(load_module(f"case_studies.{NAME}.writeup", member="ingest_event", body="quarantine_event"))
    return checked(load_module(f"case_studies.{NAME}.fixed", member="ingest_batch", body="replay_batch"))


def code_of(kind: records.Kind) -> str:
    return "ctw" if kind == "broken" else "ct"


def open_ledger(clear: bool = False) -> Ledger:
    """The ledger, its tables made (emptied of this namespace's rows, with ``clear``); a database
    that does not answer is a broken run that names it (URL masked)."""
    return Ledger().opened(clear)


def clear_ledger() -> None:
    """Delete this namespace's rows from the CTE ledger and its decision log (``run_all_fms.py --clean``)."""
    open_ledger(clear=True)
    clear_event_logs("ct")
    clear_event_logs("ctw")


# ---- the burst and its faults ------------------------------------------------------


OUTAGE_EVENTS = 200
"""The outage's stream: the burst's first 200 payloads (every event of it retries through the outage)."""


def stream(no_seq: bool = False, events: int = EVENTS) -> Stream:
    """The burst (its first ``events`` payloads); ``no_seq``: each payload without its ``seq``, as real feeds send them."""
    s = generate(SEED, events, invalid_every=INVALID_EVERY, duplicate_every=DUPLICATE_EVERY)
    if not no_seq:
        return s
    return replace(s, payloads=tuple({k: v for k, v in p.items() if k != "seq"} for p in s.payloads))


LOOSE: tuple[InvalidKind, ...] = ("gln_check_digit", "gtin_check_digit", "missing_kde")
"""The invalid kinds the write-up's model lets through: its patterns count digits, not the GS1 check digit, and
it reads none of the KDEs the rule requires per CTE type (``extra="ignore"``)."""
WRITEUP_CTE_TYPES: tuple[CteType, ...] = ("harvesting", "cooling", "shipping", "receiving", "transformation")
"""The CTE types the write-up's model knows (``writeup.CTEEvent.event_type``): not initial packing, not first
land-based receiving, which it refuses (``literal_error``) however valid."""


def writeup_takes(s: Stream, position: int) -> bool:
    """Whether the write-up's model validates the payload at ``position``: a type it knows, and valid for the fixed
    contract or invalid only in a way it cannot see (``LOOSE``)."""
    return (s.payloads[position]["event_type"] in WRITEUP_CTE_TYPES
            and (position not in s.invalid or s.invalid[position] in LOOSE))


def loose(s: Stream) -> tuple[int, ...]:
    """Positions of the payloads the fixed contract refuses and the write-up's model takes."""
    return tuple(p for p in sorted(s.invalid) if writeup_takes(s, p))


def writeup_refused(s: Stream) -> tuple[int, ...]:
    """Positions of the payloads the write-up's model refuses (each sent to its quarantine; a resend too): the
    invalid ones it sees, and every event of a CTE type it does not know."""
    return tuple(p for p in range(len(s.payloads)) if not writeup_takes(s, p))


def writeup_keys(s: Stream) -> frozenset[str]:
    """The idempotency keys the write-up's program commits when nothing is lost: one per distinct event it takes."""
    return frozenset(raw_key(s.payloads[p]) for p in range(len(s.payloads)) if writeup_takes(s, p))


def raw_key(payload: RawEvent) -> str:
    """The write-up's idempotency key of a payload, valid or not: sha256 of ``lot|type|source id``."""
    text = f"{payload.get('lot_code', '')}|{payload.get('event_type', '')}|{payload.get('source_event_id', '')}"
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class FaultPlan:
    flaky: tuple[int, ...]  # positions in the stream
    crash: int
    exhausted: int
    held: tuple[int, ...]  # the exhausted event's lot's later events: held behind it

    def faults(self, s: Stream) -> dict[str, Fault]:
        plan = {key_at(s, p): FLAKY(FLAKY_TIMES) for p in self.flaky}
        plan[key_at(s, self.crash)] = CRASH_ONCE
        plan[key_at(s, self.exhausted)] = FLAKE_FOREVER  # until the operator mends it (fixed: before the replay)
        return plan


def key_at(s: Stream, position: int) -> str:
    event = validate(s.payloads[position], now=s.as_of)
    if not hasattr(event, "seq"):
        raise ValueError(f"payload {position} is not a valid event")
    return idempotency_key(cast(Any, event))


def _lot(s: Stream, position: int) -> str:
    return stand_ins.lot_of(s.payloads[position])


def choose_faults(s: Stream, shards: int, batch: int) -> FaultPlan:
    """Valid events never resent, each in a lot and a message of its own: three flaky ones, one
    killed mid-commit that opens its message, and one whose retries run out, in a lot with later
    events and no resend after it. Each of a CTE type the write-up's model knows, so that both
    programs meet every fault."""
    resent = set(s.duplicates.values())
    fresh = [p for p in range(len(s.payloads)) if p not in s.invalid and p not in s.duplicates and p not in resent
             and writeup_takes(s, p)]
    heads: set[int] = set()
    message: dict[int, tuple[int, int]] = {}  # position -> (shard, its message's number in the shard)
    filled: dict[int, int] = {}
    for p, payload in enumerate(s.payloads):
        shard = stand_ins.shard_of(stand_ins.lot_of(payload), shards)
        if filled.get(shard, 0) % batch == 0:
            heads.add(p)
        message[p] = (shard, filled.get(shard, 0) // batch)
        filled[shard] = filled.get(shard, 0) + 1
    used: set[str] = set()
    messages: set[tuple[int, int]] = set()

    def later(p: int) -> list[int]:
        return [q for q in range(p + 1, len(s.payloads)) if _lot(s, q) == _lot(s, p)]

    def pick(start: int, ok: Callable[[int], bool]) -> int:
        p = next(p for p in fresh if p >= start and _lot(s, p) not in used and message[p] not in messages and ok(p))
        used.add(_lot(s, p))
        messages.add(message[p])
        return p

    exhausted = pick(100, lambda p: len(later(p)) >= 2 and all(q not in s.duplicates for q in later(p)))
    held = tuple(q for q in later(exhausted) if q not in s.invalid)
    flaky = tuple(pick(start, lambda p: True) for start in (50, 600, 1200))
    crash = pick(300, lambda p: p in heads)
    return FaultPlan(flaky, crash, exhausted, held)


# ---- one run ------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseRun:
    obs: Observations
    scenario: Scenario
    kind: records.Kind
    stream: Stream
    plan: FaultPlan | None
    counts: LedgerCounts
    sequences: Mapping[str, list[int]]
    quarantined: frozenset[str]  # the payload texts the ledger kept
    committed_keys: frozenset[str]
    before_replay: tuple[DeadLetter, ...]
    replayed: Mapping[str, int]  # lot -> dead letters sent back
    attempts: Mapping[int, int]  # fault position -> ledger attempts
    lot_keys: Mapping[str, list[str]]  # per lot, the committed keys in commit order
    samples: Mapping[str, float]  # every metric sample at the end
    by_supplier: Mapping[tuple[str, str], int]  # the ledger's (outcome, supplier) counts
    depths: tuple[tuple[float, tuple[int, ...]], ...]  # (seconds since publishing, depth per queue)
    publish_seconds: float
    drain_seconds: float
    lost_state: str | None = None  # write-up: the state of the exhausted event's task
    extra: Mapping[str, Any] = field(default_factory=lambda: {})


class Drain:
    """The console's view of a drain: each queue's depth, sampled as it falls, printed about once a second."""

    def __init__(self, fm: Fm, gauges: CteMetrics, say: Callable[[str], None] = print) -> None:
        self.fm, self.gauges, self.say = fm, gauges, say
        self.names = [str(q.name) for q in fm.task_queues]
        self.conn = connect(fm)
        options = cast(dict[str, Any], fm.app.conf.broker_transport_options or {})
        self.list_prefix = str(options.get("global_keyprefix") or "") if "global_keyprefix" in options else None
        self.started = time.monotonic()
        self.samples: list[tuple[float, tuple[int, ...]]] = []
        self.printed = 0.0

    def depth(self, name: str) -> int:
        """Messages waiting in queue ``name``: on a Redis broker the length of its list (its key under the
        program's prefix), on RabbitMQ the broker's count."""
        if self.list_prefix is not None:
            return int(cast(Any, backend_redis(self.fm.app)[0].llen(f"{self.list_prefix}{name}")))
        return queue_depth(self.conn, name)

    def sample(self) -> tuple[int, ...]:
        depths = tuple(self.depth(n) for n in self.names)
        now = time.monotonic() - self.started
        self.samples.append((now, depths))
        for name, d in zip(self.names, depths):
            self.gauges.set_queue_depth(name.rsplit(".", 1)[-1] if "shard" in name else name, d)
        if now - self.printed >= 1.0:
            self.printed = now
            self.say(f"  {self.fm.short} {now:5.1f}s queue depth {' '.join(str(d) for d in depths)} (total {sum(depths)})")
        return depths

    def close(self) -> None:
        self.conn.release()


RUNNER_GAUGES = ("cte_queue_depth", "cte_dead_letter_depth")
"""Set by the runner, which measures them; the workers' copies (never set) are left out."""


def _of(line: str, families: tuple[str, ...]) -> bool:
    return line.removeprefix("# HELP ").removeprefix("# TYPE ").startswith(families)


def _without(text: str, families: tuple[str, ...]) -> str:
    """An exposition without the lines of ``families`` (their HELP, TYPE and samples)."""
    return "".join(line for line in text.splitlines(keepends=True) if not _of(line, families))


def _only(text: str, families: tuple[str, ...]) -> str:
    """An exposition with only the lines of ``families``."""
    return "".join(line for line in text.splitlines(keepends=True) if _of(line, families))


def _handled(folder: Any) -> int:
    return sum(outcomes(read(exporter_registry(folder))).values())


def _meta_states(fm: Fm, ids: Sequence[str]) -> list[str]:
    backend = cast(Any, fm.app.backend)
    states: list[str] = []
    for start in range(0, len(ids), 1000):
        keys = [backend.get_key_for_task(i) for i in ids[start:start + 1000]]
        for raw in cast(list[Any], backend.client.mget(keys)):
            states.append(str(json.loads(raw)["status"]) if raw else "PENDING")
    return states


def _ended_states(fm: Fm, ids: Sequence[str], ended: dict[str, str]) -> list[str]:
    """``_meta_states``, where a task once read SUCCESS or FAILURE stays so (``ended``, filled in here).

    The write-up's retries race its own last attempt: ``Task.retry`` publishes the next attempt
    (``S.apply_async()``) before the worker stores RETRY for this one, and the backend's ``_store_result`` keeps
    only a SUCCESS from being overwritten (``KeyValueStoreBackend._store_result``, Celery 5.5.3, 5.6.3, 5.7.0).
    In one matrix run on 5.6 the fifth attempt stalled 0.9 s between the two; the sixth ran, failed and stored
    FAILURE; the fifth's RETRY then replaced it, and the check read RETRY."""
    states = _meta_states(fm, ids)
    for task_id, state in zip(ids, states):
        if state in ("SUCCESS", "FAILURE"):
            ended.setdefault(task_id, state)
    return [ended.get(task_id, state) for task_id, state in zip(ids, states)]


def run_scenario(fm: Fm, sc: Scenario, kind: records.Kind, run_id: str, metrics_dir: Any,
                 watch: Callable[[], None] | None = None, say: Callable[[str], None] = print) -> CaseRun:
    s = stream(sc.no_seq, OUTAGE_EVENTS if sc.outage else EVENTS)
    module = __import__(fm.module, fromlist=["submit"])
    shards = len(fm.task_queues)
    plan = choose_faults(s, shards, int(getattr(module, "BATCH", 1))) if sc.faults else None
    stand_ins.plan_faults(fm.app, plan.faults(s) if plan else {})
    ledger = open_ledger()
    clear_event_logs("ct")  # the programs' decision logs: this run's lines only (their workers open them later)
    clear_event_logs("ctw")
    gauges = CteMetrics()  # the runner's: queue depth per shard, dead-letter depth
    drain = Drain(fm, gauges, say)

    def look() -> None:
        if watch is not None:
            watch()
        drain.sample()

    payloads = [stand_ins.as_published(p) for p in s.payloads] if kind == "broken" else list(s.payloads)
    outage: list[float] = []  # seconds since publishing: when the ledger went down, when it came back
    stand_ins.set_outage(fm.app, False)
    if sc.outage:
        stand_ins.set_outage(fm.app, True)
        outage.append(0.0)
    started = time.monotonic()

    def outlasted(backoff_used: Callable[[], bool]) -> None:
        """Bring the ledger back once an event has used its whole backoff during the outage."""
        if len(outage) == 1 and backoff_used():
            stand_ins.set_outage(fm.app, False)
            outage.append(time.monotonic() - started)

    submitted_at = time.time()
    results: list[AsyncResult[Any]] = []
    if kind == "broken":
        results = cast("Callable[[list[RawEvent]], list[AsyncResult[Any]]]", fm.submit)(payloads)
    else:
        cast(Callable[[list[RawEvent]], int], fm.submit)(payloads)
    published = time.monotonic() - started
    ids = [r.id for r in results]
    lost_state: str | None = None
    failed: tuple[int, ...] = ()
    before: tuple[DeadLetter, ...] = ()
    replayed: dict[str, int] = {}
    try:
        if kind == "broken":
            refused = _texts([payloads[p] for p in writeup_refused(s)])
            ended: dict[str, str] = {}  # each task's first SUCCESS or FAILURE read, kept: see _ended_states

            def settled() -> bool:
                look()
                states = _ended_states(fm, ids, ended)
                outlasted(lambda: "FAILURE" in states)
                return (len(outage) != 1 and all(st in ("SUCCESS", "FAILURE") for st in states)
                        and ledger.counts().quarantined >= len(refused))
            wait_until(settled, RUN_TIMEOUT, interval=0.25)
            drained = time.monotonic() - started
            states = _ended_states(fm, ids, ended)
            if plan is not None:
                lost_state = states[plan.exhausted]
            failed = tuple(p for p, st in enumerate(states) if st == "FAILURE")
        else:
            def handled(n: int) -> Callable[[], bool]:
                def check() -> bool:
                    look()
                    outlasted(lambda: ledger.counts().dead_letters_pending > 0)
                    return len(outage) != 1 and _handled(metrics_dir) >= n
                return check
            wait_until(handled(len(payloads)), RUN_TIMEOUT, interval=0.25)
            drained = time.monotonic() - started
            before = tuple(ledger.pending_dead_letters(10_000))
            if (plan is not None or sc.outage) and not sc.dry_run:
                if plan is not None:
                    stand_ins.repair(fm.app, key_at(s, plan.exhausted))  # the operator mends the cause, then replays
                replayed = cast(Callable[..., dict[str, int]], getattr(module, "replay"))(source=ledger)
                wait_until(handled(len(payloads) + sum(replayed.values())), RUN_TIMEOUT, interval=0.25)
            look()
    finally:
        drain.close()
        stand_ins.set_outage(fm.app, False)  # a run that failed mid-outage leaves no ledger down
    counts = ledger.counts()
    gauges.set_dead_letter_depth(counts.dead_letters_pending)
    samples = dict(read(gauges.registry))
    text = _only(render(gauges.registry), RUNNER_GAUGES)
    if kind == "fixed":
        gathered = exporter_registry(metrics_dir)
        samples.update({k: v for k, v in read(gathered).items() if not k.startswith(RUNNER_GAUGES)})
        text = _without(render(gathered), RUNNER_GAUGES) + text
    positions = ((*plan.flaky, plan.crash, plan.exhausted) if plan else ())
    attempts = {p: stand_ins.attempts(fm.app, key_at(s, p)) for p in positions}
    obs = Observations(  # the observer follows documents; these tasks carry none: no lanes, the checks say it all
        fm=fm.short, run_id=run_id, scenario=sc.number, docs=(), attempts={f"p{p}": n for p, n in attempts.items()},
        fetch_attempts={}, events=(), notify_runs={}, emails=(), mail_calls=0,
        chord=Outcome("SUCCESS" if counts.committed else "PENDING", None, None, None), duplicate=None,
        dlq_depth=counts.dead_letters_pending, probe_seconds=None, burst_probe=None, stopped_by="drained",
        submitted_at=submitted_at, elapsed=time.monotonic() - started)
    with ledger.engine.connect() as conn:
        committed_keys = frozenset(str(k) for k in conn.execute(select(ledger.events_table.c.key)).scalars())
    return CaseRun(obs, sc, kind, s, plan, counts, ledger.lot_sequences(), frozenset(ledger.quarantined()),
                   committed_keys, before, replayed, attempts, ledger.lot_keys(), samples, ledger.by_supplier(),
                   tuple(drain.samples), published, drained, lost_state,
                   {"exposition": text, "outage": tuple(outage), "failed": failed})


# ---- guarantees (fixed) and symptoms (write-up) ---------------------------------------


def _texts(payloads: Sequence[RawEvent]) -> frozenset[str]:
    return frozenset(json.dumps(p, sort_keys=True, ensure_ascii=False) for p in payloads)


def _invalid_texts(s: Stream) -> frozenset[str]:
    return _texts([s.payloads[p] for p in s.invalid])


def _ledger_exact(run: CaseRun) -> Check:
    c = Collector("CT1")
    s, got = run.stream, run.counts
    c.expect(got.committed == s.valid_distinct, f"committed {got.committed}", f"{s.valid_distinct} (valid distinct events)")
    c.expect(got.quarantined == len(s.invalid) and run.quarantined == _invalid_texts(s),
             f"quarantined {got.quarantined}{'' if run.quarantined == _invalid_texts(s) else ', not the invalid payloads'}",
             f"{len(s.invalid)}, each invalid payload as sent")
    c.expect(got.dead_letters_pending == 0, f"dead letters pending {got.dead_letters_pending}", "0 after the replay")
    return c.result()


def _in_order(run: CaseRun) -> Check:
    c = Collector("CT2")
    want = {lot: list(seqs) for lot, seqs in run.stream.lot_sequences.items()}
    differ = sorted(lot for lot in set(want) | set(run.sequences) if want.get(lot) != run.sequences.get(lot))
    c.expect(not differ, f"{len(differ)} of {len(want)} lots committed in another order{': ' + differ[0] if differ else ''}",
             f"all {len(want)} lots in the order produced")
    c.expect(run.counts.out_of_order_commits == 0 and run.counts.out_of_order_attempts == 0,
             f"out-of-order commits {run.counts.out_of_order_commits}, refused {run.counts.out_of_order_attempts}", "0 and 0")
    return c.result()


def _retried_and_replayed(run: CaseRun) -> Check:
    c = Collector("CT3")
    plan, s = run.plan, run.stream
    if plan is None:
        c.expect(False, "no fault plan", "a plan")
        return c.result()
    flaky = [run.attempts.get(p, 0) for p in plan.flaky]
    c.expect(flaky == [FLAKY_TIMES + 1] * 3, f"flaky events' attempts {flaky}",
             f"{[FLAKY_TIMES + 1] * 3} (its message's transaction, then alone: a failure and a commit)")
    crashed = run.attempts.get(plan.crash, 0)
    c.expect(crashed == 2, f"crashed event's attempts {crashed}", "2 (killed mid-commit, redelivered)")
    exhausted = run.attempts.get(plan.exhausted, 0)
    c.expect(exhausted == EXHAUSTED_ATTEMPTS["fixed"], f"exhausted event's attempts {exhausted}",
             f"{EXHAUSTED_ATTEMPTS['fixed']} (its message's transaction, 1 + 5 retries alone, the replay)")
    letters = {d.key: d for d in run.before_replay}
    want = {key_at(s, plan.exhausted), *(key_at(s, q) for q in plan.held)}
    first = letters.get(key_at(s, plan.exhausted))
    raw = json.dumps(s.payloads[plan.exhausted], sort_keys=True, ensure_ascii=False)
    c.expect(set(letters) == want, f"dead letters before the replay {len(letters)}",
             f"{len(want)}: the exhausted event and the {len(plan.held)} later event(s) of its lot held behind it")
    c.expect(first is not None and first.payload == raw and first.reason.startswith("retries_exhausted")
             and all(letters[k].reason == "held" for k in want - {key_at(s, plan.exhausted)} if k in letters),
             f"first: {first.reason.split(':')[0] if first else 'missing'}, payload {'kept' if first and first.payload == raw else 'not kept'}",
             "retries_exhausted with its payload as sent; the others held")
    c.expect(want <= run.committed_keys and sum(run.replayed.values()) == len(want),
             f"replayed {sum(run.replayed.values())}, committed {len(want & run.committed_keys)}", f"{len(want)}, each once")
    return c.result()


def _metric(samples: Mapping[str, float], name: str) -> float:
    return samples.get(name, 0.0)


def _metrics_equal_ledger(run: CaseRun) -> Check:
    c = Collector("CT4")
    got = outcomes(run.samples)
    dups = Counter(("deduplicated", str(run.stream.payloads[p]["supplier_id"])) for p in run.stream.duplicates)
    want = {**{k: v for k, v in run.by_supplier.items() if v}, **dups}
    c.expect(got == want, f"metrics {sum(got.values())} outcomes"
             + (f", differing at {sorted(set(got.items()) ^ set(want.items()))[:2]}" if got != want else ""),
             f"the ledger's {sum(want.values())} (by outcome and supplier)")
    retries = int(_metric(run.samples, "cte_retries_total"))
    c.expect(retries == EXPECTED_RETRIES, f"retries {retries}", f"{EXPECTED_RETRIES} (2 per flaky event, 1 + 5 for the exhausted)")
    finals = {k: v for k, v in run.samples.items() if k.startswith("cte_queue_depth")}
    peak = max((sum(d) for _, d in run.depths), default=0)
    c.expect(bool(finals) and not any(finals.values()) and peak > 0,
             f"queue depth peaked at {peak}, ends {sorted(int(v) for v in finals.values())}",
             "falling to 0 on every shard")
    dl = _metric(run.samples, "cte_dead_letter_depth")
    c.expect(dl == run.counts.dead_letters_pending == 0, f"dead-letter depth {dl:g}", "0 (the ledger's pending)")
    c.expect(True, f"published {EVENTS} in {run.publish_seconds:.2f}s, drained in {run.drain_seconds:.1f}s")
    return c.result()


def _in_order_without_seq(run: CaseRun) -> Check:
    c = Collector("CT6")
    s = run.stream
    want: dict[str, list[str]] = {}
    for p, payload in enumerate(s.payloads):
        if p not in s.invalid and p not in s.duplicates:
            want.setdefault(stand_ins.lot_of(payload), []).append(raw_key(payload))
    differ = sorted(lot for lot in set(want) | set(run.lot_keys) if want.get(lot) != run.lot_keys.get(lot))
    sent = sum("seq" in p for p in s.payloads)
    c.expect(not differ and sent == 0, f"{len(differ)} of {len(want)} lots committed in another order "
             f"({sent} payloads sent a seq)", f"all {len(want)} lots in the order produced, no payload with a seq")
    numbered = all(seqs == list(range(1, len(seqs) + 1)) for seqs in run.sequences.values())
    c.expect(numbered and run.counts.out_of_order_commits == 0 and run.counts.out_of_order_attempts == 0,
             f"ledger numbers {'1..n' if numbered else 'not 1..n'} in every lot; out-of-order commits "
             f"{run.counts.out_of_order_commits}, refused {run.counts.out_of_order_attempts}",
             "1..n per lot, assigned under the lot's lock; 0 and 0")
    return c.result()


def _outage_seconds(run: CaseRun) -> str:
    spans = tuple(run.extra.get("outage", ()))
    return f"ledger down {spans[1] - spans[0]:.1f}s" if len(spans) == 2 else "the outage never ended"


def _outage_replayed(run: CaseRun) -> Check:
    c = Collector("CT7")
    s = run.stream
    exhausted = {d.key for d in run.before_replay if d.reason.startswith("retries_exhausted")}
    held = {d.key for d in run.before_replay if d.reason == "held"}
    lots = {d.lot for d in run.before_replay if d.key in exhausted}
    c.expect(len(run.extra.get("outage", ())) == 2 and len(exhausted) > 0,
             f"{_outage_seconds(run)}; {len(exhausted)} event(s) dead-lettered retries_exhausted, {len(held)} held",
             "> 0 events whose whole backoff the outage outlasted, each dead-lettered")
    c.expect(len(exhausted) + len(held) == len(run.before_replay) and {d.lot for d in run.before_replay} == lots,
             f"dead letters in {len({d.lot for d in run.before_replay})} lot(s), {len(lots)} with an exhausted event",
             "only the exhausted events' lots, each held behind its first")
    letters = exhausted | held
    c.expect(letters <= run.committed_keys and sum(run.replayed.values()) == len(letters)
             and run.counts.dead_letters_pending == 0,
             f"replayed {sum(run.replayed.values())}, committed {len(letters & run.committed_keys)}, "
             f"pending {run.counts.dead_letters_pending}", f"{len(letters)}, each once; 0 pending")
    c.expect(run.counts.committed == s.valid_distinct, f"committed {run.counts.committed}",
             f"{s.valid_distinct}: every valid distinct event")
    return c.result()


def _writeup_outage_lost(run: CaseRun) -> Check:
    c = Collector("CT7 write-up")
    s = run.stream
    failed = set[int](run.extra.get("failed", ()))
    copies: dict[str, set[int]] = {}  # an event's key to the positions that carry it (a resend: two)
    for p, payload in enumerate(s.payloads):
        copies.setdefault(raw_key(payload), set()).add(p)
    lost = {key for key, where in copies.items() if where <= failed}  # every copy FAILURE
    c.expect(len(run.extra.get("outage", ())) == 2 and len(lost) > 0 and not (lost & run.committed_keys)
             and run.counts.dead_lettered == 0,
             f"{_outage_seconds(run)}; {len(failed)} task(s) FAILURE, {len(lost)} event(s) with no other copy, "
             f"{len(lost & run.committed_keys)} of them in the ledger, dead letters {run.counts.dead_lettered}",
             "> 0 events FAILURE after 1 + 5 attempts, none in the ledger, nothing dead-lettered: lost")
    taken = writeup_keys(s)
    want = len(taken) - len(lost)
    c.expect(run.counts.committed == want, f"committed {run.counts.committed}",
             f"{want} (every other event its model takes: {len(taken)} distinct, {len(loose(s))} of them let "
             "through, - the lost)")
    return c.result()


def _dry(run: CaseRun) -> Check:
    c = Collector("CT5")
    got = run.counts
    zero = LedgerCounts(0, 0, 0, 0, 0, 0)
    c.expect(got == zero and not run.sequences, f"ledger rows: committed {got.committed}, quarantined {got.quarantined}, "
             f"dead letters {got.dead_lettered}", "none: the dry run writes nothing")
    would = outcomes(run.samples)
    want = run.stream.expected_outcomes()
    c.expect(would == want, f"decided {sum(would.values())} outcomes{'' if would == want else ' (differ)'}",
             f"a real run's {sum(want.values())}, by outcome and supplier")
    return c.result()


def _writeup_loose(run: CaseRun) -> Check:
    c = Collector("CT1 write-up")
    s = run.stream
    through = loose(s)
    committed = [p for p in through if raw_key(s.payloads[p]) in run.committed_keys]
    kinds = Counter(s.invalid[p] for p in through)
    c.expect(len(through) > 0 and committed == list(through),
             f"{len(committed)} of the {len(through)} events the fixed contract refuses committed "
             f"({kinds['gln_check_digit'] + kinds['gtin_check_digit']} with a wrong GS1 check digit, "
             f"{kinds['missing_kde']} lacking a KDE their type requires)",
             f"all {len(through)}: its patterns count digits and it reads no KDE the rule requires per CTE type")
    unknown = _texts([stand_ins.as_published(s.payloads[p]) for p in writeup_refused(s) if p not in s.invalid])
    refused = _texts([stand_ins.as_published(s.payloads[p]) for p in writeup_refused(s)])
    c.expect(run.quarantined == refused, f"quarantined {len(run.quarantined)}"
             f"{'' if run.quarantined == refused else ', not the payloads its model refuses'}",
             f"{len(refused)} as sent: the {len(refused) - len(unknown)} other invalid payloads and {len(unknown)} "
             "valid initial packing and first land-based receiving events (its model knows 5 CTE types of 7)")
    return c.result()


def _writeup_order(run: CaseRun) -> Check:
    c = Collector("CT2 write-up")
    want = {lot: list(seqs) for lot, seqs in run.stream.lot_sequences.items()}
    differ = [lot for lot, seqs in run.sequences.items() if seqs != sorted(seqs)]
    c.expect(run.counts.out_of_order_commits > 0, f"{run.counts.out_of_order_commits} events committed behind a later "
             f"event of their lot, in {len(differ)} of {len(want)} lots", "> 0: one queue does not keep a lot's order")
    return c.result()


def _writeup_lost(run: CaseRun) -> Check:
    c = Collector("CT3 write-up")
    plan, s = run.plan, run.stream
    if plan is None:
        c.expect(False, "no fault plan", "a plan")
        return c.result()
    key = key_at(s, plan.exhausted)
    a = run.attempts.get(plan.exhausted, 0)
    want = EXHAUSTED_ATTEMPTS["broken"]
    c.expect(run.lost_state == "FAILURE" and a == want, f"its task {run.lost_state} after {a} attempts",
             f"FAILURE after {want} (1 + 5 retries), the message acked")
    c.expect(key not in run.committed_keys and run.counts.dead_lettered == 0,
             f"in the ledger: {'yes' if key in run.committed_keys else 'no'}; dead letters {run.counts.dead_lettered}",
             "no and 0: the event is lost")
    want_committed = len(writeup_keys(s)) - 1
    c.expect(run.counts.committed == want_committed, f"committed {run.counts.committed}",
             f"{want_committed} (the distinct events its model takes, the {len(loose(s))} let through among them, "
             "one missing)")
    return c.result()


def checks_of(kind: records.Kind, run: CaseRun) -> list[Check]:
    if kind == "broken" and run.scenario.outage:
        return [_writeup_outage_lost(run)]
    if kind == "broken":
        return [_writeup_loose(run), _writeup_order(run), _writeup_lost(run)]
    if run.scenario.outage:
        return [_ledger_exact(run), _in_order(run), _outage_replayed(run)]
    if run.scenario.dry_run:
        return [_dry(run)]
    if run.scenario.no_seq:
        return [_ledger_exact(run), _in_order_without_seq(run), _retried_and_replayed(run), _metrics_equal_ledger(run)]
    return [_ledger_exact(run), _in_order(run), _retried_and_replayed(run), _metrics_equal_ledger(run)]


# ---- the harness's cell ---------------------------------------------------------------


def worker_specs(fm: Fm, sc: Scenario, metrics_dir: Any) -> list[WorkerSpec]:
    env = (("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir)), *((("CTE_DRY_RUN", "1"),) if sc.dry_run else ()))
    if fm.short == "ctw":
        return [WorkerSpec(env=env)]
    return [WorkerSpec(queue=str(q.name), env=env, part=f"shard{k}") for k, q in enumerate(fm.task_queues)]


def metrics_folder(code: str, run_id: str) -> Any:
    """A fresh multiprocess folder for the run (the namespace's earlier ones removed)."""
    if METRICS_DIR.exists():
        shutil.rmtree(METRICS_DIR, ignore_errors=True)
    folder = METRICS_DIR / f"{code}-{run_id}"
    reset_dir(folder)
    return folder


def run_one(cell: str, kind: records.Kind, on_stage: records.OnStage) -> records.RunReport:
    name = cell.split("/", 1)[1]
    sc = SCENARIOS[name]

    def run(report: records.RunReport) -> None:
        fm = program(kind)
        report.body = str(fm.notify.name).rsplit(".", 1)[-1]
        run_id = new_run_id()
        on_stage("resetting")
        reset(fm)
        open_ledger(clear=True)
        folder = metrics_folder(fm.short, run_id)
        label = f"{NAME}-{name}-{kind}"
        report.log = LOG_DIR / f"{label}-{run_id}.log"
        set_current(fm)
        with running_workers(fm, run_id, label, worker_specs(fm, sc, folder), STOP_GRACE, on_stage,
                                     after=lambda: purge(fm)) as workers:
            report.log = workers[0].log_path
            on_stage("running the scenario")
            done = run_scenario(fm, sc, kind, run_id, folder, watch=Watch(workers))
        report.observations = done.obs
        report.exposition = str(done.extra.get("exposition") or "") or None
        on_stage("checking")
        report.checks = checks_of(kind, done)

    return case_run(records.RunReport(cell, kind, code_of(kind), sc.number), run)


def run_by_hand(kind: records.Kind) -> int:
    """The ``burst`` against workers you started (``python -m case_studies.cte_ingestion.fixed``), with
    ``PROMETHEUS_MULTIPROC_DIR`` set to the same folder in their environment and this one's."""
    from case_studies.cte_ingestion.metrics import multiprocess_dir
    fm = program(kind)
    folder = multiprocess_dir()
    if kind == "fixed" and folder is None:
        print("set PROMETHEUS_MULTIPROC_DIR (the same empty folder) for the workers and for this command")
        return 2
    open_ledger(clear=True)
    sc = SCENARIOS["burst"]
    run = run_scenario(fm, sc, kind, new_run_id(), folder)
    ok = True
    for check in checks_of(kind, run):
        ok = ok and check.ok
        print(f"{sc.name}: {'ok  ' if check.ok else 'FAIL'} {check.label}: {check.detail}")
    return 0 if ok else 1


STUDY = FolderStudy(NAME, Programs(f"case_studies.{NAME}.fixed", f"case_studies.{NAME}.writeup"), CODES,
                    tuple(SCENARIOS), WRITEUP_SHOWS, program, run_one, clear_ledger)
"""This case study, as the registry (``lessons``) lists it."""
