"""Each audit rule on a small app that breaks it and on one that does not (no broker: the audit needs none).

One piece: each rule's breaking app and passing app sit side by side, so that a rule's two tests are read
together.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from typing import Any

from celery import Celery
from celery.app.defaults import DEFAULTS
from celery.concurrency.thread import TaskPool as ThreadTaskPool
from kombu import Exchange, Queue

from audit.facts import AppFacts, collect
from audit.rules import RULES, RULES_BY_ID, Finding, Options, cannot_tell, run_rules
from shared.backend import reject_unstored
from shared.retry import RetryPolicy, transient_retryable
from shared.timeouts import BackstopRequest, hard_timeout

RABBIT = "amqp://guest:secret@localhost:5672//"
REDIS = "redis://localhost:6379/0"
_names = itertools.count()
QUORUM = {"x-queue-type": "quorum", "x-delivery-limit": 2, "x-dead-letter-exchange": "q.dlx"}


def make_app(broker: str = RABBIT, backend: str | None = REDIS, guard: bool = True, requeue: bool = False,
             **conf: Any) -> Celery[Any]:
    """An app with one plain task, ``work``; ``conf`` are its settings (a safe baseline unless overridden);
    ``guard``: FM-8's ``reject_unstored`` on its result backend (``requeue``: rejecting with requeue)."""
    app: Celery[Any] = Celery(f"audit_t{next(_names)}", broker=broker, backend=backend, set_as_current=False)
    app.conf.update(task_acks_late=True, task_reject_on_worker_lost=True, worker_prefetch_multiplier=1,
                    worker_soft_shutdown_timeout=1, task_time_limit=30, task_default_queue="q",
                    task_queues=[Queue("q", Exchange("q"), routing_key="q", queue_arguments=QUORUM)],
                    broker_channel_error_retry=True, worker_cancel_long_running_tasks_on_connection_loss=True)
    app.conf.update(**conf)
    if guard:
        reject_unstored(app, requeue=requeue)

    @app.task(shared=False, Request=BackstopRequest)
    def work() -> None: ...

    return app


def facts_of(app: Celery[Any]) -> AppFacts:
    return collect(app, app.main or "app")


def audit(app: Celery[Any], options: Options = Options()) -> list[Finding]:
    return run_rules(facts_of(app), options)


def audit_as(app: Celery[Any], options: Options = Options(), **facts: Any) -> list[Finding]:
    """The audit with some facts read from code set by hand (``uses_chords``, ``routes_by_key``)."""
    return run_rules(dataclasses.replace(facts_of(app), **facts), options)


def ids(findings: list[Finding]) -> set[str]:
    return {f.rule.id for f in findings}


def test_the_baseline_app_is_clean() -> None:
    assert audit(make_app()) == []


def test_one_finding_per_rule_listing_every_task() -> None:
    app = redis_app(40, task_time_limit=None)  # acks late on Redis, nothing ends a run: each task is exposed

    @app.task(shared=False)
    def other() -> None: ...

    found = [f for f in audit(app) if f.rule.id == "visibility-timeout-below-run"]
    assert len(found) == 1 and set(found[0].tasks) == {f"{__name__}.work", other.name}
    assert found[0].where.count("task ") == 2


def test_an_explicit_default_value_is_set_by_the_app_not_celerys_default() -> None:
    """Superset's CeleryConfig sets task_acks_late = False: a choice, labelled where it was made."""
    class Config:
        task_acks_late = False
        broker_url = RABBIT

    app: Celery[Any] = Celery(f"audit_t{next(_names)}", set_as_current=False)
    app.config_from_object(Config)

    @app.task(shared=False)
    def chosen() -> None: ...

    facts = facts_of(app)
    assert "task_acks_late" in facts.changed and facts.origins["task_acks_late"].file == __file__
    early = next(f for f in run_rules(facts, Options()) if f.rule.id == "acks-early")
    assert "task_acks_late=False (set at" in early.where and "Celery's default" not in early.where


def test_every_rule_has_a_proof_or_says_none_and_a_fix() -> None:
    for rule in RULES:
        assert rule.fix and rule.title
        if rule.proof.cell is None:
            assert rule.proof.note, f"{rule.id}: a rule no lab run proves must say what it rests on"
            assert "no lab run proves it yet" in rule.proof_here(facts_of(make_app()))
        else:
            assert rule.proof.command and ("run_all_fms.py" in rule.proof.command or "pytest" in rule.proof.command)


# ---- FM-2 ------------------------------------------------------------------------------------


def test_acks_early() -> None:
    found = audit(make_app(task_acks_late=False))
    assert ids(found) >= {"acks-early"}
    f = next(f for f in found if f.rule.id == "acks-early")
    assert f.setting == "task_acks_late" and f.severity == "high" and f.rule.proof.cell == "fm2 S2"
    assert "acks-early" not in ids(audit(make_app()))


