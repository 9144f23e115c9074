"""What the harness learns from an FM module, and from nowhere else.

An FM file is a plain Celery program (``app``, the three tasks, ``submit``). The
harness reads its facts off that program, so there is no second table of FM specs:

- the short name from the file name (``<short>_<what>.py``; the lessons' registry says which
  scenario each runs);
- the worker's flags from Celery's own settings: ``-B`` when ``beat_schedule`` is
  set; the concurrency and the queues come from the app itself, so the worker
  command needs neither ``-c`` nor ``-Q``; the worker's environment from the module's
  ``WORKER_ENV`` (a deploy's lesson: Celery reads ``REMAP_SIGTERM`` from the environment only);
- the queues and exchanges it owns (the harness resets exactly these): every
  queue in ``task_queues``, the dead-letter queue each one declares, and every other kombu ``Queue``
  the module holds (a dead-letter queue or parking queue written with kombu alone, not ``shared/dlq``);
- its dead-letter queue: a ``DeadLetteringQueue``'s, else the module's queue bound to the exchange and
  routing key a task queue names in ``x-dead-letter-exchange`` / ``x-dead-letter-routing-key``;
- the bounds the checks hold it to, from the fixes it applied: the delivery bound
  of a quorum queue (``x-delivery-limit`` + 1), the ``RetryPolicy`` and the hard
  timeout found on ``parse_document``'s decorator stack.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, cast

from celery import Celery, Task
from celery.result import AsyncResult
from kombu import Queue

from lab.app import short_name, short_of_app
from shared.dlq import DeadLetteringQueue, bound_of, parked_queue
from shared.retry import DelayQueues, RetryPolicy

ROOT = Path(__file__).resolve().parent.parent
WORKER_FLAGS = ("--without-gossip", "--without-mingle", "--without-heartbeat")
"""Every lab worker runs without these (no other workers to talk to; faster start)."""

Submit = Callable[[list[str], str], "AsyncResult[Any]"]


def layers(fn: object) -> Iterator[object]:
    """A function and every wrapper beneath it (``functools.wraps`` sets ``__wrapped__``)."""
    while fn is not None:
        yield fn
        fn = getattr(fn, "__wrapped__", None)


@dataclass(frozen=True)
class Fm:
    short: str  # the namespace's name of the program: a lesson's short name, a case study's code
    module: str  # <short>_<what> (celery -A <module>)
    app: Celery
    submit: Submit
    parse_document: Task[Any, Any]
    notify: Task[Any, Any]
    probe: Task[Any, Any]
    fetch_document: Task[Any, Any] | None = None  # the chain's head (the FMs'; a case study has none)
    delays: tuple[DelayQueues, ...] = ()  # delay queues the module declares itself (a claim's busy waits)
    worker_env: tuple[tuple[str, str], ...] = ()  # the module's WORKER_ENV: what the worker's environment must hold
    declared: tuple[Queue, ...] = ()  # the module's other kombu queues (a DLQ, a parking queue written without shared/)

    @property
    def number(self) -> int:
        return int(self.short[2:]) if self.short[2:].isdigit() else -1

    @property
    def scenario(self) -> int:
        return max(self.number, 1)

    @property
    def task_queues(self) -> list[Queue]:
        return cast(list[Queue], list(self.app.conf.task_queues or []))

    @property
    def queues(self) -> list[Queue]:
        """Every queue the FM owns: its task queues, their dead-letter queues and the drain's parking queues,
        its retries' delay queues and those its module declares."""
        out: list[Queue] = []
        for q in self.task_queues:
            out.append(q)
            if isinstance(q, DeadLetteringQueue) and q.dead_letters is not None:
                out += [q.dead_letters, parked_queue(q.dead_letters)]
        mine = {str(q.name) for q in self.task_queues}
        policies = {id(d): d for task in self.app.tasks.values() for f in layers(getattr(task, "run", None))
                    if isinstance(d := getattr(f, "delay_queues", None), DelayQueues) and d.queue in mine}  # every policy
        for found in (*policies.values(), *self.delays):
            out += found.queues()
        out += self.declared
        return list({str(q.name): q for q in out}.values())

    @property
    def dead_letter_queue(self) -> Queue | None:
        found = next((q.dead_letters for q in self.task_queues if isinstance(q, DeadLetteringQueue)), None)
        if found is not None:
            return found
        for q in self.task_queues:  # dead-lettering set with RabbitMQ's own queue arguments
            args = q.queue_arguments or {}
            exchange, key = args.get("x-dead-letter-exchange"), args.get("x-dead-letter-routing-key", q.routing_key)
            if exchange:
                return next((d for d in self.declared if d.exchange.name == exchange
                             and d.routing_key == key), None)
        return None

    @property
    def queue_names(self) -> tuple[str, ...]:
        return tuple(str(q.name) for q in self.queues)

    @property
    def exchange_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(str(q.exchange.name) for q in self.queues))

    @property
    def beat(self) -> bool:
        return bool(self.app.conf.beat_schedule)

    @property
    def prefetch_one(self) -> bool:
        """The worker holds only what it runs (``worker_prefetch_multiplier = 1``)."""
        return int(self.app.conf.worker_prefetch_multiplier or 4) == 1

    @property
    def concurrency(self) -> int:
        return int(self.app.conf.worker_concurrency or 1)

    def worker_args(self) -> list[str]:
        """The flags of ``celery -A <module> worker`` for this FM (as its docstring gives them)."""
        return [*WORKER_FLAGS, *(["-B"] if self.beat else [])]

    def worker_command(self) -> str:
        """The worker command of the FM docstring's "Run it alone", as typed from the repository's folder."""
        env = "".join(f"{k}={v} " for k, v in self.worker_env)
        return f"{env}.venv/bin/celery -A {self.module} worker {' '.join(self.worker_args())}"

    def submit_command(self) -> str:
        """The by-hand submitter's command, the second of "Run it alone" (``lab.by_hand``)."""
        return f".venv/bin/python {self.module}.py"

    @property
    def bounds_stated(self) -> bool:
        """The bounds below are a lesson's stated ceilings (an exercise's check), not this program's own exact ones."""
        return False

    @property
    def delivery_bound(self) -> int | None:
        """Deliveries before RabbitMQ 3.x dead-letters a message: ``x-delivery-limit + 1``."""
        return next((b for q in self.task_queues if (b := bound_of(q)) is not None), None)

    @property
    def retry_policy(self) -> RetryPolicy | None:
        found = [getattr(f, "retry_policy", None) for f in layers(self.parse_document.run)]
        return next((p for p in found if isinstance(p, RetryPolicy)), None)

    @property
    def hard_timeout(self) -> float | None:
        return _timeout(self.parse_document, "hard_timeout_seconds")

    def fetch_hard_timeout(self) -> float | None:
        return _timeout(self.fetch_document, "hard_timeout_seconds") if self.fetch_document is not None else None


