"""The statistics of docs/results.md, from scipy.stats: the paired and Welch t-tests of one method against
another over seeds, each with the interval of the mean difference, and the one multiplicity correction
over a section's comparisons (Bonferroni: the interval at ``1 - level / m`` is a simultaneous interval for
the section, and it excludes 0 exactly when the adjusted p is below ``level``).

``tests/test_results_stats.py`` checks the tests against values worked out by hand and the correction's
intervals against its p values."""

import math
from collections.abc import Sequence
from typing import Literal, NamedTuple

from scipy import stats

Kind = Literal["paired", "welch"]


class TTest(NamedTuple):
    """One t-test of mean(a) - mean(b): which test, the difference it estimates, its statistic, degrees of
    freedom and two-sided p value, and the interval of the difference at ``confidence`` (NaN throughout:
    not defined, e.g. fewer than two values a side, a non-finite value, or no spread at all)."""

    kind: Kind
    difference: float
    t: float
    df: float
    p: float
    low: float
    high: float
    confidence: float

    @property
    def defined(self) -> bool:
        return not math.isnan(self.p)


def _undefined(kind: Kind, difference: float, confidence: float) -> TTest:
    return TTest(kind, difference, math.nan, math.nan, math.nan, math.nan, math.nan, confidence)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def paired_t(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> TTest:
    """Paired t-test of ``a - b`` (a[i] and b[i] measured on the same episodes), with the interval of the
    mean difference (``scipy.stats.ttest_rel``).

    >>> test = paired_t([1.0, 2.0, 3.5], [0.5, 1.9, 2.0])
    >>> round(test.difference, 3), round(test.t, 3), test.df, round(test.p, 3)
    (0.7, 1.681, 2.0, 0.235)
    """
    if len(a) != len(b):
        raise ValueError(f"a paired test needs as many values a side, got {len(a)} and {len(b)}")
    d = [x - y for x, y in zip(a, b)]
    difference = _mean(d)
    if len(d) < 2 or not all(math.isfinite(v) for v in d) or len(set(d)) == 1:
        return _undefined("paired", difference, confidence)
    result = stats.ttest_rel(a, b)
    interval = result.confidence_interval(confidence)
    return TTest("paired", difference, float(result.statistic), float(result.df), float(result.pvalue),
                 float(interval.low), float(interval.high), confidence)


def welch_t(a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> TTest:
    """Welch's unequal-variance t-test of mean(a) - mean(b), with the Welch-Satterthwaite degrees of freedom
    and the interval of the difference (``scipy.stats.ttest_ind(..., equal_var=False)``)."""
    difference = _mean(a) - _mean(b)
    if (len(a) < 2 or len(b) < 2 or not all(math.isfinite(v) for v in (*a, *b))
            or (len(set(a)) == 1 and len(set(b)) == 1)):
        return _undefined("welch", difference, confidence)
    result = stats.ttest_ind(a, b, equal_var=False)
    interval = result.confidence_interval(confidence)
    return TTest("welch", difference, float(result.statistic), float(result.df), float(result.pvalue),
                 float(interval.low), float(interval.high), confidence)


def t_test(kind: Kind, a: Sequence[float], b: Sequence[float], confidence: float = 0.95) -> TTest:
    """The ``kind`` test of ``a`` against ``b``."""
    return (paired_t if kind == "paired" else welch_t)(a, b, confidence)


def bonferroni(pvalues: Sequence[float]) -> list[float]:
    """The p values of one family of ``m`` tests, each times ``m`` (capped at 1): a test's adjusted p is below
    ``level`` exactly when its interval at ``1 - level / m`` excludes 0. NaN p values stay NaN and do not
    count as tests.

    >>> bonferroni([0.01, 0.04, float("nan"), 0.6])
    [0.03, 0.12, nan, 1.0]
    """
    m = sum(1 for p in pvalues if not math.isnan(p))
    return [p if math.isnan(p) else min(1.0, round(m * p, 15)) for p in pvalues]


def simultaneous_confidence(m: int, level: float = 0.05) -> float:
    """The confidence of each interval of a family of ``m`` so that all ``m`` cover together with
    probability at least ``1 - level`` (Bonferroni).

    >>> simultaneous_confidence(5)
    0.99
    """
    return 1.0 - level / max(m, 1)


def t_power(kind: Kind, effect: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """The power of the two-sided ``kind`` test at level ``alpha`` to detect a true mean difference ``effect``
    with ``n`` seeds a side (paired: ``n`` pairs, ``sd`` the spread of the differences; Welch: two rows of
    ``n`` seeds each of spread ``sd``, the equal-variance degrees of freedom), from the noncentral t
    (``scipy.stats.nct``). NaN when it is not defined (``n`` < 2, no spread).

    >>> round(t_power("welch", 1.0, 1.0, 17), 2)
    0.81
    >>> round(t_power("paired", 0.5, 1.0, 34), 2)
    0.81
    """
    if n < 2 or not (math.isfinite(sd) and sd > 0 and math.isfinite(effect)):
        return math.nan
    if kind == "paired":
        df, scale = n - 1, sd / math.sqrt(n)
    else:
        df, scale = 2 * n - 2, sd * math.sqrt(2.0 / n)
    ncp, crit = abs(effect) / scale, float(stats.t.ppf(1.0 - alpha / 2.0, df))
    upper, lower = float(stats.nct.sf(crit, df, ncp)), float(stats.nct.cdf(-crit, df, ncp))
    # Far in a tail scipy's noncentral t can answer NaN: there the tail is 0 (or the whole mass, above).
    upper = (1.0 if ncp > crit else 0.0) if math.isnan(upper) else upper
    return upper + (0.0 if math.isnan(lower) else lower)


def seeds_needed(kind: Kind, effect: float, sd: float, alpha: float = 0.05, power: float = 0.8,
                 most: int = 10_000) -> int | None:
    """The fewest seeds a side (``kind``'s test at level ``alpha``) whose power to detect ``effect`` reaches
    ``power`` (:func:`t_power`); None when not within ``most`` or not defined.

    >>> seeds_needed("welch", 1.0, 1.0)
    17
    """
    if not (math.isfinite(sd) and sd > 0 and effect):
        return None
    low, high = 2, 2
    while t_power(kind, effect, sd, high, alpha) < power:
        if high >= most:
            return None
        low, high = high, min(2 * high, most)
    while low < high:  # the power grows with n: bisect for the first n that reaches it
        mid = (low + high) // 2
        low, high = (mid + 1, high) if t_power(kind, effect, sd, mid, alpha) < power else (low, mid)
    return high
