"""The statistics of docs/results.md: Student's t distribution, the paired and Welch t-tests of one method
against another over seeds, and Holm's correction for the number of comparisons in a section.

No scipy (the suite's environment has none): the t distribution's CDF is the regularized incomplete beta
function, evaluated by its continued fraction (Lentz's method, as in Numerical Recipes' ``betacf``).
``tests/test_results_stats.py`` checks it against the closed forms of 1 and 2 degrees of freedom and
against published critical values."""

import math
from collections.abc import Sequence
from typing import NamedTuple


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (converges fast for x < (a + 1) / (a + b + 2))."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            return h
    raise ArithmeticError(f"incomplete beta: no convergence for a={a}, b={b}, x={x}")


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1.

    >>> round(incomplete_beta(1.0, 1.0, 0.3), 12)  # the uniform distribution's CDF
    0.3
    """
    if not (a > 0 and b > 0 and 0.0 <= x <= 1.0):
        raise ValueError(f"incomplete_beta needs a, b > 0 and 0 <= x <= 1, got a={a}, b={b}, x={x}")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with ``df`` (real, > 0) degrees of freedom.

    >>> round(t_two_sided_p(1.0, 1.0), 12)  # Cauchy: 1 - 2 atan(1) / pi
    0.5
    """
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    if math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0
    return incomplete_beta(df / 2.0, 0.5, df / (df + t * t))


class TTest(NamedTuple):
    """A t-test's statistic, its degrees of freedom and two-sided p-value (NaN: not defined, e.g. fewer
    than two values a side, or no spread at all)."""

    t: float
    df: float
    p: float


UNDEFINED = TTest(math.nan, math.nan, math.nan)


def _mean_var(values: Sequence[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    return mean, sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def paired_t(a: Sequence[float], b: Sequence[float]) -> TTest:
    """Paired t-test of ``a - b`` (the same seeds, so the same eval articles and sampling seed):
    t = mean(d) / (sd(d) / sqrt(n)), n - 1 degrees of freedom."""
    if len(a) != len(b):
        raise ValueError(f"a paired test needs as many values a side, got {len(a)} and {len(b)}")
    d = [x - y for x, y in zip(a, b)]
    if len(d) < 2 or not all(math.isfinite(v) for v in d):
        return UNDEFINED
    mean, var = _mean_var(d)
    if var == 0.0:
        return UNDEFINED
    t = mean / math.sqrt(var / len(d))
    return TTest(t, len(d) - 1.0, t_two_sided_p(t, len(d) - 1.0))


def welch_t(a: Sequence[float], b: Sequence[float]) -> TTest:
    """Welch's unequal-variance t-test of mean(a) - mean(b), with the Welch-Satterthwaite degrees of
    freedom."""
    if len(a) < 2 or len(b) < 2 or not all(math.isfinite(v) for v in (*a, *b)):
        return UNDEFINED
    (ma, va), (mb, vb) = _mean_var(a), _mean_var(b)
    sa, sb = va / len(a), vb / len(b)
    if sa + sb == 0.0:
        return UNDEFINED
    t = (ma - mb) / math.sqrt(sa + sb)
    df = (sa + sb) ** 2 / (sa**2 / (len(a) - 1) + sb**2 / (len(b) - 1))
    return TTest(t, df, t_two_sided_p(t, df))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of the p-values of one family of comparisons (controls the chance of
    any false rejection, like Bonferroni, and rejects at least as much). NaN p-values stay NaN and do
    not count as comparisons.

    >>> holm([0.01, 0.04, 0.03])
    [0.03, 0.06, 0.06]
    """
    order = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
    adjusted = [math.nan] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * p))
        adjusted[i] = running
    return adjusted
