"""Case study 2, as the write-up publishes it: bulk B/L ingestion in a chord on a Redis broker.

A dispatch splits the IFCSUM manifest into one unit per ``CNI`` consignment
group and builds a chord of ``parse_bl`` with an ``aggregate_batch`` body.
``parse_bl`` reads the B/L number from ``RFF+BM`` (falling back to a synthetic
``<batch>-<index>`` number when the carrier sent none), validates the container
check digits, retries connection and timeout errors with backoff
``min(2^n x 10, 600)`` s and at most 4 retries, and pushes any other error as a
JSON record (key, B/L, raw segment, reason, time) onto a Redis list, returning
``"dead_lettered"`` so that the chord completes. A unit's key is sha256 of the
batch id, the B/L number and the raw segment. ``aggregate_batch`` takes a
``SET NX`` (24 h) on the batch id, forwards the parsed units to the terminal
operating system and logs one line with the counts. The replay job ``BRPOP``s
the list (bounded per run) and re-enqueues each unit with ``parse_bl.delay``.
Acks late, reject on worker lost, prefetch 1, ``visibility_timeout`` from the
environment (3,600 s by default).

The lab runs it unchanged but for its scales: the backoff in hundredths (0.1 s
for the write-up's 10 s), ``BL_VISIBILITY_TIMEOUT=1`` in its scenarios (for a
parse that outlives the write-up's hour, the lab's slow parse takes 2.5 s; the
benchmark keeps the default 3,600 s), and in its ``slow_parse`` scenario kombu's
restore sweep every 0.25 s (``study.sweep``; a worker sweeps about every 100 s). What its design does not consider, each shown by ``--prove``: see
``fixed.py``.

Run it alone (from the repository's folder after ``make lab``; two shells; the scale its scenarios need):

    BL_VISIBILITY_TIMEOUT=1 .venv/bin/celery -A case_studies.bl_ingestion.writeup worker --without-gossip --without-mingle --without-heartbeat
    .venv/bin/python -m case_studies.bl_ingestion.writeup
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, TypedDict

from celery import Task, chord, group
from celery.result import AsyncResult

from case_studies.bl_ingestion.logs import event_log
from case_studies.bl_ingestion.manifest import check_containers, split, writeup_bl_number, writeup_key
from case_studies.bl_ingestion.stand_ins import Terminal, UnitRef, crash_point, registry, run_of, unit_name
from lab.app import lab_app
from shared.backend import backend_redis

BACKOFF_SCALE = 0.01  # the lab: the write-up's seconds in hundredths
VISIBILITY_TIMEOUT = int(os.environ.get("BL_VISIBILITY_TIMEOUT", 3600))  # write-up; the lab's scenarios: 1

app = lab_app(__name__, short="blw", broker="redis")  # JSON only; every Redis key under the namespace
app.conf.task_acks_late = True
app.conf.task_reject_on_worker_lost = True
app.conf.worker_prefetch_multiplier = 1
app.conf.worker_concurrency = 2
app.conf.broker_transport_options.update(visibility_timeout=VISIBILITY_TIMEOUT)


class Parsed(TypedDict):
    doc: str
    batch: str
    bl: str
    key: str


def dead_list() -> tuple[Any, str]:
    r, prefix = backend_redis(app)
    return r, f"{prefix}dead"


@app.task(bind=True, max_retries=4)
def parse_bl(self: Task[Any, Any], unit: UnitRef) -> Parsed | str:
    bl = writeup_bl_number(unit["raw"], unit["batch"], unit["index"])  # RFF+BM, else <batch>-<index>
    try:
        registry(unit)
        check_containers(unit["raw"])  # ISO 6346 check digits
    except (ConnectionError, TimeoutError) as exc:
        raise self.retry(exc=exc, countdown=min(2 ** self.request.retries * 10, 600) * BACKOFF_SCALE)
    except Exception as exc:
        key = writeup_key(unit["batch"], bl, unit["raw"])
        r, dead = dead_list()
        r.lpush(dead, json.dumps({"key": key, "bl": bl, "raw": unit["raw"], "reason": str(exc), "time": time.time(),
                                  "unit": unit}))
        event_log(run_of(unit)).warning("unit_dead_lettered", batch_id=unit["batch"], bl_number=bl,
                                         unit=unit["index"], reason=type(exc).__name__, detail=str(exc))
        return "dead_lettered"
    return {"doc": unit["doc"], "batch": unit["batch"], "bl": bl, "key": writeup_key(unit["batch"], bl, unit["raw"])}


@app.task(bind=True)
def aggregate_batch(self: Task[Any, Any], results: list[Parsed | str], batch_id: str, run_id: str) -> dict[str, int]:
    r, prefix = backend_redis(app)
    if not r.set(f"{prefix}aggregated:{batch_id}", str(self.request.id), nx=True, ex=86_400):
        return {"forwarded": 0}
    crash_point(run_id, "aggregate:after_claim")  # the lab
    ok = [p for p in results if isinstance(p, dict)]
    tos = Terminal(run_id)
    for p in ok:
        tos.book(p["bl"], p["key"], p["batch"])
    event_log(run_id).info("batch_aggregated", batch_id=batch_id, bl_number=None, forwarded=len(ok),
                           dead_lettered=len(results) - len(ok))
    return {"forwarded": len(ok), "dead_lettered": len(results) - len(ok)}


@app.task(bind=True)
def replay_dead_letters(self: Task[Any, Any], limit: int = 1000) -> int:
    r, dead = dead_list()
    limit = min(limit, int(r.llen(dead)))  # bounded per run: what the list held when it started
    replayed = 0
    while replayed < limit:
        popped = r.brpop([dead], timeout=1)
        if not popped:
            break
        record = json.loads(popped[1])
        crash_point(run_of(record["unit"]), "replay:after_take")  # the lab
        parse_bl.delay(record["unit"])
        event_log(run_of(record["unit"])).info("unit_replayed", batch_id=record["unit"]["batch"],
                                               bl_number=record["bl"], unit=record["unit"]["index"])
        replayed += 1
    return replayed


@app.task(bind=True)
def dispatch_manifest(self: Task[Any, Any], text: str, batch_id: str, run_id: str) -> str:
    units = [UnitRef(doc=f"{run_id}/{unit_name(batch_id, u.index)}", batch=batch_id, carrier=u.carrier, index=u.index,
                     raw=u.raw) for u in split(text)]  # one unit per CNI group
    body = chord(group(parse_bl.s(u) for u in units))(aggregate_batch.s(batch_id, run_id))
    return str(body.id)


def submit(text: str, batch_id: str, run_id: str) -> AsyncResult[Any]:
    return dispatch_manifest.delay(text, batch_id, run_id)


def replay() -> AsyncResult[Any]:
    return replay_dead_letters.delay()


if __name__ == "__main__":
    from case_studies.bl_ingestion.study import run_by_hand

    raise SystemExit(run_by_hand("broken"))
