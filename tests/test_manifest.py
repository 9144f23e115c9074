"""shared/manifest.py on the real result-backend Redis: the ids in header order, kept as long as the
results, and a body whose manifest is gone told so (the size claim is C14 in test_celery_claims.py)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from lab import harness
from shared.backend import backend_redis
from shared.manifest import DEFAULT_TTL_SECONDS, ManifestMissing, read_manifest, write_manifest

pytestmark = pytest.mark.usefixtures("real_services")


def test_the_manifest_keeps_the_ids_in_order_as_long_as_the_results() -> None:
    fm = harness.load("fm1")
    ids = [f"pipe/doc{i}" for i in (3, 1, 2)]
    write_manifest(fm.app, "pipe", ids)
    try:
        assert read_manifest(fm.app, "pipe") == ids
        r, prefix = backend_redis(fm.app)
        expires: Any = fm.app.conf.result_expires  # the lab's apps: 3600 s
        wanted = int(expires.total_seconds()) if isinstance(expires, timedelta) else int(expires or DEFAULT_TTL_SECONDS)
        assert wanted == 3600
        assert wanted - 5 <= r.ttl(f"{prefix}manifest:pipe") <= wanted
    finally:
        harness.reset(fm)


def test_a_body_whose_manifest_is_gone_is_told_so() -> None:
    fm = harness.load("fm1")
    with pytest.raises(ManifestMissing, match="no manifest for pipeline 'gone'"):
        read_manifest(fm.app, "gone")
