"""A test session leaves nothing behind: its namespaces, their cleaning, and the final look that fails it.

``tests/namespaces.py`` names the session's namespace and those its tests derive; ``tests/leftovers.py``
lists and deletes what is under them; ``conftest.py`` cleans at the end and fails a session that
finds anything left. Against the real services: a session of its own runs in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, cast

import pytest
from kombu import Connection
from sqlalchemy import Column, Integer, MetaData, Table, create_engine

from lab.fm import ROOT
from lab.observe import client
from lab.settings import broker_url, namespace_problem
from tests import leftovers
from tests.namespaces import DEFAULT, LIMIT, derived, fit, session_namespace


def test_the_session_namespace_comes_from_the_test_variable_or_the_users_own() -> None:
    assert session_namespace({"RCL_TEST_NAMESPACE": "mine", "RCL_NAMESPACE": "ada"}) == "mine"
    assert session_namespace({"RCL_NAMESPACE": "ada"}) == "ada-t"
    assert session_namespace({}) == DEFAULT == "rcltest"


def test_derived_names_keep_the_31_character_rule_and_stay_apart() -> None:
    long_a, long_b = "a" * 31, "a" * 30 + "b"
    names = [fit(long_a, "t"), fit(long_b, "t"), fit(long_a, "sig15"), fit("ada", "sig15")]
    assert names[3] == "ada-sig15"
    assert all(len(n) <= LIMIT and namespace_problem(n) is None for n in names), names
    assert len(set(names)) == 4  # two long names cut to the same prefix still differ (their hash)


@pytest.mark.usefixtures("real_services")
def test_the_final_look_lists_a_key_a_queue_and_a_table_and_the_cleaning_deletes_them(postgres_url: str) -> None:
    ns = derived("probe")
    r: Any = client()
    r.set(f"{ns}:fm1:x", "1")
    with Connection(broker_url()) as conn:
        cast(Any, conn.default_channel).queue_declare(queue=f"{ns}.fm1.tasks", durable=True)
    engine = create_engine(postgres_url)
    table = Table(f"{ns}_probe_rows", MetaData(), Column("id", Integer, primary_key=True))
    with engine.begin() as db:
        table.create(db, checkfirst=True)
    engine.dispose()
    found = leftovers.leftovers(postgres_url, namespaces=[ns])
    assert sorted(found) == sorted([f"Redis key {ns}:fm1:x", f"queue {ns}.fm1.tasks", f"PostgreSQL table {ns}_probe_rows"])
    leftovers.clean(postgres_url, namespaces=[ns])
    assert leftovers.leftovers(postgres_url, namespaces=[ns]) == []


INNER = '''
import os
import pytest
from lab.observe import client
from tests import namespaces

@pytest.fixture(scope="session")
def late():
    yield
    if os.environ.get("LEAVE") == "1":  # torn down after real_services has cleaned: as a straggler would
        client().set(f"{namespaces.session()}:fm1:late", "1")

def test_makes_a_key(late, real_services):
    client().set(f"{namespaces.session()}:fm1:early", "1")  # the cleaning deletes this one
'''


def _inner_session(folder: Path, ns: str, leave: bool) -> subprocess.CompletedProcess[str]:
    test = folder / "test_inner.py"
    test.write_text(textwrap.dedent(INNER))
    env = {**os.environ, "RCL_TEST_NAMESPACE": ns, "LEAVE": "1" if leave else "0"}
    env.pop("RCL_CLAIMS_JSON", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                           "--rootdir", str(folder), str(test)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.usefixtures("real_services")
def test_a_session_that_leaves_something_fails_naming_it(tmp_path: Path) -> None:
    ns = derived("inner")
    clean = _inner_session(tmp_path, ns, leave=False)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert f"nothing left behind in namespace {ns} or those derived from it" in clean.stdout
    left = _inner_session(tmp_path, ns, leave=True)
    assert left.returncode == 1, left.stdout + left.stderr
    assert "1 passed" in left.stdout  # every test passed: the leftover alone fails the session
    assert f"FAILED: 1 thing(s) left behind in namespace {ns} or one derived from it" in left.stdout
    assert f"  Redis key {ns}:fm1:late" in left.stdout and f"{ns}:fm1:early" not in left.stdout
    r: Any = client()
    r.delete(f"{ns}:fm1:late")