def test_acks_early_set_on_the_task_itself_is_reported_at_the_task() -> None:
    app = make_app()

    @app.task(shared=False, acks_late=False, Request=BackstopRequest)
    def early() -> None: ...

    found = [f for f in audit(app) if f.rule.id == "acks-early"]
    assert [f.tasks for f in found] == [(early.name,)] and found[0].where.startswith(f"task {early.name}")


def test_acks_late_without_reject_on_worker_lost() -> None:
    found = audit(make_app(task_reject_on_worker_lost=False))
    assert "acks-late-without-reject-on-worker-lost" in ids(found)
    assert "acks-late-without-reject-on-worker-lost" not in ids(audit(make_app()))


def test_retry_on_worker_lost_is_reported_on_57_only() -> None:
    app = make_app(task_retry_on_worker_lost=True, task_reject_on_worker_lost=False)
    facts = facts_of(app)
    if facts.celery_minor >= (5, 7):
        assert "retry-on-worker-lost-fails-chord" in ids(run_rules(facts, Options()))
        assert "acks-late-without-reject-on-worker-lost" not in ids(run_rules(facts, Options()))
    older = dataclasses.replace(facts, celery_version="5.5.3", unknown_settings=("task_retry_on_worker_lost",),
                                raw_set={"task_retry_on_worker_lost": True})
    found = run_rules(older, Options())
    assert "retry-on-worker-lost-fails-chord" not in ids(found)  # nothing reported that 5.5 does not have
    unknown = next(f for f in found if f.rule.id == "setting-not-in-this-celery")
    assert unknown.where == "1 name(s) Celery 5.5.3 does not read: task_retry_on_worker_lost (new in Celery 5.7.0)"
    assert "each is ignored" in unknown.consequence
    assert "retry-on-worker-lost-fails-chord" not in ids(audit(make_app()))


# ---- FM-3 ------------------------------------------------------------------------------------


def test_unbounded_redelivery_on_a_classic_queue() -> None:
    found = audit(make_app(task_queues=[Queue("q", Exchange("q"), routing_key="q")]))
    f = next(f for f in found if f.rule.id == "unbounded-redelivery")
    assert f.queue == "q" and "classic queue has no delivery limit" in f.consequence


def test_unbounded_redelivery_on_a_quorum_queue_without_a_limit_names_rabbitmq_4() -> None:
    found = audit(make_app(task_queues=[Queue("q", Exchange("q"), routing_key="q",
                                              queue_arguments={"x-queue-type": "quorum"})]))
    f = next(f for f in found if f.rule.id == "unbounded-redelivery")
    assert "RabbitMQ 4.0" in f.consequence


def test_unbounded_redelivery_on_a_redis_broker() -> None:
    found = audit(make_app(broker=REDIS, task_queues=None))
    f = next(f for f in found if f.rule.id == "unbounded-redelivery")
    assert "kombu's Redis transport has no delivery limit" in f.consequence
    assert "(a Redis list)" in f.where and "classic" not in f.where  # no exchange type a Redis list does not have
    assert "quorum" not in f.fix_here.split(";")[0] and "task_retry_on_worker_lost" in f.fix_here  # a fix Redis has
    assert "quorum" in f.rule.fix  # the rule's own (RabbitMQ) fix stays for RabbitMQ


def test_no_unbounded_redelivery_without_requeue_or_with_a_limit() -> None:
    assert "unbounded-redelivery" not in ids(audit(make_app()))  # quorum, limit 2, DLX
    early = make_app(task_acks_late=False, task_queues=[Queue("q", Exchange("q"), routing_key="q")])
    assert "unbounded-redelivery" not in ids(audit(early))  # nothing is requeued: acks-early says what happens


def test_delivery_limit_without_a_dead_letter_exchange() -> None:
    found = audit(make_app(task_queues=[Queue("q", Exchange("q"), routing_key="q", queue_arguments={
        "x-queue-type": "quorum", "x-delivery-limit": 2})]))
    f = next(f for f in found if f.rule.id == "delivery-limit-without-dead-letter-exchange")
    assert f.rule.proof.cell is None and "dropped" in f.consequence
    assert "delivery-limit-without-dead-letter-exchange" not in ids(audit(make_app()))


def test_prefetch_above_one_with_a_delivery_limit() -> None:
    found = audit(make_app(worker_prefetch_multiplier=4))
    f = next(f for f in found if f.rule.id == "prefetch-above-delivery-limit")
    assert f.rule.proof.cell == "C19" and "3 such losses" in f.consequence
    assert "prefetch-above-delivery-limit" not in ids(audit(make_app()))


# ---- FM-7 ------------------------------------------------------------------------------------


