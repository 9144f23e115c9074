"""FM-2: a worker process that dies mid-task must not lose the message.

Symptom (fm1 on scenario 2): ``doc3``'s pool process is SIGKILLed on its first
attempt (an OOM kill, a node drained). ``doc3`` is attempted once, never again;
the chord result is ``ChordError`` naming ``WorkerLostError``; ``notify`` never runs.

Root cause: early acknowledgement. By default the worker acks a message when it
receives it, so RabbitMQ has already forgotten it when the process dies. The
main process then reports ``WorkerLostError`` and, in Celery 5.7's
``celery.worker.request.Request.on_failure``, stores it with
``backend.mark_as_failure``, which also tells the chord (``on_chord_part_return``).

Fix: ``task_acks_late=True`` (ack after the task returns) plus
``task_reject_on_worker_lost=True``. In ``Request.on_failure``, a
``WorkerLostError`` of an ``acks_late`` task with ``reject_on_worker_lost`` is
rejected with ``requeue=True`` and *not* marked failed: RabbitMQ delivers it
again, ``doc3`` succeeds on attempt 2, the chord completes. Without
``reject_on_worker_lost``, ``acks_late`` alone acks the lost message
(``acks_on_failure``) and marks it failed: the chord still breaks (tried:
removing either setting fails G2 with ``doc3 attempts 1``).

From here on the lab runs two pool processes (``-c 2``). This fix does not need
them: with ``-c 1`` the replacement process takes the requeued message and G2
still holds. FM-4 does: its two overlapping ``notify`` calls need two slots.

Delta from fm1: those two settings and ``-c 2``.

Tradeoffs: at-least-once. A task can now run twice (its side effects too),
so it must be idempotent (FM-4 deals with ``notify``). A message that kills
its worker every time is redelivered for ever (FM-3).

Run it alone (two shells, services up):

    celery -A fm2_worker_crash worker -c 2 -Q rcl.fm2.tasks --without-gossip --without-mingle --without-heartbeat
    python fm2_worker_crash.py

or ``python run_all_fms.py --only fm2``.
"""

from fm1_mid_pipeline_error import RECIPE as FM1
from shared.harness import run_by_hand
from shared.recipe import build

RECIPE = FM1.extend(
    fm="fm2",
    module="fm2_worker_crash",
    scenario=2,
    concurrency=2,
    conf={
        "task_acks_late": True,  # ack after the body returns, not on receipt
        "task_reject_on_worker_lost": True,  # a lost worker requeues the message instead of failing it
    },
)
app, tasks = build(RECIPE)

if __name__ == "__main__":
    raise SystemExit(run_by_hand(RECIPE.fm))
