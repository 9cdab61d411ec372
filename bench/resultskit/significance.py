"""A section's comparisons tested from its records, by rules fixed before the numbers:

- **One primary test per comparison, declared in its definition** (:class:`Comparison`'s ``test``):
  ``paired`` where the two rows are meant to evaluate the same episodes (the same env, eval problems,
  sampling settings and seed), ``welch`` otherwise. No second test is computed, so none can be chosen
  after the fact.
- **The premise of a paired test is checked** (:func:`premise`): two rows are paired only when their
  records show the same episodes: the same seeds, the same episode settings and stored episodes, and the
  same before-training value of the measure on every seed. Otherwise the comparison uses Welch's test
  and the page says why; a paired p value never comes from rows that differ before training.
- **One correction over all the comparisons of a section** (Bonferroni, ``stats.bonferroni``): each
  effect is stated as a difference with its 95% interval and its simultaneous interval over the
  section's ``m`` tests (each at ``1 - 0.05 / m``), and read from the simultaneous one: *holds* (wholly on
  the side the comparison claims), *reversed* (wholly on the other side) or *inconclusive* (it covers 0).

The tests table (:func:`significance_table`) and the sentences a reading states from it
(:func:`against_baseline`, :func:`reading_of`)."""

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .provenance import row_note
from .stats import Kind, TTest, bonferroni, paired_t, seeds_needed, simultaneous_confidence, t_power, t_test
from .summary import mean_std
from .values import Record, Value, before_of, by_seed, ev, method_label, ms, of, of_method, slash, v3

LEVEL = 0.05
"""The section's family-wise error rate: every reading of a section is right together with probability at
least ``1 - LEVEL`` (the simultaneous intervals)."""
SAME = 1e-6
"""Two before-training values further apart than this are different episodes."""
EPISODE_FLAGS = ("num-eval-problems", "eval-greedy", "temperature", "top-p", "top-k", "max-source-words")
"""The flags of a record that decide which episodes its evaluation plays (problems, sampling, source texts)."""


@dataclass(frozen=True)
class Comparison:
    """What is measured, method A, method B, the value of a record (A - B over seeds), the primary test
    declared for it and the direction the claim under test gives A - B (+1: A above B; -1: A below B)."""

    what: str
    a: str
    b: str
    value: Value
    test: Kind = "paired"
    claim: int = 1

    def __post_init__(self) -> None:
        if self.test not in ("paired", "welch"):
            raise ValueError(f"{self.a} - {self.b}: the declared test is 'paired' or 'welch', got {self.test!r}")
        if self.claim not in (1, -1):
            raise ValueError(f"{self.a} - {self.b}: the claim is +1 (A above B) or -1 (A below B), got {self.claim}")


def against(baseline: str, others: Sequence[str], what: str = "eval total", value: Value | None = None,
            test: Kind = "paired", claim: int = 1) -> list[Comparison]:
    """``baseline`` against each of ``others`` on one value (default: the eval total after training), each
    with the declared ``test``."""
    return [Comparison(what, baseline, other, value or ev(), test, claim) for other in others]


def premise(a: Sequence[Record], b: Sequence[Record], value: Value) -> str | None:
    """Why rows ``a`` and ``b`` (one method's records each) did not evaluate the same episodes, or None
    when their records show that they did: the same seeds, on each seed the same before-training ``value``
    (an untrained row's one evaluation is its before) and, for rows of the same env, every value of the
    evaluation before training the same; the same episode flags; the same stored ``episodes`` (records
    that store them)."""
    before = before_of(value)
    if before is None:
        return "this value has no before-training measure to show that the rows played the same episodes"
    ra, rb = {r["seed"]: r for r in a}, {r["seed"]: r for r in b}
    if set(ra) != set(rb):
        return f"the rows ran different seeds ({_seeds(ra)} against {_seeds(rb)})"
    differ, flags, stored = [], [], []
    for seed in sorted(ra):
        x, y = ra[seed], rb[seed]
        bx, by = before(x), before(y)
        if not (math.isfinite(bx) and math.isfinite(by) and abs(bx - by) <= SAME):
            differ.append(f"seed {seed}: {v3(bx)} against {v3(by)}")
        elif x.get("env") == y.get("env") and _differ(x.get("eval_before") or {}, y.get("eval_before") or {}):
            key = _differ(x["eval_before"], y["eval_before"])
            differ.append(f"seed {seed}: `{key}` {v3(x['eval_before'][key])} against {v3(y['eval_before'][key])}")
        fx, fy = x.get("flags") or {}, y.get("flags") or {}
        if [k for k in EPISODE_FLAGS if k in fx and k in fy and fx[k] != fy[k]]:
            flags.append(seed)
        if x.get("episodes") and y.get("episodes") and x["episodes"] != y["episodes"]:
            stored.append(seed)
    if differ:
        return f"their before-training values differ ({'; '.join(differ)})"
    if flags:
        return f"their evaluations ran with different episode settings (seeds {_seeds(flags)})"
    if stored:
        return f"their records store different evaluation episodes (seeds {_seeds(stored)})"
    return None


