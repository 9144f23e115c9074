"""FM-6: a hung task must end inside its body, so the chord still completes.

Symptom (fm5 on scenario 6): ``doc8`` hangs and ignores every polite request.
Its pool slot is pinned for as long as it hangs; ``notify`` never runs.

Root cause: no deadline inside the body. Celery's own ``time_limit`` alone is
not enough: on expiry the worker kills the pool process, and
``celery.worker.request.Request.on_timeout`` (hard branch) calls
``backend.mark_as_failure`` with ``TimeLimitExceeded``. That puts the chord
member in the FAILURE state, so the chord fails with ``ChordError`` (FM-1's
symptom again) and ``notify`` does not run (``tests/test_celery_claims.py``
runs exactly that: this recipe without ``@hard_timeout``).

Fix: ``@hard_timeout(1.2)`` (``shared/timeouts.py``, ``SIGALRM`` through
``setitimer``) raises ``HardTimeout`` inside the body, which ``@enveloped``
records as reason ``hard_timeout``. ``soft_time_limit=0.5`` asks first:
``SoftTimeLimitExceeded`` stops ``doc7``, which cooperates, and is recorded as
``soft_timeout``. ``time_limit=5`` stays as the backstop for what a signal
cannot interrupt (C code that never returns to the interpreter). Scenario 6 has
no such code, so G6 holds without the backstop (tried); removing
``@hard_timeout`` or ``soft_time_limit`` fails G6.

Delta from fm5: ``hard_timeout=1.2`` and the two time limits on ``parse_document``.

Tradeoffs: a limit sized for the slowest legitimate document; ``SIGALRM`` is
process-wide and main-thread only (prefork, not threads or gevent); a
timed-out document is not retried.

Run it alone (two shells, services up):

    celery -A fm6_task_timeouts worker -c 2 -Q rcl.fm6.tasks --without-gossip --without-mingle --without-heartbeat -B
    python fm6_task_timeouts.py

or ``python run_all_fms.py --only fm6``.
"""

from fm5_transient_failures import RECIPE as FM5
from shared.harness import run_by_hand
from shared.recipe import build

RECIPE = FM5.extend(
    fm="fm6",
    module="fm6_task_timeouts",
    scenario=6,
    hard_timeout=1.2,  # our deadline, raised inside the body
    parse_options={
        "soft_time_limit": 0.5,  # the polite request first
        "time_limit": 5,  # Celery's backstop: kills the process, fails the chord member
    },
)
app, tasks = build(RECIPE)

if __name__ == "__main__":
    raise SystemExit(run_by_hand(RECIPE.fm))
