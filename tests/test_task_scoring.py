"""Benchmark scores on hand-made numbers: intervals, normalized scores, paired differences."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cbgym.tasks import batch_means, mean_ci, normalized_score, paired_difference


def test_mean_ci_is_the_student_t_interval() -> None:
    ci = mean_ci([1, 2, 3, 4, 5])
    # mean 3, sd sqrt(2.5), t(0.975, 4) = 2.776445: half width 1.963
    assert ci.mean == 3 and ci.n == 5
    assert ci.low == pytest.approx(3 - 2.776445 * math.sqrt(2.5 / 5), abs=1e-5)
    assert ci.high == pytest.approx(3 + 2.776445 * math.sqrt(2.5 / 5), abs=1e-5)
    wide = mean_ci([1, 2, 3, 4, 5], level=0.99)
    assert wide.low < ci.low and wide.high > ci.high
    one = mean_ci([7.0])
    assert one.mean == 7 and math.isnan(one.low) and math.isnan(one.high)


def test_normalized_score_is_zero_for_random_and_one_for_the_best() -> None:
    random, best = [400, 420, 380], [480, 500, 460]
    assert normalized_score(random, random, best).mean == 0
    assert normalized_score(best, random, best).mean == pytest.approx(1)
    half = normalized_score([440, 460, 420], random, best)
    assert half.mean == pytest.approx(0.5) and half.low == half.high == pytest.approx(0.5)
    noisy = normalized_score([450, 450, 420], random, best)
    assert noisy.mean == pytest.approx((np.mean([450, 450, 420]) - 400) / 80)
    assert noisy.low < noisy.mean < noisy.high


def test_paired_difference_counts_and_interval() -> None:
    d = paired_difference([10, 12, 9, 11], [8, 12, 7, 10])
    assert (d.wins, d.ties, d.losses) == (3, 1, 0)
    assert d.difference.mean == pytest.approx(1.25)
    assert d.significant == (d.difference.low > 0)
    same = paired_difference([5, 6], [5, 6])
    assert same.difference.mean == 0 and not same.significant


def test_bad_input_is_refused_with_a_message() -> None:
    with pytest.raises(ValueError, match="same windows"):
        paired_difference([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="does not separate"):
        normalized_score([1, 2], [5, 5], [4, 4])
    with pytest.raises(ValueError, match="finite"):
        mean_ci([1, float("nan")])
    with pytest.raises(ValueError, match="level"):
        mean_ci([1, 2], level=1.5)


def test_batch_means_average_neighbouring_windows() -> None:
    np.testing.assert_array_equal(batch_means([1, 2, 3, 4, 5], 2), [1.5, 3.5])  # 5 dropped
    np.testing.assert_array_equal(batch_means([1, 2, 3], 1), [1, 2, 3])
    for size in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="positive integer"):
            batch_means([1, 2, 3, 4], size)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 2"):
        batch_means([1, 2, 3], 2)
