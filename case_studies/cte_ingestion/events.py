r"""Critical Tracking Events (FSMA 204): the contract, its idempotency key, and a synthetic stream.

- ``validate(raw, now=None)``: a ``CriticalTrackingEvent``, or a ``Quarantined`` holding the raw
  payload and every problem found (each with its field, error type and message). Bad input never
  raises: it is data about a producer. A quarantined payload is never retried, since the same
  bytes fail the same way on every attempt.
- ``idempotency_key(event)``: sha256 of ``"lot|type|source event id"``, the write-up's key.
- ``generate(seed, events, ...)``: what producers send (JSON-shaped dicts: growers' lots from harvesting
  to receiving, fishing businesses' from first land-based receiving, every event with its type's
  KDEs) and the ground truth a check needs: which payloads are invalid and why, which are resends,
  each lot's order.

The contract is strict (pydantic strict mode, frozen; an unknown field is kept as sent and named by
``unknown_fields``, for the caller to report, never fatal) and the wire format
is JSON: ``validate`` reads a dict as the JSON it stands for, so ``"2025-03-03T05:00:00Z"`` is a
time, ``"12.50"`` a quantity and ``"1"`` is not a sequence number.

The Key Data Elements the Food Traceability Rule requires per CTE type (21 CFR 1.1325-1.1350) are
one table, ``REQUIRED_KDES``: for each of the seven types, each KDE beyond what every event carries,
the field(s) that carry it and the rule's paragraph. A model validator reads it: a payload that
lacks a KDE its type requires (absent or null) is quarantined with one ``missing_kde`` problem per
KDE, located at it, whose message names the type and the paragraph ("a shipping event requires the
reference document number (21 CFR 1.1340(a)(8)): send reference_document_number"). Every KDE field
is typed whenever it is sent; a type that does not require it takes it too.

What the write-up's patterns miss:

- GLN ``^\d{13}$`` and GTIN ``^\d{12,14}$`` count digits. Every GS1 number ends in a mod-10
  check digit, there to catch a mistyped or misread digit; a pattern accepts nine numbers in ten
  that fail it (``WRITEUP_GLN`` and ``WRITEUP_GTIN`` keep them, for the test that shows it). In
  Python ``\d`` also matches any Unicode digit (Arabic-Indic ``١``), so the contract writes ``[0-9]``.
- The check digit comes from python-stdnum's ``stdnum.ean``: the GS1 mod-10 check over 8, 12, 13
  or 14 digits, which is the GTIN's and, over 13 digits, the GLN's. ``stdnum.gs1_128`` is not the
  tool: it checks GTINs inside element strings (AI 01, 02) but takes a GLN (AI 414) with any last
  digit. ``ean.validate`` also drops spaces and dashes before checking, so the pattern comes first:
  the contract takes a number as the producer must send it, never a repaired one.
- A quantity sent as a JSON number is, to most producers, a binary float already rounded
  (``0.1 + 0.2``), so it is refused: a quantity is a decimal string (``"12.50"``) read as a ``Decimal``.
- "Not in the future" needs a clock. ``now`` is injectable (``validate(raw, now=...)`` passes it
  as the validation context), so a check is deterministic; producers' clocks drift, so an event up
  to ``CLOCK_SKEW`` ahead is accepted (``skew=timedelta(0)`` is the write-up's literal rule).
- The key joins fields with ``|``; a lot code or source id holding ``|`` could make two events one
  key (``"A|shipping"`` + ``"x"`` against ``"A"`` + ``"shipping|x"``), so ``|`` is refused in both.

Pure and deterministic: no I/O, no global random state; the clock only when ``now`` is not given.

One piece: the contract (the KDEs each event type requires), its key and the stream generated from it must
agree line for line.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Annotated, Any, Literal, TypeAlias, TypedDict, cast, get_args

from pydantic import AfterValidator, AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, \
    ValidationInfo, field_validator, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError
from stdnum import ean

CteType = Literal["harvesting", "cooling", "initial_packing", "first_land_based_receiving", "shipping", "receiving",
                  "transformation"]
"""The Food Traceability Rule's Critical Tracking Events: harvesting, cooling, initial packing, first land-based
receiving (of food obtained from a fishing vessel), shipping, receiving, transformation."""
CTE_TYPES: tuple[CteType, ...] = get_args(CteType)

CLOCK_SKEW = timedelta(minutes=5)
"""How far ahead of the validator's clock an event time may be: producers' clocks drift."""

WRITEUP_GLN = r"^\d{13}$"
WRITEUP_GTIN = r"^\d{12,14}$"
"""The write-up's patterns, kept only to show what they let through."""

RawEvent: TypeAlias = dict[str, str | int | list[str]]
"""A payload as a producer sends it: JSON-shaped, every value a string but ``seq`` (optional: real feeds send none)
and a transformation's ``input_lot_codes``."""

RawPayload: TypeAlias = str | bytes | Mapping[str, Any]
"""What ``validate`` takes: the JSON text, or the dict it decodes to."""

SUPPLIER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$"
"""Short and tame on purpose: the supplier id becomes a metrics label (bounded, no quoting surprises)."""


# Called after the field's pattern has passed (ASCII digits, the right length), so the number
# goes straight to stdnum's GS1 mod-10 (``ean.validate`` would first strip separators: slower, and
# nothing to strip).

def _gln_check_digit(number: str) -> str:
    if (digit := ean.calc_check_digit(number[:-1])) != number[-1]:
        raise PydanticCustomError("gln_check_digit", "GLN {number} fails its GS1 check digit (expected {digit})",
                                  {"number": number, "digit": digit})
    return number


def _gtin_check_digit(number: str) -> str:
    if (digit := ean.calc_check_digit(number[:-1])) != number[-1]:
        raise PydanticCustomError("gtin_check_digit", "GTIN {number} fails its GS1 check digit (expected {digit})",
                                  {"number": number, "digit": digit})
    return number


_DECIMAL_TEXT = re.compile(r"[0-9]{1,9}(?:\.[0-9]{1,6})?")  # bounds the digits too (cheaper than max_digits)


