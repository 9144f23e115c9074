"""A carrier's cargo manifest (UN/EDIFACT IFCSUM): the synthetic interchange, its split, its parse, its keys.

An IFCSUM interchange is one line of segments, each a three-letter tag and data
elements, ended by ``'``. Elements are separated by ``+``, the components of an
element by ``:``, and ``?`` releases the character after it: a shipper called
``O'NEILL + SONS`` is sent as ``O?'NEILL ?+ SONS``. The interchange opens with
``UNA`` (those six service characters) and ``UNB`` (sender, recipient, date,
control reference), its message with ``UNH``; each consignment is a group that
starts at a ``CNI`` segment and runs to the next ``CNI`` or to the message's
``UNT`` (which counts the message's segments); ``UNZ`` closes the interchange.

- ``generate(seed, consignments, deviations, resend=0, batch_id=None)``: a
  ``Manifest``: the text, its batch id, and what a check must find for each
  consignment (``truth``, one ``Expected`` each).
  Consignment ``i`` (0-based) deviates as ``Deviations`` says: every N-th one,
  the kinds taken in turn, or at explicit indices. ``resend=n`` is the carrier
  sending the same consignments again: a new control reference (so a new batch
  id), a later preparation time, and every ETA moved (a ``DTM`` in each group).
- ``split(text)``: one ``Unit`` per ``CNI`` group, its segments re-serialised as
  EDIFACT text (``raw``, what keys and dead-letter records hold); ``envelope(text)``
  reads the ``UNB`` alone. A text that is not a whole interchange (truncated, a
  ``UNT`` whose count is wrong) raises ``MalformedInterchange``: none of it is
  dispatched.
- ``parse_unit(unit)``: a ``Consignment``, or ``UnitRejected`` with a short
  ``reason`` code and a sentence (``detail``): the B/L reference first (without it
  nothing can be booked: ``RFF+BM``, else the ``CNI``'s document number), then
  each segment's shape. Every rejection is the carrier's to mend: retrying it
  cannot help. A container whose ISO 6346 check digit (``python-stdnum``) is
  wrong is refused on its own (``Consignment.rejected_containers``, with its
  reason): the B/L and its other containers are not.
- What real senders send, and this module reads: an ``NAD`` that names its party
  by a code alone or by unstructured lines alone; a B/L in the ``CNI``; gross
  weights as ``MEA+AAE+G``, ``MEA+WT+G`` (a goods item's) or ``MEA+WT+AAD`` (the
  consignment's total, which wins over the items' sum), in KGM or TNE; bytes in
  the character set the ``UNB`` syntax identifier names (``CHARSETS``: UNOA/UNOB
  ASCII, UNOC ISO 8859-1, ..., UNOW/UNOY UTF-8; ``decode_interchange``) with or
  without a UTF-8 byte order mark; segments one per line.
- ``consignment_key``: sha256 of the carrier (the ``UNB`` sender) and the B/L
  number. A B/L number is unique for the carrier that issued it, so the pair names
  the consignment in every manifest that carries it. Not the batch id: a re-sent
  manifest comes under a new one. Not the raw segment: a re-send may differ in a
  segment that does not change the consignment (here the ETA's ``DTM``).
  ``unit_key`` (carrier and raw text) names a unit that has no B/L to key on.
- ``check_containers(unit)``: every ``EQD+CN`` number of a unit checked with ISO
  6346, nothing else (``BadContainerNumber`` naming the first bad one).

The write-up's own split, B/L regular expression and key are in ``writeup.py``,
as it publishes them.

Why a parser and not ``text.split("CNI+")``: text is free to contain ``CNI+``. A
shipper's name that ends in ``...TECNI`` is followed by the ``+`` that separates it
from the street; a free text may end in ``CNI`` before its language element; and
a release character makes ``CNI?+`` or ``?'`` data, not syntax. pydifact's
tokenizer honours the release character, so a group starts only at a segment
whose tag is ``CNI``. The ``escaped_text`` deviation plants one such ``CNI+`` in a
consignment that is otherwise valid.

pydifact is the one EDIFACT library for Python in wide use (typed, it reads ``UNA``
and release characters, and writes segments back); everything of it this module
uses sits in one section, behind ``_read`` (text to typed segments) and ``_text``
(segments back to text).
Pure and deterministic: no I/O, no clock, no global random state.

One piece: the interchange's syntax, its split and its keys are one format: the generator writes what the
parser reads.
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Annotated, Literal, NamedTuple, cast, get_args, overload

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydifact.constants import EDI_DEFAULT_DIRECTORY, EDI_DEFAULT_VERSION, Element
from pydifact.control.characters import Characters
from pydifact.exceptions import EDISyntaxError
from pydifact.exceptions import ValidationError as EdifactValidationError
from pydifact.parser import Parser
from pydifact.segments import Segment, SegmentFactory
from pydifact.serializer import Serializer
from stdnum import iso6346
from stdnum.exceptions import InvalidChecksum
from stdnum.exceptions import ValidationError as NumberInvalid

Reason = Literal["booking_only", "no_reference", "bad_check_digit", "bad_container", "malformed_segment",
                 "malformed_interchange", "bad_encoding"]
"""Why input was refused, as a code to count and route by; the sentence is the error's ``detail``."""


