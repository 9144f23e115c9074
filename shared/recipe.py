"""How an FM file becomes a Celery app: the recipe, the stacking order, the tasks.

An FM file states its recipe: the previous FM's recipe plus its one fix
(``Recipe.extend``). ``build`` turns it into an app with ``fetch_document``,
``parse_document``, ``notify`` and ``probe`` (plus ``drain_dead_letters`` when
the recipe has a dead-letter path), each under the FM's own name, queue and
Redis prefix. The harness reads worker flags and queues from the same recipe.

The decorator order is defined once, here, in ``PARSE_LAYERS`` (outermost first):
``@app.task``, ``@enveloped``, ``@transient_retryable``, ``@hard_timeout``.
``@enveloped`` must be outside the retry layer so that the error of the last
attempt (``RetriesExhausted``) becomes the envelope, and outside the timeout so
that ``HardTimeout`` does; the retry layer sits outside the timeout so that a
hard timeout is terminal, not retried.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from celery import Celery, Task
from celery.signals import worker_ready
from kombu import Exchange, Queue

from shared import dlq, pipeline
from shared.claim import ClaimPolicy, NotifyClaim
from shared.dlq import DeadLetterPolicy, DeadLetter
from shared.envelope import Wire, enveloped
from shared.observe import Recorder, client
from shared.retry import RetryPolicy, transient_retryable
from shared.scenarios import RunContext
from shared.settings import amqp_name, backend_url, broker_url, redis_prefix
from shared.timeouts import hard_timeout

PARSE_LAYERS: tuple[str, ...] = ("enveloped", "transient_retryable", "hard_timeout")
"""The order of the fixes around ``parse_document``, outermost first."""


@dataclass(frozen=True)
class Recipe:
    fm: str  # short name, also the namespace: fm3 -> rcl.fm3.*, rcl:fm3:*
    module: str  # the module that holds the app (celery -A <module>)
    scenario: int
    concurrency: int = 1
    enveloped: bool = True
    conf: Mapping[str, Any] = field(default_factory=lambda: {})  # app settings the fix needs
    parse_options: Mapping[str, Any] = field(default_factory=lambda: {})  # options of parse_document
    dead_letter: DeadLetterPolicy | None = None
    claim: ClaimPolicy | None = None
    retry: RetryPolicy | None = None
    hard_timeout: float | None = None

    def extend(self, fm: str, module: str, scenario: int, **fix: Any) -> Recipe:
        """This recipe plus one fix; mappings (``conf``, ``parse_options``) are merged."""
        for name in ("conf", "parse_options"):
            if name in fix:
                fix[name] = {**getattr(self, name), **fix[name]}
        return dataclasses.replace(self, fm=fm, module=module, scenario=scenario, **fix)

    @property
    def task_queue(self) -> Queue:
        name = amqp_name(self.fm, "tasks")
        arguments = dlq.quorum_arguments(self.fm, self.dead_letter) if self.dead_letter else None
        return Queue(name, Exchange(name, type="direct"), routing_key=name, queue_arguments=arguments)

    @property
    def queue_names(self) -> tuple[str, ...]:
        """Every queue the FM owns (the harness deletes exactly these on reset)."""
        extra = (dlq.dead_letter_queue(self.fm).name,) if self.dead_letter else ()
        return (str(self.task_queue.name), *extra)

    @property
    def exchange_names(self) -> tuple[str, ...]:
        extra = (dlq.dlx_exchange(self.fm).name,) if self.dead_letter else ()
        return (amqp_name(self.fm, "tasks"), *extra)

    @property
    def beat(self) -> bool:
        return self.dead_letter is not None

    def worker_args(self) -> list[str]:
        """The flags of ``celery -A <module> worker`` for this FM."""
        args = ["-c", str(self.concurrency), "-Q", str(self.task_queue.name)]
        args += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        return args + (["-B"] if self.beat else [])


class Tasks(NamedTuple):
    fetch_document: Task[Any, Any]
    parse_document: Task[Any, Any]
    notify: Task[Any, Any]
    probe: Task[Any, Any]
    drain_dead_letters: Task[Any, Any] | None


def build(recipe: Recipe) -> tuple[Celery, Tasks]:
    app = Celery(f"rcl_{recipe.fm}", broker=broker_url(), backend=backend_url())
    queue = recipe.task_queue
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_queues=[queue],
        task_default_queue=queue.name,
        task_default_exchange=queue.name,
        task_default_routing_key=queue.name,
        result_backend_transport_options={"global_keyprefix": redis_prefix(recipe.fm)},
        result_expires=3600,
        control_exchange=amqp_name(recipe.fm, "control"),
        event_exchange=amqp_name(recipe.fm, "events"),
        broker_connection_retry_on_startup=True,
        worker_consumer="shared.dlq:NamespacedConsumer",
        worker_pool="shared.pool:LabPool",  # prefork, noticing dead children sooner
        worker_redirect_stdouts_level="INFO",
    )
    app.conf.update(dict(recipe.conf))
    tasks = _register(app, recipe)
    if recipe.dead_letter is not None:
        tasks = tasks._replace(drain_dead_letters=_add_dead_letter_path(app, recipe.fm, recipe.dead_letter))
    return app, tasks


def parse_stack(recipe: Recipe) -> list[Callable[[Any], Any]]:
    """The decorators around ``parse_document``, outermost first (``PARSE_LAYERS``)."""
    layers: dict[str, Callable[[Any], Any] | None] = {
        "enveloped": enveloped if recipe.enveloped else None,
        "transient_retryable": transient_retryable(recipe.retry, _record_retry) if recipe.retry else None,
        "hard_timeout": hard_timeout(recipe.hard_timeout) if recipe.hard_timeout else None,
    }
    return [deco for name in PARSE_LAYERS if (deco := layers[name]) is not None]


def _wrap(fn: Callable[..., Any], stack: list[Callable[[Any], Any]]) -> Callable[..., Any]:
    for deco in reversed(stack):
        fn = deco(fn)
    return fn


def _register(app: Celery, recipe: Recipe) -> Tasks:
    outer = [enveloped] if recipe.enveloped else []
    name = f"{recipe.fm}.%s"
    fetch = app.task(bind=True, shared=False, name=name % "fetch_document")(_wrap(pipeline.fetch_document, outer))
    parse = app.task(bind=True, shared=False, name=name % "parse_document", **dict(recipe.parse_options))(
        _wrap(pipeline.parse_document, parse_stack(recipe))
    )
    notify_body = _claimed_notify(recipe.claim) if recipe.claim else _plain_notify
    notify = app.task(bind=True, shared=False, name=name % "notify")(_wrap(notify_body, outer))

    @app.task(shared=False, name=name % "probe")
    def probe() -> str:
        return "pong"

    return Tasks(fetch, parse, notify, probe, None)


def _begin_notify(results: list[Any], ctx: Wire, role: str) -> tuple[RunContext, Recorder, pipeline.Summary]:
    run = RunContext.from_wire(ctx)
    rec = Recorder(run.fm, run.run_id)
    rec.notify_ran(role)
    rec.event("notify_start", role=role)
    return run, rec, pipeline.summarise(results, run.docs)


def _end_notify(rec: Recorder, role: str, summary: pipeline.Summary, sent: bool) -> pipeline.Summary:
    rec.event("notify_end", role=role, sent=sent)
    return {**summary, "sent": sent}


def _plain_notify(task: Task[Any, Any], results: list[Any], *, ctx: Wire, role: str = "chord") -> pipeline.Summary:
    run, rec, summary = _begin_notify(results, ctx, role)
    pipeline.send_email(run, rec, role, summary)
    return _end_notify(rec, role, summary, sent=True)


def _claimed_notify(policy: ClaimPolicy) -> Callable[..., pipeline.Summary]:
    def notify(task: Task[Any, Any], results: list[Any], *, ctx: Wire, role: str = "chord") -> pipeline.Summary:
        run, rec, summary = _begin_notify(results, ctx, role)
        owner = str(task.request.id)
        claim = NotifyClaim(client(), redis_prefix(run.fm), run.pipeline_id, policy)
        state = claim.acquire(owner)
        rec.event("claim", role=role, state=state)
        if state == "busy":  # someone is sending: look again soon (they may still fail)
            raise task.retry(countdown=policy.busy_retry_delay, max_retries=policy.busy_max_retries)
        if state == "done":
            return _end_notify(rec, role, summary, sent=False)
        try:
            pipeline.send_email(run, rec, role, summary)
        except BaseException:
            claim.release(owner)  # let a retry or a duplicate send instead
            raise
        claim.mark_sent(owner)
        return _end_notify(rec, role, summary, sent=True)

    return notify


def _record_retry(task: Task[Any, Any], args: tuple[Any, ...], exc: BaseException, n: int, delay: float) -> None:
    run = RunContext.from_wire(task.request.kwargs["ctx"] if task.request.kwargs else {})
    Recorder(run.fm, run.run_id).event("retry", doc=pipeline.doc_named_by(args), retry=n, delay=f"{delay:.4f}")


def _add_dead_letter_path(app: Celery, fm: str, policy: DeadLetterPolicy) -> Task[Any, Any]:
    drain_name = f"{fm}.drain_dead_letters"

    def on_finalised(letter: DeadLetter) -> None:
        ctx = letter.kwargs.get("ctx")
        if ctx is None:
            return
        run = RunContext.from_wire(ctx)
        Recorder(run.fm, run.run_id).event("dead_lettered", doc=pipeline.doc_named_by(letter.args), death=letter.death_reason)

    @app.task(shared=False, name=drain_name, ignore_result=True)
    def drain_dead_letters() -> int:
        return dlq.drain(app, fm, policy, on_finalised)

    app.conf.beat_schedule = {"drain-dead-letters": {"task": drain_name, "schedule": policy.drain_every}}

    @worker_ready.connect(weak=False)
    def declare(sender: object = None, **_: object) -> None:
        if getattr(sender, "app", None) is app:
            dlq.declare_dead_letter_path(app, fm)

    return drain_dead_letters
