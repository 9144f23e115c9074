"""FM-3: a poison message must stop somewhere, and the chord must still complete.

Symptom (fm2 on scenario 3): ``doc4`` SIGKILLs its process on every attempt.
With FM-2's fix it is requeued every time: attempts climb past any bound, a
pool slot is burnt on it for ever and ``notify`` never runs.

Root cause: FM-2 has no bound on redelivery, and Celery has none for a lost
worker (``request.retries`` does not count redeliveries).

Fix (``shared/dlq.py``):

- the task queue becomes a RabbitMQ quorum queue with ``x-delivery-limit: 2``
  and a dead-letter exchange; RabbitMQ 3.x delivers ``doc4`` 3 times (limit + 1)
  and then dead-letters it to ``rcl.fm3.dlq`` instead of delivering it again.
  (RabbitMQ 4.0 gives every quorum queue a limit of 20 unless one is set, and
  later 4.x releases changed which returns count; ``shared/dlq.py`` says more.)
- nobody consumes the DLQ as a task queue. A beat task, ``drain_dead_letters``,
  reads it every 0.25 s and, for a chord member, writes a SUCCESS-state
  ``Result`` with reason ``dead_lettered`` through ``backend.mark_as_done`` with
  a request rebuilt from the message headers; ``Backend.mark_as_done`` calls
  ``on_chord_part_return``, the member counts, and ``notify`` fires.

Delta from fm2: the quorum queue arguments, the dead-letter path and the beat
drain (worker flag ``-B``).

Tradeoffs: a dead-lettered document is reported failed, not retried; an
operator must look at why. The drain runs every 0.25 s here (seconds or
minutes in production), which is how long a chord waits after the last
delivery. Quorum queues have no global QoS and, in Celery 5.7, pull in the
``DelayedDelivery`` bootstep; the lab's apps run without it (see
``shared/dlq.py``) so that nothing outside ``rcl.fm3.*`` is declared.

Still open: a duplicated ``notify`` sends two emails (FM-4).

Run it alone (two shells, services up):

    celery -A fm3_dlq_reconciliation worker -c 2 -Q rcl.fm3.tasks --without-gossip --without-mingle --without-heartbeat -B
    python fm3_dlq_reconciliation.py

or ``python run_all_fms.py --only fm3``.
"""

from fm2_worker_crash import RECIPE as FM2
from shared.dlq import DeadLetterPolicy
from shared.harness import run_by_hand
from shared.recipe import build

RECIPE = FM2.extend(
    fm="fm3",
    module="fm3_dlq_reconciliation",
    scenario=3,
    dead_letter=DeadLetterPolicy(delivery_limit=2, drain_every=0.25),
)
app, tasks = build(RECIPE)

if __name__ == "__main__":
    raise SystemExit(run_by_hand(RECIPE.fm))