def test_a_warm_shutdown_only_worker_with_acks_late_tasks() -> None:
    found = [f for f in audit(make_app(worker_soft_shutdown_timeout=0)) if f.rule.id == "warm-shutdown-only"]
    assert len(found) == 1 and found[0].setting == "worker_soft_shutdown_timeout" and found[0].severity == "medium"
    assert found[0].rule.proof.cell == "fm7 S7" and "SIGKILLs it mid-body" in found[0].consequence
    assert len(found[0].tasks) == 1 and found[0].tasks[0].endswith(".work")
    assert "warm-shutdown-only" not in ids(audit(make_app()))  # a soft shutdown of 1 s: not a finding, but
    notes = cannot_tell(facts_of(make_app()), Options())  # whether it applies is REMAP_SIGTERM's, out of sight
    assert any(n.startswith("warm-shutdown-only:") and "REMAP_SIGTERM=SIGQUIT" in n for n in notes)
    assert "warm-shutdown-only" not in ids(audit(make_app(task_acks_late=False, worker_soft_shutdown_timeout=0)))


# ---- FM-8 ------------------------------------------------------------------------------------

ACKS_ON_FAILURE = "task_acks_on_failure" if "task_acks_on_failure" in DEFAULTS else "task_acks_on_failure_or_timeout"
"""The setting that says whether a late-acked failure is acked: 5.7's, else the one 5.5 and 5.6 have."""


def test_an_unstorable_result_is_acked_and_lost() -> None:
    found = [f for f in audit(make_app(guard=False)) if f.rule.id == "unstored-result-acked"]
    assert len(found) == 1 and found[0].severity == "high" and found[0].rule.proof.cell == "fm8 S8"
    # 5.7's task_acks_on_failure, unset, falls back to task_acks_on_failure_or_timeout: named as such on every version
    assert found[0].setting == "task_acks_on_failure_or_timeout" and "(Celery's default)" in found[0].where
    assert "stays PENDING for ever" in found[0].consequence and found[0].tasks[0].endswith(".work")
    assert "unstored-result-acked" not in ids(audit(make_app()))  # reject_unstored, a quorum queue with a DLX


def test_no_unstored_result_rule_where_nothing_is_stored_or_acked_late() -> None:
    assert "unstored-result-acked" not in ids(audit(make_app(guard=False, task_ignore_result=True)))
    assert "unstored-result-acked" not in ids(audit(make_app(guard=False, backend="rpc://")))
    assert "unstored-result-acked" not in ids(audit(make_app(guard=False, backend=None)))
    early = audit(make_app(guard=False, task_acks_late=False))  # acked at receipt: acks-early says so
    assert "unstored-result-acked" not in ids(early) and "acks-early" in ids(early)


def test_acks_on_failure_false_alone_is_not_enough() -> None:
    for setting in {ACKS_ON_FAILURE, "task_acks_on_failure_or_timeout"}:  # 5.7's, and the one it falls back to
        off: dict[str, Any] = {setting: False}
        found = [f for f in audit(make_app(guard=False, **off)) if f.rule.id == "unstored-result-acked"]
        assert [(f.severity, f.setting) for f in found] == [("medium", setting)], setting
        assert "ChordError" in found[0].consequence and "(set by the app)" in found[0].where


def test_a_guard_with_nowhere_to_dead_letter_drops_the_message() -> None:
    classic = make_app(task_queues=[Queue("q", Exchange("q"), routing_key="q")])
    f = next(f for f in audit(classic) if f.rule.id == "unstored-result-acked")
    assert f.severity == "high" and "dropped" in f.consequence and f.setting == "result_backend"
    redis = make_app(broker=REDIS, task_queues=None)  # kombu's Redis transport has no dead-letter exchange
    assert "dropped" in next(f.consequence for f in audit(redis) if f.rule.id == "unstored-result-acked")


def test_a_guard_that_requeues_keeps_the_message_where_nothing_dead_letters() -> None:
    """tests/test_backend_requeue.py runs it: the message back in its queue, stored once the backend returns."""
    for app in (make_app(broker=REDIS, task_queues=None, requeue=True),
                make_app(task_queues=[Queue("q", Exchange("q"), routing_key="q")], requeue=True)):
        facts = facts_of(app)
        assert facts.backend_guards_store and facts.backend_requeues_unstored
        assert "unstored-result-acked" not in ids(run_rules(facts, Options()))
    assert not facts_of(make_app(broker=REDIS, task_queues=None)).backend_requeues_unstored


def test_the_result_backends_class_and_its_guard() -> None:
    facts = facts_of(make_app())
    assert facts.backend_guards_store and facts.backend_class.startswith("shared.backend:RejectUnstored_")
    plain = facts_of(make_app(guard=False))
    assert plain.backend_class == "celery.backends.redis:RedisBackend" and not plain.backend_guards_store
    assert facts_of(make_app(guard=False, backend="rpc://")).backend_class == "celery.backends.rpc:RPCBackend"


def test_acks_on_failure_is_read_where_it_comes_from() -> None:
    option = facts_of(make_app()).tasks[0].options["acks_on_failure"]
    assert (option.value, option.source, option.setting) == (True, "default", "task_acks_on_failure_or_timeout")
    off: dict[str, Any] = {ACKS_ON_FAILURE: False}
    option = facts_of(make_app(**off)).tasks[0].options["acks_on_failure"]
    assert (option.value, option.source, option.setting) == (False, "setting", ACKS_ON_FAILURE)
    app = make_app()

    @app.task(shared=False, acks_on_failure_or_timeout=False)
    def own() -> None: ...

    option = next(t for t in facts_of(app).tasks if t.name == own.name).options["acks_on_failure"]
    assert (option.value, option.source) == (False, "task")


