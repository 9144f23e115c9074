"""A right answer to FM-3's exercise written without ``shared/dlq``: RabbitMQ's own dead-lettering, a drain of its own.

The task queue is a quorum queue whose ``x-delivery-limit`` of 2 makes RabbitMQ 3.x deliver a poison message 3
times, then route it by ``x-dead-letter-exchange`` to ``DEAD``. A beat task reads ``DEAD`` with kombu: for each
Celery message it stores a failure envelope (reason ``dead_lettered``, in its own words) as the result of the
chord member the message stands for (itself; the last task of the chain it heads; or, for a chord body, itself),
through ``backend.mark_as_done``, whose request makes the chord count the member. What is no Celery task goes to
``ASIDE``. Kept beside the wrong answers to show that ``--check`` judges what happens, not whose code it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from celery import Task, chain, chord, group
from celery.app.task import Context
from celery.result import AsyncResult
from celery.signals import worker_ready
from kombu import Exchange, Producer, Queue
from kombu.message import Message

from lab.app import lab_app
from lab.faults import lab_fault
from lab.pipeline import Fetched, Parsed, Summary, fetch_text, parse, send_email, summarise
from shared.envelope import Result, Wire, envelope_revoked, enveloped, unwrap
from shared.manifest import read_manifest, write_manifest

app = lab_app(__name__)  # JSON only; queue, exchanges and result keys under the FM's namespace
envelope_revoked(app)  # FM-1: a chain head revoked or expired before it ran hands its chain a FAILURE envelope
app.conf.task_acks_late = True  # FM-2: ack when the body has returned
app.conf.task_reject_on_worker_lost = True  # FM-2: a process that dies requeues its message
app.conf.worker_concurrency = 2  # two pool processes: the lab's scenario 4 needs two slots
QUEUE = app.conf.task_default_queue
GRAVE = Exchange(f"{QUEUE}.grave", type="direct")  # where RabbitMQ routes what it will not deliver again
DEAD = Queue(f"{QUEUE}.dead", GRAVE, routing_key="dead")  # the dead letters; no worker consumes it as a task queue
ASIDE = Queue(f"{QUEUE}.aside", GRAVE, routing_key="aside")  # letters that are no Celery task, kept for a person
LIMIT = 2  # RabbitMQ 3.x: LIMIT returns to the queue, then the next death dead-letters: LIMIT + 1 deliveries
app.conf.task_queues = [Queue(QUEUE, Exchange(QUEUE), routing_key=QUEUE, queue_arguments={
    "x-queue-type": "quorum", "x-delivery-limit": LIMIT,
    "x-dead-letter-exchange": GRAVE.name, "x-dead-letter-routing-key": DEAD.routing_key})]
app.conf.beat_schedule = {"bury": {"task": f"{__name__}.bury_dead_letters", "schedule": 0.5}}


@worker_ready.connect
def _declare_the_grave(sender: object = None, **_: object) -> None:  # RabbitMQ drops a dead letter it cannot route
    if getattr(sender, "app", None) is not app:  # another app's worker in this process
        return
    with app.connection_for_write() as conn:
        for queue in (DEAD, ASIDE):
            queue.bind(conn.default_channel).declare()


@app.task(bind=True)
@enveloped  # FM-1: every exit is a SUCCESS-state envelope
def fetch_document(self: Task[Any, Any], doc_id: str) -> Fetched:
    return {"doc": doc_id, "text": fetch_text(doc_id)}  # a document store stands in for S3


@app.task(bind=True)
@enveloped  # FM-1
def parse_document(self: Task[Any, Any], fetched: Wire) -> Parsed:
    document: Fetched = unwrap(fetched)  # FM-1: the fetch's envelope; UpstreamFailed if it failed
    lab_fault(self, document)  # the lab: what the scenario does to this document
    return parse(document)


@app.task(bind=True)
@enveloped  # FM-1
def notify(self: Task[Any, Any], results: list[Wire], pipeline_id: str) -> Summary:
    summary = summarise(results, read_manifest(app, pipeline_id))  # the documents, from the manifest
    send_email(pipeline_id, summary)
    return {**summary, "sent": True}


@app.task(ignore_result=True)
def bury_dead_letters() -> int:
    """Empty ``DEAD``: finalise what stands for a chord member or body, set the rest aside."""
    buried = 0
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        dead, aside = DEAD.bind(channel), ASIDE.bind(channel)
        dead.declare()
        aside.declare()
        while (message := dead.get(no_ack=False)) is not None:
            if _finalise(message):
                buried += 1
            else:  # published aside first, then acked: a crash between leaves a copy, never none
                Producer(channel).publish(message.body, exchange=GRAVE, routing_key=ASIDE.routing_key,
                                          headers=dict(message.headers or {}), content_type=message.content_type,
                                          content_encoding=message.content_encoding, serializer=None)
            message.ack()
    return buried


def _finalise(message: Message) -> bool:
    headers = cast(Mapping[str, Any], message.headers or {})
    task_id, name = str(headers.get("id") or ""), str(headers.get("task") or "")
    if message.content_type != "application/json" or not task_id:
        return False
    body = cast(object, message.decode())
    if not (isinstance(body, list) and len(cast(list[Any], body)) == 3):
        return False
    embed = cast(Mapping[str, Any], cast(list[Any], body)[2] or {})
    rest = cast(list[Mapping[str, Any]], embed.get("chain") or [])  # the rest of the chain, its last task first
    failure = Result[Any].failure(f"{name} died on each of its {LIMIT + 1} deliveries", "dead_lettered",
                                  LIMIT + 1, LIMIT + 1).to_wire()
    if embed.get("chord"):  # the message is the chord member itself
        member = Context(id=task_id, task=name, group=headers.get("group"), group_index=headers.get("group_index"),
                         chord=embed["chord"], root_id=headers.get("root_id"), parent_id=headers.get("parent_id"))
    elif rest and (options := cast(Mapping[str, Any], rest[0].get("options") or {})).get("chord"):
        app.backend.mark_as_done(task_id, failure, request=Context(id=task_id, task=name, chord=None))  # the head
        member = Context(id=options["task_id"], task=rest[0].get("task"), group=options.get("group_id"),
                         group_index=options.get("group_index"), chord=options["chord"],
                         root_id=headers.get("root_id"), parent_id=task_id)
    else:  # a chord body, or a task on its own: its own result says it died
        member = Context(id=task_id, task=name, chord=None)
    app.backend.mark_as_done(str(member.id), failure, request=member)  # a request with a chord: the chord counts it
    return True


def submit(doc_ids: list[str], pipeline_id: str) -> AsyncResult[Any]:
    """One ``fetch | parse`` chain per document; ``notify`` once every chain has returned."""
    write_manifest(app, pipeline_id, doc_ids)  # the ids once, for notify: not in its signature, which every message carries
    header = group(chain(fetch_document.s(d), parse_document.s()) for d in doc_ids)
    return chord(header)(notify.s(pipeline_id))


if __name__ == "__main__":  # submit the scenario to a worker you started, then check it
    from lab.by_hand import run_by_hand

    raise SystemExit(run_by_hand(__file__))
