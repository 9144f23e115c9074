"""Make sure RabbitMQ and Redis answer before a run (DESIGN.md §4).

In order:

1. both answer at their URLs: use them;
2. otherwise, for the default localhost URLs only: a Docker engine answers:
   ``docker compose up -d`` with the repo's ``docker-compose.yml``;
3. else ``redis-server`` / ``rabbitmq-server`` are installed: start them as the
   current user with their data under ``.lab/services/`` (git-ignored);
4. else ``ServiceError`` (the CLI exits 2) saying what to do.

A URL the user set (``CELERY_BROKER_URL``, ``CELERY_RESULT_BACKEND``) that does
not answer is an error naming the URL, its password masked: the lab does not
start services for someone else's broker. ``stop_started()`` stops what step 3
started (``run_all_fms.py --down``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import redis
from amqp.exceptions import AccessRefused
from kombu import Connection

from lab import settings
from lab.observe import connect
from lab.waiting import wait_until

ROOT = Path(__file__).resolve().parent.parent
STATE = ROOT / ".lab" / "services"
START_TIMEOUT = 90.0
RABBIT_NODE = "rcl-lab@localhost"


class ServiceError(Exception):
    """A service is missing and the lab cannot (or must not) start it."""


def broker_problem(url: str | None = None, timeout: float = 3.0) -> str | None:
    """None when the broker answers and lets the lab in; else what is wrong, in words."""
    try:
        with Connection(url or settings.broker_url(), connect_timeout=timeout) as conn:
            conn.connect()
        return None
    except AccessRefused as exc:
        return f"refused the lab's credentials ({exc})"
    except Exception as exc:
        return f"does not answer ({type(exc).__name__}: {exc})"


def backend_problem(url: str | None = None, timeout: float = 3.0) -> str | None:
    """None when Redis answers and lets the lab in; else what is wrong, in words."""
    try:
        client = connect(url or settings.backend_url(), socket_connect_timeout=timeout, socket_timeout=timeout)
        try:
            cast(Any, client).ping()
            return None
        finally:
            client.close()
    except redis.AuthenticationError as exc:
        return f"refused the lab's credentials ({exc})"
    except redis.ResponseError as exc:
        if any(word in str(exc) for word in ("NOAUTH", "WRONGPASS", "invalid password")):
            return f"refused the lab's credentials ({exc})"
        return f"answered with an error ({exc})"
    except Exception as exc:
        return f"does not answer ({type(exc).__name__}: {exc})"


def broker_answers(url: str | None = None, timeout: float = 3.0) -> bool:
    return broker_problem(url, timeout) is None


def backend_answers(url: str | None = None, timeout: float = 3.0) -> bool:
    return backend_problem(url, timeout) is None


HOW_TO = """The lab needs RabbitMQ (AMQP on 127.0.0.1:5672, guest/guest) and Redis (127.0.0.1:6379).
Any one of these works:
  1. start them yourself (or point CELERY_BROKER_URL / CELERY_RESULT_BACKEND at yours);
  2. run a Docker engine: the lab then runs `docker compose up -d` with docker-compose.yml;
  3. install the servers (Debian/Ubuntu: apt-get install rabbitmq-server redis-server;
     macOS: brew install rabbitmq redis): the lab then starts them itself under .lab/services/."""


def ensure(say: Callable[[str], None] = print) -> None:
    """Return when both services answer; raise ``ServiceError`` otherwise."""
    broker_says, backend_says = broker_problem(), backend_problem()
    broker_ok, backend_ok = broker_says is None, backend_says is None
    if broker_ok and backend_ok:
        return
    for problem, is_default, url, what in (
        (broker_says, settings.broker_is_default(), settings.broker_url(), "CELERY_BROKER_URL"),
        (backend_says, settings.backend_is_default(), settings.backend_url(), "CELERY_RESULT_BACKEND"),
    ):
        if problem is not None and "credentials" in problem:
            raise ServiceError(f"{what}={settings.mask_url(url)} {problem}: check the user and password in the URL.")
        if problem is not None and not is_default:
            raise ServiceError(f"{what}={settings.mask_url(url)} {problem}; the lab starts services only for the "
                               "default localhost URLs.")
    missing = [name for name, ok in (("rabbitmq", broker_ok), ("redis", backend_ok)) if not ok]
    if _docker_answers():
        say(f"starting {', '.join(missing)} with docker compose ...")
        _run(["docker", "compose", "-f", str(ROOT / "docker-compose.yml"), "up", "-d", *missing])
    else:
        for name in missing:
            starter = _LOCAL_STARTERS[name]
            if not starter(say):
                raise ServiceError(f"{name} does not answer and no way to start it was found.\n{HOW_TO}")
    if not wait_until(lambda: broker_answers(timeout=1.0) and backend_answers(timeout=1.0), START_TIMEOUT, interval=0.5):
        raise ServiceError(f"started {', '.join(missing)} but it did not answer within {START_TIMEOUT:.0f}s (see .lab/services/)")


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return subprocess.run(["docker", "info"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _run(cmd: list[str], env: dict[str, str] | None = None) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    if done.returncode != 0:
        raise ServiceError(f"`{' '.join(cmd)}` failed ({done.returncode}): {done.stderr.strip()[-800:]}")


def _start_redis(say: Callable[[str], None]) -> bool:
    exe = shutil.which("redis-server")
    if exe is None:
        return False
    folder = STATE / "redis"
    folder.mkdir(parents=True, exist_ok=True)
    say(f"starting redis-server (data in {folder}) ...")
    _run([exe, "--port", "6379", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "yes",
          "--dir", str(folder), "--pidfile", str(folder / "redis.pid"), "--logfile", str(folder / "redis.log")])
    return True


def _rabbit_env() -> dict[str, str]:
    folder = STATE / "rabbitmq"
    for sub in ("mnesia", "log", "home"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    plugins = folder / "enabled_plugins"
    if not plugins.exists():
        plugins.write_text("[].\n")
    return {
        **os.environ,
        "HOME": str(folder / "home"),  # a private Erlang cookie
        "RABBITMQ_NODENAME": RABBIT_NODE,
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": "5672",
        "RABBITMQ_MNESIA_BASE": str(folder / "mnesia"),
        "RABBITMQ_LOG_BASE": str(folder / "log"),
        "RABBITMQ_PID_FILE": str(folder / "rabbitmq.pid"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(plugins),
        "RABBITMQ_CONFIG_FILE": str(folder / "rabbitmq"),  # absent: defaults
    }


def _rabbit_bin(name: str) -> str | None:
    # Debian's /usr/sbin wrappers switch to the rabbitmq user; the real scripts run as us.
    direct = Path("/usr/lib/rabbitmq/bin") / name
    return str(direct) if direct.exists() else shutil.which(name)


def _start_rabbitmq(say: Callable[[str], None]) -> bool:
    exe = _rabbit_bin("rabbitmq-server")
    if exe is None:
        return False
    say(f"starting rabbitmq-server (data in {STATE / 'rabbitmq'}) ...")
    _run([exe, "-detached"], env=_rabbit_env())
    return True


_LOCAL_STARTERS: dict[str, Callable[[Callable[[str], None]], bool]] = {"redis": _start_redis, "rabbitmq": _start_rabbitmq}


def started_by_lab() -> list[str]:
    """The servers step 3 started that ``stop_started`` would stop (by their pid files)."""
    return [name for name, pidfile in (("redis-server", STATE / "redis" / "redis.pid"),
                                       ("rabbitmq-server", STATE / "rabbitmq" / "rabbitmq.pid")) if pidfile.exists()]


def stop_started(say: Callable[[str], None] = print) -> None:
    """Stop the servers step 3 started (nothing else)."""
    pidfile = STATE / "redis" / "redis.pid"
    if pidfile.exists():
        try:
            os.kill(int(pidfile.read_text().strip()), signal.SIGTERM)
            say("stopped the lab's redis-server")
        except (ProcessLookupError, ValueError):
            pass
        pidfile.unlink(missing_ok=True)
    if (STATE / "rabbitmq" / "rabbitmq.pid").exists() and (ctl := _rabbit_bin("rabbitmqctl")):
        subprocess.run([ctl, "-n", RABBIT_NODE, "stop"], env=_rabbit_env(), capture_output=True, timeout=60)
        (STATE / "rabbitmq" / "rabbitmq.pid").unlink(missing_ok=True)
        say("stopped the lab's rabbitmq-server")


def main() -> int:
    try:
        ensure()
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"broker {settings.mask_url(settings.broker_url())} and backend {settings.mask_url(settings.backend_url())} answer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
