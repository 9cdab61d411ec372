"""The rules docs/results.md's readings follow (bench/resultskit/significance.py), each exercised with records
built to break it: a declared pairing whose rows differ before training gets no paired p value; one test per
comparison, declared before the numbers; one correction over a whole section; every reading holds, reversed
or inconclusive from the simultaneous interval."""

from __future__ import annotations

import importlib
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def sig():
    sys.path.insert(0, str(ROOT / "bench"))
    return importlib.import_module("resultskit.significance")


def runs(name: str, after: list[float], before: list[float] | None = None, **fields) -> list[dict]:
    """One method's records, seed i scoring ``after[i]`` (``before[i]`` before training; default 1.0)."""
    before = before or [1.0] * len(after)
    return [{"comparison": "x", "method": name, "label": name, "seed": seed, "learner": "magrpo", "env": "e",
             "flags": {"num-eval-problems": 32, "temperature": 0.7}, "eval": {"total": a},
             "eval_before": {"total": b}, **fields} for seed, (a, b) in enumerate(zip(after, before))]


def test_rows_that_differ_before_training_get_no_paired_p(sig) -> None:
    team, other = [2.0, 2.5, 3.0], [1.0, 1.4, 2.1]
    same = runs("team", team) + runs("b", other)
    (paired,) = sig.family_tests(same, sig.against("team", ["b"], test="paired"))
    assert paired.used == "paired" and paired.test.kind == "paired" and paired.why is None
    # Seed 1 of B started elsewhere (another commit's sampler, another machine): the pairing's premise fails.
    moved = runs("team", team) + runs("b", other, before=[1.0, 1.2, 1.0])
    (t,) = sig.family_tests(moved, sig.against("team", ["b"], test="paired"))
    assert t.used == "welch" and t.test.kind == "welch" and t.simultaneous.kind == "welch"
    assert t.why == "their before-training values differ (seed 1: 1.000 against 1.200)"
    assert t.test.p == pytest.approx(sig.t_test("welch", team, other).p)  # no paired p anywhere
    table = "\n".join(sig.significance_table(moved, sig.against("team", ["b"], test="paired")))
    assert "| paired -> **welch** (see below) |" in table and "seed 1: 1.000 against 1.200" in table
    text = "\n".join(sig.against_baseline(moved, sig.against("team", ["b"], test="paired")))
    assert "Welch test (declared paired; not paired: their before-training values differ" in text
    assert "paired seeds" not in text  # no seed-by-seed reading of rows that are not paired


@pytest.mark.parametrize(("change", "why"), [
    ({"seeds": [0, 1]}, "the rows ran different seeds (0, 1, 2 against 0, 1)"),
    ({"flags": {"num-eval-problems": 16, "temperature": 0.7}}, "different episode settings (seeds 0, 1, 2)"),
    ({"episodes": "other"}, "store different evaluation episodes (seeds 0, 1, 2)"),
    ({"component": True}, "their before-training values differ (seed 0: `length` 0.500 against 0.400"),
])
def test_every_stored_sign_of_other_episodes_breaks_the_pairing(sig, change: dict, why: str) -> None:
    a = runs("team", [2.0, 2.5, 3.0], episodes="mine")
    b = runs("b", [1.0, 1.4, 2.1], episodes="mine")
    for r in a:
        r["eval_before"]["length"] = 0.5
    for r in b:
        r["eval_before"]["length"] = 0.4 if change.get("component") else 0.5
        if "flags" in change:
            r["flags"] = change["flags"]
        if "episodes" in change:
            r["episodes"] = change["episodes"]
    if "seeds" in change:
        b = [r for r in b if r["seed"] in change["seeds"]]
    (t,) = sig.family_tests(a + b, sig.against("team", ["b"], test="paired"))
    assert t.used == "welch" and why in t.why


def test_a_value_with_no_before_measure_is_never_paired(sig) -> None:
    records = runs("team", [2.0, 2.5, 3.0]) + runs("b", [1.0, 1.4, 2.1])
    curve = sig.Comparison("a curve's last value", "team", "b", lambda r: r["eval"]["total"], "paired")
    (t,) = sig.family_tests(records, [curve])
    assert t.used == "welch" and "no before-training measure" in t.why


def test_one_declared_test_per_comparison(sig) -> None:
    with pytest.raises(ValueError, match="declared test is 'paired' or 'welch', got 'either'"):
        sig.Comparison("x", "a", "b", lambda r: 0.0, "either")
    with pytest.raises(ValueError, match="claim is"):
        sig.Comparison("x", "a", "b", lambda r: 0.0, "welch", 0)
    # A declared Welch comparison stays Welch even where a paired test would find more.
    records = runs("team", [2.0, 2.5, 3.0]) + runs("b", [1.0, 1.4, 2.1])
    (t,) = sig.family_tests(records, sig.against("team", ["b"], test="welch"))
    assert t.used == "welch" and t.why is None
    assert not hasattr(t, "paired") and not hasattr(t, "welch")  # one test, no second to fall back on


