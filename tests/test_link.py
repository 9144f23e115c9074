"""lab/link.py and shared/consumer_timeout.py: the cut touches only what goes through the link (a real
RabbitMQ), and the limits below the consumer timeout (pure: no broker)."""

from __future__ import annotations

import itertools
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, cast

import pytest
from celery import Celery
from kombu import Connection

from lab.fm import ROOT
from lab.link import BrokerLink, url_through
from lab.settings import broker_url
from shared.consumer_timeout import within_consumer_timeout


def _ping(conn: Connection) -> None:
    """One round trip on the connection's channel."""
    cast(Any, conn.default_channel).basic_qos(0, 1, False)


def _blocked(native_id: int | None) -> int:
    """The signal mask of one of this process's threads (``SigBlk``, bit n-1 for signal n)."""
    status = Path(f"/proc/self/task/{native_id}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("SigBlk:")).split()[1], 16)


def test_the_links_threads_leave_the_signals_a_main_thread_handles_to_it() -> None:
    """A SIGUSR1 (a cut by hand) or a Ctrl-C handed to a pump thread would wait for the main thread's next wake-up,
    and ``python -m lab.link``'s main thread sleeps in a read of its stdin: the link's threads block them."""
    with BrokerLink("127.0.0.1", 9) as link:  # nothing needs to answer: no connection is made
        accept = next(t for t in threading.enumerate() if t.name == f"broker-link-{link.port}")
        for sig in (signal.SIGUSR1, signal.SIGINT, signal.SIGTERM):
            assert _blocked(accept.native_id) & (1 << (sig - 1)), sig
            assert not _blocked(threading.main_thread().native_id) & (1 << (sig - 1)), sig  # the main's, unchanged


def test_the_link_url_keeps_the_credentials_and_the_vhost() -> None:
    assert url_through("amqp://lab:secret@broker.example:5672/vh", 17000) == "amqp://lab:secret@127.0.0.1:17000/vh"
    assert url_through("amqp://broker:5672//", 17001) == "amqp://127.0.0.1:17001//"


def test_a_cut_drops_the_connections_through_the_link_and_no_other() -> None:
    with BrokerLink.to(broker_url()) as link, Connection(link.url(broker_url()), connect_timeout=5) as through, \
            Connection(broker_url(), connect_timeout=5) as direct:
        through.connect()
        direct.connect()
        _ping(through)
        assert link.connections == 1
        assert link.cut() == 1
        with pytest.raises(Exception):  # the broker side is gone: the next frame fails (ConnectionError or OSError)
            _ping(through)
            through.drain_events(timeout=2)
        _ping(direct)  # the other client's connection is untouched
        with Connection(link.url(broker_url()), connect_timeout=5) as again:  # the link forwards again at once
            again.connect()
            _ping(again)
        assert link.cuts == 1


_apps = itertools.count()
NAMES = ("short", "long", "unbounded", "soft")


def _app() -> tuple[Celery, str]:
    """An app with four tasks (names under a prefix of its own: Celery warns of a name given twice)."""
    app = Celery("t-consumer-timeout", set_as_current=False)
    p = f"t{next(_apps)}."
    limits: dict[str, tuple[int | None, int | None]] = {
        "short": (3, None), "long": (2000, 1500), "unbounded": (None, None), "soft": (600, 500)}
    for name, (hard, soft) in limits.items():
        def body() -> None: ...
        limit: dict[str, Any] = {k: v for k, v in (("time_limit", hard), ("soft_time_limit", soft)) if v is not None}
        app.task(name=p + name, shared=False, **limit)(body)  # not shared: no other app of the session gets it
    return app, p


def test_every_limit_above_half_the_consumer_timeout_is_lowered_and_said() -> None:
    app, p = _app()
    lowered = [said for said in within_consumer_timeout(app, 1800) if said.startswith(p)]  # (shared tasks are the app's too)
    assert [app.tasks[p + n].time_limit for n in NAMES] == [3, 900, 900, 600]
    assert [app.tasks[p + n].soft_time_limit for n in NAMES] == [None, None, None, 500]
    assert lowered == [f"{p}long: time_limit 2000 -> 900s", f"{p}long: soft_time_limit 1500 dropped (not below 900s)",
                       f"{p}unbounded: time_limit None -> 900s"]


def test_a_low_consumer_timeout_lowers_every_limit_and_celerys_own_tasks_are_left_alone() -> None:
    app, p = _app()
    within_consumer_timeout(app, 2.4)
    assert [app.tasks[p + n].time_limit for n in NAMES] == [1.2] * 4
    assert all(t.time_limit is None for name, t in app.tasks.items() if name.startswith("celery."))
    with pytest.raises(ValueError):
        within_consumer_timeout(app, 10, share=1.0)


def test_by_hand_the_link_prints_the_workers_url_and_each_enter_cuts() -> None:
    """docs/failure-modes.md (FM-9): ``python -m lab.link`` in a shell of its own; the worker gets the URL it prints."""
    proc = subprocess.Popen([sys.executable, "-m", "lab.link"], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert proc.stdout.readline().startswith("link to amqp://")
        exported = proc.stdout.readline().strip()
        assert exported.startswith("export CELERY_BROKER_URL=amqp://") and "guest:guest@127.0.0.1:" in exported
        proc.stdout.readline()
        with Connection(exported.split("=", 1)[1], connect_timeout=5) as through:
            through.connect()
            _ping(through)
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "cut 1 connection(s)"
            with pytest.raises(Exception):
                _ping(through)
                through.drain_events(timeout=2)
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
