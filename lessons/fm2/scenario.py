"""What FM-2's lesson adds to the scenarios: a document whose worker process dies once."""

from __future__ import annotations

from lab.faults import CRASH_ONCE
from lab.scenarios import Doc, Part

PART = Part(docs=(Doc("doc3", CRASH_ONCE, "a crash: its own process SIGKILLed on the first attempt only"),))
