"""What the audit reads from a Celery app: its settings, queues, routes and every task's options.

Nothing here talks to a broker or a backend: Celery keeps all of it in memory (``app.conf``,
``app.amqp.queues``, ``app.amqp.router``, the task classes). ``load_app`` imports the app under
``audit.guard.no_connections``.

A task's effective option is what a worker would use: the task's own option; else, for an option
with a ``task_*`` setting, the app's setting; else Celery's default. ``celery.app.task.Task.bind``
copies most settings onto the task class (``Task.from_config``), which is what this module reads;
``task_time_limit`` and ``task_soft_time_limit`` are among them only from 5.7.0: in 5.5 and 5.6 the
worker gives them to its pool as the default limits (``celery.worker.worker.WorkController``), so
a task without a limit of its own takes the setting here too; ``source`` says where it came from: ``task`` when
it differs from the app's setting, else ``setting`` when the user set it, else ``default``.
``acks_on_failure`` and ``acks_on_timeout`` are Celery 5.7's; on 5.5 and 5.6 both are
``acks_on_failure_or_timeout`` (``celery.worker.request.Request.on_failure``), and on 5.7 a task
that sets neither, in an app that sets neither setting, takes that one's value (``Task.bind``):
reported as ``acks_on_failure_or_timeout``, where the value comes from.

Beside the tasks: the result backend's class as a worker would load it (``celery.app.backends.by_url``,
which imports the class and makes no instance) and whether the app's own code overrides its
``mark_as_done`` (``shared.backend.reject_unstored`` does: FM-8); the pool the ``worker_pool``
setting names, resolved to Celery's pool it is or derives from (a worker's ``-P`` overrides the
setting, and the audit cannot see the command line).

What it cannot see: what a task body does (a ``self.retry(countdown=...)`` in the body, a
deadline of the body's own making). It recognises the lab's primitives by the attributes they
leave on the function (``shared.timeouts.hard_timeout``: ``hard_timeout_seconds``;
``shared.retry.transient_retryable``: ``retry_policy``), through any ``functools.wraps`` layer.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import os
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, cast
from urllib.parse import urlsplit

from celery import Celery
from celery.app.defaults import DEFAULTS

from audit.guard import ConnectionRefusedByAudit, no_connections

Source = Literal["task", "setting", "default"]
BrokerKind = Literal["rabbitmq", "redis", "sqs", "other"]
PoolKind = Literal["prefork", "threads", "gevent", "eventlet", "solo", "other"]

CELERY_DEFAULT_REQUEST = "celery.worker.request:Request"
REDIS_VISIBILITY_DEFAULT = 3600.0
"""kombu's Redis transport: ``Channel.visibility_timeout`` (kombu 5.5 to 5.7)."""
RABBITMQ_CONSUMER_TIMEOUT_DEFAULT = 1800.0
"""RabbitMQ's ``consumer_timeout`` by default since 3.8.17, in seconds; Celery cannot read the broker's."""
POOL_MODULES: dict[str, PoolKind] = {
    "celery.concurrency.prefork": "prefork", "celery.concurrency.thread": "threads",
    "celery.concurrency.gevent": "gevent", "celery.concurrency.eventlet": "eventlet",
    "celery.concurrency.solo": "solo",
}
"""Celery's pools by module (``celery.concurrency.ALIASES`` names them), 5.5 to 5.7."""


class AppLoadError(Exception):
    """The app could not be imported or found; the message says why, in one line."""


@dataclass(frozen=True)
class Option:
    value: Any
    source: Source
    setting: str | None = None  # the task_* setting behind it, if any


@dataclass(frozen=True)
class QueueFacts:
    name: str
    arguments: dict[str, Any]
    exchange: str
    exchange_type: str
    routing_key: str

    @property
    def quorum(self) -> bool:
        return self.arguments.get("x-queue-type") == "quorum"

    @property
    def delivery_limit(self) -> int | None:
        raw = self.arguments.get("x-delivery-limit")
        return int(raw) if isinstance(raw, int | float | str) and str(raw).lstrip("-").isdigit() else None

    @property
    def dead_letter_exchange(self) -> str | None:
        raw = self.arguments.get("x-dead-letter-exchange")
        return str(raw) if raw is not None else None


