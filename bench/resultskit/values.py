"""The values docs/results.md reads from its records, and how it writes them: a record's eval, validation
and curve values, per method and seed, and their formatting (a non-finite value is marked, never dropped).
The layer under :mod:`provenance`, :mod:`significance` and :mod:`reading`."""

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .comparisons import COMPARISONS, LAST
from .summary import fmt, last_mean, mean_std

Record = dict[str, Any]


Value = Callable[[Record], float]


def v3(x: float, digits: int = 3) -> str:
    """A value with ``digits`` decimals; a non-finite one marked (it is never dropped)."""
    return f"{x:.{digits}f}" if math.isfinite(x) else f"⚠ {x}"


def ms(values: Sequence[float], digits: int = 3) -> str:
    """``mean ± std (n=N)`` of the values, a non-finite one counted beside n."""
    return fmt(*mean_std(values), digits=digits)


def slash(values: Iterable[float], digits: int = 3) -> str:
    return " / ".join(v3(x, digits) for x in values)


def span(values: Sequence[float], digits: int = 3) -> str:
    """``lo-hi`` of the finite values (``lo`` alone when they are equal), the non-finite ones counted."""
    finite = [x for x in values if math.isfinite(x)]
    bad = len(values) - len(finite)
    if not finite:
        return f"⚠ {bad} non-finite"
    lo, hi = min(finite), max(finite)
    text = v3(lo, digits) if v3(lo, digits) == v3(hi, digits) else f"{v3(lo, digits)}-{v3(hi, digits)}"
    return f"{text} (⚠ {bad} non-finite)" if bad else text


def of(k: int, n: int) -> str:
    """``every one of the 3`` / ``2 of 3`` / ``none of the 3``."""
    return f"all {n}" if k == n else ("none" if k == 0 else f"{k} of {n}")


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """Trailing moving average, the window clipped at the start (``baselines.infra.plots.smooth``).

    >>> moving_average([1.0, 2.0, 3.0, 4.0], 2)
    [1.0, 1.5, 2.5, 3.5]
    """
    return [sum(values[max(0, i - window + 1):i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(values))]


def window(record: Record, key: str, first: int, last: int | None = None) -> list[float]:
    """A curve's values at iterations ``first``..``last`` (1-based, inclusive; ``last`` None: to the end)."""
    curve = record["curve"]
    return [v for it, v in zip(curve.get("iteration", []), curve.get(key, []))
            if first <= it <= (last if last is not None else math.inf)]


def first_iteration(record: Record, key: str, test: Callable[[float], bool]) -> int | None:
    """The first iteration whose ``key`` passes ``test`` (None if none)."""
    for it, v in zip(record["curve"].get("iteration", []), record["curve"].get(key, [])):
        if test(v):
            return int(it)
    return None


def of_method(records: Sequence[Record], name: str) -> list[Record]:
    """``name``'s records, by seed."""
    return sorted((r for r in records if r["method"] == name), key=lambda r: r["seed"])


def seeds(records: Sequence[Record]) -> str:
    return " / ".join(str(r["seed"]) for r in records)


def ev(key: str = "total", split: str = "eval") -> Value:
    """A record's ``split`` (``eval``, ``eval_before``, ``validation``) value of ``key`` (NaN if absent). An
    ``eval`` value carries, as ``before``, the same value of the evaluation before training (the same
    problems and sampling seed: what a paired test's premise check compares, :func:`before_of`).

    >>> ev("total")({"eval": {"total": 2.0}}), before_of(ev("total"))({"eval_before": {"total": 1.0}})
    (2.0, 1.0)
    """
    def value(r: Record) -> float:
        return float(r.get(split, {}).get(key, math.nan))

    if split == "eval":
        value.before = ev(key, "eval_before")  # type: ignore[attr-defined]
    return value


def before_of(value: Value) -> Value | None:
    """The before-training counterpart of a value (None: the value has none, e.g. a training curve's)."""
    return getattr(value, "before", None)


def final(model: str, key: str) -> Value:
    """The mean of a PPO / CORY curve's last iterations (``agent_<model>/<key>``), NaN when one is not finite."""
    return lambda r: last_mean(r["curve"][f"agent_{model}/{key}"], LAST)


def cpu_s(r: Record) -> float:
    return float(r["cpu_s"]) if r.get("cpu_s") is not None else math.nan


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def by_seed(records: Sequence[Record], name: str, value: Value) -> dict[int, float]:
    """Seed -> ``value`` of method ``name``'s record."""
    return {r["seed"]: value(r) for r in of_method(records, name)}


def method_label(records: Sequence[Record], name: str) -> str:
    """A method's label: its records', else (a method with no record yet) the label the comparison of
    ``records`` gives it, else its name."""
    mine = of_method(records, name)
    if mine:
        return mine[0]["label"]
    comparisons = {r.get("comparison") for r in records} & set(COMPARISONS)
    return next((m.label for c in sorted(comparisons) for m in COMPARISONS[c] if m.name == name), name)


def cpu_line(records: Sequence[Record]) -> str:
    """CPU seconds a run, per method (each run once; records that did not time it, unknown)."""
    parts = []
    for name in dict.fromkeys(r["method"] for r in records):
        values = [cpu_s(r) for r in of_method(records, name)]
        known = [x for x in values if math.isfinite(x)]
        if known:
            unknown = len(values) - len(known)
            parts.append(f"{method_label(records, name)} {span(known, 0)}" + (f" ({unknown} "
                                                                              f"unknown)" if unknown else ""))
        else:
            parts.append(f"{method_label(records, name)} unknown")
    return "CPU seconds a run (the process's own CPU time, the fairer measure of cost on a shared machine): " + \
        "; ".join(parts) + "."
