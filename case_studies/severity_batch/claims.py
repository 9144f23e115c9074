"""Insurance claims: the nightly extract, its validation, and the one scoring function.

- ``generate(seed, n, poison_every, featureless_every)``: a synthetic extract, rows of
  strings as a CSV gives them. Row ``i`` (1-based) is poison when ``i % poison_every
  == 0`` and featureless when ``i % featureless_every == 0`` and not poison (0 turns
  either off), so a check knows the exact ids of each. Poison rows are malformed in one
  of ``POISON_KINDS``, taken in turn, with a variation drawn per row.
- ``parse(raw)``: a ``Claim``, or None for a featureless row (the caller skips it), or
  ``PoisonClaim`` for a malformed row (the caller quarantines it: retrying cannot help).
- ``assess(claim)``: the claim's ``Severity``: a score in [0, 1] to 4 decimal places,
  its tier (low, medium, high, severe) under a versioned set of thresholds, and
  whether the loss exceeds the policy's limit; ``score(claim)`` is its score. The
  same function the real-time path calls, so the batch and the live score never
  disagree.

The model (``MODEL_VERSION``), as a claims actuary would read it: the size of the
loss counts in money, on a log scale up to ``REFERENCE_LOSS`` (a 9,000 loss is not a
900,000 one, whatever their limits), and the loss against its limit counts beside it;
then peril, claim history, building age and region. A loss above its limit is no
data error but an excess-of-limit claim, among the most severe there are: it scores
with its ratio capped at 1 and its tier is at least ``high``. Tiers come from the
score's cut-offs and from absolute floors (a large loss is at least ``high``, a
catastrophic one ``severe``), all in ``Thresholds``, whose ``version`` is recorded
with every tier so a re-tiered book can say which thresholds each claim met.

Pure and deterministic: no I/O, no clock, no global random state (``random.Random(seed)``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import ROUND_HALF_EVEN, Context, Decimal, localcontext
from typing import Literal, TypeAlias, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

MODEL_VERSION = "severity-2.0.0"

Peril = Literal["fire", "flood", "theft", "liability", "storm"]
PERILS: tuple[Peril, ...] = get_args(Peril)

RawClaim: TypeAlias = dict[str, str]
"""One row of the extract: every value a string, an empty string for a missing value."""

FEATURES = ("prior_claims", "property_age_years", "region_risk")
COLUMNS = ("claim_id", "policy_id", "peril", "coverage_limit", "loss_amount", "reported_at", *FEATURES)


class PoisonClaim(Exception):
    """A row that can never be scored as it is: quarantine it with ``reason``, do not retry it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Claim(BaseModel):
    """A claim that can be scored. Strict: a value of the wrong shape is an error, not a guess."""

    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")

    claim_id: str = Field(pattern=r"^C[0-9]+$")
    policy_id: str = Field(pattern=r"^P[0-9]{7}$")
    peril: Peril
    coverage_limit: Decimal = Field(gt=0, max_digits=12, decimal_places=2)
    loss_amount: Decimal = Field(ge=0, max_digits=12, decimal_places=2)
    reported_at: date
    prior_claims: int = Field(ge=0, le=50)
    property_age_years: int = Field(ge=0, le=300)
    region_risk: Decimal = Field(ge=0, le=1, decimal_places=2)


def parse(raw: RawClaim) -> Claim | None:
    """The row as a ``Claim``; None when it has no features at all; ``PoisonClaim`` when malformed."""
    if not any(raw.get(name) for name in FEATURES):
        return None
    try:
        return Claim.model_validate_strings(raw, strict=True)
    except ValidationError as error:
        raise PoisonClaim(_reason(error)) from None  # the reason says it all; no chained traceback to ship


