"""What a model costs and how much it can read: the maintained table, or what the swarm file says.

Known models take their price and context window from ``genai-prices``, a maintained table that ships its data
in the package; it is read from the installed files, never fetched (its auto-update is never started). Prices
are decimal USD per million tokens there and in swarm files; each is converted once, here, to integer micro-USD
per million tokens, the unit of ``ModelRoute`` and the ledger.

A swarm file's own value must convert exactly (at most six decimal places); a table value that would not is
rounded up, so a budget never holds less than the list price. Tiered prices take the highest tier the model's
context window can reach (a tier that starts at the window can never apply).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_CEILING, Decimal

from swarmyard.errors import InvalidInputError
from swarmyard.money import MICRO_PER_USD, parse_usd

#: The table's provider ids for the hosted kinds (an ``openai_compatible`` route is matched by URL, then name).
TABLE_PROVIDERS = {"openai": "openai", "anthropic": "anthropic"}


@dataclass(frozen=True, slots=True)
class KnownModel:
    """A model's list price (micro-USD per million tokens) and context window, as the table has them."""

    input_per_mtok: int
    output_per_mtok: int
    context_tokens: int | None


def usd_per_mtok_to_micro(value: str, *, field: str) -> int:
    """A decimal string of USD per million tokens as whole micro-USD per million tokens, exactly.

    ``ValueError`` (with a message for the user) when it is not a number, negative, or finer than a micro-USD.
    """
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a decimal string such as \"0.15\" (money is never a float)")
    try:
        return parse_usd(value, field=field)  # the one reading of a dollar string: ASCII, bounded, exact
    except InvalidInputError as exc:
        raise ValueError(exc.message) from None


def _micro_up(amount: Decimal) -> int:
    return int((amount * MICRO_PER_USD).to_integral_value(rounding=ROUND_CEILING))


def _price_of(price: object, context_tokens: int | None) -> Decimal | None:
    """One price key of the table as a flat Decimal: a tiered price at the highest tier the window reaches."""
    from genai_prices.types import TieredPrices

    if price is None:
        return None
    if isinstance(price, TieredPrices):
        reachable = [tier.price for tier in price.tiers if context_tokens is None or tier.start < context_tokens]
        return max([price.base, *reachable])
    if isinstance(price, Decimal):
        return price
    return None


def known_model(kind: str, model: str, base_url: str | None = None) -> KnownModel | None:
    """The table's price and window of ``model`` served by a provider of ``kind``; ``None`` if it has none.

    ``openai`` and ``anthropic`` look in their own provider's list; ``openai_compatible`` in the provider whose
    API address matches ``base_url``, else wherever the model's name is known (a proxy serving ``gpt-4o-mini``
    charges like OpenAI does: ask for an explicit price where it does not).
    """
    from genai_prices import data_snapshot

    snapshot = data_snapshot.get_snapshot()
    lookups: list[tuple[str | None, str | None]] = []
    if kind in TABLE_PROVIDERS:
        lookups.append((TABLE_PROVIDERS[kind], None))
    elif kind == "openai_compatible":
        if base_url:
            lookups.append((None, base_url))
        lookups.append((None, None))
    for provider_id, api_url in lookups:
        try:
            _, info = snapshot.find_provider_model(model, None, provider_id, api_url)
        except LookupError:
            continue
        prices = info.get_prices(datetime.now(tz=UTC))
        window = info.context_window
        input_price = _price_of(getattr(prices, "input_mtok", None), window)
        output_price = _price_of(getattr(prices, "output_mtok", None), window)
        if input_price is None or output_price is None:
            continue  # priced per request, per second or per image: not something the ledger can hold
        return KnownModel(_micro_up(input_price), _micro_up(output_price), window)
    return None