def _differ(x: Record, y: Record) -> str | None:
    """The first key two before-training evaluations of the same env both hold and disagree on (None: none)."""
    return next((k for k in x if k in y and not abs(float(x[k]) - float(y[k])) <= SAME), None)


def _seeds(seeds: object) -> str:
    return ", ".join(str(s) for s in sorted(seeds)) or "none"  # type: ignore[call-overload]


@dataclass(frozen=True)
class Tested:
    """One comparison of a section, tested: A's and B's values by seed, the test used (the declared one,
    or Welch's when a declared pairing's premise fails, ``why``), the test at 95% and at the section's
    simultaneous confidence, the p value adjusted over the section's ``m`` tests, and the reading."""

    comparison: Comparison
    values_a: dict[int, float]
    values_b: dict[int, float]
    used: Kind
    why: str | None
    test: TTest
    simultaneous: TTest
    adjusted_p: float
    m: int

    @property
    def what(self) -> str:
        return self.comparison.what

    @property
    def a(self) -> str:
        return self.comparison.a

    @property
    def b(self) -> str:
        return self.comparison.b

    @property
    def shared(self) -> list[int]:
        return sorted(set(self.values_a) & set(self.values_b))

    @property
    def reading(self) -> str:
        """``holds``, ``reversed`` or ``inconclusive`` from the simultaneous interval; ``no test`` when the
        test is not defined."""
        if not self.simultaneous.defined:
            return "no test"
        claim = self.comparison.claim
        low, high = sorted((claim * self.simultaneous.low, claim * self.simultaneous.high))
        return "holds" if low > 0 else ("reversed" if high < 0 else "inconclusive")


def family_tests(records: Sequence[Record], comparisons: Sequence[Comparison], level: float = LEVEL) -> list[Tested]:
    """Every comparison of a section tested by its declared test (Welch's where a pairing's premise fails),
    and one Bonferroni correction over all of them (a comparison with no test, fewer than two values a side
    or no spread, is not counted in it)."""
    found = []
    for c in comparisons:
        a, b = of_method(records, c.a), of_method(records, c.b)
        ra, rb = by_seed(records, c.a, c.value), by_seed(records, c.b, c.value)
        why = premise(a, b, c.value) if c.test == "paired" and a and b else None
        used: Kind = "welch" if why else c.test
        if used == "paired":
            seeds = sorted(set(ra) & set(rb))
            xs, ys = [ra[s] for s in seeds], [rb[s] for s in seeds]
        else:
            xs, ys = list(ra.values()), list(rb.values())
        found.append((c, ra, rb, used, why, xs, ys, t_test(used, xs, ys)))
    adjusted = bonferroni([f[-1].p for f in found])
    m = sum(1 for f in found if f[-1].defined)
    confidence = simultaneous_confidence(m, level)
    return [Tested(c, ra, rb, used, why, test, t_test(used, xs, ys, confidence), p, m)
            for (c, ra, rb, used, why, xs, ys, test), p in zip(found, adjusted)]


def _p(p: float) -> str:
    return "—" if math.isnan(p) else (f"{p:.3g}" if p >= 0.001 else "<0.001")


def _interval(test: TTest) -> str:
    return "—" if not test.defined else f"[{v3(test.low)}, {v3(test.high)}]"


def _confidence(tested: Sequence[Tested]) -> str:
    return f"{tested[0].simultaneous.confidence * 100:.4g}%" if tested else "—"


def claim_of(records: Sequence[Record], c: Comparison) -> str:
    return f"{method_label(records, c.a)} {'above' if c.claim > 0 else 'below'} {method_label(records, c.b)}"


