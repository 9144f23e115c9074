"""The ``notify`` claim: one email per pipeline under at-least-once delivery (the FM-4 fix).

A Redis key per pipeline, ``<prefix>claim:<pipeline_id>``, moves through two states:

- ``claimed:<owner>``: set with ``SET NX EX claim_ttl`` by the first ``notify``
  that wants to send; it expires if that worker dies before sending, so a later
  attempt can take over;
- ``sent:<owner>``: set, by the owner only, once the email is out; kept ``sent_ttl``.

``acquire`` answers ``won`` (send now), ``busy`` (someone is sending: retry
shortly, because they may still fail and release) or ``done`` (already sent:
skip). Owner checks are atomic Lua scripts, so a stale owner cannot overwrite a
newer claim.

Limits: it narrows, not closes, the window: an owner that sends and dies before
``mark_sent`` leaves ``claimed``, which expires, and the email goes out twice.
Exactly-once needs the mail provider to deduplicate on the pipeline id too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast

import redis

State = Literal["won", "busy", "done"]

_MARK_SENT = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  return 1
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


@dataclass(frozen=True)
class ClaimPolicy:
    claim_ttl: int = 60  # seconds a claim survives its owner's death
    sent_ttl: int = 86_400  # seconds "sent" is remembered
    busy_retry_delay: float = 0.05  # how soon a busy notify looks again
    busy_max_retries: int = 400  # 400 x 0.05 s: longer than any email takes here


class NotifyClaim:
    def __init__(self, r: redis.Redis, prefix: str, pipeline_id: str, policy: ClaimPolicy) -> None:
        self.r = r
        self.key = f"{prefix}claim:{pipeline_id}"
        self.policy = policy

    def acquire(self, owner: str) -> State:
        if self.r.set(self.key, f"claimed:{owner}", nx=True, ex=self.policy.claim_ttl):
            return "won"
        current = cast(str | None, self.r.get(self.key))
        if current is None:  # expired between the two calls: try once more
            return "won" if self.r.set(self.key, f"claimed:{owner}", nx=True, ex=self.policy.claim_ttl) else "busy"
        return "done" if current.startswith("sent:") else "busy"

    def mark_sent(self, owner: str) -> bool:
        script = self.r.register_script(_MARK_SENT)
        return bool(script(keys=[self.key], args=[f"claimed:{owner}", f"sent:{owner}", self.policy.sent_ttl]))

    def release(self, owner: str) -> bool:
        script = self.r.register_script(_RELEASE)
        return bool(script(keys=[self.key], args=[f"claimed:{owner}"]))
