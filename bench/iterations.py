"""Seconds per iteration of MAGRPO, PPO and CORY before and after the rollout engine, in one script,
each path in its own process (so each peak RSS is its own), on the embedded SmolLM2-135M-Instruct.

- ``before``: main as it was when the rollout-engine issue was opened: the commit before the engine
  (:data:`BEFORE_COMMIT`, checked out into a temporary git worktree and run with its own defaults:
  transformers' ``generate`` one agent at a time, a float32 base, PEFT's forward, separate scoring
  passes). ``--before flags`` runs today's code with the old choices switched back on instead
  (``--backend generate --dtype float32``, MAGRPO also ``--micro-batch-tokens 0``, glibc's default
  allocator settings): it isolates the engine and precision from the other changes since.
- ``after``: today's defaults.

Shapes: MAGRPO, 2 agents (writing/xsum-v0), 1 problem x G=4, 48 new tokens, temperature 0.7 / top-p
0.9, chat prompts of about 40 tokens, evaluation off. PPO (sentiment/imdb-v0) and CORY
(sentiment/imdb-cory-v0) with bench/cory_vs_ppo.py's settings: 16 episodes, 4 PPO epochs on one
minibatch of 16, 4-16 new tokens, evaluation off. The figure is the median over rounds of each run's
median seconds per iteration, the first iteration (one-off set-up) left out. Prints one JSON object on
its last line.

    python bench/iterations.py [--learners magrpo ppo cory] [--iterations 8] [--rounds 1]
                               [--before commit|flags]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMON = ["--checkpoint-every", "0", "--no-tensorboard", "--no-progress", "--num-eval-problems", "0"]
SHAPES = {
    "magrpo": [
        "--env", "writing/xsum-v0", "--max-source-words", "12", "--num-problems", "1", "--num-generations", "4",
        "--max-new-tokens", "48", "--temperature", "0.7", "--top-p", "0.9", "--overwrite",
    ],
    "ppo": [
        "--env", "sentiment/imdb-v0", "--batch-size", "16", "--minibatch-size", "16", "--num-ppo-epochs", "4",
        "--min-new-tokens", "4", "--max-new-tokens", "16", "--learning-rate", "5e-4",
    ],
    "cory": [
        "--batch-size", "16", "--minibatch-size", "16", "--num-ppo-epochs", "4", "--min-new-tokens", "4",
        "--max-new-tokens", "16", "--learning-rate", "5e-4",
    ],
}
BEFORE_COMMIT = "edff31a"
"""main just before the rollout engine (agents/engine.py) landed: the code the issue measured."""
BEFORE = {
    "magrpo": ["--backend", "generate", "--dtype", "float32", "--micro-batch-tokens", "0"],
    "ppo": ["--backend", "generate", "--dtype", "float32"],
    "cory": ["--backend", "generate", "--dtype", "float32"],
}

CHILD = """
import json, os, resource, sys
import baselines
if os.path.isdir(os.path.join(baselines.__path__[0], "learners")):
    from baselines.learners import cory, magrpo, ppo
    from baselines.infra.metrics import read_metrics
else:  # the tree before the engine: the learners and read_metrics at the package's top
    from baselines import cory, magrpo, ppo
    from baselines.common import read_metrics
import tyro
module = {"magrpo": magrpo, "ppo": ppo, "cory": cory}[sys.argv[1]]
config = tyro.cli(module.Config, args=sys.argv[2:])
module.main(config)
rows = [r for r in read_metrics(config.run_dir() / "metrics.jsonl") if "charts/s_per_iteration" in r]
print(json.dumps({"s_per_iteration": [r["charts/s_per_iteration"] for r in rows],
                  "rollout_fraction": [r["charts/rollout_fraction"] for r in rows],
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


@contextlib.contextmanager
def worktree(commit: str) -> Iterator[Path]:
    """A temporary git worktree of this repository at ``commit`` (removed afterwards)."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        made = subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=ROOT,
                              capture_output=True, text=True)
        if made.returncode != 0:  # no git, or a shallow clone without that commit
            raise SystemExit(f"cannot check out {commit} for the 'before' path ({made.stderr.strip()}); "
                             "fetch the history (git fetch --unshallow) or run with --before flags")
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)


def run(learner: str, path: str, iterations: int, out: Path, tree: Path | None = None, round_: int = 0) -> dict:
    """One child process: ``path`` "before" runs ``tree`` (a checkout of the old commit) with its own
    defaults, or, without a tree, today's code with the old choices (:data:`BEFORE`) switched back on.
    The child asks the tree's own ``baselines`` where its learners are, not the import system: an editable
    install's finder resolves a submodule the tree lacks (``baselines.learners``) from today's checkout.
    Each round gets its own run directory (a finished run leaves a checkpoint that a new run refuses to
    write over)."""
    extra = BEFORE[learner] if path == "before" and tree is None else []
    args = [*SHAPES[learner], *COMMON, "--num-iterations", str(iterations), "--output-dir", str(out),
            "--run-name", f"{learner}-{path}-{round_}", *extra]
    env = dict(os.environ)
    if path == "before":
        env["LLM_ENVS_TUNE_MALLOC"] = "0"
    cwd = ROOT
    if path == "before" and tree is not None:
        cwd = tree
        env["PYTHONPATH"] = os.pathsep.join([str(tree), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                          if p and Path(p).resolve() != ROOT]])
    proc = subprocess.run([sys.executable, "-c", CHILD, learner, *args], cwd=cwd, capture_output=True, text=True,
                          env=env)
    if proc.returncode != 0:
        how = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
        raise RuntimeError(f"{learner} {path} run failed ({how}):\n{proc.stderr[-3000:]}\n{proc.stdout[-1000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def median_of(records: list[dict], key: str) -> float:
    return round(statistics.median(statistics.median(r[key][1:]) for r in records), 2)


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (tests/test_docs_commands.py parses the docs' command lines with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--learners", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--paths", nargs="+", choices=["before", "after"], default=["before", "after"],
                        help="run only some paths (the speedup needs both)")
    parser.add_argument("--before", default="commit", choices=["commit", "flags"],
                        help=f"commit: main before the engine ({BEFORE_COMMIT}, a temporary git worktree); "
                             "flags: today's code with generate, float32 and glibc's allocator defaults")
    return parser


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    import torch

    from agents.models import machine_description

    result: dict[str, object] = {"iterations": args.iterations, "rounds": args.rounds,
                                 "threads": torch.get_num_threads(),
                                 "machine": machine_description("auto"),  # 'after'; 'before' runs float32
                                 "before": BEFORE_COMMIT if args.before == "commit" else "flags"}
    old = worktree(BEFORE_COMMIT) if args.before == "commit" and "before" in args.paths else contextlib.nullcontext()
    with tempfile.TemporaryDirectory() as tmp, old as tree:
        for learner in args.learners:
            runs: dict[str, list[dict]] = {path: [] for path in args.paths}
            for round_ in range(args.rounds):
                for path in runs:
                    runs[path].append(run(learner, path, args.iterations, Path(tmp), tree, round_))
            summary: dict[str, object] = {}
            for path, records in runs.items():
                summary[path] = {
                    "s_per_iteration": median_of(records, "s_per_iteration"),
                    "rollout_fraction": median_of(records, "rollout_fraction"),
                    "peak_rss_mb": round(max(r["peak_rss_mb"] for r in records)),
                }
            if len(runs) == 2:
                summary["speedup"] = round(
                    summary["before"]["s_per_iteration"] / summary["after"]["s_per_iteration"], 2
                )
            result[learner] = summary
            print(json.dumps({learner: summary}), file=sys.stderr, flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