@dataclass(frozen=True)
class TaskFacts:
    name: str
    options: dict[str, Option]
    queue: str | None
    autoretry_for: tuple[str, ...]
    retry_backoff: float
    retry_backoff_max: float
    retry_jitter: bool
    retry_countdown: float | None  # the longest countdown its configured retries wait, when config says
    body_deadline: float | None  # the lab's @hard_timeout seconds, when the body has one
    request_class: str
    request_handles_timeout: bool  # a Request class of the app's own that overrides on_failure/on_timeout
    file: str | None
    line: int | None
    retries_held_in_worker: bool = False  # its configured retries are ETA messages (Task.retry(countdown=...))

    def opt(self, name: str) -> Any:
        o = self.options.get(name)
        return o.value if o is not None else None


@dataclass(frozen=True)
class AppFacts:
    target: str
    main: str | None
    celery_version: str
    kombu_version: str
    broker_url: str
    broker_kind: BrokerKind
    backend_url: str
    backend_kind: str
    settings: dict[str, Any]  # every setting the installed Celery has, effective value
    changed: frozenset[str]  # settings the app set
    unknown_settings: tuple[str, ...]  # settings the app set that the installed Celery does not have
    queues: dict[str, QueueFacts]
    default_queue: str
    tasks: list[TaskFacts]
    file: str | None
    setting_lines: dict[str, int] = field(default_factory=lambda: {})
    backend_class: str = ""  # module:Class a worker would load for result_backend; "" when it cannot be loaded
    backend_guards_store: bool = False  # that class, or a base of the app's own, overrides mark_as_done (FM-8)
    backend_requeues_unstored: bool = False  # the guard rejects with requeue (shared.backend's requeue_unstored)
    pool: PoolKind = "prefork"  # the worker_pool setting, resolved to the Celery pool it is or derives from

    @property
    def celery_minor(self) -> tuple[int, int]:
        parts = self.celery_version.split(".")
        return int(parts[0]), int(parts[1])

    def has_setting(self, name: str) -> bool:
        return name in DEFAULTS

    def line_of(self, setting: str) -> int:
        """The line of the app's module that sets ``setting``, else the one that makes the app, else 1."""
        return self.setting_lines.get(setting, self.setting_lines.get("", 1))


# ---- loading --------------------------------------------------------------------------


def load_app(target: str) -> Celery[Any]:
    """Import ``module:attribute`` (or ``module``, whose ``app`` or ``celery`` is taken) with no connection."""
    module_name, _, attr = target.partition(":")
    if not module_name:
        raise AppLoadError(f"{target!r} is no app: give module:attribute, e.g. myproject.celery:app")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `celery -A` does: the project's folder is importable
    with no_connections() as tried:
        try:
            module = importlib.import_module(module_name)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # the user's import-time code: say what went wrong, no traceback
            raise _import_error(module_name, exc, tried) from None
    names = [attr] if attr else ["app", "celery"]
    for name in names:
        found: object = getattr(module, name, None)
        if isinstance(found, Celery):
            return cast("Celery[Any]", found)
    if attr:
        what = "no attribute" if not hasattr(module, attr) else f"{type(getattr(module, attr)).__name__}, not a Celery app,"
        raise AppLoadError(f"{module_name} has {what} {attr!r}")
    raise AppLoadError(f"{module_name} has no Celery app named app or celery: give module:attribute")


def _import_error(module_name: str, exc: BaseException, tried: list[object]) -> AppLoadError:
    if isinstance(exc, ConnectionRefusedByAudit):
        return AppLoadError(f"importing {module_name} {exc}")
    if tried:  # the refusal, wrapped in an error of the user's client (redis.ConnectionError, ...)
        return AppLoadError(f"importing {module_name} {ConnectionRefusedByAudit(tried[0])} ({type(exc).__name__})")
    if isinstance(exc, ModuleNotFoundError) and exc.name and module_name.startswith(exc.name):
        return AppLoadError(f"cannot import {module_name}: no module named {exc.name!r}")
    return AppLoadError(f"importing {module_name} raised {type(exc).__name__}: {exc}")


# ---- reading --------------------------------------------------------------------------

TASK_OPTIONS: dict[str, str | None] = {
    "acks_late": "task_acks_late",
    "reject_on_worker_lost": "task_reject_on_worker_lost",
    "retry_on_worker_lost": "task_retry_on_worker_lost",  # 5.7
    "acks_on_failure_or_timeout": "task_acks_on_failure_or_timeout",
    "acks_on_failure": "task_acks_on_failure",  # 5.7
    "acks_on_timeout": "task_acks_on_timeout",  # 5.7
    "time_limit": "task_time_limit",
    "soft_time_limit": "task_soft_time_limit",
    "ignore_result": "task_ignore_result",
    "rate_limit": "task_default_rate_limit",
    "max_retries": None,
    "default_retry_delay": None,
}
"""The options read from each task, with the ``task_*`` setting each falls back to."""


