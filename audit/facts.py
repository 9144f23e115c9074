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

One piece: everything the audit reads from an app is gathered here once, into the ``AppFacts`` every rule
reads; the rules live in ``audit.rules``.
"""

from __future__ import annotations

import ast
import gc
import importlib
import importlib.metadata
import inspect
import os
import sys
import textwrap
from collections.abc import Generator, Iterable
from contextlib import contextmanager
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
class Origin:
    """Where the app set a setting: the file and line that assign the name Celery read, and whether the
    value is read from the environment there (so the deployed value may differ from the one audited)."""

    name: str  # the name assigned: CELERY_TASK_TIME_LIMIT under a namespace, task_time_limit, an old name
    file: str | None
    line: int | None
    environment: bool = False


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
    retry_max: int | None = 3  # how many times autoretry_for retries (retry_kwargs' max_retries wins); None: no end

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
    origins: dict[str, Origin] = field(default_factory=lambda: {})  # setting -> where the app set it
    uses_chords: bool = False  # a module beside the app's or its tasks' builds a chord (chord(...) or .chord)
    routes_by_key: bool = False  # such a module sends with a routing key computed per call (routing_key=f"lot.{x}")
    raw_set: dict[str, Any] = field(default_factory=lambda: {})  # each name of unknown_settings -> the value set

    @property
    def celery_minor(self) -> tuple[int, int]:
        parts = self.celery_version.split(".")
        return int(parts[0]), int(parts[1])

    def has_setting(self, name: str) -> bool:
        return name in DEFAULTS

    def line_of(self, setting: str) -> int:
        """The line of the app's module that sets ``setting``, else the one that makes the app, else 1."""
        return self.setting_lines.get(setting, self.setting_lines.get("", 1))

    def place(self, setting: str) -> tuple[str | None, int]:
        """The file and line where the app set ``setting`` (its settings module or class, or the app's own
        module), else the line of the app's module that makes the app."""
        o = self.origins.get(setting)
        if o is not None and o.file:
            return o.file, o.line or 1
        return self.file, self.line_of(setting)

    def how(self, setting: str) -> str:
        """``set at settings.py:27, read from the environment`` or ``Celery's default``, for a finding's text."""
        o = self.origins.get(setting)
        if o is None:
            return "set by the app" if setting in self.changed else "Celery's default"
        where = f" at {_short_path(o.file)}:{o.line}" if o.file and o.line else ""
        named = f" as {o.name}" if o.name != setting else ""
        env = ", read from the environment" if o.environment else ""
        return f"set{named}{where}{env}" if where or env or named else "set by the app"


# ---- loading --------------------------------------------------------------------------


_FRESH: dict[int, frozenset[str]] = {}
"""id(app) -> the modules importing it brought in (its tasks' modules among them): see ``_belongs``."""


def load_app(target: str) -> Celery[Any]:
    """Find the app as ``celery -A target`` does (``celery.app.utils.find_app``: ``module:attribute``; or a
    module, whose ``app``, then ``celery``, then for a package its ``celery`` submodule, then any Celery
    instance it holds is taken), importing from the current folder, with no connection allowed."""
    if not target or target.startswith(":"):
        raise AppLoadError(f"{target!r} is no app: give a module (myproject) or module:attribute (myproject.celery:app)")
    from celery.app.utils import find_app

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `celery -A` does: the project's folder is importable
    before = set(sys.modules)
    module_name = target.partition(":")[0]
    with no_connections() as tried:
        try:
            found = cast(object, find_app(target))  # a module or anything else when the name is not an app
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # the user's import-time code, or no app: say what went wrong, no traceback
            raise _import_error(module_name, exc, tried, target) from None
    if not isinstance(found, Celery):
        what = type(found).__name__
        raise AppLoadError(f"{target}: {what}, not a Celery app" if ":" in target or what != "module"
                           else f"{target} holds no Celery app (celery -A would not find one either)")
    app = cast("Celery[Any]", found)
    _FRESH[id(app)] = frozenset(set(sys.modules) - before)
    return app


