"""The audit's rules: each failure mode the lab proves, as a check on an app's configuration.

A rule has an id, the FM or case study it comes from, a severity, the lab cell whose run proves
its consequence (``fm3 S3``, ``severity_batch SB6 write-up``, claim ``C9``), the command that shows
it, the Celery versions on which that cell holds as stated (``make matrix``, docs/celery-versions.md),
and the fix's settings. A rule no lab run proves yet says so in its proof (``cell`` is None).

Every consequence sentence was read in Celery 5.5.3, 5.6.3 and 5.7.0 (the module and function are
named in docs/audit.md); a rule that needs a setting the installed Celery lacks does not run
(``since``), and a setting the app sets that the installed Celery lacks is a finding of its own.

One piece: the rules' table and their checks sit side by side, so that a rule's words and the condition it
fires on are read together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from audit.facts import (RABBITMQ_CONSUMER_TIMEOUT_DEFAULT, REDIS_VISIBILITY_DEFAULT, AppFacts, Option, QueueFacts,
                         TaskFacts, seconds)

Severity = Literal["high", "medium", "low"]
SEVERITIES: tuple[Severity, ...] = ("low", "medium", "high")
LAB_VERSIONS = ("5.5", "5.6", "5.7")
"""The Celery minors ``make matrix`` runs every cell on."""


@dataclass(frozen=True)
class Proof:
    cell: str | None  # "fm3 S3"; None: no lab run proves it yet
    command: str | None
    versions: tuple[str, ...] = LAB_VERSIONS  # the minors on which the cell holds as the rule states
    note: str = ""


@dataclass(frozen=True)
class Options:
    """What the user tells the audit that configuration cannot: the longest stretch a chord of theirs goes
    with no member returning (from its dispatch to the first return, or between two returns), and the
    ``consumer_timeout`` of their RabbitMQ (AMQP does not carry it; RabbitMQ's default unless told)."""

    chord_gap: float | None = None  # the longest stretch a chord goes with no member returning
    consumer_timeout: float = RABBITMQ_CONSUMER_TIMEOUT_DEFAULT


@dataclass(frozen=True)
class Finding:
    rule: Rule
    where: str
    consequence: str
    severity: Severity
    tasks: tuple[str, ...] = ()
    queue: str | None = None
    setting: str | None = None
    file: str | None = None
    line: int | None = None
    fix: str | None = None  # the fix on this app's broker, when it is not the rule's

    @property
    def fix_here(self) -> str:
        return self.fix or self.rule.fix


Check = Callable[[AppFacts, Options, "Rule"], Iterable[Finding]]


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    origin: str  # "FM-2", "case study severity_batch", "research"
    severity: Severity
    proof: Proof
    fix: str
    check: Check = field(repr=False, compare=False)
    since: tuple[int, int] | None = None  # the Celery version the rule's setting appears in

    def proof_here(self, facts: AppFacts) -> str:
        """The proof, said for the installed Celery."""
        if self.proof.cell is None:
            return f"no lab run proves it yet{': ' + self.proof.note if self.proof.note else ''}"
        minor = ".".join(facts.celery_version.split(".")[:2])
        text = f"{self.proof.cell}"
        if minor in self.proof.versions:
            text += f" (holds on Celery {minor} in make matrix)"
        elif minor in LAB_VERSIONS:
            text += f" (the lab's run does not apply on Celery {minor}: only on {', '.join(self.proof.versions)})"
        else:
            text += f" (run on Celery {', '.join(self.proof.versions)}; the lab does not run {facts.celery_version})"
        return text + (f"; {self.proof.note}" if self.proof.note else "")


# ---- helpers --------------------------------------------------------------------------


def _fm(n: int) -> str:
    return f".venv/bin/python run_all_fms.py --only fm{n} --prove"


def _study(name: str) -> str:
    return f".venv/bin/python run_all_fms.py --case-studies --only {name} --prove"


def _claim(test: str) -> str:
    return f".venv/bin/python -m pytest tests/test_celery_claims.py -k {test}"


def grouped(facts: AppFacts, rule: Rule, hits: list[TaskFacts], option: str, consequence: Callable[[TaskFacts], str],
            severity: Severity | None = None) -> Iterable[Finding]:
    """One finding for every task in ``hits``: those that took ``option`` from the app's setting or Celery's
    default named once, with where the setting was set; each task that set it itself named with its value."""
    if not hits:
        return
    own = [t for t in hits if (o := t.options.get(option)) is not None and o.source == "task"]
    shared = [t for t in hits if t not in own]
    parts: list[str] = []
    setting: str | None = None
    file: str | None = None
    line: int | None = None
    if shared:
        o = shared[0].options.get(option) or Option(None, "default")
        setting = o.setting or option
        parts.append(f"setting {setting}={o.value!r} ({facts.how(setting)}): {len(shared)} task(s)")
        file, line = facts.place(setting)
    parts += [f"task {t.name} ({option}={t.opt(option)!r})" for t in own]
    if file is None and own:
        file, line = own[0].file, own[0].line
    yield Finding(rule, "; ".join(parts), consequence((shared or own)[0]), severity or rule.severity,
                  tuple(t.name for t in [*shared, *own]), None, setting, file, line)


def queue_finding(facts: AppFacts, rule: Rule, q: QueueFacts, tasks: list[TaskFacts], consequence: str,
                  severity: Severity | None = None, hints: tuple[str, ...] = ("x-delivery-limit", "task_queues")) -> Finding:
    """A finding on queue ``q``; its line is the first of ``hints`` the app's module names."""
    line = next((facts.setting_lines[h] for h in hints if h in facts.setting_lines), None)
    file = facts.file
    if line is None:  # not named in the app's module: where a settings module or class sets it, else the app's line
        outside = next((h for h in hints if h in facts.origins and facts.origins[h].file not in (None, facts.file)), None)
        file, line = facts.place(outside) if outside else (facts.file, facts.line_of(""))
    return Finding(rule, f"queue {q.name} ({_kind(facts, q)}): {len(tasks)} task(s)", consequence,
                   severity or rule.severity, tuple(t.name for t in tasks), q.name, None, file, line)


def _kind(facts: AppFacts, q: QueueFacts) -> str:
    if facts.broker_kind == "redis":
        return "a Redis list"
    kind = "quorum" if q.quorum else "classic"
    limit = f", x-delivery-limit {q.delivery_limit}" if q.delivery_limit is not None else ""
    return f"{kind}{limit}, {q.exchange_type} exchange"


def by_queue(facts: AppFacts, tasks: Iterable[TaskFacts]) -> dict[str, list[TaskFacts]]:
    found: dict[str, list[TaskFacts]] = {}
    for t in tasks:
        found.setdefault(t.queue or facts.default_queue, []).append(t)
    return found


def limit_of(facts: AppFacts, t: TaskFacts) -> float | None:
    """The task's time_limit as its pool applies it: None where the pool drops it (threads, solo, eventlet)."""
    return None if facts.pool in LIMITLESS_POOLS else seconds(t.opt("time_limit"))


def soft_limit_fires(facts: AppFacts) -> bool:
    """Only the prefork pool sends Celery's soft limit (billiard's SIGUSR1 on its timer)."""
    return facts.pool == "prefork"


def worker_lost_retried(facts: AppFacts, t: TaskFacts) -> bool:
    return facts.celery_minor >= (5, 7) and bool(t.opt("retry_on_worker_lost"))


# ---- FM-2 -----------------------------------------------------------------------------


def check_acks_early(facts: AppFacts, _: Options, rule: Rule) -> Iterable[Finding]:
    hits = [t for t in facts.tasks if not t.opt("acks_late") and not worker_lost_retried(facts, t)]
    return grouped(facts, rule, hits, "acks_late", lambda _t: (
        "The worker acks the message as soon as a pool process takes it, so a process that dies mid-task "
        "(an OOM kill, a SIGKILL) loses it: the task fails with WorkerLostError and never runs again."))


def check_acks_late_without_reject(facts: AppFacts, _: Options, rule: Rule) -> Iterable[Finding]:
    """Prefork only: on the threads, gevent, eventlet and solo pools a task runs in the worker's own process,
    so no child dies alone (WorkerLostError): a worker killed whole leaves the message unacked and the
    broker redelivers it."""
    if facts.pool != "prefork":  # no child process to lose: a worker killed whole leaves its messages unacked
        return []
    hits = [t for t in facts.tasks if t.opt("acks_late") and not t.opt("reject_on_worker_lost")
            and not worker_lost_retried(facts, t)]

    def say(t: TaskFacts) -> str:
        how = "acked" if t.opt("acks_on_failure") is not False else "rejected without requeue"
        return (f"Acks late without reject on worker lost: a process that dies mid-task has its message {how} "
                "and the task fails with WorkerLostError, so it never runs again.")

    return grouped(facts, rule, hits, "reject_on_worker_lost", say)


def check_retry_on_worker_lost(facts: AppFacts, _: Options, rule: Rule) -> Iterable[Finding]:
    hits = [t for t in facts.tasks if worker_lost_retried(facts, t)]
    def say(t: TaskFacts) -> str:
        if t.opt("max_retries") is None:
            return ("A task whose process dies is sent again as Task.retry would, and with max_retries None without "
                    "end: a message that kills its process every time takes a pool slot on every delivery, for ever.")
        return (f"A task whose process dies is sent again as Task.retry would, up to max_retries ({t.opt('max_retries')}); "
                "then it fails with WorkerLostError, so a poison message in a chord fails the chord with ChordError.")

    return grouped(facts, rule, hits, "retry_on_worker_lost", say)


# ---- FM-3 -----------------------------------------------------------------------------


def _requeued(facts: AppFacts) -> list[TaskFacts]:
    return [t for t in facts.tasks if t.opt("acks_late") and t.opt("reject_on_worker_lost")
            and not worker_lost_retried(facts, t)]


REQUEUE_HINTS = ("x-delivery-limit", "task_queues", "task_reject_on_worker_lost")
REDIS_REDELIVERY_FIX = (
    "a Redis broker counts no deliveries, so the bound is the app's: on Celery 5.7, task_retry_on_worker_lost with "
    "max_retries in place of reject_on_worker_lost (each death a counted retry, then FAILURE: "
    "retry-on-worker-lost-fails-chord); or a delivery counter of the task's own, kept where its idempotency claim is "
    "(FM-4), that records the message as a failed result once it passes a bound; or a RabbitMQ broker with a quorum "
    "queue's x-delivery-limit and dead-letter exchange (FM-3)")


def check_unbounded_redelivery(facts: AppFacts, _: Options, rule: Rule) -> Iterable[Finding]:
    for name, tasks in sorted(by_queue(facts, _requeued(facts)).items()):
        q = facts.queues.get(name) or QueueFacts(name, {}, name, "direct", name)
        if facts.broker_kind == "redis":
            f = queue_finding(facts, rule, q, tasks, (
                "Reject on worker lost requeues a message whose process died, and kombu's Redis transport has no "
                "delivery limit: a message that kills its process on every delivery is delivered again without end, "
                "taking a pool slot each time" + (", and its chord never completes." if facts.uses_chords else ".")),
                hints=REQUEUE_HINTS)
            yield dataclasses.replace(f, fix=REDIS_REDELIVERY_FIX)
        elif facts.broker_kind == "rabbitmq" and q.delivery_limit is None:
            extra = (" (RabbitMQ 4.0 and later give a quorum queue a limit of 20 unless one is set)" if q.quorum
                     else " (a classic queue has no delivery limit)")
            yield queue_finding(facts, rule, q, tasks, (
                "Reject on worker lost requeues a message whose process died and this queue sets no x-delivery-limit"
                f"{extra}: a message that kills its process on every delivery is delivered again without end, "
                "taking a pool slot each time, and its chord never completes."), hints=REQUEUE_HINTS)


def check_limit_without_dlx(facts: AppFacts, _: Options, rule: Rule) -> Iterable[Finding]:
    if facts.broker_kind != "rabbitmq":
        return
    for name, tasks in sorted(by_queue(facts, facts.tasks).items()):
        q = facts.queues.get(name)
        if q is not None and q.delivery_limit is not None and q.dead_letter_exchange is None:
            yield queue_finding(facts, rule, q, tasks, (
                f"A message delivered more than x-delivery-limit ({q.delivery_limit}) times is dropped, since the queue "
                "has no x-dead-letter-exchange: the task is never stored, and a chord it belongs to never completes."))


def check_prefetch_over_limit(facts: AppFacts, _: Options, rule: Rule) -> Iterable[Finding]:
    raw = facts.settings.get("worker_prefetch_multiplier")
    multiplier = int(raw) if isinstance(raw, int | float) else 4
    if facts.broker_kind != "rabbitmq" or multiplier == 1:
        return
    held = f"up to {multiplier} messages per process" if multiplier > 1 else "every message it can get (0: no limit)"
    for name, tasks in sorted(by_queue(facts, facts.tasks).items()):
        q = facts.queues.get(name)
        if q is None or q.delivery_limit is None:
            continue
        yield queue_finding(facts, rule, q, tasks, (
            f"With worker_prefetch_multiplier {multiplier} the worker holds {held}, most of them not started, "
            "and a worker that stops (a deploy, an OOM kill) returns them all; RabbitMQ 3.10 to 4.2 counts each "
            f"return against x-delivery-limit {q.delivery_limit}, so {q.delivery_limit + 1} such losses dead-letter "
            "a message that never ran."), hints=("worker_prefetch_multiplier", "x-delivery-limit", "task_queues"))


# ---- FM-5 -----------------------------------------------------------------------------


def check_countdown_on_quorum_direct(facts: AppFacts, _: Options, rule: Rule) -> Iterable[Finding]:
    if facts.broker_kind != "rabbitmq" or not any(q.quorum for q in facts.queues.values()):
        return
    for name, tasks in sorted(by_queue(facts, [t for t in facts.tasks if t.autoretry_for]).items()):
        q = facts.queues.get(name) or QueueFacts(name, {}, name, "direct", name)
        if q.exchange_type != "direct":
            continue
        yield queue_finding(facts, rule, q, tasks, (
            "Celery cannot delay a countdown retry through a direct exchange by native delayed delivery, so each "
            "retry of autoretry_for is an ETA message the worker holds unacked until it is due; with a quorum queue "
            "the prefetch is static, and a burst of waiting retries fills it while new work waits behind them."))


def check_retries_exhausted(facts: AppFacts, _: Options, rule: Rule) -> Iterable[Finding]:
    """Only where the last failure ends a chord: an app that builds chords, a task whose result is stored. A
    fire-and-forget task that exhausts its retries fails as Celery documents, which the audit does not restate."""
    if not facts.uses_chords:
        return
    hits = [t for t in facts.tasks if t.autoretry_for and not t.opt("ignore_result")]
    if not hits:
        return
    first = hits[0]
    yield Finding(rule, "; ".join(f"task {t.name} (autoretry_for={', '.join(t.autoretry_for)}, max_retries={t.retry_max})"
                                  for t in hits), (
        "When its retries run out Celery raises the last error and the task is stored FAILURE: as a member of one "
        "of the app's chords it fails the chord with ChordError and the body never runs."),
        rule.severity, tuple(t.name for t in hits), first.queue, None, first.file, first.line)


# ---- FM-6 -----------------------------------------------------------------------------


def check_no_deadline(facts: AppFacts, options: Options, rule: Rule) -> Iterable[Finding]:
    hits = [t for t in facts.tasks if limit_of(facts, t) is None and t.body_deadline is None]

    def say(t: TaskFacts) -> str:
        if t.opt("time_limit") is not None:
            text = (f"The {facts.pool} pool drops this task's time_limit ({t.opt('time_limit')}s) and nothing else ends "
                    "a run: a body that hangs pins its slot for as long as it hangs.")
        elif t.opt("soft_time_limit") is not None and not soft_limit_fires(facts):
            text = (f"Only a soft_time_limit ({t.opt('soft_time_limit')}s), which the {facts.pool} pool never sends, "
                    "bounds this task: a body that hangs pins its slot for as long as it hangs.")
        elif t.opt("soft_time_limit") is not None:
            text = (f"Only Celery's soft_time_limit ({t.opt('soft_time_limit')}s) asks a run of this task to stop, "
                    "and nothing makes it: a body that catches the exception, or spins in C code, pins its pool slot "
                    "for as long as it runs.")
        else:
            text = ("No time_limit or in-body deadline ends a run of this task: a body that hangs (a call with no "
                    "timeout, a lock never released) pins its pool slot for as long as it hangs.")
        if facts.uses_chords:
            text += " As a chord member it keeps the chord's body from running."
        if facts.broker_kind == "rabbitmq" and t.opt("acks_late"):  # one root cause: time-limit-above-consumer-timeout
            text += (f" Acks late on RabbitMQ, a run past the broker's consumer_timeout ({options.consumer_timeout:g}s) "
                     "also has its channel closed (406) and its message delivered again (FM-9).")
        return text

    return grouped(facts, rule, hits, "time_limit", say)


def check_time_limit_fails_chord(facts: AppFacts, _: Options, rule: Rule) -> Iterable[Finding]:
    if not facts.uses_chords:  # FAILURE is what a time limit is for; it costs more only as a chord member
        return []
    hits = [t for t in facts.tasks if limit_of(facts, t) is not None and not t.request_handles_timeout]
    return grouped(facts, rule, hits, "time_limit", lambda t: (
        f"When Celery's time_limit ({t.opt('time_limit')}s) kills the process, the task is stored FAILURE "
        "(TimeLimitExceeded): as a chord member it fails the chord with ChordError and the body never runs."))


def check_celery_soft_limit(facts: AppFacts, _: Options, rule: Rule) -> Iterable[Finding]:
    if not soft_limit_fires(facts):  # pool-cannot-apply-deadlines says the soft limit never fires there
        return []
    hits = [t for t in facts.tasks if t.opt("soft_time_limit") is not None]
    return grouped(facts, rule, hits, "soft_time_limit", lambda t: (
        f"Celery's soft_time_limit ({t.opt('soft_time_limit')}s) is a signal sent on a timer of the main process: "
        "it can land after the body returned, while the result is stored, and the task is then stored FAILURE "
        "(SoftTimeLimitExceeded); a body that catches Exception swallows it."))


# ---- Redis broker, result expiry, backend ------------------------------------------------


def _visibility(facts: AppFacts) -> float:
    options: object = facts.settings.get("broker_transport_options") or {}
    found = seconds(cast(dict[str, Any], options).get("visibility_timeout")) if isinstance(options, dict) else None
    return found if found is not None else REDIS_VISIBILITY_DEFAULT


def check_visibility_timeout(facts: AppFacts, _: Options, rule: Rule) -> Iterable[Finding]:
    if facts.broker_kind != "redis":
        return
    visibility = _visibility(facts)
    for t in facts.tasks:
        late = bool(t.opt("acks_late"))
        limit = limit_of(facts, t)
        countdown = t.retry_countdown or 0.0
        if late and limit is None:
            none = "no time_limit" if t.opt("time_limit") is None else f"its time_limit dropped by the {facts.pool} pool"
            yield Finding(rule, f"task {t.name} (acks late, {none}; visibility_timeout {visibility:g}s)", (
                f"On a Redis broker a message not acked visibility_timeout ({visibility:g}s) after delivery is "
                "delivered again: nothing bounds this acks-late task's run, so a run longer than that runs twice, "
                "at once, in two processes."), "medium", (t.name,), t.queue, "visibility_timeout", t.file, t.line)
            continue
        need = (limit if late and limit is not None else 0.0) + countdown
        if need and need >= visibility:
            parts = " + ".join(p for p in (f"time_limit {limit:g}s" if late and limit else "",
                                          f"retry countdown {countdown:g}s" if countdown else "") if p)
            yield Finding(rule, f"task {t.name} ({parts}; visibility_timeout {visibility:g}s)", (
                f"On a Redis broker a message not acked visibility_timeout ({visibility:g}s) after delivery is "
                f"delivered again, and a message of this task can stay unacked for {need:g}s ({parts}: a retry "
                "waits for its countdown in the worker, then runs before its ack): it can run twice, at once."), rule.severity, (t.name,), t.queue, "visibility_timeout", t.file, t.line)


CHORD_COUNTER_BACKENDS = ("redis", "rediss", "sentinel")


def chord_expiry(facts: AppFacts) -> tuple[str, float | None]:
    """The setting that bounds a chord's keys in the Redis backend, and its seconds (None or 0: never expire)."""
    chord = seconds(facts.settings.get("result_chord_expires")) if facts.has_setting("result_chord_expires") else None
    if chord is not None:
        return "result_chord_expires", chord
    return "result_expires", seconds(facts.settings.get("result_expires"))


def member_bound(facts: AppFacts, t: TaskFacts) -> float | None:
    """How long one run of ``t`` can take from its first start to its return, by its configuration: every attempt
    at its time_limit plus every retry's countdown; None when nothing bounds an attempt."""
    limit = limit_of(facts, t)
    if limit is None:
        return None
    retries = (t.retry_max or 0) if t.autoretry_for else 0
    return limit * (retries + 1) + retries * (t.retry_countdown or 0.0)


def check_chord_expires(facts: AppFacts, options: Options, rule: Rule) -> Iterable[Finding]:
    """The Redis backend renews the chord's keys' expiry at every member's return (5.7's CHORD_PART_RETURN_LUA;
    5.5 and 5.6 expire them in on_chord_part_return's pipeline), so what must stay below the expiry is the
    longest stretch with no return: dispatch to first return (queue wait and countdowns included), or between
    two returns. Configuration cannot say how long that is, but it can bound one part of it: a straggler that
    starts with the others and runs every attempt to its time_limit returns that long after them. Given
    --chord-gap, the rule compares the expiry with it; else with that bound, where every member has one."""
    if facts.backend_kind not in CHORD_COUNTER_BACKENDS:
        return
    name, value = chord_expiry(facts)
    if not value:  # 0 or None: never expires
        return
    note = "" if facts.has_setting("result_chord_expires") else " (Celery before 5.7 has no result_chord_expires)"
    file, line = facts.place(name)
    if options.chord_gap is not None:
        if value >= options.chord_gap:
            return
        yield Finding(rule, f"setting {name}={value:g}s ({facts.how(name)}), a chord goes {options.chord_gap:g}s with "
                      f"no member returning{note}", (
            f"The Redis backend sets the chord's keys (its size and join counter) to expire {value:g}s ({name}) after "
            "the last member's return, or after the dispatch before the first: a stretch of "
            f"{options.chord_gap:g}s with no return outlives them, the members after it find the counter gone, and "
            "the body never runs."), rule.severity, (), None, name, file, line)
        return
    if not facts.uses_chords:
        return
    bounds = [(t, b) for t in facts.tasks if not t.opt("ignore_result") and (b := member_bound(facts, t)) is not None
              and b > value]
    if not bounds:
        return
    slow = max(bounds, key=lambda tb: tb[1])
    parts = "; ".join(f"task {t.name} (up to {b:g}s)" for t, b in bounds)
    yield Finding(rule, f"setting {name}={value:g}s ({facts.how(name)}) below a member's longest run: {parts}{note}", (
        f"A chord member of {slow[0].name} can return up to {slow[1]:g}s after it starts (every attempt at its "
        f"time_limit, and its retries' countdowns), while the Redis backend lets the chord's keys expire {value:g}s "
        f"({name}) after the last return: a straggler that starts with the others and runs that long finds the "
        "counter gone when it returns, and the body never runs (queue wait would only add to it)."),
        rule.severity, tuple(t.name for t, _ in bounds), None, name, file, line)


def check_rpc_chords(facts: AppFacts, _: Options, rule: Rule) -> Iterable[Finding]:
    if facts.backend_kind == "rpc":
        yield Finding(rule, "setting result_backend=rpc://", (
            "Celery refuses chords on the rpc result backend (RPCBackend.ensure_chords_allowed raises "
            "NotImplementedError), so applying a chord, or a group chained to a task, fails."),
            rule.severity, (), None, "result_backend", *facts.place("result_backend"))


# ---- FM-7 -----------------------------------------------------------------------------


def check_warm_shutdown_only(facts: AppFacts, _: Options, rule: Rule) -> Iterable[Finding]:
    raw = facts.settings.get("worker_soft_shutdown_timeout")
    if isinstance(raw, int | float) and raw > 0:
        return  # the soft wait runs on a cold shutdown only: REMAP_SIGTERM decides, which cannot_tell says
    hits = [t for t in facts.tasks if t.opt("acks_late")]
    if hits:
        file, line = facts.place("worker_soft_shutdown_timeout")
        yield Finding(rule, f"setting worker_soft_shutdown_timeout={raw!r} "
                      f"({facts.how('worker_soft_shutdown_timeout')}): {len(hits)} acks-late task(s)", (
            "SIGTERM is Celery's warm shutdown, which waits for every running task however long it runs: a deploy "
            "whose grace period is shorter than a task SIGKILLs it mid-body, so its work is lost and done again, "
            "and every message the worker held goes back, each return counted against a delivery limit."),
            rule.severity, tuple(t.name for t in hits), None, "worker_soft_shutdown_timeout", file, line)


# ---- FM-8 -----------------------------------------------------------------------------

STORE_BACKENDS_EXCLUDED = ("disabled", "rpc")
"""No store that can go away apart from the broker: nothing to store, or results sent through the broker itself."""


def check_unstored_result(facts: AppFacts, _: Options, rule: Rule) -> Iterable[Finding]:
    if facts.backend_kind in STORE_BACKENDS_EXCLUDED or not facts.uses_chords:
        return  # an unstored result costs a chord its completion; with no chord nothing waits on it that config shows
    stored = [t for t in facts.tasks if t.opt("acks_late") and not t.opt("ignore_result")]
    acked: list[TaskFacts] = []
    rejected: list[TaskFacts] = []
    dropped: list[TaskFacts] = []
    for t in stored:
        q = facts.queues.get(t.queue or facts.default_queue)
        dead_letters = facts.broker_kind == "rabbitmq" and q is not None and q.dead_letter_exchange is not None
        if facts.backend_guards_store:
            if not dead_letters and not facts.backend_requeues_unstored:
                dropped.append(t)
        elif t.opt("acks_on_failure") is False:
            rejected.append(t)
        else:
            acked.append(t)
    yield from grouped(facts, rule, acked, "acks_on_failure", lambda _t: (
        "Celery stores a task's result after its body returned (celery.app.trace); a result backend that does not "
        "answer then is a failure outside the body, and Request.on_failure acks the late-acked message "
        "(acks_on_failure, True): the work is done, its outcome is stored nowhere, nothing runs it again, and a "
        "chord it belongs to stays PENDING for ever."))
    yield from grouped(facts, rule, rejected, "acks_on_failure", lambda _t: (
        "An unstorable result rejects the message without requeue here (acks_on_failure False): dead-lettered if "
        "its queue has a dead-letter exchange, else dropped. But Celery still stores the task's FAILURE, in the pool "
        "and in the main process, each with the backend's retries: a backend back within them records a member "
        "that succeeded as failed, and its chord fails with ChordError."), severity="medium")
    if dropped:
        yield Finding(rule, f"result backend {facts.backend_class} (guards its store): {len(dropped)} task(s) whose "
                      "queue has no dead-letter exchange", (
                          "The backend's guard rejects a message whose result it cannot store, without requeue; "
                          "this task's queue has no dead-letter exchange (or the broker is not RabbitMQ), so the "
                          "message is dropped: its outcome is stored nowhere and nothing runs it again (on such a "
                          "broker, a guard that rejects with requeue keeps it)."),
                      rule.severity, tuple(t.name for t in dropped), None, "result_backend",
                      *facts.place("result_backend"))


# ---- FM-9 -----------------------------------------------------------------------------


def _late(facts: AppFacts) -> list[TaskFacts]:
    return [t for t in facts.tasks if t.opt("acks_late")]


def _setting_finding(facts: AppFacts, rule: Rule, setting: str, tasks: list[TaskFacts], consequence: str,
                     what: str = "acks-late task(s)") -> Finding:
    value = facts.settings.get(setting)
    return Finding(rule, f"setting {setting}={value!r} ({facts.how(setting)}): {len(tasks)} {what}", consequence,
                   rule.severity, tuple(t.name for t in tasks), None, setting, *facts.place(setting))


def check_connection_loss(facts: AppFacts, _: Options, rule: Rule) -> Iterable[Finding]:
    hits = _late(facts)
    if facts.broker_kind != "rabbitmq" or facts.settings.get("worker_cancel_long_running_tasks_on_connection_loss") or not hits:
        return
    yield _setting_finding(facts, rule, "worker_cancel_long_running_tasks_on_connection_loss", hits, (
        "When the worker's broker connection drops (a blip, a failover), RabbitMQ requeues every message it held "
        "unacked, and Celery reconnects but leaves the running acks-late tasks running "
        "(Consumer.on_connection_error_after_connected): the requeued message comes back while the first run goes "
        "on, whose ack can no longer be sent, and runs a second time (beside the first in the lab's runs on 5.6 and "
        "5.7; after it on 5.5, where only a task already stored is skipped)."))


def check_channel_error(facts: AppFacts, _: Options, rule: Rule) -> Iterable[Finding]:
    hits = _late(facts)
    if facts.broker_kind != "rabbitmq" or facts.settings.get("broker_channel_error_retry") or not hits:
        return
    yield _setting_finding(facts, rule, "broker_channel_error_retry", hits, (
        "Celery's consumer recovers from connection errors only, unless broker_channel_error_retry "
        "(Consumer.start): a channel the broker closes, such as RabbitMQ's 406 PRECONDITION_FAILED when a delivery "
        "stays unacked past its consumer_timeout, ends the worker; every message it held is requeued, and the "
        "over-long one ends the next worker that takes it the same way."))


def held_in_worker(facts: AppFacts, t: TaskFacts) -> bool:
    """Do the task's configured retries wait as ETA messages in the worker (not in the broker)?"""
    if not t.retries_held_in_worker:
        return False
    quorum = facts.broker_kind == "rabbitmq" and any(q.quorum for q in facts.queues.values())
    q = facts.queues.get(t.queue or facts.default_queue)
    return not (quorum and q is not None and q.exchange_type != "direct")  # native delayed delivery (5.5+)


def check_consumer_timeout(facts: AppFacts, options: Options, rule: Rule) -> Iterable[Finding]:
    if facts.broker_kind != "rabbitmq":
        return
    timeout = options.consumer_timeout
    half = timeout / 2
    for t in facts.tasks:
        late = bool(t.opt("acks_late"))
        limit = limit_of(facts, t)
        countdown = (t.retry_countdown or 0.0) if held_in_worker(facts, t) else 0.0
        if late and limit is None:
            if t.body_deadline is None:
                continue  # no-deadline reports it (one root cause: nothing ends the run), with this consequence
            yield Finding(rule, f"task {t.name} (acks late, no time_limit, in-body deadline {t.body_deadline:g}s; "
                          f"consumer_timeout {timeout:g}s)", (
                              "An in-body deadline is a signal, which cannot interrupt a process stuck in C code, and "
                              "no time_limit kills it: such a run holds its message unacked past the broker's "
                              f"consumer_timeout ({timeout:g}s), RabbitMQ closes the channel (406) and requeues the "
                              "message, and the task runs again while the first run goes on, or the worker exits."),
                          "medium", (t.name,), t.queue, "task_time_limit", t.file, t.line)
            continue
        need = (limit if late and limit is not None else 0.0) + countdown
        if need and need > half:
            parts = " + ".join(p for p in (f"time_limit {limit:g}s" if late and limit else "",
                                          f"retry countdown {countdown:g}s held as an ETA message" if countdown else "")
                               if p)
            past = need >= timeout
            reach = (f"at or past the broker's consumer_timeout ({timeout:g}s)" if past else
                     f"above half the broker's consumer_timeout ({timeout:g}s), the margin its fix keeps for a retry's "
                     "wait and the run after it")
            yield Finding(rule, f"task {t.name} ({parts}; consumer_timeout {timeout:g}s)", (
                f"A message of this task can stay unacked {need:g}s ({parts}: an ETA message is held unacked by the "
                f"worker whether the task acks early or late, and an acks-late run holds its own until it ends), {reach}: "
                "past the timeout RabbitMQ closes the worker's channel (406 PRECONDITION_FAILED) and requeues what it "
                "held; the worker exits unless broker_channel_error_retry, and with it the message runs again while "
                "the first run goes on (a cancel cannot end a process stuck in C code)."),
                rule.severity if past else "medium", (t.name,), t.queue, "task_time_limit", t.file, t.line)


# ---- research: ETA messages held in the worker ------------------------------------------------


def check_eta_limit(facts: AppFacts, _: Options, rule: Rule) -> Iterable[Finding]:
    if facts.settings.get("worker_eta_task_limit") is not None or facts.broker_kind not in ("rabbitmq", "redis"):
        return
    if facts.broker_kind == "rabbitmq" and any(q.quorum for q in facts.queues.values()):
        return  # per-consumer QoS: the prefetch stays static (countdown-retry-on-quorum-direct), or native delay
    hits = [t for t in facts.tasks if held_in_worker(facts, t)]
    if hits and (facts.celery_minor < (5, 6) or not facts.has_setting("worker_eta_task_limit")):
        # the exposure is there before 5.6 too; only the cap is missing: said so, with the fix this Celery allows
        yield Finding(rule, f"Celery {facts.celery_version} has no worker_eta_task_limit (new in 5.6.0): {len(hits)} "
                      "task(s) with retries held in the worker", (
                          "Each waiting retry of these tasks is an ETA message the worker holds unacked in memory "
                          "until it is due, raising its prefetch by one for it (celery.worker.strategy.default: "
                          "qos.increment_eventually), and this Celery has no setting to cap them: a burst of failing "
                          "calls grows the worker's memory and prefetch without bound, and past 65,535 kombu turns "
                          "the prefetch limit off (kombu.common.QoS.set), so the worker takes every message of its "
                          "queues."), rule.severity, tuple(t.name for t in hits), None, "worker_eta_task_limit",
                      hits[0].file, hits[0].line,
                      fix="retries that wait in the broker (shared.retry.transient_retryable(..., wait_in=QUEUE)), or "
                      "Celery 5.6+ with worker_eta_task_limit at the waiting retries one worker may hold")
    elif hits:
        yield _setting_finding(facts, rule, "worker_eta_task_limit", hits, (
            "Each waiting retry of these tasks is an ETA message the worker holds unacked in memory until it is due, "
            "raising its prefetch by one for it (celery.worker.strategy.default: qos.increment_eventually) with no cap "
            "unless worker_eta_task_limit: a burst of failing calls grows the worker's memory and prefetch without "
            "bound, and past 65,535 kombu turns the prefetch limit off (kombu.common.QoS.set), so the worker takes "
            "every message of its queues."), what="task(s) with retries held in the worker")


# ---- FM-6: the pool -----------------------------------------------------------------------

SIGNAL_POOLS = ("threads", "gevent", "eventlet")
REFUSING_POOLS = ("threads", "gevent")
"""Pools where @hard_timeout raises RuntimeError on every run (tried with gevent 26.9.0: its greenlets are not
the main thread as the signal module sees it, exactly as a pool thread is not)."""
"""Pools whose tasks do not each run on a process's main thread: @hard_timeout's SIGALRM is not theirs."""
LIMITLESS_POOLS = ("threads", "solo", "eventlet")
"""Pools whose on_apply drops Celery's time_limit (celery.concurrency.thread, .solo via base.apply_target, .eventlet)."""


def check_pool_deadlines(facts: AppFacts, _: Options, rule: Rule) -> Iterable[Finding]:
    pool = facts.pool
    body_hits = [t for t in facts.tasks if pool in SIGNAL_POOLS and t.body_deadline is not None]
    limit_hits = [t for t in facts.tasks if pool in LIMITLESS_POOLS and t.opt("time_limit") is not None]
    soft_hits = [t for t in facts.tasks if pool != "prefork" and pool != "other" and t.opt("soft_time_limit") is not None]
    if not (body_hits or limit_hits or soft_hits):
        return
    said: list[str] = []
    if body_hits and pool in REFUSING_POOLS:
        said.append(f"The {pool} pool runs each task off the process's main thread (a thread, or a greenlet), and "
                    "@hard_timeout refuses to run there (RuntimeError): every run of "
                    f"{', '.join(t.name for t in body_hits)} fails before its body.")
    elif body_hits:
        said.append(f"The {pool} pool runs its tasks as green threads of one process, and @hard_timeout's deadline is "
                    "that process's one SIGALRM timer and handler: a task that starts replaces the deadline of one still "
                    "running, and the alarm raises in whatever runs when it fires, not in its task.")
    if limit_hits:
        said.append(f"The {pool} pool drops Celery's time_limit (its on_apply ignores the timeout) of "
                    f"{', '.join(t.name for t in limit_hits)}: nothing kills a run stuck in C code, and a time_limit kept "
                    "below a broker's consumer_timeout (FM-9) or a Redis visibility timeout does not hold.")
    if soft_hits:
        said.append(f"Celery's soft_time_limit is a signal only the prefork pool sends: on the {pool} pool the soft "
                    f"limit of {', '.join(t.name for t in soft_hits)} never fires.")
    severity: Severity = "high" if body_hits and pool in REFUSING_POOLS else rule.severity
    tasks = list(dict.fromkeys(t.name for t in [*body_hits, *limit_hits, *soft_hits]))
    value = facts.settings.get("worker_pool")
    file, line = facts.place("worker_pool")
    yield Finding(rule, f"setting worker_pool={value!r} ({facts.how('worker_pool')}; a worker's -P overrides it): "
                  f"{len(tasks)} task(s)", " ".join(said), severity, tuple(tasks), None, "worker_pool", file, line)


# ---- case study: per-key order ----------------------------------------------------------


def check_per_key_order(facts: AppFacts, _: Options, rule: Rule) -> Iterable[Finding]:
    concurrency = facts.settings.get("worker_concurrency")
    if facts.broker_kind not in ("rabbitmq", "redis") or (isinstance(concurrency, int) and concurrency == 1):
        return
    if not facts.routes_by_key:  # a catch-all binding alone (Taiga's task.#) promises no order per key
        return
    for name, tasks in sorted(by_queue(facts, facts.tasks).items()):
        q = facts.queues.get(name)
        if q is None or q.exchange_type != "topic" or not any(c in q.routing_key for c in "#*"):
            continue
        slots = concurrency if isinstance(concurrency, int) else "one per CPU"
        where = ("One Redis list (kombu's topic exchange is a binding table: the routing key picks the list)"
                 if facts.broker_kind == "redis" else "One queue")
        yield queue_finding(facts, rule, q, tasks, (
            f"{where} bound by {q.routing_key!r} carries every key, and its messages are taken by competing pool "
            f"processes ({slots}): two messages of one key can run at once and commit out of order, so an order "
            "per key that the routing key suggests is not kept."), hints=("task_queues", "worker_concurrency"))


# ---- the installed Celery ------------------------------------------------------------------

NEW_IN: dict[str, str] = {
    "result_chord_expires": "5.7.0", "task_retry_on_worker_lost": "5.7.0", "task_acks_on_failure": "5.7.0",
    "task_acks_on_timeout": "5.7.0", "worker_eta_task_limit": "5.6.0", "worker_soft_shutdown_timeout": "5.5.0",
    "worker_enable_soft_shutdown_on_idle": "5.5.0", "task_default_queue_type": "5.5.0",
    "worker_detect_quorum_queues": "5.5.0", "broker_channel_error_retry": "5.3.0",
    "worker_cancel_long_running_tasks_on_connection_loss": "5.1.0",
}


def check_unknown_settings(facts: AppFacts, _: Options, rule: Rule) -> Iterable[Finding]:
    names = [n for n in facts.unknown_settings if not _meant_and_done(facts, n)]
    if not names:
        return
    said: list[str] = []
    for name in names:
        meant = _meant(facts, name)
        since = NEW_IN.get(meant or "")
        said.append(f"{name} (new in Celery {since})" if since else name)
    o = facts.origins.get(names[0])
    file, line = (o.file, o.line) if o is not None and o.file else facts.place(_meant(facts, names[0]) or names[0])
    yield Finding(rule, f"{len(names)} name(s) Celery {facts.celery_version} does not read: {', '.join(said)}", (
        f"Celery {facts.celery_version} reads no setting by these names: each is ignored, and what it was set for "
        "does not happen."), rule.severity, (), None, names[0], file, line)


def _meant(facts: AppFacts, name: str) -> str | None:
    """The setting an unread name looks meant for: its namespace or CELERY prefix dropped, lower-cased."""
    key = name.lower()
    for prefix in ("celery_", "celeryd_", "celerybeat_"):
        if key.startswith(prefix):
            key = key[len(prefix):]
            break
    return key if key in NEW_IN or key in facts.settings else None


def _meant_and_done(facts: AppFacts, name: str) -> bool:
    """An unread name whose setting has the same value anyway (Lemur's CELERY_BROKER_URL, also given to Celery()):
    nothing it was set for is lost."""
    meant = _meant(facts, name)
    return (meant is not None and meant != name and meant in facts.settings
            and facts.settings[meant] == facts.raw_set.get(name))


# ---- the catalogue -----------------------------------------------------------------------

RULES: tuple[Rule, ...] = (
    Rule("acks-early", "tasks acked before they run", "FM-2", "high",
         Proof("fm2 S2", _fm(2)),
         "task_acks_late = True and task_reject_on_worker_lost = True, with a delivery limit and a dead-letter "
         "queue (FM-3)", check_acks_early),
    Rule("acks-late-without-reject-on-worker-lost", "acks late without reject on worker lost", "FM-2", "high",
         Proof("fm2 S2", _fm(2), note="S2 runs with both settings off; fm2_worker_crash.py records that removing "
               "reject_on_worker_lost alone fails G2 the same way (doc3 attempted once)"),
         "task_reject_on_worker_lost = True, with a delivery limit and a dead-letter queue (FM-3)",
         check_acks_late_without_reject),
    Rule("retry-on-worker-lost-fails-chord", "task_retry_on_worker_lost ends in FAILURE", "FM-3", "medium",
         Proof("C5", _claim("test_task_retry_on_worker_lost_bounds_the_poison_loop_and_still_breaks_the_chord"),
               versions=("5.7",)),
         "bound redelivery in the broker instead: a quorum queue with x-delivery-limit and x-dead-letter-exchange, "
         "and a drain that records each dead letter as a result (shared/dlq.py)",
         check_retry_on_worker_lost, since=(5, 7)),
    Rule("unbounded-redelivery", "a poison message is redelivered for ever", "FM-3", "high",
         Proof("fm3 S3", _fm(3), note="the lab's broker is RabbitMQ 3.x"),
         "the task queue a quorum queue with x-delivery-limit and x-dead-letter-exchange, and a drain that records "
         "each dead letter as a result so its chord completes (shared/dlq.py)", check_unbounded_redelivery),
    Rule("delivery-limit-without-dead-letter-exchange", "a delivery limit with nowhere to dead-letter", "FM-3", "high",
         Proof(None, None, note="RabbitMQ's quorum-queue documentation; the lab always sets both (fm3 G3)"),
         "x-dead-letter-exchange and x-dead-letter-routing-key on the queue, a dead-letter queue declared with it "
         "(shared.dlq.DeadLetteringQueue), and a drain", check_limit_without_dlx),
    Rule("prefetch-above-delivery-limit", "prefetched messages spend their deliveries", "research: rolling deploys (FM-7)",
         "medium", Proof("C19", _claim("test_with_the_default_prefetch_three_deploys_dead_letter_messages_that_never_ran"),
                         note="C9 shows the same for a worker killed whole"),
         "worker_prefetch_multiplier = 1, and x-delivery-limit above the whole-worker losses a message may live "
         "through", check_prefetch_over_limit),
    Rule("warm-shutdown-only", "a deploy's SIGKILL cuts acks-late tasks mid-body", "FM-7", "medium",
         Proof("fm7 S7", _fm(7)),
         "worker_soft_shutdown_timeout (5.5+) and REMAP_SIGTERM=SIGQUIT in the worker's environment, so that SIGTERM "
         "cancels running tasks after the soft wait and their messages go back unacked; a grace period above the "
         "soft timeout, one task and Celery's own stop (claim C18); the drain's send_back for letters a deploy "
         "charged (fm7_rolling_deploys.py)", check_warm_shutdown_only, since=(5, 5)),
    Rule("unstored-result-acked", "a result the backend cannot store is acked and lost", "FM-8", "high",
         Proof("fm8 S8", _fm(8), note="S8 runs fm7, whose acks_on_failure is True (Celery's default); with it False and "
               "no guard, fm8_backend_outage.py records the chord failing one run in two on 5.6.3 (seen, not a lab "
               "cell); a guard's reject with no dead-letter exchange is read in Request.on_failure, not run"),
         "shared.backend.reject_unstored(app): a task whose own result the Redis backend cannot store raises a Reject "
         "without requeue, so Request.on_failure rejects its message into the queue's dead-letter exchange (FM-3) "
         "with nothing acked or stored; and a drain that sends such letters back once the backend answers "
         "(shared.dlq.drain(..., send_back_rejected=True)). task_acks_on_failure = False (5.7; "
         "task_acks_on_failure_or_timeout = False on 5.5 and 5.6) alone is not enough: Celery still stores the "
         "member's FAILURE, with the backend's retries, and a backend back within them fails the chord "
         "(fm8_backend_outage.py). A Redis broker has no dead-letter exchange: there the guard's reject without "
         "requeue drops the message; reject_unstored(app, requeue=True) sends it back to its queue instead, where it "
         "runs again at once while the backend is gone (tests/test_backend_requeue.py)", check_unstored_result),
    Rule("connection-loss-leaves-tasks-running", "a lost connection leaves acks-late tasks running", "FM-9", "high",
         Proof("fm9 S9", _fm(9), note="side connloss: the lab cuts the worker's own link to a RabbitMQ node of its "
               "own; the running member is not stopped: its copy runs beside it (seen on 5.6 and 5.7), or it runs on to "
               "its end with its message already given back, its ack lost (seen on 5.5, where the copy waited)"),
         "worker_cancel_long_running_tasks_on_connection_loss = True (Celery 5.1+; the default from 6.0): the worker "
         "cancels its running acks-late tasks when the connection drops, and the requeued message runs once more, from "
         "the start (make the work idempotent, FM-4); with broker_channel_error_retry and time limits below the "
         "consumer_timeout (fm9_connection_loss.py)", check_connection_loss, since=(5, 1)),
    Rule("channel-error-ends-worker", "a channel the broker closes ends the worker", "FM-9", "medium",
         Proof("fm9 S9", _fm(9), note="S9's side overlong: a member past the lab node's consumer_timeout, 406, "
               "and the worker exits (status 1); this part held on 5.5.3, 5.6.3 and 5.7.0"),
         "broker_channel_error_retry = True (Celery 5.3+): a channel the broker closed is a reconnect, not the end of "
         "the worker; with worker_cancel_long_running_tasks_on_connection_loss and time limits below the "
         "consumer_timeout (fm9_connection_loss.py)", check_channel_error, since=(5, 3)),
    Rule("time-limit-above-consumer-timeout", "a task may hold its message past RabbitMQ's consumer_timeout", "FM-9",
         "high", Proof("fm9 S9 hard", _fm(9),
                       note="fm9w: fm6's 3 s time_limit above the lab node's 2.4 s consumer_timeout, both FM-9 settings "
                       "on (in one run on 5.7.0 beside another lab run the redelivered member waited for a process until the "
                       "kill had stored its envelope, and FM-7's deduplication skipped it); the retry countdown's part "
                       "is read (celery.worker.strategy.default holds an ETA message unacked), "
                       "not run"),
         "a time_limit on every acks-late task at most half the broker's consumer_timeout, retry countdowns held in the "
         "worker counted in (shared.consumer_timeout.within_consumer_timeout(app, seconds) lowers them at import); "
         "give the audit your broker's with --consumer-timeout", check_consumer_timeout),
    Rule("countdown-retry-on-quorum-direct", "countdown retries held in the worker on a quorum queue", "FM-5",
         "medium", Proof("fm5 S5 hard", _fm(5)),
         "retries that wait in the broker (per-message TTL delay queues that dead-letter back: "
         "shared.retry.transient_retryable(..., wait_in=QUEUE)), or a topic exchange for Celery's native delayed "
         "delivery", check_countdown_on_quorum_direct),
    Rule("eta-without-task-limit", "waiting retries held in the worker without a cap",
         "research: ETA tasks held in the worker", "medium",
         Proof(None, None, note="read in celery.worker.strategy.default (qos.increment_eventually per ETA message), "
               "celery.worker.consumer.tasks.Tasks.start (worker_eta_task_limit caps it) and kombu.common.QoS.set "
               "(past 65,535 the limit is turned off); celery#2218, #3267, #9849; no lab run shows the unbounded hold"),
         "worker_eta_task_limit (5.6+) at the waiting retries one worker may hold, or retries that wait in the broker "
         "(shared.retry.transient_retryable(..., wait_in=QUEUE))", check_eta_limit),
    Rule("retries-exhausted-fail", "retries that run out fail the task", "case study severity_batch",
         "medium", Proof("severity_batch SB5 write-up", _study("severity_batch")),
         "record the last failure as a result the chord counts (shared.envelope.enveloped over "
         "shared.retry.transient_retryable), or dead-letter it where a replay finds it", check_retries_exhausted),
    Rule("no-deadline", "nothing ends a hung task", "FM-6", "medium", Proof("fm6 S6", _fm(6)),
         "an in-body deadline (shared.timeouts.hard_timeout) below a time_limit kept as the backstop, with "
         "Request=shared.timeouts.BackstopRequest (acks late on RabbitMQ: the time_limit at most half the broker's "
         "consumer_timeout, FM-9)", check_no_deadline),
    Rule("time-limit-fails-chord", "Celery's time_limit stores FAILURE", "FM-6", "medium",
         Proof("C1", _claim("test_celery_time_limit_alone_fails_the_chord")),
         "Request=shared.timeouts.BackstopRequest (records the kill as a result and acks), and an in-body deadline "
         "below the time_limit", check_time_limit_fails_chord),
    Rule("celery-soft-time-limit", "Celery's soft limit lands outside the body", "FM-6", "medium",
         Proof("fm6 S6 hard", _fm(6)),
         "drop soft_time_limit; an in-body deadline started and cancelled with the body "
         "(shared.timeouts.hard_timeout(seconds, soft=...))", check_celery_soft_limit),
    Rule("pool-cannot-apply-deadlines", "the app's pool cannot apply its tasks' deadlines", "FM-6", "medium",
         Proof(None, None, note="read in shared.timeouts.hard_timeout (main thread only; one SIGALRM timer per "
               "process) and celery.concurrency (thread.TaskPool.on_apply, base.apply_target for solo, "
               "eventlet.TaskPool.on_apply drop the timeout); every lab run uses the prefork pool"),
         "the prefork pool (worker_pool = 'prefork', and no other -P on the worker), where each task runs on a "
         "process's main thread and billiard kills a run at its time_limit", check_pool_deadlines),
    Rule("visibility-timeout-below-run", "a Redis broker redelivers a task still running",
         "case study bl_ingestion", "high", Proof("bl_ingestion BL8 write-up", _study("bl_ingestion")),
         "broker_transport_options visibility_timeout above the longest time_limit plus the longest retry countdown, "
         "and a time_limit on every acks-late task", check_visibility_timeout),
    Rule("chord-outlives-result-expires", "the chord's state expires before the chord ends",
         "case study severity_batch", "high", Proof("severity_batch SB6 write-up", _study("severity_batch")),
         "result_chord_expires (Celery 5.7+) or, before 5.7, result_expires above the longest chord run",
         check_chord_expires),
    Rule("chord-on-rpc-backend", "chords on the rpc result backend", "case study severity_batch", "high",
         Proof(None, None, note="read in celery.backends.rpc.RPCBackend.ensure_chords_allowed, 5.5.3 to 5.7.0"),
         "a result backend that supports chords (Redis)", check_rpc_chords),
    Rule("one-queue-per-key-order", "one queue for every key does not keep order per key",
         "case study cte_ingestion", "medium", Proof("cte_ingestion CT2 write-up", _study("cte_ingestion")),
         "a queue per shard of keys, each consumed by one process (worker_concurrency = 1 on its worker)",
         check_per_key_order),
    Rule("setting-not-in-this-celery", "a setting the installed Celery does not have", "Celery versions", "low",
         Proof(None, None, note="the installed Celery's celery.app.defaults has no such setting"),
         "upgrade Celery, or the fix for this version (docs/celery-versions.md)", check_unknown_settings),
)

RULES_BY_ID = {r.id: r for r in RULES}


def run_rules(facts: AppFacts, options: Options, rules: Iterable[Rule] = RULES) -> list[Finding]:
    """Every rule's finding on the app: one per rule, listing every task (and queue) it concerns."""
    found: list[Finding] = []
    for rule in rules:
        if rule.since is not None and facts.celery_minor < rule.since:
            continue
        found.extend(merge(list(rule.check(facts, options, rule))))
    order = {s: i for i, s in enumerate(reversed(SEVERITIES))}
    return sorted(found, key=lambda f: (order[f.severity], f.rule.id, f.where))


def merge(findings: list[Finding]) -> list[Finding]:
    """One rule's findings as one: its most severe first, the others' places and consequences after it."""
    if len(findings) < 2:
        return findings
    order = {s: i for i, s in enumerate(reversed(SEVERITIES))}
    ranked = sorted(findings, key=lambda f: order[f.severity])
    first = ranked[0]
    said = list(dict.fromkeys(f.consequence for f in ranked))
    tasks = tuple(dict.fromkeys(t for f in ranked for t in f.tasks))
    return [dataclasses.replace(first, where="; ".join(f.where for f in ranked), consequence=" ".join(said),
                                tasks=tasks)]


def cannot_tell(facts: AppFacts, options: Options) -> list[str]:
    """What the audit cannot tell from configuration, for this app: said beside the findings, never as one."""
    said: list[str] = []
    late = [t for t in facts.tasks if t.opt("acks_late")]
    soft = facts.settings.get("worker_soft_shutdown_timeout")
    if late and isinstance(soft, int | float) and soft > 0 and facts.celery_minor >= (5, 5):
        said.append(f"warm-shutdown-only: worker_soft_shutdown_timeout is {soft:g}s, but Celery waits it out only on a "
                    "cold shutdown, and SIGTERM is one only with REMAP_SIGTERM=SIGQUIT in the worker's environment, which "
                    "the audit cannot read: without it a deploy's SIGTERM still waits for every running task.")
    if facts.uses_chords and facts.backend_kind in CHORD_COUNTER_BACKENDS and options.chord_gap is None:
        name, value = chord_expiry(facts)
        expiry = f"{value:g}s" if value else "never"
        said.append(f"chord-outlives-result-expires: the app builds chords on a Redis result backend, whose chord keys "
                    f"expire {expiry} ({name}) after the last return; how long a chord goes with no member returning "
                    "(queue wait, countdowns, a straggler) is not configuration: give it with --chord-gap.")
    if facts.broker_kind == "rabbitmq" and options.consumer_timeout == RABBITMQ_CONSUMER_TIMEOUT_DEFAULT:
        said.append(f"time-limit-above-consumer-timeout: your RabbitMQ's consumer_timeout is not configuration Celery "
                    f"reads; RabbitMQ's default ({RABBITMQ_CONSUMER_TIMEOUT_DEFAULT:g}s) was assumed: give yours with "
                    "--consumer-timeout.")
    if facts.pool != "prefork" or "worker_pool" not in facts.changed:
        said.append(f"the pool: the rules read worker_pool ({facts.pool}); a worker started with -P runs another, "
                    "which the audit cannot see.")
    return said