def _decimal_text(value: object) -> object:
    """A quantity arrives as a decimal string; a JSON number (a float to most producers) is refused."""
    if isinstance(value, Decimal):  # built in Python, not read from JSON
        return value
    if not isinstance(value, str):
        raise PydanticCustomError("decimal_string", "quantity must be a decimal string such as \"12.50\", "
                                  "not a JSON {kind}: a binary float is already rounded", {"kind": type(value).__name__})
    if not _DECIMAL_TEXT.fullmatch(value):
        raise PydanticCustomError("decimal_format", "quantity must be up to 9 digits, then optionally a point and "
                                  "up to 6 digits, such as \"12.50\" (no sign, exponent or separators)")
    return Decimal(value)


KeyPart = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[^|\x00-\x1f\x7f]+$")]
"""1 to 64 characters, no ``|`` (it separates the key's parts) and no control characters."""
Gln = Annotated[str, Field(pattern=r"^[0-9]{13}$"), AfterValidator(_gln_check_digit)]
Gtin = Annotated[str, Field(pattern=r"^(?:[0-9]{12}|[0-9]{13}|[0-9]{14})$"), AfterValidator(_gtin_check_digit)]
Quantity = Annotated[Decimal, BeforeValidator(_decimal_text), Field(gt=0)]
Unit = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9 .,/()_-]{0,63}$")]
"""Up to 64 characters: the rule's own examples ("25 reusable plastic containers"), "cases (12 x 1 lb bags)"."""


@dataclass(frozen=True)
class Clock:
    """The validation context: the moment "the future" starts from, less the skew allowed."""

    now: datetime | None = None  # None: the real clock, read when the event is validated
    skew: timedelta = CLOCK_SKEW


@dataclass(frozen=True)
class Kde:
    """A Key Data Element the Food Traceability Rule requires of one CTE type, as the contract carries it."""

    key: str
    """What a rejection names (its ``loc``): the field, or for a choice of fields the choice's name."""
    fields: tuple[str, ...]
    """The field(s) that carry it: any one of them sent, not null, is enough."""
    what: str
    """The KDE in the rule's words."""
    rule: str
    """Where 21 CFR part 1, subpart S requires it."""


def _kde(name: str, what: str, rule: str) -> Kde:
    return Kde(name, (name,), what, rule)


def _reference(rule: str) -> tuple[Kde, Kde]:
    return (_kde("reference_document_type", "the reference document type", rule),
            _kde("reference_document_number", "the reference document number", rule))


def _tlc_source(rule: str) -> Kde:
    return Kde("tlc_source", ("tlc_source_gln", "tlc_source_reference"),
               "the location description for the traceability lot code source, or its reference", rule)


REQUIRED_KDES: dict[CteType, tuple[Kde, ...]] = {
    "harvesting": (
        _kde("subsequent_recipient_gln", "the location description for the immediate subsequent recipient",
             "1.1325(a)(1)(i)"),
        _kde("commodity", "the commodity and, if applicable, variety", "1.1325(a)(1)(ii)"),
        *_reference("1.1325(a)(1)"),
    ),
    "cooling": (
        _kde("subsequent_recipient_gln", "the location description for the immediate subsequent recipient",
             "1.1325(b)(1)(i)"),
        _kde("commodity", "the commodity and, if applicable, variety", "1.1325(b)(1)(ii)"),
        _kde("harvest_farm_gln", "the location description for the farm where the food was harvested", "1.1325(b)(1)"),
        *_reference("1.1325(b)(1)"),
    ),
    "initial_packing": (
        _kde("commodity", "the commodity and, if applicable, variety of the food received", "1.1330(a)(1)"),
        _kde("received_date", "the date the food was received", "1.1330(a)(2)"),
        _kde("received_quantity", "the quantity of the food received", "1.1330(a)(3)"),
        _kde("received_unit_of_measure", "the unit of measure of the food received", "1.1330(a)(3)"),
        _kde("harvest_farm_gln", "the location description for the farm where the food was harvested", "1.1330(a)(4)"),
        _kde("harvester_business_name", "the business name of the harvester", "1.1330(a)(7)"),
        _kde("harvester_phone", "the phone number of the harvester", "1.1330(a)(7)"),
        _kde("harvest_date", "the date of harvesting", "1.1330(a)(8)"),
        _kde("product_description", "the product description of the packed food", "1.1330(a)"),
        *_reference("1.1330(a)"),
    ),
    "first_land_based_receiving": (
        Kde("species_or_product_description", ("commodity", "product_description"),
            "the species and/or acceptable market name (unpackaged food), or the product description (packaged)",
            "1.1335(b)"),
        _kde("harvest_date", "the first day of the harvest date range of the trip", "1.1335(d)"),
        _kde("harvest_end_date", "the last day of the harvest date range of the trip", "1.1335(d)"),
        _kde("catch_area", "the harvest locations of the trip (NMFS ocean geographic code or coordinates)", "1.1335(d)"),
        *_reference("1.1335(g)"),
    ),
    "shipping": (
        _kde("product_description", "the product description", "1.1340(a)(3)"),
        _kde("subsequent_recipient_gln", "the location description for the immediate subsequent recipient",
             "1.1340(a)(4)"),
        _tlc_source("1.1340(a)(7)"),
        *_reference("1.1340(a)(8)"),
    ),
    "receiving": (
        _kde("product_description", "the product description", "1.1345(a)(3)"),
        _kde("previous_source_gln", "the location description for the immediate previous source", "1.1345(a)(4)"),
        _tlc_source("1.1345(a)(7)"),
        *_reference("1.1345(a)(8)"),
    ),
    "transformation": (
        _kde("input_lot_codes", "the traceability lot codes of the foods used", "1.1350(a)(1)"),
        _kde("input_product_descriptions", "the product description of each food used", "1.1350(a)(1)"),
        _kde("input_quantities", "the quantity used from each traceability lot", "1.1350(a)(1)"),
        _kde("input_units_of_measure", "the unit of measure of each quantity used", "1.1350(a)(1)"),
        _kde("product_description", "the product description of the food produced", "1.1350(a)(2)"),
        *_reference("1.1350(a)(2)"),
    ),
}
"""Per CTE type, the KDEs the rule requires beyond what every event carries. Every event carries the traceability
lot code from initial packing on (``lot_code``, ``LOT_CODE_FROM``; harvesting and cooling records may send none), the quantity
and unit of measure, where the event happened (``location_gln``: the farm, the cooler, the packer, the landing
site, the ship-from or receiving location; at initial packing, first land-based receiving and transformation it
is the traceability lot code source) and its date (``event_time``). A transformation's inputs are parallel lists,
one entry per lot used (``input_lot_codes``, ``input_product_descriptions``, ``input_quantities``,
``input_units_of_measure``, of one length). The KDEs the rule requires only in some cases are ``CASE_KDES``'s: the
payload states its case in a field of its own, and the case's KDEs are then required."""


