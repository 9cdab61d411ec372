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
            if source.endswith("/"):  # a folder of one GPU window's JSONs (none yet at some commits)
                for name, record in figures.gpu_figures.load(figures.source_path(ROOT, source)).items():
                    assert {"when", "load", "commit"} <= record["measured"].keys(), (source, name)
                    assert name == "window" or {"cpu", "isa", "dtype", "gpu", "torch", "cuda"} <= record[
                        "machine"].keys(), (source, name)
                continue
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


# ------------------------------------------------------------------------------------- the GPU window's section
GPU_MACHINE = {"cpu": "Intel Xeon", "isa": ["avx2", "avx512f"], "kernels": "AVX512", "restriction": {},
               "native_bf16": True, "threads": 16, "dtype": "bfloat16", "gpu": "NVIDIA H200", "capability": "9.0",
               "gpu_memory_gib": 139.8, "torch": "2.11.0+cu130", "cuda": "13.0", "tf32_matmul": False}
STAMP = {"when": "2026-12-02 10:00 UTC", "load": "nothing else running (the GPU window, one step at a time)",
         "commit": "abc1234"}


def decode_record(shape: str, rows: dict[int, float], floor: float) -> dict:
    """What bench/decode_step.py prints with ``--modes graph --no-baselines`` (and the window's stamp)."""
    table = [{"rows": n, "prompt_tokens": 43, "graph": {"ms_per_step": ms, "call_ms_per_step": ms * 1.2,
                                                         "first_call_s": 0.8, "fallback": None, "peak_gib": 0.5},
              "floor_ms": floor, "fraction_of_floor": round(floor / ms, 3)} for n, ms in rows.items()]
    return {"bench": "decode_step", "device": "cuda", "shape": shape, "dtype": "bfloat16", "weights_mb": 270.0,
            "bandwidth_gb_s": 4100.0, "max_new_tokens": 48, "sampling": {"temperature": 0.7, "top_p": 0.9, "top_k": 50},
            "table": table, "machine": GPU_MACHINE, "measured": STAMP}


def magrpo_record(shape: str, problems: int, s_per_iteration: float, update_s: float, compiling=None) -> dict:
    """What bench/magrpo_step.py prints on CUDA (and the window's stamp)."""
    return {"bench": "magrpo_step", "s_per_iteration": s_per_iteration, "rollout_s": s_per_iteration - update_s,
            "update_s": update_s, "first_iteration_s": 3.1, "samples_per_s": 16.0, "peak_rss_mb": 2100.0,
            "agents": 2, "problems": problems, "G": 4, "max_new_tokens": 48, "micro_batch_tokens": 2048,
            "threads": 16, "device": "cuda", "shape": shape, "peak_gpu_gib": 1.25,
            "update_compile": compiling or {},
            "machine": GPU_MACHINE, "measured": STAMP}


def gpu_window(folder: Path, **changes) -> Path:
    """A GPU window's OUT/measured, every target met unless ``changes`` replace a record (None: the file is left
    out)."""
    records = {
        "decode135": decode_record("135m", {32: 1.5, 256: 1.9}, 0.07),
        "decode17b": decode_record("1.7b", {32: 2.5}, 0.8),
        "magrpo135x1": magrpo_record("135m", 1, 0.42, 0.2),
        "magrpo17bx1": magrpo_record("1.7b", 1, 0.48, 0.24, {"update_compile_s": {"first": 12.5, "mean_after": 0.0}}),
        "magrpo135": magrpo_record("135m", 8, 0.9, 0.5),
        "demo": {"bench": "demo_step", "command": "llm-envs train magrpo --preset demo --num-iterations 4 --device "
                 "cuda --output-dir TMP --no-tensorboard --no-progress", "rc": 0, "error": None, "wall_s": 21.5,
                 "iterations": 4, "first_iteration_s": 2.5, "s_per_iteration": 0.61, "rollout_s": 0.3, "update_s": 0.31,
                 "s_per_iteration_all": [2.5, 0.6, 0.61, 0.7], "update_compile": {}, "evaluations": 2, "problems": 2,
                 "G": 4, "max_new_tokens": 48, "num_eval_problems": 8, "device": "cuda", "peak_gpu_gib": 0.9,
                 "machine": GPU_MACHINE, "measured": STAMP},
        "test_gpu": {"bench": "pytest_tally", "command": "make test-gpu GPU_PY=python3 GPU_WORKERS=8", "rc": 0,
                     "interrupted": False, "seconds": 121.0, "passed": 270, "failed": 0, "errors": 0, "skipped": 6,
                     "failing": [], "skip_reasons": {"two GPUs needed": 6}, "device": "cuda", "machine": GPU_MACHINE,
                     "measured": STAMP},
        "window": {"bench": "gpu_window", "kind": "gpu", "budget_s": 480,
                   "nvidia_smi": "NVIDIA H200, 143771 MiB, 580.1",
                   "gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "cuda": "13.0", "machine": GPU_MACHINE,
                   "steps": [{"step": "decode17b", "status": "timed out", "rc": 124, "seconds": 45, "limit_s": 45,
                              "json": False}], "measured": STAMP},
    }
    records.update(changes)
    folder.mkdir(parents=True, exist_ok=True)
    for name, record in records.items():
        if record is not None:
            (folder / f"{name}.json").write_text(json.dumps(record), encoding="utf-8")
    return folder


