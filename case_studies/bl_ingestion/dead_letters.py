"""A dead-letter list on Redis that a replay cannot lose a unit from.

The write-up's store is one Redis list: ``LPUSH`` a JSON record to dead-letter,
``BRPOP`` it to replay, then ``parse_bl.delay``. Between the pop and the
re-enqueue the record exists only in the replayer's memory: a replayer killed
there loses the unit (``python run_all_fms.py --only bl_ingestion --prove``
shows it). ``DeadLetters`` keeps every record in Redis until its re-enqueue is
confirmed:

- ``put(key, record)`` dead-letters a unit once per ``key``: a second ``put`` of
  the same key (a redelivered aggregate, a parse that ran twice) is a no-op. The
  index entry goes when the unit is replayed, so a unit that fails again after a
  replay is dead-lettered again;
- ``take()`` moves the oldest record to a processing list and stamps the time,
  in one Lua script (``RPOPLPUSH`` and ``HSET``): there is no moment when the
  record is in neither list;
- ``done(item)`` removes it from the processing list once the re-enqueue has
  returned (a publish to a Redis broker is an ``LPUSH`` that has answered);
- ``reap(stale_after)`` moves back to the dead list every record that has sat in
  the processing list longer than ``stale_after``: its replayer died. The record
  may have been re-enqueued already (the replayer died after the publish, before
  ``done``); it is then replayed twice, so whatever a replay leads to must be
  idempotent (the terminal books a consignment key once).

Every key sits under the app's result-backend prefix (``shared.backend``), so the
lab's namespace holds them. Records are JSON; the caller gives each a ``key``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, cast

import redis

_PUT = """
if redis.call('HSETNX', KEYS[2], ARGV[1], '1') == 1 then
  redis.call('LPUSH', KEYS[1], ARGV[2])
  return 1
end
return 0
"""
_TAKE = """
local item = redis.call('RPOPLPUSH', KEYS[1], KEYS[2])
if item then
  redis.call('HSET', KEYS[3], redis.sha1hex(item), ARGV[1])
end
return item
"""
_DONE = """
local removed = redis.call('LREM', KEYS[1], 1, ARGV[1])
redis.call('HDEL', KEYS[2], redis.sha1hex(ARGV[1]))
redis.call('HDEL', KEYS[3], ARGV[2])
return removed
"""
_REAP = """
local moved = 0
for _, item in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
  local since = redis.call('HGET', KEYS[3], redis.sha1hex(item))
  if (not since) or tonumber(since) < tonumber(ARGV[1]) then
    redis.call('LREM', KEYS[2], 1, item)
    redis.call('HDEL', KEYS[3], redis.sha1hex(item))
    redis.call('RPUSH', KEYS[1], item)
    moved = moved + 1
  end
end
return moved
"""


class DeadLetters:
    """One dead-letter list (``<prefix><name>``) with its processing list, stamps and index."""

    def __init__(self, r: redis.Redis, prefix: str, name: str = "dead") -> None:
        self.r = r
        self.list = f"{prefix}{name}"
        self.processing = f"{self.list}:processing"
        self.since = f"{self.list}:since"
        self.index = f"{self.list}:index"

    def put(self, key: str, record: Mapping[str, Any]) -> bool:
        """Dead-letter ``record`` unless ``key`` is already dead-lettered; True when it was added."""
        script = self.r.register_script(_PUT)
        return bool(script(keys=[self.list, self.index], args=[key, json.dumps({**record, "key": key})]))

    def take(self) -> str | None:
        """The oldest record, now in the processing list (None when there is none)."""
        script = self.r.register_script(_TAKE)
        return cast(str | None, script(keys=[self.list, self.processing, self.since], args=[repr(time.time())]))

    def done(self, item: str) -> bool:
        """``item`` is re-enqueued: forget it (and its key, so it may be dead-lettered again)."""
        key = str(json.loads(item).get("key", ""))
        script = self.r.register_script(_DONE)
        return bool(script(keys=[self.processing, self.since, self.index], args=[item, key]))

    def reap(self, stale_after: float) -> int:
        """Move records older than ``stale_after`` seconds back from the processing list; how many."""
        script = self.r.register_script(_REAP)
        return int(script(keys=[self.list, self.processing, self.since], args=[repr(time.time() - stale_after)]))

    def depth(self) -> int:
        return int(self.r.llen(self.list))

    def in_processing(self) -> int:
        return int(self.r.llen(self.processing))

    def records(self) -> list[dict[str, Any]]:
        """The dead list's records, oldest first."""
        return [json.loads(x) for x in reversed(cast(list[str], self.r.lrange(self.list, 0, -1)))]
