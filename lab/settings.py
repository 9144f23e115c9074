"""Where the broker and backend are, and the lab's namespace.

Knobs (environment variables):

- ``CELERY_BROKER_URL``: AMQP URL of RabbitMQ (default ``amqp://guest:guest@127.0.0.1:5672//``).
- ``CELERY_RESULT_BACKEND``: Redis URL (default ``redis://127.0.0.1:6379/0``).
- ``RCL_NAMESPACE``: the prefix of every name the lab owns (default ``rcl``); two
  people sharing one development broker give themselves different namespaces.

Every queue, exchange and Redis key the lab creates starts with the namespace,
then the FM's short name: ``rcl.fm3.tasks`` on the broker, ``rcl:fm3:...`` in
Redis. The lab only ever deletes names under that prefix.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit, urlunsplit

DEFAULT_BROKER_URL = "amqp://guest:guest@127.0.0.1:5672//"
DEFAULT_BACKEND_URL = "redis://127.0.0.1:6379/0"
NAMESPACE = os.environ.get("RCL_NAMESPACE") or "rcl"
if not re.fullmatch(r"[a-z][a-z0-9-]{0,30}", NAMESPACE):
    raise SystemExit(f"RCL_NAMESPACE must be lowercase letters, digits and '-', got {NAMESPACE!r}")


def broker_url() -> str:
    return os.environ.get("CELERY_BROKER_URL") or DEFAULT_BROKER_URL


def backend_url() -> str:
    return os.environ.get("CELERY_RESULT_BACKEND") or DEFAULT_BACKEND_URL


def broker_is_default() -> bool:
    return not os.environ.get("CELERY_BROKER_URL")


def backend_is_default() -> bool:
    return not os.environ.get("CELERY_RESULT_BACKEND")


def mask_url(url: str) -> str:
    """The URL with its password replaced by ``***`` (for anything printed)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:  # an IPv6 literal goes back into brackets
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port is not None else ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}{port}"))


def amqp_name(fm: str, suffix: str) -> str:
    """A queue or exchange name inside the lab's namespace: ``rcl.fm3.tasks``."""
    return f"{NAMESPACE}.{fm}.{suffix}"


def redis_prefix(fm: str) -> str:
    """The Redis key prefix of one FM: ``rcl:fm3:``; reset deletes only these keys."""
    return f"{NAMESPACE}:{fm}:"