class ManifestError(Exception):
    """Input that no retry can mend. ``reason``: a ``Reason`` code; ``detail``: one sentence for a person.

    Its ``args`` are its constructor's arguments, so it pickles and a result backend rebuilds it."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(reason, detail)
        self.reason: Reason = reason
        self.detail = detail

    def __str__(self) -> str:
        return self.detail


class MalformedInterchange(ManifestError):
    """The manifest as a whole cannot be split (unreadable, truncated, counts that disagree): dispatch none of it."""


class UnitRejected(ManifestError):
    """One consignment only the carrier can mend; ``bl_number`` is its B/L when it has one."""

    def __init__(self, reason: Reason, detail: str, bl_number: str | None = None) -> None:
        super().__init__(reason, detail)
        self.args = (reason, detail, bl_number)
        self.bl_number = bl_number


class MissingBillOfLading(UnitRejected):
    """No ``RFF+BM``: ``booking_only`` when the carrier sent a booking ``RFF+BN`` instead, else ``no_reference``."""


class BadContainerNumber(UnitRejected):
    """An ``EQD+CN`` container number that is not ISO 6346: ``bad_check_digit`` or ``bad_container``."""


class MalformedSegment(UnitRejected):
    """A segment of the unit that cannot be read as IFCSUM says it must be: ``malformed_segment``."""


# --- the models ---------------------------------------------------------------------------------------------------

def _iso6346(number: str) -> str:
    try:
        return iso6346.validate(number)
    except NumberInvalid as error:
        raise ValueError(f"{number!r} is not an ISO 6346 container number: {error}") from None


ContainerNumber = Annotated[str, AfterValidator(_iso6346)]
"""Owner code (3 letters), category (U, J, Z or R), six digits, check digit: ``BLTU1234568``."""


class Unit(BaseModel):
    """One ``CNI`` consignment group as dispatched; JSON-safe (``model_dump()``, ``Unit.model_validate(...)``)."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    index: int = Field(ge=0)  # position in the manifest, 0-based (its CNI sequence number is index + 1 here)
    carrier: str = Field(min_length=1)  # the interchange's sender (UNB): the unit alone does not say it
    raw: str = Field(min_length=1)  # the group's segments re-serialised (UNA's default characters)


class Party(BaseModel):
    """An ``NAD`` party: ``CZ`` shipper (consignor), ``CN`` consignee, ``N1`` notify party.

    A sender identifies a party by a code (C082, ``NAD+CZ+5412345000013::9``), by unstructured name-and-address
    lines (C058, ``NAD+CN++ACME LTD:1 DOCK ROAD:HULL``), by a structured name and address (C080 and on), or by
    several of them; one is enough. ``name`` is the structured name, else the C058 lines; '' when only a code."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    role: str = Field(pattern=r"^[A-Z0-9]{1,3}$")
    code: str | None = Field(default=None, max_length=35)
    name: str = Field(max_length=350)
    street: str
    city: str
    postcode: str
    country: str = Field(pattern=r"^([A-Z]{2})?$")


class RejectedContainer(BaseModel):
    """A container of a consignment that failed ISO 6346: the container is refused, the B/L is not."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    number: str
    reason: Literal["bad_check_digit", "bad_container"]
    detail: str


class Consignment(BaseModel):
    """A consignment that can be forwarded: a B/L number and only valid container numbers.

    ``carrier`` and ``index`` come from the ``Unit``; both are None when only the raw text was parsed."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    carrier: str | None
    index: int | None
    bl_number: str = Field(min_length=1, max_length=70)
    booking: str | None
    parties: tuple[Party, ...]
    containers: tuple[ContainerNumber, ...]
    rejected_containers: tuple[RejectedContainer, ...] = ()  # refused one by one, each with its reason
    goods_items: int = Field(ge=0)
    packages: int = Field(ge=0)
    gross_weight_kg: Decimal = Field(ge=0)

    def party(self, role: str) -> Party | None:
        """The first party in ``role`` (``CZ``, ``CN``, ``N1``), or None."""
        return next((p for p in self.parties if p.role == role), None)


# --- pydifact, behind three functions -----------------------------------------------------------------------------

SERVICE_CHARACTERS = ":+.? '"
"""UNA's six: component separator, data separator, decimal mark, release character, reserved, terminator."""
_CHARACTERS = Characters.from_str(SERVICE_CHARACTERS)
_SERIALIZER = Serializer(_CHARACTERS)


class _Unvalidated(SegmentFactory):
    """pydifact's factory without its directory check: pydifact 0.2.3 ships no service-segment directory, so that
    check only warns once per segment tag; what this module needs of each segment, it checks itself."""

    @staticmethod
    def create_segment(name: str, *elements: Element, validate: bool = True, version: str = EDI_DEFAULT_VERSION,
                       directory: str = EDI_DEFAULT_DIRECTORY) -> Segment:
        return SegmentFactory.create_segment(name, *elements, validate=False, version=version, directory=directory)


class _Segment(NamedTuple):
    """A segment as this module reads it: pydifact's, with its tag typed (pydifact builds it from untyped ``*args``)."""

    tag: str
    elements: list[Element]  # a simple element is a str, a composite one the list of its components
    source: Segment  # pydifact's, to write it back


class _Unreadable(Exception):
    """The text is not EDIFACT that pydifact can tokenise; the caller says whether a manifest or a unit."""


