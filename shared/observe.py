"""What a run saw, recorded in Redis under the run's own keys.

Layout (``P`` = ``rcl:<fm>:run:<run_id>:``):

- ``P attempts:<doc>``: INCR per attempt of ``parse_document`` (survives redelivery);
- ``P events``: a Redis stream, one entry per thing that happened (attempt
  start/end, retry, gate, claim, email, dead-letter finalisation), with the
  wall time in ``t``;
- ``P notify:<role>``: INCR per ``notify`` execution, role ``chord`` or ``duplicate``;
- ``P emails``: one list item per email "sent";
- ``P gate``: set by the runner to let a waiting ``notify`` go on (FM-4's interleaving).

Tasks write here, the runner reads, and the harness deletes only ``rcl:<fm>:*``.
Every key expires after ``TTL_SECONDS`` so an interrupted run leaves nothing for ever.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import redis

from shared.settings import backend_url, redis_prefix

TTL_SECONDS = 3600

_client: tuple[int, redis.Redis] | None = None


def connect(url: str, **options: Any) -> redis.Redis:
    """A Redis client for ``url`` that answers ``str`` (redis-py's ``from_url`` is untyped)."""
    return cast(Any, redis.Redis).from_url(url, decode_responses=True, **options)


def client() -> redis.Redis:
    """One Redis client per process (pool children fork: a new one after fork)."""
    global _client
    if _client is None or _client[0] != os.getpid():
        _client = (os.getpid(), connect(backend_url()))
    return _client[1]


def run_prefix(fm: str, run_id: str) -> str:
    return f"{redis_prefix(fm)}run:{run_id}:"


@dataclass(frozen=True)
class Event:
    t: float
    kind: str
    fields: Mapping[str, str]

    def get(self, name: str, default: str = "") -> str:
        return self.fields.get(name, default)


def attempt_starts(events: Iterable[Event], doc: str) -> list[float]:
    """When each attempt of ``doc`` began (wall time), in order."""
    return [e.t for e in events if e.kind == "attempt_start" and e.get("doc") == doc]


class Recorder:
    """The write side, used inside tasks (one per task call; cheap)."""

    def __init__(self, fm: str, run_id: str) -> None:
        self.prefix = run_prefix(fm, run_id)
        self.r = client()

    def _touch(self, key: str) -> None:
        self.r.expire(key, TTL_SECONDS)

    def event(self, kind: str, **fields: object) -> None:
        key = self.prefix + "events"
        entry: dict[str, str] = {"t": repr(time.time()), "kind": kind, "pid": str(os.getpid())}
        entry.update({k: str(v) for k, v in fields.items()})
        self.r.xadd(key, cast(Any, entry))
        self._touch(key)

    def _incr(self, key: str) -> int:
        n = int(self.r.incr(self.prefix + key))
        self._touch(self.prefix + key)
        return n

    def begin_attempt(self, doc: str) -> int:
        n = self._incr(f"attempts:{doc}")
        self.event("attempt_start", doc=doc, attempt=n)
        return n

    def notify_ran(self, role: str) -> int:
        return self._incr(f"notify:{role}")

    def email(self, role: str, text: str) -> None:
        key = self.prefix + "emails"
        self.r.rpush(key, f"{role}|{text}")
        self._touch(key)
        self.event("email", role=role)

    def gate_is_open(self) -> bool:
        return bool(self.r.exists(self.prefix + "gate"))

    def open_gate(self) -> None:
        self.r.set(self.prefix + "gate", "1", ex=TTL_SECONDS)


class Reader:
    """The read side, used by the runner and the checks."""

    def __init__(self, fm: str, run_id: str) -> None:
        self.prefix = run_prefix(fm, run_id)
        self.r = client()

    def _count(self, key: str) -> int:
        raw = self.r.get(self.prefix + key)
        return int(cast(str, raw)) if raw is not None else 0

    def attempts(self, doc: str) -> int:
        return self._count(f"attempts:{doc}")

    def notify_runs(self, role: str) -> int:
        return self._count(f"notify:{role}")

    def emails(self) -> list[str]:
        return [str(x) for x in cast(list[Any], self.r.lrange(self.prefix + "emails", 0, -1))]

    def events(self) -> list[Event]:
        rows = cast(list[tuple[str, dict[str, str]]], self.r.xrange(self.prefix + "events"))
        out: list[Event] = []
        for _id, fields in rows:
            rest = {k: v for k, v in fields.items() if k not in ("t", "kind")}
            out.append(Event(float(fields["t"]), fields["kind"], rest))
        return out

    def has_event(self, kind: str, **match: str) -> bool:
        return any(e.kind == kind and all(e.get(k) == v for k, v in match.items()) for e in self.events())
