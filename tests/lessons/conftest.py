"""The lesson tests' one fixture: the session's lab runs (``tests.lessons.runs.LabRuns``), on the real services."""

from __future__ import annotations

import pytest

from tests.lessons.runs import LabRuns


@pytest.fixture(scope="session")
def lab(real_services: None) -> LabRuns:
    return LabRuns()
