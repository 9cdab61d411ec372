"""bench/resultskit/stats.py: the paired and Welch t-tests (scipy.stats) against values worked out by hand,
their intervals, and the one correction over a section (Bonferroni) whose simultaneous intervals agree with
its adjusted p values."""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def stats():
    sys.path.insert(0, str(ROOT / "bench"))
    return importlib.import_module("resultskit.stats")


def test_paired_and_welch_by_hand(stats) -> None:
    a, b = [1.0, 2.0, 3.5], [0.5, 1.9, 2.0]
    # d = (0.5, 0.1, 1.5): mean 0.7, var (0.04 + 0.36 + 0.64) / 2 = 0.52, t = 0.7 / sqrt(0.52 / 3), df 2.
    paired = stats.paired_t(a, b)
    assert paired.kind == "paired" and paired.difference == pytest.approx(0.7)
    assert paired.t == pytest.approx(0.7 / math.sqrt(0.52 / 3)) and paired.df == 2.0
    assert paired.p == pytest.approx(1.0 - paired.t / math.sqrt(2.0 + paired.t**2))  # df 2's closed form
    # The interval: 0.7 -/+ t_{0.975, 2} sd/sqrt(n), t_{0.975, 2} = 4.303 (the tables).
    half = 4.302653 * math.sqrt(0.52 / 3)
    assert (paired.low, paired.high) == pytest.approx((0.7 - half, 0.7 + half), rel=1e-6)
    # var(a) = 19/12, var(b) = 211/300: t = 0.7 / sqrt(19/36 + 211/900), Welch-Satterthwaite df 3.484.
    sa, sb = 19 / 36, 211 / 900
    welch = stats.welch_t(a, b)
    assert welch.kind == "welch" and welch.t == pytest.approx(0.7 / math.sqrt(sa + sb))
    assert welch.df == pytest.approx((sa + sb) ** 2 / (sa**2 / 2 + sb**2 / 2))
    assert 0.4 < welch.p < 0.5  # between the df-3 and df-4 tables' p for t = 0.80
    assert welch.low < 0.7 < welch.high and (welch.high - welch.low) > (paired.high - paired.low) / 2


def test_undefined_tests_are_nan_not_a_p_of_0_or_1(stats) -> None:
    for test in (stats.paired_t([1.0], [0.0]), stats.welch_t([1.0, math.nan], [0.0, 1.0]),
                 stats.paired_t([1.0, 2.0], [0.0, 1.0]), stats.welch_t([1.0, 1.0], [2.0, 2.0])):
        assert not test.defined and all(math.isnan(v) for v in (test.t, test.df, test.p, test.low, test.high))
    with pytest.raises(ValueError, match="as many values a side, got 2 and 3"):
        stats.paired_t([1.0, 2.0], [1.0, 2.0, 3.0])


def test_the_interval_at_a_higher_confidence_is_wider(stats) -> None:
    a, b = [2.0, 2.5, 3.0], [1.0, 1.4, 2.1]
    narrow, wide = stats.welch_t(a, b, 0.95), stats.welch_t(a, b, stats.simultaneous_confidence(5))
    assert wide.low < narrow.low < narrow.high < wide.high and wide.p == narrow.p


@pytest.mark.parametrize("m", [1, 2, 5, 8])
def test_bonferroni_intervals_agree_with_the_adjusted_p(stats, m: int) -> None:
    """A test's interval at 1 - 0.05 / m excludes 0 exactly when its p times m is below 0.05."""
    for a, b in ([[2.0, 2.5, 3.0], [1.0, 1.4, 2.1]], [[1.0, 1.1, 1.3], [0.2, 0.3, 0.25]], [[1.0, 3.0], [0.0, 2.5]]):
        for kind in ("paired", "welch"):
            test = stats.t_test(kind, a, b, stats.simultaneous_confidence(m))
            (adjusted,) = stats.bonferroni([test.p] + [0.5] * (m - 1))[:1]
            assert (adjusted < 0.05) == (test.low > 0 or test.high < 0), (kind, a, b, m)


def test_bonferroni(stats) -> None:
    assert stats.bonferroni([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.12, 0.09])
    adjusted = stats.bonferroni([0.2, math.nan, 0.6])  # NaN is not a test: a family of 2
    assert adjusted[0] == pytest.approx(0.4) and math.isnan(adjusted[1]) and adjusted[2] == 1.0  # capped at 1
    assert stats.simultaneous_confidence(4) == pytest.approx(0.9875)


def test_no_hand_written_distribution_is_left(stats) -> None:
    source = (ROOT / "bench" / "resultskit" / "stats.py").read_text(encoding="utf-8")
    assert "incomplete_beta" not in source and "lgamma" not in source and "from scipy import stats" in source
