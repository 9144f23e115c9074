"""Case study 2, as the write-up publishes it: bulk B/L ingestion in a chord on a Redis broker.

The write-up's program, line for line where it gives code. A dispatch task
takes the manifest's bytes, decodes them as UTF-8 with replacement, and splits
the text on ``CNI+``: each piece after the first is one unit. It builds a chord
of ``parse_bl`` (queue ``bl.parse``) with an ``aggregate_batch`` body (the
dispatch and the body on ``bulk.dispatch``). ``parse_bl``, inside one ``try``,
reads the B/L number with a regular expression for ``RFF+BM`` (falling back to a
synthetic ``<batch>-<index>`` number when none matches), computes the unit's key
(sha256 of batch id, B/L number and raw segment) and validates the container
check digits (ISO 6346); connection and timeout errors retry with backoff
``min(2^n x 10, 600)`` s and at most 4 retries; any other error pushes a JSON
record (key, B/L, raw segment, reason, time) onto a Redis list with ``LPUSH``,
logs one JSON line (B/L number and reason) and returns ``"dead_lettered"`` so
that the chord completes. ``aggregate_batch`` takes a ``SET NX`` (24 h) on the
batch id, forwards each parsed unit to the terminal operating system (TOS), a
forward the write-up keys on the B/L number and calls idempotent, and logs one
line with the counts. ``replay_dead_letters`` is a function (run by an operator
or a cron job, not a task): it pops up to 200 records, each with a ``BRPOP`` that
blocks up to 5 s, and re-enqueues each unit with ``parse_bl.delay``. Acks late,
reject on worker lost, prefetch 1, ``visibility_timeout`` from
``BULK_VISIBILITY_TIMEOUT`` (3,600 s by default).

What that code does to the lab's 40-consignment manifest (``--prove``'s write-up
column checks it exactly in ``resend``): one consignment's shipper is
``SERVEIS D'ENGINYERIA TECNI``, so the text holds ``TECNI+<street>``, and the
split yields 41 units. The piece that starts inside the street address carries
that consignment's goods and containers but no ``RFF+BM``: it is booked under a
made-up ``<batch>-28``, while the consignment's own B/L is booked from a piece
with no container at all. The regular expression ``RFF\\+BM:(\\w+)`` stops at the
first character that is not a letter, a digit or ``_``: a B/L number the carrier
writes with a space (``MEDU 1234567``) is booked as ``MEDU``
(``tests/test_bl_domain.py``).

Departures the lab makes, each keeping the mechanism it runs:

| what | the write-up | the lab | why the mechanism is the same |
|---|---|---|---|
| names | queues ``bulk.dispatch``, ``bl.parse``; Redis keys of its own | ``<namespace>.blw.bulk.dispatch``, ``<namespace>.blw.bl.parse``; every key under ``<namespace>:blw:`` | a prefix: the lab shares its broker (``lab.app``) |
| backoff | ``min(2^n x 10, 600)`` s | the same in hundredths (0.1 s for 10 s) | the same curve and count, scaled in time |
| ``BULK_VISIBILITY_TIMEOUT`` | 3,600 s | 1 s in the scenarios (the slow parse takes 2.5 s); the restore sweep every 0.25 s in ``slow_parse`` (``study.sweep``; a worker sweeps about every 100 s) | a parse longer than the timeout, as one longer than an hour would be |
| the unit on the wire | what ``parse_bl`` needs | ``BlUnit``: its ``doc`` also names the lab's run | the lab's observer follows a unit by its ``doc`` |
| the dead-letter record | key, B/L, raw segment, reason, time | the same, plus the unit as dispatched (``unit``), which the replay re-enqueues | the replay needs what ``parse_bl`` takes |
| the container registry | the call that raises connection errors | ``stand_ins.registry``: refuses, lags or is slow as the scenario plans | a ``ConnectionError`` subclass, inside the ``try`` |
| ISO 6346 | check digits | python-stdnum's ``iso6346.validate`` | the same check digit (ISO 6346 annex A) |
| the TOS | forwards keyed on the B/L number, idempotent | ``stand_ins.Terminal`` books a B/L number once | keyed as the write-up says the real one is |
| the log | structlog JSON lines | the same lines, written to the run's file (``logs.event_log``) | only the destination |
| the replay | run by hand or cron | run by the lab in a child process (``study.replay_process``) | a process the lab may kill between the pop and the re-enqueue |
| the replay's Redis client | not shown | a read timeout of 10 s: redis-py 8.1 (pinned) reads with 5 s by default, and a 5 s ``BRPOP`` on an empty list then raised ``TimeoutError`` (seen on this lab's first run of it) | the same 5 s blocking pop, which now returns empty |
| kills | none | ``crash_point``: one lab line in the aggregate and the replay | SIGKILL, as a deploy or the OOM killer does |

What its design does not consider, each shown by ``--prove``: see
``fixed.py``.

Run it alone (from the repository's folder after ``make lab``; two shells; the scale its scenarios need):

    BULK_VISIBILITY_TIMEOUT=1 .venv/bin/celery -A case_studies.bl_ingestion.writeup worker --without-gossip --without-mingle --without-heartbeat
    .venv/bin/python -m case_studies.bl_ingestion.writeup
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from typing import Any, TypedDict, cast

import redis

from celery import Task, chord, group
from celery.result import AsyncResult
from kombu import Exchange, Queue
from stdnum import iso6346

from case_studies.bl_ingestion.logs import event_log
from case_studies.bl_ingestion.stand_ins import Terminal, crash_point, registry, run_of, unit_name
from lab.app import lab_app
from lab.settings import amqp_name
from shared.backend import backend_redis

BACKOFF_SCALE = 0.01  # the lab: the write-up's seconds in hundredths
BULK_VISIBILITY_TIMEOUT = int(os.environ.get("BULK_VISIBILITY_TIMEOUT", 3600))  # write-up; the lab's scenarios: 1
REPLAY_MAX_ITEMS = 200  # write-up: records popped per replay run
REPLAY_BLOCK_SECONDS = 5  # write-up: BRPOP's timeout

app = lab_app(__name__, short="blw", broker="redis")  # JSON only; every Redis key under the namespace
DISPATCH_QUEUE = amqp_name("blw", "bulk.dispatch")  # write-up: bulk.dispatch
PARSE_QUEUE = amqp_name("blw", "bl.parse")  # write-up: bl.parse
app.conf.update(task_default_queue=DISPATCH_QUEUE, task_default_exchange=DISPATCH_QUEUE,
                task_default_routing_key=DISPATCH_QUEUE)
app.conf.task_queues = [Queue(q, Exchange(q, type="direct"), routing_key=q) for q in (DISPATCH_QUEUE, PARSE_QUEUE)]
app.conf.task_routes = {f"{__name__}.parse_bl": {"queue": PARSE_QUEUE, "routing_key": PARSE_QUEUE}}
app.conf.task_acks_late = True
app.conf.task_reject_on_worker_lost = True
app.conf.worker_prefetch_multiplier = 1
app.conf.worker_concurrency = 2
app.conf.broker_transport_options.update(visibility_timeout=BULK_VISIBILITY_TIMEOUT)

RFF_BM = re.compile(r"RFF\+BM:(\w+)")  # write-up: the B/L number
EQD_CN = re.compile(r"EQD\+CN\+([^+':]*)")  # write-up: the container numbers


class BlUnit(TypedDict):
    doc: str  # the lab: <run>/<batch>-blNNNN
    batch: str
    index: int
    raw: str  # the piece of text after its CNI+


class Parsed(TypedDict):
    doc: str
    batch: str
    bl: str
    key: str


def split_units(text: str) -> list[str]:
    """write-up: one unit per ``CNI+`` in the text."""
    return text.split("CNI+")[1:]


def bl_number_of(raw: str, batch_id: str, index: int) -> str:
    """write-up: ``RFF+BM``'s number, else a synthetic ``<batch>-<index>``."""
    match = RFF_BM.search(raw)
    return match.group(1) if match else f"{batch_id}-{index}"


