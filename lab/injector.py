"""What the lab does to a running pipeline from outside: one interface for every fault injector.

A fault injector (Jepsen calls it a nemesis) is started, stepped from what the run observes, and
stopped; the runner (``lab.runner``) and the harness (``lab.harness``) call it without knowing which
lesson it serves. A lesson declares its injectors by name in its scenario (``lab.scenarios``), and a
side chord names the injector that drives it, if any.

The hooks, in the order a run meets them (each does nothing unless an injector says otherwise):

- ``prepare(fm, harnessed)``: before the run's worker starts, for an injector that needs services or
  workers of its own (a result backend it may stop, a broker node whose connections it may cut); it
  may return the program changed (another backend, the worker's environment). Only the harness calls
  it: a run by hand has none of these, so its ``needs_harness`` injectors are left out;
- ``attach(worker)``: the run's worker is ready;
- ``start(run)``: before the run's own chord is sent (set a gate, plan crashes);
- ``step(run)``: at every look at the run (every 20 ms): act when the moment has come;
- ``stop()``: the run ended, or failed: undo what is left undone (start a stopped server again).

And what the runner asks of it: ``ready(run, side)`` (may the side chord it drives be sent now),
``send(run, side)`` (send it: through a broker of its own, with heads already expired ...),
``busy(run)`` (the run may not end yet), ``paused()`` (read no result now: the backend is gone),
``observed()`` (what it adds to the run's ``Observations``). The harness asks ``serving(worker)`` (the
worker that serves now, after a deploy replaced the first), ``workers()`` (those it started, for the
harness to stop) and ``watch()`` (raise when one of them died).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from celery.result import AsyncResult

from lab.faults import Fault
from lab.fm import Fm
from lab.observe import Reader

if TYPE_CHECKING:
    from lab.workers import Worker


class SideView(Protocol):
    """One side chord of the run, as an injector sees it."""

    @property
    def tag(self) -> str: ...

    @property
    def run_id(self) -> str: ...

    @property
    def reader(self) -> Reader: ...

    @property
    def docs(self) -> tuple[str, ...]: ...

    @property
    def sent(self) -> bool: ...

    def ready(self) -> bool:
        """Sent, and its chord's result is in."""
        ...

    def submit(self) -> None:
        """Send it through the program's own ``submit``."""
        ...

    def submit_with(self, send: Callable[[list[str]], AsyncResult[Any]]) -> None:
        """Send it with ``send(doc_ids)`` instead (the documents stored first)."""
        ...


class RunView(Protocol):
    """The run, as an injector sees it."""

    @property
    def fm(self) -> Fm: ...

    @property
    def run_id(self) -> str: ...

    @property
    def reader(self) -> Reader: ...

    @property
    def faults(self) -> Mapping[str, Fault | None]: ...

    @property
    def chord(self) -> AsyncResult[Any] | None:
        """The run's own chord (its body's result), once sent."""
        ...

    def side(self, tag: str) -> SideView | None: ...


@dataclass(frozen=True)
class Harnessed:
    """What the harness gives an injector that starts workers or services of its own."""

    run_id: str
    stack: ExitStack  # what it enters here is left when the run ends
    spawn: Callable[[Fm, str, Mapping[str, str] | None], Worker]  # (program, part name, environment): a worker, started
    grace: float  # how long a worker it stops may take


class Injector:
    """A fault injector; every hook does nothing here (see the module's docstring)."""

    needs_harness: ClassVar[bool] = False
    """It starts workers or services of its own: only runs the harness makes have it (not a run by hand)."""

    def prepare(self, fm: Fm, harnessed: Harnessed) -> Fm:
        return fm

    def attach(self, worker: Worker) -> None:
        pass

    def start(self, run: RunView) -> None:
        pass

    def step(self, run: RunView) -> None:
        pass

    def stop(self) -> None:
        pass

    def ready(self, run: RunView, side: SideView) -> bool:
        return True

    def send(self, run: RunView, side: SideView) -> None:
        side.submit()

    def busy(self, run: RunView) -> bool:
        return False

    def paused(self) -> bool:
        return False

    def observed(self) -> Mapping[str, object]:
        return {}

    def serving(self, worker: Worker) -> Worker:
        return worker

    def workers(self) -> list[Worker]:
        return []

    def watch(self) -> None:
        pass


InjectorFactory = Callable[[], Injector]
"""How a scenario names an injector: each run makes its own."""
