"""The lab's result backend: Celery's ``RedisBackend`` with one hook, for faults outside the body.

``lab_app`` makes the ``redis://`` scheme resolve to ``LabRedisBackend`` (``loader.override_backends``,
read by ``celery.app.backends.by_name``, Celery 5.5 to 5.7), so the URL, the keys and every behaviour of
the Redis backend stay Celery's own. The one addition: before it stores the SUCCESS result of a
``parse_document`` whose document carries ``LATE_FINISH`` or ``STALL_PAST_LIMIT``, the store stalls
once (``lab.faults.STORE_STALLS``), in the pool process, inside ``celery.app.trace``'s call of
``backend.mark_as_done``: the body has returned and its deadline is cancelled, the result is not yet
stored. That is where a slow Redis (a large result, a fork for a snapshot, a network hiccup) keeps a
task, and where a Celery time limit that fires lands outside the body (a time limits' lesson's first hard variant).
Every other store goes straight to Celery's code.

And one after the store: the SUCCESS of a ``parse_document`` whose document carries ``HOLD_AFTER_STORE``
is held once where ``Backend.mark_as_done`` has stored it and is about to count the member in its chord
(``on_chord_part_return``): the backend records ``stored_uncounted`` (with the pool process's pid) and
waits until the run's key ``<HELD_ACTED>:<doc>`` says an injector acted on it (killed the process, cut
its connection), at most ``HOLD_SECONDS``; then it counts as Celery does. The window it opens is the one a
kill meets between a member's store and its count, made as long as the injector needs, never guessed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, cast

from celery import states
from celery.backends.redis import RedisBackend

from lab.faults import STORE_STALLS, fault_in
from lab.observe import RunRecorder, doc_in
from lab.waiting import wait_until
from shared.envelope import is_envelope


HELD_ACTED = "acted-after-store"
"""The run key (``<HELD_ACTED>:<doc>``) an injector sets once it acted on a member held after its store."""
HOLD_SECONDS = 30.0
"""The most a held member waits for its injector (by hand, with none, it then counts)."""


def release_held(rec: RunRecorder, doc: str) -> None:
    """An injector acted on ``doc``'s member held after its store: if its process lives on, it goes on to its count."""
    rec.put(f"{HELD_ACTED}:{doc}", "1")


def held_ended(rec: RunRecorder, doc: str, pid: int) -> None:
    """The process that held ``doc``'s member after its store is gone (cancelled, SIGKILLed): recorded
    (``ended_after_store``) and the hold released."""
    rec.event("ended_after_store", doc=doc, child=str(pid))
    release_held(rec, doc)


LOGGER = logging.getLogger("lab.worker")  # the lab's lines in the worker window (lab.worker_log)


class LabRedisBackend(RedisBackend):
    """Celery's Redis backend; a scenario's fault may stall one store (see the module docstring)."""

    def store_result(self, task_id: str, result: Any, state: str, traceback: Any = None, request: Any = None,
                     **kwargs: Any) -> Any:
        if state == states.SUCCESS and str(getattr(request, "task", "") or "").endswith(".parse_document"):
            _stall_once(task_id, result)
        return super().store_result(task_id, result, state, traceback, request, **kwargs)

    def on_chord_part_return(self, request: Any, state: Any, result: Any, propagate: Any = None, **kwargs: Any) -> Any:
        if state == states.SUCCESS and str(getattr(request, "task", "") or "").endswith(".parse_document"):
            _hold_once(str(getattr(request, "id", "")), result)
        return super().on_chord_part_return(request, state, result, propagate, **kwargs)


def _stall_once(task_id: str, result: object) -> None:
    payload = cast(Mapping[str, object], result).get("payload") if is_envelope(result) else None
    found = doc_in([cast(object, payload)]) if isinstance(payload, Mapping) else None
    if found is None:
        return
    run = RunRecorder(found[0])
    fault = fault_in(run.get(f"doc:{found[1]}") or "")
    seconds = STORE_STALLS.get(fault.kind) if fault is not None else None
    if seconds is not None and run.claim_once(f"store-stalled:{found[1]}", task_id):
        run.event("store_stall", task=task_id, doc=found[1], seconds=seconds)
        LOGGER.info("lab: %s's body returned; its result store stalls %.1fs (scenario fault %s), as a slow Redis would: "
                    "no in-body deadline is left to fire, Celery's time_limit (3 s from the start) still may", found[1],
                    seconds, fault.kind if fault is not None else "?")
        time.sleep(seconds)  # the fault: a store that takes this long (a Celery limit may end it sooner)


def _hold_once(task_id: str, result: object) -> None:
    payload = cast(Mapping[str, object], result).get("payload") if is_envelope(result) else None
    found = doc_in([cast(object, payload)]) if isinstance(payload, Mapping) else None
    if found is None:
        return
    run = RunRecorder(found[0])
    fault = fault_in(run.get(f"doc:{found[1]}") or "")
    if fault is None or fault.kind != "HOLD_AFTER_STORE" or not run.claim_once(f"held-after-store:{found[1]}", task_id):
        return
    run.event("stored_uncounted", task=task_id, doc=found[1])
    LOGGER.info("lab: %s's result is stored and not yet counted in its chord: held until the run acts on it "
                "(scenario fault HOLD_AFTER_STORE)", found[1])
    acted = wait_until(lambda: run.get(f"{HELD_ACTED}:{found[1]}") is not None, HOLD_SECONDS)
    # only a member still alive gets here: one killed or cancelled in the hold records nothing more
    run.event("hold_over", task=task_id, doc=found[1], why="acted" if acted else f"{HOLD_SECONDS:g}s passed")