def idempotency_key(batch_id: str, bl_number: str, raw: str) -> str:
    """write-up: sha256 of batch id, B/L number and raw segment."""
    return hashlib.sha256(f"{batch_id}|{bl_number}|{raw}".encode()).hexdigest()


def validate_containers(raw: str) -> list[str]:
    """write-up: every ``EQD+CN`` container number passes ISO 6346 (``ValueError`` otherwise)."""
    numbers = EQD_CN.findall(raw)
    for number in numbers:
        if not iso6346.is_valid(number):
            raise ValueError(f"invalid container number {number!r}")
    return numbers


def dead_list() -> tuple[Any, str]:
    r, prefix = backend_redis(app)
    return r, f"{prefix}dead"


@app.task(bind=True, max_retries=4)
def parse_bl(self: Task[Any, Any], unit: BlUnit) -> Parsed | str:
    raw, bl_number, key = unit["raw"], None, None
    try:
        bl_number = bl_number_of(raw, unit["batch"], unit["index"])
        key = idempotency_key(unit["batch"], bl_number, raw)
        registry(unit)  # the container registry (stand-in): a refusal is a ConnectionError
        validate_containers(raw)  # ISO 6346 check digits
    except (ConnectionError, TimeoutError) as exc:
        raise self.retry(exc=exc, countdown=min(2 ** self.request.retries * 10, 600) * BACKOFF_SCALE)
    except Exception as exc:
        r, dead = dead_list()
        r.lpush(dead, json.dumps({"key": key, "bl_number": bl_number, "raw_segment": raw, "reason": str(exc),
                                  "ts": time.time(), "unit": unit}))
        event_log(run_of(unit)).warning("bl_dead_lettered", bl_number=bl_number, reason=str(exc))
        return "dead_lettered"
    return {"doc": unit["doc"], "batch": unit["batch"], "bl": bl_number, "key": key}