def significance_table(records: Sequence[Record], comparisons: Sequence[Comparison]) -> list[str]:
    """Markdown: per comparison the claim, the declared test and the one used, the mean difference A - B with
    its 95% interval and its simultaneous interval over the table's tests, t, p and the adjusted p, and the
    reading; below it, why a declared pairing was not used."""
    tested = family_tests(records, comparisons)
    m = tested[0].m if tested else 0
    lines = [f"Tests (two-sided; each comparison's test declared in its definition, a paired one only on rows whose "
             f"records show the same episodes; one Bonferroni correction over the {m} tests of this table: each "
             f"reading is read from the simultaneous interval, each at {_confidence(tested)}, so that all of them "
             f"cover together at 95%; n < 2 a side, or no spread: no test):", "",
             "| measure | claim (A - B) | test: declared -> used | A - B, 95% interval | simultaneous interval | "
             "t (df), p, adjusted p | reading | seeds |",
             "|---|---|---|---|---|---|---|---|"]
    for t in tested:
        used = t.used if t.used == t.comparison.test else f"**{t.used}** (see below)"
        stat = "—" if not t.test.defined else \
            f"{t.test.t:.2f} ({t.test.df:.1f}), {_p(t.test.p)}, {_p(t.adjusted_p)}"
        lines.append(f"| {t.what} | {claim_of(records, t.comparison)} | {t.comparison.test} -> {used} | "
                     f"{v3(t.test.difference)} {_interval(t.test)} | {_interval(t.simultaneous)} | {stat} | "
                     f"**{t.reading}** | {len(t.values_a)} + {len(t.values_b)} |")
    unpaired = [t for t in tested if t.why]
    if unpaired:
        lines += ["", "Declared paired, tested by Welch's test because the premise of pairing fails:"]
        lines += [f"- {method_label(records, t.a)} - {method_label(records, t.b)} ({t.what}): {t.why}."
                  for t in unpaired]
    return lines


def untested(t: Tested) -> str:
    """Why a comparison has no test: a side with no record or fewer than two seeds, or no spread."""
    a, b = list(t.values_a.values()), list(t.values_b.values())
    if not (a and b):
        return "no test yet (no record on one side)"
    if len({*a, *b}) == 1:
        return f"no test at this size (every value is {v3(a[0])} on both sides)"
    if min(len(a), len(b)) < 2:
        return f"no test yet ({len(a)} + {len(b)} seeds: a test needs two a side)"
    return "no test (no spread within the sides)"


def reading_of(t: Tested) -> str:
    """The sentence of one comparison's reading: the test used (and why, when a declared pairing's premise
    failed), the difference with its intervals, p and adjusted p, and holds / reversed / inconclusive.

    >>> from .stats import t_test
    >>> c = Comparison("x", "a", "b", lambda r: 0.0, "welch")
    >>> one = t_test("welch", [2.0], [1.0, 1.5])
    >>> reading_of(Tested(c, {0: 2.0}, {0: 1.0, 1: 1.5}, "welch", None, one, one, math.nan, 0))
    'no test yet (1 + 2 seeds: a test needs two a side)'
    """
    if not t.test.defined:
        return untested(t)
    test = "paired" if t.used == "paired" else "Welch"
    why = f" (declared paired; not paired: {t.why})" if t.why else ""
    return (f"{test} test{why}: A - B {v3(t.test.difference)}, 95% interval {_interval(t.test)}, simultaneous "
            f"interval over the section's {t.m} tests {_interval(t.simultaneous)}; p {_p(t.test.p)}, adjusted "
            f"{_p(t.adjusted_p)}: **{t.reading}**")


def caveats(records: Sequence[Record], t: "Tested", notes: Mapping[str, str] | None = None) -> str:
    """What a comparison's reading rests on that the numbers do not show, for each of its two rows: the
    ``notes`` given for the row (a learning rate at an edge of its grid) and, from the records, the machines
    and uncommitted trees its seeds ran on (:func:`provenance.row_note`); "" when there is none."""
    parts = []
    for name in dict.fromkeys((t.a, t.b)):
        said = [x for x in ((notes or {}).get(name), row_note(of_method(records, name))) if x]
        if said:
            parts.append(f"{method_label(records, name)}: {'; '.join(said)}")
    unlike = unlike_rows(of_method(records, t.a), of_method(records, t.b))
    if unlike:
        parts.append(f"The two rows differ in more than the method: {unlike}")
    return f" Resting on: {'. '.join(parts)}." if parts else ""


UNLIKE_COMPUTE = 1.5
"""Rows whose mean CPU seconds differ by more than this factor are named as unlike in compute."""


