"""bench/figures.py: the docs' measured figures are what the bench JSONs kept in bench/measured/ make of them."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def figures():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        yield importlib.import_module("figures")
    finally:
        sys.path.remove(str(ROOT / "bench"))


def test_the_docs_are_what_the_measured_jsons_make(figures) -> None:
    """A bench JSON added or changed, or a figure's text changed in code, without a render fails here."""
    for doc, text in figures.rendered().items():
        assert (ROOT / doc).read_text(encoding="utf-8") == text, f"{doc} is stale: run `python bench/figures.py`"


def test_every_figure_has_its_markers_and_sources(figures) -> None:
    for name, (doc, sources, _) in figures.FIGURES.items():
        text = (ROOT / doc).read_text(encoding="utf-8")
        for end in ("begin", "end"):
            assert text.count(figures.MARKER.format(name=name, end=end)) == 1, (name, end)
        for source in sources:
            record = json.loads(figures.source_path(ROOT, source).read_text(encoding="utf-8"))
            if "/" in source:  # a run's record kept beside its doc: where and when, or its figure says unknown
                where = {"machine", "date", "commit"} <= record.keys()
                assert where or "not recorded" in figures.rendered()[doc], source
                continue
            # Every kept measurement says where and when it was taken: the CPU, its ISA, the dtype, the commit.
            assert {"cpu", "isa", "dtype"} <= (record.get("machine") or record).keys(), source
            assert {"when", "load", "commit"} <= record["measured"].keys(), source


def copy_tree(tmp_path: Path, figures) -> Path:
    for doc in {doc for doc, _, _ in figures.FIGURES.values()}:
        (tmp_path / doc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / doc, tmp_path / doc)
    shutil.copytree(figures.MEASURED, tmp_path / "bench" / "measured")
    shutil.copytree(ROOT / "docs" / "figures", tmp_path / "docs" / "figures")
    return tmp_path


def test_a_changed_measurement_changes_the_doc_and_only_its_block(figures, tmp_path) -> None:
    root = copy_tree(tmp_path, figures)
    path = root / "bench" / "measured" / "generate.json"
    record = json.loads(path.read_text(encoding="utf-8"))
    record["ratio"], record["fraction_of_limit"] = 9.99, 0.12
    path.write_text(json.dumps(record), encoding="utf-8")
    before = (root / "docs" / "agents.md").read_text(encoding="utf-8")
    after = figures.rendered(root)["docs/agents.md"]
    assert "**9.99x the tokens a second**" in after and "**0.12 of the limit**" in after
    changed = [line for line in after.splitlines() if line not in before.splitlines()]
    assert len(changed) == 1 and changed[0].startswith("The engine with the defaults:")


def test_the_rendered_ratios_are_the_recorded_ones(figures) -> None:
    """Hand-checked against bench/measured/: the rows as the JSON holds them, the ways' best per shape."""
    measured = {name: json.loads((figures.MEASURED / f"{name}.json").read_text(encoding="utf-8"))
                for name in ("attention", "attention_avx2", "decode_table", *figures.TRAINING_ATTENTION)}
    decode = figures.decode_attention(measured)
    row = next(r for r in measured["attention"]["rows"] if r["pass"] == "decode" and r["dtype"] == "bfloat16"
               and r["keys"] == 600 and r["rows"] == 16)
    assert (f"| AVX512 | bf16 | 16 x 600 | {row['enable_gqa_ms']:.3f} ms | {row['grouped_ms']:.3f} ms | "
            f"{row['transposed_ms']:.3f} ms | {row['transposed_over_grouped']:.2f}x |") in decode
    assert "ATEN_CPU_CAPABILITY=avx2" in decode  # the AVX2 rows say how the kernels were restricted
    training = figures.training_attention(measured)
    kept = [measured[name] for name in figures.TRAINING_ATTENTION]
    for record in kept:
        for r in record["rows"]:
            best = [min(("mask", "written", "spans"), key=lambda w, p=p: r[w][f"{p}_ms"]) for p in ("fwd", "train")]
            assert f" | {best[0]}, {best[1]} |" in training
        for p in record.get("passes", []):  # each whole pass under its JSON's bounds, against its "before"
            assert (f"{p['now']['score_ms']:.0f} / {p['now']['train_ms']:.0f} ms | {p['before']['score_ms']:.0f} / "
                    f"{p['before']['train_ms']:.0f} ms") in training
    assert training.count("\n| AVX") == sum(len(r["rows"]) + len(r.get("passes", [])) for r in kept)
    table = measured["decode_table"]["ms_per_step"]
    bf16_4, bf16_32 = table["bfloat16 engine, 2 adapters"]["4"], table["bfloat16 engine, 2 adapters"]["32"]
    assert f"in bfloat16 32 rows cost {bf16_32 / bf16_4:.2f}x what 4 cost" in figures.decode_table(measured)


def test_a_missing_marker_or_json_is_a_clear_error(figures, tmp_path) -> None:
    root = copy_tree(tmp_path, figures)
    (root / "bench" / "measured" / "generate.json").unlink()
    with pytest.raises(SystemExit, match="figure 'generate' reads .*generate.json"):
        figures.rendered(root)
    root = copy_tree(tmp_path / "again", figures)
    doc = root / "docs" / "agents.md"
    doc.write_text(doc.read_text(encoding="utf-8").replace(figures.MARKER.format(name="generate", end="end"), ""),
                   encoding="utf-8")
    with pytest.raises(ValueError, match="no 'generate' section"):
        figures.rendered(root)