def _read(text: str) -> Iterator[_Segment]:
    """The segments of ``text`` after its ``UNA``, lazily (``UNA`` sets the service characters; without it, the
    defaults). A text without ``UNA`` gets the default one: pydifact looks for ``'UNA`` anywhere in such a text, and
    would take a released ``?'`` followed by ``UNA...`` in free text for a service string advice."""
    parser = Parser(factory=_Unvalidated(), characters=_CHARACTERS)
    try:
        for segment in parser.parse(text if text.startswith("UNA") else f"UNA{SERVICE_CHARACTERS}{text}"):
            tag = cast(str, getattr(segment, "tag"))  # the one cast: pydifact types ``tag`` as ``str | <untyped arg>``
            if tag != "UNA":
                yield _Segment(tag, segment.elements, segment)
    except (EDISyntaxError, EdifactValidationError, ValueError, IndexError) as error:
        raise _Unreadable(str(error)) from None


def _text(segments: list[_Segment]) -> str:
    """``segments`` as EDIFACT text, releasing ``? : + '`` in data: the inverse of ``_read``."""
    return _SERIALIZER.serialize([s.source for s in segments], with_una_header=False)


def _components(segment: _Segment, element: int) -> list[str]:
    """The components of data element ``element`` (0-based, after the tag); [] when absent."""
    if element >= len(segment.elements):
        return []
    value = segment.elements[element]
    return [value] if isinstance(value, str) else value


def _part(segment: _Segment, element: int, component: int = 0) -> str:
    """Component ``component`` of data element ``element`` (both 0-based, after the tag); '' when absent."""
    parts = _components(segment, element)
    return parts[component] if component < len(parts) else ""


# --- bytes to text ------------------------------------------------------------------------------------------------

CHARSETS: Mapping[str, str] = {
    "UNOA": "ascii", "UNOB": "ascii",  # ISO 646 subsets (A: upper case only; not enforced here)
    "UNOC": "iso8859-1", "UNOD": "iso8859-2", "UNOE": "iso8859-5", "UNOF": "iso8859-7", "UNOG": "iso8859-3",
    "UNOH": "iso8859-4", "UNOI": "iso8859-6", "UNOJ": "iso8859-8", "UNOK": "iso8859-9",
    "UNOW": "utf-8", "UNOY": "utf-8",  # ISO 10646-1; senders encode UNOY as UTF-8
}
"""The character set each ``UNB`` syntax identifier (0001) names, as Python's codec."""
UTF8_BOM = b"\xef\xbb\xbf"
_SYNTAX_ID = re.compile(rb"UNB(.)(UNO[A-Z])")  # after UNB, its data separator, then the syntax identifier


def charset(data: bytes | str) -> tuple[str, str]:
    """``(syntax identifier, codec)`` the interchange's ``UNB`` names; ``MalformedInterchange`` when it names
    none (``malformed_interchange``) or one this parser does not know (``bad_encoding``)."""
    head = data[:512] if isinstance(data, bytes) else data[:512].encode("ascii", errors="replace")
    found = _SYNTAX_ID.search(head)
    if found is None:
        raise MalformedInterchange("malformed_interchange", "no UNB syntax identifier (UNOA, UNOC, ...) in the "
                                   "interchange's first 512 bytes")
    syntax = found.group(2).decode("ascii")
    if syntax not in CHARSETS:
        raise MalformedInterchange("bad_encoding", f"the UNB syntax identifier {syntax} names a character set this "
                                   f"parser does not read (it reads {', '.join(CHARSETS)})")
    return syntax, CHARSETS[syntax]


def decode_interchange(data: bytes) -> str:
    """The interchange's text, decoded in the character set its ``UNB`` names, a leading UTF-8 byte order mark
    dropped (editors and some senders' tools write one whatever the character set). A byte that is not in that
    character set refuses the whole interchange (``bad_encoding``, naming the byte and where it is): decoding with
    replacement would book a name the sender did not send."""
    if data.startswith(UTF8_BOM):
        data = data[len(UTF8_BOM):]
    syntax, codec = charset(data)
    try:
        return data.decode(codec)
    except UnicodeDecodeError as error:
        byte = data[error.start]
        raise MalformedInterchange("bad_encoding", f"byte 0x{byte:02X} at offset {error.start} is not {syntax} "
                                   f"({codec}), the character set the UNB names") from None


def encode_interchange(text: str) -> bytes:
    """``text`` as the bytes a sender sends: in the character set its ``UNB`` names (the inverse of
    ``decode_interchange``)."""
    syntax, codec = charset(text)
    try:
        return text.encode(codec)
    except UnicodeEncodeError as error:
        raise MalformedInterchange("bad_encoding", f"{text[error.start]!r} at {error.start} cannot be sent as "
                                   f"{syntax} ({codec})") from None


def _as_text(data: str | bytes) -> str:
    if isinstance(data, bytes):
        return decode_interchange(data)
    return data[1:] if data.startswith("\ufeff") else data  # a BOM decoded along with the text


# --- the split ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Envelope:
    """The interchange header (``UNB``)."""

    carrier: str  # sender identification (0004)
    recipient: str  # recipient identification (0010)
    control_ref: str  # interchange control reference (0020): a sender uses a new one for every interchange it sends
    prepared: str  # date and time of preparation, as sent (YYMMDD:HHMM)

    @property
    def batch_id(self) -> str:
        """``<sender>-<control reference>``: new for every interchange, so new for a re-sent manifest."""
        return f"{self.carrier}-{self.control_ref}"


def _envelope(unb: _Segment) -> Envelope:
    env = Envelope(_part(unb, 1), _part(unb, 2), _part(unb, 4), f"{_part(unb, 3)}:{_part(unb, 3, 1)}")
    if not env.carrier or not env.control_ref:
        raise MalformedInterchange("malformed_interchange", "the UNB header has no sender or no control reference")
    return env


