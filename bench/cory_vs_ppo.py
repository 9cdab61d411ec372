"""CORY vs PPO on IMDB with the embedded SmolLM2-135M-Instruct: same budget, same seed.

PPO trains one adapter on ``sentiment/imdb-v0`` (the pioneer's prompt and reward); CORY trains two on
``sentiment/imdb-cory-v0`` (pioneer -> observer, collective reward, roles swapped every 5 iterations).
Both use the same PPO settings, iterations, batch size and seed. Writes

    docs/figures/cory_vs_ppo.png    task reward and KL per iteration (PPO, and each CORY model)
    docs/figures/cory_vs_ppo.json   settings, wall times, means over the last iterations, eval

    python bench/cory_vs_ppo.py                    # both runs, one after the other
    python bench/cory_vs_ppo.py --only ppo --threads 1 & python bench/cory_vs_ppo.py --only cory --threads 1
    python bench/cory_vs_ppo.py --plot-only        # then: figure and JSON from the two runs
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from agents.models import machine_description
from baselines.infra.metrics import read_metrics
from baselines.infra.plots import smooth
from baselines.learners import cory, ppo

FIGURES = Path(__file__).resolve().parent.parent / "docs" / "figures"
SETTINGS: dict[str, Any] = dict(
    num_iterations=15,
    batch_size=16,
    minibatch_size=16,
    num_ppo_epochs=4,
    min_new_tokens=4,
    max_new_tokens=16,
    learning_rate=5e-4,
    lora_rank=16,
    lora_alpha=32.0,
    init_kl_coef=0.3,
    num_eval_problems=16,
    checkpoint_every=0,
    tensorboard=False,
    seed=0,
)


def series(rows: list[dict[str, float]], name: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[name]) for r in rows if name in r and "charts/iteration" in r]
    return [p[0] for p in points], [p[1] for p in points]


def summarise(rows: list[dict[str, float]], model: str, last: int) -> dict[str, float]:
    out = {}
    for key in ("task_reward", "env_reward", "kl", "combined", "kl_coef"):
        _, values = series(rows, f"agent_{model}/{key}")
        out[f"{key}_last{last}"] = float(np.mean(values[-last:]))
        out[f"{key}_mean"] = float(np.mean(values))
    return out


def plot(runs: dict[str, Path], out: Path, smoothing: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    curves = [("PPO", runs["ppo"], "agent", "tab:red")] + [
        (f"CORY {m}", runs["cory"], m, color) for m, color in zip(cory.MODELS, ("tab:blue", "tab:green"))
    ]
    for label, run, model, color in curves:
        rows = read_metrics(run / "metrics.jsonl")
        for ax, key, title in zip(
            axes, ("task_reward", "kl", "combined"), ("task reward (own VADER sentiment)", "KL to base (nats)",
                                                     "task reward - eta * KL")
        ):
            steps, values = series(rows, f"agent_{model}/{key}")
            ax.plot(steps, values, color=color, alpha=0.25, linewidth=1)
            ax.plot(steps, smooth(values, smoothing), color=color, linewidth=2, label=label)
            ax.set_title(title)
            ax.set_xlabel("iteration")
            ax.grid(alpha=0.3)
    rows = read_metrics(runs["cory"] / "metrics.jsonl")
    steps, roles = series(rows, f"agent_{cory.MODELS[0]}/role")
    for ax in axes:
        for s, r in zip(steps, roles):
            if r == 1.0:  # model_0 is the observer: shade those iterations
                ax.axvspan(s - 0.5, s + 0.5, color="grey", alpha=0.08, linewidth=0)
    axes[0].legend(fontsize=8)
    fig.suptitle("CORY vs PPO, IMDB (SmolLM2-135M, LoRA); shaded: model_0 plays the observer")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (tests/test_docs_commands.py parses the docs' command lines with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", default="runs/cory_vs_ppo", help="where the two runs go")
    parser.add_argument("--iterations", type=int, default=SETTINGS["num_iterations"])
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--only", choices=["ppo", "cory"], default=None,
                        help="train one of the two (e.g. both at once in two processes with --threads 1)")
    parser.add_argument("--plot-only", action="store_true", help="redraw and summarise the finished runs")
    parser.add_argument("--last", type=int, default=5, help="summarise the last N iterations")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:<i> (default: a GPU when present)")
    return parser


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    settings = {**SETTINGS, "num_iterations": args.iterations, "threads": args.threads, "output_dir": args.output_dir,
                "device": args.device}
    configs = {
        "ppo": ppo.Config(env="sentiment/imdb-v0", run_name="ppo", **settings),
        "cory": cory.Config(env="sentiment/imdb-cory-v0", run_name="cory", swap_every=5, **settings),
    }
    runs = {name: c.run_dir() for name, c in configs.items()}
    if not args.plot_only:
        for name, config in configs.items():
            if args.only not in (None, name):
                continue
            t0 = time.perf_counter()
            result = (ppo.main if name == "ppo" else cory.main)(config)
            outcome = {
                "wall_s": round(time.perf_counter() - t0, 1),
                "eval_before": {k: v for k, v in result.items() if k.startswith("eval_before/")},
                "eval_after": {k: v for k, v in result.items() if k.startswith("eval/")},
            }
            (runs[name] / "outcome.json").write_text(json.dumps(outcome, indent=2))
        if args.only is not None:
            return
    json_path = FIGURES / "cory_vs_ppo.json"
    record: dict[str, Any] = {"settings": {k: v for k, v in settings.items() if k != "output_dir"}, "runs": {}}
    for name, models in (("ppo", ["agent"]), ("cory", list(cory.MODELS))):
        rows = read_metrics(runs[name] / "metrics.jsonl")
        record["runs"][name] = json.loads((runs[name] / "outcome.json").read_text())
        record["runs"][name]["models"] = {m: summarise(rows, m, args.last) for m in models}
        per_iteration = [r for r in rows if "charts/iteration" in r]
        seconds = [r["charts/s_per_iteration"] for r in per_iteration]
        record["runs"][name]["s_per_iteration_mean"] = float(np.mean(seconds))
    plot(runs, FIGURES / "cory_vs_ppo.png", smoothing=3)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({**record, "machine": machine_description("auto")}))


if __name__ == "__main__":
    main()
