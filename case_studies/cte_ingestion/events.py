r"""Critical Tracking Events (FSMA 204): the contract, its idempotency key, and a synthetic stream.

- ``validate(raw, now=None)``: a ``CriticalTrackingEvent``, or a ``Quarantined`` holding the raw
  payload and every problem found (each with its field, error type and message). Bad input never
  raises: it is data about a producer. A quarantined payload is never retried, since the same
  bytes fail the same way on every attempt.
- ``idempotency_key(event)``: sha256 of ``"lot|type|source event id"``, the write-up's key.
- ``generate(seed, events, ...)``: what producers send (JSON-shaped dicts) and the ground truth a
  check needs: which payloads are invalid and why, which are resends, each lot's order.

The contract is strict (pydantic strict mode, frozen; an unknown field is kept as sent and named by
``unknown_fields``, for the caller to report, never fatal) and the wire format
is JSON: ``validate`` reads a dict as the JSON it stands for, so ``"2025-03-03T05:00:00Z"`` is a
time, ``"12.50"`` a quantity and ``"1"`` is not a sequence number.

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
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Annotated, Any, Literal, TypeAlias, TypedDict, cast, get_args

from pydantic import AfterValidator, AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, \
    ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError
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


@dataclass(frozen=True)
class Clock:
    """The validation context: the moment "the future" starts from, less the skew allowed."""

    now: datetime | None = None  # None: the real clock, read when the event is validated
    skew: timedelta = CLOCK_SKEW


class CriticalTrackingEvent(BaseModel):
    """One CTE with its Key Data Elements. Strict: a value of the wrong shape is an error, not a guess."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)  # an unknown field is kept and reported

    supplier_id: str = Field(pattern=SUPPLIER_PATTERN)
    lot_code: KeyPart  # the traceability lot code
    event_type: CteType
    location_gln: Gln  # where the event happened
    gtin: Gtin  # what the lot is
    event_time: AwareDatetime  # a naive time is refused: "05:00" where?
    quantity: Quantity
    unit_of_measure: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9 .,/()_-]{0,63}$")  # "cases (12 x 1 lb bags)"
    source_event_id: KeyPart  # the producer's own id for the event
    seq: int | None = Field(default=None, ge=1)  # the producer's order of a lot's events, when it sends one (real
    # feeds do not): without it, the ledger numbers the lot's events in the order it commits them (``ledger.py``)
    # The rule's other KDEs, optional here (the stream's producers do not send them), typed when sent:
    product_description: str | None = Field(default=None, min_length=1, max_length=200)
    tlc_source_gln: Gln | None = None  # the traceability lot code source (where the lot code was assigned)
    tlc_source_reference: str | None = Field(default=None, min_length=1, max_length=200)  # or a reference to it
    reference_document_type: str | None = Field(default=None, pattern=r"^[A-Za-z][A-Za-z0-9 _-]{0,31}$")  # BOL, ASN
    reference_document_number: str | None = Field(default=None, min_length=1, max_length=64)
    previous_source_gln: Gln | None = None  # receiving: the immediate previous source
    subsequent_recipient_gln: Gln | None = None  # shipping: the immediate subsequent recipient
    input_lot_codes: tuple[KeyPart, ...] | None = None  # transformation: the lots that went in

    @property
    def unknown_fields(self) -> tuple[str, ...]:
        """Fields the contract does not know, kept as sent (``model_extra``) for the caller to report."""
        return tuple(sorted(self.model_extra or {}))

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
    return hashlib.sha256(f"{event.lot_code}|{event.event_type}|{event.source_event_id}".encode()).hexdigest()


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
    def error_types(self) -> set[str]:
        return {problem["type"] for problem in self.errors}


def supplier_label(supplier: str) -> str:
    """The supplier id as a label (metrics, ledger columns): ``"unknown"`` unless well-formed, so a
    payload can neither invent series nor overflow a column."""
    return supplier if re.fullmatch(SUPPLIER_PATTERN, supplier) else "unknown"


def supplier_of(raw: RawPayload) -> str:
    """The supplier id of any payload, valid or not, when it has a well-formed one; else ``"unknown"``."""
    decoded: object = raw
    if isinstance(raw, (str, bytes)):
        try:
            decoded = json.loads(raw)
        except ValueError:
            return "unknown"
    if isinstance(decoded, Mapping):
        supplier = cast(Mapping[str, object], decoded).get("supplier_id")
        if isinstance(supplier, str):
            return supplier_label(supplier)
    return "unknown"


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