def unlike_rows(a: Sequence[Record], b: Sequence[Record]) -> str | None:
    """What besides the method differs between two trained rows, from their records: the learning rates they
    trained at and the CPU seconds they took (a factor over :data:`UNLIKE_COMPUTE`); None when neither differs.

    >>> a = [{"flags": {"learning-rate": 1e-3}, "cpu_s": 6000.0, "curve": [1]},
    ...      {"flags": {"learning-rate": 1e-3}, "cpu_s": 5000.0, "curve": [1]}]
    >>> b = [{"flags": {"learning-rate": 3e-4}, "cpu_s": 1500.0, "curve": [1]}]
    >>> print(unlike_rows(a, b))
    learning rate 0.001 against 0.0003; 3.7x the CPU seconds (5500 against 1500 a seed)
    >>> unlike_rows(a, a) is None
    True
    """
    def rates(rows: Sequence[Record]) -> list:
        return sorted({(r.get("flags") or {}).get("learning-rate") for r in rows} - {None})

    parts = []
    ra, rb = rates(a), rates(b)
    if ra and rb and ra != rb:
        parts.append(f"learning rate {'/'.join(f'{x:g}' for x in ra)} against {'/'.join(f'{x:g}' for x in rb)}")
    ca = [r["cpu_s"] for r in a if r.get("cpu_s")]
    cb = [r["cpu_s"] for r in b if r.get("cpu_s")]
    trained = all(r.get("curve") for r in (*a, *b))  # an untrained row only evaluates: its compute says nothing
    if ca and cb and trained:
        ma, mb = sum(ca) / len(ca), sum(cb) / len(cb)
        factor = max(ma, mb) / min(ma, mb)
        if factor > UNLIKE_COMPUTE:
            parts.append(f"{ma / mb:.1f}x the CPU seconds ({ma:.0f} against {mb:.0f} a seed)")
    return "; ".join(parts) or None


def against_baseline(records: Sequence[Record], comparisons: Sequence[Comparison],
                     notes: Mapping[str, str] | None = None) -> list[str]:
    """The reading any section of comparisons can have (``SECTION_TESTS``): per comparison the claim, both
    means, seed by seed where the rows are paired, the reading of :func:`reading_of` and what it rests on
    (:func:`caveats`, with ``notes``: method -> what its reading must say, e.g. its rate at a grid's edge)."""
    out = []
    for t in family_tests(records, comparisons):
        if not (t.values_a and t.values_b):
            continue
        seeds = ""
        if t.used == "paired":
            ahead = sum(1 for seed in t.shared if t.values_a[seed] > t.values_b[seed])
            seeds = (f"; above it on {of(ahead, len(t.shared))} paired seeds (A - B: "
                     f"{slash(t.values_a[seed] - t.values_b[seed] for seed in t.shared)})")
        out.append(f"- **{claim_of(records, t.comparison)}** ({t.what}): {ms(list(t.values_a.values()))} against "
                   f"{ms(list(t.values_b.values()))}{seeds}; {reading_of(t)}.{caveats(records, t, notes)}")
    return out


# ------------------------------------------------------------------------------------------ training effects
@dataclass(frozen=True)
class Effect:
    """One trained row's change on one measure: after minus before training on the same evaluation (the
    same problems and sampling seed), paired over its seeds, at 95% and at the table's simultaneous
    confidence (one Bonferroni correction over the table's effects), with the Bonferroni-adjusted p."""

    name: str
    what: str
    before: dict[int, float]
    after: dict[int, float]
    test: TTest
    simultaneous: TTest
    adjusted_p: float
    m: int

    @property
    def reading(self) -> str:
        """``up`` / ``down`` (the simultaneous interval wholly above / below 0), ``inconclusive`` (it covers 0)
        or ``no test`` (fewer than two seeds, or the same change on every seed)."""
        if not self.simultaneous.defined:
            return "no test"
        return "up" if self.simultaneous.low > 0 else ("down" if self.simultaneous.high < 0 else "inconclusive")