# ---- FM-9 ------------------------------------------------------------------------------------


def test_a_lost_connection_leaves_acks_late_tasks_running() -> None:
    found = [f for f in audit(make_app(worker_cancel_long_running_tasks_on_connection_loss=False))
             if f.rule.id == "connection-loss-leaves-tasks-running"]
    assert len(found) == 1 and found[0].severity == "high" and found[0].rule.proof.cell == "fm9 S9"
    assert found[0].setting == "worker_cancel_long_running_tasks_on_connection_loss" and "(set by the app)" in found[0].where
    assert "connection-loss-leaves-tasks-running" not in ids(audit(make_app()))
    assert "connection-loss-leaves-tasks-running" not in ids(audit(make_app(
        task_acks_late=False, worker_cancel_long_running_tasks_on_connection_loss=False)))  # acked at receipt
    assert "connection-loss-leaves-tasks-running" not in ids(audit(make_app(
        broker=REDIS, task_queues=None, worker_cancel_long_running_tasks_on_connection_loss=False)))  # RabbitMQ's


def test_a_channel_the_broker_closes_ends_the_worker() -> None:
    found = [f for f in audit(make_app(broker_channel_error_retry=False)) if f.rule.id == "channel-error-ends-worker"]
    assert len(found) == 1 and found[0].severity == "medium" and "406" in found[0].consequence
    assert found[0].setting == "broker_channel_error_retry" and found[0].rule.since == (5, 3)
    assert "channel-error-ends-worker" not in ids(audit(make_app()))
    assert "channel-error-ends-worker" not in ids(audit(make_app(broker=REDIS, task_queues=None,
                                                                 broker_channel_error_retry=False)))


def consumer_timeout(app: Celery[Any], seconds: float = 1800) -> list[Finding]:
    return [f for f in audit(app, Options(consumer_timeout=seconds)) if f.rule.id == "time-limit-above-consumer-timeout"]


def test_a_time_limit_at_or_above_the_consumer_timeout() -> None:
    found = consumer_timeout(make_app(task_time_limit=3600))
    assert [(f.severity, f.setting) for f in found] == [("high", "task_time_limit")]
    assert "time_limit 3600s; consumer_timeout 1800s" in found[0].where and found[0].rule.proof.cell == "fm9 S9 hard"
    assert [f.severity for f in consumer_timeout(make_app(task_time_limit=1800))] == ["high"]  # at it: a race
    # above half the timeout, the margin the rule's own fix keeps (within_consumer_timeout): medium
    assert [f.severity for f in consumer_timeout(make_app(task_time_limit=1000))] == ["medium"]
    assert not consumer_timeout(make_app(task_time_limit=900))  # half RabbitMQ's default, 1800 s: the fix's value
    assert [f.severity for f in consumer_timeout(make_app(task_time_limit=1000), seconds=600)] == ["high"]
    assert not consumer_timeout(make_app(broker=REDIS, task_queues=None, task_time_limit=3600))  # RabbitMQ's


def test_no_time_limit_is_no_deadlines_finding_not_a_second_one() -> None:
    """One root cause, one finding: no-deadline names the consumer timeout for an acks-late task on RabbitMQ."""
    found = audit(make_app(task_time_limit=None), Options(consumer_timeout=600))
    assert "time-limit-above-consumer-timeout" not in ids(found)
    assert "consumer_timeout (600s)" in next(f.consequence for f in found if f.rule.id == "no-deadline")
    redis = audit(make_app(broker=REDIS, task_queues=None, task_time_limit=None))
    assert "consumer_timeout" not in next(f.consequence for f in redis if f.rule.id == "no-deadline")


def test_an_in_body_deadline_without_a_time_limit_cannot_end_c_code() -> None:
    app = make_app(task_time_limit=None)

    @app.task(bind=True, shared=False)
    @hard_timeout(2, soft=1)
    def bounded(self: Any) -> None: ...

    found = consumer_timeout(app)
    assert [(f.tasks, f.severity) for f in found] == [((bounded.name,), "medium")]  # `work` is no-deadline's
    assert "cannot interrupt a process stuck in C code" in found[0].consequence


