from __future__ import annotations

import importlib
from typing import Any

import pytest

from shared.recipe import PARSE_LAYERS, Recipe, parse_stack
from shared.scenarios import RunContext, scenario

FMS = ["fm0_naive", "fm1_mid_pipeline_error", "fm2_worker_crash", "fm3_dlq_reconciliation",
       "fm4_duplicated_runs", "fm5_transient_failures", "fm6_task_timeouts"]


def recipe(module: str) -> Recipe:
    return importlib.import_module(module).RECIPE


def test_the_stacking_order_is_the_designed_one() -> None:
    assert PARSE_LAYERS == ("enveloped", "transient_retryable", "hard_timeout")


def _layers(fn: Any) -> list[str]:
    """The wrapper layers around a task function, outermost first, by their defining decorator."""
    names: list[str] = []
    while hasattr(fn, "__wrapped__"):
        names.append(fn.__code__.co_qualname.split(".<locals>")[0])  # wraps() copies __qualname__, not the code
        fn = fn.__wrapped__
    return names


def test_fm6_parse_document_is_wrapped_in_that_order() -> None:
    fm6 = importlib.import_module("fm6_task_timeouts")
    assert _layers(fm6.tasks.parse_document.run) == ["enveloped", "transient_retryable", "hard_timeout"]
    assert _layers(fm6.tasks.notify.run) == ["enveloped"]
    assert len(parse_stack(fm6.RECIPE)) == 3


@pytest.mark.parametrize("n", range(7))
def test_each_fm_adds_its_fix_and_keeps_the_earlier_ones(n: int) -> None:
    r = recipe(FMS[n])
    assert r.fm == f"fm{n}" and r.module == FMS[n] and r.scenario == max(n, 1)
    assert r.enveloped is (n >= 1)
    assert bool(r.conf.get("task_acks_late")) is (n >= 2) and bool(r.conf.get("task_reject_on_worker_lost")) is (n >= 2)
    assert (r.dead_letter is not None) is (n >= 3) and r.beat is (n >= 3)
    assert (r.claim is not None) is (n >= 4)
    assert (r.retry is not None) is (n >= 5)
    assert (r.hard_timeout is not None) is (n >= 6)
    assert r.concurrency == (2 if n >= 2 else 1)


def test_fm6_limits_sit_around_its_hard_timeout() -> None:
    r = recipe("fm6_task_timeouts")
    assert r.hard_timeout is not None
    assert r.parse_options["soft_time_limit"] < r.hard_timeout < r.parse_options["time_limit"]


@pytest.mark.parametrize("module", FMS)
def test_every_name_an_fm_owns_is_in_its_namespace(module: str) -> None:
    r = recipe(module)
    for name in (*r.queue_names, *r.exchange_names):
        assert name.startswith(f"rcl.{r.fm}.")
    app = importlib.import_module(module).app
    assert app.conf.accept_content == ["json"]
    assert app.conf.result_backend_transport_options["global_keyprefix"] == f"rcl:{r.fm}:"


def test_fm3_task_queue_is_a_bounded_quorum_queue() -> None:
    r = recipe("fm3_dlq_reconciliation")
    args = r.task_queue.queue_arguments or {}
    assert args["x-queue-type"] == "quorum" and args["x-delivery-limit"] == 2
    assert args["x-dead-letter-exchange"] == "rcl.fm3.dlx"
    assert r.queue_names == ("rcl.fm3.tasks", "rcl.fm3.dlq")


def test_extend_merges_mappings() -> None:
    base = Recipe(fm="a", module="a", scenario=1, conf={"x": 1})
    more = base.extend(fm="b", module="b", scenario=2, conf={"y": 2})
    assert dict(more.conf) == {"x": 1, "y": 2} and dict(base.conf) == {"x": 1}


def test_scenarios_are_cumulative() -> None:
    assert scenario(1).docs == ("doc1", "doc2")
    assert scenario(6).docs == tuple(f"doc{i}" for i in range(1, 9))
    assert not scenario(3).duplicate_notify and scenario(4).duplicate_notify
    with pytest.raises(ValueError):
        scenario(7)


def test_run_context_round_trips() -> None:
    ctx = RunContext.for_scenario("r1", "fm5", scenario(5))
    back = RunContext.from_wire(ctx.to_wire())
    assert back == ctx and back.fault_for("doc5") is not None and back.fault_for("doc2") is None


@pytest.mark.parametrize("module", FMS)
def test_each_docstring_gives_the_worker_command_the_harness_runs(module: str) -> None:
    r = recipe(module)
    doc = importlib.import_module(module).__doc__ or ""
    assert f"celery -A {r.module} worker {' '.join(r.worker_args())}\n" in doc
    assert f"python {r.module}.py" in doc
