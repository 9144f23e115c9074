from __future__ import annotations

from typing import Any

import pytest
from celery import Celery, Task
from celery.exceptions import Ignore, Reject, Retry, SoftTimeLimitExceeded

from shared.envelope import REASONS, Result, enveloped, note_attempt, reason_of
from shared.retry import RetriesExhausted
from shared.timeouts import HardTimeout


def bound(app: Celery, fn: Any) -> Task[Any, Any]:
    return app.task(bind=True, shared=False)(fn)


def test_result_round_trips_through_the_wire() -> None:
    ok = Result[dict[str, str]].success({"doc": "doc2"}, attempts=1)
    assert Result.from_wire(ok.to_wire()) == ok
    bad = Result[Any].failure("PermanentError: x", "error", attempts=2)
    assert Result.from_wire(bad.to_wire()) == bad
    assert not bad.ok and ok.ok


@pytest.mark.parametrize(
    "raw",
    [None, [], {"status": "MAYBE", "attempts": 1}, {"status": "SUCCESS"}, {"status": "FAILURE", "attempts": 1, "reason": "nope"}],
)
def test_from_wire_rejects_what_is_not_an_envelope(raw: object) -> None:
    with pytest.raises(ValueError):
        Result.from_wire(raw)


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (ValueError("x"), "error"),
        (SoftTimeLimitExceeded(), "soft_timeout"),
        (HardTimeout("x"), "hard_timeout"),
        (RetriesExhausted("x"), "retries_exhausted"),
    ],
)
def test_reason_of_each_failure(exc: BaseException, reason: str) -> None:
    assert reason_of(exc) == reason


def test_reasons_are_the_eight_a_dashboard_splits_on() -> None:
    assert set(REASONS) == {"error", "dead_lettered", "retries_exhausted", "soft_timeout", "hard_timeout", "time_limit",
                            "expired", "revoked"}


def test_success_becomes_a_success_envelope(local_app: Celery) -> None:
    def body(task: Task[Any, Any], x: int) -> dict[str, int]:
        return {"x": x}

    task = bound(local_app, body)
    assert enveloped(body)(task, 3) == {"status": "SUCCESS", "payload": {"x": 3}, "error": None, "reason": None, "attempts": 1}


def test_an_exception_becomes_a_failure_envelope_in_success_state(local_app: Celery) -> None:
    def body(task: Task[Any, Any]) -> None:
        note_attempt(4)
        raise SoftTimeLimitExceeded()

    wrapped = enveloped(body)
    task = bound(local_app, wrapped)
    result = task.apply()  # Celery's own execution path: the state is SUCCESS
    assert result.state == "SUCCESS"
    env = Result.from_wire(result.result)
    assert (env.status, env.reason, env.attempts) == ("FAILURE", "soft_timeout", 4)
    assert (env.error or "").startswith("SoftTimeLimitExceeded")


@pytest.mark.parametrize("control", [Retry("again"), Ignore(), Reject("no", requeue=False)])
def test_celery_control_flow_passes_through(local_app: Celery, control: Exception) -> None:
    def body(task: Task[Any, Any]) -> None:
        raise control

    task = bound(local_app, body)
    with pytest.raises(type(control)):
        enveloped(body)(task)


def test_attempts_default_to_retries_plus_one(local_app: Celery) -> None:
    def body(task: Task[Any, Any]) -> int:
        return 1

    task = bound(local_app, body)
    task.push_request(retries=2)
    try:
        assert Result.from_wire(enveloped(body)(task)).attempts == 3
    finally:
        task.pop_request()
