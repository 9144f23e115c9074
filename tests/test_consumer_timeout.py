"""``shared.consumer_timeout`` without a worker: what it changes on the app's tasks and what it logs.
The worker's side (the limit it enforces per message) is claim C22 in tests/test_celery_claims.py."""

from __future__ import annotations

import itertools
import logging
from typing import Any

import pytest
from celery import Celery, Task

from shared.consumer_timeout import CappedRequest, within_consumer_timeout
from shared.timeouts import BackstopRequest

_apps = itertools.count()


def _app(task_time_limit: float | None) -> tuple[Celery, str]:
    app = Celery("t-cap", set_as_current=False)
    app.conf.task_time_limit = task_time_limit
    p = f"cap{next(_apps)}."

    def body() -> None: ...
    app.task(name=p + "plain", shared=False)(body)
    app.task(name=p + "backstop", shared=False, Request=BackstopRequest)(body)
    app.task(name=p + "long", shared=False, time_limit=2000)(body)
    return app, p


def test_a_lower_task_time_limit_is_kept() -> None:
    """Issue 38 item 1: on 5.5.3 and 5.6.3 a task's ``time_limit`` reads None under ``task_time_limit=60``;
    the cap of 900 s must not replace the setting's 60 s."""
    app, p = _app(60)
    lowered = [said for said in within_consumer_timeout(app, 1800) if said.startswith(p)]  # (shared tasks are the app's too)
    assert lowered == [f"{p}long: time_limit 2000 -> 900s"]  # its own 2000 s is what Celery enforces for it
    copied = ("time_limit", "task_time_limit") in Task.from_config  # 5.7.0's, not 5.5.3's or 5.6.3's
    assert app.tasks[p + "plain"].time_limit == (60 if copied else None)


def test_a_higher_task_time_limit_is_lowered_and_said_so() -> None:
    app, p = _app(3600)
    lowered = [said for said in within_consumer_timeout(app, 1800) if said.startswith(p)]
    said = "3600" if ("time_limit", "task_time_limit") in Task.from_config else "3600 (task_time_limit)"
    assert lowered == [f"{p}backstop: time_limit {said} -> 900s", f"{p}long: time_limit 2000 -> 900s",
                       f"{p}plain: time_limit {said} -> 900s"]
    assert [app.tasks[p + n].time_limit for n in ("plain", "backstop", "long")] == [900, 900, 900]


def test_one_warning_per_task_lowered_however_often_it_is_called(caplog: pytest.LogCaptureFixture) -> None:
    app, p = _app(None)
    with caplog.at_level(logging.DEBUG, logger="shared.consumer_timeout"):
        within_consumer_timeout(app, 1800)
        within_consumer_timeout(app, 1800)
        within_consumer_timeout(app, 1000)
    mine = [(r.levelno, r.getMessage()) for r in caplog.records if f" {p}" in r.getMessage()]
    assert mine == [(logging.DEBUG, f"consumer_timeout 1800s: {p}backstop: time_limit None -> 900s"),
                    (logging.WARNING, f"consumer_timeout 1800s: {p}long: time_limit 2000 -> 900s"),
                    (logging.DEBUG, f"consumer_timeout 1800s: {p}plain: time_limit None -> 900s")]
    assert [app.tasks[p + n].time_limit for n in ("plain", "backstop", "long")] == [500, 500, 500]


def test_the_request_class_composes_with_the_tasks_own() -> None:
    app, p = _app(None)
    within_consumer_timeout(app, 1800)
    within_consumer_timeout(app, 600)  # a second call caps what the first capped, once
    request: Any = app.tasks[p + "backstop"].Request
    assert issubclass(request, CappedRequest) and issubclass(request, BackstopRequest)
    assert request.consumer_timeout_cap == 300
    assert [c.__name__ for c in request.__mro__[:4]] == ["CappedBackstopRequest", "CappedRequest", "BackstopRequest",
                                                         "Request"]
    plain: Any = app.tasks[p + "plain"].Request
    assert issubclass(plain, CappedRequest) and not issubclass(plain, BackstopRequest)
