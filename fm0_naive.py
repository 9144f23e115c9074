"""FM-0: the naive pipeline, FM-1's bug on display.

One line: a chord whose header task raises never runs its body.

Symptom: scenario 1 makes ``doc1`` raise. The chord's body, ``notify``, never
runs: no email, and the chord's result is a FAILURE holding ``ChordError``
("Dependency ... raised PermanentError('doc1 is malformed')"). It does not
hang: the Redis backend fails the chord as soon as the last member returns.

Root cause: ``celery.backends.redis.RedisBackend.on_chord_part_return`` counts
the members; once all have returned it decodes their states and a FAILURE one
makes it call ``chord_error_from_stack`` (``celery.backends.base``), which
runs the body's errbacks and stores the body as FAILURE instead of calling it.

Fix: none here. FM-1 (``fm1_mid_pipeline_error.py``) adds ``@enveloped``.

Run it alone (two shells, services up):

    celery -A fm0_naive worker -c 1 -Q rcl.fm0.tasks --without-gossip --without-mingle --without-heartbeat
    python fm0_naive.py

or ``python run_all_fms.py --include-fm0 --only fm0`` (reported as BUG REPRODUCED).
"""

from shared.harness import run_by_hand
from shared.recipe import Recipe, build

RECIPE = Recipe(fm="fm0", module="fm0_naive", scenario=1, enveloped=False)
app, tasks = build(RECIPE)

if __name__ == "__main__":
    raise SystemExit(run_by_hand(RECIPE.fm))