def envelope(text: str | bytes) -> Envelope:
    """The interchange's ``UNB``, read without tokenising the rest (bytes are decoded as ``split`` does)."""
    text = _as_text(text)
    try:
        for segment in _read(text):
            if segment.tag == "UNB":
                return _envelope(segment)
            break
    except _Unreadable as error:
        raise MalformedInterchange("malformed_interchange", f"not an EDIFACT interchange: {error}") from None
    raise MalformedInterchange("malformed_interchange", "the interchange does not start with a UNB header")


def split(text: str | bytes) -> list[Unit]:
    """One ``Unit`` per ``CNI`` group of every message, in order, indices from 0. Bytes are decoded in the character
    set the ``UNB`` names (``decode_interchange``); a leading byte order mark is dropped."""
    try:
        return _split(_as_text(text))
    except _Unreadable as error:
        raise MalformedInterchange("malformed_interchange", f"not an EDIFACT interchange: {error}") from None


def _split(text: str) -> list[Unit]:
    def bad(detail: str) -> MalformedInterchange:
        return MalformedInterchange("malformed_interchange", detail)

    segments = _read(text)
    first = next(segments, None)
    if first is None or first.tag != "UNB":
        raise bad("the interchange does not start with a UNB header")
    env = _envelope(first)
    units: list[Unit] = []
    group: list[_Segment] = []
    message_ref: str | None = None  # the open message's reference, None between messages
    counted = messages = 0
    closed = False

    def close_group() -> None:
        if group:
            units.append(Unit(index=len(units), carrier=env.carrier, raw=_text(group)))
            group.clear()

    for segment in segments:
        tag = segment.tag
        if closed:
            raise bad(f"a {tag} segment follows the UNZ trailer")
        if message_ref is None:  # between messages: UNH or UNZ only
            if tag == "UNH":
                message_ref, counted, messages = _part(segment, 0), 1, messages + 1
            elif tag == "UNZ":
                if _part(segment, 0) != str(messages) or _part(segment, 1) != env.control_ref:
                    raise bad(f"UNZ counts {_part(segment, 0)} message(s) of interchange {_part(segment, 1)}; "
                              f"found {messages} of {env.control_ref}")
                closed = True
            else:
                raise bad(f"a {tag} segment outside any UNH..UNT message")
            continue
        counted += 1
        if tag == "UNH":
            raise bad(f"message {message_ref} has no UNT before the next UNH")
        if tag == "UNT":
            close_group()
            if _part(segment, 0) != str(counted) or _part(segment, 1) != message_ref:
                raise bad(f"UNT of message {_part(segment, 1)} counts {_part(segment, 0)} segments; "
                          f"message {message_ref} has {counted}")
            message_ref = None
        elif tag == "CNI":
            close_group()
            group.append(segment)
        elif group:
            group.append(segment)
    if not closed:
        raise bad("the interchange ends without its UNZ trailer (truncated?)")
    return units


# --- the parse ----------------------------------------------------------------------------------------------------

_COUNT = re.compile(r"[0-9]+")
_WEIGHT = re.compile(r"[0-9]+(?:[.,][0-9]+)?")  # either decimal mark (ISO 9735); no thousands separator


def _unit_segments(raw: str) -> list[_Segment]:
    try:
        segments = list(_read(raw))
    except _Unreadable as error:
        raise MalformedSegment("malformed_segment", f"the unit is not EDIFACT text: {error}") from None
    if not segments or segments[0].tag != "CNI":
        raise MalformedSegment("malformed_segment", "a unit must start with its CNI segment")
    return segments


def _references(segments: list[_Segment]) -> tuple[str | None, str | None]:
    """``(bill of lading, booking number)``, None when absent. The B/L is ``RFF+BM``'s number, else the document
    number of the group's ``CNI`` (``CNI+1+MEDU1234567``: some senders carry the transport document there); the
    booking number is ``RFF+BN``'s."""
    found: dict[str, str] = {}
    for segment in segments:
        if segment.tag == "RFF" and (qualifier := _part(segment, 0)) in ("BM", "BN"):
            number = _part(segment, 0, 1)
            if not number:
                raise MalformedSegment("malformed_segment", f"RFF+{qualifier} has no number", found.get("BM"))
            if found.setdefault(qualifier, number) != number:
                raise MalformedSegment("malformed_segment", f"two RFF+{qualifier} numbers in one consignment: "
                                       f"{found[qualifier]} and {number}", found.get("BM"))
    cni = _part(segments[0], 1) if segments and segments[0].tag == "CNI" else ""
    return found.get("BM") or cni or None, found.get("BN")


def _missing_bl(booking: str | None) -> MissingBillOfLading:
    if booking is not None:
        return MissingBillOfLading("booking_only", "booking reference RFF+BN but no bill of lading RFF+BM "
                                   f"(booking {booking})")
    return MissingBillOfLading("no_reference", "no RFF+BM bill of lading reference")  # nor a CNI document number


def _container(number: str, bl_number: str | None) -> str:
    """``number`` as ISO 6346 has it, or ``BadContainerNumber`` naming it (and the check digit it should have)."""
    try:
        return iso6346.validate(number)
    except InvalidChecksum:
        compact = iso6346.compact(number)
        raise BadContainerNumber("bad_check_digit", f"container {compact} has check digit {compact[-1]}; "
                                 f"ISO 6346 gives {iso6346.calc_check_digit(compact[:10])}", bl_number) from None
    except NumberInvalid:
        raise BadContainerNumber("bad_container", f"container number {number!r} is not ISO 6346 (owner code, "
                                 "category U/J/Z/R, six digits, check digit)", bl_number) from None