def test_readings_holds_reversed_inconclusive(sig) -> None:
    records = (runs("team", [2.0, 2.1, 2.2]) + runs("up", [1.0, 1.1, 1.15]) + runs("down", [3.0, 3.1, 3.25])
               + runs("near", [1.5, 2.6, 2.0]))
    tested = {t.b: t for t in sig.family_tests(records, sig.against("team", ["up", "down", "near"], test="welch"))}
    assert tested["up"].reading == "holds" and tested["up"].simultaneous.low > 0
    assert tested["down"].reading == "reversed" and tested["down"].simultaneous.high < 0
    near = tested["near"]  # its interval covers 0: not "does not hold", inconclusive
    assert near.simultaneous.low < 0 < near.simultaneous.high and near.reading == "inconclusive"
    # A claim of A below B (a KL): the same interval reads the other way.
    (kl,) = sig.family_tests(records, sig.against("team", ["down"], test="welch", claim=-1))
    assert kl.reading == "holds"
    text = "\n".join(sig.against_baseline(records, sig.against("team", ["up", "down", "near"], test="welch")))
    assert text.count("**holds**") == 1 and text.count("**reversed**") == 1 and text.count("**inconclusive**") == 1
    # Too few seeds: no test, and no reading either way.
    (one,) = sig.family_tests(records + runs("single", [0.5]), sig.against("team", ["single"], test="welch"))
    assert one.reading == "no test" and sig.reading_of(one) == "no test yet (3 + 1 seeds: a test needs two a side)"


def test_the_correction_runs_over_the_whole_section(sig) -> None:
    """A comparison that holds alone becomes inconclusive in a section of five: its adjusted p is five times
    its p and its interval widens to the section's simultaneous confidence; every test of the section
    counts, paired and Welch alike, and a comparison with no test does not."""
    records = runs("team", [2.0, 2.5, 3.0]) + runs("b", [1.3, 1.6, 2.4])
    (alone,) = sig.family_tests(records, sig.against("team", ["b"], test="paired"))
    assert alone.m == 1 and alone.reading == "holds" and alone.adjusted_p == pytest.approx(alone.test.p)
    others = [runs(n, [1.0 + i / 10, 1.4, 2.0]) for i, n in enumerate(("c", "d", "e", "f"))]
    section = [*sig.against("team", ["b", "c", "d"], test="paired"),
               *sig.against("team", ["e", "f", "g"], test="welch")]
    tested = sig.family_tests(records + [r for rs in others for r in rs], section)
    first = tested[0]
    assert [t.m for t in tested] == [5] * 6 and math.isnan(tested[-1].test.p)  # g has no record: not counted
    assert first.test.p == pytest.approx(alone.test.p) and first.adjusted_p == pytest.approx(5 * alone.test.p)
    assert first.simultaneous.confidence == pytest.approx(0.99) and first.reading == "inconclusive"
    assert {t.used for t in tested[:5]} == {"paired", "welch"}
    table = "\n".join(sig.significance_table(records + [r for rs in others for r in rs], section))
    assert "one Bonferroni correction over the 5 tests of this table" in table and "each at 99%" in table


def test_the_pages_paired_tests_pair_only_rows_that_share_their_episodes(sig) -> None:
    """On docs/results.md's own records: every comparison tested as paired has the same before-training
    value on every seed, and the pairings the issue found broken (section 3's MADPO, section 5's untrained
    pair) are tested by Welch's test with the reason."""
    reading = importlib.import_module("resultskit.reading")
    records = importlib.import_module("resultskit.records")
    comparisons = importlib.import_module("resultskit.comparisons")
    values = importlib.import_module("resultskit.values")
    for section, tests in reading.SECTION_TESTS.items():
        mine = records.load_records(comparisons.RECORDS, section)
        for t in sig.family_tests(mine, tests):
            if t.used == "paired":
                before = values.before_of(t.comparison.value)
                for seed in t.shared:
                    pair = [before(r) for r in mine if r["seed"] == seed and r["method"] in (t.a, t.b)]
                    assert len(pair) == 2 and pair[0] == pytest.approx(pair[1], abs=1e-6), (section, t.a, t.b, seed)
    preference = sig.family_tests(records.load_records(comparisons.RECORDS, "preference"),
                                  reading.SECTION_TESTS["preference"])
    madpo = next(t for t in preference if t.b == "madpo")
    assert madpo.comparison.test == "paired" and madpo.used == "welch" and "seed 0" in madpo.why
    coding = sig.family_tests(records.load_records(comparisons.RECORDS, "coding"), reading.SECTION_TESTS["coding"])
    assert all(t.used == "welch" for t in coding if t.b == "untrained-parallel")
