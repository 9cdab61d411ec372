"""The ``llm-envs`` command line: list, demo, plot, train magrpo (tiny local model) and eval of its run."""

from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from baselines.infra.cli import main


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
    assert f"report: {run_dir / 'report.html'}" in out and (run_dir / "report.html").is_file()

    # --device and --dtype as the learners take them (README "On a GPU").
    eval_args = ["eval", "--checkpoint", str(run_dir), "--num-problems", "2", "--device", "cpu", "--dtype", "float32"]
    assert main(eval_args) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["env"] == "writing/xsum-v0" and result["greedy"] is True
    assert 0.0 <= result["eval/total"] <= 3.0 and "eval/structure" in result


def one_error_line(capsys) -> str:
    """The one error line on stderr (transformers may draw a weight-loading progress bar there too)."""
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if ": error: " in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_train_bad_flags(capsys):
    assert main(["train", "magrpo", "--preset", "nope"]) == 2
    assert "unknown preset 'nope'" in capsys.readouterr().err
    # Bad flags exit with status 2 as argparse's errors do, with one line: the config's own check (which
    # quotes the value), a value that does not parse, an unknown flag, an unknown learner.
    for argv, expected in [
        (["train", "magrpo", "--num-generations", "1"], "num_generations=1 leaves a group of one"),
        (["train", "ppo", "--learning-rate", "fast"], "Error parsing --learning-rate"),
        (["train", "cory", "--no-such-flag", "1"], "Unrecognized options: --no-such-flag"),
        (["train", "sac"], "invalid choice: 'sac'"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        line = one_error_line(capsys)
        assert exit_info.value.code == 2 and expected in line, line
        assert line.startswith(f"llm-envs train{' ' + argv[1] if argv[1] != 'sac' else ''}: error: "), line
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "magrpo", "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and "--num-generations" in out
    # The learner's own docstring, not the deprecated path's "Moved to ..." (baselines/_moved.py).
    assert "Moved to" not in out and "MAGRPO" in out.split("╭")[0], out[:400]


@pytest.mark.parametrize("name", ["magrpo", "ppo", "maac", "cory", "madpo", "marlhf"])
def test_python_m_learner_is_llm_envs_train(name, monkeypatch):
    """``python -m baselines.learners.<name>`` (and ``torchrun -m``) runs ``llm-envs train <name>`` with its
    flags: the same config, errors and the report.html at the end (test_train_magrpo_then_eval)."""
    import importlib.util
    import runpy
    import sys

    calls = []
    monkeypatch.setattr("baselines.infra.cli.main", lambda argv: calls.append(argv) or 0)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--num-iterations", "1"])
    # The module's file run as `__main__` (what `python -m` does): run_path compiles the source itself, where
    # run_module would take the loader of pytest's assertion rewriter, which claims the package's modules when
    # the editable install's egg-info (with our pytest11 plugin) sits in the working folder, and has no get_code.
    path = importlib.util.find_spec(f"baselines.learners.{name}").origin
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(path, run_name="__main__")
    assert exit_info.value.code == 0 and calls == [["train", name, "--num-iterations", "1"]]


def test_errors_are_one_line_and_debug_shows_the_traceback(tmp_path, capsys):
    assert main(["train", "magrpo", "--env", "nope/nope-v0", "--output-dir", str(tmp_path)]) == 2
    line = one_error_line(capsys)
    assert line.startswith("llm-envs train magrpo: error: Unknown env id 'nope/nope-v0'.")
    assert line.rstrip().endswith("(--debug shows the traceback)")
    with pytest.raises(KeyError, match="nope/nope-v0"):
        main(["train", "magrpo", "--env", "nope/nope-v0", "--output-dir", str(tmp_path), "--debug"])
    assert main(["eval", "--checkpoint", str(tmp_path / "missing")]) == 2
    assert "no checkpoint found at" in one_error_line(capsys)
    assert main(["eval", "--num-problems", "1", "--dtype", "float8"]) == 2
    assert "dtype must be None, 'auto', one of" in one_error_line(capsys)
    assert main(["train", "magrpo", "--resume", "--output-dir", str(tmp_path)]) == 2
    assert "nothing to resume" in one_error_line(capsys)
    step = tmp_path / "run" / "checkpoints" / "step_000001"
    step.mkdir(parents=True)
    (step / "trainer.json").write_text("{ torn")
    assert main(["eval", "--checkpoint", str(step)]) == 2
    assert "corrupt checkpoint file" in one_error_line(capsys)


def test_resume_falls_back_to_the_newest_intact_checkpoint(tiny_model_dir, tmp_path, capsys):
    args = [
        "train", "magrpo", "--model", tiny_model_dir, "--max-source-words", "20", "--num-generations", "2",
        "--max-new-tokens", "8", "--num-eval-problems", "0", "--output-dir", str(tmp_path), "--run-name", "r",
        "--no-tensorboard", "--no-progress", "--lora-rank", "4", "--checkpoint-every", "1",
    ]
    assert main([*args, "--num-iterations", "2"]) == 0
    root = tmp_path / "r" / "checkpoints"
    assert sorted(p.name for p in root.glob("step_*")) == ["step_000001", "step_000002"]
    (root / "step_000002" / "policy" / "brief.adapter.safetensors").write_bytes(b"damaged")
    capsys.readouterr()
    assert main([*args, "--num-iterations", "3", "--resume"]) == 0
    warning = [line for line in capsys.readouterr().err.splitlines() if line.startswith("llm-envs: warning:")]
    assert len(warning) == 1 and "resuming from step_000001 (step 1)" in warning[0]
    assert "skipped damaged step_000002" in warning[0] and "brief.adapter.safetensors" in warning[0]
    trainer = json.loads((root / "step_000003" / "trainer.json").read_text())
    assert trainer["step"] == 3
    from baselines.infra.metrics import read_metrics

    assert [r["step"] for r in read_metrics(tmp_path / "r" / "metrics.jsonl")] == [1, 2, 3]
    for name in ("step_000002", "step_000003"):
        (root / name / "optimizers.pt").write_bytes(b"damaged")
    assert main([*args, "--num-iterations", "4", "--resume"]) == 2
    line = one_error_line(capsys)
    assert "no checkpoint of" in line and "step_000003: corrupt checkpoint file" in line
    # A checkpoint of another config is not damage: no fallback, the mismatch is the error.
    (root / "step_000003" / "optimizers.pt").unlink()
    assert main([*args, "--num-iterations", "4", "--resume", "--learning-rate", "0.5"]) == 2
    line = one_error_line(capsys)
    assert "different config (learning_rate" in line and "no checkpoint of" not in line


def test_iac_is_the_ppo_learner(capsys):
    # IAC (the reference's name for independent actor-critic) runs baselines.learners.ppo: its flags, its checks.
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "iac", "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and "llm-envs train iac" in out and "--vf-coef" in out
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "iac", "--vf-coef", "-1"])
    assert exit_info.value.code == 2 and "vf_coef" in one_error_line(capsys)
