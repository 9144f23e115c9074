"""FM-2's exercise (``run_all_fms.py --exercise fm2``): the task, what must hold, the hints (``lab.exercise``)."""

from __future__ import annotations

from lab.exercise import Task

EXERCISE = Task(
    symptom="The lab SIGKILLs the pool process that parses doc3, on its first attempt only. doc3 is never tried "
            "again: the chord's result is a FAILURE holding a ChordError that names WorkerLostError, and notify never "
            "runs.",
    must_hold=(
        "A document whose process is killed on its first attempt is tried again and ends ok: exactly 2 attempts.",
        "A healthy document beside it (doc2) is tried exactly once.",
        "notify runs exactly once and the chord's result is a SUCCESS envelope; doc1 still fails with its error.",
    ),
    hints=(
        "Ask when the broker forgets a message: when the worker receives it, or once the task has returned? A "
        "message the broker has forgotten cannot be delivered again. Look at the app's configuration near the top "
        "of the file, and at how many pool processes the worker has.",
        "Celery's task_acks_late and task_reject_on_worker_lost (both in Celery 5.5 to 5.7): read in Celery's "
        "documentation what each does when a pool process dies mid-task; one alone does not bring the message back. "
        "worker_concurrency sets the pool processes.",
    ),
)
