"""The notify claim against the real Redis (keys under rcl:test:, deleted afterwards)."""

from __future__ import annotations

import uuid

from shared.claim import ClaimPolicy, NotifyClaim
from shared.observe import client


def make(redis_keys: list[str]) -> NotifyClaim:
    claim = NotifyClaim(client(), "rcl:test:", uuid.uuid4().hex, ClaimPolicy(claim_ttl=30))
    redis_keys.append(claim.key)
    return claim


def test_first_wins_concurrent_is_busy_later_is_done(redis_keys: list[str]) -> None:
    claim = make(redis_keys)
    assert claim.acquire("a") == "won"
    assert claim.acquire("b") == "busy"
    assert not claim.mark_sent("b")  # only the owner may say it sent
    assert claim.mark_sent("a")
    assert claim.acquire("b") == "done"


def test_a_released_claim_can_be_taken_again(redis_keys: list[str]) -> None:
    claim = make(redis_keys)
    assert claim.acquire("a") == "won"
    assert not claim.release("b")
    assert claim.release("a")
    assert claim.acquire("b") == "won"


def test_a_claim_expires_if_its_owner_dies(redis_keys: list[str]) -> None:
    claim = make(redis_keys)
    assert claim.acquire("a") == "won"
    ttl = int(client().ttl(claim.key))
    assert 0 < ttl <= 30