InvalidKind = Literal["gln_check_digit", "gtin_check_digit", "naive_timestamp", "future_timestamp", "zero_quantity"]
INVALID_KINDS: tuple[InvalidKind, ...] = get_args(InvalidKind)
EXPECTED_ERROR: dict[InvalidKind, tuple[str, str]] = {
    "gln_check_digit": ("location_gln", "gln_check_digit"),
    "gtin_check_digit": ("gtin", "gtin_check_digit"),
    "naive_timestamp": ("event_time", "timezone_aware"),
    "future_timestamp": ("event_time", "future_timestamp"),
    "zero_quantity": ("quantity", "greater_than"),
}
"""Each invalid kind and the one problem ``validate`` must report for it: (field, error type)."""

START = datetime(2025, 3, 3, 5, 0, tzinfo=UTC)
TICK = timedelta(seconds=15)
"""A stream starts at ``START``; a new lot opens at the time of the payload that opens it (one per ``TICK``)."""

LIFECYCLE: tuple[CteType, ...] = ("harvesting", "cooling", "shipping", "receiving")
TRANSFORMED_SHARE = 0.25  # lots that end with a transformation (fresh-cut at the receiver)
_GAP_MINUTES: dict[CteType, tuple[int, int]] = {  # time since the lot's previous event
    "harvesting": (0, 180), "cooling": (30, 240), "shipping": (360, 2_880), "receiving": (240, 4_320),
    "transformation": (120, 1_440),
}
_OFFSETS = (-8, -7, -6, -5, -4, 0, 1)  # hours: growers and packers from California to Spain
_UNITS = ("case", "carton", "kg", "lb")


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
    """Each supplier's own GLNs (farm, cooler, shipping dock)."""
    as_of: datetime
    """A ``now`` later than every valid event time: validate with it for a run that never depends on the clock."""

    @property
    def valid_distinct(self) -> int:
        """How many events must end up committed."""
        return len(self.payloads) - len(self.invalid) - len(self.duplicates)

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
    tz: timezone
    farm: str
    cooler: str
    dock: str
    gtins: tuple[str, ...]
    lots_opened: int = 0


@dataclass
class _Lot:
    supplier: _Supplier
    code: str
    steps: tuple[CteType, ...]
    gtin: str
    unit: str
    hundredths: int  # the quantity, in hundredths of the unit
    receiver: str
    time: datetime
    done: int = 0


def _with_check_digit(body: str) -> str:
    return body + ean.calc_check_digit(body)


def _supplier(rng: random.Random, number: int) -> _Supplier:
    prefix = f"{rng.randrange(300, 980)}{rng.randrange(10_000):04d}"  # a 7-digit GS1 company prefix
    farm, cooler, dock = (_with_check_digit(f"{prefix}{rng.randrange(100_000):05d}") for _ in range(3))
    gtins = (_with_check_digit(f"1{prefix}{rng.randrange(100_000):05d}"),  # GTIN-14, a case
             _with_check_digit(f"{prefix}{rng.randrange(100_000):05d}"),  # GTIN-13
             _with_check_digit(f"{prefix[1:]}{rng.randrange(100_000):05d}"))  # GTIN-12 (UPC-A)
    return _Supplier(f"SUP-{number:03d}", timezone(timedelta(hours=rng.choice(_OFFSETS))), farm, cooler, dock, gtins)


def _open_lot(rng: random.Random, supplier: _Supplier, receivers: tuple[str, ...], clock: datetime) -> _Lot:
    supplier.lots_opened += 1
    harvest = clock + timedelta(minutes=rng.randrange(0, 120))
    steps = LIFECYCLE + (("transformation",) if rng.random() < TRANSFORMED_SHARE else ())
    unit = rng.choice(_UNITS)
    hundredths = rng.randrange(20, 1_200) * 100 if unit in ("case", "carton") else rng.randrange(5_000, 2_000_000)
    code = f"{supplier.supplier_id.replace('-', '')}-{harvest.astimezone(supplier.tz):%y%m%d}-{supplier.lots_opened:04d}"
    return _Lot(supplier, code, steps, rng.choice(supplier.gtins), unit, hundredths, rng.choice(receivers), harvest)