@dataclass(frozen=True)
class Case:
    """A case in which the rule asks more (or less) of a CTE type: the payload states it (``field`` is ``value``)."""

    field: str
    value: str
    adds: tuple[Kde, ...] = ()
    """KDEs required in this case."""
    waives: tuple[str, ...] = ()
    """Keys of ``REQUIRED_KDES`` entries not required in this case."""


_FIELD_NAME = _kde("harvest_area", "the name of the field or other growing area the produce was harvested from",
                   "")
_CONTAINER = _kde("harvest_area", "the name of the container (pond, pool, tank, cage) the aquacultured food was "
                  "harvested from", "")


def _at(kde: Kde, rule: str) -> Kde:
    return Kde(kde.key, kde.fields, kde.what, rule)


CASE_KDES: dict[CteType, tuple[Case, ...]] = {
    "harvesting": (Case("harvest_site", "field", (_at(_FIELD_NAME, "1.1325(a)(1)"),)),
                   Case("harvest_site", "aquaculture_container", (_at(_CONTAINER, "1.1325(a)(1)"),))),
    "initial_packing": (
        Case("harvest_site", "field", (_at(_FIELD_NAME, "1.1330(a)"),)),
        Case("harvest_site", "aquaculture_container", (_at(_CONTAINER, "1.1330(a)"),)),
        Case("cooled_before_packing", "yes", (
            _kde("cooling_gln", "the location description for where the food was cooled before initial packing",
                 "1.1330(a)"),
            _kde("cooling_date", "the date of cooling", "1.1330(a)"))),
    ),
    "receiving": (Case("previous_source_exempt", "yes", waives=("tlc_source",)),),  # 1.1345(b): from a person the
    # rule does not apply to, the receiver records no traceability lot code source
}
"""Per CTE type, the cases the payload states (``harvest_site``: ``field``, ``aquaculture_container`` or
``other``; ``cooled_before_packing`` and ``previous_source_exempt``: ``yes`` or ``no``) and what each changes. A
payload that states no case is held to ``REQUIRED_KDES`` alone: the contract asks nothing it cannot tell applies."""


_LOT_CODE_RULES: tuple[tuple[CteType, str], ...] = (
    ("initial_packing", "1.1330(a)"), ("first_land_based_receiving", "1.1335"), ("shipping", "1.1340(a)"),
    ("receiving", "1.1345(a)"), ("transformation", "1.1350(a)"))
LOT_CODE_FROM: dict[CteType, Kde] = {kind: _kde("lot_code", "the traceability lot code", rule)
                                     for kind, rule in _LOT_CODE_RULES}
"""The types whose records carry a traceability lot code: the rule assigns one at initial packing, first land-based
receiving and transformation, and every later record names it. Harvesting and cooling come before any (1.1325)."""


def _harvest_key(supplier: str, farm: str, commodity: str) -> str:
    digest = hashlib.sha256(commodity.encode()).hexdigest()[:12]
    return f"~{supplier}:{farm}:{digest}"  # '~' and ':' keep it apart from any lot code; at most 60 characters


def lot_key_of(payload: Mapping[str, object]) -> str:
    """The key that orders a payload's event and shards it, from the payload as sent (valid or not): its lot code,
    or for a record without one (harvesting, cooling: no lot code exists yet) the farm's harvests of that commodity
    (supplier, farm GLN, commodity), so that a farm's harvest and cooling records keep their order."""
    code = payload.get("lot_code")
    if isinstance(code, str) and code:
        return code
    farm = payload.get("harvest_farm_gln") or payload.get("location_gln")
    return _harvest_key(str(payload.get("supplier_id", "")), str(farm or ""), str(payload.get("commodity") or ""))


def required_kdes(event_type: CteType, sent: Mapping[str, object]) -> tuple[Kde, ...]:
    """The KDEs an ``event_type`` payload stating the cases in ``sent`` must carry (``REQUIRED_KDES``, and
    ``CASE_KDES``'s for the cases it states)."""
    cases = [case for case in CASE_KDES.get(event_type, ()) if sent.get(case.field) == case.value]
    waived = {key for case in cases for key in case.waives}
    return (*(kde for kde in REQUIRED_KDES[event_type] if kde.key not in waived),
            *(kde for case in cases for kde in case.adds))


def missing_kdes(event_type: CteType, sent: Mapping[str, object]) -> tuple[Kde, ...]:
    """The KDEs ``event_type`` requires of ``sent`` (field to value) that it lacks: each field of it absent or null."""
    return tuple(kde for kde in required_kdes(event_type, sent) if all(sent.get(f) is None for f in kde.fields))


