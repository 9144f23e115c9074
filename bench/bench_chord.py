"""Benchmark: what a Celery chord costs per member, and what the lab's fixes add (issue 26).

    RCL_NAMESPACE=rclbench .venv/bin/python bench/bench_chord.py                  # N 100,1000,3000,10000, 3 repeats (10,000: 1)
    RCL_NAMESPACE=rclbench .venv/bin/python bench/bench_chord.py -n 100 1000 --repeats 2
    RCL_NAMESPACE=rclbench .venv/bin/python bench/bench_chord.py --quick          # N 20 and 60, once (the tests)

Variants (``VARIANTS``), each over every N, interleaved (for each repeat, for each N, every
variant in turn) so that a machine whose load drifts spreads it over all of them:

- ``plain-chain`` and ``plain-task``: a plain Celery chord, no lab code (``bench/plain_chord.py``);
  ``plain-chain-get``: the same chain, the submitter waiting with Celery's ``result.get()``;
- ``fm0`` .. ``fm9`` (``FMS``; fm9 the final FM): each FM file's own ``submit``, driven directly
  (no harness), with the lab's observer on, and as ``fm0-obs-off`` .. ``fm9-obs-off`` with it
  off (``lab.observe.uninstall``: the production shape);
- ``fm9-chunk10``, ``fm9-chunk50``: the final FM with 10 and 50 documents per task
  (``bench/fm9_chunked.py``), observer off (it records nothing for a chunk anyway);
- ``raw-kombu``, ``raw-redis``: the machine's limit (``bench/raw_limit.py``).

One run: the namespace's queues and keys of the variant reset, its documents written to the
document store, its worker started (``lab.workers.Worker``: its own process group) and ready;
then the clock runs from the submit until the chord body's result is stored (``_wait_for``: one
GET every 50 ms, not ``result.get()``, whose cost ``plain-chain-get`` shows); the worker is
stopped. A run counts only when every document is accounted for exactly (each of the N once among
the body's ok documents, none failed; raw kombu: each message consumed once); otherwise the
benchmark stops with ``Unaccounted`` (exit 1).

The result backend is a ``redis-server`` of the benchmark's own (``lab.owned``, no persistence),
so that its commands and its CPU are the benchmark's alone; ``--shared-redis`` uses
``CELERY_RESULT_BACKEND``'s instead (then others' commands are estimated and subtracted, and
their CPU counts). RabbitMQ is the shared one (its CPU counts others' work too).

Per run: docs/s; ms per member (wall time / N); bytes per message (the mean size, body and
headers as JSON, of the messages the submitter publishes: the chain heads, which carry the chord's
body); Redis commands per document (``INFO commandstats``, with the count per command in the
JSON); CPU seconds of the worker (its process group), the submitter (this process), RabbitMQ
(the ``beam.smp`` that listens on the broker URL's port, found through ``/proc``; a dash when it cannot
be told) and Redis (``redis-server``).

Output (``bench/results/``, which git ignores but for the published run): ``chord-<time>.json``
(every run and the min/median/max per variant and N), ``.md`` (the table) and ``.png`` (docs/s
against N per variant; needs the ``bench`` extra: ``pip install -e '.[bench]'``).
Always give it a namespace of its own (``RCL_NAMESPACE``): it deletes that namespace's keys.

One piece: one command runs, measures and writes the benchmark's tables and plot, so that a published figure
comes from one file's run.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
from urllib.parse import urlparse
import platform
import resource
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import celery
from celery.result import AsyncResult
from celery.signals import before_task_publish
from kombu import Connection, Exchange, Queue

from lab.fm import Fm, load_module
from lab.harness import delete_keys, delete_names, reset
from lab.observe import TTL_SECONDS, client, doc_id, run_prefix, short_doc
from lab.queues import queue_consumers
from lab.settings import NAMESPACE, backend_url, broker_url, redis_prefix
from lab.faults import document_text
from lab.waiting import Interrupted, wait_until
from lab.owned import OwnedRedis
from lab.workers import LOG_DIR, Worker, prune_logs
from shared.envelope import Result, is_envelope

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
DEFAULT_NS = (100, 1000, 3000, 10000)
QUICK_NS = (20, 60)
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class Unaccounted(Exception):
    """A run whose documents do not add up: it does not count, and the benchmark stops."""


@dataclass(frozen=True)
class Variant:
    name: str
    kind: str  # "celery", "raw-kombu", "raw-redis"
    program: str = ""  # the module whose app the worker serves (RCL_BENCH_FM), or bench.plain_chord
    observer: bool = True
    chunk: int = 0  # documents per task (the final FM chunked)
    plain: str = ""  # "chain" or "task" for the plain chord
    label: str = ""
    celery_get: bool = False  # the submitter waits with Celery's result.get() (its result consumer) instead of a poll
    cut_parent: bool = False  # with celery_get: the body's result without its parent (the header's GroupResult)
    default: bool = True  # in a run without --only
    quorum: bool = False  # raw kombu: the final FM's queue type and prefetch (2) instead of a classic queue and Celery's 8
    max_n: int = 0  # not run above this N (0: every N)


FMS = (
    ("fm0", "fm0_naive", "fm0 (no fix)"),
    ("fm1", "fm1_mid_pipeline_error", "fm1 (+ envelopes)"),
    ("fm2", "fm2_worker_crash", "fm2 (+ acks late, reject on worker lost)"),
    ("fm3", "fm3_dlq_reconciliation", "fm3 (+ a quorum queue with a delivery limit, dead letters, start counters, the drain)"),
    ("fm4", "fm4_duplicated_runs", "fm4 (+ the notify claim)"),
    ("fm5", "fm5_transient_failures", "fm5 (+ retries that wait in the broker)"),
    ("fm6", "fm6_task_timeouts", "fm6 (+ deadlines)"),
    ("fm7", "fm7_rolling_deploys", "fm7 (+ prefetch 1, the soft shutdown, REMAP_SIGTERM)"),
    ("fm8", "fm8_backend_outage", "fm8 (+ the result store's guard)"),
    ("fm9", "fm9_connection_loss", "fm9 (every fix: + the connection-loss settings)"),
)
"""Every FM file, in order: (variant name, module, what it adds). The last is the final FM."""
FINAL = FMS[-1][0]

VARIANTS = (
    Variant("plain-chain", "celery", "bench.plain_chord", observer=False, plain="chain",
            label="plain Celery chord, a fetch | parse chain per document, no lab code"),
    Variant("plain-chain-get", "celery", "bench.plain_chord", observer=False, plain="chain", celery_get=True, max_n=3000,
            label="plain-chain, the submitter waiting with Celery's result.get()"),
    Variant("plain-chain-get-orphan", "celery", "bench.plain_chord", observer=False, plain="chain", celery_get=True,
            cut_parent=True, default=False,
            label="plain-chain-get, the body's result cut from its parent (the header's GroupResult) before get()"),
    Variant("plain-task", "celery", "bench.plain_chord", observer=False, plain="task",
            label="plain Celery chord, one task per document, no lab code"),
    *(v for name, module, adds in FMS
      for v in (Variant(name, "celery", module, label=f"{adds}, the lab's observer on"),
                Variant(f"{name}-obs-off", "celery", module, observer=False, label=f"{name}, observer off"))),
    Variant("fm9-chunk10", "celery", "bench.fm9_chunked", observer=False, chunk=10, label="fm9, 10 documents per task"),
    Variant("fm9-chunk50", "celery", "bench.fm9_chunked", observer=False, chunk=50, label="fm9, 50 documents per task"),
    Variant("fm9-runner", "runner", "fm9_connection_loss", default=False,
            label="fm9 through the lab's runner (lab.runner.run_scenario, then the timeline), observer on"),
    Variant("fm7-runner", "runner", "fm7_rolling_deploys", default=False,
            label="fm7 through the lab's runner, observer on (the runner's cost as first measured)"),
    Variant("raw-kombu", "raw-kombu", label="raw kombu: 2 messages per document published, consumed, acked"),
    Variant("raw-kombu-quorum", "raw-kombu", quorum=True, default=False,
            label="raw kombu on the final FM's broker settings: a quorum queue, prefetch 2"),
    Variant("raw-redis", "raw-redis", label="raw Redis: the backend's 5 round trips per document, one at a time"),
)
BY_NAME = {v.name: v for v in VARIANTS}


# ---- measuring -------------------------------------------------------------------


def _proc_stat(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()  # state ppid pgrp ... utime(11) stime(12)


def _cpu(pids: Sequence[int]) -> float:
    total = 0
    for pid in pids:
        fields = _proc_stat(pid)
        if fields is not None:
            total += int(fields[11]) + int(fields[12])
    return total / CLOCK_TICKS


def _pids(match: Callable[[int, str, list[str]], bool]) -> list[int]:
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
        except OSError:
            continue
        fields = _proc_stat(int(entry.name))
        if fields is not None and match(int(entry.name), comm, fields):
            found.append(int(entry.name))
    return found


def _group(pgid: int) -> list[int]:
    return _pids(lambda _pid, _comm, fields: fields[2] == str(pgid))


_own_redis: list[int] = []
"""The pid of the benchmark's own redis-server, when it runs one (the default); empty: the shared one."""