def _import_error(module_name: str, exc: BaseException, tried: list[object], target: str = "") -> AppLoadError:
    if isinstance(exc, ConnectionRefusedByAudit):
        return AppLoadError(f"importing {module_name} {exc}")
    if tried:  # the refusal, wrapped in an error of the user's client (redis.ConnectionError, ...)
        return AppLoadError(f"importing {module_name} {ConnectionRefusedByAudit(tried[0])} ({type(exc).__name__})")
    if isinstance(exc, ModuleNotFoundError) and exc.name and module_name.startswith(exc.name):
        return AppLoadError(f"cannot import {module_name}: no module named {exc.name!r}")
    if isinstance(exc, AttributeError) and module_name in sys.modules:  # imported, but no app where it looked
        return AppLoadError(f"{target or module_name}: no Celery app found as celery -A looks for one "
                            f"({_one_line(exc)}): give module:attribute")
    return AppLoadError(f"importing {module_name} raised {type(exc).__name__}: {_one_line(exc)}")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _short_path(file: str) -> str:
    """``file`` relative to the current folder when it is under it (for a finding's text)."""
    try:
        return Path(file).resolve().relative_to(Path(os.getcwd()).resolve()).as_posix()
    except ValueError:
        return file


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


@contextmanager
def _no_collection() -> Generator[None]:
    """The garbage collector off while the guard holds. A finalizer of the caller's (a Celery result consumer that
    unsubscribes from Redis when its AsyncResult is collected) would otherwise run inside the guard, meet its refusal,
    and raise inside ``ast.parse``, which CPython 3.11 turns into ``SystemError: AST constructor recursion depth
    mismatch`` (seen once in the test suite, where earlier tests leave such results). What is garbage already is
    collected first, with the network still there."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def collect(app: Celery[Any], target: str) -> AppFacts:
    """Everything the rules read, from ``app`` (already imported), under the no-connection guard."""
    with _no_collection(), no_connections():
        try:
            return _collect(app, target)
        except ConnectionRefusedByAudit as exc:
            raise AppLoadError(f"reading the app {exc}") from None
        except AppLoadError:
            raise
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # Celery finalizing the app's tasks, a router, a task class of the user's
            raise AppLoadError(f"reading the app (finalizing its tasks, queues, routes) raised "
                               f"{type(exc).__name__}: {_one_line(exc)}") from None


def _collect(app: Celery[Any], target: str) -> AppFacts:
    before = set(sys.modules)
    try:  # what `celery worker` imports before it runs: `imports`, `include`, autodiscovered task modules
        cast(Any, app.loader).import_default_modules()
    except ConnectionRefusedByAudit:
        raise
    except Exception as exc:
        raise AppLoadError(f"importing the app's task modules (imports, include, autodiscover) raised "
                           f"{type(exc).__name__}: {_one_line(exc)}") from None
    fresh_tasks = frozenset(set(sys.modules) - before)
    conf: Any = app.conf
    settings = {key: conf.get(key) for key in DEFAULTS}
    set_maps = _set_maps(conf)
    read = read_names(conf, set_maps, settings)
    changed = frozenset(read.values())
    raw_set = _unknown(conf, set_maps, read)
    unknown = tuple(sorted(raw_set))
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
    fresh = _FRESH.get(id(app), frozenset()) | fresh_tasks
    tasks = [_task(app, amqp, t, settings, changed, default_queue)
             for n, t in sorted(cast(dict[str, Any], dict(app.tasks)).items())
             if not str(n).startswith("celery.") and _belongs(app, t, fresh)]
    file = _app_file(target)
    setting_lines = _setting_lines(file, target.partition(":")[2] or "app")
    origins = _origins(app, conf, read, file, setting_lines, unknown)
    # The lab's own probe and idle tasks (lab.app.lab_app adds them to every lab program: the FM files, the case
    # studies) are the harness's plumbing, not the program's code: the folder they live in is not the program's.
    scan = scan_code([file, *(t.file for t in tasks if not (t.file and Path(t.file).match("lab/app.py")))])
    backend_class, guards, requeues = _backend_class(app)
    return AppFacts(
        target=target, main=app.main, celery_version=_version("celery"), kombu_version=_version("kombu"),
        broker_url=broker, broker_kind=broker_kind(broker), backend_url=backend, backend_kind=backend_kind(backend),
        settings=settings, changed=changed, unknown_settings=unknown, queues=queues, default_queue=default_queue,
        tasks=tasks, file=file, setting_lines=setting_lines,
        backend_class=backend_class, backend_guards_store=guards,
        backend_requeues_unstored=requeues, pool=pool_kind(settings.get("worker_pool")), origins=origins,
        uses_chords=scan.chords, routes_by_key=scan.keyed_routing, raw_set=raw_set,
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


def _names(conf: Any, key: str) -> tuple[str, ...]:
    """The names Celery looks ``key`` up by (``ConfigurationView.__getitem__``): under a namespace
    ``CELERY_TASK_TIME_LIMIT``, then ``task_time_limit``, then the old name (``CELERYD_TASK_TIME_LIMIT``)."""
    to_keys = getattr(conf, "_to_keys", None)
    prefix = str(getattr(conf, "prefix", "") or "")
    names: list[str] = ([str(n) for n in cast(tuple[Any, ...], to_keys(key))] if callable(to_keys)
                        else [f"{prefix}{key.upper()}", key] if prefix else [key])
    for f in cast(tuple[Any, ...], getattr(conf, "_keys", None) or ()):  # 5.5 and 5.6 add these in __getitem__
        try:
            names.append(str(f(key)))
        except Exception:
            continue
    return tuple(dict.fromkeys(names))


def _same(a: Any, b: Any) -> bool:
    try:
        return a is b or bool(a == b)
    except Exception:
        return False


def _values(m: Any) -> dict[str, Any]:
    """A settings map's names and values: a ``config_from_object`` source's public attributes, or a dict."""
    obj = getattr(m, "obj", None)
    if obj is not None:
        return {n: getattr(obj, n, None) for n in dir(obj) if not n.startswith("_")}
    items: dict[Any, Any] = dict(m)
    return {str(k): v for k, v in items.items()}


def read_names(conf: Any, set_maps: list[Any], settings: dict[str, Any]) -> dict[str, str]:
    """Each name the app set that Celery read, with the setting it gave: a name counts when it is one Celery looks
    the setting up by and the setting's value as Celery resolved it is that name's. Celery 5.7 maps an old name
    (CELERY_QUEUES) under a namespace; 5.5 and 5.6 find the plain default first, so there the name is unread."""
    by_name: dict[str, list[str]] = {}
    for key in DEFAULTS:
        for n in _names(conf, key):
            by_name.setdefault(n, []).append(key)
    read: dict[str, str] = {}
    for m in set_maps:
        for name, value in _values(m).items():
            if name in read:
                continue
            for key in by_name.get(name, []):
                if _same(settings.get(key), value):
                    read[name] = key
                    break
    return read


def _set_maps(conf: Any) -> list[Any]:
    """What the app set, in the order Celery reads it: ``conf.update`` and keyword arguments (``changes``),
    then the ``config_from_object`` source (a module, a class, Django's settings): every map but the defaults."""
    maps: list[Any] = list(getattr(conf, "maps", []) or [])
    return maps[:-1] if len(maps) > 1 else [getattr(conf, "changes", {})]


SETTING_GROUPS = frozenset(k.split("_", 1)[0] for k in DEFAULTS) - {"include", "imports", "enable", "timezone"}
"""The first word of Celery's setting names (task, worker, broker, result, beat, ...): a lower-case name of a
settings source that starts with one and is not a setting is one Celery ignores."""


def _unknown(conf: Any, set_maps: list[Any], read: dict[str, str]) -> dict[str, Any]:
    """Names the app set that the installed Celery does not read: under a namespace, every name with its prefix
    that maps to no setting (DefectDojo's CELERY_TASK_DEFAULT_EXPIRES); else a lower-case name of a setting's
    group (task_..., worker_...) that is none, or an old upper-case CELERY... name that is none."""
    prefix = str(getattr(conf, "prefix", "") or "")
    found: dict[str, Any] = {}
    for m in reversed(set_maps):  # the first map wins, as in Celery's lookups
        for k, value in _values(m).items():
            if k in read or k in DEFAULTS or k == "deprecated_settings":
                continue
            if (k.startswith(prefix) if prefix else
                    (k.islower() and k.split("_", 1)[0] in SETTING_GROUPS) or (k.isupper() and k.startswith("CELERY"))):
                found[k] = value
    return found


def _source_object(app: Celery[Any]) -> Any:
    """The ``config_from_object`` source: the module or class itself (a name is imported as Celery does)."""
    src = getattr(app, "_config_source", None)
    if isinstance(src, str):
        try:
            from celery.utils.imports import symbol_by_name

            return symbol_by_name(src)
        except Exception:
            return None
    return src


def _origins(app: Celery[Any], conf: Any, read: dict[str, str], app_file: str | None,
             app_lines: dict[str, int], unknown: tuple[str, ...] = ()) -> dict[str, Origin]:
    """Where each setting the app set was set: the line assigning the name Celery read, in the settings module
    or class ``config_from_object`` was given (read from its source), else in the app's own module."""
    assigned = _assignments(_source_object(app))
    changes = cast(dict[str, Any], dict(getattr(conf, "changes", {}) or {}))
    found: dict[str, Origin] = {}
    for key in sorted(set(read.values())):
        names = [n for n in _names(conf, key) if read.get(n) == key]
        in_changes = next((n for n in names if n in changes), None)
        if in_changes is not None:
            found[key] = Origin(in_changes, app_file, app_lines.get(key) or app_lines.get(in_changes)
                                or app_lines.get(""))
            continue
        for n in names:
            if n in assigned:
                file, line, env = assigned[n]
                found[key] = Origin(n, file, line, env)
                break
    for name in unknown:  # an unread name: where it is assigned, for its finding's location
        if name in assigned:
            file, line, env = assigned[name]
            found[name] = Origin(name, file, line, env)
        elif name in changes:
            found[name] = Origin(name, app_file, app_lines.get(name) or app_lines.get(""))
    return found


def _assignments(obj: Any) -> dict[str, tuple[str, int, bool]]:
    """Each name a settings module or class assigns (for a class, the first class of its MRO that does):
    its file, the line of its last assignment at the top level (an ``if`` at the top level counts) and
    whether the value is read from the environment (``os.environ``, ``getenv``, an ``env(...)`` helper, or
    a name of the same module assigned so, followed a few steps)."""
    found: dict[str, tuple[str, int, bool]] = {}
    if isinstance(obj, dict):
        return _dict_assignments(cast(dict[str, Any], obj))
    targets: list[Any] = ([c for c in getattr(obj, "__mro__", ()) if c is not object] if inspect.isclass(obj)
                          else [obj] if inspect.ismodule(obj) else [])
    for target in targets:
        try:
            file = inspect.getsourcefile(target)
            lines, start = inspect.getsourcelines(target)
        except (TypeError, OSError):
            continue
        if not file:
            continue
        try:
            tree = ast.parse(textwrap.dedent("".join(lines)))
        except SyntaxError:
            continue
        offset = max(start, 1) - 1
        body: list[ast.stmt] = tree.body
        if inspect.isclass(target) and body and isinstance(body[0], ast.ClassDef):
            body = body[0].body
        module_tree = _module_tree(target)
        own: dict[str, tuple[int, ast.expr | None]] = {}
        for stmt in _top_level(body):
            for name, value in _assigned_names(stmt):
                own[name] = (stmt.lineno + offset, value)
        for name, (line, value) in own.items():
            if name not in found:
                found[name] = (file, line, value is not None and _reads_env(value, module_tree, 0))
    return found


def _dict_assignments(config: dict[str, Any]) -> dict[str, tuple[str, int, bool]]:
    """A settings dict (Airflow's ``Celery(config_source=DEFAULT_CELERY_CONFIG)``): the module-level name of a module
    of the project (under the current folder) that holds this very dict, and the line of each key of its literal."""
    here = Path(os.getcwd()).resolve()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not file or not Path(file).resolve().is_relative_to(here):
            continue
        names = [n for n, v in list(vars(module).items()) if v is config]
        if not names:
            continue
        try:
            tree = ast.parse(Path(file).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
            continue
        module_tree = _module_tree(module)
        for stmt in _top_level(tree.body):
            for name, value in _assigned_names(stmt):
                if name in names and isinstance(value, ast.Dict):
                    return {k.value: (file, k.lineno, _reads_env(v, module_tree, 0))
                            for k, v in zip(value.keys, value.values)
                            if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return {}


def _module_tree(target: Any) -> dict[str, ast.AST]:
    """The top-level assignments and functions of ``target``'s module, by name (to follow a name one step)."""
    module = inspect.getmodule(target)
    try:
        tree = ast.parse(inspect.getsource(module)) if module is not None else None
    except (TypeError, OSError, SyntaxError):
        tree = None
    found: dict[str, ast.AST] = {}
    for stmt in _top_level(tree.body if tree is not None else []):
        if isinstance(stmt, ast.FunctionDef):
            found[stmt.name] = stmt
        for name, value in _assigned_names(stmt):
            if value is not None:
                found[name] = value
    return found


def _top_level(body: list[ast.stmt]) -> Iterable[ast.stmt]:
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If | ast.Try | ast.With):
            for part in (getattr(stmt, "body", []), getattr(stmt, "orelse", []), getattr(stmt, "finalbody", [])):
                yield from _top_level(cast(list[ast.stmt], part))
            for handler in getattr(stmt, "handlers", []):
                yield from _top_level(cast(ast.ExceptHandler, handler).body)


def _assigned_names(stmt: ast.stmt) -> list[tuple[str, ast.expr | None]]:
    if isinstance(stmt, ast.Assign):
        return [(t.id, stmt.value) for t in stmt.targets if isinstance(t, ast.Name)]
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return [(stmt.target.id, stmt.value)]
    return []


ENV_NAMES = frozenset({"environ", "getenv", "env", "environ_get"})


def _reads_env(node: ast.AST, module_tree: dict[str, ast.AST], depth: int) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in ENV_NAMES:
            return True
        if isinstance(sub, ast.Name):
            if sub.id in ENV_NAMES:
                return True
            follow = module_tree.get(sub.id)
            if follow is not None and follow is not node and depth < 4 and _reads_env(follow, module_tree, depth + 1):
                return True
    return False


@dataclass(frozen=True)
class CodeScan:
    chords: bool
    keyed_routing: bool


def scan_code(files: Iterable[str | None]) -> CodeScan:
    """What the modules beside the app's and its tasks' (same folders) do with Celery, read from their syntax
    trees: whether one builds a chord (a call of ``chord``, or of an attribute named so), and whether one sends
    with a routing key computed per call (``routing_key=`` given an f-string, a format or a concatenation),
    the case where one queue bound by a wildcard key is asked to keep an order per key."""
    folders = {Path(f).resolve().parent for f in files if f}
    chords = keyed = False
    for folder in sorted(folders):
        for path in sorted(folder.glob("*.py")):
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError):
                continue
            if "chord" not in text and "routing_key" not in text:
                continue
            try:
                tree = ast.parse(text)
            except (SyntaxError, ValueError):
                continue
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                fn = node.func
                name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                chords = chords or name == "chord"
                keyed = keyed or any(k.arg == "routing_key" and isinstance(k.value, ast.JoinedStr | ast.BinOp | ast.Call)
                                     for k in node.keywords)
            if chords and keyed:
                return CodeScan(True, True)
    return CodeScan(chords, keyed)


def _belongs(app: Celery[Any], task: Any, fresh: frozenset[str] = frozenset()) -> bool:
    """False for a task another app defined: ``@app.task`` is shared by default, and Celery adds a shared
    task to every app finalised in the process (``celery._state.connect_on_app_finalize``). A task whose
    module holds Celery apps, none of them this one, is that other app's, unless loading this app imported
    that module (``fresh``): then a worker of this app imports it too and runs the task (BookWyrm declares
    its tasks on a second app, and its worker's app runs them as shared tasks)."""
    name = str(getattr(task, "__module__", ""))
    module = sys.modules.get(name)
    if module is None or name in fresh:
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
                     retries_held_in_worker=held, retry_max=autoretry_max(task))


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
    limit = autoretry_max(task)
    if backoff:  # celery.app.autoretry: factor * 2**retries (jitter only shortens it), capped at retry_backoff_max
        factor = int(max(1.0, backoff))
        if limit is None:
            return backoff_max
        return float(min(backoff_max, factor * 2 ** max(limit - 1, 0)))
    if "countdown" in kwargs:
        return seconds(kwargs["countdown"])
    return seconds(getattr(task, "default_retry_delay", 180))


def autoretry_max(task: Any) -> int | None:
    """How many times autoretry_for retries: ``retry_kwargs['max_retries']`` when given (celery.app.autoretry
    passes retry_kwargs to Task.retry, whose max_retries argument wins over the task's), else the task's."""
    kwargs = cast(dict[str, Any], getattr(task, "retry_kwargs", {}) or {})
    raw = kwargs["max_retries"] if "max_retries" in kwargs else getattr(task, "max_retries", 3)
    return int(raw) if isinstance(raw, int | float) else None


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
