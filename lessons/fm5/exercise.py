"""FM-5's exercise (``run_all_fms.py --exercise fm5``): the task, what must hold, the hints (``lab.exercise``)."""

from __future__ import annotations

from lab.exercise import Stated, Task
from shared.retry import RetryPolicy

POLICY = RetryPolicy(max_retries=3, base=0.1)
"""The lesson's bound: 3 retries, retry k after 0.1 * 2**k seconds times a factor from 1 to 2."""

EXERCISE = Task(
    symptom="doc5 meets a transient error (a 503 from a downstream service) twice; a third try would work. It fails "
            "after its first attempt.",
    must_hold=(
        "A document whose call fails with a TransientError twice is ok after exactly 3 attempts.",
        f"One whose call always fails transiently ends with reason retries_exhausted after exactly "
        f"{POLICY.max_retries + 1} attempts ({POLICY.max_retries} retries).",
        f"Retry k (k from 0) is planned {POLICY.base} * 2**k seconds times a random factor from 1 to 2 after the "
        "failure, and does not start earlier than planned.",
        "A burst of 8 or more retries waiting for their time does not hold up new work: a probe task sent meanwhile "
        "is taken by the worker within 0.5 s.",
    ),
    hints=(
        "Today every exception the body raises is recorded as the document's final failure. Look between "
        "@enveloped and the body: which errors deserve another attempt, how many, when, and where does a retry wait "
        "until its time?",
        "shared/retry.py's @transient_retryable(RetryPolicy(...), wait_in=QUEUE) under @enveloped, built on "
        "Celery's Task.retry; Celery's own autoretry_for sits in the task decorator, outside @enveloped: ask what "
        "it ever sees.",
    ),
    stated=Stated(retry_policy=POLICY),
)