def _reason(error: ValidationError) -> str:
    """Every problem, each naming its field: ``loss_amount: Input should be a valid decimal (got 'NaN')``."""
    parts: list[str] = []
    for problem in error.errors(include_url=False):
        field = ".".join(str(part) for part in problem["loc"])
        given = problem["input"]
        shown = f" (got {given[:24]!r})" if field and isinstance(given, str) else ""
        parts.append(f"{field}: {problem['msg']}{shown}" if field else problem["msg"])
    return "; ".join(parts)


# The score: a weighted sum of terms that each lie in [0, 1], with weights summing to 1.
PERIL_WEIGHT: dict[Peril, Decimal] = {
    "fire": Decimal("0.90"), "flood": Decimal("0.80"), "liability": Decimal("0.70"),
    "storm": Decimal("0.60"), "theft": Decimal("0.40"),
}
W_SIZE, W_RATIO, W_PERIL, W_HISTORY, W_AGE, W_REGION = (
    Decimal(w) for w in ("0.40", "0.10", "0.15", "0.15", "0.10", "0.10"))
REFERENCE_LOSS = Decimal(1_000_000)
"""A loss this large or larger has the full size term (the book's currency)."""
_ZERO, _ONE, _PLACES = Decimal(0), Decimal(1), Decimal("0.0001")
_CONTEXT = Context(prec=28, rounding=ROUND_HALF_EVEN)  # fixed, so the caller's decimal context cannot change a score

Tier = Literal["low", "medium", "high", "severe"]
TIERS: tuple[Tier, ...] = get_args(Tier)


@dataclass(frozen=True)
class Thresholds:
    """Where the tiers start, versioned: the score's cut-offs and the absolute floors."""

    version: str
    medium: Decimal  # score at which a claim is at least medium
    high: Decimal
    severe: Decimal
    large_loss: Decimal  # a loss of at least this is at least high, whatever its score
    catastrophic_loss: Decimal  # and of at least this, severe


THRESHOLDS = Thresholds("tiers-2026.1", medium=Decimal("0.50"), high=Decimal("0.65"), severe=Decimal("0.80"),
                        large_loss=Decimal(250_000), catastrophic_loss=Decimal(1_000_000))


@dataclass(frozen=True)
class Severity:
    score: Decimal  # [0, 1], 4 places
    tier: Tier
    excess_of_limit: bool  # the loss is above the policy's limit
    thresholds: str  # Thresholds.version
    model: str  # MODEL_VERSION


def assess(claim: Claim, thresholds: Thresholds = THRESHOLDS) -> Severity:
    """The claim's score, tier and excess-of-limit flag (see the module docstring)."""
    with localcontext(_CONTEXT):
        size = min((claim.loss_amount + 1).log10() / (REFERENCE_LOSS + 1).log10(), _ONE)
        loss_ratio = min(claim.loss_amount / claim.coverage_limit, _ONE)
        history = Decimal(min(claim.prior_claims, 5)) / 5
        age = Decimal(min(claim.property_age_years, 100)) / 100
        total = (W_SIZE * size + W_RATIO * loss_ratio + W_PERIL * PERIL_WEIGHT[claim.peril] + W_HISTORY * history
                 + W_AGE * age + W_REGION * claim.region_risk)
        value = min(max(total, _ZERO), _ONE).quantize(_PLACES)
    excess = claim.loss_amount > claim.coverage_limit
    rank = sum(1 for cut in (thresholds.medium, thresholds.high, thresholds.severe) if value >= cut)
    if excess or claim.loss_amount >= thresholds.large_loss:
        rank = max(rank, TIERS.index("high"))
    if claim.loss_amount >= thresholds.catastrophic_loss:
        rank = TIERS.index("severe")
    return Severity(value, TIERS[rank], excess, thresholds.version, MODEL_VERSION)


def score(claim: Claim) -> Decimal:
    """Severity in [0, 1], 4 decimal places (``assess(claim).score``)."""
    return assess(claim).score


@dataclass(frozen=True)
class Batch:
    """An extract and what a check must find in it: exactly these ids quarantined, these skipped."""

    rows: tuple[RawClaim, ...]
    poison_ids: frozenset[str]
    featureless_ids: frozenset[str]

    @property
    def scorable(self) -> int:
        """How many rows must end up scored."""
        return len(self.rows) - len(self.poison_ids) - len(self.featureless_ids)


