"""The notify claim against the real Redis (keys under the lab's namespace, deleted afterwards)."""

from __future__ import annotations

import uuid

import pytest

from lab.observe import client
from lab.settings import NAMESPACE
from shared.claim import ClaimPolicy, NotifyClaim


def claims(redis_keys: list[str]) -> tuple[NotifyClaim, NotifyClaim]:
    """Two owners, ``a`` and ``b``, of one pipeline's claim."""
    key = f"{NAMESPACE}:test:claim:{uuid.uuid4().hex}"
    redis_keys.append(key)
    policy = ClaimPolicy(claim_ttl=30)
    return NotifyClaim(client(), key, "a", policy), NotifyClaim(client(), key, "b", policy)


def test_first_wins_concurrent_is_busy_later_is_done(redis_keys: list[str]) -> None:
    a, b = claims(redis_keys)
    assert a.acquire() == "won"
    assert b.acquire() == "busy"
    assert not b.mark_sent()  # only the owner may say it sent
    assert a.mark_sent()
    assert b.acquire() == "done"


def test_a_released_claim_can_be_taken_again(redis_keys: list[str]) -> None:
    a, b = claims(redis_keys)
    assert a.acquire() == "won"
    assert not b.release()
    assert a.release()
    assert b.acquire() == "won"


def test_a_claim_expires_if_its_owner_dies(redis_keys: list[str]) -> None:
    a, _ = claims(redis_keys)
    assert a.acquire() == "won"
    ttl = int(client().ttl(a.key))
    assert 0 < ttl <= 30


def test_sending_marks_sent_on_success_and_releases_on_error(redis_keys: list[str]) -> None:
    a, b = claims(redis_keys)
    assert a.acquire() == "won"
    with pytest.raises(RuntimeError), a.sending():
        raise RuntimeError("the mail API said 500")
    assert b.acquire() == "won"  # released: the next one may send
    with b.sending():
        pass
    assert a.acquire() == "done"