def seconds(value: Any) -> float | None:
    """A duration setting (int, float, timedelta) in seconds; None when unset."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value))
    except ValueError:
        return None


def broker_kind(url: str) -> BrokerKind:
    scheme = urlsplit(url).scheme.split("+")[0].lower()
    if scheme in ("amqp", "amqps", "pyamqp", "librabbitmq"):
        return "rabbitmq"
    if scheme in ("redis", "rediss", "sentinel", "socket"):
        return "redis"
    if scheme == "sqs":
        return "sqs"
    return "other"


def backend_kind(url: str) -> str:
    if not url:
        return "disabled"
    scheme = urlsplit(url).scheme if "://" in url else url
    return scheme.split("+")[0].lower() or "disabled"


def collect(app: Celery[Any], target: str) -> AppFacts:
    """Everything the rules read, from ``app`` (already imported), under the no-connection guard."""
    with no_connections():
        try:
            return _collect(app, target)
        except ConnectionRefusedByAudit as exc:
            raise AppLoadError(f"reading the app {exc}") from None


def _collect(app: Celery[Any], target: str) -> AppFacts:
    try:  # what `celery worker` imports before it runs: `imports`, `include`, autodiscovered task modules
        cast(Any, app.loader).import_default_modules()
    except ConnectionRefusedByAudit:
        raise
    except Exception as exc:
        raise AppLoadError(f"importing the app's task modules (imports, include, autodiscover) raised "
                           f"{type(exc).__name__}: {exc}") from None
    conf: Any = app.conf
    settings = {key: conf.get(key) for key in DEFAULTS}
    changed = frozenset(str(k) for k in cast(dict[str, Any], dict(conf.changes)))
    unknown = tuple(sorted(k for k in changed if k not in DEFAULTS and _looks_like_setting(k)))
    broker = str(conf.broker_url or conf.broker_read_url or "amqp://guest@localhost//")
    backend = str(conf.result_backend or "")
    amqp = cast(Any, app.amqp)
    queues: dict[str, QueueFacts] = {}
    for name, q in cast(dict[str, Any], dict(amqp.queues)).items():
        ex = q.exchange
        queues[str(name)] = QueueFacts(str(name), dict(cast(dict[str, Any], q.queue_arguments or {})),
                                       str(getattr(ex, "name", "") or ""), str(getattr(ex, "type", "direct") or "direct"),
                                       str(q.routing_key or ""))
    default_queue = str(conf.task_default_queue)
    tasks = [_task(app, amqp, t, settings, changed, default_queue)
             for n, t in sorted(cast(dict[str, Any], dict(app.tasks)).items())
             if not str(n).startswith("celery.") and _belongs(app, t)]
    file = _app_file(target)
    backend_class, guards, requeues = _backend_class(app)
    return AppFacts(
        target=target, main=app.main, celery_version=_version("celery"), kombu_version=_version("kombu"),
        broker_url=broker, broker_kind=broker_kind(broker), backend_url=backend, backend_kind=backend_kind(backend),
        settings=settings, changed=changed, unknown_settings=unknown, queues=queues, default_queue=default_queue,
        tasks=tasks, file=file, setting_lines=_setting_lines(file, target.partition(":")[2] or "app"),
        backend_class=backend_class, backend_guards_store=guards,
        backend_requeues_unstored=requeues, pool=pool_kind(settings.get("worker_pool")),
    )


def _backend_class(app: Celery[Any]) -> tuple[str, bool, bool]:
    """The result backend's class, as ``Celery._get_backend`` picks it (no instance: that could connect),
    whether code of the app's own (not ``celery.*``) overrides its ``mark_as_done``, and whether that guard
    rejects with requeue (``requeue_unstored``, as ``shared.backend.reject_unstored(app, requeue=True)`` sets)."""
    by_url: Any = getattr(importlib.import_module("celery.app.backends"), "by_url")  # celery-types types it wrongly
    try:
        found: tuple[Any, Any] = by_url(cast(Any, app).backend_cls or app.conf.result_backend, app.loader)
    except ConnectionRefusedByAudit:
        raise
    except Exception:  # an unknown scheme, a backend whose client is not installed: the rules read the URL's kind
        return "", False, False
    cls: type = found[0]
    guards = any("mark_as_done" in vars(c) for c in cls.__mro__ if not c.__module__.startswith("celery."))
    return f"{cls.__module__}:{cls.__qualname__}", guards, guards and getattr(cls, "requeue_unstored", False) is True


def pool_kind(value: Any) -> PoolKind:
    """The Celery pool ``worker_pool`` names (an alias, ``module:Class``, or a class), or one it derives from."""
    aliases = cast(dict[str, str | None], getattr(importlib.import_module("celery.concurrency"), "ALIASES"))
    if isinstance(value, type):
        cls: Any = value
    else:
        path = aliases.get(str(value), str(value)) if value else aliases["prefork"]
        if not path:
            return "other"
        module = path.partition(":")[0] if ":" in path else path.rpartition(".")[0]
        if module in POOL_MODULES:  # Celery's own: named, not imported (gevent's and eventlet's need those packages)
            return POOL_MODULES[module]
        try:
            from celery.utils.imports import symbol_by_name

            cls = symbol_by_name(path)
        except ConnectionRefusedByAudit:
            raise
        except Exception:
            return "other"
    for c in cast(tuple[type, ...], getattr(cls, "__mro__", ())):
        if c.__module__ in POOL_MODULES:
            return POOL_MODULES[c.__module__]
    return "other"


VERSIONED_SETTINGS = ("result_chord_expires", "task_retry_on_worker_lost", "task_acks_on_failure",
                      "task_acks_on_timeout", "worker_eta_task_limit", "task_default_queue_type",
                      "worker_soft_shutdown_timeout", "worker_enable_soft_shutdown_on_idle",
                      "worker_cancel_long_running_tasks_on_connection_loss", "broker_channel_error_retry",
                      "worker_detect_quorum_queues")
"""Settings some Celery 5.x has and another has not: one the app sets that the installed Celery
lacks is reported (``setting-not-in-this-celery``)."""


def _looks_like_setting(key: str) -> bool:
    return key in VERSIONED_SETTINGS


def _belongs(app: Celery[Any], task: Any) -> bool:
    """False for a task another app defined: ``@app.task`` is shared by default, and Celery adds a shared
    task to every app finalised in the process (``celery._state.connect_on_app_finalize``). A task whose
    module holds Celery apps, none of them this one, is that other app's."""
    module = sys.modules.get(str(getattr(task, "__module__", "")))
    if module is None:
        return True
    apps: list[object] = [v for v in list(vars(module).values()) if isinstance(v, Celery)]
    return not apps or any(a is app for a in apps)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def _innermost(fn: Any) -> Any:
    seen = 0
    while getattr(fn, "__wrapped__", None) is not None and seen < 50:
        fn = fn.__wrapped__
        seen += 1
    return fn


