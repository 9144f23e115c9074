"""What FM-5's lesson adds to the scenarios: a document that flakes twice, one that flakes for ever, and a burst.

The burst (the hard variant) is twice what the prefetch (``worker_concurrency`` 2 x
``worker_prefetch_multiplier`` 4) holds, throttled once each: once all of them wait to retry,
``BurstProbe`` sends a probe task and notes when it comes back (``Observations.burst_probe``). It goes last
but for the hung fetch of FM-6's lesson, so that its probe meets pool processes that the hangs no longer hold.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from celery.result import AsyncResult

from lab.faults import FLAKE_FOREVER, FLAKY, THROTTLED
from lab.injector import Injector, RunView
from lab.observe import BURST_PROBE
from lab.scenarios import Doc, Part

BURST: tuple[str, ...] = tuple(f"doc{n}" for n in range(12, 28))
"""The burst: the runner sends a probe task once all of them wait to retry."""


class BurstProbe(Injector):
    """A probe task sent once every document of the run's burst waits to retry."""

    def __init__(self) -> None:
        self.probe: AsyncResult[Any] | None = None
        self.sent = 0.0
        self.back: float | None = None

    def step(self, run: RunView) -> None:
        burst = tuple(d for d, f in run.faults.items() if f == THROTTLED)
        if not burst:
            return
        if self.probe is None and _waiting(run, burst):
            self.sent = time.time()
            self.probe = run.fm.probe.apply_async(task_id=f"{run.run_id}{BURST_PROBE}{uuid.uuid4()}")
            run.reader.rec.event("burst_probe_sent")
        elif self.probe is not None and self.back is None and self.probe.ready():
            self.back = time.time()
            run.reader.rec.event("burst_probe_back")  # a run before the hard fix may stop here

    def busy(self, run: RunView) -> bool:
        return self.probe is not None and self.back is None

    def observed(self) -> Mapping[str, object]:
        return {"burst_probe": (self.sent, self.back)} if self.probe is not None else {}


def _waiting(run: RunView, burst: tuple[str, ...]) -> bool:
    """Has every document of the burst planned its retry (so all of them wait now)?"""
    planned = {e.get("doc") for e in run.reader.events_of("retry")}
    return all(doc in planned for doc in burst)


PART = Part(
    docs=(Doc("doc5", FLAKY(2), "a flaky upstream: a transient error twice, then success"),
          Doc("doc6", FLAKE_FOREVER, "a dead upstream: a transient error on every attempt"),
          *(Doc(d, THROTTLED, "throttled once (a 429 with Retry-After), then fine: one of a burst", "burst") for d in BURST)),
    injectors={"burst probe": BurstProbe},
)
