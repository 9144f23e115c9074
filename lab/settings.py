"""Where the broker and backend are, and the lab's namespace.

Knobs (environment variables):

- ``CELERY_BROKER_URL``: AMQP URL of RabbitMQ (default ``amqp://guest:guest@127.0.0.1:5672//``).
- ``CELERY_RESULT_BACKEND``: Redis URL (default ``redis://127.0.0.1:6379/0``).
- ``RCL_OBSERVATIONS_URL``: the Redis where the lab's observer writes what a run does
  (default: ``CELERY_RESULT_BACKEND``'s). A lesson that stops the result backend stops, a Redis the
  lab owns; the harness then points the backend there and keeps the observations on the
  shared Redis, so that the run can still be read while its backend is gone.
- ``RCL_NAMESPACE``: the prefix of every name the lab owns (default ``rcl`` when the
  variable is not set); two people sharing one development broker, or two runs of
  the lab at once, give themselves different namespaces. A value that breaks
  ``NAMESPACE_RULES`` (an empty one too) stops the lab with exit status 2.

Every queue, exchange and Redis key the lab creates starts with the namespace,
then the FM's short name (with the default ``rcl``: ``rcl.<short>.tasks`` on the broker, ``rcl:<short>:...`` in
Redis). The lab only ever deletes names under that prefix.
"""

from __future__ import annotations

import os
import re
import sys
from urllib.parse import urlsplit, urlunsplit

DEFAULT_BROKER_URL = "amqp://guest:guest@127.0.0.1:5672//"
DEFAULT_BACKEND_URL = "redis://127.0.0.1:6379/0"
NAMESPACE_RULES = ("it starts with a lowercase letter", "then only lowercase letters, digits and '-'",
                   "1 to 31 characters in all")


def namespace_problem(value: str) -> str | None:
    """Why ``value`` cannot be a namespace (every rule, stated), or None when it can."""
    if re.fullmatch(r"[a-z][a-z0-9-]{0,30}", value):
        return None
    return f"RCL_NAMESPACE={value!r} is not a namespace: {'; '.join(NAMESPACE_RULES)}"


NAMESPACE = os.environ.get("RCL_NAMESPACE", "rcl")
if (_problem := namespace_problem(NAMESPACE)) is not None:
    print(f"error: {_problem}", file=sys.stderr)
    raise SystemExit(2)


def broker_url() -> str:
    return os.environ.get("CELERY_BROKER_URL") or DEFAULT_BROKER_URL


def backend_url() -> str:
    return os.environ.get("CELERY_RESULT_BACKEND") or DEFAULT_BACKEND_URL


def observations_url() -> str:
    """Where the observer writes (``lab.observe``): ``RCL_OBSERVATIONS_URL``, else the result backend's Redis."""
    return os.environ.get("RCL_OBSERVATIONS_URL") or backend_url()


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
    """A queue or exchange name inside the lab's namespace: ``rcl.<short>.tasks``."""
    return f"{NAMESPACE}.{fm}.{suffix}"


def redis_prefix(fm: str) -> str:
    """The Redis key prefix of one FM: ``rcl:<short>:``; reset deletes only these keys."""
    return f"{NAMESPACE}:{fm}:"
