"""Pure reservation arithmetic: the worst case of a call and the largest ``max_tokens`` an envelope affords.

worst case = ceil((input bound x input price + max output x output price) / 1,000,000), with prices in
micro-USD per million tokens, so the result is whole micro-USD rounded up and never under the true cost.
"""

from __future__ import annotations

from swarmyard.domain import Price

_PER_MTOK = 1_000_000


def worst_case(input_tokens: int, max_output_tokens: int, price: Price) -> int:
    """The most a call can cost, in micro-USD."""
    if input_tokens < 0 or max_output_tokens < 0:
        raise ValueError("token counts are never negative")
    numerator = input_tokens * price.input_per_mtok + max_output_tokens * price.output_per_mtok
    return -(-numerator // _PER_MTOK)


def actual_cost(input_tokens: int, output_tokens: int, price: Price) -> int:
    """What a finished call costs, in micro-USD (same rounding as the worst case)."""
    return worst_case(input_tokens, output_tokens, price)


def largest_affordable(available: int, input_tokens: int, price: Price, cap: int) -> int:
    """The largest ``max_tokens`` (at most ``cap``) whose worst case fits in ``available``; 0 if none.

    ceil(X / 1e6) <= A exactly when X <= A x 1e6, so the bound is found with integers only.
    """
    if available < 0 or cap <= 0:
        return 0
    room = available * _PER_MTOK - input_tokens * price.input_per_mtok
    if room < 0:
        return 0
    if price.output_per_mtok == 0:
        return cap
    return min(cap, room // price.output_per_mtok)