def gpu_text(figures, folder: Path) -> tuple[str, str]:
    measured = {figures.gpu_figures.SOURCE: figures.gpu_figures.load(folder)}
    return figures.gpu_figures.agents_section(measured), figures.gpu_figures.readme_section(measured)


def test_the_gpu_section_says_plainly_when_nothing_is_measured(figures, tmp_path) -> None:
    agents, readme = gpu_text(figures, tmp_path / "none")
    for text in (agents, readme):
        assert "not measured yet at this commit" in text.lower() and "bash scripts/gpu_window.sh" in text
        assert "python bench/figures.py --gpu-from" in text and "**met**" not in text


def test_the_gpu_targets_are_judged_from_the_jsons(figures, tmp_path) -> None:
    """Every target met; then the 1.7B update and decode step over their targets and a failing test: exactly
    those turn NOT met, with the figures as the JSONs have them."""
    agents, readme = gpu_text(figures, gpu_window(tmp_path / "met"))
    assert agents.count("**NOT met**") == 0 and readme.count("**met**") == 6
    assert "NVIDIA H200 (compute capability 9.0, 139.8 GiB, driver 580.1), torch 2.11.0+cu130, CUDA 13.0" in agents
    assert "| 135m, 256 rows | graph | 1.90 ms | 0.070 ms | 0.04 | 0.80 s | 0.50 GiB | <= 2 ms" in agents
    assert ("| 1.7b, two agents, 1 prompt x 4 samples (1 x 4, 48 tokens) | 0.480 s | 0.240 s | 0.240 s | 3.10 s | "
            "1.25 GiB | <= 0.5 s, update <= 0.25 s: **met** |") in agents
    assert "`update_compile_s` 12.500 in the first iteration, 0.000 on average after it" in agents
    assert "| 135m, bench/magrpo_step.py's workload (8 x 4, 48 tokens) | 0.900 s |" in agents
    assert ("the demo (`llm-envs train magrpo --preset demo`, 2 x 4, 48 tokens; median of 3 iterations) | "
            "0.610 s") in agents
    assert "270 passed, 0 failed, 0 errors, 6 skipped in 121 s" in agents and "two GPUs needed (6)" in agents
    failing = figures.gpu_figures.load(gpu_window(tmp_path / "met"))["test_gpu"]
    failing.update(failed=2, rc=1, failing=["tests/test_decoder.py::test_grad", "tests/test_engine.py::test_x"])
    agents, readme = gpu_text(figures, gpu_window(
        tmp_path / "not", magrpo17bx1=magrpo_record("1.7b", 1, 0.48, 0.3),
        decode17b=decode_record("1.7b", {32: 3.2}, 0.8), test_gpu=failing))
    for text in (agents, readme):
        assert "MAGRPO 1.7b iteration <= 0.5 s with its update <= 0.25 s: **NOT met**" in text
        assert "MAGRPO 135m iteration <= 0.5 s with its update <= 0.25 s: **met**" in text
        assert "decode step 1.7b, 32 rows <= 3 ms, first call <= 5 s: **NOT met**" in text
        assert "decode step 135m, 256 rows <= 2 ms, first call <= 5 s: **met**" in text
        assert "`make test-gpu` green on one GPU: **NOT met**" in text
    assert "Failing: `tests/test_decoder.py::test_grad`, `tests/test_engine.py::test_x`." in agents
    slow_first = decode_record("135m", {32: 1.5, 256: 1.9}, 0.07)
    slow_first["table"][0]["graph"]["first_call_s"] = 5.5  # a first call over its target fails the step's target
    agents, _ = gpu_text(figures, gpu_window(tmp_path / "first", decode135=slow_first))
    assert "decode step 135m, 32 rows <= 2 ms, first call <= 5 s: **NOT met**" in agents


