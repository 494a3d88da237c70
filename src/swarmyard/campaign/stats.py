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


#: Seeds below which a bootstrap interval is not trusted: with fewer, the resamples are a handful of values and
#: the "95%" band is about [min, max] (zero width when the seeds agree).
MIN_TRUSTED_SEEDS = 8


@dataclass(frozen=True, slots=True)
class Paired:
    """Cell A against cell B on the seeds both ran: the per-seed differences A - B and what they say."""

    diffs: tuple[float, ...]
    mean: float
    #: the percentile bootstrap over seeds of the mean difference (``low <= mean <= high``)
    low: float
    high: float
    wins: int
    losses: int
    ties: int
    #: exact two-sided p-values: the sign test and the Wilcoxon signed-rank test (ties and zeros handled exactly)
    sign_p: float
    wilcoxon_p: float

    @property
    def trusted(self) -> bool:
        """Enough seeds for the interval to mean what it says."""
        return len(self.diffs) >= MIN_TRUSTED_SEEDS


def paired(a: Sequence[float], b: Sequence[float], *, seed: int = 0, resamples: int = RESAMPLES) -> Paired:
    """Compare two cells seed by seed (``a[i]`` and ``b[i]`` ran on the same seed); ``ValueError`` for no pairs or
    lengths that differ."""
    if len(a) != len(b):
        raise ValueError("paired values come in pairs")
    diffs = tuple(x - y for x, y in zip(a, b, strict=True))
    interval = bootstrap_ci(diffs, seed=seed, resamples=resamples)
    wins = sum(1 for d in diffs if d > 0)
    losses = sum(1 for d in diffs if d < 0)
    return Paired(diffs, interval.mean, interval.low, interval.high, wins, losses, len(diffs) - wins - losses,
                  sign_test(wins, losses), wilcoxon_signed_rank(diffs))


def sign_test(wins: int, losses: int) -> float:
    """The exact two-sided sign test of ``wins`` against ``losses`` (ties left out): twice the smaller binomial
    tail at one half, at most 1."""
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(wins, losses) + 1)) / 2**n
    return float(min(1.0, 2 * tail))


def wilcoxon_signed_rank(diffs: Sequence[float]) -> float:
    """The exact two-sided Wilcoxon signed-rank test of differences around 0.

    Zeros are left out (Wilcoxon's own rule); tied magnitudes get their average rank and the null distribution is
    counted over every assignment of signs to those ranks (so it is exact with ties too), by dynamic programming
    over doubled ranks, which are integers.
    """
    nonzero = [d for d in diffs if d != 0]
    n = len(nonzero)
    if n == 0:
        return 1.0
    ordered = sorted(range(n), key=lambda i: abs(nonzero[i]))
    doubled = [0] * n  # twice each average rank
    start = 0
    while start < n:
        end = start
        while end + 1 < n and abs(nonzero[ordered[end + 1]]) == abs(nonzero[ordered[start]]):
            end += 1
        for k in range(start, end + 1):
            doubled[ordered[k]] = start + end + 2  # (start+1 + end+1) / 2, doubled
        start = end + 1
    w_plus = sum(r for r, d in zip(doubled, nonzero, strict=True) if d > 0)
    counts = [0] * (sum(doubled) + 1)  # how many sign assignments give each doubled W+
    counts[0] = 1
    for rank in doubled:
        for total in range(len(counts) - 1, rank - 1, -1):
            counts[total] += counts[total - rank]
    everything = 2**n
    below = sum(counts[: w_plus + 1]) / everything
    above = sum(counts[w_plus:]) / everything
    return float(min(1.0, 2 * min(below, above)))
