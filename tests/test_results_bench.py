"""bench/results.py (docs/results.md): --quick records through the learners' command line with a tiny
model, skipping finished records on a re-run, and the figures, summaries and page tables rendered from
whatever records exist."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def results():
    spec = importlib.util.spec_from_file_location("bench_results", ROOT / "bench" / "results.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def last_json(capsys: pytest.CaptureFixture[str]) -> dict:
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    return json.loads(lines[-1])


SECTIONS = ("sampling", "wall", "magrpo-settings", "magrpo", "magrpo-reading", "cory-settings", "cory", "cory-reading",
            "preference-settings", "preference", "preference-reading", "sweep-settings", "sweep", "methods-settings",
            "methods", "methods-reading", "coding-sweep-settings", "coding-sweep", "coding-settings", "coding",
            "coding-reading")


def page_with_markers(results, path: Path) -> Path:
    marks = [results.MARKER.format(name=name, end="begin") + "\nSTALE\n" + results.MARKER.format(name=name, end="end")
             for name in SECTIONS]
    path.write_text("# Results\n" + "\nreading kept\n".join(marks) + "\n", encoding="utf-8")
    return path


def test_quick_magrpo_records_skip_and_render(results, tiny_model_dir, tmp_path, capsys) -> None:
    out, runs = tmp_path / "records", tmp_path / "runs"
    methods = ["untrained-sequential", "single-strict", "magrpo-2turn"]
    argv = ["run", "magrpo", "--quick", "--model", tiny_model_dir, "--out", str(out), "--runs-dir", str(runs),
            "--methods", *methods]
    assert results.main(argv) == 0
    summary = last_json(capsys)
    assert [d["record"] for d in summary["done"]] == [f"{m}__s0.json" for m in methods]
    records = {r["method"]: r for r in results.load_records(out, "magrpo")}
    assert set(records) == set(methods)
    for record in records.values():
        assert record["seed"] == 0 and record["quick"] and record["wall_s"] >= 0
        assert record["command"].startswith("llm-envs ") and "--model" in record["command"]
        assert math.isfinite(record["eval"]["total"])
    single, two_turn = records["single-strict"], records["magrpo-2turn"]
    # The single agent writes both parts: twice the pair's tokens per response; its reward reports the delimiter.
    assert single["flags"]["max-new-tokens"] == 2 * two_turn["flags"]["max-new-tokens"]
    assert single["env"] == "writing/xsum-single-strict-v0" and "delimiter" in single["eval"]
    assert single["curve"]["iteration"] == [1.0, 2.0] and len(single["curve"]["reward/delimiter"]) == 2
    assert two_turn["flags"]["num-turns"] == 2 and "--num-turns 2" in two_turn["command"]
    assert records["untrained-sequential"]["command"].startswith("llm-envs eval --env writing/xsum-sequential-v0")
    assert records["untrained-sequential"]["curve"] == {}

    # A re-run skips what exists and runs nothing.
    assert results.main(argv) == 0
    again = last_json(capsys)
    assert again["done"] == [] and sorted(again["skipped"]) == sorted(f"{m}__s0.json" for m in methods)

    page = page_with_markers(results, tmp_path / "results.md")
    assert results.main(["render", "--out", str(out), "--page", str(page)]) == 0
    rendered = last_json(capsys)
    assert rendered["records"] == 3 and (out / "magrpo.png").is_file()
    text = page.read_text(encoding="utf-8")
    assert "STALE" not in text and "reading kept" in text
    assert "single agent (GRPO), split=strict" in text and "(n=1)" in text
    # The page names every missing record and the command that completes it.
    run = "python bench/results.py run magrpo"
    assert f"{run} --seeds 0 1 2 --methods untrained-parallel single-reference magrpo" in text
    assert f"{run} --seeds 1 2 --methods untrained-sequential single-strict magrpo-2turn" in text
    saved = json.loads((out / "magrpo.json").read_text())
    assert saved["summary"]["single-strict"]["seeds"] == [0]
    assert saved["settings"]["num-iterations"] == results.MAGRPO_SETTINGS["num-iterations"]


def test_quick_cory_records(results, tiny_model_dir, tmp_path, capsys) -> None:
    out, runs = tmp_path / "records", tmp_path / "runs"
    argv = ["run", "cory", "--quick", "--model", tiny_model_dir, "--out", str(out), "--runs-dir", str(runs),
            "--methods", "ppo", "cory-individual"]
    assert results.main(argv) == 0
    assert len(last_json(capsys)["done"]) == 2
    records = {r["method"]: r for r in results.load_records(out, "cory")}
    ppo, cory = records["ppo"], records["cory-individual"]
    assert set(ppo["final"]) == {"agent"} and set(cory["final"]) == {"model_0", "model_1"}
    assert cory["env"] == "sentiment/imdb-cory-individual-v0" and cory["flags"]["swap-every"] == 5
    for record in (ppo, cory):
        for model in record["final"]:
            assert len(record["curve"][f"agent_{model}/kl"]) == 2
            assert all(math.isfinite(v) for v in record["final"][model].values())
        assert record["flags"]["init-kl-coef"] == results.CORY_SETTINGS["init-kl-coef"]
    assert results.main(["render", "--out", str(out), "--page", ""]) == 0
    assert (out / "cory.png").is_file() and last_json(capsys)["missing"]["cory"]["ppo"] == [1, 2]


def test_a_record_running_elsewhere_is_skipped_and_a_dead_claim_taken_over(results, tiny_model_dir, tmp_path,
                                                                         capsys) -> None:
    out, runs = tmp_path / "records", tmp_path / "runs"
    argv = ["run", "magrpo", "--quick", "--model", tiny_model_dir, "--out", str(out), "--runs-dir", str(runs),
            "--methods", "untrained-sequential"]
    marker = out / "magrpo" / "untrained-sequential__s0.running"
    marker.parent.mkdir(parents=True)
    marker.write_text(f"{os.getppid()}\n")  # a live process that is not this one
    assert results.main(argv) == 0
    summary = last_json(capsys)
    assert summary["done"] == []
    assert summary["skipped"] == [f"untrained-sequential__s0.json (running in process {os.getppid()})"]
    assert not (out / "magrpo" / "untrained-sequential__s0.json").exists() and marker.exists()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # its pid names no process now
    marker.write_text(f"{gone.pid}\n")
    assert results.main(argv) == 0
    assert [d["record"] for d in last_json(capsys)["done"]] == ["untrained-sequential__s0.json"]
    assert not marker.exists()  # released once the record is written


def test_status_says_how_far_a_running_record_is(results, tmp_path, capsys) -> None:
    """``status`` lists the records a live process runs now, with the last iteration its metrics logged
    and the time its iterations left take at its pace; the marker ``run`` writes holds what that needs
    (the log, the run directory, the iterations)."""
    out, run_dir = tmp_path / "records", tmp_path / "runs" / "magrpo__magrpo__s1"
    run_dir.mkdir(parents=True)
    rows = [{"step": 0, "eval/total": 1.0}, {"step": 1, "reward/total": 0.5, "charts/s_per_iteration": 30.0},
            {"step": 2, "reward/total": 0.7, "charts/s_per_iteration": 50.0}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 3, "rew')
    (out / "magrpo").mkdir(parents=True)
    details = {"log": str(tmp_path / "m.log"), "run_dir": str(run_dir), "num_iterations": 20}
    (out / "magrpo" / "magrpo__s1.running").write_text(f"{os.getppid()}\n{json.dumps(details)}\n")
    (out / "magrpo" / "magrpo__s2.running").write_text(f"{os.getppid()}\n")  # a marker of the pid alone
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (out / "magrpo" / "ppo__s0.running").write_text(f"{gone.pid}\n{{}}\n")  # its process is gone: not running
    assert results.main(["status", "--out", str(out)]) == 0
    running = last_json(capsys)["magrpo"]["running"]
    assert running == {
        # 3 is half-written; 18 iterations left at the median pace of the last ones (30 and 50 s): 720 s
        "magrpo__s1.json": {"pid": os.getppid(), "log": details["log"], "iteration": 2, "of": 20, "eta_s": 720},
        "magrpo__s2.json": {"pid": os.getppid()},
    }
    assert sys.modules[results.run_records.__module__].running_pid(out / "magrpo" / "magrpo__s1.json") == os.getppid()


def test_a_run_announces_each_record_and_marks_it_with_its_details(results, tiny_model_dir, tmp_path, capsys,
                                                                   monkeypatch) -> None:
    out, runs = tmp_path / "records", tmp_path / "runs"
    seen = []
    records = sys.modules[results.run_records.__module__]
    real = records._run_record

    def spy(comparison, m, seed, path, **kwargs):
        seen.append(path.with_suffix(".running").read_text(encoding="utf-8"))
        return real(comparison, m, seed, path, **kwargs)

    monkeypatch.setattr(records, "_run_record", spy)
    argv = ["run", "magrpo", "--quick", "--model", tiny_model_dir, "--out", str(out), "--runs-dir", str(runs),
            "--methods", "untrained-sequential"]
    assert results.main(argv) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    started = lines[0]
    assert started["started"] == "untrained-sequential__s0.json"
    assert started["log"].endswith("magrpo__untrained-sequential__s0.log") and "run_dir" not in started  # an eval
    pid, detail = seen[0].splitlines()
    assert int(pid) == os.getpid() and json.loads(detail) == {"log": started["log"]}


def test_a_run_a_sitting_left_unfinished_resumes_to_the_uninterrupted_record(results, tiny_model_dir, tmp_path,
                                                                           capsys) -> None:
    """A training run killed after its first iteration's checkpoint continues in the next sitting with
    ``--resume`` and gives the uninterrupted run's record, its two legs timed and summed (the coding pair
    over two turns with the tests' feedback: the longest runs of the page); a directory whose legs ran
    other code starts again from nothing."""
    comparison, name = "coding-sweep", "magrpo-2turn@lr0.001"
    out, runs = tmp_path / "records", tmp_path / "runs"
    argv = ["run", comparison, "--quick", "--model", tiny_model_dir, "--out", str(out), "--runs-dir", str(runs),
            "--methods", name]
    assert results.main(argv) == 0
    path, run_dir = out / comparison / f"{name}__s0.json", runs / "quick" / f"{comparison}__{name}__s0"
    whole = json.loads(path.read_text(encoding="utf-8"))
    timing = ("charts/s_per_iteration", "charts/samples_per_s", "charts/responses_per_s", "charts/rollout_fraction")

    def learned() -> list[dict]:  # every logged value but the timings: losses, gradient norms, rewards, evals
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
        return [{k: v for k, v in row.items() if k not in timing} for row in rows]

    uninterrupted = learned()
    assert sum(1 for row in uninterrupted for k in row if k.endswith("/grad_norm")) == 4  # 2 agents x 2 iterations
    assert "legs" not in whole and "--checkpoint-every 1" in whole["command"]
    legs = json.loads((run_dir / "legs.json").read_text(encoding="utf-8"))
    assert [leg["from_step"] for leg in legs] == [0] and legs[0]["wall_s"] == whole["wall_s"]

    # The sitting ended during iteration 2: no record, no step-2 checkpoint, its log line half-written.
    path.unlink()
    shutil.rmtree(run_dir / "checkpoints" / "step_000002")
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as fh:
        fh.write('{"step": 2, "reward/to')
    capsys.readouterr()
    assert results.main(["status", "--out", str(out), "--runs-dir", str(runs / "quick")]) == 0
    assert last_json(capsys)[comparison]["resumable"] == {path.name: {"step": 1, "legs": 1, "run_dir": str(run_dir)}}
    assert results.main(argv) == 0
    done = last_json(capsys)["done"]
    assert [(d["record"], d["resumed_from"]) for d in done] == [(path.name, 1)]
    resumed = json.loads(path.read_text(encoding="utf-8"))
    assert resumed["command"] == whole["command"]  # the command of the run, not of its legs
    assert resumed["eval"] == whole["eval"] and resumed["eval_before"] == whole["eval_before"]
    assert {k: v for k, v in resumed["curve"].items() if k != "charts/s_per_iteration"} == {
        k: v for k, v in whole["curve"].items() if k != "charts/s_per_iteration"}
    assert learned() == uninterrupted
    assert [leg["from_step"] for leg in resumed["legs"]] == [0, 1]
    assert resumed["wall_s"] == pytest.approx(sum(leg["wall_s"] for leg in resumed["legs"]), abs=0.11)
    page = page_with_markers(results, tmp_path / "results.md")
    assert results.main(["render", "--out", str(out), "--page", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    assert f"| [{name}__s0](results/{comparison}/{name}__s0.json) | {resumed['wall_s']} (2 legs) |" in text
    assert "| MAGRPO pair, 2 turns (tests' feedback) | 0.001 | (missing) |" not in text  # its sweep row is filled

    # Legs of other code: nothing to continue, the run starts again (and is one leg).
    path.unlink()
    legs = json.loads((run_dir / "legs.json").read_text(encoding="utf-8"))
    (run_dir / "legs.json").write_text(json.dumps([{**leg, "code": "another commit"} for leg in legs]))
    capsys.readouterr()
    assert results.main(argv) == 0
    assert "resumed_from" not in last_json(capsys)["done"][0]
    again = json.loads(path.read_text(encoding="utf-8"))
    assert "legs" not in again and again["eval"] == whole["eval"]


def test_helpers(results, tmp_path) -> None:
    assert results.to_argv({"swap-every": 0, "adaptive-kl": True, "eval-greedy": False}) == [
        "--swap-every", "0", "--adaptive-kl", "--no-eval-greedy"]
    assert results.mean_std([2.0, math.nan, 4.0]) == (3.0, math.sqrt(2.0), 2, 1)  # the NaN counted, not dropped
    empty = results.mean_std([])
    assert math.isnan(empty.mean) and (empty.n, empty.nonfinite) == (0, 0)
    assert results.missing_records(tmp_path, "cory") == {"ppo": [0, 1, 2], "cory": [0, 1, 2], "cory-no-swap": [0],
                                                         "cory-individual": [0]}
    assert results.completion_commands("cory", {"ppo": [1, 2], "cory": [1, 2], "cory-no-swap": [0]}) == [
        "python bench/results.py run cory --seeds 1 2 --methods ppo cory",
        "python bench/results.py run cory --seeds 0 --methods cory-no-swap",
    ]
    with pytest.raises(ValueError, match="unknown method 'sac' of 'cory'"):
        results.method("cory", "sac")
    with pytest.raises(ValueError, match="the page has no 'magrpo' section"):
        results.replace_section("no markers here", "magrpo", "body")
    with pytest.raises(SystemExit):
        results.main(["run", "dqn"])


def test_eval_top_k(tiny_model_dir, capsys, monkeypatch) -> None:
    """``llm-envs eval --top-k`` reaches the evaluation (the untrained records sample as the learners'
    evaluations do, top-k 50); the default stays 0 (off); a negative value is refused."""
    import baselines.infra.evaluation
    from baselines.infra.cli import main

    real, seen = baselines.infra.evaluation.evaluate, []

    def evaluate(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(baselines.infra.evaluation, "evaluate", evaluate)
    base = ["eval", "--model", tiny_model_dir, "--env", "writing/xsum-single-v0", "--num-problems", "2",
            "--max-new-tokens", "12", "--max-source-words", "20"]
    assert main(base + ["--sample", "--top-k", "50", "--seed", "4"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert {"eval/delimiter", "eval/marker", "eval/total"} <= set(result)
    assert seen[-1]["top_k"] == 50 and seen[-1]["greedy"] is False and seen[-1]["seed"] == 4
    assert main(base + ["--sample", "--top-k", "-1"]) == 2
    assert "--top-k must be >= 0 (0 disables it), got -1" in capsys.readouterr().err
    assert len(seen) == 1  # refused before anything ran


@pytest.mark.slow
def test_quick_with_the_embedded_model(results, tmp_path, capsys) -> None:
    """The page's path end to end with the real model: the single agent under the reference split (2
    iterations of 1 problem x 2 samples) and the untrained sequential pair."""
    out = tmp_path / "records"
    argv = ["run", "magrpo", "--quick", "--out", str(out), "--runs-dir", str(tmp_path / "runs"), "--threads", "1",
            "--methods", "untrained-sequential", "single-reference"]
    assert results.main(argv) == 0
    assert len(last_json(capsys)["done"]) == 2
    records = {r["method"]: r for r in results.load_records(out, "magrpo")}
    single = records["single-reference"]
    assert "--model" not in single["command"]
    assert 0.0 <= single["eval"]["total"] <= 3.0 and 0.0 <= single["eval"]["delimiter"] <= 1.0
    assert len(single["curve"]["reward/total"]) == 2
    assert 0.0 <= records["untrained-sequential"]["eval"]["total"] <= 3.0


def test_quick_preference_records_reuse_magrpo_and_render(
    results, tiny_model_dir, tmp_path, capsys, varied_writing_reward
) -> None:
    """The preference comparison: its MAGRPO team is the magrpo comparison's record (run there once,
    read from there), its centralised and MADPO runs are its own."""
    out, runs = tmp_path / "records", tmp_path / "runs"
    # The magrpo comparison's record of the team (its runs are tested above): written by hand here.
    record = {"comparison": "magrpo", "method": "magrpo", "label": "MAGRPO, parallel", "seed": 0, "wall_s": 1.0,
              "load_average_1min": {"start": 0.0, "end": 0.0}, "finished": "now", "commit": None, "curve": {},
              "eval": {"total": 1.5}, "eval_before": {"total": 0.5}}
    (out / "magrpo").mkdir(parents=True)
    (out / "magrpo" / "magrpo__s0.json").write_text(json.dumps(record))
    argv = ["run", "preference", "--quick", "--model", tiny_model_dir, "--out", str(out), "--runs-dir", str(runs),
            "--threads", "1", "--methods", "magrpo", "madpo"]
    assert results.main(argv) == 0
    assert last_json(capsys)["skipped"] == ["magrpo__s0.json"]  # the team's record is read, not run again
    assert (out / "preference" / "madpo__s0.json").is_file()
    records = {r["method"]: r for r in results.load_records(out, "preference")}
    assert set(records) == {"magrpo", "madpo"} and records["magrpo"]["reused_from"] == "magrpo"
    madpo = records["madpo"]
    assert madpo["command"].startswith("llm-envs train madpo") and "--num-prompts 2" in madpo["command"]
    assert math.isfinite(madpo["eval"]["total"]) and len(madpo["curve"]["losses/dpo"]) == 2
    centralized = results.flags_of(results.method("preference", "centralized"), "preference", False)
    assert centralized["centralized"] is True and centralized["max-new-tokens"] == 96
    page = page_with_markers(results, tmp_path / "results.md")
    assert results.main(["render", "--out", str(out), "--page", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    assert "MADPO (offline" in text and "(results/magrpo/magrpo__s0.json)" in text
    assert "python bench/results.py run preference --seeds 0 1 2 --methods centralized" in text


def test_sweep_chooses_each_rate_on_validation_and_seed_0_is_the_sweep_record(
    results, tiny_model_dir, tmp_path, capsys, varied_writing_reward
) -> None:
    """The methods comparison (issue #38): a method's learning rate is its sweep's best validation total
    (never the eval split's), seed 0 is that sweep record, the other seeds run at the chosen rate."""
    out, runs = tmp_path / "records", tmp_path / "runs"
    rates = results.SWEEP_RATES["madpo"]
    # Hand-written sweep records: the best validation total is the middle rate's, the best eval total another's.
    for rate, val, evaluated in zip(rates, (0.5, 1.25, 1.0), (2.5, 0.0, 0.0)):
        name = results.sweep_name("madpo", rate)
        record = {"comparison": "sweep", "method": name, "label": name, "seed": 0, "wall_s": 1.0, "cpu_s": 1.0,
                  "load_average_1min": {"start": 0.0, "end": 0.0}, "finished": "now", "commit": None,
                  "flags": {"learning-rate": rate}, "curve": {}, "eval": {"total": evaluated},
                  "eval_before": {"total": 0.25}, "validation": {"total": val}}
        (out / "sweep").mkdir(parents=True, exist_ok=True)
        (out / "sweep" / f"{name}__s0.json").write_text(json.dumps(record))
    assert results.chosen_rate(out, "madpo") == rates[1]
    assert results.chosen_rate(out, "madpo-iterative") is None  # its sweep has not run
    assert results.chosen_rate(out, "centralized") == results.FIXED_RATE  # not swept
    argv = ["run", "methods", "--quick", "--model", tiny_model_dir, "--out", str(out), "--runs-dir", str(runs),
            "--threads", "1", "--methods", "madpo", "madpo-iterative", "--seeds", "0", "1"]
    assert results.main(argv) == 0
    summary = last_json(capsys)
    assert summary["done"][0] == {"record": "madpo__s0.json", "copied_from": results.sweep_name("madpo", rates[1])}
    assert [d["record"] for d in summary["done"]] == ["madpo__s0.json", "madpo__s1.json"]
    assert sorted(summary["skipped"]) == [f"madpo-iterative__s{s}.json (its learning-rate sweep is not complete)"
                                          for s in (0, 1)]
    records = {(r["method"], r["seed"]): r for r in results.load_records(out, "methods")}
    assert records[("madpo", 0)]["copied_from"] == f"sweep/{results.sweep_name('madpo', rates[1])}__s0.json"
    ran = records[("madpo", 1)]
    assert f"--learning-rate {rates[1]}" in ran["command"] and ran["flags"]["learning-rate"] == rates[1]
    assert "--num-validation-problems 2" in ran["command"] and math.isfinite(ran["validation"]["total"])
    page = page_with_markers(results, tmp_path / "results.md")
    assert results.main(["render", "--out", str(out), "--page", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    # The chosen rate's validation total in bold, the others as they are (a real run's wall time may read 0.5 s:
    # the rows are matched whole).
    assert f"| {rates[1]:g} | **1.250** |" in text and f"| {rates[0]:g} | 0.500 |" in text
    assert "MADPO, offline (40 prompts x 4 candidates) | 0.0001 |" in text


def test_sweep_commands(results) -> None:
    """Every swept method at every rate: its own flags, the rate, the validation split; the centralised
    rows twice the pair's tokens (the prefilled one with --prefill)."""
    comparisons = sys.modules["resultskit.comparisons"]
    names = [m.name for m in comparisons.COMPARISONS["sweep"]]
    assert len(names) == sum(len(r) for r in comparisons.SWEEP_RATES.values()) == 16
    for m in comparisons.COMPARISONS["sweep"]:
        argv = comparisons.command_of(m, "sweep", 0, quick=False, runs_dir=Path("runs"), model=None, threads=1)
        base, rate = m.name.split("@lr")
        assert argv[:2] == ["train", comparisons.method("methods", base).learner]
        assert f"--learning-rate {float(rate)}" in " ".join(argv) and "--num-validation-problems 32" in " ".join(argv)
        # MARLHF's rates share their seed's reward-model fit (--rm-cache; the fit reads no RL setting).
        assert ("--rm-cache" in argv) == (base == "marlhf"), m.name
    prefill = comparisons.flags_of(comparisons.method("sweep", "centralized-prefill@lr0.001"), "sweep", False)
    assert prefill["centralized"] is True and prefill["prefill"] is True and prefill["max-new-tokens"] == 96
    assert comparisons.method("methods", "centralized").flags.get("prefill") is None


def test_coding_commands_and_its_own_sweep(results) -> None:
    """The coding comparison (issue #51): the untrained pairs through `llm-envs eval` on the parallel and
    sequential ids (no writing flag), each trained method swept on its own, its rate chosen from its own
    sweep records only (the writing sweep of a method of the same name is not read)."""
    records, comparisons = sys.modules["resultskit.records"], sys.modules["resultskit.comparisons"]
    coding = {m.name: m for m in comparisons.COMPARISONS["coding"]}
    assert set(coding) == {"untrained-parallel", "untrained-sequential", "single", "magrpo", "magrpo-2turn"}
    for name, env in (("untrained-parallel", "coding/humaneval-v0"),
                      ("untrained-sequential", "coding/humaneval-sequential-v0")):
        argv = comparisons.command_of(coding[name], "coding", 1, quick=False, runs_dir=Path("runs"), model=None,
                                      threads=1)
        assert argv[:3] == ["eval", "--env", env] and "--max-source-words" not in argv
        assert "--sample" in argv and argv[argv.index("--seed") + 1] == "1"
        assert [argv[argv.index(f) + 1] for f in ("--num-problems", "--max-new-tokens", "--temperature")] == [
            "32", "256", "0.7"]
    sweep = {m.name for m in comparisons.COMPARISONS["coding-sweep"]}
    assert sweep == {comparisons.sweep_name(n, r) for n, rates in comparisons.CODING_SWEEP_RATES.items() for r in rates}
    two_turn = " ".join(comparisons.command_of(comparisons.method("coding-sweep", "magrpo-2turn@lr0.001"),
                                               "coding-sweep", 0, quick=False, runs_dir=Path("runs"), model=None,
                                               threads=1))
    assert "--env coding/humaneval-v0" in two_turn and "--num-turns 2" in two_turn
    assert "--learning-rate 0.001" in two_turn and "--num-validation-problems 32" in two_turn
    single = comparisons.command_of(coding["single"], "coding", 0, quick=False, runs_dir=Path("runs"), model=None,
                                threads=1)
    assert "coding/humaneval-single-v0" in single and single[single.index("--max-new-tokens") + 1] == "256"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        assert records.chosen_rate(out, "magrpo", "coding") is None
        for rate, val in zip(comparisons.CODING_SWEEP_RATES["magrpo"], (0.25, 0.5, 2.0)):
            path = records.record_path(out, "coding-sweep", comparisons.sweep_name("magrpo", rate), 0)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"validation": {"total": val}}))
        assert records.chosen_rate(out, "magrpo", "coding") == comparisons.CODING_SWEEP_RATES["magrpo"][2]
        assert records.chosen_rate(out, "magrpo") is None  # the writing sweep of MAGRPO has no record here
        assert records.missing_records(out, "coding-sweep").keys() == sweep - {
            comparisons.sweep_name("magrpo", r) for r in comparisons.CODING_SWEEP_RATES["magrpo"]}


def test_the_page_is_what_render_makes_of_the_records(results) -> None:
    """docs/results.md's generated sections (tables, tests, provenance, readings) are what ``render`` makes
    of the records in docs/results/: a record added, or a reading changed in code, without a render
    fails here."""
    page = results.PAGE.read_text(encoding="utf-8")
    texts, totals = results.sections(results.RECORDS, 3)
    assert results.render_page(page, texts) == page, "docs/results.md is stale: run `python bench/results.py render`"
    assert totals["runs"] < totals["records"]  # reused records and the sweep's seed-0 copies count once


def test_the_pages_hand_written_text_states_no_number(results) -> None:
    """Every number of docs/results.md is rendered from the records: outside the generated sections only
    code, commands, links, section and issue numbers and list markers carry digits."""
    import re

    text = re.sub(r"<!-- results:(\S+):begin.*?<!-- results:\1:end[^\n]*", "", results.PAGE.read_text(encoding="utf-8"),
                  flags=re.S)
    text = re.sub(r"`[^`]*`", "", re.sub(r"```.*?```", "", text, flags=re.S), flags=re.S)
    typed = []
    for line in text.splitlines():
        bare = re.sub(r"\]\([^)]*\)", "]", line)  # link targets
        bare = re.sub(r"^(#+ )?\d+\. ", "", bare)  # numbered headings and list items
        bare = re.sub(r"([Ss]ections?|Figure|#) ?\d+", "", bare)
        bare = re.sub(r"[A-Za-z_-]\d+", "", bare)  # names such as SmolLM2-135M
        if re.search(r"\d", bare):
            typed.append(line)
    assert typed == [], "numbers typed by hand in docs/results.md (render them from the records):\n" + "\n".join(typed)


def _record(method: str, seed: int, **fields) -> dict:
    return {"comparison": "cory", "method": method, "label": method.upper(), "seed": seed, "learner": method,
            "wall_s": 1.0, "load_average_1min": {"start": 0.0, "end": 0.0}, "finished": "now", "commit": None,
            "curve": {}, "eval": {}, "eval_before": {}, **fields}


def test_provenance_counts_unknown_apart_and_derives_the_sampler_from_git(results, tmp_path) -> None:
    reading = sys.modules["resultskit.provenance"]
    epyc = {"cpu": "AMD EPYC", "isa": ["avx2"], "dtype": "bfloat16", "threads": 1, "host": "a"}
    xeon = {**epyc, "cpu": "Intel Xeon", "host": "b"}
    one_and_unknown = [_record("ppo", 0, machine=epyc), _record("ppo", 1)]
    text = reading.provenance(one_and_unknown, tmp_path)
    assert "1 CPU kind: AMD EPYC (avx2) (1 runs), unknown (1 runs did not record it)" in text
    assert "one CPU kind" not in text  # a record without a machine is not a second machine, nor the same one
    two = reading.provenance([_record("ppo", 0, machine=epyc), _record("ppo", 1, machine=xeon)], tmp_path)
    assert "2 CPU kinds: AMD EPYC (avx2) (1 runs), Intel Xeon (avx2) (1 runs)" in two and "2 hosts" in two
    # A run shown twice (a reused record, the sweep's seed-0 copy) counts once.
    copy = _record("ppo", 2, machine=epyc, copied_from="cory/ppo__s0.json")
    assert "(1 distinct runs)" in reading.provenance([_record("ppo", 0, machine=epyc), copy], tmp_path)
    # The sampler, from the commit: the counter-based draw's own commit, one before it, one git does not know.
    first = subprocess.run(["git", "rev-list", "--max-parents=0", "HEAD"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()[0]
    draw = subprocess.run(["git", "rev-parse", reading.COUNTER_DRAW], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    assert reading.sampler_of(draw, tmp_path) == "counter-based"
    assert reading.sampler_of(first, tmp_path) == "earlier"
    assert reading.sampler_of("f" * 40, tmp_path) == reading.sampler_of(None, tmp_path) == "unknown"
    reading.save_samplers(tmp_path)
    assert json.loads((tmp_path / "samplers.json").read_text()) == {draw: "counter-based", first: "earlier"}


def test_a_non_finite_value_shows_in_the_tables_and_the_last_5_mean(results, tmp_path) -> None:
    """A NaN in a CORY curve's last iterations makes that seed's final mean NaN, counted in every cell
    (n and a mark), never averaged away; the tests skip a comparison they cannot compute."""
    page = sys.modules[results.render.__module__]
    curve = {f"agent_agent/{k}": [0.5] * 6 for k in ("task_reward", "kl", "combined")}
    broken = {**curve, "agent_agent/kl": [0.5] * 5 + [math.nan]}
    records = [_record("ppo", 0, curve=curve, eval={"total": 0.2}),
               _record("ppo", 1, curve=broken, eval={"total": 0.3})]
    summary = page.summarise("cory", records)
    assert summary["ppo"]["final"]["agent"]["kl"] == (0.5, 0.0, 1, 1)
    assert summary["ppo"]["final"]["agent"]["task_reward"] == (0.5, 0.0, 2, 0)
    table = page.tables("cory", summary, records, tmp_path)
    assert "| PPO | agent | 0.500 ± 0.000 (n=2) | 0.500 (n=1, ⚠ 1 non-finite) |" in table
    records_module = sys.modules[results.run_records.__module__]
    assert math.isnan(records_module._mean([1.0, math.nan])) and records_module._mean([1.0, 2.0]) == 1.5


def test_a_record_of_a_dirty_tree_keeps_its_diff(results, monkeypatch) -> None:
    records = sys.modules[results.run_records.__module__]
    monkeypatch.setattr(records, "_COMMIT", ["abc+dirty"])
    monkeypatch.setattr(records, "_DIFF", ["--- a/x\n+++ b/x\n"])
    m = results.method("magrpo", "untrained-parallel")
    record = records.make_record("magrpo", m, 0, ["eval", "--threads", "2"], '{"eval/total": 1.0}', 1.0, True, None,
                                 (0.0, 0.0), 1.0)
    assert record["commit"] == "abc+dirty" and record["diff"] == "--- a/x\n+++ b/x\n"
    # What decides its evaluation's episodes, kept so that a later paired test can check its premise.
    assert record["episodes"] == {"split": "eval", "first": 0, "seed": 0, **{
        k: record["flags"][k] for k in ("num-eval-problems", "eval-greedy", "temperature", "top-p", "top-k",
                                        "max-new-tokens", "max-source-words")}}
    assert record["machine"]["threads"] == 2 and len(record["machine"]["host"]) == 12
    monkeypatch.setattr(records, "_DIFF", [""])
    assert "diff" not in records.make_record("magrpo", m, 0, ["eval"], '{"eval/total": 1.0}', 1.0, True, None,
                                             (0.0, 0.0), 1.0)


def test_a_reading_states_what_its_records_show(results) -> None:
    """The reading of a comparison against a baseline is computed: the declared test (paired on seeds A and
    B share, the premise checked), the differences seed by seed, the intervals and the reading after the
    one correction over the section's comparisons (the rules themselves: tests/test_results_rules.py)."""
    reading = sys.modules["resultskit.significance"]

    def runs(name: str, totals: list[float]) -> list[dict]:
        return [_record(name, seed, label=name, eval={"total": t}, eval_before={"total": 1.0})
                for seed, t in enumerate(totals)]

    records = runs("team", [2.0, 2.5, 3.0]) + runs("a", [1.0, 1.4, 2.1]) + runs("b", [2.1, 2.4, 2.9]) + runs("c", [0.5])
    comparisons = reading.against("team", ["a", "b", "c"], test="paired")
    text = "\n".join(reading.against_baseline(records, comparisons))
    # team - a = (1.0, 1.1, 0.9): paired t = 1.0 / (0.1 / sqrt 3) = 17.3 on 2 df, p = 0.0033; x2 (2 tests).
    tested = reading.family_tests(records, comparisons)
    assert tested[0].test.p == pytest.approx(1.0 - tested[0].test.t / math.sqrt(2.0 + tested[0].test.t**2))
    assert tested[0].adjusted_p == pytest.approx(2 * tested[0].test.p)
    first = text.split("\n")[0]
    assert "**team above a** (eval total)" in first and "all 3 paired seeds (A - B: 1.000 / 1.100 / 0.900)" in first
    assert "paired test: A - B 1.000" in first and first.endswith("**holds**.")
    assert "above it on 2 of 3 paired seeds" in text.split("\n")[1] and "**inconclusive**" in text.split("\n")[1]
    # c has one seed: the pairing's premise fails (other seeds), and no test either way.
    assert "no test yet (3 + 1 seeds: a test needs two a side)" in text.split("\n")[2]
    table = "\n".join(reading.significance_table(records, comparisons))
    assert "one Bonferroni correction over the 2 tests of this table" in table  # c (one seed) has no test


def test_a_method_with_no_record_yet_is_named_by_its_own_comparisons_label(results) -> None:
    """Two comparisons name a method ``magrpo-2turn`` with different labels: a table row of the coding
    section for it, before any record exists, takes the coding comparison's label, not its name or the
    writing one's."""
    values = sys.modules["resultskit.values"]
    coding = [{"comparison": "coding", "method": "single", "label": "one coder", "seed": 0}]
    assert values.method_label(coding, "single") == "one coder"
    assert values.method_label(coding, "magrpo-2turn") == "MAGRPO pair, 2 turns (tests' feedback)"
    assert values.method_label([{"comparison": "magrpo", "method": "magrpo", "label": "x", "seed": 0}],
                               "magrpo-2turn") == "MAGRPO, 2 turns (env feedback)"
    assert values.method_label(coding, "no-such-method") == "no-such-method"