class CriticalTrackingEvent(BaseModel):
    """One CTE with its Key Data Elements. Strict: a value of the wrong shape is an error, not a guess."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)  # an unknown field is kept and reported

    supplier_id: str = Field(pattern=SUPPLIER_PATTERN)
    lot_code: KeyPart | None = None  # the traceability lot code: required from initial packing on (LOT_CODE_FROM),
    # which assigns it; a harvesting or cooling record may carry a farm's own lot code, or none (``lot_key``)
    event_type: CteType
    location_gln: Gln  # where the event happened
    gtin: Gtin  # what the lot is
    event_time: AwareDatetime  # a naive time is refused: "05:00" where?
    quantity: Quantity
    unit_of_measure: Unit
    source_event_id: KeyPart  # the producer's own id for the event
    seq: int | None = Field(default=None, ge=1)  # the producer's order of a lot's events, when it sends one (real
    # feeds do not): without it, the ledger numbers the lot's events in the order it commits them (``ledger.py``)
    # The rule's other KDEs: each typed when sent, and required by the event types REQUIRED_KDES names.
    product_description: str | None = Field(default=None, min_length=1, max_length=200)
    commodity: str | None = Field(default=None, min_length=1, max_length=200)  # commodity and variety; a fish's
    # species or acceptable market name
    tlc_source_gln: Gln | None = None  # the traceability lot code source (where the lot code was assigned)
    tlc_source_reference: str | None = Field(default=None, min_length=1, max_length=200)  # or a reference to it
    reference_document_type: str | None = Field(default=None, pattern=r"^[A-Za-z][A-Za-z0-9 _-]{0,31}$")  # BOL, ASN
    reference_document_number: str | None = Field(default=None, min_length=1, max_length=64)
    previous_source_gln: Gln | None = None  # receiving: the immediate previous source
    subsequent_recipient_gln: Gln | None = None  # harvesting, cooling, shipping: the immediate subsequent recipient
    input_lot_codes: tuple[KeyPart, ...] | None = None  # transformation: the lots that went in, and for each
    input_product_descriptions: tuple[Annotated[str, Field(min_length=1, max_length=200)], ...] | None = None  # its
    input_quantities: tuple[Quantity, ...] | None = None  # product description, the quantity used from it and
    input_units_of_measure: tuple[Unit, ...] | None = None  # its unit (the lists one entry per lot, in one order)
    harvest_site: Literal["field", "aquaculture_container", "other"] | None = None  # harvesting, initial packing:
    # where the food grew, the case that asks for harvest_area
    cooled_before_packing: Literal["yes", "no"] | None = None  # initial packing: the case that asks for the cooling
    previous_source_exempt: Literal["yes", "no"] | None = None  # receiving: from a person the rule does not apply to
    harvest_farm_gln: Gln | None = None  # cooling, initial packing: the farm where the food was harvested
    harvest_area: str | None = Field(default=None, min_length=1, max_length=200)  # produce: the field or growing
    # area; aquaculture: the container (pond, tank)
    harvester_business_name: str | None = Field(default=None, min_length=1, max_length=200)  # initial packing
    harvester_phone: str | None = Field(default=None, pattern=r"^\+?[0-9(][0-9 ().-]{5,23}$")  # initial packing
    harvest_date: date | None = None  # initial packing: the date of harvesting; first land-based receiving: the
    harvest_end_date: date | None = None  # trip's first and last days of catching (its harvest date range)
    catch_area: str | None = Field(default=None, min_length=1, max_length=64)  # first land-based receiving: an
    # NMFS ocean geographic code or coordinates
    received_date: date | None = None  # initial packing: the date the packer received the food
    received_quantity: Quantity | None = None  # initial packing: the quantity received (the event's quantity is
    received_unit_of_measure: Unit | None = None  # the packed food's), and its unit
    cooling_gln: Gln | None = None  # initial packing: where the food was cooled (if it was)
    cooling_date: date | None = None  # initial packing: the date of cooling (if it was cooled)

    @property
    def lot_key(self) -> str:
        """What orders the event and keys it (``lot_key_of``): its lot code, or for a harvesting or cooling
        record without one, its farm's harvests of the commodity."""
        return self.lot_code if self.lot_code is not None else _harvest_key(
            self.supplier_id, self.harvest_farm_gln or self.location_gln, self.commodity or "")

    @property
    def unknown_fields(self) -> tuple[str, ...]:
        """Fields the contract does not know, kept as sent (``model_extra``) for the caller to report."""
        return tuple(sorted(self.model_extra or {}))

    @model_validator(mode="after")
    def _required_kdes(self) -> CriticalTrackingEvent:
        """One ``missing_kde`` problem per KDE the event's type requires and the payload lacks (absent or null),
        located at the KDE, naming the type and the rule's paragraph. Runs once every field is valid (an "after"
        validator): a payload with a malformed field is reported for that first."""
        missing = missing_kdes(self.event_type, self.__dict__)
        if self.lot_code is None and self.event_type in LOT_CODE_FROM:
            missing = (LOT_CODE_FROM[self.event_type], *missing)
        if missing:
            # pydantic-core keeps the line errors of a ValidationError raised in a validator (one per KDE, each
            # with its own loc), where a PydanticCustomError would be one error located at the model
            raise ValidationError.from_exception_data(type(self).__name__, [
                InitErrorDetails(type=PydanticCustomError(
                    "missing_kde", "a {cte_type} event requires {kde} (21 CFR {rule}): send {fields}",
                    {"cte_type": self.event_type, "kde": kde.what, "rule": kde.rule, "fields": " or ".join(kde.fields)}),
                    loc=(kde.key,), input=None)
                for kde in missing])
        return self

    @model_validator(mode="after")
    def _harvest_dates_in_order(self) -> CriticalTrackingEvent:
        if self.harvest_date and self.harvest_end_date and self.harvest_end_date < self.harvest_date:
            raise PydanticCustomError("harvest_date_range", "harvest_end_date {end} is before harvest_date {start}",
                                      {"end": self.harvest_end_date.isoformat(), "start": self.harvest_date.isoformat()})
        return self

    @model_validator(mode="after")
    def _one_entry_per_input(self) -> CriticalTrackingEvent:
        lists = {name: len(value) for name in ("input_lot_codes", "input_product_descriptions", "input_quantities",
                                               "input_units_of_measure") if (value := getattr(self, name)) is not None}
        if len(set(lists.values())) > 1:
            raise PydanticCustomError("transformation_inputs_misaligned", "a transformation's input lists need one "
                                      "entry per lot used, in one order; lengths: {lengths}",
                                      {"lengths": ", ".join(f"{k} {n}" for k, n in lists.items())})
        return self

    @model_validator(mode="after")
    def _transformation_makes_a_new_lot(self) -> CriticalTrackingEvent:
        if self.event_type == "transformation" and self.input_lot_codes and self.lot_code in self.input_lot_codes:
            raise PydanticCustomError("transformation_keeps_input_lot", "a transformation assigns a new traceability "
                                      "lot code; {lot} is one of its inputs", {"lot": self.lot_code})
        return self

    @field_validator("event_time")
    @classmethod
    def _not_in_the_future(cls, value: datetime, info: ValidationInfo) -> datetime:
        clock = info.context if isinstance(info.context, Clock) else Clock()
        now = clock.now if clock.now is not None else datetime.now(UTC)
        if value > now + clock.skew:
            raise PydanticCustomError("future_timestamp", "event_time {time} is in the future (now {now}, "
                                      "skew allowed {skew})", {"time": value.isoformat(), "now": now.isoformat(),
                                                               "skew": str(clock.skew)})
        return value


