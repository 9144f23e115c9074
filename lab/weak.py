"""Each FM as it stood before the hard variant of its failure: what ``--prove`` runs to show the hard fix is needed.

A weak variant is the FM's file with its hard fix taken out by exact edits
(``lab.variants.derive``), in a namespace of its own (``fm3w``, ...). The run
is scenario N on it; the check is the hard variant's symptom (``lab.checks``):

- fm3w: the drain finalises chord members only (``drain(..., chains=False)``):
  ``doc9``'s poison *fetch* is the chain's head, not the member, so its chord
  never completes;
- fm4w: the claim as FM-4 first had it: no resume for the owner's own
  redelivery, 400 busy-retries of 50 ms (20 s, against a 60 s claim TTL), no
  idempotency key: the owner killed before sending is turned away by its own claim;
- fm5w: no ``wait_in``: waiting retries are ETA messages the worker holds, and on
  the quorum queue they fill its static prefetch: a probe sent while the burst
  waits comes back only once the retries come due;
- fm6w: no ``Request=BackstopRequest``: the hang in C code outlives every signal,
  Celery's ``time_limit`` kills it and marks it FAILURE: ``ChordError``.
"""

from __future__ import annotations

from lab.fm import Fm
from lab.variants import derive

_RESUME_AND_BUDGET = (
    "    claim = NotifyClaim.of(app, pipeline_id, owner=self.request.id)  # FM-4: SET NX; the owner's redelivery resumes it\n"
    "    if (state := claim.acquire()) == \"busy\":  # FM-4: another notify is sending; it may still fail\n"
    "        raise self.retry(countdown=claim.policy.poll, max_retries=claim.policy.busy_retries)  # FM-4: outlast the claim's TTL\n",
    "    claim = NotifyClaim.of(app, pipeline_id, owner=self.request.id, policy=ClaimPolicy(resume=False))\n"
    "    if (state := claim.acquire()) == \"busy\":\n"
    "        raise self.retry(countdown=0.05, max_retries=400)\n",
)
_IMPORT = ("from shared.claim import NotifyClaim\n", "from shared.claim import ClaimPolicy, NotifyClaim\n")
_NO_KEY = ("send_email(pipeline_id, summary, idempotency_key=claim.key)  # FM-4: the mail API delivers a key once",
           "send_email(pipeline_id, summary)")

EDITS: dict[str, list[tuple[str, str]]] = {
    "fm3": [("    return drain(app, DLQ)\n", "    return drain(app, DLQ, chains=False)\n")],
    "fm4": [_IMPORT, _RESUME_AND_BUDGET, _NO_KEY],
    "fm5": [("RetryPolicy(max_retries=3, base=0.1), wait_in=QUEUE)", "RetryPolicy(max_retries=3, base=0.1))")],
    "fm6": [(", Request=BackstopRequest)", ")")],
}
"""The FMs that have a weak variant, and the edits that take the hard fix out."""


def has_weak(fm: str) -> bool:
    return fm in EDITS


def weak_name(fm: str) -> str:
    return f"{fm}w"


def weak(fm: str, base_module: str) -> Fm:
    """The weak variant of ``fm`` (module ``base_module``), written and loaded."""
    return derive(base_module, f"{weak_name(fm)}_{base_module.split('_', 1)[1]}", EDITS[fm])
