"""FM-1: a mid-pipeline error must not swallow the whole chord.

Symptom (fm0 on scenario 1): ``doc1`` raises, ``notify`` never runs and the
chord's result is a ``ChordError``; the document that parsed fine is never
reported, and nobody is told about the one that did not.

Root cause: a chord member in the FAILURE state. With the Redis backend,
``celery.backends.redis.RedisBackend.on_chord_part_return`` sees it when the
last member returns and hands the chord to
``celery.backends.base.Backend.chord_error_from_stack``: the body's errbacks
run, the body does not.

Fix: ``@enveloped`` (``shared/envelope.py``) around every task body. Every exit
becomes a SUCCESS state whose value is a ``Result`` with ``status`` FAILURE,
``error`` and ``reason``; ``notify`` aggregates ok and failed documents.
Celery's ``Retry`` (and ``Ignore``/``Reject``) pass through untouched.

Delta from fm0: ``enveloped=True``, nothing else.

Tradeoffs: Celery's own state no longer says FAILURE for a failed document
(Flower shows SUCCESS); dashboards must read the envelope's ``status`` and
``reason``. Errbacks on the header tasks no longer fire.

Still open: a worker that dies mid-task loses the message (FM-2).

Run it alone (two shells, services up):

    celery -A fm1_mid_pipeline_error worker -c 1 -Q rcl.fm1.tasks --without-gossip --without-mingle --without-heartbeat
    python fm1_mid_pipeline_error.py

or ``python run_all_fms.py --only fm1``.
"""

from fm0_naive import RECIPE as FM0
from shared.harness import run_by_hand
from shared.recipe import build

RECIPE = FM0.extend(fm="fm1", module="fm1_mid_pipeline_error", scenario=1, enveloped=True)
app, tasks = build(RECIPE)

if __name__ == "__main__":
    raise SystemExit(run_by_hand(RECIPE.fm))