def test_the_pure_python_benches_render_their_own_figures(figures) -> None:
    """Hand-checked against bench/measured/procgen.json: the generator calls an instance costs, the
    sandbox's share of a step with the reference program, the oracle's exact score."""
    d = json.loads((figures.MEASURED / "procgen.json").read_text(encoding="utf-8"))
    text = figures.procgen({"procgen": d})
    calls = [d["generator_calls_per_s"][f] / d["instances_per_s"][f] for f in d["instances_per_s"]]
    assert f"costs {figures.span(calls, 1, '')} generator calls" in text
    assert text.count("\n| ") == 1 + len(d["instances_per_s"])  # the header and a row a family
    oracle = figures.building_oracle({"procgen": d})
    for family, b in d["building"].items():
        assert f"| `building/{family}-v0` | {b['max_reward']:.1f} on all {b['eval_instances']} |" in oracle
    assert "zero credit: **yes**" in figures.sandbox({"sandbox": json.loads(
        (figures.MEASURED / "sandbox.json").read_text(encoding="utf-8"))})


def test_the_serve_figure_is_what_its_json_says(figures) -> None:
    """Hand-checked against bench/measured/serve.json: a row per (env, sessions) and the fault run's, the
    overhead over the env's own step, and the targets' and the fault run's verdicts as the JSON has them."""
    d = json.loads((figures.MEASURED / "serve.json").read_text(encoding="utf-8"))
    text = figures.serve({"serve": d})
    assert text.count("\n| `") == len(d["runs"]) + 1
    for r in d["runs"]:
        own = d["in_process"][r["env"]]["step_p50_ms"]
        assert abs(r["overhead_ms_p50"] - (r["p50_ms"] - own)) < 1e-6
        assert (f"| `{r['env']}` | {r['sessions']} | {r['steps_per_s']:,.1f} | {r['p50_ms']:.2f} ms | "
                f"{r['p99_ms']:.2f} ms | {r['overhead_ms_p50']:+.2f} ms | {r['ratio_to_in_process']:.2f}x | "
                f"{r['fraction_of_limit']:.2f} |") in text
    f = d["fault"]
    assert f"| {f['episodes_dropped']} / {f['episodes']['lost']} of {f['episodes']['started']} |" in text
    t = d["targets"]
    for env, met in t["overhead_met"].items():
        assert f"`{env}` {'**met**' if met else '**NOT met**'} ({t['overhead_ms_p50'][env]:+.2f} ms)" in text
    half = {True: "**met**", False: "**NOT met**", None: "not measured"}[t["half_rate_met"]]
    assert f"reaching at least half the in-process step rate: {half}" in text
    assert f"no episode lost, in any run: **{'yes' if d['no_episode_lost'] else 'NO'}**" in text


def test_cory_s_seconds_an_iteration_are_iterations_json_s(figures) -> None:
    """docs/cory.md quotes PPO's and CORY's seconds an iteration from bench/measured/iterations.json, and the
    comparison's table from its run's JSON."""
    it = json.loads((figures.MEASURED / "iterations.json").read_text(encoding="utf-8"))
    run = json.loads((ROOT / "docs" / "figures" / "cory_vs_ppo.json").read_text(encoding="utf-8"))
    text = figures.cory_vs_ppo({"iterations": it, "docs/figures/cory_vs_ppo.json": run})
    for key, name in (("ppo", "PPO"), ("cory", "CORY")):
        assert (f"{name} {it[key]['before']['s_per_iteration']:.2f} -> **{it[key]['after']['s_per_iteration']:.2f} "
                f"s an iteration**") in text
    assert f"| {run['runs']['ppo']['models']['agent']['task_reward_last5']:.3f} |" in text
    assert text in (ROOT / "docs" / "cory.md").read_text(encoding="utf-8")


def test_the_precision_and_target_figures_are_the_recorded_ones(figures) -> None:
    """docs/agents.md's bfloat16-against-float32 ratios (the engine's step, whole passes per real token) and the
    speedup targets' verdicts, hand-checked against bench/measured/."""
    names = ("generate", "decode_table", "attention_training", "attention_passes_f32", "iterations")
    measured = {name: json.loads((figures.MEASURED / f"{name}.json").read_text(encoding="utf-8")) for name in names}
    text = figures.precision(measured)
    g = measured["generate"]
    assert f"decode step **{g['ours_fp32']['ms_per_step'] / g['ours_bf16']['ms_per_step']:.2f}x**" in text
    f32 = next(p for p in measured["attention_passes_f32"]["passes"] if p["what"] == "medium")
    bf16 = next(p for p in measured["attention_training"]["passes"] if p["what"] == "medium")
    ratio = (f32["now"]["train_ms"] / f32["tokens"]) / (bf16["now"]["train_ms"] / bf16["tokens"])
    assert f"training **{ratio:.2f}x**" in text
    it = measured["iterations"]
    targets = figures.iterations({"iterations": it})
    for key, target in figures.ITERATION_TARGETS.items():
        verdict = "met" if it[key]["speedup"] >= target else "NOT met"
        assert f"{target:g}x: **{verdict}** ({it[key]['speedup']:.2f}x)" in targets
    doc = (ROOT / "docs" / "agents.md").read_text(encoding="utf-8")
    assert text in doc and targets in doc
