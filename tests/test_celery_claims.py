"""Runs that prove claims the docstrings make about Celery and RabbitMQ (real services)."""

from __future__ import annotations

import importlib
import json
from typing import Any, cast

import pytest
from kombu import Connection, Exchange, Producer, Queue

from shared import dlq, harness
from shared.harness import running_worker
from shared.runner import Lab, dlq_depth, new_run_id, run_scenario
from shared.scenarios import scenario
from shared.settings import broker_url

pytestmark = pytest.mark.usefixtures("real_services")


def test_celery_time_limit_alone_fails_the_chord() -> None:
    """fm6's docstring: without @hard_timeout the hard time limit breaks the chord."""
    module = importlib.import_module("tests.variants.fm6_backstop_only")
    lab = Lab(module.RECIPE, module.app, module.tasks)
    harness.reset(lab.recipe)
    run_id = new_run_id()
    with running_worker(lab, run_id, "variant-fm6-backstop-only", grace=0.5):
        obs = run_scenario(lab, scenario(6), run_id, timeout=60, probe_after=False)
    harness.reset(lab.recipe)
    assert obs.chord.state == "FAILURE" and obs.chord.error_type == "ChordError"
    assert "TimeLimitExceeded" in (obs.chord.error or "")
    assert obs.notify_runs["chord"] == 0


def _publish_to_dlq(fm: str, body: Any, headers: dict[str, Any]) -> None:
    with Connection(broker_url()) as conn:
        Producer(conn.default_channel).publish(
            json.dumps(body), exchange=dlq.dlx_exchange(fm), routing_key=dlq.dead_letter_queue(fm).routing_key,
            content_type="application/json", content_encoding="utf-8", headers=headers,
        )


def test_the_drain_acks_what_is_not_a_chord_member_and_goes_on() -> None:
    lab = harness.load("fm3")
    harness.reset(lab.recipe)
    _publish_to_dlq("fm3", [[], {}, {"chord": None}], {"id": "not-a-member", "task": "fm3.parse_document"})
    _publish_to_dlq("fm3", {"not": "a task message"}, {})
    _publish_to_dlq("fm3", [[], {}, {}], {})
    assert dlq_depth(lab) == 3
    assert lab.recipe.dead_letter is not None
    assert dlq.drain(lab.app, "fm3", lab.recipe.dead_letter) == 0
    assert dlq_depth(lab) == 0


def test_reset_replaces_a_lab_queue_declared_with_other_arguments() -> None:
    """A queue left from an older lab version (classic, not quorum) would fail the
    worker's declare with PRECONDITION_FAILED; reset deletes and re-declares it."""
    recipe = harness.load("fm3").recipe
    name = str(recipe.task_queue.name)
    with Connection(broker_url()) as conn:
        channel = cast(Any, conn.default_channel)
        channel.queue_delete(queue=name)
        Queue(name, Exchange(name, type="direct"), routing_key=name).bind(channel).declare()
    harness.reset(recipe)
    with Connection(broker_url()) as conn:
        recipe.task_queue.bind(conn.default_channel).declare()  # the worker's declare: no PRECONDITION_FAILED
    harness.reset(recipe)