def _chain_attr(fn: Any, attr: str) -> Any:
    """``attr`` on ``fn`` or any function it wraps (``functools.wraps`` copies it outward too)."""
    seen = 0
    while fn is not None and seen < 50:
        found = getattr(fn, attr, None)
        if found is not None:
            return found
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    return None


def _task(app: Celery[Any], amqp: Any, task: Any, settings: dict[str, Any], changed: frozenset[str],
          default_queue: str) -> TaskFacts:
    options: dict[str, Option] = {}
    cls: type[object] = type(cast(object, task))
    for attr, setting in TASK_OPTIONS.items():
        if not hasattr(cls, attr) and not hasattr(task, attr):
            continue
        value = getattr(task, attr, None)
        if value is None and setting is not None and settings.get(setting) is not None:
            value = settings[setting]  # 5.5/5.6 bind no time limits to a task: the worker's pool applies the setting
        if setting is None or setting not in settings:
            own = attr in vars(cls)
            options[attr] = Option(value, "task" if own else "default", None)
            continue
        if value != settings[setting]:
            options[attr] = Option(value, "task", setting)
        else:
            options[attr] = Option(value, "setting" if setting in changed else "default", setting)
    both = options.get("acks_on_failure_or_timeout")
    for split in ("acks_on_failure", "acks_on_timeout"):
        own = options.get(split)
        if both is None:
            continue
        if own is None:  # Celery 5.5/5.6: one flag for both
            options[split] = both
        elif own.source == "task" and settings.get(f"task_{split}") is None and own.value == both.value:
            options[split] = both  # 5.7: unset, the task took the fallback (Task.bind), not a value of its own
    queue = _queue_of(amqp, task, default_queue)
    autoretry = tuple(getattr(e, "__name__", str(e)) for e in cast(tuple[Any, ...], tuple(getattr(task, "autoretry_for", ()) or ())))
    backoff = float(getattr(task, "retry_backoff", False) or 0)
    backoff_max = float(getattr(task, "retry_backoff_max", 600) or 600)
    jitter = bool(getattr(task, "retry_jitter", True))
    run = getattr(task, "run", None)
    policy = _chain_attr(run, "retry_policy")
    deadline = _chain_attr(run, "hard_timeout_seconds")
    countdown = _countdown(task, autoretry, backoff, backoff_max, policy)
    # Celery's autoretry and the lab's policy without wait_in retry with Task.retry(countdown=...): an ETA message
    held = (bool(autoretry) and (countdown or 0.0) > 0) or (policy is not None and _chain_attr(run, "delay_queues") is None)
    request = getattr(task, "Request", CELERY_DEFAULT_REQUEST)
    request_name, handles = _request(request)
    file, line = _where(run)
    return TaskFacts(name=str(task.name), options=options, queue=queue, autoretry_for=autoretry, retry_backoff=backoff,
                     retry_backoff_max=backoff_max, retry_jitter=jitter, retry_countdown=countdown,
                     body_deadline=float(deadline) if isinstance(deadline, int | float) else None,
                     request_class=request_name, request_handles_timeout=handles, file=file, line=line,
                     retries_held_in_worker=held)


