"""FM-5: a transient error deserves another attempt, a bounded number of times.

Symptom (fm4 on scenario 5): ``doc5`` meets a 503 from a downstream service
twice and would have parsed on the third try; ``@enveloped`` records the first
error as terminal, so ``doc5`` fails after 1 attempt.

Root cause: every exception is terminal; nothing tells a transient error from
a permanent one.

Fix: ``@transient_retryable(RetryPolicy(...))`` (``shared/retry.py``) between
``@enveloped`` and the body: a ``TransientError`` is retried with Celery's
``Task.retry`` after ``0.1 * 2**k`` seconds times a jitter in ``[1, 2)``, at
most 3 times; then it raises ``RetriesExhausted`` and ``@enveloped`` records
reason ``retries_exhausted``. ``doc5`` succeeds on attempt 3; ``doc6`` (503
for ever) fails after 4 attempts; each planned delay falls in its doubling band
and no observed gap is shorter than its planned delay.

Delta from fm4: ``retry=RetryPolicy(...)`` on ``parse_document``.

Tradeoffs: the lab's base delay is 0.1 s to stay fast; production uses
seconds and a cap. A waiting retry holds no pool slot, but its countdown is
held in the worker's memory as an ETA task (Celery 5.7 logs that native delayed
delivery does not apply to the lab's direct exchange). Only errors you declare
transient are retried.

Still open: a hung call pins a worker slot for ever (FM-6).

Run it alone (two shells, services up):

    celery -A fm5_transient_failures worker -c 2 -Q rcl.fm5.tasks --without-gossip --without-mingle --without-heartbeat -B
    python fm5_transient_failures.py

or ``python run_all_fms.py --only fm5``.
"""

from fm4_duplicated_runs import RECIPE as FM4
from shared.harness import run_by_hand
from shared.recipe import build
from shared.retry import RetryPolicy

RECIPE = FM4.extend(
    fm="fm5",
    module="fm5_transient_failures",
    scenario=5,
    retry=RetryPolicy(max_retries=3, base=0.1, factor=2.0),
)
app, tasks = build(RECIPE)

if __name__ == "__main__":
    raise SystemExit(run_by_hand(RECIPE.fm))