_LIMITS = tuple(limit * 100 for limit in (10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000))  # cents
_DAYS = tuple((date(2025, 1, 1) + timedelta(days=d)).isoformat() for d in range(365))
_PRIOR = ("0", "0", "0", "0", "0", "0", "1", "1", "1", "2", "2", "3", "4", "7")
_AGES = tuple(str(years) for years in range(121))
_RISKS = tuple(f"{k // 100}.{k % 100:02d}" for k in range(101))


def _money(cents: int) -> str:
    sign = "-" if cents < 0 else ""
    return f"{sign}{abs(cents) // 100}.{abs(cents) % 100:02d}"


def _row(rng: random.Random, index: int) -> RawClaim:
    cover = rng.choice(_LIMITS)
    return {
        "claim_id": f"C{index:08d}",
        "policy_id": f"P{rng.randrange(10_000_000):07d}",
        "peril": rng.choice(PERILS),
        "coverage_limit": _money(cover),
        "loss_amount": _money(int(cover * rng.random() ** 2)),  # most losses are small against the cover
        "reported_at": rng.choice(_DAYS),
        "prior_claims": rng.choice(_PRIOR),
        "property_age_years": rng.choice(_AGES),
        "region_risk": rng.choice(_RISKS),
    }


def _loss_not_a_number(rng: random.Random, row: RawClaim) -> None:
    whole, cents = row["loss_amount"].split(".")
    row["loss_amount"] = rng.choice((f"{int(whole) + 1000:,}.{cents}", "NaN", f"{whole}.{cents} EUR", "n/a"))


def _negative_cover(rng: random.Random, row: RawClaim) -> None:
    row["coverage_limit"] = "-" + row["coverage_limit"]


def _unknown_peril(rng: random.Random, row: RawClaim) -> None:
    row["peril"] = rng.choice(("earthquake", "FIRE", "hail", "WTR", "fire "))


def _negative_loss(rng: random.Random, row: RawClaim) -> None:
    row["loss_amount"] = _money(-rng.randrange(1, 5_000_000))  # a recovery booked as a loss: no loss to score


def _bad_feature(rng: random.Random, row: RawClaim) -> None:
    name, value = rng.choice((("region_risk", "1.35"), ("prior_claims", "-1"), ("property_age_years", "forty"),
                              ("region_risk", ""), ("prior_claims", "2.5")))
    row[name] = value


def _bad_date(rng: random.Random, row: RawClaim) -> None:
    row["reported_at"] = rng.choice(("31/12/2025", "2025-02-30", "2025-13-01", "yesterday"))


def _sub_cent_amount(rng: random.Random, row: RawClaim) -> None:
    row["loss_amount"] = row["loss_amount"] + rng.choice("159")


POISON_KINDS: tuple[Callable[[random.Random, RawClaim], None], ...] = (
    _loss_not_a_number, _negative_cover, _unknown_peril, _negative_loss, _bad_feature, _bad_date,
    _sub_cent_amount,
)


def generate(seed: int, n: int, poison_every: int = 0, featureless_every: int = 0) -> Batch:
    """``n`` rows, the same for the same arguments; claim ids ``C00000001`` onwards."""
    rng = random.Random(seed)
    rows: list[RawClaim] = []
    poison: list[str] = []
    featureless: list[str] = []
    for index in range(1, n + 1):
        row = _row(rng, index)
        if poison_every and index % poison_every == 0:
            POISON_KINDS[len(poison) % len(POISON_KINDS)](rng, row)
            poison.append(row["claim_id"])
        elif featureless_every and index % featureless_every == 0:
            row.update(dict.fromkeys(FEATURES, ""))
            featureless.append(row["claim_id"])
        rows.append(row)
    return Batch(tuple(rows), frozenset(poison), frozenset(featureless))