def test_a_retry_countdown_held_in_the_worker_counts_against_the_consumer_timeout() -> None:
    app = make_app()  # a quorum queue through a direct exchange: Celery holds the retry in the worker
    name = add_autoretry(app)  # backoff 1, 2, 4, 8, 16 s
    found = consumer_timeout(app, seconds=40)  # `work` too: its 30 s time_limit is above half of 40
    assert [f.severity for f in found] == ["high"] and name in found[0].tasks
    assert f"task {name} (time_limit 30s + retry countdown 16s held as an ETA message" in found[0].where
    assert [(f.tasks, f.severity) for f in consumer_timeout(app, 80)] == [((name,), "medium")]
    topic = make_app(task_queues=[Queue("q", Exchange("q", type="topic"), routing_key="q", queue_arguments=QUORUM)])
    add_autoretry(topic)  # native delayed delivery: the broker holds the retry
    assert not consumer_timeout(topic, seconds=80)  # 30 s of time_limit alone, below half of 80
    early = make_app(task_acks_late=False, task_queues=[Queue("q", Exchange("q"), routing_key="q")])
    name = add_autoretry(early)  # acks early, but an ETA message is held unacked until its countdown is due
    found = consumer_timeout(early, seconds=16)
    assert [(f.tasks, f.severity) for f in found] == [((name,), "high")] and "time_limit" not in found[0].where


# ---- FM-5 ------------------------------------------------------------------------------------


def add_autoretry(app: Celery[Any]) -> str:
    @app.task(shared=False, autoretry_for=(ConnectionError,), retry_backoff=True, max_retries=5,
              Request=BackstopRequest)
    def flaky() -> None: ...

    return flaky.name


def test_countdown_retries_on_a_quorum_queue_through_a_direct_exchange() -> None:
    app = make_app()
    name = add_autoretry(app)
    f = next(f for f in audit(app) if f.rule.id == "countdown-retry-on-quorum-direct")
    assert f.tasks == (name,) and f.rule.proof.cell == "fm5 S5 hard"
    topic = make_app(task_queues=[Queue("q", Exchange("q", type="topic"), routing_key="q", queue_arguments=QUORUM)])
    add_autoretry(topic)
    assert "countdown-retry-on-quorum-direct" not in ids(audit(topic))  # native delayed delivery takes it
    assert "countdown-retry-on-quorum-direct" not in ids(audit(make_app()))  # no autoretry_for


CLASSIC = [Queue("q", Exchange("q"), routing_key="q")]


def test_retries_held_in_the_worker_without_worker_eta_task_limit() -> None:
    app = make_app(task_queues=CLASSIC)
    name = add_autoretry(app)
    facts = facts_of(app)
    f = next(f for f in run_rules(facts, Options()) if f.rule.id == "eta-without-task-limit")
    assert f.tasks == (name,) and f.setting == "worker_eta_task_limit" and f.rule.proof.cell is None
    assert "65,535" in f.consequence
    # 5.5 holds the retries the same way but has no cap to set: reported, with the fix 5.5 allows
    older = next(f for f in run_rules(dataclasses.replace(facts, celery_version="5.5.3"), Options())
                 if f.rule.id == "eta-without-task-limit")
    assert older.where.startswith("Celery 5.5.3 has no worker_eta_task_limit (new in 5.6.0)") and older.tasks == (name,)
    assert older.fix_here.startswith("retries that wait in the broker")
    capped = make_app(task_queues=CLASSIC, worker_eta_task_limit=100)
    add_autoretry(capped)
    if facts.celery_minor >= (5, 6):
        assert "eta-without-task-limit" not in ids(audit(capped))
    else:  # 5.5 reads no worker_eta_task_limit: the cap is an unread name, and the retries are still held
        assert {"eta-without-task-limit", "setting-not-in-this-celery"} <= ids(audit(capped))
    quorum = make_app()  # per-consumer QoS: the prefetch stays static (countdown-retry-on-quorum-direct's case)
    add_autoretry(quorum)
    assert "eta-without-task-limit" not in ids(audit(quorum))
    redis = make_app(broker=REDIS, task_queues=None)
    add_autoretry(redis)
    assert "eta-without-task-limit" in ids(audit(redis))
    lab = make_app(task_queues=CLASSIC)

    @lab.task(bind=True, shared=False, Request=BackstopRequest)
    @transient_retryable(RetryPolicy(max_retries=3), wait_in="q")  # waits in the broker's delay queues
    def careful(self: Any) -> None: ...

    @lab.task(bind=True, shared=False, Request=BackstopRequest)
    @transient_retryable(RetryPolicy(max_retries=3))  # Task.retry(countdown=...): an ETA message in the worker
    def eager(self: Any) -> None: ...

    assert [f.tasks for f in audit(lab) if f.rule.id == "eta-without-task-limit"] == [(eager.name,)]