def _listener(port: int) -> int | None:
    """The pid of the process that listens on TCP ``port`` (its socket's inode in ``/proc/net/tcp[6]``, found
    among each process's file descriptors); None when it cannot be told (another user's process, no ``/proc``)."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                inodes.add(f"socket:[{fields[9]}]")
    entries: list[Path] = list(Path("/proc").iterdir()) if inodes else []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd) in inodes for fd in (entry / "fd").iterdir()):
                return int(entry.name)
        except OSError:
            continue
    return None


def _broker_node() -> list[int]:
    """The ``beam.smp`` of the RabbitMQ node the broker URL reaches (the one listening on its port), not every
    node on the machine; empty when it cannot be told: the RabbitMQ CPU column is then left out."""
    port = urlparse(broker_url()).port or 5672
    pid = _listener(port)
    if pid is None:
        return []
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return []
    return [pid] if comm == "beam.smp" else []


def _services() -> dict[str, list[int]]:
    found = {"rabbitmq": _broker_node(),
             "redis": list(_own_redis) or _pids(lambda _p, comm, _f: comm == "redis-server")}
    return {k: v for k, v in found.items() if v}  # a party that cannot be told has no column, not a 0


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _redis_by_command() -> dict[str, int]:
    stats = cast(Mapping[str, Mapping[str, object]], cast(Any, client()).info("commandstats"))
    return {k.removeprefix("cmdstat_"): int(cast(int, v.get("calls", 0))) for k, v in stats.items()}


def _redis_calls() -> int:
    return sum(_redis_by_command().values())


_last_background = [0.0]


@dataclass
class Meter:
    """CPU of each party and the shared Redis's command count, from ``start()`` to ``stop()``."""

    worker_pgid: int | None = None
    cpu: dict[str, float] = field(default_factory=lambda: {})
    redis_commands: int = 0
    background_per_s: float = 0.0  # the shared Redis's commands per second from others, measured before the run
    seconds: float = 0.0
    _start: dict[str, float] = field(default_factory=lambda: {})
    _calls: int = 0
    _by_command: dict[str, int] = field(default_factory=lambda: {})
    by_command: dict[str, int] = field(default_factory=lambda: {})  # the delta per command (others' included)
    _t: float = 0.0
    _pids: dict[str, list[int]] = field(default_factory=lambda: {})

    def _sample(self) -> dict[str, float]:
        out = {"submitter": _self_cpu(), **{k: _cpu(v) for k, v in self._pids.items()}}
        if self.worker_pgid is not None:
            out["worker"] = _cpu(_group(self.worker_pgid))
        return out

    def background(self, calls: int, seconds: float) -> None:
        """Others' commands: ``calls`` counted over ``seconds`` in which this benchmark sent (nearly) none.
        None on the benchmark's own Redis: every command there is the run's."""
        if _own_redis:
            return
        self.background_per_s = max(0.0, calls / seconds) if seconds > 0 else 0.0
        _last_background[0] = self.background_per_s

    @property
    def own_redis_commands(self) -> float:
        """The run's commands less the background rate over its time (an estimate: others' load varies)."""
        return max(0.0, self.redis_commands - self.background_per_s * self.seconds)

    def start(self) -> None:
        self._pids = _services()
        self._start = self._sample()
        self._by_command = _redis_by_command()
        self._calls = sum(self._by_command.values())
        self._t = time.monotonic()

    def stop(self) -> None:
        self.seconds = time.monotonic() - self._t
        end_by_command = _redis_by_command()
        self.redis_commands = sum(end_by_command.values()) - self._calls - 1  # less this INFO itself
        self.by_command = {k: d for k, v in sorted(end_by_command.items()) if (d := v - self._by_command.get(k, 0)) > 0}
        end = self._sample()
        self.cpu = {k: round(end[k] - self._start.get(k, 0.0), 3) for k in end}