def idempotency_key(event: CriticalTrackingEvent) -> str:
    """The write-up's key: sha256 of ``lot|type|source event id``, 64 hex digits."""
    return hashlib.sha256(f"{event.lot_key}|{event.event_type}|{event.source_event_id}".encode()).hexdigest()


class Problem(TypedDict):
    """One thing wrong with a payload, as pydantic reports it: where, which rule, in words."""

    loc: list[str | int]
    type: str
    msg: str


@dataclass(frozen=True)
class Quarantined:
    """A payload that breaks the contract, with every problem found. Never retried: the same bytes
    fail the same way every time. Kept aside (``Ledger.quarantine``) for the producer to fix."""

    raw: RawPayload
    errors: tuple[Problem, ...]

    @property
    def payload_text(self) -> str:
        """The payload as text, exactly as received when it came as text (it may not even be JSON)."""
        if isinstance(self.raw, str):
            return self.raw
        if isinstance(self.raw, bytes):
            return self.raw.decode("utf-8", errors="replace")
        return json.dumps(self.raw, sort_keys=True, ensure_ascii=False, default=repr)

    @property
    def key(self) -> str:
        """sha256 of the payload text: the same payload quarantined twice (a redelivery) is kept once."""
        return hashlib.sha256(self.payload_text.encode()).hexdigest()

    @property
    def supplier(self) -> str:
        """The payload's supplier id when it has a well-formed one, else ``"unknown"`` (a label must stay bounded)."""
        return supplier_of(self.raw)

    @property
    def cte_type(self) -> CteType | None:
        """The CTE type the payload names, when it is one of the rule's (a ``missing_kde`` problem is that type's)."""
        return cte_type_of(self.raw)

    @property
    def error_types(self) -> set[str]:
        return {problem["type"] for problem in self.errors}


def supplier_label(supplier: str) -> str:
    """The supplier id as a label (metrics, ledger columns): ``"unknown"`` unless well-formed, so a
    payload can neither invent series nor overflow a column."""
    return supplier if re.fullmatch(SUPPLIER_PATTERN, supplier) else "unknown"


def _field_of(raw: RawPayload, name: str) -> object:
    """The value of field ``name`` in any payload, valid or not (None when it has none, or is not a JSON object)."""
    decoded: object = raw
    if isinstance(raw, (str, bytes)):
        try:
            decoded = json.loads(raw)
        except ValueError:
            return None
    return cast(Mapping[str, object], decoded).get(name) if isinstance(decoded, Mapping) else None


def supplier_of(raw: RawPayload) -> str:
    """The supplier id of any payload, valid or not, when it has a well-formed one; else ``"unknown"``."""
    supplier = _field_of(raw, "supplier_id")
    return supplier_label(supplier) if isinstance(supplier, str) else "unknown"


def cte_type_of(raw: RawPayload) -> CteType | None:
    """The CTE type any payload names, valid or not, when it is one of the rule's; else None."""
    named = _field_of(raw, "event_type")
    return next((kind for kind in CTE_TYPES if kind == named), None)


def validate(raw: RawPayload, now: datetime | None = None,
             skew: timedelta = CLOCK_SKEW) -> CriticalTrackingEvent | Quarantined:
    """The payload as a ``CriticalTrackingEvent``, or ``Quarantined`` with every problem in it.

    ``raw`` is the JSON text or the dict it decodes to (read as JSON: a dict holding a Python
    ``datetime`` or ``Decimal`` is not a payload a producer can send). ``now`` (timezone-aware)
    replaces the clock; ``skew`` is how far ahead of it an event may be."""
    if now is not None and now.tzinfo is None:
        raise ValueError("now must be timezone-aware")
    if isinstance(raw, (str, bytes)):
        text = raw
    else:
        try:
            text = json.dumps(raw, allow_nan=False)
        except (TypeError, ValueError) as error:
            return Quarantined(raw, (Problem(loc=[], type="not_json", msg=f"the payload is not JSON: {error}"),))
    try:
        return CriticalTrackingEvent.model_validate_json(text, context=Clock(now, skew))
    except ValidationError as error:
        problems = tuple(Problem(loc=list(detail["loc"]), type=detail["type"], msg=detail["msg"])
                         for detail in error.errors(include_url=False, include_context=False, include_input=False))
        return Quarantined(raw, problems)


# The synthetic stream.

InvalidKind = Literal["gln_check_digit", "gtin_check_digit", "naive_timestamp", "future_timestamp", "zero_quantity",
                      "missing_kde"]
INVALID_KINDS: tuple[InvalidKind, ...] = get_args(InvalidKind)
EXPECTED_ERROR: dict[InvalidKind, tuple[str, str]] = {
    "gln_check_digit": ("location_gln", "gln_check_digit"),
    "gtin_check_digit": ("gtin", "gtin_check_digit"),
    "naive_timestamp": ("event_time", "timezone_aware"),
    "future_timestamp": ("event_time", "future_timestamp"),
    "zero_quantity": ("quantity", "greater_than"),
}
"""Each invalid kind and the one problem ``validate`` must report for it: (field, error type). A ``missing_kde``
payload's problem names the KDE dropped from it (``Stream.expected_problem``)."""

START = datetime(2025, 3, 3, 5, 0, tzinfo=UTC)
TICK = timedelta(seconds=15)
"""A stream starts at ``START``; a new lot opens at the time of the payload that opens it (one per ``TICK``)."""

