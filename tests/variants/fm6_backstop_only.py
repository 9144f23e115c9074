"""fm6 without ``@hard_timeout``: Celery's ``time_limit`` is the only deadline.

Used by tests/test_celery_claims.py to prove what fm6's docstring says: on a
hard time limit ``celery.worker.request.Request.on_timeout`` marks the member
FAILURE and the chord fails with ``ChordError``.
"""

from fm5_transient_failures import RECIPE as FM5
from shared.recipe import build

RECIPE = FM5.extend(
    fm="fm6t",
    module="tests.variants.fm6_backstop_only",
    scenario=6,
    parse_options={"soft_time_limit": 0.5, "time_limit": 1.5},
)
app, tasks = build(RECIPE)
