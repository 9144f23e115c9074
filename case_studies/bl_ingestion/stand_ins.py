"""The services around the B/L pipeline, as the lab stands them in.

Not the lesson and not a fix: what production has outside the Celery program.

- ``UnitRef``: one consignment unit on the wire. Its ``doc`` is
  ``<run>/<batch>-blNNNN``, so the lab's observer (``lab.observe``) follows each
  unit as the FMs follow a document, and a re-sent manifest's units are told
  apart from the first one's;
- ``registry(unit)``: the container registry asked about every unit before it
  is parsed. It counts its calls per unit (``registry_calls``: what the checks
  read as a unit's attempts, whichever task made them) and plays the scenario's
  fault for the unit, written by the runner into the lab's document store
  (``lab.pipeline.store_document``): ``FLAKY:n`` refuses the connection on the
  first n calls (counted across deliveries and replays, so ``FLAKY:5`` outlasts
  four retries and a replay finds the registry back); ``FAIL`` answers "unknown
  container" on the first call (a registry that lags behind the carrier's
  booking: a replay finds it); ``SOFT_HANG`` answers after ``SLOW_SECONDS`` on
  the first call; and an outage of the whole registry (``plan_outage``): every
  call refused, whatever the unit, until the runner ends it (``end_outage``);
- ``Terminal``: the terminal operating system that books each B/L. It records
  every call, and books an idempotency key once (``book``). It stands in for the
  real one's booking API, which takes a client reference it deduplicates on;
- ``crash_point(run, step)``: the lab's line in ``aggregate_batch`` and the
  replay job. The runner plans one crash per run (``plan_crash``); the first
  process that reaches the planned step SIGKILLs itself there.
"""

from __future__ import annotations

import time
from typing import Any, Literal, TypedDict, cast

from lab.faults import fault_in, kill_self
from lab.observe import TTL_SECONDS, RunRecorder, split_doc_id

SLOW_SECONDS = 2.5
"""How long a ``SOFT_HANG`` unit's registry takes on its first attempt: past the
write-up's scaled ``visibility_timeout`` (1 s), under the fixed program's
``time_limit`` (3 s)."""

CrashStep = Literal["aggregate:after_claim", "aggregate:mid_forward", "replay:after_take"]


class RegistryUnavailable(ConnectionError):
    """The container registry refused the connection: a later attempt may succeed."""


class UnknownContainer(Exception):
    """The registry does not know a container of the unit (yet)."""


class UnitName(TypedDict):
    """What the stand-ins need of a unit, of either program: its ``doc``, batch and index."""

    doc: str  # <run>/<batch>-blNNNN
    batch: str  # the manifest's batch id
    index: int  # the unit's position in the manifest (0-based)


class UnitRef(TypedDict):
    doc: str  # <run>/<batch>-blNNNN
    batch: str  # the manifest's batch id
    carrier: str  # the interchange's sender (UNB)
    index: int  # the unit's position in the manifest (0-based)
    raw: str  # the unit's segments, as EDIFACT text


def unit_name(batch: str, index: int) -> str:
    return f"{batch}-bl{index:04d}"


def run_of(unit: UnitName) -> str:
    found = split_doc_id(unit["doc"])
    return found[0] if found else ""


def registry(unit: UnitName) -> None:
    """Ask the container registry about the unit's containers (the lab: misbehave as planned)."""
    run = RunRecorder(run_of(unit))
    name = unit_name(unit["batch"], unit["index"])
    pipe = cast(Any, run.r).pipeline(transaction=False)  # one round trip: the stand-in must not be what is measured
    pipe.incr(run.prefix + f"registry-calls:{name}")
    pipe.expire(run.prefix + f"registry-calls:{name}", TTL_SECONDS)
    pipe.get(run.prefix + f"doc:{name}")  # the scenario's fault, in the lab's document store
    pipe.get(run.prefix + "registry-down")  # an outage of the whole registry (``plan_outage``)
    attempt, _, text, down = cast(tuple[int, bool, str | None, str | None], tuple(pipe.execute()))
    if down is not None:
        raise RegistryUnavailable(f"connection refused by the container registry: it is down (attempt {attempt})")
    fault = fault_in(str(text or ""))
    if fault is None:
        return
    if fault.kind == "FLAKY" and attempt <= fault.times:
        raise RegistryUnavailable(f"connection refused by the container registry (attempt {attempt})")
    if fault.kind == "FAIL" and attempt == 1:
        raise UnknownContainer("the container registry does not know this unit's containers yet")
    if fault.kind == "SOFT_HANG" and attempt == 1:
        time.sleep(SLOW_SECONDS)


def plan_outage(run_id: str) -> None:
    """The whole container registry refuses every connection, whatever the unit, until ``end_outage``."""
    run = RunRecorder(run_id)
    run.r.set(run.prefix + "registry-down", repr(time.time()), ex=TTL_SECONDS)


def end_outage(run_id: str) -> float:
    """The registry answers again; how long it was down (seconds)."""
    run = RunRecorder(run_id)
    since = run.get("registry-down")
    run.r.delete(run.prefix + "registry-down")
    return time.time() - float(since) if since else 0.0


def registry_calls(run_id: str, name: str) -> int:
    """How many times the registry was asked about unit ``name`` (``<batch>-blNNNN``) in the run."""
    return int(RunRecorder(run_id).get(f"registry-calls:{name}") or 0)


def plan_crash(run_id: str, step: CrashStep) -> None:
    RunRecorder(run_id).append("crash_plan", step)


_plans: dict[str, list[str]] = {}  # run id -> its crash plan, read once per process


def crash_point(run_id: str, step: CrashStep) -> None:
    """SIGKILL this process if the run's crash plan names ``step`` (once per plan entry: the
    ``LREM`` decides, so a plan this process read before another used it fires no second time)."""
    run = RunRecorder(run_id)
    if run_id not in _plans:
        _plans[run_id] = run.get_list("crash_plan")
    if step in _plans[run_id] and run.r.lrem(run.prefix + "crash_plan", 1, step):
        run.event("crash", step=step)
        kill_self()


_BOOK = """
redis.call('RPUSH', KEYS[1], ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[3])
if not redis.call('SET', KEYS[2], ARGV[2], 'NX', 'EX', ARGV[3]) then
  return 0
end
redis.call('RPUSH', KEYS[3], ARGV[1])
redis.call('EXPIRE', KEYS[3], ARGV[3])
return 1
"""


class Terminal:
    """The terminal operating system of one lab run (its record lives in the run's Redis keys)."""

    def __init__(self, run_id: str) -> None:
        self.run = RunRecorder(run_id)

    def book(self, bl_number: str, idempotency_key: str, batch: str) -> bool:
        """Book ``bl_number``; a key already seen is acknowledged and not booked again. True when booked."""
        script = self.run.r.register_script(_BOOK)
        keys = [self.run.prefix + k for k in ("tos_calls", f"tos-key:{idempotency_key}", "tos_bookings")]
        return bool(script(keys=keys, args=[f"{bl_number}|{batch}", bl_number, TTL_SECONDS]))

    def bookings(self) -> list[tuple[str, str]]:
        """``(B/L number, batch)`` per booking, in order."""
        return [(b, batch) for b, _, batch in (x.partition("|") for x in self.run.get_list("tos_bookings"))]

    def calls(self) -> int:
        return len(self.run.get_list("tos_calls"))