def test_retries_that_run_out_fail_the_task() -> None:
    app = make_app()
    name = add_autoretry(app)

    @app.task(shared=False, autoretry_for=(KeyError,), retry_kwargs={"max_retries": 5}, Request=BackstopRequest)
    def keyed() -> None: ...

    found = [f for f in audit_as(app, uses_chords=True) if f.rule.id == "retries-exhausted-fail"]
    assert len(found) == 1 and set(found[0].tasks) == {name, keyed.name} and "ChordError" in found[0].consequence
    assert f"task {keyed.name} (autoretry_for=KeyError, max_retries=5)" in found[0].where  # retry_kwargs' 5, not 3
    # no chord in the app's code: a task whose retries run out fails as Celery documents; nothing to restate
    assert "retries-exhausted-fail" not in ids(audit_as(app, uses_chords=False))
    quiet = make_app()

    @quiet.task(shared=False, autoretry_for=(KeyError,), ignore_result=True, Request=BackstopRequest)
    def forgotten() -> None: ...

    assert "retries-exhausted-fail" not in ids(audit_as(quiet, uses_chords=True))  # fire-and-forget
    lab = make_app()

    @lab.task(bind=True, shared=False, Request=BackstopRequest)
    @transient_retryable(RetryPolicy(max_retries=3), wait_in="q")
    def careful(self: Any) -> None: ...

    assert "retries-exhausted-fail" not in ids(audit(lab))


# ---- FM-6 ------------------------------------------------------------------------------------


def test_no_deadline() -> None:
    found = audit(make_app(task_time_limit=None))
    assert "no-deadline" in ids(found)
    app = make_app(task_time_limit=None)

    @app.task(bind=True, shared=False)
    @hard_timeout(2, soft=1)
    def bounded(self: Any) -> None: ...

    f = next(f for f in audit(app) if f.rule.id == "no-deadline")
    assert bounded.name not in f.tasks  # the lab's in-body deadline counts as one
    assert "no-deadline" not in ids(audit(make_app()))


def test_celery_time_limit_with_celerys_request_fails_the_chord() -> None:
    app = make_app()

    @app.task(shared=False, time_limit=10)
    def plain() -> None: ...

    f = next(f for f in audit(app) if f.rule.id == "time-limit-fails-chord")
    assert f.tasks == (plain.name,) and "TimeLimitExceeded" in f.consequence and f.rule.proof.cell == "C1"
    assert "time-limit-fails-chord" not in ids(audit(make_app()))  # BackstopRequest


class OwnThreads(ThreadTaskPool):
    """A pool of the app's own, derived from Celery's threads pool."""


def pool_findings(pool: object) -> tuple[list[Finding], str]:
    app = make_app(worker_pool=pool)

    @app.task(bind=True, shared=False, Request=BackstopRequest)
    @hard_timeout(2, soft=1)
    def bounded(self: Any) -> None: ...

    return [f for f in audit(app) if f.rule.id == "pool-cannot-apply-deadlines"], bounded.name


def test_a_pool_where_hard_timeout_cannot_run() -> None:
    found, bounded = pool_findings("threads")
    assert [(f.severity, f.setting) for f in found] == [("high", "worker_pool")]  # one finding, every task in it
    assert bounded in found[0].tasks and "RuntimeError" in found[0].consequence  # and its time_limit (30 s) dropped
    assert "drops Celery's time_limit" in found[0].consequence and any(t.endswith(".work") for t in found[0].tasks)
    assert found[0].rule.proof.cell is None and "-P overrides it" in found[0].where
    assert "worker_pool='threads' (set by the app;" in found[0].where  # not "Celery's default"
    assert [f.severity for f in pool_findings(f"{__name__}:OwnThreads")[0]] == ["high"]
    assert [f.severity for f in pool_findings(OwnThreads)[0]] == ["high"]  # a class, not a name


def test_hard_timeout_refuses_a_thread_of_its_own() -> None:
    """What the threads pool does to a task with @hard_timeout: it runs it on a thread of its executor."""
    app = make_app()

    @app.task(bind=True, shared=False)
    @hard_timeout(2)
    def bounded(self: Any) -> None: ...

    raised: list[BaseException] = []

    def run() -> None:
        try:
            bounded.run()
        except BaseException as exc:
            raised.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(5)
    assert [type(e) for e in raised] == [RuntimeError] and "main thread" in str(raised[0])


def test_green_pools_and_solo() -> None:
    found, bounded = pool_findings("gevent")  # not imported: gevent is not installed here
    # under gevent @hard_timeout raises RuntimeError on every run, as on threads (gevent 26.9.0): the same severity
    assert [(f.tasks, f.severity) for f in found] == [((bounded,), "high")] and "RuntimeError" in found[0].consequence
    eventlet, _ = pool_findings("eventlet")  # green threads sharing SIGALRM; and eventlet's on_apply drops time_limit
    assert len(eventlet) == 1 and "drops Celery's time_limit" in eventlet[0].consequence
    assert "SIGALRM" in eventlet[0].consequence
    solo, _ = pool_findings("solo")  # the body runs on the main thread: @hard_timeout works; time_limit does not
    assert len(solo) == 1 and len(solo[0].tasks) == 2 and "SIGALRM" not in solo[0].consequence
    for prefork in ("prefork", "processes", "lab.pool:LabPool"):
        assert pool_findings(prefork)[0] == [], prefork
    assert pool_findings("no.such.module:Pool")[0] == []  # a pool the audit cannot place is not guessed at


def test_celery_soft_time_limit() -> None:
    found = audit(make_app(task_soft_time_limit=20))
    f = next(f for f in found if f.rule.id == "celery-soft-time-limit")
    assert f.setting == "task_soft_time_limit" and f.rule.proof.cell == "fm6 S6 hard"
    assert "celery-soft-time-limit" not in ids(audit(make_app()))


