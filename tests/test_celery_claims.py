"""Runs that prove claims the docstrings make about Celery and RabbitMQ (real services)."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from kombu import Connection, Exchange, Producer, Queue

from lab import harness, variants
from lab.fm import Fm
from lab.harness import running_worker
from lab.runner import dlq_depth, new_run_id, run_scenario
from lab.scenarios import scenario
from lab.settings import broker_url
from shared import dlq

pytestmark = pytest.mark.usefixtures("real_services")

HARD_TIMEOUT_LINE = "@hard_timeout(1.5)  # FM-6: SIGALRM raises HardTimeout inside the body\n"


def test_celery_time_limit_alone_fails_the_chord() -> None:
    """fm6's docstring: without @hard_timeout the hard time limit breaks the chord."""
    fm = variants.derive("fm6_task_timeouts", "fm6t_backstop_only",
                         [(HARD_TIMEOUT_LINE, ""), ("soft_time_limit=1, time_limit=5", "soft_time_limit=1, time_limit=2")])
    assert fm.hard_timeout is None
    harness.reset(fm)
    run_id = new_run_id()
    with running_worker(fm, run_id, "variant-fm6-backstop-only", grace=0.5):
        obs = run_scenario(fm, scenario(6), run_id, timeout=60, probe_after=False)
    harness.reset(fm)
    assert obs.chord.state == "FAILURE" and obs.chord.error_type == "ChordError"
    assert "TimeLimitExceeded" in (obs.chord.error or "")
    assert obs.notify_runs["chord"] == 0


def test_a_variant_edit_must_match_exactly_once() -> None:
    with pytest.raises(ValueError, match="occurs 0 times"):
        variants.derive("fm6_task_timeouts", "fm6t_nothing", [("no such line\n", "")])


def _publish_to_dlq(fm: Fm, body: Any, headers: dict[str, Any]) -> None:
    queue = fm.dead_letter_queue
    assert queue is not None and queue.exchange is not None
    with Connection(broker_url()) as conn:
        Producer(conn.default_channel).publish(
            json.dumps(body), exchange=queue.exchange, routing_key=queue.routing_key,
            content_type="application/json", content_encoding="utf-8", headers=headers,
        )


def test_the_drain_acks_what_is_not_a_chord_member_and_goes_on() -> None:
    fm = harness.load("fm3")
    harness.reset(fm)
    assert fm.dead_letter_queue is not None
    _publish_to_dlq(fm, [[], {}, {"chord": None}], {"id": "not-a-member", "task": "fm3.parse_document"})
    _publish_to_dlq(fm, {"not": "a task message"}, {})
    _publish_to_dlq(fm, [[], {}, {}], {})
    assert dlq_depth(fm) == 3
    assert dlq.drain(fm.app, fm.dead_letter_queue) == 0
    assert dlq_depth(fm) == 0


def test_declaring_the_task_queue_declares_its_dead_letter_queue() -> None:
    """shared/dlq.py: a DeadLetteringQueue cannot be declared without its DLQ."""
    fm = harness.load("fm3")
    harness.reset(fm)
    dead = fm.dead_letter_queue
    assert dead is not None
    with Connection(broker_url()) as conn:
        channel = cast(Any, conn.default_channel)
        channel.queue_delete(queue=dead.name)
        fm.task_queues[0].bind(channel).declare()
        assert int(cast(Any, dead.bind(channel).queue_declare(passive=True)).message_count) == 0
    harness.reset(fm)


def test_reset_replaces_a_lab_queue_declared_with_other_arguments() -> None:
    """A queue left from an older lab version (classic, not quorum) would fail the
    worker's declare with PRECONDITION_FAILED; reset deletes and re-declares it."""
    fm = harness.load("fm3")
    name = str(fm.task_queues[0].name)
    with Connection(broker_url()) as conn:
        channel = cast(Any, conn.default_channel)
        channel.queue_delete(queue=name)
        Queue(name, Exchange(name, type="direct"), routing_key=name).bind(channel).declare()
    harness.reset(fm)
    with Connection(broker_url()) as conn:
        fm.task_queues[0].bind(conn.default_channel).declare()  # the worker's declare: no PRECONDITION_FAILED
    harness.reset(fm)


def test_task_retry_on_worker_lost_bounds_the_poison_loop_and_still_breaks_the_chord() -> None:
    """fm3's docstring: Celery 5.7's own bound for a lost worker (``task_retry_on_worker_lost``)
    stops the loop after ``max_retries`` and then marks the member FAILURE: ChordError."""
    fm = variants.derive("fm2_worker_crash", "fm2r_retry_on_worker_lost", [
        ("app.conf.task_reject_on_worker_lost = True", "app.conf.task_reject_on_worker_lost = True\n"
         "app.conf.task_retry_on_worker_lost = True  # Celery 5.7: retry a lost task, max_retries times"),
        ("@app.task(bind=True)\n@enveloped  # FM-1\ndef parse_document",
         "@app.task(bind=True, default_retry_delay=0)\n@enveloped  # FM-1\ndef parse_document"),
    ])
    harness.reset(fm)
    run_id = new_run_id()
    with running_worker(fm, run_id, "variant-fm2-retry-on-worker-lost", grace=0.5):
        obs = run_scenario(fm, scenario(3), run_id, timeout=60, probe_after=False)
    harness.reset(fm)
    assert obs.attempts["doc4"] == 4  # the first attempt and max_retries (3) retries
    assert obs.chord.state == "FAILURE" and obs.chord.error_type == "ChordError"
    assert "WorkerLostError" in (obs.chord.error or "")
    assert obs.notify_runs["chord"] == 0
