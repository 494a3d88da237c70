"""The campaign's statistics: the percentile bootstrap of the mean (seeded, on data whose answer is known), the
similarity of submissions, and the durable record a resume reads."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from swarmyard.campaign.record import TrialLog, TrialRecord
from swarmyard.campaign.stats import (
    bootstrap_ci,
    mean,
    mean_pairwise_similarity,
    paired,
    sign_test,
    similarity,
    wilcoxon_signed_rank,
)
from swarmyard.errors import UserError


def test_bootstrap_of_a_fair_coin_matches_the_normal_interval() -> None:
    values = [0.0] * 50 + [1.0] * 50
    ci = bootstrap_ci(values, seed=7)
    # the normal approximation: 0.5 +- 1.96 * sqrt(0.25 / 100) = 0.5 +- 0.098
    assert ci.mean == 0.5
    assert 0.38 < ci.low < 0.43 and 0.57 < ci.high < 0.62
    assert math.isclose(0.5 - ci.low, ci.high - 0.5, abs_tol=0.03)


def test_bootstrap_is_seeded_and_the_seed_matters() -> None:
    values = [3.0, 9.0, 4.0, 12.0, 7.0, 1.0]
    assert bootstrap_ci(values, seed=1) == bootstrap_ci(values, seed=1)
    assert bootstrap_ci(values, seed=1) != bootstrap_ci(values, seed=2)


def test_bootstrap_interval_holds_the_mean_and_narrows_with_more_data() -> None:
    small = [float(v) for v in range(10)]
    large = small * 10
    a, b = bootstrap_ci(small, seed=3), bootstrap_ci(large, seed=3)
    assert a.low <= a.mean == 4.5 <= a.high and b.mean == 4.5
    assert (b.high - b.low) < (a.high - a.low) / 2
    # the spread of resampled means is the standard error: sd / sqrt(n) for n = 100
    se = statistics.pstdev(large) / math.sqrt(len(large))
    assert math.isclose(b.high - b.low, 2 * 1.96 * se, rel_tol=0.15)


def test_bootstrap_of_one_value_or_equal_values_has_no_width() -> None:
    assert bootstrap_ci([5.0]) == bootstrap_ci([5.0, 5.0, 5.0])
    one = bootstrap_ci([5.0])
    assert (one.mean, one.low, one.high) == (5.0, 5.0, 5.0)


def test_bootstrap_refuses_what_it_cannot_do() -> None:
    with pytest.raises(ValueError, match="no values"):
        bootstrap_ci([])
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ci([1.0, 2.0], confidence=1.0)
    with pytest.raises(ValueError, match="no values"):
        mean([])


def test_similarity_of_submissions() -> None:
    assert similarity("abc", "abc") == 1.0
    assert similarity("aaaa", "bbbb") == 0.0
    assert 0 < similarity("instance 1 code 1234", "instance 1 code 1299") < 1
    assert mean_pairwise_similarity(["x"]) is None
    assert mean_pairwise_similarity(["ab", "ab", "cd"]) == pytest.approx((1 + 0 + 0) / 3)


def _record(key: str, score: int | None = 1) -> TrialRecord:
    return TrialRecord(key, key.split("#")[0], int(key.split("#")[1]), "run_x", score, 10, 2, 30, 4, 1.5, 0.5, 3, True)


def test_the_record_survives_a_torn_last_line_and_refuses_another_campaign(tmp_path: Path) -> None:
    log = TrialLog(tmp_path / "c")
    assert log.begin("c", "digest-1", resume=False) == {}
    log.append(_record("a#1"))
    log.append(_record("a#2", None))
    with log.path.open("a") as handle:
        handle.write('{"key": "a#3", "cel')  # a write the kill cut off
    with pytest.raises(UserError, match="already holds a campaign"):
        TrialLog(tmp_path / "c").begin("c", "digest-1", resume=False)
    with pytest.raises(UserError, match="another campaign"):
        TrialLog(tmp_path / "c").begin("c", "digest-2", resume=True)
    again = TrialLog(tmp_path / "c")
    found = again.begin("c", "digest-1", resume=True)
    assert sorted(found) == ["a#1", "a#2"] and found["a#2"].score is None
    again.append(_record("a#3"))
    assert sorted(again.read()) == ["a#1", "a#2", "a#3"]
    with pytest.raises(UserError, match="no campaign to resume"):
        TrialLog(tmp_path / "other").begin("c", "digest-1", resume=True)


def test_the_paired_difference_and_its_interval_match_a_hand_computed_case() -> None:
    # four seeds where a beats b by 1 and four where they tie: the bootstrap mean of 8 draws is Binomial(8, 1/2)/8,
    # whose 2.5% and 97.5% quantiles are 1/8 and 7/8 (P(X <= 0) = 1/256 < 2.5% <= P(X <= 1) = 9/256)
    a = [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    found = paired([x + 5 for x in a], [5.0] * 8, seed=3)
    assert found.diffs == tuple(a) and found.mean == 0.5 and found.trusted
    assert (found.low, found.high) == (0.125, 0.875)
    assert (found.wins, found.losses, found.ties) == (4, 0, 4)
    assert found.sign_p == 2 / 16  # 4 wins of 4 untied: 2 * (1/2)^4
    assert found.wilcoxon_p == 2 / 16  # the four equal nonzero differences: all positive is 1 of 2^4 sign patterns


def test_the_exact_tests_against_hand_counts() -> None:
    # differences 1, -2, 3..8: W- = 2, and 3 of the 256 sign patterns give W- <= 2 ({}, {1}, {2})
    assert wilcoxon_signed_rank([1, -2, 3, 4, 5, 6, 7, 8]) == 6 / 256
    assert sign_test(7, 1) == 2 * 9 / 256  # P(X <= 1) for Binomial(8, 1/2) is 9/256
    assert sign_test(8, 0) == wilcoxon_signed_rank(range(1, 9)) == 2 / 256
    assert wilcoxon_signed_rank([0, 0]) == sign_test(0, 0) == 1.0  # nothing but ties: no evidence either way
    # tied magnitudes get their average rank: |1|, |-1| rank 1.5 each, 2 rank 3; W+ = 4.5. Of the 8 sign patterns
    # (sums 0, 1.5, 1.5, 3, 3, 4.5, 4.5, 6), 3 reach 4.5 or more: p = 2 * 3/8
    assert wilcoxon_signed_rank([1, -1, 2]) == 0.75
    assert not paired([1.0] * 7, [0.0] * 7).trusted  # fewer than 8 seeds: the interval is not to be trusted