def test_a_soft_time_limit_on_a_pool_that_never_sends_it() -> None:
    """Only prefork signals the soft limit: on threads it never fires, which the pool rule says, not this one."""
    found = audit(make_app(task_soft_time_limit=20, task_time_limit=None, worker_pool="threads"))
    assert "celery-soft-time-limit" not in ids(found)
    pool = next(f for f in found if f.rule.id == "pool-cannot-apply-deadlines")
    assert "soft limit" in pool.consequence and "never fires" in pool.consequence
    assert "never sends" in next(f for f in found if f.rule.id == "no-deadline").consequence


def test_acks_late_without_reject_is_a_prefork_finding() -> None:
    """On threads (or gevent, eventlet, solo) no child process dies alone: there is no WorkerLostError to ack."""
    found = audit(make_app(task_reject_on_worker_lost=False))
    assert "acks-late-without-reject-on-worker-lost" in ids(found)
    for pool in ("threads", "gevent", "solo"):
        assert "acks-late-without-reject-on-worker-lost" not in ids(
            audit(make_app(task_reject_on_worker_lost=False, worker_pool=pool))), pool


def test_a_time_limit_fails_a_chord_only_where_there_are_chords() -> None:
    app = make_app(guard=False)  # Celery's Request: a kill stores FAILURE
    app.conf.task_default_request = None

    @app.task(shared=False, time_limit=5)
    def plain() -> None: ...

    assert "time-limit-fails-chord" in ids(audit_as(app, uses_chords=True))
    assert "time-limit-fails-chord" not in ids(audit_as(app, uses_chords=False))
    threads = make_app(worker_pool="threads")

    @threads.task(shared=False, time_limit=5)
    def dropped() -> None: ...

    assert "time-limit-fails-chord" not in ids(audit_as(threads, uses_chords=True))  # threads drop the limit


# ---- Redis broker, result expiry, backend ---------------------------------------------------


def redis_app(visibility: float | None, **conf: Any) -> Celery[Any]:
    options = {} if visibility is None else {"visibility_timeout": visibility}
    return make_app(broker=REDIS, task_queues=None, broker_transport_options=options, **conf)


def test_visibility_timeout_below_a_time_limit_plus_its_countdown() -> None:
    app = redis_app(40)
    name = add_autoretry(app)  # backoff 1, 2, 4, 8, 16 s: the longest countdown is 16 s
    found = [f for f in audit(app) if f.rule.id == "visibility-timeout-below-run"]
    assert [(f.tasks, f.severity) for f in found] == [((name,), "high")]
    assert "time_limit 30s + retry countdown 16s" in found[0].consequence
    assert not [f for f in audit(redis_app(60)) if f.rule.id == "visibility-timeout-below-run"]


def test_visibility_timeout_with_an_unbounded_acks_late_task_and_kombus_default() -> None:
    found = [f for f in audit(redis_app(None, task_time_limit=None)) if f.rule.id == "visibility-timeout-below-run"]
    assert found and found[0].severity == "medium" and "(3600s)" in found[0].consequence


def test_no_visibility_rule_on_rabbitmq() -> None:
    assert "visibility-timeout-below-run" not in ids(audit(make_app(task_time_limit=None)))


def test_chord_outlives_result_expires() -> None:
    """The Redis backend renews the chord's keys at every return: what must stay below the expiry is the longest
    stretch with no return (--chord-gap), not the chord's whole run."""
    app = make_app(result_expires=8, task_time_limit=None)  # no time limit: configuration bounds no stretch
    assert "chord-outlives-result-expires" not in ids(audit_as(app, uses_chords=True))  # without --chord-gap: says so
    notes = cannot_tell(dataclasses.replace(facts_of(app), uses_chords=True), Options())
    assert any(n.startswith("chord-outlives-result-expires:") and "--chord-gap" in n for n in notes)
    f = next(f for f in audit(app, Options(chord_gap=20)) if f.rule.id == "chord-outlives-result-expires")
    assert f.setting == "result_expires" and f.rule.proof.cell == "severity_batch SB6 write-up"
    assert "a chord goes 20s with no member returning" in f.where
    assert "chord-outlives-result-expires" not in ids(audit(make_app(result_expires=60), Options(chord_gap=20)))
    assert "chord-outlives-result-expires" not in ids(audit(make_app(result_expires=0), Options(chord_gap=20)))
    assert "chord-outlives-result-expires" not in ids(audit(make_app(backend="rpc://", result_expires=8),
                                                          Options(chord_gap=20)))  # Redis backend only