def _timeout(task: Task[Any, Any], attribute: str) -> float | None:
    """A deadline ``@hard_timeout`` keeps on a task's decorator stack (None when it has none)."""
    found = [getattr(f, attribute, None) for f in layers(task.run)]
    return next((float(s) for s in found if isinstance(s, (int, float))), None)


class NotAnFm(Exception):
    """A module that does not hold an FM program (app, tasks, submit)."""


def from_module(module: ModuleType, member: str = "parse_document", body: str = "notify") -> Fm:
    """The program in ``module``; a case study names its chord member and body (``score_chunk``, ``reconcile``)."""
    found, submit = getattr(module, "app", None), getattr(module, "submit", None)
    if not isinstance(found, Celery) or not callable(submit):
        raise NotAnFm(f"{module.__name__} has no Celery `app` and `submit`")
    app = cast(Celery, found)
    short = short_of_app(app.main) or short_name(module.__name__)
    try:
        tasks = {name: app.tasks[f"{module.__name__}.{name}"] for name in (member, body)}
        probe = app.tasks[f"{short}.probe"]
    except KeyError as exc:
        raise NotAnFm(f"{module.__name__} does not define the task {exc}") from exc
    head = app.tasks.get(f"{module.__name__}.fetch_document")
    delays = tuple(v for v in vars(module).values() if isinstance(v, DelayQueues))
    env = cast(dict[str, str], getattr(module, "WORKER_ENV", None) or {})
    mine = {id(q) for q in cast(list[Queue], list(app.conf.task_queues or []))}
    declared = tuple(v for v in vars(module).values() if isinstance(v, Queue) and id(v) not in mine
                     and not isinstance(v, DeadLetteringQueue))
    return Fm(short, module.__name__, app, cast(Submit, submit), tasks[member], tasks[body], probe, head, delays,
              tuple((str(k), str(v)) for k, v in env.items()), declared)


def load_module(name: str, folder: Path | None = None, member: str = "parse_document", body: str = "notify") -> Fm:
    """Import the program ``name`` (from ``folder`` too, for a variant) and read it."""
    if folder is not None and str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    return from_module(importlib.import_module(name), member, body)