class PublishedSizes:
    """The size of every message this process publishes while active (Celery's ``before_task_publish``)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.active = False
        before_task_publish.connect(self._on_publish, weak=False)

    def _on_publish(self, body: object = None, headers: object = None, **_: object) -> None:
        if self.active:
            self.sizes.append(len(json.dumps(body, default=str)) + len(json.dumps(headers, default=str)))

    @contextmanager
    def counting(self) -> Generator[list[int], None, None]:
        self.sizes = []
        self.active = True
        try:
            yield self.sizes
        finally:
            self.active = False


SIZES = PublishedSizes()


# ---- running one cell -------------------------------------------------------------------


@dataclass
class Run:
    variant: str
    n: int
    repeat: int
    seconds: float
    docs_per_s: float
    ms_per_member: float
    bytes_per_message: float | None
    messages_published: int
    redis_commands_per_doc: float
    redis_background_per_s: float
    cpu: dict[str, float]
    accounted: int
    redis_by_command: dict[str, int]


def _program(variant: Variant) -> Any:
    return importlib.import_module(variant.program)


WORKER_LOGLEVEL = ["WARNING"]
"""The workers' ``--loglevel`` (``--worker-loglevel``): Celery's default, not the lab's INFO, which
writes two lines per task."""


@dataclass(frozen=True)
class BenchFm(Fm):
    """An FM (or the plain program) whose worker logs at ``loglevel`` (click keeps the last ``--loglevel``)."""

    loglevel: str = "WARNING"

    def worker_args(self) -> list[str]:
        return [*super().worker_args(), f"--loglevel={self.loglevel}"]


def _fm_of(variant: Variant) -> Fm:
    """The lab's view of the program (queues, flags, probe), its worker serving ``bench.fm_worker``."""
    if variant.plain:
        plain = _program(variant)
        return BenchFm("plain", variant.program, plain.app, plain.submit_chain, plain.parse_document, plain.collect,
                       plain.probe, loglevel=WORKER_LOGLEVEL[0])
    base = load_module("fm9_connection_loss" if variant.program == "bench.fm9_chunked" else variant.program)
    fields: dict[str, Any] = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    fields["module"] = "bench.fm_worker"
    return BenchFm(**fields, loglevel=WORKER_LOGLEVEL[0])


def _reset(variant: Variant, fm: Fm) -> None:
    if variant.plain:
        queue = str(_program(variant).QUEUE)
        delete_names([queue], [queue])
        delete_keys(f"{NAMESPACE}:plain:*")
        with Connection(broker_url()) as conn:  # declared again: kombu's publisher remembers it declared it once
            Queue(queue, Exchange(queue, type="direct"), routing_key=queue).bind(conn.default_channel).declare()
    else:
        reset(fm)


