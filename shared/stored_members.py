"""A chord member whose result was stored but never counted is counted when its message comes back.

The window. With acks late, a chord member's success is two writes before its ack: the result backend
stores SUCCESS (``Backend.mark_as_done`` -> ``store_result``), then counts the member into the chord's
join (``on_chord_part_return``; the Redis backend's ``.j`` key). A process that dies between the two (a
deploy's SIGKILL, FM-9's connection-loss cancel, FM-7's cold-shutdown cancel) leaves the message unacked,
so the broker delivers it again. Its redelivery finds SUCCESS stored, and
``worker_deduplicate_successful_tasks`` (Celery 5.1+, ``celery.app.trace.build_tracer``) acks it without
running it, and without counting it: the chord waits for a member that will never report, in silence
(nothing fails, nothing is dead-lettered). Turning the deduplication off closes the window at the cost of
running the member's work a second time.

``count_stored_members(app)`` keeps the deduplication and closes the window, in the worker's main process,
on the two ways a stored-but-uncounted member shows itself there:

- the member's pool process is lost (``WorkerLostError``: a SIGKILL, a cancel). Celery 5.7.0
  (``Request.on_failure``, ``_success_was_stored``) then finds SUCCESS stored, logs "succeeded before the
  worker was lost" and acks the message, taking the member for counted; 5.5 and 5.6 requeue it (reject
  on worker lost). Before either, the stored result is counted;
- a redelivered message of a chord member arrives (Celery's ``task_received`` signal, before the pool
  runs anything: the whole worker was killed, or the connection was lost and RabbitMQ requeued it). If
  the member's stored state is SUCCESS, the stored result is counted before the deduplication acks it.

Counting is idempotent, so a member that was counted before it died is not counted twice:

- Celery 5.7 (``CHORD_PART_RETURN_LUA``) keeps a set of the members it counted, by task id and header
  index, and ignores a second report;
- Celery 5.5 and 5.6 add the encoded ``[1, task id, state, result]`` to a sorted set
  (``RedisBackend.on_chord_part_return``, ``result_chord_ordered``, on by default); the stored result
  decodes and encodes again to the same JSON, so the member is the one already there. A member found
  there is not reported again at all: 5.5 and 5.6 send the body whenever the count equals the chord's
  size, so a second report landing between the last member's count and the deletion of the join's keys
  would send it twice (a run showed it).

A member that was the last to count and died before it sent the body has the body sent now (5.5 and 5.6:
the count reaches the chord's size again; 5.7: once the dead process's claim on the dispatch expires, at
least ``result_chord_join_timeout`` x 2 s after it was taken, the count is no longer ``claimed``: see
"Limits"). A body sent twice runs twice: its own idempotency (FM-4's claim) is what makes that safe.

Costs: one read of the task's stored meta per redelivered chord member and per chord member whose process
was lost, in the worker's main process, over the result backend's own client (its socket timeouts and retry
policy), and on 5.5 and 5.6 one look at the chord's join; a member that ends normally costs nothing.

Limits:
- Only the Redis result backend's join is covered (the lab's); another backend's ``on_chord_part_return``
  is called as it is, idempotent or not.
- Only SUCCESS is counted this way: a stored failure is already in the member's envelope (FM-1), and a
  member stored FAILURE by Celery is what FM-1 removes.
- A member that dies between its store and its count must come back: a broker that dead-letters its
  message instead (the delivery limit, FM-3) hands it to the DLQ drain, which finalises what it finds.
- Celery 5.7: a re-count that finds the dispatch claimed by the dead process does not send the body (the
  claim lives ``max(5, 2 x result_chord_join_timeout)`` s); the lab has not shown that case by a run.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from celery import Celery
from celery.app.task import Context
from celery.signals import task_received
from celery.states import SUCCESS
from billiard.exceptions import WorkerLostError

log = logging.getLogger(__name__)


def _already_joined(backend: Any, group_id: str, task_id: str, result: Any) -> bool:
    """Whether the member is in its chord's join already. Celery 5.7's join script ignores a second report itself
    (``_chord_part_return_script``): no look is needed. 5.5 and 5.6 add the encoded result to the join's sorted set
    (a list when ``result_chord_ordered`` is off) and send the body whenever the count equals the chord's size: a
    second report of a counted member, landing between the last member's count and the deletion of the join's keys,
    would send the body a second time (seen in ``tests/test_stored_members.py`` on 5.5.3), so it is not made."""
    if hasattr(backend, "_chord_part_return_script") or not hasattr(backend, "get_key_for_group"):
        return False
    jkey = backend.get_key_for_group(group_id, ".j")
    encoded = backend.encode([1, task_id, SUCCESS, backend.encode_result(result, SUCCESS)])
    if getattr(backend, "_chord_zset", True):
        return backend.client.zscore(jkey, encoded) is not None
    return backend.client.lpos(jkey, encoded) is not None


def count_stored(app: Celery, request: Any) -> bool:
    """Count ``request``'s stored SUCCESS into its chord, if it is a chord member whose result is stored SUCCESS."""
    chord_body, group_id = request.chord, request.group
    if not chord_body or not group_id:
        return False  # not a chord member
    backend = cast(Any, app.backend)
    try:
        meta = cast(dict[str, Any], backend.get_task_meta(request.id, cache=False))
        if meta.get("status") != SUCCESS:
            return False  # not stored, or stored as something else: the member runs again, or its failure stands
        if _already_joined(backend, group_id, request.id, meta.get("result")):
            return False  # counted before its process died: counting again could send the body twice (5.5, 5.6)
        context = Context({**cast(dict[str, Any], request.request_dict), "chord": chord_body,
                           "group": group_id, "group_index": request.group_index})
        backend.on_chord_part_return(context, SUCCESS, meta.get("result"))
    except Exception as exc:  # the backend does not answer: Celery goes on as it would without this
        log.warning("lab: stored member %s not counted again: %r", request.id, exc)
        return False
    log.info("counted the stored result of chord member %s (group %s)", request.id, group_id)
    return True


def count_stored_members(app: Celery) -> None:
    """Count a chord member whose result is stored SUCCESS when its process is lost or its message comes back."""

    def on_received(sender: Any = None, request: Any = None, **_: Any) -> None:
        if request is None or request.app is not app or not request.chord:
            return
        if cast(dict[str, Any], request.delivery_info or {}).get("redelivered"):
            count_stored(app, request)
        on_failure = request.on_failure

        def counted_on_failure(exc_info: Any, *args: Any, **kwargs: Any) -> Any:
            exc = getattr(exc_info, "exception", None)
            exc = getattr(exc, "exc", exc)  # billiard's ExceptionWithTraceback wraps it (Request.on_failure unwraps too)
            if isinstance(exc, WorkerLostError):
                count_stored(app, request)
            return on_failure(exc_info, *args, **kwargs)

        request.on_failure = counted_on_failure  # this request's own: Celery's pool calls it on a lost process

    task_received.connect(on_received, weak=False, dispatch_uid=f"count_stored_members:{id(app)}")
