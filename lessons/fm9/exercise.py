"""FM-9's exercise (``run_all_fms.py --exercise fm9``): the task, what must hold, the hints (``lab.exercise``)."""

from __future__ import annotations

from collections.abc import Sequence

from lab.exercise import Stated, Task
from lab.lesson import Stop
from lab.observe import Reader
from lessons.fm9.scenario import CONNLOSS, HUNG_DOC, OVERLONG


def _broke(r: Reader) -> bool:
    """A worker of the cut or of the over-long member exited, or the member stuck in C code began a second time."""
    events = [e for tag in (CONNLOSS, OVERLONG) if (side := r.side_readers.get(tag)) is not None for e in side.events()]
    return any(e.kind == "worker_exit" for e in events) or sum(
        1 for e in events if e.kind == "attempt_start" and e.get("doc") == HUNG_DOC) > 1


def _early(stated: Stated) -> Sequence[Stop]:
    return (("the worker exited, or the member stuck in C code ran a second time", _broke),)

EXERCISE = Task(
    symptom="On a RabbitMQ node of the lab's own, the lab cuts the worker's broker connection while a slow document "
            "parses, as a network blip or a failover does: RabbitMQ requeues the message, the worker reconnects "
            "and takes it again while the first run goes on (on Celery 5.6 and 5.7 both run at once). Another "
            "document is stuck in C code past the node's consumer timeout (2.4 s here): RabbitMQ closes the channel "
            "and the worker exits. And a worker stopped by a deploy (SIGTERM, a soft shutdown wait) loses its "
            "connection while it waits: another worker starts the document it still runs.",
    must_hold=(
        "No document's work runs in two processes at once; every document is accounted once, one email per chord.",
        "The worker serves again after its connection was cut, and after the broker closed its channel.",
        "The member stuck in C code ends as an envelope with reason time_limit, before the broker's consumer "
        "timeout takes its message back.",
    ),
    hints=(
        "Two events to follow: what the worker does with a running task when its connection is lost, and what it "
        "does when the broker closes its channel (406 PRECONDITION_FAILED); and which deadline comes first, the "
        "task's or the broker's consumer_timeout.",
        "Celery's worker_cancel_long_running_tasks_on_connection_loss (5.1+) and broker_channel_error_retry (5.3+); "
        "shared/consumer_timeout.py's within_consumer_timeout(app, seconds), which keeps every time_limit at most "
        "half of the broker's timeout; shared/soft_wait.py's cancel_when_lost_in_soft_wait(app), since "
        "Celery's soft shutdown wait is a sleep that no connection loss interrupts; shared/run_fence.py's "
        "fence_redeliveries(app), since a cancel can lose the race to the broker's redelivery.",
    ),
    early=_early,
    needs=("rabbitmq-server",),
)
