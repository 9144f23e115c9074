"""A network path of the lab's own between one worker and its broker, which the runner can cut.

A scenario drops a worker's broker connection while its members run, as a network blip or a broker
failover does. ``BrokerLink`` listens on a port of its own and forwards every connection to the broker;
the worker is given the link's URL (``url_through``), nobody else is, so ``cut()`` closes that worker's
connections (its consumer's, its pool processes', its beat's) and no other client's: on a shared
broker nobody else's connection is touched. The broker sees the connection end as a client that went
away and requeues what it had delivered unacked on it; the worker sees its socket closed and
reconnects through the link, which forwards again at once.

Why not ``rabbitmqctl close_connection``: each call of the CLI boots an Erlang VM, 0.4 to 1.1 s on the
lab's machine (listing the connections, then closing one), longer than a slow member's whole body
(0.8 s under the time limits' soft deadline), so the drop could not be aimed at a running member; it also needs the
broker's Erlang cookie, which a workshop attendee's shared broker does not give.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit, urlunsplit

BUFFER = 65536
HANDLED_BY_MAIN = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1}
"""Signals a Python program handles in its main thread (Python runs every handler there)."""


def url_through(url: str, port: int) -> str:
    """``url`` (an AMQP URL) with its host and port replaced by the link's."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{auth + '@' if auth else ''}127.0.0.1:{port}"))


class BrokerLink:
    """Forwards ``127.0.0.1:<port>`` to the broker at ``host:port`` until closed; ``cut()`` drops every
    connection that goes through it at that moment (new ones are forwarded as before)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._closed = False
        self.cuts = 0
        # The link's threads (this one and every pump it starts, which inherit its mask) block the signals a main
        # thread handles, so the kernel hands those to the main thread: one handed to a pump thread runs Python's
        # handler only once the main thread next wakes, and ``python -m lab.link``'s main thread sleeps in a read of
        # its stdin (a SIGUSR1 for a cut, a Ctrl-C, went unanswered: 2 of 80 SIGUSR1s under a connection a 20 ms).
        before = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_BY_MAIN)
        try:
            threading.Thread(target=self._accept, name=f"broker-link-{self.port}", daemon=True).start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)

    @classmethod
    def to(cls, url: str) -> BrokerLink:
        parts = urlsplit(url)
        return cls(parts.hostname or "127.0.0.1", parts.port or 5672)

    def url(self, broker_url: str) -> str:
        return url_through(broker_url, self.port)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:  # closed
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.close()  # the broker does not answer: the client sees its connection refused
                continue
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self._pairs.append((client, upstream))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(BUFFER):
                dst.sendall(data)
        except OSError:
            pass
        self._drop(src, dst)

    def _drop(self, a: socket.socket, b: socket.socket) -> None:
        with self._lock:
            self._pairs = [p for p in self._pairs if a not in p]
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    @property
    def connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def cut(self) -> int:
        """Drop every connection going through the link now; how many there were."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for client, upstream in pairs:
            for s in (client, upstream):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self.cuts += 1
        return len(pairs)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._server.close()
        self.cut()

    def __enter__(self) -> BrokerLink:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


# ---- the link by hand: found by the namespace, cut on request --------------------------------------------------

LINK_FILE = "link.json"
"""Under the namespace's state folder (``.lab/<namespace>/``): the running link's pid and port."""
CUTS_FILE = "link-cuts"
"""One line per cut the running link made: its time and how many connections it closed."""
REQUEST_FILE = "link-request"
"""Written by ``python -m lab.link --cut``: a by-hand run carries the cut out at its mark, then the file goes."""
ASK_SECONDS = 240.0
"""How long ``--cut`` waits for a by-hand run to carry its cut out before it has the link cut at once."""


def _state(name: str) -> Path:
    from lab.workers import STATE_DIR

    return STATE_DIR / name


def registered() -> tuple[int, int] | None:
    """The namespace's running link (its pid, its port), found by its file and checked by its command line."""
    try:
        found = json.loads(_state(LINK_FILE).read_text())
        pid, port = int(found["pid"]), int(found["port"])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not cmdline.rstrip().endswith("-m lab.link"):  # the link itself, not a `--cut` asking it
        return None
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1.0).close()  # it listens (the forward may go nowhere yet)
    except OSError:
        return None
    return pid, port


def cuts() -> list[tuple[float, int]]:
    """The cuts the namespace's link made: (when, connections closed)."""
    try:
        lines = _state(CUTS_FILE).read_text().splitlines()
    except OSError:
        return []
    return [(float(t), int(n)) for t, n in (line.split() for line in lines if line.strip())]