def training_effects(records: Sequence[Record], measures: Sequence[tuple[str, Value]],
                     level: float = LEVEL) -> list[Effect]:
    """Every trained row (a method whose records trained: learner not ``eval``) on each of ``measures``
    (what, value: an ``ev`` value, whose before-training counterpart is the same evaluation before): after
    minus before over its seeds by the paired t-test (the same episodes before and after, by
    construction of the run), and one Bonferroni correction over all of them. A measure a row does not
    have (non-finite on every seed) is left out."""
    found = []
    for what, value in measures:
        before_value = before_of(value)
        if before_value is None:
            raise ValueError(f"{what}: a training effect needs a value with a before-training measure")
        for name in dict.fromkeys(r["method"] for r in records):
            mine = [r for r in of_method(records, name) if r.get("learner") != "eval"]
            if not mine:
                continue
            before = {r["seed"]: before_value(r) for r in mine}
            after = {r["seed"]: value(r) for r in mine}
            if not any(math.isfinite(x) for x in (*before.values(), *after.values())):
                continue
            seeds = sorted(before)
            found.append((name, what, before, after, [after[s] for s in seeds], [before[s] for s in seeds]))
    tests = [paired_t(a, b) for *_, a, b in found]
    adjusted = bonferroni([t.p for t in tests])
    m = sum(1 for t in tests if t.defined)
    confidence = simultaneous_confidence(m, level)
    return [Effect(name, what, before, after, test, paired_t(a, b, confidence), p, m)
            for (name, what, before, after, a, b), test, p in zip(found, tests, adjusted)]


def effect_of(e: Effect) -> str:
    """``after - before d, 95% interval [lo, hi], simultaneous [lo, hi]: up`` (or why there is no test)."""
    if not e.test.defined:
        changes = {round(e.after[s] - e.before[s], 12) for s in e.before}
        if len(e.before) >= 2 and len(changes) == 1:
            return f"after - before {v3(e.test.difference)} on every seed: no spread, no test"
        return f"after - before {v3(e.test.difference)} ({len(e.before)} seeds: a test needs two)"
    return (f"after - before {v3(e.test.difference)}, 95% interval {_interval(e.test)}, simultaneous interval "
            f"{_interval(e.simultaneous)}: **{e.reading}**")


def effects_table(records: Sequence[Record], measures: Sequence[tuple[str, Value]]) -> list[str]:
    """Markdown: each trained row's after minus before on the same evaluation (:func:`training_effects`),
    beside the comparisons between rows."""
    effects = training_effects(records, measures)
    if not effects:
        return []
    m = effects[0].m
    confidence = f"{effects[0].simultaneous.confidence * 100:.4g}%"
    lines = [f"Training effects (each trained row against itself before training, on the same evaluation: after - "
             f"before, paired over its seeds; one Bonferroni correction over the {m} effects of this table, each "
             f"simultaneous interval at {confidence}; up / down: wholly above / below 0; inconclusive: it covers 0):",
             "", "| row | measure | before | after | after - before, 95% interval | simultaneous interval | "
             "p, adjusted p | reading | seeds |", "|---|---|---|---|---|---|---|---|---|"]
    for e in effects:
        stat = "—" if not e.test.defined else f"{_p(e.test.p)}, {_p(e.adjusted_p)}"
        lines.append(f"| {method_label(records, e.name)} | {e.what} | {ms(list(e.before.values()))} | "
                     f"{ms(list(e.after.values()))} | {v3(e.test.difference)} {_interval(e.test)} | "
                     f"{_interval(e.simultaneous)} | {stat} | **{e.reading}** | {len(e.before)} |")
    return lines


# ------------------------------------------------------------------------------------------ power
POWER = 0.8
"""The power a budget is sized for (the usual 80%)."""


def budget(t: Tested, effects: Sequence[float], level: float = LEVEL) -> list[tuple[float, float, int | None]]:
    """For one tested comparison, from its observed spread (the paired differences' sample std, or the
    two rows' pooled one for Welch's test) at the section's Bonferroni level ``level / m``: for each
    plausible ``effects`` size, the power its seeds have now (the smaller side) and the seeds a side its
    test would need for :data:`POWER` (:func:`stats.seeds_needed`; None: beyond reach)."""
    if t.used == "paired":
        d = [t.values_a[s] - t.values_b[s] for s in t.shared]
        sd, n = mean_std(d).std, len(d)
    else:
        a, b = mean_std(list(t.values_a.values())), mean_std(list(t.values_b.values()))
        sd, n = math.sqrt((a.std ** 2 + b.std ** 2) / 2.0), min(a.n, b.n)
    alpha = level / max(t.m, 1)
    return [(x, t_power(t.used, x, sd, n, alpha), seeds_needed(t.used, x, sd, alpha, POWER)) for x in effects]
