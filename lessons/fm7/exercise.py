"""FM-7's exercise (``run_all_fms.py --exercise fm7``): the task, what must hold, the hints (``lab.exercise``)."""

from __future__ import annotations

from lab.exercise import Task
from lessons.fm7.scenario import DEPLOY_DOCS, DEPLOYS

EXERCISE = Task(
    symptom=f"The lab deploys the worker {DEPLOYS} times, as Kubernetes does, while {len(DEPLOY_DOCS)} slow but "
            "healthy documents (0.8 s of work each) run: a new worker starts, the old one gets SIGTERM, then SIGKILL "
            "when a short grace period ends. Work running at the SIGKILL is lost, and a healthy document that the "
            "deploys meet can be dead-lettered as if it were poison.",
    must_hold=(
        f"The deploys' chord completes with every one of its {len(DEPLOY_DOCS)} documents ok, each counted once, "
        "and one email.",
        "No healthy document is dead-lettered; none is parsed in two processes at once.",
        "No body that was running when its worker got SIGTERM is still running when the grace ends (killed): it "
        "stops in time, and its message goes back to start afresh.",
    ),
    hints=(
        "Look at what an old worker holds when SIGTERM comes (the messages it runs, and those it prefetched) and at "
        "what Celery's shutdown does with each until the grace ends; and at what RabbitMQ counts as a delivery.",
        "Celery's worker_prefetch_multiplier, worker_soft_shutdown_timeout (5.5+) with REMAP_SIGTERM=SIGQUIT in the "
        "worker's environment (WORKER_ENV in the program), worker_deduplicate_successful_tasks; shared/"
        "stored_members.py's count_stored_members; drain(..., send_back=True) in shared/dlq.py.",
    ),
)
