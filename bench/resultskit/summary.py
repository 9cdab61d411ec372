"""Summaries over seeds and how the page writes them: mean and sample std of the finite values (the
others counted, never dropped), a curve's last values, one value formatted. The bottom of the results
package with :mod:`comparisons` (no other module of it imported)."""

import math
from collections.abc import Sequence
from typing import NamedTuple

from .comparisons import LAST


class Summary(NamedTuple):
    """Mean and sample std (0 for one value) of the finite values, their count ``n``, and how many values
    were not finite (NaN or infinite): never dropped silently, every table shows them."""

    mean: float
    std: float
    n: int
    nonfinite: int = 0


def mean_std(values: Sequence[float | None]) -> Summary:
    """Mean, sample std and count of the finite values, and the count of the others.

    >>> mean_std([1.0, 2.0, 3.0])
    Summary(mean=2.0, std=1.0, n=3, nonfinite=0)
    >>> mean_std([1.0, float("nan")])
    Summary(mean=1.0, std=0.0, n=1, nonfinite=1)
    """
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    nonfinite = sum(1 for v in values if v is not None and not math.isfinite(v))
    if not finite:
        return Summary(math.nan, math.nan, 0, nonfinite)
    mean = sum(finite) / len(finite)
    if len(finite) == 1:
        return Summary(mean, 0.0, 1, nonfinite)
    return Summary(mean, math.sqrt(sum((v - mean) ** 2 for v in finite) / (len(finite) - 1)), len(finite), nonfinite)


def last_mean(values: Sequence[float], last: int = LAST) -> float:
    """The mean of a curve's last ``last`` values; NaN when any of them is not finite (a failed iteration
    shows as such in the tables, it is not averaged away).

    >>> last_mean([9.0, 1.0, 2.0], last=2)
    1.5
    >>> last_mean([1.0, float("nan")], last=2)
    nan
    """
    window = [float(v) for v in values[-last:]]
    if not window or not all(math.isfinite(v) for v in window):
        return math.nan
    return sum(window) / len(window)


def last_finite(values: Sequence[float]) -> float:
    """The last finite value of a curve (NaN if none).

    >>> last_finite([0.5, 0.75, float("nan")])
    0.75
    """
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return finite[-1] if finite else math.nan


def fmt(mean: float, std: float, n: int, nonfinite: int = 0, digits: int = 3) -> str:
    """``mean ± std (n=N)``; one value has no spread to show (``value (n=1)``); values that were not
    finite are counted beside n with a mark.

    >>> fmt(2.0, 0.5, 2, 1)
    '2.000 ± 0.500 (n=2, ⚠ 1 non-finite)'
    >>> fmt(1.5, 0.0, 1)
    '1.500 (n=1)'
    """
    shown = "—" if n == 0 else f"{mean:.{digits}f}" if n == 1 else f"{mean:.{digits}f} ± {std:.{digits}f}"
    if nonfinite:
        return f"{shown} (n={n}, ⚠ {nonfinite} non-finite)"
    return shown if n == 0 else f"{shown} (n={n})"


def value(v: float, digits: int = 3) -> str:
    """One value: ``0.123``, or ``⚠ nan`` / ``⚠ inf`` for a value that is not finite.

    >>> value(float("nan"))
    '⚠ nan'
    """
    return f"{v:.{digits}f}" if math.isfinite(v) else f"⚠ {v}"