def parse_unit(unit: Unit | str) -> Consignment:
    """The unit as a ``Consignment``; ``UnitRejected`` (its subclass says which) when only the carrier can mend it."""
    raw, carrier, index = (unit, None, None) if isinstance(unit, str) else (unit.raw, unit.carrier, unit.index)
    segments = _unit_segments(raw)
    bl_number, booking = _references(segments)
    if bl_number is None:
        raise _missing_bl(booking)

    def malformed(detail: str) -> MalformedSegment:
        return MalformedSegment("malformed_segment", detail, bl_number)

    parties: list[Party] = []
    numbers: list[str] = []
    goods_items = packages = 0
    item_weight, total_weight = Decimal(0), None  # the goods items' gross weights; the consignment's own total
    for segment in segments[1:]:
        match segment.tag:
            case "CNI":
                raise malformed("a second CNI segment inside one consignment unit")
            case "NAD":
                parties.append(_party(segment, malformed))
            case "GID":
                count = _part(segment, 1)
                if not _COUNT.fullmatch(count):
                    raise malformed(f"GID+{_part(segment, 0)}: number of packages {count!r} is not a whole number")
                goods_items, packages = goods_items + 1, packages + int(count)
            case "MEA" if (kind := _weight_kind(segment)) is not None:
                kilograms = _kilograms(segment, malformed)
                if kind == "item":
                    item_weight += kilograms
                else:
                    total_weight = (total_weight or Decimal(0)) + kilograms
            case "EQD" if _part(segment, 0) == "CN":
                if not (number := _part(segment, 1)):
                    raise malformed("EQD+CN has no container number")
                numbers.append(number)
            case _:  # DTM, FTX, ...: nothing this pipeline forwards
                pass
    containers: list[str] = []
    refused: list[RejectedContainer] = []
    for number in numbers:  # a bad container is refused on its own; the B/L and its other containers go on
        try:
            containers.append(_container(number, bl_number))
        except BadContainerNumber as error:
            refused.append(RejectedContainer(number=number, reason=cast(Literal["bad_check_digit", "bad_container"],
                                                                        error.reason), detail=error.detail))
    try:
        return Consignment(carrier=carrier, index=index, bl_number=bl_number, booking=booking, parties=tuple(parties),
                           containers=tuple(containers), rejected_containers=tuple(refused), goods_items=goods_items,
                           packages=packages,
                           gross_weight_kg=total_weight if total_weight is not None else item_weight)
    except ValidationError as error:  # a B/L number longer than RFF's 70 characters
        raise malformed(_problem(error)) from None


_ITEM_WEIGHTS = {("AAE", "G"), ("WT", "G"), ("WT", "AAB")}  # a goods item's gross weight (G; AAB: its item weight)
_TOTAL_WEIGHTS = {("WT", "AAD"), ("AAE", "AAD")}  # the consignment's gross weight (AAD)
_TO_KILOGRAMS = {"KGM": Decimal(1), "TNE": Decimal(1000)}


def _weight_kind(segment: _Segment) -> Literal["item", "total"] | None:
    """Which gross weight an ``MEA`` gives: a goods item's, the consignment's total, or none (None)."""
    pair = (_part(segment, 0), _part(segment, 1))
    return "item" if pair in _ITEM_WEIGHTS else "total" if pair in _TOTAL_WEIGHTS else None


def _kilograms(segment: _Segment, malformed: Callable[[str], MalformedSegment]) -> Decimal:
    unit_code, value = _part(segment, 2, 0), _part(segment, 2, 1)
    if unit_code not in _TO_KILOGRAMS or not _WEIGHT.fullmatch(value):
        raise malformed(f"MEA+{_part(segment, 0)}+{_part(segment, 1)} gross weight {value!r} {unit_code!r} is not "
                        "a number of KGM or TNE (one decimal mark, no thousands separator)")
    return Decimal(value.replace(",", ".")) * _TO_KILOGRAMS[unit_code]


def _party(segment: _Segment, malformed: Callable[[str], MalformedSegment]) -> Party:
    """An ``NAD``: identified by a code (C082), unstructured lines (C058), a structured name (C080), or several."""
    role, code = _part(segment, 0), _part(segment, 1) or None
    name = " ".join(c for c in _components(segment, 3) if c) or " ".join(c for c in _components(segment, 2) if c)
    if not name and not code:
        raise malformed(f"NAD+{role} identifies no party: no party code (C082), no name and address (C058, C080)")
    try:
        return Party(role=role, code=code, name=name, street=_part(segment, 4), city=_part(segment, 5),
                     postcode=_part(segment, 7), country=_part(segment, 8))
    except ValidationError as error:  # a country or role of the wrong shape
        raise malformed(f"NAD+{role}: {_problem(error)}") from None


def _problem(error: ValidationError) -> str:
    """The first problem pydantic found, naming its field: ``country: String should match pattern ...``."""
    problem = error.errors(include_url=False)[0]
    where = ".".join(str(part) for part in problem["loc"])
    return f"{where}: {problem['msg']}" if where else problem["msg"]


def bill_of_lading(unit: Unit | str) -> str | None:
    """The unit's ``RFF+BM`` number, None when it has none (``MalformedSegment`` when the unit is unreadable)."""
    return _references(_unit_segments(unit if isinstance(unit, str) else unit.raw))[0]


