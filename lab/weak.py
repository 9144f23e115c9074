"""Each FM as it stood before the hard variant of its failure: what ``--prove`` runs to show the hard fix is needed.

A weak variant is the FM's file with its hard fixes taken out by exact edits
(``lab.variants.derive``), in a namespace of its own (``fm3w``, ...). The run
is scenario N on it; the check is the hard variants' symptoms (``lab.checks``),
each on the document or side chord its fault targets, so that each symptom
points at the one fix it lacks:

- fm1w: no ``envelope_revoked``: a chain head that expired before it ran is
  REVOKED and its chord (side ``expired``) never completes;
- fm3w: the drain as FM-3 first had it (``drain(..., chains=False, bodies=False,
  park=False)``): ``doc9``'s poison *fetch* is the chain's head, not the member,
  so its chord never completes; the poison chord body (side ``body``) is kept in
  silence; and the letters it cannot place go back to the head of the DLQ, so
  once a pass's worth of them wait, a newer poison member (side ``behind``) is
  never reached;
- fm4w: the claim as FM-4 first had it: no resume for the owner's own
  redelivery, 400 busy-retries of 50 ms (20 s, against a 60 s claim TTL), no
  idempotency key: the owner killed before sending is turned away by its own claim;
- fm5w: no ``wait_in``: waiting retries are ETA messages the worker holds, and on
  the quorum queue they fill its static prefetch: a probe sent while the burst
  waits comes back only once the retries come due;
- fm6w: fm6 as it first stood: Celery's ``soft_time_limit`` instead of the
  in-body soft deadline, no ``Request=BackstopRequest``, no deadline on the
  fetch or on ``notify``: the hang in C code (``doc11``) is FAILURE
  ``TimeLimitExceeded``; Celery's soft limit lands in the stalled store after
  ``doc28``'s body returned (FAILURE ``SoftTimeLimitExceeded``); ``doc29``'s
  hung fetch pins its slot;
- fm9w: the two settings without ``within_consumer_timeout``: the member stuck in C
  code (side ``overlong``, ``doc81``) outlives the node's consumer timeout under fm6's
  3 s ``time_limit``; the worker survives the 406 and cancels it, but SIGTERM cannot
  reach a process in C code, and its message comes back; in runs here 5.6 and 5.7
  ran it a second time, 5.5 never ended it while the broker closed the worker's
  channel every 2.5 s.
"""

from __future__ import annotations

from lab.fm import Fm
from lab.variants import derive

_RESUME_AND_BUDGET = (
    "    claim = NotifyClaim.of(app, pipeline_id, owner=self.request.id)  # FM-4: SET NX; the owner's redelivery resumes it\n"
    "    if (state := claim.acquire()) == \"busy\":  # FM-4: another notify is sending; it may still fail\n"
    "        raise BUSY.retry(self, ClaimBusy(pipeline_id), claim.policy.poll)  # FM-4: ask again later; outlast the claim's TTL\n",
    "    claim = NotifyClaim.of(app, pipeline_id, owner=self.request.id, policy=ClaimPolicy(resume=False))\n"
    "    if (state := claim.acquire()) == \"busy\":\n"
    "        raise self.retry(countdown=0.05, max_retries=400)\n",
)
_IMPORT = ("from shared.claim import ClaimBusy, NotifyClaim, busy_waits, release_when_dead_lettered\n",
           "from shared.claim import ClaimBusy, ClaimPolicy, NotifyClaim, busy_waits, release_when_dead_lettered\n")
_NO_KEY = ("send_email(pipeline_id, summary, idempotency_key=claim.key)  # FM-4: the mail API delivers a key once",
           "send_email(pipeline_id, summary)")

_FM6_FETCH = ("@app.task(bind=True, time_limit=3, Request=BackstopRequest)  # FM-6: every task has a deadline; Celery's kills last\n"
              "@enveloped  # FM-1: every exit is a SUCCESS-state envelope\n"
              "@hard_timeout(1.5, soft=1)  # FM-6: asks at 1 s, then raises HardTimeout at 1.5 s, inside the body only\n",
              "@app.task(bind=True)\n@enveloped  # FM-1: every exit is a SUCCESS-state envelope\n")
_FM6_PARSE = ("@app.task(bind=True, time_limit=3, Request=BackstopRequest)  # FM-6: the backstop; its kill is still an envelope\n",
              "@app.task(bind=True, soft_time_limit=1, time_limit=3)\n")
_FM6_PARSE_SOFT = ("@hard_timeout(1.5, soft=1)  # FM-6: SIGALRM asks (SoftTimeLimitExceeded) at 1 s, raises HardTimeout at 1.5 s\n",
                   "@hard_timeout(1.5)\n")
_FM6_NOTIFY = ("@app.task(bind=True, time_limit=15, Request=BackstopRequest)  # FM-6\n@enveloped  # FM-1\n"
               "@hard_timeout(10, soft=8)  # FM-6: the chord body too (it may wait for a busy claim's owner)\n",
               "@app.task(bind=True)\n@enveloped  # FM-1\n")

EDITS: dict[str, list[tuple[str, str]]] = {
    "fm1": [("envelope_revoked(app)  # FM-1: a chain head revoked or expired before it ran hands its chain a FAILURE envelope\n", "")],
    "fm3": [("    return drain(app, DLQ)\n", "    return drain(app, DLQ, chains=False, bodies=False, park=False)\n")],
    "fm4": [_IMPORT, _RESUME_AND_BUDGET, _NO_KEY],
    "fm5": [("RetryPolicy(max_retries=3, base=0.1), wait_in=QUEUE)", "RetryPolicy(max_retries=3, base=0.1))")],
    "fm6": [_FM6_FETCH, _FM6_PARSE, _FM6_PARSE_SOFT, _FM6_NOTIFY],
    "fm9": [("within_consumer_timeout(app, CONSUMER_TIMEOUT)  # FM-9: every time_limit at most half of it: a task ends "
             "before its channel\n", "")],
}
"""The FMs that have a weak variant, and the edits that take the hard fix out."""


def has_weak(fm: str) -> bool:
    return fm in EDITS


def weak_name(fm: str) -> str:
    return f"{fm}w"


def weak(fm: str, base_module: str) -> Fm:
    """The weak variant of ``fm`` (module ``base_module``), written and loaded."""
    return derive(base_module, f"{weak_name(fm)}_{base_module.split('_', 1)[1]}", EDITS[fm])
