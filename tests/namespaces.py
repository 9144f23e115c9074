"""The test session's namespaces: one of its own, and those its tests derive from it.

- ``session_namespace(environ)``: ``RCL_TEST_NAMESPACE`` when set; else ``<RCL_NAMESPACE>-t`` (the
  user's own namespace, marked as the tests'), so that two people sharing a broker who each export
  ``RCL_NAMESPACE`` never share a test namespace either; else ``rcltest``. ``conftest.py`` sets
  ``RCL_NAMESPACE`` to it before any lab module reads the variable.
- ``derived(suffix)``: a namespace for one test's own use (a lab run in a subprocess, a ledger
  beside the session's), ``<session>-<suffix>``; recorded, so that the session's end deletes what
  is under it too and checks that nothing is left (``tests/leftovers.py``).

Every name keeps the 31-character rule (``lab.settings.namespace_problem``): a base too long for
its suffix is cut, and a few hex digits of its full name's hash keep two long bases apart.
This module reads nothing at import and imports no lab module (``conftest.py`` needs it first).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping

LIMIT = 31
DEFAULT = "rcltest"

_derived: list[str] = []


def fit(base: str, suffix: str) -> str:
    """``<base>-<suffix>``, within ``LIMIT`` characters."""
    name = f"{base}-{suffix}"
    if len(name) <= LIMIT:
        return name
    digest = hashlib.sha256(base.encode()).hexdigest()[:4]
    keep = LIMIT - len(suffix) - len(digest) - 2  # two '-'
    if keep < 1:
        raise ValueError(f"suffix {suffix!r} leaves no room for a namespace in {LIMIT} characters")
    return f"{base[:keep].rstrip('-')}-{digest}-{suffix}"


def session_namespace(environ: Mapping[str, str]) -> str:
    if explicit := environ.get("RCL_TEST_NAMESPACE"):
        return explicit
    if user := environ.get("RCL_NAMESPACE"):
        return fit(user, "t")
    return DEFAULT


def session() -> str:
    """The session's namespace (set by ``conftest.py`` into ``RCL_NAMESPACE``)."""
    return os.environ["RCL_NAMESPACE"]


def derived(suffix: str) -> str:
    """A namespace of the session's own for one use, recorded for the cleaning at the session's end."""
    name = fit(session(), suffix)
    if name not in _derived:
        _derived.append(name)
    return name


def every() -> list[str]:
    """The session's namespace and every one derived from it so far."""
    return [session(), *_derived]