# --- the keys -----------------------------------------------------------------------------------------------------

def _digest(*parts: str) -> str:
    """sha256 over the parts, each prefixed by its length: no two different lists of parts give the same input."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


@overload
def consignment_key(item: Unit | Consignment, /) -> str: ...
@overload
def consignment_key(item: str, bl_number: str, /) -> str: ...
def consignment_key(item: Unit | Consignment | str, bl_number: str | None = None, /) -> str:
    """sha256 of carrier and B/L number: the same in every manifest that carries the consignment.

    ``consignment_key(unit)``, ``consignment_key(consignment)`` or ``consignment_key(carrier, bl_number)``. A unit
    with no ``RFF+BM`` has no such key (``MissingBillOfLading``)."""
    if isinstance(item, str):
        if bl_number is None:
            raise TypeError("consignment_key(carrier, bl_number): the B/L number is missing")
        return _digest(item, bl_number)
    if isinstance(item, Unit):
        found, booking = _references(_unit_segments(item.raw))
        if found is None:
            raise _missing_bl(booking)
        return _digest(item.carrier, found)
    if item.carrier is None:
        raise ValueError("this consignment was parsed from raw text alone: call consignment_key(carrier, bl_number)")
    return _digest(item.carrier, item.bl_number)


@overload
def unit_key(item: Unit, /) -> str: ...
@overload
def unit_key(item: str, raw: str, /) -> str: ...
def unit_key(item: Unit | str, raw: str | None = None, /) -> str:
    """sha256 of carrier and raw text: a unit that may have no B/L to key on (``unit_key(unit)`` or
    ``unit_key(carrier, raw)``). A re-send that changes any segment of the unit gets a new one."""
    if isinstance(item, Unit):
        return _digest(item.carrier, item.raw)
    if raw is None:
        raise TypeError("unit_key(carrier, raw): the raw text is missing")
    return _digest(item, raw)


def check_containers(unit: Unit | str) -> tuple[str, ...]:
    """Every ``EQD+CN`` number of the unit passes ISO 6346, else ``BadContainerNumber``."""
    segments = _unit_segments(unit if isinstance(unit, str) else unit.raw)
    bl_number = _references(segments)[0]
    return tuple(_container(_part(s, 1), bl_number) for s in segments if s.tag == "EQD" and _part(s, 0) == "CN")


# --- the synthetic manifest ---------------------------------------------------------------------------------------

DeviationKind = Literal["booking_only", "no_reference", "bad_check_digit", "escaped_text", "malformed"]
"""What a carrier gets wrong, or legal text that breaks a naive split. ``booking_only``: ``RFF+BN`` and no
``RFF+BM``; ``no_reference``: neither; ``bad_check_digit``: the first container's check digit is off; ``escaped_text``
(valid): by ``index % 3``, a shipper's name ending in ``TECNI``, a free text with a released ``CNI?+`` and ``?'`` that
ends in ``CNI``, or one where ``?'`` comes right before ``CNI``; ``malformed``: by ``index % 3``, a package count with
the letter O for a zero, a weight with a thousands separator, an ``EQD+CN`` without its number."""
DEVIATION_KINDS: tuple[DeviationKind, ...] = get_args(DeviationKind)
EXPECTED_REASON: Mapping[DeviationKind, Reason | None] = {
    "booking_only": "booking_only", "no_reference": "no_reference",
    "bad_check_digit": None,  # the container is refused (``Consignment.rejected_containers``), not the B/L
    "escaped_text": None, "malformed": "malformed_segment",
}


@dataclass(frozen=True)
class Deviations:
    """Which consignments deviate. With ``every`` = N, the k-th multiple of N (index kN - 1) deviates as
    ``kinds[(k - 1) % len(kinds)]``; ``at`` names indices (0-based) and wins. Each index's kind depends on that index
    alone, so an entry of ``at`` moves no other consignment's kind."""

    every: int = 0
    kinds: tuple[DeviationKind, ...] = DEVIATION_KINDS
    at: Mapping[int, DeviationKind] = field(default_factory=dict[int, DeviationKind])

    def __post_init__(self) -> None:
        if self.every < 0 or (self.every and not self.kinds) or any(i < 0 for i in self.at):
            raise ValueError(f"deviations need every >= 0, kinds when every > 0, indices >= 0: {self!r}")

    def kind(self, index: int) -> DeviationKind | None:
        """The deviation of consignment ``index``, or None."""
        if index in self.at:
            return self.at[index]
        if self.every and (index + 1) % self.every == 0:
            return self.kinds[((index + 1) // self.every - 1) % len(self.kinds)]
        return None


@dataclass(frozen=True)
class Expected:
    """What a check must find for one consignment."""

    index: int
    bl_number: str | None  # the RFF+BM sent; None when the carrier sent none
    deviation: DeviationKind | None

    @property
    def reason(self) -> Reason | None:
        """The ``UnitRejected.reason`` that ``parse_unit`` must give, None when it must parse."""
        return EXPECTED_REASON[self.deviation] if self.deviation else None


@dataclass(frozen=True)
class Manifest:
    """An IFCSUM interchange and its ground truth."""

    text: str
    batch_id: str  # what the receiving system calls it: Envelope.batch_id (<sender>-<control reference>) by default
    carrier: str  # the UNB sender
    truth: tuple[Expected, ...]  # one per consignment, in order

    def with_reason(self, reason: Reason | None) -> tuple[Expected, ...]:
        """The consignments ``parse_unit`` must reject with ``reason`` (None: those it must parse)."""
        return tuple(e for e in self.truth if e.reason == reason)

    @property
    def parsable(self) -> tuple[Expected, ...]:
        return self.with_reason(None)

    @property
    def rejected(self) -> tuple[Expected, ...]:
        return tuple(e for e in self.truth if e.reason is not None)


_CARRIERS = (("BLTC", "BALTIC COAST LINE"), ("ORML", "ORIENT MERIDIAN LINES"), ("ACSL", "ATLANTIC CRESCENT SHIPPING"),
             ("HNFS", "HANSEATIC FEEDER SERVICES"))
_TERMINALS = (("NLRTMTOS", "NLRTM"), ("DEHAMTOS", "DEHAM"), ("BEANRTOS", "BEANR"))  # recipient, port of discharge
_LOAD_PORTS = ("CNSHA", "SGSIN", "KRPUS", "BRSSZ", "USNYC", "ESVLC")
_VESSELS = ("NORDIC DAWN", "MERIDIAN STAR", "CRESCENT BAY", "HANSA PIONEER")
_NAMES = ("NORDIC TIMBER AB", "SHANGHAI BRIGHT TEXTILE CO LTD", "KOWALSKI FOODS SP Z O O", "PACIFIC RIM AUTO PARTS INC",
          "GREEN VALLEY COFFEE EXPORTS", "HANSEN & SOENNER GMBH", "DELTA FROZEN SEAFOOD SA", "BUSAN MARINE ELECTRONICS",
          "O'NEILL & DAUGHTERS LTD", "M+K INDUSTRIAL SUPPLY", "ALPHA:OMEGA LOGISTICS BV", "D'ANGELO + FIGLI SRL",
          "WHY? NOT TRADING CO", "L'ATELIER DU MEUBLE SARL")  # the last six hold a character that must be released
_ADDRESSES = (("12 HARBOUR ROAD", "ROTTERDAM", "3011", "NL"), ("4 KAISTRASSE", "HAMBURG", "20457", "DE"),
              ("88 PUDONG AVENUE", "SHANGHAI", "200120", "CN"), ("1 TANJONG PAGAR", "SINGAPORE", "088443", "SG"),
              ("RUA DO PORTO 210", "SANTOS", "11010", "BR"), ("UL. PORTOWA 7", "GDANSK", "80-601", "PL"),
              ("250 PIER STREET", "NEWARK", "07114", "US"), ("AV. DEL PUERTO 31", "VALENCIA", "46024", "ES"))
_GOODS = ("FROZEN SHRIMP", "AUTOMOTIVE SPARE PARTS", "COTTON T-SHIRTS", "GREEN COFFEE BEANS IN JUTE BAGS",
          "SAWN PINE TIMBER", "FURNITURE: FLAT PACKED", "CERAMIC TILES + GROUT", "CHILDREN'S TOYS", "LED LAMPS 230V",
          "OLIVE OIL, EXTRA VIRGIN", "BICYCLES, UNASSEMBLED", "WHAT? NOT KNOWN: SAID TO CONTAIN PARTS")
_PACKAGES = ("CT", "PK", "BG", "PX", "DR", "CS")  # carton, package, bag, pallet, drum, case
_OWNERS = ("BLTU", "ORMU", "ACSU", "HNFU", "TXLU", "SGCU", "CRXU", "FLXU", "TGBU", "GESU")  # owner code + U
_SIZE_TYPES = ("22G1", "42G1", "45G1", "45R1")
_ESCAPED_TEXT = (  # each puts exactly one "CNI+" in the text outside a CNI segment, by index % 3
    ("NAD", "SERVEIS D'ENGINYERIA TECNI"),  # a shipper's name that ends in CNI, then the separator before its street
    ("FTX", "CARTONS MARKED 'LOT 7: CNI+4' SEE CARRIER'S CNI"),  # released CNI?+ and ?', then CNI before "+EN"
    ("FTX", "AS PER BOOKING NOTE 'CNI"),  # a naive split on "'" leaves a piece "CNI+EN"
)
_RELEASE = str.maketrans({c: "?" + c for c in "?:+'"})


@functools.cache  # the pools are small: each text is released once
def _esc(text: str) -> str:
    """``text`` as an EDIFACT data value: ``?`` before each of ``? : + '``."""
    return text.translate(_RELEASE)


@functools.cache
def _nad(role: str, name: str, address: tuple[str, str, str, str]) -> str:
    street, city, postcode, country = address
    return f"NAD+{role}+++{_esc(name)}+{_esc(street)}+{_esc(city)}++{postcode}+{country}'"


def _consignment(rng: random.Random, index: int, kind: DeviationKind | None, scac: str, bl_base: int,
                 eta: datetime) -> tuple[list[str], str | None]:
    """The segments of consignment ``index`` and the RFF+BM it carries. Every random draw is made whatever
    ``kind`` is, so a deviation changes its own consignment and nothing else of the manifest."""
    bl_number = f"{scac}{bl_base + index:09d}"
    booking_number, has_booking = f"{rng.randrange(10**8, 10**9)}", rng.random() < 0.6
    arrival = eta + timedelta(hours=rng.randrange(96))
    shipper, consignee = rng.choice(_NAMES), rng.choice(_NAMES)
    shipper_at, consignee_at = rng.choice(_ADDRESSES), rng.choice(_ADDRESSES)
    notify = rng.choice(_NAMES) if rng.random() < 0.3 else None
    goods = [(rng.randint(1, 120) * 10, rng.choice(_PACKAGES), rng.choice(_GOODS), rng.randrange(10_000, 280_000))
             for _ in range(rng.randint(1, 3))]  # packages, package type, description, weight in tenths of a kg
    containers: list[list[str]] = []
    for _ in range(rng.randint(1, 2)):
        owner_serial = f"{rng.choice(_OWNERS)}{rng.randrange(10**6):06d}"
        containers.append([owner_serial + iso6346.calc_check_digit(owner_serial), rng.choice(_SIZE_TYPES)])

    if kind == "bad_check_digit":
        good = int(containers[0][0][-1])
        containers[0][0] = containers[0][0][:-1] + str((good + 1 + index % 9) % 10)
    escaped = _ESCAPED_TEXT[index % 3] if kind == "escaped_text" else None
    if escaped and escaped[0] == "NAD":
        shipper = escaped[1]
    sent_bl = None if kind in ("booking_only", "no_reference") else bl_number
    booking = booking_number if kind == "booking_only" or (has_booking and kind != "no_reference") else None

    out = [f"CNI+{index + 1}'"]
    if sent_bl:
        out.append(f"RFF+BM:{sent_bl}'")
    if booking:
        out.append(f"RFF+BN:{booking}'")
    out.append(f"DTM+132:{arrival:%Y%m%d%H%M}:203'")  # estimated arrival: what a re-send moves
    out.append(_nad("CZ", shipper, shipper_at))
    out.append(_nad("CN", consignee, consignee_at))
    if notify:
        out.append(_nad("N1", notify, consignee_at))
    if escaped and escaped[0] == "FTX":
        out.append(f"FTX+AAI+++{_esc(escaped[1])}+EN'")
    for item, (count, package, description, tenths) in enumerate(goods, start=1):
        count_text, weight_text = str(count), f"{tenths // 10}.{tenths % 10}"
        if kind == "malformed" and item == 1 and index % 3 == 0:
            count_text = count_text[:-1] + "O"  # a zero typed as the letter O
        if kind == "malformed" and item == 1 and index % 3 == 1:
            weight_text = f"{tenths // 10:,}.{tenths % 10}"  # a thousands separator
        out.append(f"GID+{item}+{count_text}:{package}'")
        out.append(f"FTX+AAA+++{_esc(description)}'")
        out.append(f"MEA+AAE+G+KGM:{weight_text}'")
    for n, (number, size_type) in enumerate(containers):
        if kind == "malformed" and n == 0 and index % 3 == 2:
            number = ""  # an equipment segment without its number
        out.append(f"EQD+CN+{number}+{size_type}+++5'")
    return out, sent_bl


def generate(seed: int, consignments: int, deviations: Deviations | None = None, resend: int = 0,
             batch_id: str | None = None) -> Manifest:
    """An IFCSUM interchange of ``consignments`` consignment groups, the same for the same arguments.

    ``resend`` > 0: the carrier's ``resend``-th re-send of the same manifest (same consignments and B/L numbers; a
    new control reference and so a new batch id, a later preparation time, every ETA ``6 x resend`` hours later).
    ``batch_id`` replaces the default ``Envelope.batch_id`` in the ``Manifest`` (a lab run's own id); the text is
    the same either way."""
    if consignments < 0 or resend < 0:
        raise ValueError("consignments and resend must be >= 0")
    deviations = deviations or Deviations()
    rng = random.Random(seed)
    scac, carrier_name = rng.choice(_CARRIERS)
    recipient, discharge = rng.choice(_TERMINALS)
    loading, vessel = rng.choice(_LOAD_PORTS), rng.choice(_VESSELS)
    voyage = f"{rng.randrange(100, 1000)}{rng.choice('EWNS')}"
    imo = f"9{rng.randrange(10**6):06d}"
    departure = datetime(2025, 1, 1) + timedelta(days=rng.randrange(365), hours=rng.randrange(24))
    eta = departure + timedelta(days=rng.randrange(12, 36))
    control_ref = f"{rng.randrange(10**9) + resend:010d}"  # the sender's counter: one more per interchange sent
    bl_base = rng.randrange(10**8, 9 * 10**8)
    prepared = departure + timedelta(hours=1 + 6 * resend)
    shift = timedelta(hours=6 * resend)

    body = ["UNH+1+IFCSUM:D:99B:UN'", f"BGM+785+{scac}{voyage}{loading}+9'",
            f"DTM+137:{prepared:%Y%m%d%H%M}:203'",
            f"TDT+20+{voyage}+1++{scac}:172:182+++{imo}:146:11:{_esc(vessel)}'",
            f"LOC+9+{loading}:139:6'", f"LOC+11+{discharge}:139:6'",
            f"NAD+CA+{scac}:160:182++{_esc(carrier_name)}'"]
    expected: list[Expected] = []
    for index in range(consignments):
        kind = deviations.kind(index)
        segments, sent_bl = _consignment(rng, index, kind, scac, bl_base, eta + shift)
        body += segments
        expected.append(Expected(index, sent_bl, kind))
    body.append(f"UNT+{len(body) + 1}+1'")
    text = "".join([f"UNA{SERVICE_CHARACTERS}", f"UNB+UNOC:3+{scac}:ZZZ+{recipient}:ZZZ+"
                    f"{prepared:%y%m%d}:{prepared:%H%M}+{control_ref}'", *body, f"UNZ+1+{control_ref}'"])
    return Manifest(text, batch_id or f"{scac}-{control_ref}", scac, tuple(expected))