def clean(variants: Sequence[Variant]) -> None:
    """Delete what the benchmark's variants own in the namespace: their queues, exchanges and keys."""
    from bench import raw_limit

    for variant in variants:
        if variant.kind != "celery":
            continue
        fm = _fm_of(variant)
        if variant.plain:
            queue = str(_program(variant).QUEUE)
            delete_names([queue], [queue])
            delete_keys(f"{NAMESPACE}:plain:*")
        else:
            delete_names(fm.queue_names, fm.exchange_names)
            delete_keys(f"{redis_prefix(fm.short)}*")
    raw_limit.delete()
    delete_keys(f"{raw_limit.KEY_PREFIX}*")


def _put_documents(variant: Variant, run_id: str, n: int) -> list[str]:
    """Write the run's N documents (no fault) to its document store; their ids, in order."""
    if variant.plain:
        ids = [f"{run_id}/doc{i}" for i in range(1, n + 1)]
        _program(variant).put_documents(ids)
        return ids
    pipe = cast(Any, client()).pipeline(transaction=False)
    ids: list[str] = []
    for i in range(1, n + 1):
        doc = f"doc{i}"
        pipe.set(f"{run_prefix(run_id)}doc:{doc}", document_text(doc, None), ex=TTL_SECONDS)
        ids.append(doc_id(run_id, doc))
    pipe.execute()
    return ids


def _submit(variant: Variant, ids: list[str], run_id: str) -> AsyncResult[Any]:
    program = _program(variant)
    if variant.plain == "chain":
        return cast("AsyncResult[Any]", program.submit_chain(ids, run_id))
    if variant.plain == "task":
        return cast("AsyncResult[Any]", program.submit_task(ids, run_id))
    if variant.chunk:
        return cast("AsyncResult[Any]", program.submit(ids, run_id, variant.chunk))
    return cast("AsyncResult[Any]", program.submit(ids, run_id))


def account(variant: Variant, value: object, ids: list[str]) -> int:
    """How many documents the chord's result accounts for, each exactly once; ``Unaccounted`` otherwise."""
    if is_envelope(value):
        envelope = Result.from_wire(value)
        if not envelope.ok:
            raise Unaccounted(f"{variant.name}: the chord's body failed: {envelope.reason} {envelope.error}")
        value = envelope.payload
    if not isinstance(value, Mapping):
        raise Unaccounted(f"{variant.name}: the chord's result is not a summary: {value!r:.200}")
    summary = cast(Mapping[str, object], value)
    ok = [short_doc(str(d)) for d in cast(list[object], summary.get("ok") or [])]
    failed = cast(list[object], summary.get("failed") or [])
    want = [short_doc(i) for i in ids]
    if failed or len(ok) != len(want) or sorted(ok) != sorted(want) or len(set(ok)) != len(ok):
        raise Unaccounted(f"{variant.name}: {len(want)} documents sent, {len(ok)} ok ({len(set(ok))} distinct), "
                          f"{len(failed)} failed")
    return len(ok)


WAIT_POLL_SECONDS = 0.05


def _wait_for(fm: Fm, result: AsyncResult[Any], timeout: float) -> object:
    """The chord body's return value, once its result is stored: one GET of its key every
    ``WAIT_POLL_SECONDS``. Not ``result.get()``: Celery's result consumer, in the submitter, would
    subscribe to every header result and re-read them while it waits (measured: 6 to 30 GETs per
    document), a cost a production submitter, which does not wait for its chord, does not pay."""
    backend = cast(Any, fm.app.backend)
    key = backend.get_key_for_task(result.id)
    r = backend.client
    found: list[bytes] = []

    def stored() -> bool:
        raw = r.get(key)
        if raw is not None and json.loads(raw).get("status") in ("SUCCESS", "FAILURE"):
            found.append(raw)
        return bool(found)

    if not wait_until(stored, timeout, interval=WAIT_POLL_SECONDS):
        raise Unaccounted(f"the chord's result was not stored within {timeout:.0f}s")
    meta = cast(dict[str, Any], json.loads(found[0]))
    if meta.get("status") != "SUCCESS":
        raise Unaccounted(f"the chord's body ended {meta.get('status')}: {meta.get('result')!r:.300}")
    return meta.get("result")


def _run_id(variant: Variant, n: int, repeat: int) -> str:
    """A run id no earlier run of this process or another used."""
    return f"bench-{variant.name}-{n}-{repeat}-{os.getpid()}-{int(time.time() * 1000) % 10**8}"


def _ready_meter(variant: Variant, worker: Worker) -> Meter:
    """Waits until ``worker`` answers its probe; the meter of its process group."""
    worker.wait_ready()
    if worker.proc is None:
        raise Unaccounted(f"{variant.name}: the worker was never started")
    return Meter(worker_pgid=worker.proc.pid)