Chain = Literal["produce", "seafood"]
LIFECYCLES: dict[Chain, tuple[CteType, ...]] = {
    "produce": ("harvesting", "cooling", "initial_packing", "shipping", "receiving"),
    "seafood": ("first_land_based_receiving", "shipping", "receiving"),
}
"""A lot's events in order: a grower's (its lot code is the packer's from the start: the key needs one), or a
fishing business's, whose lot starts when the catch is landed."""
SEAFOOD_EVERY = 3  # every third supplier lands fish
TRANSFORMED_SHARE = 0.25  # produce lots that end with a transformation (fresh-cut at the receiver)
_GAP_MINUTES: dict[CteType, tuple[int, int]] = {  # time since the lot's previous event
    "harvesting": (0, 180), "cooling": (30, 240), "initial_packing": (60, 720), "first_land_based_receiving": (0, 180),
    "shipping": (360, 2_880), "receiving": (240, 4_320), "transformation": (120, 1_440),
}
_OFFSETS = (-8, -7, -6, -5, -4, 0, 1)  # hours: growers and packers from California to Spain
_UNITS: dict[Chain, tuple[str, ...]] = {"produce": ("case", "carton", "kg", "lb"), "seafood": ("kg", "lb")}
_PRODUCE = (("Romaine lettuce", "Green Towers"), ("Cucumbers", "Marketmore 76"), ("Roma tomatoes", "Plum Regal"),
            ("Baby spinach", "Space"), ("Cantaloupe", "Athena"), ("Jalapeno peppers", "Mitla"))
_PACKS = ("24 ct carton", "40 lb carton", "12 x 1 lb clamshells", "25 lb bag")
_SEAFOOD = ("Atlantic cod (Gadus morhua)", "Haddock (Melanogrammus aeglefinus)",
            "Sea scallops (Placopecten magellanicus)", "Yellowfin tuna (Thunnus albacares)")
_CATCH_AREAS = ("NMFS 514", "NMFS 522", "NMFS 537", "41.62N 69.35W", "43.10N 68.80W")
_PLACES = ("Valle Verde", "Coastal", "Sunridge", "Mesa Alta", "Riverbend", "North Shore")
_DOCUMENTS: dict[CteType, str] = {
    "harvesting": "harvest log", "cooling": "cooling log", "initial_packing": "production log",
    "first_land_based_receiving": "landing receipt", "shipping": "BOL", "receiving": "BOL",
    "transformation": "work order",
}
"""Each event's reference document type (a receiver records the shipper's bill of lading)."""
TLC_REFERENCE_SHARE = 0.2  # lots whose shipper names its lot code source by a reference, not a GLN


@dataclass(frozen=True)
class Stream:
    """A burst of producer payloads and what a check must find after ingesting it."""

    payloads: tuple[RawEvent, ...]
    invalid: Mapping[int, InvalidKind]
    """Position in ``payloads`` of each invalid payload, and why it is invalid."""
    duplicates: Mapping[int, int]
    """Position of each resend, and the position of the payload it repeats (byte for byte)."""
    lot_sequences: Mapping[str, tuple[int, ...]]
    """Per lot, the ``seq`` of its valid events in the order they were produced (increasing)."""
    locations: Mapping[str, tuple[str, ...]]
    """Each supplier's own GLNs (farm, cooler, packhouse, shipping dock; a fishing business: landing site, dock)."""
    as_of: datetime
    """A ``now`` later than every valid event time: validate with it for a run that never depends on the clock."""
    dropped: Mapping[int, str] = field(default_factory=lambda: {})
    """Position of each ``missing_kde`` payload, and the key of the KDE dropped from it (``Kde.key``)."""

    @property
    def valid_distinct(self) -> int:
        """How many events must end up committed."""
        return len(self.payloads) - len(self.invalid) - len(self.duplicates)

    def expected_problem(self, position: int) -> tuple[str, str]:
        """The one problem ``validate`` must report for the invalid payload at ``position``: (field or KDE, type)."""
        kind = self.invalid[position]
        return (self.dropped[position], "missing_kde") if kind == "missing_kde" else EXPECTED_ERROR[kind]

    def expected_outcomes(self) -> dict[tuple[str, str], int]:
        """(outcome, supplier) to count when one consumer takes the payloads in order:
        ``committed``, ``deduplicated`` (the resends) and ``quarantined``."""
        counts: dict[tuple[str, str], int] = {}
        for position, payload in enumerate(self.payloads):
            outcome = ("quarantined" if position in self.invalid else
                       "deduplicated" if position in self.duplicates else "committed")
            key = (outcome, str(payload["supplier_id"]))
            counts[key] = counts.get(key, 0) + 1
        return counts


@dataclass
class _Supplier:
    supplier_id: str
    chain: Chain
    name: str
    phone: str
    tz: timezone
    sites: dict[str, str]  # role (farm, cooler, packhouse, landing, dock) to GLN
    gtins: tuple[str, ...]
    lots_opened: int = 0


@dataclass
class _Lot:
    supplier: _Supplier
    code: str
    steps: tuple[CteType, ...]
    gtin: str
    unit: str
    hundredths: int  # the quantity, in hundredths of the unit (packed or landed)
    bins: int  # produce: the field bins harvested and cooled before packing
    commodity: str
    description: str
    area: str  # produce: the field; seafood: the catch area
    tlc_reference: str | None  # its shippers name the lot code source by this reference, not by a GLN
    receiver: str
    time: datetime
    done: int = 0
    local: dict[CteType, datetime] = field(default_factory=lambda: {})  # each event's local time
    bol: str = ""  # the bill of lading it is shipped under (the receiver records it too)


def _with_check_digit(body: str) -> str:
    return body + ean.calc_check_digit(body)


def _supplier(rng: random.Random, number: int) -> _Supplier:
    prefix = f"{rng.randrange(300, 980)}{rng.randrange(10_000):04d}"  # a 7-digit GS1 company prefix
    chain: Chain = "seafood" if number % SEAFOOD_EVERY == 0 else "produce"
    roles = ("landing", "dock") if chain == "seafood" else ("farm", "cooler", "packhouse", "dock")
    sites = {role: _with_check_digit(f"{prefix}{rng.randrange(100_000):05d}") for role in roles}
    gtins = (_with_check_digit(f"1{prefix}{rng.randrange(100_000):05d}"),  # GTIN-14, a case
             _with_check_digit(f"{prefix}{rng.randrange(100_000):05d}"),  # GTIN-13
             _with_check_digit(f"{prefix[1:]}{rng.randrange(100_000):05d}"))  # GTIN-12 (UPC-A)
    name = f"{rng.choice(_PLACES)} {'Seafood' if chain == 'seafood' else rng.choice(('Farms', 'Growers', 'Ranch'))}"
    phone = f"+1 {rng.randrange(201, 990)}-555-{rng.randrange(100, 200):04d}"  # 555-0100..0199: fictional numbers
    return _Supplier(f"SUP-{number:03d}", chain, name, phone, timezone(timedelta(hours=rng.choice(_OFFSETS))), sites,
                     gtins)


