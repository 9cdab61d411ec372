"""Seeded tiny runs of every learner, and a diff of two sets of them: evidence that a refactor left the
learners' behaviour unchanged.

    # run the learners of the tree on PYTHONPATH (e.g. an export of main, then this branch):
    git archive main | tar -x -C /tmp/main-tree
    PYTHONPATH=/tmp/main-tree python scripts/compare_runs.py run /tmp/runs-main
    PYTHONPATH=. python scripts/compare_runs.py run /tmp/runs-branch
    # compare them: metrics.jsonl line by line (wall-clock fields left out), samples.jsonl, and the
    # saved adapters, value heads and optimizer states bit for bit
    python scripts/compare_runs.py diff /tmp/runs-main /tmp/runs-branch

The runs use a 2-layer Llama with random weights over the default tokenizer (tests/tiny_models.py),
built from a fixed seed, and only the config fields that both trees know. ``diff`` prints one line
per run and, last, one JSON object ``{"runs": n, "identical": n, "differences": [...]}``; its exit
status is 1 when any run differs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TIMING = ("charts/s_per_iteration", "charts/rollout_fraction", "charts/samples_per_s", "charts/responses_per_s",
          "charts/expert_s")
"""Wall-clock metrics: they differ between any two runs."""

TINY = dict(tensorboard=False, progress=False, learning_rate=1e-2, lora_rank=4, lora_alpha=8.0)
WRITING = dict(max_source_words=20, temperature=1.0, top_p=1.0, top_k=0)
SENTIMENT = dict(batch_size=4, minibatch_size=2, num_ppo_epochs=2, min_new_tokens=3, max_new_tokens=6)
RUNS: dict[str, tuple[str, dict[str, Any]]] = {
    # name: (learner, config fields on top of TINY and the model)
    "magrpo": ("magrpo", dict(
        WRITING, num_iterations=3, num_problems=2, num_generations=2, max_new_tokens=12, num_epochs=2,
        kl_coef=0.1, num_eval_problems=1, eval_every=1, samples_every=1, checkpoint_every=0)),
    "magrpo-2turn": ("magrpo", dict(
        WRITING, num_turns=2, num_iterations=2, num_problems=2, num_generations=2, max_new_tokens=8,
        baseline="rloo", normalize_std=True, num_eval_problems=1, checkpoint_every=0)),
    "magrpo-tree": ("magrpo", dict(
        WRITING, num_turns=2, rollout="tree", num_iterations=2, num_problems=1, num_generations=2,
        max_new_tokens=8, num_eval_problems=0, checkpoint_every=0)),
    "ppo": ("ppo", dict(
        SENTIMENT, env="sentiment/imdb-v0", num_iterations=3, num_eval_problems=2, eval_every=2, samples_every=1,
        checkpoint_every=0)),
    "ppo-cory-env": ("ppo", dict(
        SENTIMENT, env="sentiment/imdb-cory-v0", num_iterations=2, num_eval_problems=2, adaptive_kl=False,
        checkpoint_every=0)),
    "cory": ("cory", dict(SENTIMENT, num_iterations=3, swap_every=1, num_eval_problems=2, checkpoint_every=0)),
    "maac": ("maac", dict(
        WRITING, num_iterations=2, num_problems=2, num_generations=2, max_new_tokens=8, num_eval_problems=1)),
}


def model_dir(out: Path) -> str:
    """The tiny model, saved once under ``out/model`` (the same weights in every tree: a fixed seed)."""
    path = out / "model"
    if not (path / "config.json").is_file():
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from tiny_models import tiny_model

        from llm_envs.tokenizers import load_tokenizer

        tok = load_tokenizer(None)
        tiny_model(tok, seed=0, extra_eos=range(1000, 2500)).save_pretrained(path)
        tok.save_pretrained(path)
    return str(path)


def cmd_run(args: argparse.Namespace) -> int:
    import importlib

    import torch

    torch.set_num_threads(1)  # the same float reductions in both trees
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    model = model_dir(out)
    import baselines

    print(f"learners from {Path(baselines.__file__).parent}", flush=True)
    for name, (learner, fields) in RUNS.items():
        if args.only and name not in args.only:
            continue
        module = importlib.import_module(f"baselines.learners.{learner}")
        config = module.Config(**{**TINY, **fields, "model": model, "output_dir": str(out), "run_name": name})
        module.main(config)
        print(f"{name}: done", flush=True)
    return 0


def run_files(run_dir: Path) -> dict[str, Any]:
    """What a run left: metrics without wall-clock fields, transcripts, and every checkpoint tensor."""
    import torch
    from safetensors.torch import load_file

    metrics = [
        {k: v for k, v in json.loads(line).items() if k not in TIMING}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()
    ]
    samples_path = run_dir / "samples.jsonl"
    samples = samples_path.read_text().splitlines() if samples_path.is_file() else []
    checkpoints = run_dir / "checkpoints"
    step = (checkpoints / "latest").read_text().strip()
    tensors = {f"{p.name}:{k}": t for p in sorted((checkpoints / step / "policy").glob("*.safetensors"))
               for k, t in load_file(str(p)).items()}
    optimizers = torch.load(checkpoints / step / "optimizers.pt", weights_only=True)
    for agent, state in optimizers.items():
        for index, values in state["state"].items():
            for key, value in values.items():
                tensors[f"optimizer:{agent}:{index}:{key}"] = value
    return {"metrics": metrics, "samples": samples, "tensors": tensors}


def compare(a: Path, b: Path) -> list[str]:
    import torch

    left, right = run_files(a), run_files(b)
    problems = []
    if len(left["metrics"]) != len(right["metrics"]):
        problems.append(f"{len(left['metrics'])} vs {len(right['metrics'])} metric lines")
    for i, (x, y) in enumerate(zip(left["metrics"], right["metrics"])):
        if x != y:
            keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
            problems.append(f"metrics line {i + 1} differs in {keys[:6]}")
    if left["samples"] != right["samples"]:
        problems.append("samples.jsonl differs")
    if sorted(left["tensors"]) != sorted(right["tensors"]):
        problems.append("different checkpoint tensors")
    else:
        for key, tensor in left["tensors"].items():
            if not torch.equal(tensor, right["tensors"][key]):
                problems.append(f"checkpoint tensor {key} differs")
    return problems


def cmd_diff(args: argparse.Namespace) -> int:
    a, b = Path(args.a), Path(args.b)
    names = [n for n in RUNS if (a / n / "metrics.jsonl").is_file() or (b / n / "metrics.jsonl").is_file()]
    differences, identical = [], 0
    for name in names:
        if not ((a / name / "metrics.jsonl").is_file() and (b / name / "metrics.jsonl").is_file()):
            problems = ["missing in one of the two directories"]
        else:
            problems = compare(a / name, b / name)
        print(f"{name}: {'identical' if not problems else '; '.join(problems)}")
        identical += not problems
        differences += [f"{name}: {p}" for p in problems]
    print(json.dumps({"runs": len(names), "identical": identical, "differences": differences}))
    return 1 if differences else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run every learner's tiny seeded run into OUT")
    p.add_argument("out")
    p.add_argument("--only", nargs="*", default=None, help=f"run names (default: all of {list(RUNS)})")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("diff", help="compare the runs of two OUT directories")
    p.add_argument("a")
    p.add_argument("b")
    p.set_defaults(func=cmd_diff)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