def run_celery(variant: Variant, n: int, repeat: int, timeout: float) -> Run:
    fm = _fm_of(variant)
    _reset(variant, fm)
    run_id = _run_id(variant, n, repeat)
    ids = _put_documents(variant, run_id, n)
    env = {} if variant.plain else {"RCL_BENCH_FM": variant.program, "RCL_BENCH_OBSERVER": "on" if variant.observer else "off"}
    worker = Worker(fm, run_id, LOG_DIR / f"bench-{variant.name}-{run_id}.log", env=env)
    calls, since = _redis_calls(), time.monotonic()
    worker.start()
    try:
        meter = _ready_meter(variant, worker)
        meter.background(_redis_calls() - calls, time.monotonic() - since)  # the worker's start sends a few of them
        meter.start()
        with SIZES.counting() as sizes:
            result = _submit(variant, ids, run_id)
        if variant.cut_parent:
            result.parent = None  # get()'s interval callback then has no header to read (_maybe_reraise_parent_error)
        value = (result.get(timeout=timeout, propagate=True, disable_sync_subtasks=False) if variant.celery_get
                 else _wait_for(fm, result, timeout))
        meter.stop()
        accounted = account(variant, value, ids)
    finally:
        worker.stop()
    delete_keys(f"{run_prefix(run_id)}*")
    _reset(variant, fm)  # the run's results and queues go: the next run starts from nothing
    return _run(variant, n, repeat, meter, accounted, sizes)


def run_runner(variant: Variant, n: int, repeat: int, timeout: float) -> Run:
    """The harness's cost: an FM driven by ``lab.runner.run_scenario`` (N documents, no fault, no side
    chord, no probe afterwards) and its run's timeline built (``lab.show.timeline.build``), as
    ``run_all_fms.py`` does for every run; the clock covers the runner's own writes of the documents,
    its polling, its final reads and the timeline."""
    from lab.runner import run_scenario
    from lab.scenarios import Scenario
    from lab.show.timeline import build

    fm = _fm_of(variant)
    _reset(variant, fm)
    run_id = _run_id(variant, n, repeat)
    sc = Scenario(1, {f"doc{i}": None for i in range(1, n + 1)})
    worker = Worker(fm, run_id, LOG_DIR / f"bench-{variant.name}-{run_id}.log",
                    env={"RCL_BENCH_FM": variant.program, "RCL_BENCH_OBSERVER": "on"})
    worker.start()
    try:
        meter = _ready_meter(variant, worker)
        meter.start()
        with SIZES.counting() as sizes:
            obs = run_scenario(fm, sc, run_id, timeout, probe_after=False)
        build(obs)
        meter.stop()
    finally:
        worker.stop()
    if obs.stopped_by != "chord finished":
        raise Unaccounted(f"{variant.name}: the runner stopped by {obs.stopped_by}")
    accounted = account(variant, obs.summary(), [doc_id(run_id, d) for d in sc.docs])
    delete_keys(f"{run_prefix(run_id)}*")
    _reset(variant, fm)
    return _run(variant, n, repeat, meter, accounted, sizes)


def _run(variant: Variant, n: int, repeat: int, meter: Meter, accounted: int, sizes: list[int]) -> Run:
    return Run(variant.name, n, repeat, round(meter.seconds, 3), round(n / meter.seconds, 1),
               round(meter.seconds * 1000 / n, 3), round(statistics.mean(sizes), 1) if sizes else None, len(sizes),
               round(meter.own_redis_commands / n, 1), round(meter.background_per_s, 1), meter.cpu, accounted,
               meter.by_command)