def _open_lot(rng: random.Random, supplier: _Supplier, receivers: tuple[str, ...], clock: datetime) -> _Lot:
    supplier.lots_opened += 1
    first = clock + timedelta(minutes=rng.randrange(0, 120))
    chain = supplier.chain
    steps = LIFECYCLES[chain] + (("transformation",) if chain == "produce" and rng.random() < TRANSFORMED_SHARE else ())
    unit = rng.choice(_UNITS[chain])
    hundredths = rng.randrange(20, 1_200) * 100 if unit in ("case", "carton") else rng.randrange(5_000, 2_000_000)
    code = f"{supplier.supplier_id.replace('-', '')}-{first.astimezone(supplier.tz):%y%m%d}-{supplier.lots_opened:04d}"
    if chain == "seafood":
        species = rng.choice(_SEAFOOD)
        commodity, area = species, rng.choice(_CATCH_AREAS)
        description = f"{species.split(' (')[0]}, fresh, whole, iced, {rng.choice(('50 lb tote', '25 kg box'))}"
    else:
        name, variety = rng.choice(_PRODUCE)
        commodity, area = f"{name}, variety {variety}", f"Field {rng.randrange(1, 40)}{rng.choice('ABC')}"
        description = f"{name}, {rng.choice(_PACKS)}"
    reference = (f"https://tlc.example/{supplier.supplier_id.lower()}/{code}"
                 if rng.random() < TLC_REFERENCE_SHARE else None)
    return _Lot(supplier, code, steps, rng.choice(supplier.gtins), unit, hundredths, rng.randrange(4, 60), commodity,
                description, area, reference, rng.choice(receivers), first)


