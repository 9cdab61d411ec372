"""The rules of docs/results.md's readings added for issue #62 items 3-7, each exercised with records built to
break it: a trained row's change against itself (after - before, paired over its seeds); CORY read by role
(swapped roles in the window measured; the no-swap ablation like with like); a learning rate at an edge of its
grid; a reading resting on an uncommitted tree or on several machines; README's provenance counts; the budget a
claim would need (power from the observed spread)."""

from __future__ import annotations

import importlib
import json
import math
import sys
from pathlib import Path

import pytest
from scipy import stats

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def kit():
    sys.path.insert(0, str(ROOT / "bench"))
    names = ("significance", "reading", "records", "comparisons", "provenance", "page", "stats")
    return type("Kit", (), {n: importlib.import_module(f"resultskit.{n}") for n in names})


def runs(name: str, after: list[float], before: list[float], learner: str = "magrpo", **fields) -> list[dict]:
    return [{"comparison": "x", "method": name, "label": name, "seed": seed, "learner": learner, "env": "e",
             "commit": "c0ffee", "flags": {}, "eval": {"total": a}, "eval_before": {"total": b}, **fields}
            for seed, (a, b) in enumerate(zip(after, before))]


# ------------------------------------------------------------------------------------------ item 3
def test_every_trained_row_shows_its_change_against_itself(kit) -> None:
    sig = kit.significance
    records = (runs("up", [2.0, 2.2, 2.5], [1.0, 1.1, 1.2]) + runs("flat", [1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
               + runs("noisy", [1.5, 0.2, 1.3], [1.0, 1.1, 1.2]) + runs("untrained", [1.0, 1.1], [1.0, 1.1], "eval"))
    effects = {e.name: e for e in sig.training_effects(records, [("eval total", sig.ev())])}
    assert set(effects) == {"up", "flat", "noisy"}  # an untrained row has no training to show
    up = effects["up"]
    scipy = stats.ttest_rel([2.0, 2.2, 2.5], [1.0, 1.1, 1.2])
    interval = scipy.confidence_interval(0.95)
    assert up.test.difference == pytest.approx(1.1333333) and up.test.p == pytest.approx(scipy.pvalue)
    assert (up.test.low, up.test.high) == pytest.approx((interval.low, interval.high))
    assert up.m == 2 and up.adjusted_p == pytest.approx(2 * scipy.pvalue)  # flat has no test: not counted
    assert up.simultaneous.confidence == pytest.approx(0.975) and up.reading == "up"
    assert effects["noisy"].reading == "inconclusive" and effects["flat"].reading == "no test"
    assert sig.effect_of(effects["flat"]) == "after - before 0.000 on every seed: no spread, no test"
    table = "\n".join(sig.effects_table(records, [("eval total", sig.ev())]))
    assert "one Bonferroni correction over the 2 effects" in table and "| up | eval total |" in table
    assert "| **up** | 3 |" in table and "untrained" not in table.split("\n", 4)[-1]


def test_the_page_shows_each_sections_training_effects(kit) -> None:
    """Section 5's MAGRPO pair: pass@1 went nowhere (after - before 0 on the mean), shown beside the tests."""
    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert page.count("Training effects (each trained row against itself") == 5
    coding = page[page.index("<!-- results:coding:begin"):page.index("<!-- results:coding:end")]
    assert "| MAGRPO pair, one turn | eval pass@1 | 0.073 ± 0.036 (n=3) | 0.073 ± 0.018 (n=3) | 0.000 " in coding


# ------------------------------------------------------------------------------------------ item 4
def cory_record(method: str, seed: int, swap: int, values: dict[str, list[float]], roles: bool = True) -> dict:
    """A CORY record of ``len(values['model_0'])`` iterations whose models swap every ``swap`` (0: never)."""
    n = len(values["model_0"])
    curve: dict[str, list[float]] = {"iteration": [float(i + 1) for i in range(n)]}
    for model, series in values.items():
        for key in ("task_reward", "kl", "combined"):
            curve[f"agent_{model}/{key}"] = list(series)
        if roles:
            first = 0 if model == "model_0" else 1
            curve[f"agent_{model}/role"] = [float(first ^ (swap > 0 and (i // swap) % 2 == 1)) for i in range(n)]
    return {"comparison": "cory", "method": method, "label": method, "seed": seed, "learner": "cory", "env": "e",
            "flags": {"swap-every": swap}, "curve": curve, "eval": {}, "eval_before": {}}


def test_cory_is_read_by_the_role_each_model_held(kit) -> None:
    reading = kit.reading
    # 10 iterations, swap every 5: in the last 5 (the window) model_0 is the observer, model_1 the pioneer.
    swapped = cory_record("cory", 0, 5, {"model_0": [9.0] * 10, "model_1": [1.0] * 10})
    assert reading.role_window(swapped, "pioneer") == ["model_1"] * 5
    assert reading.role_final("pioneer", "kl")(swapped) == 1.0 and reading.role_final("observer", "kl")(swapped) == 9.0
    assert reading.holders([swapped], "pioneer") == "`model_1` on seed 0"
    # A swap inside the window: each iteration's pioneer is whoever held the role then.
    inside = cory_record("cory", 1, 3, {"model_0": [float(i) for i in range(8)],
                                        "model_1": [10.0 + i for i in range(8)]})
    # iterations 4-8 (0-based 3-7): 3-5 swapped (model_1 pioneer), 6-7 not (model_0 pioneer)
    assert reading.role_window(inside, "pioneer") == ["model_1", "model_1", "model_1", "model_0", "model_0"]
    assert reading.role_final("pioneer", "kl")(inside) == pytest.approx((13 + 14 + 15 + 6 + 7) / 5)
    assert reading.holders([inside], "pioneer") == "`model_1` then `model_0` on seed 1"
    # A record that did not log the roles: the swap schedule of its flags says the same.
    unlogged = cory_record("cory", 0, 5, {"model_0": [9.0] * 10, "model_1": [1.0] * 10}, roles=False)
    assert reading.role_final("pioneer", "kl")(unlogged) == 1.0
    # PPO's one agent is what each role is compared with.
    ppo = {"learner": "ppo", "curve": {f"agent_agent/{k}": [2.0] * 10 for k in ("task_reward", "kl", "combined")}}
    assert reading.role_final("pioneer", "kl")(ppo) == reading.role_final("observer", "kl")(ppo) == 2.0
    measures = [c.what for c in reading.CORY_TESTS]
    assert any("CORY's pioneer" in w for w in measures) and any("CORY's observer" in w for w in measures)
    assert not any("model_" in w for w in measures)


def test_the_no_swap_ablation_compares_like_with_like(kit) -> None:
    """CORY's seed 0 ends with the roles swapped (model_1 the pioneer); the no-swap run's pioneer is model_0
    throughout: the ablation's pioneer is set against CORY's pioneer, whatever the models' names."""
    reading = kit.reading

    def with_evals(r: dict) -> dict:
        return {**r, "eval": {"total": 1.0, "sentiment_pioneer": 0.5, "sentiment_observer": 0.5},
                "eval_before": {"total": 0.4, "sentiment_pioneer": 0.2, "sentiment_observer": 0.2}, "cpu_s": 1.0}

    cory = [with_evals(cory_record("cory", s, 5, {"model_0": [0.9] * 10, "model_1": [0.1] * 10})) for s in (0, 1)]
    ppo = [with_evals({"comparison": "cory", "method": "ppo", "label": "PPO", "seed": s, "learner": "ppo",
                       "flags": {"batch-size": 32, "kl-horizon": 10000, "num-iterations": 10},
                       "curve": {f"agent_agent/{k}": [0.5] * 10 for k in ("task_reward", "kl", "combined", "kl_coef")}})
           for s in (0, 1)]
    no_swap = with_evals(cory_record("cory-no-swap", 0, 0, {"model_0": [0.3] * 10, "model_1": [0.7] * 10}))
    text = "\n".join(reading.reading_cory(cory + ppo + [no_swap]))
    line = next(x for x in text.splitlines() if x.startswith("- **Without role exchange"))
    assert "this run's pioneer `model_0` on seed 0, CORY's `model_1` on seed 0" in line
    assert "training task reward 0.300 / 0.700 against 0.100 / 0.900" in line  # pioneer / observer, both runs
    assert "CORY's pioneer 0.100" in text and "its observer 0.900" in text


# ------------------------------------------------------------------------------------------ item 5
def write_sweep(out: Path, name: str, totals: list[float]) -> None:
    rates = __import__("resultskit.comparisons", fromlist=["x"]).CODING_SWEEP_RATES[name]
    for rate, total in zip(rates, totals):
        path = out / "coding-sweep" / f"{name}@lr{rate:g}__s0.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"method": f"{name}@lr{rate:g}", "seed": 0, "validation": {"total": total},
                                    "eval": {"total": 1.0}, "eval_before": {"total": 1.0}}))


@pytest.mark.parametrize(("totals", "edge"), [([3.0, 2.0, 1.0], "lower"), ([1.0, 2.0, 3.0], "upper"),
                                              ([1.0, 3.0, 2.0], None)])
def test_a_rate_chosen_at_an_edge_of_its_grid_says_the_best_may_lie_beyond(kit, tmp_path, totals, edge) -> None:
    records, reading = kit.records, kit.reading
    write_sweep(tmp_path, "single", totals)
    assert records.grid_edge(tmp_path, "single", "coding") == edge
    note = records.edge_note(tmp_path, "single", "coding")
    if edge is None:
        assert note is None
        return
    rate = kit.comparisons.CODING_SWEEP_RATES["single"][0 if edge == "lower" else -1]
    assert note.startswith(f"its rate {rate:g} is at the {edge} edge of its grid")
    assert note.endswith("the best rate may lie beyond it")
    # The same rule for every method: the sweep table and the section's reading both carry it.
    sweep = kit.page.sweep_table({}, tmp_path, "coding")
    assert any(f"at the {edge} edge of its grid" in line for line in sweep)
    text = "\n".join(reading.reading_coding([], records.load_records(tmp_path, "coding-sweep"), tmp_path))
    assert f"at the {edge} edge of its grid (" in text and "the best rate may lie beyond it" in text


def test_every_method_at_an_edge_of_its_grid_on_the_page(kit) -> None:
    records, comparisons = kit.records, kit.comparisons
    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    edges = [(c, name) for c, (_, grids) in comparisons.SWEEPS.items() for name in grids
             if records.grid_edge(comparisons.RECORDS, name, c)]
    assert ("methods", "marlhf") in edges and ("coding", "magrpo") in edges and ("coding", "single") in edges
    assert ("methods", "madpo-iterative") not in edges  # its grid was extended above its first top
    for comparison, name in edges:
        note = records.edge_note(comparisons.RECORDS, name, comparison)
        assert page.count(note) >= 2, (comparison, name)  # the sweep's reading and each comparison resting on it


# ------------------------------------------------------------------------------------------ item 6
def test_a_reading_names_the_uncommitted_tree_and_the_machines_it_rests_on(kit) -> None:
    sig = kit.significance
    epyc, xeon = {"cpu": "AMD EPYC"}, {"cpu": "Intel Xeon"}
    clean = runs("team", [2.0, 2.1, 2.2], [1.0] * 3, machine=epyc) + runs("b", [1.0, 1.1, 1.15], [1.0] * 3,
                                                                           machine=epyc)
    text = "\n".join(sig.against_baseline(clean, sig.against("team", ["b"], test="paired")))
    assert "Resting on" not in text  # one named machine, committed code: nothing to name
    dirty = [dict(r) for r in clean]
    dirty[4]["commit"] = "4f3d202d0000+dirty"  # b's seed 1 from an uncommitted tree ...
    dirty[5]["machine"] = xeon  # ... and b's seed 2 from another machine
    dirty[3].pop("machine")  # ... and b's seed 0 from one its record does not name
    text = "\n".join(sig.against_baseline(dirty, sig.against("team", ["b"], test="paired")))
    assert ("Resting on: b: seeds ran on 3 machines: AMD EPYC (seed 1), Intel Xeon (seed 2), a machine its record "
            "does not name (seed 0); seeds ran at 2 commits: c0ffee (seeds 0, 2), 4f3d202 (seed 1); seed 1 on an "
            "uncommitted tree (4f3d202d+dirty, its diff not kept).") in text
    notes = {"team": "its rate 1 is at the lower edge of its grid (1, 2): the best rate may lie beyond it"}
    text = "\n".join(sig.against_baseline(clean, sig.against("team", ["b"], test="paired"), notes))
    assert "Resting on: team: its rate 1 is at the lower edge" in text


def test_the_provenance_counts_are_the_records_and_readme_says_them(kit, tmp_path) -> None:
    provenance, page = kit.provenance, kit.page
    named = {"cpu": "AMD EPYC", "isa": ["avx2"], "dtype": "bfloat16", "threads": 1}
    records = [{"comparison": "x", "method": "a", "seed": 0, "commit": "c", "machine": named, "cpu_s": 1.0},
               {"comparison": "x", "method": "a", "seed": 1, "commit": "c+dirty", "cpu_s": None},
               {"comparison": "x", "method": "a", "seed": 2, "commit": "c", "machine": named, "cpu_s": 2.0,
                "copied_from": "x/a__s0.json"}]  # the same run as seed 0: counted once
    counts = provenance.record_counts(records)
    assert counts["runs"] == 2 and counts["no_machine"] == 1 and counts["no_cpu_s"] == 1 and counts["dirty"] == 1
    text = provenance.provenance_counts(records)
    assert "1 of the 2 name the CPU and its ISA" in text and "1 of the 2 name their CPU seconds" in text
    assert "1 ran on a tree with uncommitted changes (0 keep the diff)" in text
    # README's sentence is rendered from docs/results/ and is what the records say.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    body = readme.split(page.MARKER.format(name="provenance", end="begin"))[1].split(
        page.MARKER.format(name="provenance", end="end"))[0]
    assert body.strip() == page.readme_text(kit.comparisons.RECORDS)
    assert "name, per record, the CPU, its ISA, the dtype, the threads and the" not in readme
    every = [r for c in kit.comparisons.COMPARISONS for r in kit.records.load_records(kit.comparisons.RECORDS, c)]
    c = provenance.record_counts(every)
    assert f"{c['runs'] - c['no_machine']} of the {c['runs']} name the CPU" in body and c["no_machine"] > 0


def test_the_pages_prose_claims_no_learner_it_does_not_show(kit) -> None:
    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert "every learner of the suite is in the table" not in page.replace("\n", " ")
    assert "two agents trained together beat the untrained pair" not in page.replace("\n", " ")


# ------------------------------------------------------------------------------------------ item 7
def test_the_budget_a_claim_would_need_comes_from_the_observed_spread(kit) -> None:
    sig, st = kit.significance, kit.stats
    records = runs("a", [0.10, 0.12, 0.14], [0.1] * 3) + runs("b", [0.08, 0.10, 0.12], [0.2] * 3)
    (t,) = sig.family_tests(records, sig.against("a", ["b"], test="welch"))
    rows = sig.budget(t, [0.02, 0.1])
    (small, now_small, need_small), (big, now_big, need_big) = rows
    # sd 0.02 on both sides: an effect of one sd needs 17 seeds a side at 5% (two-sample t, 80% power) ...
    assert need_small == st.seeds_needed("welch", 0.02, 0.02, 0.05) == 17 and now_small < sig.POWER
    assert need_big <= 3 and now_big > sig.POWER  # ... and five sd is in reach of three
    assert st.t_power("welch", 0.02, 0.02, 17) >= 0.8 > st.t_power("welch", 0.02, 0.02, 16)
    assert math.isnan(st.t_power("welch", 0.02, 0.0, 3)) and st.seeds_needed("welch", 0.02, 0.0) is None
    # A far tail scipy answers NaN for is a power of 1, not NaN.
    assert st.t_power("welch", 0.125, 0.018042, 3, 0.05 / 8) == pytest.approx(0.95, abs=0.01)


def test_section_5_states_its_budget_from_the_records(kit) -> None:
    reading, records, comparisons = kit.reading, kit.records, kit.comparisons
    coding = records.load_records(comparisons.RECORDS, "coding")
    lines = reading.power_lines(coding, comparisons.RECORDS)
    assert lines[0].startswith("- **The budget a claim would need**") and "Bonferroni level 0.05 / 8" in lines[0]
    assert len(lines) == 1 + len(reading.CODING_TESTS) and all("seeds a side" in x for x in lines[1:])
    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert all(line in page for line in lines)


def test_a_reading_names_what_else_differs_between_two_trained_rows():
    """Rows that differ in learning rate, compute or commits besides the method (section 5's two-turn row: another
    rate, other commits, several times the CPU seconds) say so in the reading; like rows say nothing."""
    from resultskit.provenance import row_note
    from resultskit.significance import unlike_rows

    def row(rate, cpu, commit, seed=0, curve=True):
        return {"seed": seed, "flags": {"learning-rate": rate}, "cpu_s": cpu, "commit": commit,
                "machine": {"cpu": "Xeon"}, "curve": [{"reward": 1.0}] if curve else []}

    two_turn = [row(1e-3, 6355.0, "939079c", 0), row(1e-3, 5150.0, "83054b4", 1), row(1e-3, 5253.0, "83054b4", 2)]
    one_turn = [row(3e-4, 1500.0, "83054b4", s) for s in range(3)]
    said = unlike_rows(two_turn, one_turn)
    assert "learning rate 0.001 against 0.0003" in said and "3.7x the CPU seconds" in said
    assert "seeds ran at 2 commits: 939079c (seed 0), 83054b4 (seeds 1, 2)" in row_note(two_turn)
    assert unlike_rows(one_turn, one_turn) is None and row_note(one_turn) is None
    untrained = [row(1e-3, 100.0, "83054b4", s, curve=False) for s in range(3)]
    trained = [row(1e-3, 1500.0, "83054b4", s) for s in range(3)]
    assert unlike_rows(trained, untrained) is None  # an eval-only row's compute is no caveat