@app.task(bind=True)
def aggregate_batch(self: Task[Any, Any], results: list[Parsed | str], batch_id: str, run_id: str) -> dict[str, int]:
    r, prefix = backend_redis(app)
    if not r.set(f"{prefix}aggregated:{batch_id}", str(self.request.id), nx=True, ex=86_400):
        return {"forwarded": 0}
    crash_point(run_id, "aggregate:after_claim")  # the lab
    ok = [p for p in results if isinstance(p, dict)]
    tos = Terminal(run_id)  # stand-in
    for p in ok:
        tos.book(p["bl"], p["bl"], batch_id)  # write-up: keyed on the B/L number, idempotent
    event_log(run_id).info("batch_aggregated", batch_id=batch_id, forwarded=len(ok),
                           dead_lettered=len(results) - len(ok))
    return {"forwarded": len(ok), "dead_lettered": len(results) - len(ok)}


def replay_dead_letters(max_items: int = REPLAY_MAX_ITEMS) -> int:
    _, dead = dead_list()
    r: Any = cast(Any, redis.Redis).from_url(str(app.conf.result_backend), socket_timeout=REPLAY_BLOCK_SECONDS + 5)  # the lab
    replayed = 0
    for _ in range(max_items):
        popped = r.brpop([dead], timeout=REPLAY_BLOCK_SECONDS)
        if not popped:
            break
        record = json.loads(popped[1])
        crash_point(run_of(record["unit"]), "replay:after_take")  # the lab
        parse_bl.delay(record["unit"])
        event_log(run_of(record["unit"])).info("bl_replayed", bl_number=record["bl_number"], key=record["key"])
        replayed += 1
    return replayed


@app.task(bind=True)
def dispatch_manifest(self: Task[Any, Any], payload: bytes, batch_id: str, run_id: str) -> str:
    text = payload.decode("utf-8", errors="replace")
    units = [BlUnit(doc=f"{run_id}/{unit_name(batch_id, i)}", batch=batch_id, index=i, raw=piece)
             for i, piece in enumerate(split_units(text))]
    body = chord(group(parse_bl.s(u) for u in units))(aggregate_batch.s(batch_id, run_id))
    return str(body.id)


def submit(manifest: str | bytes, batch_id: str, run_id: str) -> AsyncResult[Any]:
    """The carrier's bytes to ``dispatch_manifest`` (text is sent as its UTF-8 bytes)."""
    return dispatch_manifest.delay(manifest.encode() if isinstance(manifest, str) else manifest, batch_id, run_id)


if __name__ == "__main__":
    from case_studies.bl_ingestion.study import run_by_hand

    raise SystemExit(run_by_hand("broken"))
