"""The ``llm-envs`` command line: list, demo, plot, train magrpo (tiny local model) and eval of its run."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from baselines.cli import main


def test_list(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "writing/xsum-v0" in out and "Default env" in out


def test_scripted_demo_still_runs(capsys):
    assert main(["demo", "--episodes", "1"]) == 0
    assert "mean joint reward" in capsys.readouterr().out


def write_metrics(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_plot(tmp_path, capsys):
    rows = [
        {"step": s, "reward/total": 0.5 + 0.1 * s, "reward/structure": 0.5, "reward/length": 0.1 * s,
         "losses/pg_loss": 0.01}
        for s in range(1, 8)
    ]
    rows.insert(0, {"step": 0, "eval/total": 0.4, "eval/structure": 0.5, "eval/length": 0.0})
    path = write_metrics(tmp_path / "metrics.jsonl", rows)
    assert main(["plot", str(tmp_path), "--output", str(tmp_path / "curves.png")]) == 0
    png = tmp_path / "curves.png"
    assert capsys.readouterr().out.strip() == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert main(["plot", str(path)]) == 0 and (tmp_path / "learning_curves.png").is_file()


def test_plot_bad_input(tmp_path, capsys):
    assert main(["plot", str(tmp_path / "missing")]) == 2
    assert "no metrics file" in capsys.readouterr().err
    write_metrics(tmp_path / "metrics.jsonl", [{"step": 1, "losses/pg_loss": 0.1}])
    assert main(["plot", str(tmp_path)]) == 2
    assert "no reward/<component> metrics" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\nnot json\n{"step": 2}\n')
    assert main(["plot", str(tmp_path)]) == 2
    assert "metrics.jsonl:2 is not valid JSON" in capsys.readouterr().err


def test_train_magrpo_then_eval(tiny_model_dir, tmp_path, capsys):
    args = [
        "train", "magrpo", "--model", tiny_model_dir, "--max-source-words", "20", "--num-iterations", "1",
        "--num-generations", "2", "--max-new-tokens", "24", "--temperature", "1.0", "--top-p", "1.0",
        "--top-k", "0", "--num-eval-problems", "1", "--output-dir", str(tmp_path), "--run-name", "cli",
        "--no-tensorboard", "--no-progress", "--lora-rank", "4",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "before" in out and "after" in out and "plot:" in out
    run_dir = tmp_path / "cli"
    assert (run_dir / "learning_curves.png").is_file() and (run_dir / "checkpoints" / "latest").is_file()

    assert main(["eval", "--checkpoint", str(run_dir), "--num-problems", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["env"] == "writing/xsum-v0" and result["greedy"] is True
    assert 0.0 <= result["eval/total"] <= 3.0 and "eval/structure" in result


def test_train_bad_flags(capsys):
    assert main(["train", "magrpo", "--preset", "nope"]) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err
    # tyro reports the config's own check (which quotes the value) and exits with status 2.
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "magrpo", "--num-generations", "1"])
    assert exit_info.value.code == 2 and "num_generations=1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "sac"])  # not a learner: argparse rejects the choice


def test_iac_is_the_ppo_learner(capsys):
    # IAC (the reference's name for independent actor-critic) runs baselines.ppo: its flags, its checks.
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "iac", "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and "llm-envs train iac" in out and "--vf-coef" in out
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "iac", "--vf-coef", "-1"])
    assert exit_info.value.code == 2 and "vf_coef" in capsys.readouterr().err