def _quantity(hundredths: int, unit: str) -> str:
    if unit in ("case", "carton"):
        return str(hundredths // 100)
    return f"{hundredths // 100}.{hundredths % 100:02d}"


def _next_event(rng: random.Random, lot: _Lot) -> tuple[RawEvent, datetime]:
    """The lot's next event, as its producer sends it, and its time (aware, the supplier's local time)."""
    kind = lot.steps[lot.done]
    low, high = _GAP_MINUTES[kind]
    if lot.done:
        lot.time += timedelta(minutes=rng.randrange(low, high + 1), seconds=rng.randrange(60))
    if kind == "transformation":
        lot.hundredths = max(100, lot.hundredths * rng.randrange(88, 99) // 100)  # trimmed, washed, cut
    lot.done += 1
    place = {"harvesting": lot.supplier.farm, "cooling": lot.supplier.cooler, "shipping": lot.supplier.dock,
             "receiving": lot.receiver, "transformation": lot.receiver}[kind]
    local = lot.time.astimezone(lot.supplier.tz)
    payload: RawEvent = {
        "supplier_id": lot.supplier.supplier_id,
        "lot_code": lot.code,
        "event_type": kind,
        "location_gln": place,
        "gtin": lot.gtin,
        "event_time": local.isoformat(timespec="seconds"),
        "quantity": _quantity(lot.hundredths, lot.unit),
        "unit_of_measure": lot.unit,
        "source_event_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)),
        "seq": lot.done,
    }
    if kind == "transformation":  # the rule: a transformation assigns a new lot code, naming the lots that went in
        payload.update(lot_code=transformed_lot(lot.code), seq=1, input_lot_codes=[lot.code])
    return payload, local


def transformed_lot(code: str) -> str:
    """The lot code the transformer assigns to what it made of lot ``code`` (fresh-cut): a new lot."""
    return f"{code}-FC"


def _wrong_last_digit(rng: random.Random, number: str) -> str:
    return number[:-1] + str((int(number[-1]) + rng.randrange(1, 10)) % 10)


def _break_gln(rng: random.Random, payload: RawEvent, local: datetime) -> None:
    payload["location_gln"] = _wrong_last_digit(rng, str(payload["location_gln"]))


def _break_gtin(rng: random.Random, payload: RawEvent, local: datetime) -> None:
    payload["gtin"] = _wrong_last_digit(rng, str(payload["gtin"]))


def _naive_time(rng: random.Random, payload: RawEvent, local: datetime) -> None:
    payload["event_time"] = local.replace(tzinfo=None).isoformat(sep=rng.choice("T "), timespec="seconds")


def _future_time(rng: random.Random, payload: RawEvent, local: datetime) -> None:
    years = rng.choice((12, 100, 1_000))  # a mistyped year, far enough ahead to stay invalid against any real clock
    payload["event_time"] = (local + timedelta(days=365 * years)).isoformat(timespec="seconds")


def _zero_quantity(rng: random.Random, payload: RawEvent, local: datetime) -> None:
    payload["quantity"] = rng.choice(("0", "0.00", "0.000"))


_BREAK: dict[InvalidKind, Callable[[random.Random, RawEvent, datetime], None]] = {
    "gln_check_digit": _break_gln, "gtin_check_digit": _break_gtin, "naive_timestamp": _naive_time,
    "future_timestamp": _future_time, "zero_quantity": _zero_quantity,
}
_RECENT = 64  # a resend repeats one of the last valid payloads, often after newer events of its lot


def generate(seed: int, events: int, suppliers: int = 6, lots: int = 8, invalid_every: int = 0,
             duplicate_every: int = 0) -> Stream:
    """``events`` payloads, the same for the same arguments.

    ``suppliers`` each keep ``lots`` lots open at once; each payload is the next event of an open
    lot drawn at random (so lots interleave, each in lifecycle order with increasing ``seq`` and
    times), and a finished lot is replaced by a new one. A lot that ends transformed (fresh-cut at
    the receiver, ``TRANSFORMED_SHARE`` of them) ends in a new lot, as the rule requires: the
    transformation's ``lot_code`` is ``transformed_lot(input)``, its ``seq`` 1, its
    ``input_lot_codes`` the lot that went in. Payload ``i`` (1-based) is a resend of a
    recent valid payload when ``i % duplicate_every == 0``, else invalid when ``i % invalid_every
    == 0``, in each of ``INVALID_KINDS`` in turn (0 turns either off)."""
    if events < 0 or suppliers < 1 or lots < 1 or invalid_every < 0 or duplicate_every < 0:
        raise ValueError("events, invalid_every and duplicate_every must be >= 0; suppliers and lots >= 1")
    rng = random.Random(seed)
    partners = [_supplier(rng, number) for number in range(1, suppliers + 1)]
    receiver_prefix = f"{rng.randrange(300, 980)}{rng.randrange(10_000):04d}"
    receivers = tuple(_with_check_digit(f"{receiver_prefix}{rng.randrange(100_000):05d}") for _ in range(4))
    open_lots = [_open_lot(rng, partner, receivers, START) for partner in partners for _ in range(lots)]
    payloads: list[RawEvent] = []
    invalid: dict[int, InvalidKind] = {}
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
            _BREAK[kind](rng, payload, local)
            invalid[position] = kind
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
        locations={p.supplier_id: (p.farm, p.cooler, p.dock) for p in partners},
        as_of=(latest + timedelta(hours=1)).astimezone(UTC),
    )
