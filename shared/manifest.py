"""A pipeline's manifest: the documents its chord was sent for, written once beside its results.

Why not pass them to the body (``notify.s(doc_ids, pipeline_id)``): Celery sends the chord
body's signature inside every header task's message (``celery.canvas._chord.run`` freezes the
header with ``chord=body``, ``group._freeze_group_tasks``), so a list of every document in the
body's arguments makes each of N messages carry N ids, and the chord's bytes grow as N squared.
Measured on fm1's first member (body and headers, Celery 5.7.0): 1,092, 21,818 and 65,818 bytes
at 10, 1,000 and 3,000 documents with the ids in ``notify``'s signature; 920, 926 and 926 bytes
with the manifest (claim C14 in ``tests/test_celery_claims.py`` proves it on every version of
``make matrix``). Here the submitter writes the ids once, under the pipeline id, and the body
reads them, in header order: result ``i`` is document ``i`` (``result_chord_ordered``).

``write_manifest(app, pipeline_id, doc_ids)`` before the chord is sent; ``read_manifest(app,
pipeline_id)`` in the body. The manifest sits in the app's result-backend Redis under its key
prefix (``shared.backend``), so it is cleaned up with the app's results, and it lives as long
as they do (``result_expires``: one day by default, ``celery/app/defaults.py`` of Celery 5.5.3 to 5.7.0).

Limits: a body that runs after the manifest expired (or on a backend that lost it) cannot name
its documents: ``read_manifest`` raises ``ManifestMissing``, which ``@enveloped`` turns into the
body's FAILURE envelope (an error that says so, not a wrong summary). A second ``submit`` with the
same pipeline id replaces the manifest.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import cast

import redis
from celery import Celery

from shared.backend import backend_redis

DEFAULT_TTL_SECONDS = 86_400
"""Celery's default ``result_expires`` (one day), used when the app sets none."""


class ManifestMissing(Exception):
    """The body's pipeline has no manifest (never written, or expired with the results)."""


def _where(app: Celery, pipeline_id: str) -> tuple[redis.Redis, str]:
    r, prefix = backend_redis(app)
    return r, f"{prefix}manifest:{pipeline_id}"


def _ttl(app: Celery) -> int:
    expires = cast(object, app.conf.result_expires)
    if isinstance(expires, timedelta):
        return max(1, int(expires.total_seconds()))
    if isinstance(expires, (int, float)) and expires > 0:
        return int(expires)
    return DEFAULT_TTL_SECONDS


def write_manifest(app: Celery, pipeline_id: str, doc_ids: list[str]) -> None:
    """Keep ``doc_ids`` (in header order) under ``pipeline_id`` for as long as the app keeps results."""
    r, key = _where(app, pipeline_id)
    r.set(key, json.dumps(doc_ids), ex=_ttl(app))


def read_manifest(app: Celery, pipeline_id: str) -> list[str]:
    """The documents the chord of ``pipeline_id`` was sent for, in header order."""
    r, key = _where(app, pipeline_id)
    raw = cast(str | None, r.get(key))
    if raw is None:
        raise ManifestMissing(f"no manifest for pipeline {pipeline_id!r}: never written, or expired with its results")
    return [str(d) for d in cast(list[object], json.loads(raw))]
