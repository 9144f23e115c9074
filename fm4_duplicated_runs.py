"""FM-4: a duplicated ``notify`` must not send a second email.

Symptom (fm3 on scenario 4): a second ``notify`` for the same pipeline arrives
while the first is sending (a redelivery after a lost ack, an operator who
re-fires the body). Both send: two emails.

Root cause: at-least-once delivery, which FM-2 and FM-3 chose on purpose.
Nothing in Celery deduplicates a task by business key.

Fix: a claim in Redis per pipeline id (``shared/claim.py``): ``SET NX`` with a
TTL marks it ``claimed``, the owner sends and marks it ``sent``. A concurrent
``notify`` finds it ``claimed`` and busy-retries (``Task.retry``, 50 ms) in
case the owner fails and releases; a later one finds ``sent`` and returns
``sent=False``. The scenario makes the overlap certain: the first ``notify``
waits at a gate after claiming, and the runner opens the gate only once the
duplicate has seen the claim.

Delta from fm3: ``notify`` goes through the claim (``claim=ClaimPolicy()``).

Tradeoffs: an owner that sends and dies before marking ``sent`` leaves a claim
that expires (60 s), and the next attempt sends again: at-most-twice in that
window, unless the mail provider also deduplicates on the pipeline id.
Busy-retries cost broker round trips while the owner works.

Still open: a transient error fails a document for good (FM-5).

Run it alone (two shells, services up):

    celery -A fm4_duplicated_runs worker -c 2 -Q rcl.fm4.tasks --without-gossip --without-mingle --without-heartbeat -B
    python fm4_duplicated_runs.py

or ``python run_all_fms.py --only fm4``.
"""

from fm3_dlq_reconciliation import RECIPE as FM3
from shared.claim import ClaimPolicy
from shared.harness import run_by_hand
from shared.recipe import build

RECIPE = FM3.extend(fm="fm4", module="fm4_duplicated_runs", scenario=4, claim=ClaimPolicy())
app, tasks = build(RECIPE)

if __name__ == "__main__":
    raise SystemExit(run_by_hand(RECIPE.fm))
