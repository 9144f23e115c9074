"""Fixtures, one per concern: a broker-less Celery app for unit tests, and the real services.

The tests run in a namespace of their own (``RCL_TEST_NAMESPACE``, default
``rcltest``), set here before any lab module reads ``RCL_NAMESPACE``, so ``make test``
never touches the names a user's lab runs own; the session deletes what it made.

Claims (``tests/test_celery_claims.py``): a test marked ``@pytest.mark.claim(label, title)``
proves one claim a docstring makes about Celery or RabbitMQ. Where the claim does not
hold on the running Celery, the test checks what that version does instead (as the
docstring states it) and says so with the ``limit`` fixture; where it cannot apply
(a setting the version lacks), it skips, saying why. With ``RCL_CLAIMS_JSON=PATH`` the
session writes each claim's outcome there (``make matrix`` reads it, ``lab.matrix``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ["RCL_NAMESPACE"] = os.environ.get("RCL_TEST_NAMESPACE", "rcltest")

from collections.abc import Callable, Iterator  # noqa: E402  (the namespace must be set first)
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


# ---- claims: their marker, the limit fixture and the outcomes for make matrix -------------

CLAIMS_JSON = "RCL_CLAIMS_JSON"
_claims: dict[str, dict[str, Any]] = {}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "claim(label, title): the test proves the docstring claim `label`, "
                            "in a few words `title` (a row of make matrix's table)")


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:  # those that will run (after -k, -m)
        if (marker := item.get_closest_marker("claim")) is not None:
            label, title = (str(a) for a in marker.args)
            _claims[item.nodeid] = {"label": label, "title": title, "test": item.nodeid, "outcome": "not run", "limit": None, "message": ""}


@pytest.fixture
def limit(record_property: Callable[[str, object], None]) -> Callable[[str], None]:
    """``limit(why)``: the claim does not hold on the running Celery; the test checked what this
    version does instead, and ``why`` says it (the version's module and function)."""
    return lambda why: record_property("limit", why)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    claim = _claims.get(report.nodeid)
    if claim is None or not (report.when == "call" or report.outcome != "passed"):
        return
    if claim["outcome"] in ("failed", "skipped"):  # a teardown after a failed call keeps the call's word
        return
    claim["outcome"] = report.outcome
    claim["limit"] = next((str(v) for k, v in report.user_properties if k == "limit"), None)
    if report.skipped and isinstance(report.longrepr, tuple):
        claim["message"] = str(report.longrepr[2]).removeprefix("Skipped: ")
    elif report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        said = str(getattr(crash, "message", "")) or report.longreprtext.strip()
        claim["message"] = " ".join(said.split())[:300]


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get(CLAIMS_JSON)
    if path:
        Path(path).write_text(json.dumps({"claims": list(_claims.values())}, indent=1) + "\n")
