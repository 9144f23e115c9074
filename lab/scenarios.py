"""Scenarios (DESIGN.md §2): which document meets which fault, and what the lab does to the run.

A lesson's scenario part (``lessons/<lesson>/scenario.py``) names the documents it adds, each with its
fault and what it is (``Doc``), the side chords it adds (``SideChord``: a chord of its own in the same
run, for a hard variant or an injector that needs one) and its fault injectors (``lab.injector``). The
registry (``lessons``) puts the parts of lessons 1..N together: scenario N is cumulative. The runner
writes each fault into its document's text (``lab.faults.document_text``), so the code under test meets
the fault as it is: an earlier program gets a later scenario with no switch and no extra argument.

A lesson may say what the runs of its symptom and of its hard variants need of the cumulative scenario
(``Needs``): those runs then meet only that (``Scenario.narrowed``), while its fixed run keeps the whole scenario,
where every earlier guarantee is checked again.

Order of submission: a document's ``place`` (its lesson's own documents first, then the hard variants',
then a burst, then what must come after the burst), then the lessons' order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from typing import TYPE_CHECKING

from lab.faults import Fault, THROTTLED
from lab.injector import Injector, InjectorFactory

if TYPE_CHECKING:
    from lab.hand import Hand, HandFactory

Place = Literal["own", "hard", "burst", "after burst"]
PLACES: tuple[Place, ...] = ("own", "hard", "burst", "after burst")
"""Where a document goes in the chord's header, in this order."""
MAIN = "main"
"""A side chord sent ``after`` the run's own chord: it, its injectors and the sides sent with it are over."""


@dataclass(frozen=True)
class Doc:
    """One document of a scenario: its id, its fault (None: a healthy one) and what it is, in words."""

    id: str
    fault: Fault | None
    what: str
    place: Place = "own"


@dataclass(frozen=True)
class SideChord:
    """A chord of its own in the same run (its pipeline ``<run_id>-<tag>``, its documents in that pipeline's
    store), sent through the program's ``submit`` unless its injector sends it otherwise."""

    tag: str
    docs: tuple[Doc, ...]
    what: str  # what it is, in words
    purpose: str = ""  # what the timeline says of it ("" for none; ``{foreign}``: the letters put before it)
    injector: str | None = None  # the scenario's injector that drives it (sends it, acts on it)
    after: tuple[str, ...] = ()  # sent once these are over (``MAIN``, or side tags); () with the run's own chord
    before: tuple[str, ...] = ()  # side tags (of earlier lessons) sent only once this one is over

    @property
    def faults(self) -> Mapping[str, Fault | None]:
        return {d.id: d.fault for d in self.docs}


@dataclass(frozen=True)
class Needs:
    """What a run that shows one symptom needs of its cumulative scenario: the documents of its own chord, in the
    scenario's order, and the side chords its check reads (each with the injector that drives it). A symptom's
    run checks that symptom alone, so the earlier lessons' faults only make it longer."""

    docs: tuple[str, ...]
    sides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Part:
    """What one lesson adds to the scenarios from its own on; ``symptom`` and ``hard``: what the run of its symptom
    (on the program before it) and of each hard variant (on its program before the hard fix) need of its scenario
    (None: the whole of it)."""

    docs: tuple[Doc, ...] = ()
    sides: tuple[SideChord, ...] = ()
    injectors: Mapping[str, InjectorFactory] = field(default_factory=lambda: {})
    by_hand: Mapping[str, HandFactory] = field(default_factory=lambda: {})  # an injector's by-hand steps, by its name
    symptom: Needs | None = None
    hard: Needs | None = None


@dataclass(frozen=True)
class Scenario:
    number: int
    faults: Mapping[str, Fault | None]
    sides: tuple[SideChord, ...] = ()
    injectors: Mapping[str, InjectorFactory] = field(default_factory=lambda: {})
    what: Mapping[str, str] = field(default_factory=lambda: {})  # each document's name in words
    by_hand: Mapping[str, HandFactory] = field(default_factory=lambda: {})

    @property
    def burst(self) -> tuple[str, ...]:
        """The documents throttled once (a burst of waiting retries), in order."""
        return tuple(d for d, f in self.faults.items() if f == THROTTLED)

    @property
    def docs(self) -> tuple[str, ...]:
        return tuple(self.faults)

    def side(self, tag: str) -> SideChord | None:
        return next((s for s in self.sides if s.tag == tag), None)

    def narrowed(self, needs: Needs) -> Scenario:
        """This scenario with only what ``needs`` names: its documents, its side chords and the injectors that
        drive them. A side kept is still sent after what it came after: a side left out is replaced by ``MAIN``
        (every side of the lessons comes after the run's own chord), and it is no longer waited for."""
        missing = [d for d in needs.docs if d not in self.faults] + [t for t in needs.sides if self.side(t) is None]
        if missing or not needs.docs:
            raise ValueError(f"scenario {self.number} cannot be narrowed to {needs}: "
                             f"{'no ' + ', '.join(missing) if missing else 'its own chord needs a document'}")
        kept = {MAIN, *needs.sides}
        sides = tuple(dataclasses.replace(s, after=tuple(dict.fromkeys(t if t in kept else MAIN for t in s.after)),
                                          before=tuple(t for t in s.before if t in kept))
                      for s in self.sides if s.tag in needs.sides)
        driving = {s.injector for s in sides if s.injector is not None}
        return Scenario(self.number, {d: f for d, f in self.faults.items() if d in needs.docs}, sides,
                        {name: make for name, make in self.injectors.items() if name in driving},
                        {d: w for d, w in self.what.items() if d in needs.docs},
                        {name: make for name, make in self.by_hand.items() if name in driving})

    def injectors_by_hand(self, hand: Hand | None = None) -> dict[str, Injector]:
        """Its injectors for a run the harness does not make (by hand, a test's): those that need no worker or
        service of the harness's (``Injector.needs_harness``), and with ``hand`` (a run by hand, ``lab.hand``)
        in place of those that do, the steps their lessons give the attendee (``Part.by_hand``)."""
        made = {name: make() for name, make in self.injectors.items()}
        found: dict[str, Injector] = {name: injector for name, injector in made.items() if not injector.needs_harness}
        if hand is not None:
            found.update({name: make(hand) for name, make in self.by_hand.items() if name in made})
        return found


def cumulative(number: int, parts: list[Part]) -> Scenario:
    """Scenario ``number``: the documents, side chords and injectors of ``parts`` (lessons 1..number)."""
    docs = [d for place in PLACES for part in parts for d in part.docs if d.place == place]
    injectors = {name: make for part in parts for name, make in part.injectors.items()}
    hands = {name: make for part in parts for name, make in part.by_hand.items()}
    return Scenario(number, {d.id: d.fault for d in docs}, tuple(s for part in parts for s in part.sides), injectors,
                    {d.id: d.what for d in docs}, hands)
