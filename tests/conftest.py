"""Fixtures, one per concern: a broker-less Celery app for unit tests, and the real services.

The tests run in a namespace of their own (``RCL_TEST_NAMESPACE``, default
``rcltest``), set here before any lab module reads ``RCL_NAMESPACE``, so ``make test``
never touches the names a user's lab runs own; the session deletes what it made.
"""

from __future__ import annotations

import os

os.environ["RCL_NAMESPACE"] = os.environ.get("RCL_TEST_NAMESPACE", "rcltest")

from collections.abc import Iterator  # noqa: E402  (the namespace must be set first)
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from celery import Celery  # noqa: E402

from sqlalchemy import create_engine  # noqa: E402
from sqlalchemy.exc import OperationalError  # noqa: E402

from case_studies.severity_batch.ledger import Ledger  # noqa: E402
from lab import harness, services  # noqa: E402
from lab.observe import client  # noqa: E402
from lab.settings import mask_url  # noqa: E402

DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
"""The case studies' ledger on PostgreSQL in tests (``RCL_TEST_POSTGRES_URL`` overrides it)."""


@pytest.fixture
def local_app() -> Celery:
    """A Celery app that never connects: tasks are called directly or with ``apply()``."""
    app = Celery("rcl_unit", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(task_always_eager=False, accept_content=["json"], task_serializer="json", result_serializer="json")
    return app


@pytest.fixture(scope="session")
def real_services() -> Iterator[None]:
    """RabbitMQ and Redis must answer (started by the lab when they do not); at the end
    of the session, the test namespace's queues, exchanges and keys are deleted."""
    services.ensure()
    yield
    harness.clean(say=lambda _: None)


@pytest.fixture
def redis_keys(real_services: None) -> Iterator[list[str]]:
    """Keys a test creates; deleted one by one afterwards (never a flush)."""
    keys: list[str] = []
    yield keys
    if keys:
        r: Any = client()
        r.delete(*keys)


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """PostgreSQL for the ledger tests: skipped, saying why, when it does not answer,
    unless ``RCL_REQUIRE_POSTGRES=1`` (``.ci/run``) makes that a failure."""
    url = os.environ.get("RCL_TEST_POSTGRES_URL") or DEFAULT_POSTGRES_URL
    probe = Ledger(url)
    engine = create_engine(probe.url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect():
            pass
    except OperationalError as error:
        said = (str(error.orig).strip().splitlines() or ["no answer"])[0]
        why = f"PostgreSQL does not answer at {mask_url(probe.url)}: {said} (set RCL_TEST_POSTGRES_URL)"
        if os.environ.get("RCL_REQUIRE_POSTGRES") == "1":
            pytest.fail(why)
        pytest.skip(why)
    finally:
        engine.dispose()
    return url
