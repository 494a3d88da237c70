"""The campaign's statistics: the mean with a percentile-bootstrap confidence interval, and how alike attempts are.

Pure functions on plain numbers and strings; the bootstrap draws from ``random.Random(seed)``, so a campaign's
table is the same every time it is computed from the same record.
"""

from __future__ import annotations

import difflib
import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

#: Resamples of the bootstrap: enough that the 2.5th and 97.5th percentiles move by well under a point.
RESAMPLES = 2000
#: Characters of a submission compared (difflib is quadratic in the worst case).
SIMILARITY_CHARS = 2000
#: Pairs of submissions compared within one trial, at most.
MAX_PAIRS = 200


@dataclass(frozen=True, slots=True)
class Interval:
    """A mean and its confidence interval (``low <= mean <= high``)."""

    mean: float
    low: float
    high: float


def mean(values: Sequence[float]) -> float:
    """The arithmetic mean; ``ValueError`` for no values."""
    if not values:
        raise ValueError("the mean of no values")
    return math.fsum(values) / len(values)


def _percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of sorted values, interpolated linearly between neighbours."""
    position = q * (len(ordered) - 1)
    lower = math.floor(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)


def bootstrap_ci(values: Sequence[float], *, confidence: float = 0.95, resamples: int = RESAMPLES,
                 seed: int = 0) -> Interval:
    """The mean of ``values`` and its percentile-bootstrap interval: ``resamples`` means of resamples drawn with
    replacement, cut at the two tails of ``1 - confidence``. One value (or all equal) gives a zero-width
    interval; ``ValueError`` for no values or a confidence outside (0, 1)."""
    if not values:
        raise ValueError("a confidence interval of no values")
    if not 0 < confidence < 1:
        raise ValueError("confidence must be between 0 and 1")
    if resamples < 1:
        raise ValueError("resamples must be at least 1")
    centre = mean(values)
    if len(values) == 1 or min(values) == max(values):
        return Interval(centre, centre, centre)
    rng = random.Random(seed)
    n = len(values)
    means = sorted(math.fsum(rng.choices(values, k=n)) / n for _ in range(resamples))
    tail = (1 - confidence) / 2
    return Interval(centre, min(centre, _percentile(means, tail)), max(centre, _percentile(means, 1 - tail)))


def similarity(a: str, b: str) -> float:
    """How alike two submissions are, 0 (nothing in common) to 1 (the same text): difflib's ratio of their
    first ``SIMILARITY_CHARS`` characters."""
    a, b = a[:SIMILARITY_CHARS], b[:SIMILARITY_CHARS]
    if a == b:
        return 1.0
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def mean_pairwise_similarity(submissions: Sequence[str]) -> float | None:
    """The mean similarity over pairs of ``submissions`` (at most ``MAX_PAIRS``, taken in order); ``None``
    with fewer than two."""
    if len(submissions) < 2:
        return None
    pairs = list(itertools.islice(itertools.combinations(submissions, 2), MAX_PAIRS))
    return mean([similarity(a, b) for a, b in pairs])