def requested() -> float | None:
    """When ``--cut`` asked for a cut still to carry out (None: none asked)."""
    try:
        return float(_state(REQUEST_FILE).read_text())
    except (OSError, ValueError):
        return None


def describe(pid: int) -> str:
    """What ``/proc`` says of process ``pid`` (the link, when a cut went unanswered): its state, threads and signal
    masks (``SigPnd``/``ShdPnd`` pending, ``SigBlk`` blocked, ``SigCgt`` caught; SIGUSR1 is bit 9)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return f"process {pid} is gone"
    fields = dict(line.split(":", 1) for line in lines if ":" in line)
    keep = ("State", "Threads", "SigPnd", "ShdPnd", "SigBlk", "SigCgt")
    return f"process {pid}: " + ", ".join(f"{k} {fields[k].strip()}" for k in keep if k in fields)


def fire(pid: int) -> None:
    """Have the link ``pid`` cut now (SIGUSR1)."""
    os.kill(pid, signal.SIGUSR1)


def _serve(link: BrokerLink) -> None:
    """Register ``link`` for the namespace; each Enter or SIGUSR1 cuts, and the cut is written down."""
    import sys

    written = threading.Lock()

    def cut() -> None:
        n = link.cut()
        with written, _state(CUTS_FILE).open("a") as out:
            out.write(f"{time.time()!r} {n}\n")
        print(f"cut {n} connection(s)", flush=True)

    _state(LINK_FILE).parent.mkdir(parents=True, exist_ok=True)
    _state(CUTS_FILE).unlink(missing_ok=True)
    _state(LINK_FILE).write_text(json.dumps({"pid": os.getpid(), "port": link.port}))
    def on_usr1(signum: int, frame: object) -> None:  # off the signal handler: cut() takes the link's lock
        threading.Thread(target=cut, daemon=True).start()

    signal.signal(signal.SIGUSR1, on_usr1)
    try:
        for _ in sys.stdin:
            cut()
    except KeyboardInterrupt:
        pass
    finally:
        _state(LINK_FILE).unlink(missing_ok=True)


def _ask_cut() -> int:
    """``--cut``: ask the namespace's link for a cut, carried out by a by-hand run at its mark; say when it is done."""
    import sys

    from lab.waiting import wait_until

    found = registered()
    if found is None:
        print("error: no link runs in this namespace; start one in a shell of its own: .venv/bin/python -m lab.link",
              file=sys.stderr)
        return 2
    before = len(cuts())
    _state(REQUEST_FILE).write_text(repr(time.time()))
    print("asked the link to cut the worker's broker connections; the submitter carries the cut out while the slow "
          "document runs ...", flush=True)
    try:
        if not wait_until(lambda: len(cuts()) > before, ASK_SECONDS, interval=0.05):
            print(f"no by-hand run carried the cut out within {ASK_SECONDS:.0f}s: cutting now", flush=True)
            fire(found[0])
            if not wait_until(lambda: len(cuts()) > before, 5.0, interval=0.05):
                print(f"the link did not answer ({describe(found[0])})", flush=True)
    finally:
        _state(REQUEST_FILE).unlink(missing_ok=True)
    made = cuts()[before:]
    print(f"cut {made[0][1] if made else 0} connection(s)", flush=True)
    return 0 if made else 1


def main(argv: list[str] | None = None) -> int:
    """``python -m lab.link``: a link in front of the broker for a by-hand run. It prints the URL to give the worker
    (``CELERY_BROKER_URL``); each Enter cuts the connections going through it; Ctrl-C or end of input stops it.
    ``python -m lab.link --cut``: ask this namespace's link for a cut (a by-hand run carries it out at its mark)."""
    import argparse

    from lab.settings import broker_url, mask_url

    p = argparse.ArgumentParser(prog="python -m lab.link", description=main.__doc__)
    p.add_argument("--broker", default=None, help="the broker's AMQP URL (default: CELERY_BROKER_URL, else localhost)")
    p.add_argument("--cut", action="store_true", help="ask the namespace's running link for a cut, and wait for it")
    args = p.parse_args(argv)
    if args.cut:
        return _ask_cut()
    url = str(args.broker or broker_url())
    with BrokerLink.to(url) as link:
        print(f"link to {mask_url(url)} listening; give the worker:", flush=True)
        print(f"export CELERY_BROKER_URL={link.url(url)}", flush=True)
        print("Enter cuts the connections through the link; Ctrl-C stops it", flush=True)
        _serve(link)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