def test_a_step_without_its_json_is_named_and_its_target_not_measured(figures, tmp_path) -> None:
    agents, readme = gpu_text(figures, gpu_window(tmp_path / "w", decode17b=None, demo=None))
    assert "Not measured in this window: decode17b (timed out, rc 124), demo (" in agents
    assert "decode step 1.7b, 32 rows <= 3 ms, first call <= 5 s: not measured" in readme
    assert "| 1.7b, 32 rows |" not in agents and "The demo's run" not in agents


def test_gpu_from_keeps_one_window_and_refuses_a_dry_run_or_a_cpu(figures, tmp_path) -> None:
    first = gpu_window(tmp_path / "first")
    rerun = tmp_path / "rerun"
    rerun.mkdir()
    (rerun / "decode17b.json").write_text(json.dumps(decode_record("1.7b", {32: 2.2}, 0.8)), encoding="utf-8")
    (rerun / "window.json").write_text(json.dumps({
        "bench": "gpu_window", "kind": "gpu", "steps": [{"step": "decode17b", "status": "ok", "rc": 0}],
        "measured": STAMP}), encoding="utf-8")
    target = tmp_path / "bench" / "measured" / "gpu"
    target.mkdir(parents=True)
    (target / "stale.json").write_text("{}", encoding="utf-8")  # an older window's file goes
    kept = figures.gpu_figures.copy_window([first, rerun], target)
    assert "stale" not in kept and sorted(p.stem for p in target.glob("*.json")) == kept
    records = figures.gpu_figures.load(target)
    assert records["decode17b"]["table"][0]["graph"]["ms_per_step"] == 2.2  # the rerun's
    assert records["window"]["steps"] == [{"step": "decode17b", "status": "ok", "rc": 0}]
    assert records["window"]["nvidia_smi"].startswith("NVIDIA H200")  # the first window's, the steps merged
    dry = gpu_window(tmp_path / "dry", window={"kind": "dry", "steps": [], "measured": STAMP})
    with pytest.raises(SystemExit, match="a dry run's"):
        figures.gpu_figures.copy_window([dry], tmp_path / "out")
    on_cpu = magrpo_record("135m", 1, 4.2, 1.8)
    on_cpu["device"] = "cpu"
    with pytest.raises(SystemExit, match="magrpo135x1 ran on cpu, not on a GPU"):
        figures.gpu_figures.copy_window([gpu_window(tmp_path / "cpu", magrpo135x1=on_cpu)], tmp_path / "out")


def test_a_gpu_window_renders_into_agents_md_and_readme_only_in_its_blocks(figures, tmp_path) -> None:
    root = copy_tree(tmp_path, figures)
    shutil.rmtree(root / "bench" / "measured" / "gpu", ignore_errors=True)
    gpu_window(root / "bench" / "measured" / "gpu")
    docs = figures.rendered(root)
    for doc, name in (("docs/agents.md", "gpu"), ("README.md", "gpu-readme")):
        before = (root / doc).read_text(encoding="utf-8")
        after = docs[doc]
        assert "NVIDIA H200" in after and "NVIDIA H200" not in before
        begin, end = (figures.MARKER.format(name=name, end=e) for e in ("begin", "end"))
        outside = lambda text, b=begin, e=end: text.split(b)[0] + text.split(e)[1]  # noqa: E731
        assert outside(after) == outside(before)