def _quantity(hundredths: int, unit: str) -> str:
    if unit in ("case", "carton"):
        return str(hundredths // 100)
    return f"{hundredths // 100}.{hundredths % 100:02d}"


def _day(moment: datetime) -> str:
    return moment.date().isoformat()


def _kdes(rng: random.Random, lot: _Lot, kind: CteType, local: datetime) -> RawEvent:
    """The KDEs the rule asks of ``kind`` beyond every event's (``REQUIRED_KDES``), and the conditional ones that
    apply to this lot (the produce field, the cooling), as its producer sends them."""
    sites, supplier = lot.supplier.sites, lot.supplier
    if kind == "shipping":
        lot.bol = f"BOL-{rng.randrange(10_000_000):07d}"
    number = lot.bol if kind in ("shipping", "receiving") else f"{_DOCUMENTS[kind][0].upper()}-{rng.randrange(10**6):06d}"
    kdes: RawEvent = {"reference_document_type": _DOCUMENTS[kind], "reference_document_number": number}
    source: RawEvent = ({"tlc_source_reference": lot.tlc_reference} if lot.tlc_reference else
                        {"tlc_source_gln": sites["packhouse" if "packhouse" in sites else "landing"]})
    if kind == "harvesting":
        kdes.update(subsequent_recipient_gln=sites["cooler"], commodity=lot.commodity, harvest_area=lot.area,
                    harvest_site="field")
    elif kind == "cooling":
        kdes.update(subsequent_recipient_gln=sites["packhouse"], commodity=lot.commodity, harvest_farm_gln=sites["farm"])
    elif kind == "initial_packing":
        kdes.update(commodity=lot.commodity, received_date=_day(local), received_quantity=str(lot.bins),
                    received_unit_of_measure="bins", harvest_farm_gln=sites["farm"], harvest_area=lot.area,
                    harvester_business_name=supplier.name, harvester_phone=supplier.phone,
                    harvest_date=_day(lot.local["harvesting"]), cooling_gln=sites["cooler"],
                    cooling_date=_day(lot.local["cooling"]), product_description=lot.description,
                    harvest_site="field", cooled_before_packing="yes")
    elif kind == "first_land_based_receiving":
        last = local - timedelta(days=rng.randrange(0, 2))
        kdes.update(commodity=lot.commodity, harvest_date=_day(last - timedelta(days=rng.randrange(1, 10))),
                    harvest_end_date=_day(last), catch_area=lot.area)
    elif kind == "shipping":
        kdes.update(product_description=lot.description, subsequent_recipient_gln=lot.receiver, **source)
    elif kind == "receiving":
        kdes.update(product_description=lot.description, previous_source_gln=sites["dock"], **source)
    else:  # a transformation: what it made (its lot code and the lots that went in are the caller's)
        kdes.update(product_description=f"Fresh-cut {lot.description[0].lower()}{lot.description[1:]}")
    return kdes


def _next_event(rng: random.Random, lot: _Lot) -> tuple[RawEvent, datetime]:
    """The lot's next event, as its producer sends it, and its time (aware, the supplier's local time)."""
    kind = lot.steps[lot.done]
    low, high = _GAP_MINUTES[kind]
    if lot.done:
        lot.time += timedelta(minutes=rng.randrange(low, high + 1), seconds=rng.randrange(60))
    used = lot.hundredths  # a transformation's input: all of the lot received
    if kind == "transformation":
        lot.hundredths = max(100, lot.hundredths * rng.randrange(88, 99) // 100)  # trimmed, washed, cut
    lot.done += 1
    sites = lot.supplier.sites
    place = {"harvesting": sites.get("farm"), "cooling": sites.get("cooler"), "initial_packing": sites.get("packhouse"),
             "first_land_based_receiving": sites.get("landing"), "shipping": sites["dock"], "receiving": lot.receiver,
             "transformation": lot.receiver}[kind]
    local = lot.time.astimezone(lot.supplier.tz)
    lot.local[kind] = local
    in_bins = kind in ("harvesting", "cooling")  # before packing, the food is counted in field bins
    payload: RawEvent = {
        "supplier_id": lot.supplier.supplier_id,
        "lot_code": lot.code,
        "event_type": kind,
        "location_gln": str(place),
        "gtin": lot.gtin,
        "event_time": local.isoformat(timespec="seconds"),
        "quantity": str(lot.bins) if in_bins else _quantity(lot.hundredths, lot.unit),
        "unit_of_measure": "bins" if in_bins else lot.unit,
        "source_event_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        "seq": lot.done,
    }
    payload.update(_kdes(rng, lot, kind, local))
    if kind == "transformation":  # the rule: a transformation assigns a new lot code, naming the lots that went in
        payload.update(lot_code=transformed_lot(lot.code), seq=1, input_lot_codes=[lot.code],
                       input_product_descriptions=[lot.description], input_quantities=[_quantity(used, lot.unit)],
                       input_units_of_measure=[lot.unit])
    return payload, local


def transformed_lot(code: str) -> str:
    """The lot code the transformer assigns to what it made of lot ``code`` (fresh-cut): a new lot."""
    return f"{code}-FC"


def _wrong_last_digit(rng: random.Random, number: str) -> str:
    return number[:-1] + str((int(number[-1]) + rng.randrange(1, 10)) % 10)


# Each breaks a valid payload one way and returns what ``validate``'s one problem will name (its loc).

def _break_gln(rng: random.Random, payload: RawEvent, local: datetime) -> str:
    payload["location_gln"] = _wrong_last_digit(rng, str(payload["location_gln"]))
    return "location_gln"


def _break_gtin(rng: random.Random, payload: RawEvent, local: datetime) -> str:
    payload["gtin"] = _wrong_last_digit(rng, str(payload["gtin"]))
    return "gtin"


def _naive_time(rng: random.Random, payload: RawEvent, local: datetime) -> str:
    payload["event_time"] = local.replace(tzinfo=None).isoformat(sep=rng.choice("T "), timespec="seconds")
    return "event_time"


def _future_time(rng: random.Random, payload: RawEvent, local: datetime) -> str:
    years = rng.choice((12, 100, 1_000))  # a mistyped year, far enough ahead to stay invalid against any real clock
    payload["event_time"] = (local + timedelta(days=365 * years)).isoformat(timespec="seconds")
    return "event_time"


def _zero_quantity(rng: random.Random, payload: RawEvent, local: datetime) -> str:
    payload["quantity"] = rng.choice(("0", "0.00", "0.000"))
    return "quantity"


def _drop_kde(rng: random.Random, payload: RawEvent, local: datetime) -> str:
    """A producer that leaves out one KDE the event's type requires (all of its fields, for a choice)."""
    kde = rng.choice(REQUIRED_KDES[cast(CteType, payload["event_type"])])
    for name in kde.fields:
        payload.pop(name, None)
    return kde.key


_BREAK: dict[InvalidKind, Callable[[random.Random, RawEvent, datetime], str]] = {
    "gln_check_digit": _break_gln, "gtin_check_digit": _break_gtin, "naive_timestamp": _naive_time,
    "future_timestamp": _future_time, "zero_quantity": _zero_quantity, "missing_kde": _drop_kde,
}
_RECENT = 64  # a resend repeats one of the last valid payloads, often after newer events of its lot


def generate(seed: int, events: int, suppliers: int = 6, lots: int = 8, invalid_every: int = 0,
             duplicate_every: int = 0) -> Stream:
    """``events`` payloads, the same for the same arguments.

    ``suppliers`` each keep ``lots`` lots open at once; every ``SEAFOOD_EVERY``-th supplier lands fish,
    the others grow produce (``LIFECYCLES``); each payload is the next event of an open lot drawn at
    random (so lots interleave, each in lifecycle order with increasing ``seq`` and times), and a
    finished lot is replaced by a new one. Each event carries the KDEs its type requires
    (``REQUIRED_KDES``). A produce lot that ends transformed (fresh-cut at the receiver,
    ``TRANSFORMED_SHARE`` of them) ends in a new lot, as the rule requires: the transformation's
    ``lot_code`` is ``transformed_lot(input)``, its ``seq`` 1, its ``input_lot_codes`` the lot that
    went in. Payload ``i`` (1-based) is a resend of a recent valid payload when ``i % duplicate_every
    == 0``, else invalid when ``i % invalid_every == 0``, in each of ``INVALID_KINDS`` in turn (0 turns
    either off); a ``missing_kde`` one lacks one KDE its type requires, drawn at random."""
    if events < 0 or suppliers < 1 or lots < 1 or invalid_every < 0 or duplicate_every < 0:
        raise ValueError("events, invalid_every and duplicate_every must be >= 0; suppliers and lots >= 1")
    rng = random.Random(seed)
    partners = [_supplier(rng, number) for number in range(1, suppliers + 1)]
    receiver_prefix = f"{rng.randrange(300, 980)}{rng.randrange(10_000):04d}"
    receivers = tuple(_with_check_digit(f"{receiver_prefix}{rng.randrange(100_000):05d}") for _ in range(4))
    open_lots = [_open_lot(rng, partner, receivers, START) for partner in partners for _ in range(lots)]
    payloads: list[RawEvent] = []
    invalid: dict[int, InvalidKind] = {}
    dropped: dict[int, str] = {}
    duplicates: dict[int, int] = {}
    sequences: dict[str, list[int]] = {}
    recent: list[int] = []
    latest = START
    for position in range(events):
        if duplicate_every and (position + 1) % duplicate_every == 0 and recent:
            original = rng.choice(recent)
            payloads.append(dict(payloads[original]))
            duplicates[position] = original
            continue
        slot = rng.randrange(len(open_lots))
        lot = open_lots[slot]
        payload, local = _next_event(rng, lot)
        if lot.done == len(lot.steps):
            open_lots[slot] = _open_lot(rng, lot.supplier, receivers, START + position * TICK)
        if invalid_every and (position + 1) % invalid_every == 0:
            kind = INVALID_KINDS[len(invalid) % len(INVALID_KINDS)]
            named = _BREAK[kind](rng, payload, local)
            invalid[position] = kind
            if kind == "missing_kde":
                dropped[position] = named
        else:
            sequences.setdefault(str(payload["lot_code"]), []).append(int(cast(int, payload["seq"])))
            recent.append(position)
            if len(recent) > _RECENT:
                del recent[0]
            latest = max(latest, local)
        payloads.append(payload)
    return Stream(
        payloads=tuple(payloads), invalid=invalid, duplicates=duplicates,
        lot_sequences={code: tuple(seqs) for code, seqs in sequences.items()},
        locations={p.supplier_id: tuple(p.sites.values()) for p in partners},
        as_of=(latest + timedelta(hours=1)).astimezone(UTC), dropped=dropped,
    )
