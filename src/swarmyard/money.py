"""Money is ``int`` micro-USD everywhere (1 USD = 1,000,000). Floats never carry money."""

from __future__ import annotations

from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import NewType

from swarmyard.errors import InvalidInputError

MicroUSD = NewType("MicroUSD", int)

MICRO_PER_USD = 1_000_000


def micro_usd(value: object, *, field: str = "amount") -> MicroUSD:
    """Validate an amount of micro-USD: an ``int`` (not ``bool``), zero or more."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{field} must be an integer number of micro-USD, got {type(value).__name__}", field=field)
    if value < 0:
        raise InvalidInputError(f"{field} must not be negative, got {value}", field=field)
    return MicroUSD(value)


def usd_to_micro(usd: str | int | Decimal, *, field: str = "budget_usd") -> MicroUSD:
    """Convert dollars (a decimal string, int or Decimal; never a float) to micro-USD, rounding up."""
    if isinstance(usd, bool | float):
        raise InvalidInputError(f"{field} must be a decimal string or integer, not {type(usd).__name__}", field=field)
    try:
        amount = Decimal(usd)
    except (InvalidOperation, TypeError, ValueError) as exc:
        raise InvalidInputError(f"{field} is not a number: {usd!r}", field=field) from exc
    if not amount.is_finite() or amount < 0:
        raise InvalidInputError(f"{field} must be a finite amount of zero or more, got {usd!r}", field=field)
    return MicroUSD(int((amount * MICRO_PER_USD).to_integral_value(rounding=ROUND_CEILING)))


def format_usd(amount: int) -> str:
    """Render micro-USD as dollars, e.g. ``$0.012345``."""
    sign = "-" if amount < 0 else ""
    whole, frac = divmod(abs(amount), MICRO_PER_USD)
    return f"{sign}${whole}.{frac:06d}"
