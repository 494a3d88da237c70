"""Money is ``int`` micro-USD everywhere (1 USD = 1,000,000). Floats never carry money."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import NewType

from swarmyard.errors import InvalidInputError

MicroUSD = NewType("MicroUSD", int)

MICRO_PER_USD = 1_000_000
#: the most any amount may be: $1,000,000,000, the plane's own ceiling for a budget (SQLite INTEGER holds 2**63)
MAX_MICRO_USD = 10**15
_MAX_WHOLE_DIGITS = len(str(MAX_MICRO_USD // MICRO_PER_USD))
_USD = re.compile(r"(?P<whole>[0-9]+)(?:\.(?P<frac>[0-9]{1,6}))?")


def micro_usd(value: object, *, field: str = "amount") -> MicroUSD:
    """Validate an amount of micro-USD: an ``int`` (not ``bool``), zero or more."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{field} must be an integer number of micro-USD, got {type(value).__name__}", field=field)
    if value < 0:
        raise InvalidInputError(f"{field} must not be negative, got {value}", field=field)
    return MicroUSD(value)


def parse_usd(text: str, *, field: str) -> MicroUSD:
    """Dollars written ``^[0-9]+(\\.[0-9]{1,6})?$`` ("12", "0.15") as micro-USD, exactly.

    ASCII digits only, at most six decimal places and at most ``MAX_MICRO_USD``: no sign, exponent, space,
    underscore or other script's digits (``Decimal`` takes "1e3", "1_0", "\u0661" and " 1"), so an amount is
    refused where it is read, before anything is stored.
    """
    match = _USD.fullmatch(text)
    if match is None:
        raise InvalidInputError(f"{field} must be dollars in ASCII digits with at most six decimal places, "
                                f'such as "12.50"; got {text[:40]!r}', field=field)
    whole = match["whole"].lstrip("0") or "0"
    micro = (0 if len(whole) > _MAX_WHOLE_DIGITS else
             int(whole) * MICRO_PER_USD + int((match["frac"] or "0").ljust(6, "0")))
    if len(whole) > _MAX_WHOLE_DIGITS or micro > MAX_MICRO_USD:
        raise InvalidInputError(f"{field} is over the ceiling of {format_usd(MAX_MICRO_USD)}", field=field)
    return MicroUSD(micro)


def usd_to_micro(usd: str | int | Decimal, *, field: str = "budget_usd") -> MicroUSD:
    """Convert dollars (a decimal string as ``parse_usd`` reads it, an int or a Decimal; never a float) to
    micro-USD, exactly."""
    if isinstance(usd, bool | float):
        raise InvalidInputError(f"{field} must be a decimal string or integer, not {type(usd).__name__}", field=field)
    if isinstance(usd, int):
        if not 0 <= usd <= MAX_MICRO_USD // MICRO_PER_USD:
            raise InvalidInputError(f"{field} must be zero to {format_usd(MAX_MICRO_USD)}", field=field)
        return MicroUSD(usd * MICRO_PER_USD)
    if isinstance(usd, Decimal):
        if not usd.is_finite() or usd.adjusted() > _MAX_WHOLE_DIGITS:
            raise InvalidInputError(f"{field} must be a finite amount up to {format_usd(MAX_MICRO_USD)}",
                                    field=field)
        usd = format(usd, "f")
    if not isinstance(usd, str):
        raise InvalidInputError(f"{field} must be a decimal string, not {type(usd).__name__}", field=field)
    return parse_usd(usd, field=field)


def format_usd(amount: int) -> str:
    """Render micro-USD as dollars, e.g. ``$0.012345``."""
    sign = "-" if amount < 0 else ""
    whole, frac = divmod(abs(amount), MICRO_PER_USD)
    return f"{sign}${whole}.{frac:06d}"
