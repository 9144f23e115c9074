"""The app's result-backend Redis, for primitives that keep state beside the results.

``backend_redis(app)`` gives one client per process and URL (prefork children get
their own after the fork) and the backend's ``global_keyprefix`` (Celery's
option for the Redis backend's keys), so that a claim or a counter lives, and is
cleaned up, beside the app's results.
"""

from __future__ import annotations

import os
from typing import Any, cast

import redis
from celery import Celery

_clients: dict[tuple[int, str], redis.Redis] = {}


def backend_redis(app: Celery) -> tuple[redis.Redis, str]:
    """``(client, key prefix)`` of ``app``'s Redis result backend."""
    url = str(app.conf.result_backend)
    key = (os.getpid(), url)
    if key not in _clients:
        _clients[key] = cast(Any, redis.Redis).from_url(url, decode_responses=True)
    options = cast(dict[str, Any], app.conf.result_backend_transport_options or {})
    return _clients[key], str(options.get("global_keyprefix") or "")