def _queue_of(amqp: Any, task: Any, default_queue: str) -> str | None:
    options: dict[str, Any] = {}
    cls: type[object] = type(cast(object, task))
    own = vars(cls).get("queue")
    if own:
        options["queue"] = own
    try:
        routed = cast(dict[str, Any], amqp.router.route(options, str(task.name)))
    except Exception:  # a router of the user's that needs arguments: the default queue is the best guess
        return default_queue
    q = routed.get("queue")
    name = getattr(q, "name", q)
    return str(name) if name else default_queue


def _countdown(task: Any, autoretry: tuple[str, ...], backoff: float, backoff_max: float, policy: Any) -> float | None:
    """The longest wait between two attempts that the task's configuration states, or None."""
    if policy is not None and hasattr(policy, "planned"):  # the lab's RetryPolicy: jitter up to twice the plan
        n = int(getattr(policy, "max_retries", 0) or 0)
        return max((2 * float(policy.planned(k)) for k in range(n)), default=0.0)
    if not autoretry:
        return None
    kwargs = cast(dict[str, Any], getattr(task, "retry_kwargs", {}) or {})
    if backoff:  # celery.app.autoretry: factor * 2**retries (jitter only shortens it), capped at retry_backoff_max
        factor = int(max(1.0, backoff))
        if task.max_retries is None:
            return backoff_max
        return float(min(backoff_max, factor * 2 ** max(int(task.max_retries) - 1, 0)))
    if "countdown" in kwargs:
        return seconds(kwargs["countdown"])
    return seconds(getattr(task, "default_retry_delay", 180))


def _request(request: Any) -> tuple[str, bool]:
    if isinstance(request, str):
        name = request
        try:
            from celery.utils.imports import symbol_by_name

            cls = symbol_by_name(request)
        except Exception:
            return name, False
    else:
        cls = request
        name = f"{getattr(cls, '__module__', '?')}:{getattr(cls, '__qualname__', '?')}"
    if name == CELERY_DEFAULT_REQUEST:
        return name, False
    handles = any(m in vars(c) for c in getattr(cls, "__mro__", ())[:-1]
                  if getattr(c, "__module__", "") != "celery.worker.request" for m in ("on_failure", "on_timeout"))
    return name, handles


def _where(fn: Any) -> tuple[str | None, int | None]:
    inner = _innermost(fn)
    try:
        file = inspect.getsourcefile(inner)
        _, line = inspect.getsourcelines(inner)
    except (TypeError, OSError):
        return None, None
    return file, line


def _app_file(target: str) -> str | None:
    module = sys.modules.get(target.partition(":")[0])
    return getattr(module, "__file__", None) if module is not None else None


def _setting_lines(file: str | None, app_name: str) -> dict[str, int]:
    """The first line of code in the app's module that names each setting (for SARIF and the table).

    Read from the syntax tree, not the text, so that a docstring or a comment naming a setting does not
    count: an attribute (``app.conf.task_acks_late``), a keyword (``task_acks_late=``), a string
    (``"x-delivery-limit"``) or a name. ``""`` is the line that assigns the app itself, the fallback."""
    if not file:
        return {}
    try:
        tree = ast.parse(Path(file).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    wanted = {*DEFAULTS, "visibility_timeout", "x-delivery-limit", "x-queue-type", "x-dead-letter-exchange"}
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
        elif isinstance(node, ast.keyword) and node.arg:
            names.append(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 60:
            names.append(node.value)
        elif isinstance(node, ast.Name):
            names.append(node.id)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == app_name for t in node.targets):
            names.append("")
        line = getattr(node, "lineno", None)
        for name in names:
            if (name in wanted or name == "") and isinstance(line, int) and line < found.get(name, 1 << 30):
                found[name] = line
    return found
