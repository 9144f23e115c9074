"""The chord benchmark (``bench/bench_chord.py``, issue 26): a quick run against the real RabbitMQ
and Redis, in a namespace of the test's own, accounts every document and writes its outputs; a
chord result that does not account for every document exactly is refused."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.bench_chord import BY_NAME, Unaccounted, account
from lab.fm import ROOT
from shared.envelope import Result
from tests.namespaces import derived

N = 30
QUICK = ["plain-task", "fm7-obs-off", "fm9-obs-off", "fm9-chunk10", "raw-kombu", "raw-redis"]


def test_a_result_counts_only_when_every_document_is_there_once() -> None:
    ids = [f"run/doc{i}" for i in range(1, 4)]
    fm7 = BY_NAME["fm7"]
    summary = {"ok": ["doc1", "doc2", "doc3"], "failed": [], "sent": True}
    assert account(fm7, Result[Any].success(summary, 1).to_wire(), ids) == 3
    assert account(BY_NAME["plain-chain"], {"ok": ids, "sent": True}, ids) == 3
    for wrong in ({"ok": ["doc1", "doc2"], "failed": [], "sent": True},  # one missing
                  {"ok": ["doc1", "doc2", "doc2"], "failed": [], "sent": True},  # one twice, one missing
                  {"ok": ["doc1", "doc2", "doc3", "doc3"], "failed": [], "sent": True},  # one twice
                  {"ok": ["doc1", "doc2"], "failed": [{"doc": "doc3", "reason": "error", "error": "x"}], "sent": True}):
        with pytest.raises(Unaccounted):
            account(fm7, Result[Any].success(wrong, 1).to_wire(), ids)
    with pytest.raises(Unaccounted):
        account(fm7, Result[Any].failure("ChordError", "error", 1).to_wire(), ids)


@pytest.mark.usefixtures("real_services")
def test_a_quick_run_accounts_every_document_and_writes_json_table_and_plot(tmp_path: Path) -> None:
    base = tmp_path / "quick"
    env = {**os.environ, "RCL_NAMESPACE": derived("bench")}
    done = subprocess.run([sys.executable, "bench/bench_chord.py", "--quick", "-n", str(N), "--only", *QUICK,
                           "--out", str(base)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    data = json.loads(base.with_suffix(".json").read_text())
    assert set(data) == {"meta", "summary", "runs"}
    assert data["meta"]["sizes"] == [N] and data["meta"]["nproc"] == os.cpu_count()
    runs = data["runs"]
    assert [r["variant"] for r in runs] == QUICK  # one repeat, in the given order
    for r in runs:
        assert r["accounted"] == N and r["n"] == N
        assert r["docs_per_s"] > 0 and abs(r["ms_per_member"] - r["seconds"] * 1000 / N) < 0.05  # both rounded to 3 places
        assert set(r["cpu"]) >= {"submitter", "rabbitmq", "redis"}
    by = {r["variant"]: r for r in runs}
    assert by["plain-task"]["messages_published"] == N  # one message per document from the submitter
    assert by["fm7-obs-off"]["messages_published"] == by["fm9-obs-off"]["messages_published"] == N  # the chain heads
    assert by["fm9-chunk10"]["messages_published"] == N // 10
    assert by["raw-kombu"]["messages_published"] == 2 * N
    assert abs(by["raw-kombu"]["bytes_per_message"] - by["fm9-obs-off"]["bytes_per_message"]) <= 1
    assert {"worker"} <= set(by["fm7-obs-off"]["cpu"]) and by["fm7-obs-off"]["cpu"]["worker"] > 0
    assert [(row["variant"], row["n"], row["runs"]) for row in data["summary"]] == [(v, N, 1) for v in QUICK]

    table = base.with_suffix(".md").read_text().splitlines()
    detail = [line for line in table if line.startswith(("| plain-task | 30 | ", "| fm7-obs-off | 30 | ", "| raw-redis | 30 | "))
              and " / " in line]  # min / median / max
    assert len(detail) == 3
    assert "| variant (median docs/s) | N=30 |" in table  # the pivot
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    png = base.with_suffix(".png")
    assert png.exists() == has_matplotlib
    if has_matplotlib:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.usefixtures("real_services")
def test_result_get_reads_the_header_again_through_the_bodys_parent(tmp_path: Path) -> None:
    """Why ``plain-chain-get`` costs what it does (docs/benchmarks.md): ``AsyncResult.get``
    (celery/result.py) calls ``_maybe_reraise_parent_error`` when it starts and again from its
    wait's interval callback; that calls ``maybe_throw`` on every parent, here the header's
    ``GroupResult``, which GETs each member whose result it has not cached yet. The same chord,
    waited for the same way with the body's result cut from its parent, makes at least one GET
    fewer per member: nothing else differs between the two runs (the same worker, the same
    tasks, the benchmark's own Redis counting every command)."""
    n = 60
    base = tmp_path / "get"
    env = {**os.environ, "RCL_NAMESPACE": derived("bget")}
    variants = ["plain-chain-get", "plain-chain-get-orphan"]
    done = subprocess.run([sys.executable, "bench/bench_chord.py", "--quick", "-n", str(n), "--only", *variants,
                           "--out", str(base)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    by = {r["variant"]: r for r in json.loads(base.with_suffix(".json").read_text())["runs"]}
    assert by["plain-chain-get"]["accounted"] == by["plain-chain-get-orphan"]["accounted"] == n
    gets = {name: by[name]["redis_by_command"].get("get", 0) for name in variants}
    assert gets["plain-chain-get"] - gets["plain-chain-get-orphan"] >= n, gets


@pytest.mark.usefixtures("real_services")
def test_the_rabbitmq_cpu_is_the_brokers_node_only() -> None:
    """Issue 38: the column summed every beam.smp on the machine (another node's, an owned one's) and once
    printed -0.14. Now: the one node that listens on the broker URL's port, whatever else runs."""
    from urllib.parse import urlparse

    from bench.bench_chord import _services  # pyright: ignore[reportPrivateUsage]
    from lab import owned
    from lab.settings import broker_url

    if owned.rabbit_available() is None:
        pytest.skip("needs rabbitmq-server for a second node")
    port = urlparse(broker_url()).port or 5672
    with owned.OwnedRabbit(f"t-bench-{os.getpid()}") as other:
        assert other.proc is not None
        found = _services().get("rabbitmq", [])
        assert len(found) == 1, found
        listening = Path("/proc/net/tcp").read_text() + Path("/proc/net/tcp6").read_text()
        inodes = {row.split()[9] for row in listening.splitlines()[1:]
                  if row.split()[3] == "0A" and int(row.split()[1].rsplit(":", 1)[1], 16) == port}
        fds = {os.readlink(f) for f in Path(f"/proc/{found[0]}/fd").iterdir()}
        assert {f"socket:[{i}]" for i in inodes} & fds
        assert Path(f"/proc/{found[0]}/comm").read_text().strip() == "beam.smp"
        others = [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()
                  and (e / "comm").exists() and (e / "comm").read_text().strip() == "beam.smp"]
        assert len(others) >= 2  # the owned node's VM runs too, and is not counted