def run_raw_kombu(variant: Variant, n: int, repeat: int, size: int, timeout: float) -> Run:
    from bench import raw_limit

    raw_limit.delete()
    raw_limit.declare(variant.quorum)
    count = 2 * n
    calls, since = _redis_calls(), time.monotonic()
    options = ["--quorum", "--prefetch", "2"] if variant.quorum else []
    consumer = subprocess.Popen([sys.executable, str(ROOT / "bench" / "raw_limit.py"), str(count), *options], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        with Connection(broker_url()) as conn:
            if not wait_until(lambda: queue_consumers(conn, raw_limit.QUEUE_NAME) >= 1, 60, interval=0.05):
                raise Unaccounted("raw-kombu: the consumer never subscribed")
        meter = Meter(worker_pgid=consumer.pid)
        meter.background(_redis_calls() - calls, time.monotonic() - since)
        meter.start()
        raw_limit.publish(count, size, variant.quorum)
        out, _ = consumer.communicate(timeout=timeout)
        meter.stop()
    finally:
        if consumer.poll() is None:
            consumer.kill()
            consumer.wait()
        raw_limit.delete()
    seen = cast(dict[str, float], json.loads(out.strip().splitlines()[-1]))
    if seen["consumed"] != count or seen["duplicates"]:
        raise Unaccounted(f"raw-kombu: {count} published, {seen['consumed']:.0f} consumed, {seen['duplicates']:.0f} twice")
    meter.cpu["worker"] = seen["cpu_seconds"]  # the consumer's own count: it has exited by the end sample
    return _run(variant, n, repeat, meter, n, [size] * count)


def run_raw_redis(variant: Variant, n: int, repeat: int) -> Run:
    from bench import raw_limit

    meter = Meter()
    meter.background_per_s = _last_background[0]  # no window of its own: the run before it's
    meter.start()
    trips = raw_limit.redis_round_trips(n)
    meter.stop()
    delete_keys(f"{raw_limit.KEY_PREFIX}*")
    if trips != raw_limit.ROUND_TRIPS_PER_DOC * n:
        raise Unaccounted(f"raw-redis: {trips} round trips for {n} documents")
    return _run(variant, n, repeat, meter, n, [])


# ---- the whole benchmark -------------------------------------------------------------------


def summarise(runs: list[Run]) -> list[dict[str, Any]]:
    """Per variant and N: min, median and max of docs/s, and the medians of the rest."""
    rows: list[dict[str, Any]] = []
    keys = dict.fromkeys((r.variant, r.n) for r in runs)
    for name, n in keys:
        mine = [r for r in runs if r.variant == name and r.n == n]
        rate = [r.docs_per_s for r in mine]
        sizes = [r.bytes_per_message for r in mine if r.bytes_per_message is not None]
        cpu_keys = dict.fromkeys(k for r in mine for k in r.cpu)
        rows.append({
            "variant": name, "n": n, "runs": len(mine),
            "docs_per_s": {"min": min(rate), "median": statistics.median(rate), "max": max(rate)},
            "ms_per_member": statistics.median(r.ms_per_member for r in mine),
            "bytes_per_message": statistics.median(sizes) if sizes else None,
            "redis_commands_per_doc": statistics.median(r.redis_commands_per_doc for r in mine),
            "cpu_seconds": {k: round(statistics.median(r.cpu.get(k, 0.0) for r in mine), 3) for k in cpu_keys},
        })
    return rows


def _or_dash(value: float | None, spec: str) -> str:
    """A table cell: ``value`` formatted, or "-" where the variant has none (raw Redis has no worker or message)."""
    return "-" if value is None else format(value, spec)


def markdown(rows: list[dict[str, Any]], meta: Mapping[str, Any]) -> str:
    lines = [f"Chord benchmark, {meta['date']}, {meta['nproc']} cores, load average {meta['load_before']} before and "
             f"{meta['load_after']} after; Celery {meta['celery']}; {meta['repeats']} repeats (N >= {meta['big_n']}: "
             f"{meta['big_repeats']}). docs/s min / median / max; the rest medians; CPU seconds of one run. "
             f"Result backend: {meta['backend']}; Redis commands: its INFO commandstats delta per document"
             f"{'' if 'own' in str(meta['backend']) else ' less the background rate measured before each run'}.", "",
             "| variant | N | docs/s (min / median / max) | ms per member | bytes per message | Redis cmds per doc "
             "| CPU worker | CPU submitter | CPU RabbitMQ | CPU Redis |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        d, cpu = r["docs_per_s"], r["cpu_seconds"]
        size, worker = _or_dash(r["bytes_per_message"], ".0f"), _or_dash(cpu.get("worker"), ".2f")
        lines.append(f"| {r['variant']} | {r['n']} | {d['min']:.0f} / {d['median']:.0f} / {d['max']:.0f} | "
                     f"{r['ms_per_member']:.2f} | {size} | {r['redis_commands_per_doc']:.1f} | {worker} | "
                     f"{cpu.get('submitter', 0):.2f} | {_or_dash(cpu.get('rabbitmq'), '.2f')} | {_or_dash(cpu.get('redis'), '.2f')} |")
    return "\n".join(lines) + "\n"


def pivot(rows: list[dict[str, Any]]) -> str:
    """Median docs/s, one row per variant, one column per N (the plot's numbers)."""
    ns = sorted(dict.fromkeys(int(r["n"]) for r in rows))
    median = {(r["variant"], int(r["n"])): float(r["docs_per_s"]["median"]) for r in rows}
    lines = ["| variant (median docs/s) | " + " | ".join(f"N={n}" for n in ns) + " |", "|---|" + "---:|" * len(ns)]
    for name in dict.fromkeys(str(r["variant"]) for r in rows):
        cells = [f"{median[(name, n)]:.0f}" if (name, n) in median else "-" for n in ns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _steps(rows: list[dict[str, Any]]) -> tuple[int, list[str]] | None:
    """The N and the FMs for the second panel (every FM at one N, observer on and off): N = 1,000
    when it was measured (the targets' N), else the N with the most runs; None under two FMs."""
    fms = [name for name, _, _ in FMS if any(r["variant"] == name for r in rows)]
    if len(fms) < 2:
        return None
    ns = sorted({int(r["n"]) for r in rows if r["variant"] in fms})
    n = 1000 if 1000 in ns else max(ns, key=lambda m: (sum(r["runs"] for r in rows if int(r["n"]) == m), m))
    return n, fms


def per_document(rows: list[dict[str, Any]], n: int) -> str:
    """At one N, per document (medians): wall ms, each party's CPU ms, Redis commands, bytes per
    message, and docs/s as a share of the plain chain's (the targets' ratio)."""
    mine = [r for r in rows if int(r["n"]) == n]
    plain = next((float(r["docs_per_s"]["median"]) for r in mine if r["variant"] == "plain-chain"), None)
    lines = [f"Per document at N = {n} (medians; CPU in ms):", "",
             "| variant | docs/s | / plain-chain | wall ms | CPU worker | submitter | RabbitMQ | Redis | CPU in all "
             "| Redis cmds | bytes per message |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in mine:
        cpu = {k: 1000 * float(v) / n for k, v in r["cpu_seconds"].items()}
        rate = float(r["docs_per_s"]["median"])
        share = _or_dash(rate / plain if plain else None, ".2f")
        size, worker = _or_dash(r["bytes_per_message"], ".0f"), _or_dash(cpu.get("worker"), ".2f")
        lines.append(f"| {r['variant']} | {rate:.0f} | {share} | {r['ms_per_member']:.2f} | {worker} | "
                     f"{cpu.get('submitter', 0):.2f} | {_or_dash(cpu.get('rabbitmq'), '.2f')} | {_or_dash(cpu.get('redis'), '.2f')} | "
                     f"{sum(cpu.values()):.2f} | {r['redis_commands_per_doc']:.1f} | {size} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    """docs/s (median, min-max bars) against N, one line per variant but the FMs between the first
    and the final; beside it, every FM at one N, observer on and off, against the plain chain.
    False without matplotlib."""
    try:
        matplotlib: Any = importlib.import_module("matplotlib")
    except ImportError:
        return False
    matplotlib.use("Agg")
    plt: Any = importlib.import_module("matplotlib.pyplot")
    steps = _steps(rows)
    middle = {f"{name}{suffix}" for name, _, _ in FMS[1:-1] for suffix in ("", "-obs-off")} if steps else set[str]()
    fig, axes = plt.subplots(1, 2 if steps else 1, figsize=(15 if steps else 9, 5.5),
                             gridspec_kw={"width_ratios": [3, 2]} if steps else None, squeeze=False)
    ax = axes[0][0]
    colours = plt.get_cmap("tab20")
    for i, name in enumerate(n for n in dict.fromkeys(r["variant"] for r in rows) if n not in middle):
        mine = sorted((r for r in rows if r["variant"] == name), key=lambda r: r["n"])
        ns = [r["n"] for r in mine]
        med = [r["docs_per_s"]["median"] for r in mine]
        low = [m - r["docs_per_s"]["min"] for m, r in zip(med, mine)]
        high = [r["docs_per_s"]["max"] - m for m, r in zip(med, mine)]
        ax.errorbar(ns, med, yerr=[low, high], marker="o", capsize=3, label=name, color=colours(i % 20),
                    linestyle="--" if name.startswith("raw") else "-")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("documents in the chord (N)")
    ax.set_ylabel("documents per second (median; bars: min-max)")
    ax.set_title("Celery chord throughput on RabbitMQ + Redis, two cores")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    if steps:
        n, fms = steps
        bars = axes[0][1]
        median = {str(r["variant"]): float(r["docs_per_s"]["median"]) for r in rows if int(r["n"]) == n}
        xs = list(range(len(fms)))
        for offset, suffix, label, colour in ((-0.2, "", "observer on", colours(2)), (0.2, "-obs-off", "observer off", colours(0))):
            bars.bar([x + offset for x in xs], [median.get(f"{f}{suffix}", 0.0) for f in fms], width=0.4, label=label,
                     color=colour)
        if "plain-chain" in median:
            bars.axhline(median["plain-chain"], color="black", linewidth=1, label="plain-chain")
            bars.axhline(0.8 * median["plain-chain"], color="black", linewidth=1, linestyle=":", label="0.8 x plain-chain")
        bars.set_xticks(xs, fms)
        bars.set_ylabel("documents per second (median)")
        bars.set_title(f"Each FM's fixes at N = {n:,}")
        bars.grid(True, axis="y", alpha=0.3)
        bars.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Celery chord benchmark (issue 26)")
    p.add_argument("-n", "--sizes", type=int, nargs="+", default=None, metavar="N",
                   help=f"documents per chord (default {' '.join(map(str, DEFAULT_NS))})")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--big-n", type=int, default=10000, help="from this N on, only --big-repeats runs")
    p.add_argument("--big-repeats", type=int, default=1)
    p.add_argument("--only", nargs="+", choices=list(BY_NAME), metavar="VARIANT", help=f"of {', '.join(BY_NAME)}")
    p.add_argument("--quick", action="store_true", help=f"one repeat; N {' and '.join(map(str, QUICK_NS))} unless -n says")
    p.add_argument("--raw-bytes", type=int, default=1200, help="raw kombu's message size when no final FM run measured one")
    p.add_argument("--shared-redis", action="store_true", help="the result backend on CELERY_RESULT_BACKEND's Redis "
                   "(others' commands and CPU then count too) instead of a redis-server of the benchmark's own")
    p.add_argument("--worker-loglevel", default="WARNING", help="the workers' --loglevel (default Celery's, WARNING)")
    p.add_argument("--tables-from", type=Path, default=None, metavar="JSON",
                   help="only write the table and the plot again from a run's JSON (beside it), then exit")
    p.add_argument("--out", type=Path, default=None, help="base path of the outputs (default bench/results/chord-<time>)")
    args = p.parse_args(argv)
    if args.quick:
        args.repeats = 1
    if args.sizes is None:
        args.sizes = list(QUICK_NS if args.quick else DEFAULT_NS)
    if min(args.sizes) < 1 or args.repeats < 1:
        p.error("N and --repeats take whole numbers from 1 up")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    variants = [BY_NAME[v] for v in args.only] if args.only else [v for v in VARIANTS if v.default]
    WORKER_LOGLEVEL[0] = str(args.worker_loglevel)
    if args.tables_from is not None:
        data = cast(dict[str, Any], json.loads(Path(args.tables_from).read_text()))
        write_tables(data["meta"], data["summary"], Path(args.tables_from).with_suffix(""))
        return 0
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base: Path = args.out or RESULTS / f"chord-{stamp}"
    base.parent.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "nproc": os.cpu_count(), "load_before": _load(),
        "celery": celery.__version__, "python": platform.python_version(), "namespace": NAMESPACE,
        "broker": "RabbitMQ (shared)", "backend": f"Redis (shared) {backend_url().rsplit('@', 1)[-1]}",
        "sizes": args.sizes, "repeats": args.repeats, "big_n": args.big_n, "big_repeats": min(args.big_repeats, args.repeats),
        "variants": {v.name: v.label for v in variants}, "worker_loglevel": args.worker_loglevel,
    }
    owned = None if args.shared_redis else OwnedRedis("bench", persist=False)
    try:
        if owned is not None:  # before any client or app reads the URL: the workers inherit it too
            owned.start()
            os.environ["CELERY_RESULT_BACKEND"] = owned.url
            _own_redis.extend([owned.proc.pid] if owned.proc is not None else [])
            meta["backend"] = f"Redis of the benchmark's own (redis-server {owned.url.rsplit('@', 1)[-1]}, no persistence)"
        partial = base.with_suffix(".partial.json")  # every run so far, should a later one fail or be interrupted

        def keep(runs: list[Run]) -> None:
            partial.write_text(json.dumps({"meta": meta, "runs": [dataclasses.asdict(r) for r in runs]}, indent=1) + "\n")

        try:
            runs = _measure(args, variants, keep)
            partial.unlink(missing_ok=True)
        finally:
            clean(variants)
            prune_logs()  # the workers' logs, under .lab/<namespace>/logs: the lab's usual bound
    finally:
        if owned is not None:
            owned.remove()
    meta["load_after"] = _load()
    _report(meta, runs, base)
    return 0


def _measure(args: argparse.Namespace, variants: list[Variant], keep: Callable[[list[Run]], None]) -> list[Run]:
    """Every run: for each repeat, for each N, each variant in turn (interleaved)."""
    runs: list[Run] = []
    measured_size: dict[int, float] = {}
    for repeat in range(1, int(args.repeats) + 1):
        for n in cast(list[int], args.sizes):
            if n >= args.big_n and repeat > args.big_repeats:
                continue
            timeout = 120 + n * 0.1
            for variant in variants:
                if variant.max_n and n > variant.max_n:
                    continue
                if variant.kind == "raw-kombu":
                    size = round(measured_size[n]) if n in measured_size else int(args.raw_bytes)
                    run = run_raw_kombu(variant, n, repeat, size, timeout)
                elif variant.kind == "raw-redis":
                    run = run_raw_redis(variant, n, repeat)
                elif variant.kind == "runner":
                    run = run_runner(variant, n, repeat, timeout)
                else:
                    run = run_celery(variant, n, repeat, timeout)
                    if variant.name in (FINAL, f"{FINAL}-obs-off") and run.bytes_per_message is not None:
                        measured_size[n] = run.bytes_per_message
                runs.append(run)
                keep(runs)
                print(f"repeat {repeat} N={n:<6} {variant.name:<16} {run.docs_per_s:>8.1f} docs/s  {run.seconds:>7.2f}s  "
                      f"{run.bytes_per_message or 0:>7.0f} B/msg  {run.redis_commands_per_doc:>5.1f} cmds/doc  "
                      f"cpu {run.cpu}", flush=True)
    return runs


def _report(meta: dict[str, Any], runs: list[Run], base: Path) -> None:
    rows = summarise(runs)
    base.with_suffix(".json").write_text(json.dumps({"meta": meta, "summary": rows, "runs": [dataclasses.asdict(r) for r in runs]},
                                                    indent=1) + "\n")
    write_tables(meta, rows, base)


def write_tables(meta: Mapping[str, Any], rows: list[dict[str, Any]], base: Path) -> None:
    """The Markdown table (with the pivot of median docs/s) and the plot, from the summary rows."""
    ns = sorted({int(r["n"]) for r in rows})
    table = "\n".join([markdown(rows, meta), pivot(rows),
                       *(per_document(rows, n) for n in ns if n in (1000, 3000) or (n == ns[-1] and len(ns) == 1))])
    base.with_suffix(".md").write_text(table)
    drew = plot(rows, base.with_suffix(".png"))
    print("\n" + table)
    print(f"wrote {base.with_suffix('.json')}, {base.with_suffix('.md')}"
          + (f", {base.with_suffix('.png')}" if drew else " (no plot: pip install -e '.[bench]' for matplotlib)"))


def _raise_interrupted(signum: int, frame: object = None) -> None:
    """SIGTERM and SIGHUP as Ctrl-C: the running worker, the namespace's queues and keys and the
    benchmark's own redis-server go in the ``finally`` blocks, as they do on Ctrl-C."""
    raise Interrupted(signum)


if __name__ == "__main__":
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupted)
    try:
        sys.exit(main())
    except Unaccounted as exc:
        print(f"error: a run does not count: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        print(f"interrupted by {signal.Signals(signum).name}: worker stopped, namespace cleaned, runs so far in "
              "the .partial.json beside the outputs", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        # Not sys.exit: the interrupted run's AsyncResults, freed at exit, would unsubscribe from the
        # redis-server already removed (celery.backends.redis.ResultConsumer.cancel_for), a traceback each
        os._exit(128 + signum)
