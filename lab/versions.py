"""The versions the lab runs on: Celery's and its stack's, as installed.

``CELERY`` is the running Celery's ``(major, minor)``. The lab's code needs no
version branch to run on 5.5, 5.6 and 5.7 (``make matrix`` runs it on each); the
few places where a version changes the fix itself test ``CELERY`` and say why
there (``case_studies/severity_batch/fixed.py``), and ``tests/test_celery_claims.py``
checks the behaviour its docstring states for the running version.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import celery

CELERY: tuple[int, int] = (int(celery.VERSION[0]), int(celery.VERSION[1]))
"""The running Celery's major and minor version, e.g. ``(5, 7)``."""

STACK = ("celery", "kombu", "redis", "billiard", "amqp")
"""The packages whose versions decide what the lab's claims rest on."""


def installed() -> dict[str, str]:
    """The installed version of each package of ``STACK`` (``"-"`` when missing)."""
    found: dict[str, str] = {}
    for name in STACK:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "-"
    return found
