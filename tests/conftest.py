"""Fixtures, one per concern: a broker-less Celery app for unit tests, and the real services.

The tests run in a namespace of their own, set here before any lab module reads
``RCL_NAMESPACE`` (``tests/namespaces.py``): ``RCL_TEST_NAMESPACE``, else ``<RCL_NAMESPACE>-t``,
else ``rcltest``; so ``make test`` never touches the names a user's lab runs own. A test that
needs a namespace beside it (a lab run in a subprocess, a second ledger) derives one,
``namespaces.derived("sig15")``. Every key, queue, exchange and table goes under one of them.

Nothing is left behind: the ``real_services`` fixture deletes, at the end of the session, the
Redis keys and the broker's queues and exchanges of the session's namespaces, and ``postgres_url``
their PostgreSQL tables (``tests/leftovers.py``); then the session looks again, and a session that
finds anything left fails (exit status 1), naming each leftover.

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

from tests.namespaces import session_namespace

os.environ["RCL_NAMESPACE"] = session_namespace(os.environ)

from collections.abc import Callable, Iterator  # noqa: E402  (the namespace must be set first)
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from celery import Celery  # noqa: E402

from sqlalchemy import create_engine  # noqa: E402
from sqlalchemy.exc import OperationalError  # noqa: E402

from case_studies.severity_batch.ledger import Ledger  # noqa: E402
from lab import services  # noqa: E402
from lab.observe import client  # noqa: E402
from lab.settings import NAMESPACE, mask_url  # noqa: E402
from tests import leftovers  # noqa: E402

DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
"""The case studies' ledger on PostgreSQL in tests (``RCL_TEST_POSTGRES_URL`` overrides it)."""


@pytest.fixture
def local_app() -> Celery:
    """A Celery app that never connects: tasks are called directly or with ``apply()``."""
    app = Celery("rcl_unit", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.update(task_always_eager=False, accept_content=["json"], task_serializer="json", result_serializer="json")
    return app


_used: dict[str, str | None] = {}
"""What the session used: ``services`` (RabbitMQ and Redis) and ``postgres`` (its URL), for the final look."""


@pytest.fixture(scope="session")
def real_services() -> Iterator[None]:
    """RabbitMQ and Redis must answer (started by the lab when they do not); at the end
    of the session, the test namespaces' queues, exchanges and keys are deleted."""
    services.ensure()
    _used["services"] = None
    yield
    leftovers.clean(None, services=True)


@pytest.fixture
def redis_keys(real_services: None) -> Iterator[list[str]]:
    """Keys a test creates; deleted one by one afterwards (never a flush)."""
    keys: list[str] = []
    yield keys
    if keys:
        r: Any = client()
        r.delete(*keys)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """PostgreSQL for the ledger tests: skipped, saying why, when it does not answer,
    unless ``RCL_REQUIRE_POSTGRES=1`` (``.ci/run``) makes that a failure. At the end of the
    session, the test namespaces' tables there are dropped."""
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
    _used["postgres"] = url
    yield url
    leftovers.clean(url, services=False)


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
    check_nothing_left(session)


_left: list[list[str]] = []
"""What the final look found (one list, once it has looked)."""


def check_nothing_left(session: pytest.Session) -> None:
    """After the fixtures have deleted what the session made: look again, and fail the session
    (exit status 1) when anything of its namespaces is still there."""
    if not _used:  # no service was used: nothing to look at (a unit-test session stays off the network)
        return
    found = leftovers.leftovers(_used.get("postgres"), services="services" in _used)
    _left.append(found)
    if found:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The final look's finding, after the tests' summary (``check_nothing_left``)."""
    if not _left:
        return
    found = _left[0]
    if not found:
        what = f"Redis keys, queues, exchanges{', PostgreSQL tables' if 'postgres' in _used else ''}"
        terminalreporter.write_sep("-", f"nothing left behind in namespace {NAMESPACE} or those derived from it ({what})")
        return
    terminalreporter.write_sep("=", f"FAILED: {len(found)} thing(s) left behind in namespace {NAMESPACE} or one "
                               "derived from it", red=True)
    for line in found[:100]:
        terminalreporter.write_line(f"  {line}")
