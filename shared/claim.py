"""The ``notify`` claim: one email per pipeline under at-least-once delivery (the FM-4 fix).

A Redis key per pipeline, ``<prefix>claim:<pipeline_id>``, moves through two states:

- ``claimed:<owner>``: set with ``SET NX EX claim_ttl`` by the first ``notify``
  that wants to send; it expires if that worker dies before sending, so a later
  attempt can take over;
- ``sent:<owner>``: set, by the owner only, once the email is out; kept ``sent_ttl``.

``acquire()`` answers ``won`` (send now), ``busy`` (someone is sending: retry
shortly, because they may still fail and release) or ``done`` (already sent:
skip). ``with claim.sending(): ...`` releases the claim when the block raises (a
retry or a duplicate may send instead) and marks it ``sent`` when it returns.
Owner checks are atomic Lua scripts, so a stale owner cannot overwrite a newer claim.

``NotifyClaim.of(app, pipeline_id, owner)`` keeps the claim in the app's result
backend Redis, under the app's ``global_keyprefix`` (Celery's own option for the
backend's keys), so it lives and is cleaned up beside the results.

Limits: it narrows, not closes, the window: an owner that sends and dies before
``mark_sent`` leaves ``claimed``, which expires, and the email goes out twice.
Exactly-once needs the mail provider to deduplicate on the pipeline id too.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, cast

import redis
from celery import Celery

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


_clients: dict[tuple[int, str], redis.Redis] = {}


def _client(url: str) -> redis.Redis:
    """One client per process and URL (prefork children get their own after fork)."""
    key = (os.getpid(), url)
    if key not in _clients:
        _clients[key] = cast(Any, redis.Redis).from_url(url, decode_responses=True)
    return _clients[key]


class NotifyClaim:
    def __init__(self, r: redis.Redis, key: str, owner: str, policy: ClaimPolicy = ClaimPolicy()) -> None:
        self.r = r
        self.key = key
        self.owner = owner
        self.policy = policy

    @classmethod
    def of(cls, app: Celery, pipeline_id: str, owner: str | None, policy: ClaimPolicy = ClaimPolicy()) -> NotifyClaim:
        """The claim of ``pipeline_id`` in ``app``'s result backend Redis, under its key prefix."""
        options = cast(dict[str, Any], app.conf.result_backend_transport_options or {})
        prefix = str(options.get("global_keyprefix") or "")
        return cls(_client(str(app.conf.result_backend)), f"{prefix}claim:{pipeline_id}", str(owner), policy)

    def acquire(self) -> State:
        mine = f"claimed:{self.owner}"
        if self.r.set(self.key, mine, nx=True, ex=self.policy.claim_ttl):
            return "won"
        current = cast(str | None, self.r.get(self.key))
        if current is None:  # expired between the two calls: try once more
            return "won" if self.r.set(self.key, mine, nx=True, ex=self.policy.claim_ttl) else "busy"
        return "done" if current.startswith("sent:") else "busy"

    def mark_sent(self) -> bool:
        script = self.r.register_script(_MARK_SENT)
        return bool(script(keys=[self.key], args=[f"claimed:{self.owner}", f"sent:{self.owner}", self.policy.sent_ttl]))

    def release(self) -> bool:
        script = self.r.register_script(_RELEASE)
        return bool(script(keys=[self.key], args=[f"claimed:{self.owner}"]))

    @contextmanager
    def sending(self) -> Generator[None]:
        """Around the side effect of a won claim: release on error, mark ``sent`` on success."""
        try:
            yield
        except BaseException:
            self.release()  # let a retry or a duplicate send instead
            raise
        self.mark_sent()