def test_chord_expiry_against_a_members_longest_run() -> None:
    """Without --chord-gap, configuration bounds one stretch: a straggler running every attempt to its time_limit."""
    app = make_app(result_expires=60)
    name = add_autoretry(app)  # time_limit 30 s, 5 retries with backoff 1..16 s: up to 30 x 6 + 5 x 16 = 260 s
    found = [f for f in audit_as(app, uses_chords=True) if f.rule.id == "chord-outlives-result-expires"]
    assert len(found) == 1 and found[0].tasks == (name,) and f"task {name} (up to 260s)" in found[0].where
    assert "chord-outlives-result-expires" not in ids(audit_as(app, uses_chords=False))  # no chord in the code
    assert "chord-outlives-result-expires" not in ids(audit_as(make_app(result_expires=600), uses_chords=True))
    unbounded = make_app(result_expires=60, task_time_limit=None)  # no bound: the rule cannot tell, and says so
    assert "chord-outlives-result-expires" not in ids(audit_as(unbounded, uses_chords=True))


def test_result_chord_expires_decides_where_the_installed_celery_has_it() -> None:
    facts = facts_of(make_app(result_expires=8, result_chord_expires=60))
    found = ids(run_rules(facts, Options(chord_gap=20)))
    if facts.has_setting("result_chord_expires"):
        assert "chord-outlives-result-expires" not in found
    else:
        assert "chord-outlives-result-expires" in found and "setting-not-in-this-celery" in found


def test_chords_on_the_rpc_backend() -> None:
    assert "chord-on-rpc-backend" in ids(audit(make_app(backend="rpc://")))
    assert "chord-on-rpc-backend" not in ids(audit(make_app()))


def test_one_topic_queue_for_every_key_with_competing_processes() -> None:
    topic = [Queue("q", Exchange("q.lots", type="topic"), routing_key="lot.#", queue_arguments=QUORUM)]
    assert "one-queue-per-key-order" in ids(audit_as(make_app(task_queues=topic, worker_concurrency=2), routes_by_key=True))
    assert "one-queue-per-key-order" not in ids(audit_as(make_app(task_queues=topic, worker_concurrency=1),
                                                         routes_by_key=True))
    assert "one-queue-per-key-order" not in ids(audit_as(make_app(worker_concurrency=2), routes_by_key=True))
    # a catch-all binding with no code sending a key per call (Taiga's task.#) promises no order per key
    assert "one-queue-per-key-order" not in ids(audit_as(make_app(task_queues=topic, worker_concurrency=2),
                                                         routes_by_key=False))


def test_one_topic_queue_for_every_key_on_a_redis_broker() -> None:
    """The write-up of case study 3 on its own broker: kombu's Redis transport routes a topic exchange to one list."""
    topic = [Queue("q", Exchange("q.lots", type="topic"), routing_key="lot.#")]
    found = [f for f in audit_as(make_app(broker=REDIS, task_queues=topic, worker_concurrency=2), routes_by_key=True)
             if f.rule.id == "one-queue-per-key-order"]
    assert len(found) == 1 and found[0].consequence.startswith("One Redis list")
    assert "one-queue-per-key-order" not in ids(audit_as(make_app(broker=REDIS, task_queues=topic, worker_concurrency=1),
                                                         routes_by_key=True))
    assert "one-queue-per-key-order" not in ids(audit_as(make_app(broker="memory://", task_queues=topic,
                                                                  worker_concurrency=2), routes_by_key=True))


# ---- where a task's option comes from ------------------------------------------------------


def test_an_option_the_task_sets_itself_is_the_tasks() -> None:
    app = make_app()

    @app.task(shared=False, acks_late=False)
    def t() -> None: ...

    option = next(x for x in facts_of(app).tasks if x.name == t.name).options["acks_late"]
    assert (option.value, option.source, option.setting) == (False, "task", "task_acks_late")


def test_an_option_from_the_apps_setting_is_the_settings() -> None:
    app = make_app(task_acks_late=False)
    option = facts_of(app).tasks[0].options["acks_late"]
    assert (option.value, option.source) == (False, "setting")


def test_celerys_default_is_named_as_such() -> None:
    app: Celery[Any] = Celery(f"audit_t{next(_names)}", broker=RABBIT, backend=REDIS, set_as_current=False)

    @app.task(shared=False)
    def t() -> None: ...

    option = facts_of(app).tasks[0].options["acks_late"]
    assert (option.value, option.source) == (False, "default")


def test_rules_by_id_covers_every_rule() -> None:
    assert set(RULES_BY_ID) == {r.id for r in RULES} and len(RULES_BY_ID) == len(RULES)




def test_a_soft_limit_alone_is_no_deadline() -> None:
    f = next(f for f in audit(make_app(task_time_limit=None, task_soft_time_limit=5)) if f.rule.id == "no-deadline")
    assert "Only Celery's soft_time_limit (5s)" in f.consequence


def test_the_apps_time_limit_counts_for_a_task_without_its_own() -> None:
    """5.7 binds task_time_limit to the task; 5.5 and 5.6 give it to the worker's pool: the same limit either way."""
    option = facts_of(make_app(task_time_limit=42)).tasks[0].options["time_limit"]
    assert (option.value, option.source, option.setting) == (42, "setting", "task_time_limit")
