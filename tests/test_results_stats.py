"""bench/results_stats.py: the t distribution (regularized incomplete beta, no scipy) against closed forms
and published critical values, the paired and Welch tests against values worked out by hand, Holm."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def stats():
    spec = importlib.util.spec_from_file_location("bench_results_stats", ROOT / "bench" / "results_stats.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 1.53, 4.0, 40.0])
def test_t_distribution_matches_its_closed_forms(stats, t: float) -> None:
    # 1 degree of freedom is the Cauchy distribution, 2 has CDF 1/2 + t / (2 sqrt(2 + t^2)).
    assert stats.t_two_sided_p(t, 1.0) == pytest.approx(1.0 - 2.0 * math.atan(t) / math.pi, abs=1e-12)
    assert stats.t_two_sided_p(-t, 2.0) == pytest.approx(1.0 - t / math.sqrt(2.0 + t * t), abs=1e-12)


@pytest.mark.parametrize(("t", "df", "p"), [
    (12.706, 1, 0.05), (4.303, 2, 0.05), (2.776, 4, 0.05), (2.228, 10, 0.05), (2.042, 30, 0.05),
    (9.925, 2, 0.01), (3.169, 10, 0.01), (1.812, 10, 0.10),
])
def test_t_distribution_matches_the_tables_critical_values(stats, t: float, df: int, p: float) -> None:
    assert stats.t_two_sided_p(t, df) == pytest.approx(p, rel=2e-3)  # the tables round t to 3 decimals


def test_incomplete_beta_symmetry_and_bounds(stats) -> None:
    for a, b, x in [(0.5, 0.5, 0.2), (3.0, 0.5, 0.9), (10.0, 2.5, 0.7)]:
        assert stats.incomplete_beta(a, b, x) == pytest.approx(1.0 - stats.incomplete_beta(b, a, 1.0 - x), abs=1e-12)
    assert stats.incomplete_beta(0.5, 0.5, 0.5) == pytest.approx(0.5, abs=1e-12)  # arcsine distribution's median
    with pytest.raises(ValueError, match="0 <= x <= 1, got a=1, b=1, x=1.5"):
        stats.incomplete_beta(1, 1, 1.5)


def test_paired_and_welch_by_hand(stats) -> None:
    a, b = [1.0, 2.0, 3.5], [0.5, 1.9, 2.0]
    # d = (0.5, 0.1, 1.5): mean 0.7, var (0.04 + 0.36 + 0.64) / 2 = 0.52, t = 0.7 / sqrt(0.52 / 3), df 2.
    paired = stats.paired_t(a, b)
    assert paired.t == pytest.approx(0.7 / math.sqrt(0.52 / 3)) and paired.df == 2.0
    assert paired.p == pytest.approx(1.0 - paired.t / math.sqrt(2.0 + paired.t**2))  # df 2's closed form
    # var(a) = 19/12, var(b) = 211/300: t = 0.7 / sqrt(19/36 + 211/900), Welch-Satterthwaite df 3.484.
    sa, sb = 19 / 36, 211 / 900
    welch = stats.welch_t(a, b)
    assert welch.t == pytest.approx(0.7 / math.sqrt(sa + sb))
    assert welch.df == pytest.approx((sa + sb) ** 2 / (sa**2 / 2 + sb**2 / 2))
    assert 0.4 < welch.p < 0.5  # between the df-3 and df-4 tables' p for t = 0.80
    # Too few values, a non-finite value or no spread: not defined, not a p of 0 or 1.
    for test in (stats.paired_t([1.0], [0.0]), stats.welch_t([1.0, math.nan], [0.0, 1.0]),
                 stats.paired_t([1.0, 2.0], [0.0, 1.0]), stats.welch_t([1.0, 1.0], [2.0, 2.0])):
        assert all(math.isnan(v) for v in test)
    with pytest.raises(ValueError, match="as many values a side, got 2 and 3"):
        stats.paired_t([1.0, 2.0], [1.0, 2.0, 3.0])


def test_holm(stats) -> None:
    # Sorted 0.01, 0.03, 0.04: x3, x2, x1 = 0.03, 0.06, 0.04 -> running max 0.03, 0.06, 0.06.
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    adjusted = stats.holm([0.2, math.nan, 0.6])  # NaN is not a comparison: a family of 2
    assert adjusted[0] == pytest.approx(0.4) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.6)
    assert stats.holm([0.5, 0.9]) == [1.0, 1.0]  # capped at 1
