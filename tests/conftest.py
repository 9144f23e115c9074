"""Fixtures, one per concern: a broker-less Celery app for unit tests, and the real services."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from lab import services
from lab.observe import client


@pytest.fixture
def local_app() -> Celery:
    """A Celery app that never connects: tasks are called directly or with ``apply()``."""
    app = Celery("rcl_unit", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(task_always_eager=False, accept_content=["json"], task_serializer="json", result_serializer="json")
    return app


@pytest.fixture(scope="session")
def real_services() -> None:
    """RabbitMQ and Redis must answer (started by the lab when they do not)."""
    services.ensure()


@pytest.fixture
def redis_keys(real_services: None) -> Iterator[list[str]]:
    """Keys a test creates; deleted one by one afterwards (never a flush)."""
    keys: list[str] = []
    yield keys
    if keys:
        r: Any = client()
        r.delete(*keys)
