"""The demo (``llm-envs train magrpo --preset demo``, what ``make demo`` runs) for a bounded number of iterations,
timed from its own metrics file: seconds an iteration (the first apart), its rollout and update parts, the
evaluations' and the whole run's seconds, and the peak GPU memory. Prints one JSON object on its last line.

    python bench/demo_step.py [--device cuda] [--iterations 4] [-- LEARNER FLAGS ...]

The run is the demo's command line in this process (so that the peak GPU memory is the run's) with
``--num-iterations``, ``--device``, a temporary ``--output-dir`` and ``--no-tensorboard --no-progress`` added;
flags after ``--`` go to the learner too (they win). Its model is the default one: on the GPU machine, the kit's
random-weight model of SmolLM2-135M's shape (``LLM_ENVS_CACHE``), whose rewards mean nothing. The iterations'
seconds are the learner's ``charts/s_per_iteration`` and ``charts/rollout_fraction``; the compiled update's
``charts/update_compile_s`` and ``charts/update_compiled_shapes``, when the learner logs them, are kept too (the
first iteration's, and the mean of the others).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def iteration_figures(rows: list[dict[str, float]]) -> dict[str, Any]:
    """Seconds an iteration from a run's metrics rows: the first iteration apart, then the median of the others
    with its rollout and update parts (each iteration's rollout share of its own seconds); the compiled
    update's ``charts/update_compile*`` as (first, mean of the others).

    >>> rows = [{"step": 0, "eval/reward": 0.1}, {"step": 1, "charts/s_per_iteration": 3.0,
    ...         "charts/rollout_fraction": 0.5, "charts/update_compile_s": 2.0}, {"step": 2,
    ...         "charts/s_per_iteration": 1.0, "charts/rollout_fraction": 0.25, "charts/update_compile_s": 0.0},
    ...         {"step": 3, "charts/s_per_iteration": 1.2, "charts/rollout_fraction": 0.25}]
    >>> figures = iteration_figures(rows)
    >>> figures["first_iteration_s"], figures["s_per_iteration"], figures["rollout_s"], figures["update_s"]
    (3.0, 1.1, 0.275, 0.825)
    >>> figures["update_compile"]
    {'update_compile_s': {'first': 2.0, 'mean_after': 0.0}}
    """
    steps = sorted((r for r in rows if "charts/s_per_iteration" in r), key=lambda r: r["step"])
    if not steps:
        return {"iterations": 0}
    later = steps[1:] or steps
    seconds = [r["charts/s_per_iteration"] for r in later]
    rollouts = [r["charts/s_per_iteration"] * r["charts/rollout_fraction"] for r in later]
    compiling: dict[str, dict[str, float | None]] = {}
    for key in sorted({k for r in steps for k in r if k.startswith("charts/update_compile")}):
        after = [r[key] for r in steps[1:] if key in r]
        compiling[key.removeprefix("charts/")] = {"first": steps[0].get(key),
                                                  "mean_after": round(statistics.fmean(after), 4) if after else None}
    s_per_it, rollout = statistics.median(seconds), statistics.median(rollouts)
    return {
        "iterations": len(steps),
        "first_iteration_s": round(steps[0]["charts/s_per_iteration"], 3),
        "s_per_iteration": round(s_per_it, 3),
        "rollout_s": round(rollout, 3),
        "update_s": round(s_per_it - rollout, 3),
        "s_per_iteration_all": [round(r["charts/s_per_iteration"], 3) for r in steps],
        "update_compile": compiling,
    }


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (tests/test_gpu_window.py parses the window's command lines with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:<i> (default: a GPU when present)")
    parser.add_argument("--iterations", type=int, default=4, help="the demo's iterations (its preset has 12)")
    parser.add_argument("learner", nargs=argparse.REMAINDER, help="more learner flags, after --")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    from agents.models import device_description, machine_description, resolve_device, resolve_dtype
    from baselines.infra import cli
    from baselines.infra.metrics import METRICS_FILE, read_metrics

    device = resolve_device(args.device)
    extra = args.learner[1:] if args.learner[:1] == ["--"] else args.learner
    with tempfile.TemporaryDirectory() as tmp:
        command = ["train", "magrpo", "--preset", "demo", "--num-iterations", str(args.iterations),
                   "--device", str(device), "--output-dir", tmp, "--no-tensorboard", "--no-progress", *extra]
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        stderr = io.StringIO()
        start = time.perf_counter()
        with contextlib.redirect_stderr(stderr):
            status = cli.main(command)
        wall = time.perf_counter() - start
        sys.stderr.write(stderr.getvalue())
        config = cli.parse_train_config("magrpo", command[2:])
        metrics = config.run_dir() / METRICS_FILE
        rows = read_metrics(metrics) if metrics.is_file() else []
    errors = [line for line in stderr.getvalue().splitlines() if "error:" in line]
    evaluations = sum(1 for r in rows if any(k.startswith("eval/") for k in r))
    print(json.dumps({
        "bench": "demo_step", "command": "llm-envs " + " ".join(c if c != tmp else "TMP" for c in command),
        "rc": status, "error": errors[-1] if errors else None, "wall_s": round(wall, 2),
        **iteration_figures(rows), "evaluations": evaluations,
        "problems": config.num_problems, "G": config.num_generations, "max_new_tokens": config.max_new_tokens,
        "num_eval_problems": config.num_eval_problems, "device": str(device),
        "peak_gpu_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None,
        "machine": {**machine_description(resolve_dtype(config.dtype, device)), **device_description(device)},
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
