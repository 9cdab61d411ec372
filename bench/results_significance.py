"""A section's comparisons tested from its records: per comparison (A - B on one value, over seeds) the
paired t-test on the seeds both share and Welch's, each family corrected by Holm (``results_stats``); the
tests table, and the sentences a reading states from them (whether a difference holds, and whether a
paper's direction does)."""

import math
from collections.abc import Sequence
from dataclasses import dataclass

from results_stats import TTest, holm, paired_t, welch_t
from results_values import Record, Value, _mean, by_seed, ev, method_label, ms, of, slash, v3

Comparison = tuple[str, str, str, Value]


"""(what is measured, method A, method B, the value of a record): a test of A - B over seeds."""


def against(baseline: str, others: Sequence[str], what: str = "eval total",
            value: Value | None = None) -> list[Comparison]:
    """``baseline`` against each of ``others`` on one value (default: the eval total after training)."""
    return [(what, baseline, other, value or ev()) for other in others]


def _p(p: float) -> str:
    return "—" if math.isnan(p) else (f"{p:.3g}" if p >= 0.001 else "<0.001")


@dataclass(frozen=True)
class Tested:
    """One comparison of a section, tested: A's and B's values by seed, the paired and Welch tests, and
    their p-values after Holm's correction over the section's family of comparisons."""

    what: str
    a: str
    b: str
    values_a: dict[int, float]
    values_b: dict[int, float]
    paired: TTest
    welch: TTest
    paired_holm: float
    welch_holm: float

    @property
    def shared(self) -> list[int]:
        return sorted(set(self.values_a) & set(self.values_b))


def family_tests(records: Sequence[Record], comparisons: Sequence[Comparison]) -> list[Tested]:
    """Every comparison of a section tested, paired (on the seeds A and B share: the same eval articles
    and sampling seed) and by Welch, each family corrected by Holm (comparisons with no test, fewer than
    two values a side or no spread, are not counted in it)."""
    found = []
    for what, a, b, value in comparisons:
        ra, rb = by_seed(records, a, value), by_seed(records, b, value)
        shared = sorted(set(ra) & set(rb))
        found.append((what, a, b, ra, rb, paired_t([ra[s] for s in shared], [rb[s] for s in shared]),
                      welch_t(list(ra.values()), list(rb.values()))))
    paired_holm, welch_holm = holm([f[5].p for f in found]), holm([f[6].p for f in found])
    return [Tested(*f, ph, wh) for f, ph, wh in zip(found, paired_holm, welch_holm)]


def significance_table(records: Sequence[Record], comparisons: Sequence[Comparison]) -> list[str]:
    """Markdown: per comparison the mean difference A - B, the seed-by-seed differences, the paired
    t-test and Welch's, each with its p after Holm's correction over the comparisons of this table."""
    tested = family_tests(records, comparisons)
    lines = [f"Tests (two-sided; Holm's correction over the {sum(1 for t in tested if not math.isnan(t.paired.p))} "
             f"paired and {sum(1 for t in tested if not math.isnan(t.welch.p))} Welch tests of this table; n < 2 a "
             "side, or no spread: no test):", "",
             "| measure | A - B | mean difference | per seed | paired t (df), p, Holm p | Welch t (df), p, Holm p | "
             "seeds |",
             "|---|---|---|---|---|---|---|"]
    for t in tested:
        diffs = ", ".join(f"{v3(t.values_a[s] - t.values_b[s])} (s{s})" for s in t.shared) or "no shared seed"
        diff = _mean(list(t.values_a.values())) - _mean(list(t.values_b.values()))
        paired = "—" if math.isnan(t.paired.p) else \
            f"{t.paired.t:.2f} ({t.paired.df:.0f}), {_p(t.paired.p)}, **{_p(t.paired_holm)}**"
        welch = "—" if math.isnan(t.welch.p) else \
            f"{t.welch.t:.2f} ({t.welch.df:.1f}), {_p(t.welch.p)}, **{_p(t.welch_holm)}**"
        lines.append(f"| {t.what} | {method_label(records, t.a)} - {method_label(records, t.b)} | {v3(diff)} | "
                     f"{diffs} | {paired} | {welch} | {len(t.values_a)} + {len(t.values_b)} |")
    return lines


def direction(t: "Tested", level: float = 0.05) -> str:
    """Whether the paper's direction (A above B) holds on a tested comparison: it holds (above, and
    significant after Holm's correction by either test), holds in direction only, does not hold (A not
    above B), or is not measurable (a side with no record or one seed, or every value the same on both
    sides).

    >>> from results_stats import paired_t, welch_t
    >>> one = Tested("x", "a", "b", {0: 2.0}, {0: 1.0, 1: 1.5}, paired_t([2.0], [1.0]), welch_t([2.0], [1.0, 1.5]),
    ...              math.nan, math.nan)
    >>> direction(one)
    'not measurable yet (1 + 2 seeds: a test needs two a side)'
    """
    a, b = list(t.values_a.values()), list(t.values_b.values())
    if not (a and b):
        return "not measurable yet (no record on one side)"
    if len({*a, *b}) == 1:
        return f"not measurable at this size (every value is {v3(a[0])} on both sides)"
    untested = math.isnan(t.paired_holm) and math.isnan(t.welch_holm)
    if untested and min(len(a), len(b)) < 2:
        return f"not measurable yet ({len(a)} + {len(b)} seeds: a test needs two a side)"
    if _mean(a) <= _mean(b):
        return "does not hold"
    if untested:
        return "holds in direction only (untested: no spread within the sides)"
    if min(t.paired_holm, t.welch_holm) < level:
        return f"holds (significant at {level:g} after Holm's correction)"
    return f"holds in direction only (not significant at {level:g} after Holm's correction)"


def against_baseline(records: Sequence[Record], comparisons: Sequence[Comparison]) -> list[str]:
    """The reading any section of comparisons against a baseline can have (``SECTION_TESTS``): per
    comparison both means, on how many shared seeds A is ahead of B and by how much, and whether the
    difference holds after Holm's correction."""
    out = []
    for t in family_tests(records, comparisons):
        if not (t.values_a and t.values_b):
            continue
        ahead = sum(1 for seed in t.shared if t.values_a[seed] > t.values_b[seed])
        out.append(f"- **{method_label(records, t.a)} against {method_label(records, t.b)}** ({t.what}): "
                   f"{ms(list(t.values_a.values()))} against {ms(list(t.values_b.values()))}; above it on "
                   f"{of(ahead, len(t.shared))} shared seeds (A - B: "
                   f"{slash(t.values_a[seed] - t.values_b[seed] for seed in t.shared)}); {verdict(t)}.")
    return out


def verdict(t: Tested, level: float = 0.05) -> str:
    """Whether a comparison's difference holds at ``level`` after Holm's correction, paired and Welch."""
    if math.isnan(t.paired_holm) and math.isnan(t.welch_holm):
        return "no test (fewer than two seeds a side, or no spread)"
    holds = [name for name, p in (("paired", t.paired_holm), ("Welch", t.welch_holm)) if p < level]
    shown = f"Holm-corrected p {_p(t.paired_holm)} paired, {_p(t.welch_holm)} Welch"
    if len(holds) == 2:
        return f"significant at {level:g} by both tests ({shown})"
    if holds:
        return f"significant at {level:g} by the {holds[0]} test only ({shown})"
    return f"not significant at {level:g} ({shown})"
