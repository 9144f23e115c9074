"""FM-7's hard variant: a member killed after its result is stored and before its chord counts it.

A deploy's SIGKILL at the grace's end (or its cold shutdown's cancel, or FM-9's connection-loss cancel) can land
in the window of every late-acked chord member between ``Backend.mark_as_done``'s store of SUCCESS and its call of
``on_chord_part_return``, which counts the member in the chord's join. The window is short (the count's encoding of
the result), so the run does not wait for a millisecond to hit it: the side chord ``stored``'s marked member
(``lab.faults.HOLD_AFTER_STORE``) is held there by the lab's result backend (``lab.backend``), which records
``stored_uncounted`` (the pool process's pid) in the side's stream and waits for the runner; ``KillAfterStore``
sees it, SIGKILLs that pool process (``killed_after_store``) and tells the backend it acted. The marked member is
then exactly where a SIGKILL in that window leaves it: SUCCESS stored, not counted, its message unacked.

What follows is Celery's: 5.5 and 5.6 requeue the message (reject on worker lost) and its redelivery is acked
without running by ``worker_deduplicate_successful_tasks``; 5.7 acks it at once ("succeeded before the worker was
lost"). Without ``count_stored_members`` (``lessons/fm7/before_hard_fix.py``) no one counts the member: the chord
waits for ever, in silence. With it, the member is counted once.
"""

from __future__ import annotations

import os
import signal

from lab.backend import HELD_ACTED
from lab.injector import Injector, RunView
from lab.workers import pid_alive

STORED = "stored"
"""The side chord's tag."""


class KillAfterStore(Injector):
    """SIGKILL the pool process of a member the backend holds between its store and its count (see above)."""

    def __init__(self) -> None:
        self.done: set[str] = set()

    def step(self, run: RunView) -> None:
        side = run.side(STORED)
        if side is None or not side.sent:
            return
        reader = side.reader
        for e in reader.events():
            doc = e.get("doc")
            if e.kind != "stored_uncounted" or doc in self.done:
                continue
            self.done.add(doc)
            pid = int(e.get("pid"))
            alive = pid_alive(pid)
            if alive:
                os.kill(pid, signal.SIGKILL)  # the grace's SIGKILL, landing after the store and before the count
            reader.rec.event("killed_after_store", doc=doc, task=e.get("task"), child=str(pid),
                             killed="yes" if alive else "no: gone already")
            reader.rec.put(f"{HELD_ACTED}:{doc}", "1")  # the held member, if alive, goes on
