"""MAGRPO iterations before and after the rollout engine, in one script: 2 agents (writing/xsum-v0),
1 problem x G=4 per iteration, 48 new tokens, temperature 0.7 / top-p 0.9, chat-template prompts of
about 40 tokens, 8 iterations, evaluation off, the embedded SmolLM2-135M-Instruct.

- ``before``: what the learners did until the engine: transformers' ``generate`` one agent at a time,
  fp32 base, the update on a whole turn at once (``--backend generate --dtype float32
  --micro-batch-tokens 0``).
- ``after``: today's defaults (``--backend auto``, the default dtype and token budget).

Each path runs ``llm-envs train magrpo`` in its own process (so each peak RSS is its own), the two
alternating ``--rounds`` times; the figures are medians over the rounds of each run's median seconds
per iteration (the first iteration, which pays one-off set-up, is left out). Prints one JSON object
on its last line.

    python bench/magrpo_iteration.py [--iterations 8] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHAPE = [
    "--env", "writing/xsum-v0", "--max-source-words", "12", "--num-problems", "1", "--num-generations", "4",
    "--max-new-tokens", "48", "--temperature", "0.7", "--top-p", "0.9", "--num-eval-problems", "0",
    "--checkpoint-every", "0", "--no-tensorboard", "--no-progress", "--overwrite",
]
PATHS = {
    "before": ["--backend", "generate", "--dtype", "float32", "--micro-batch-tokens", "0"],
    "after": [],
}

CHILD = """
import json, resource, sys
from baselines import magrpo
from baselines.common import read_metrics
import tyro
config = tyro.cli(magrpo.Config, args=sys.argv[1:])
magrpo.main(config)
rows = [r for r in read_metrics(config.run_dir() / "metrics.jsonl") if "charts/s_per_iteration" in r]
print(json.dumps({"s_per_iteration": [r["charts/s_per_iteration"] for r in rows],
                  "rollout_fraction": [r["charts/rollout_fraction"] for r in rows],
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run(path: str, iterations: int, out: Path) -> dict:
    args = [*SHAPE, "--num-iterations", str(iterations), "--output-dir", str(out), "--run-name", path, *PATHS[path]]
    proc = subprocess.run([sys.executable, "-c", CHILD, *args], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{path} run failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    import torch

    import llm_envs

    env = llm_envs.make("writing/xsum-v0", max_source_words=12, max_new_tokens=48)
    obs, _ = env.reset(seed=0)
    prompt_tokens = {a: int(o["attention_mask"].sum()) for a, o in obs.items()}
    runs: dict[str, list[dict]] = {p: [] for p in PATHS}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for path in PATHS:
                runs[path].append(run(path, args.iterations, Path(tmp)))
    result: dict[str, object] = {
        "shape": "2 agents, 1 problem x G=4, 48 new tokens, T 0.7 / top-p 0.9",
        "prompt_tokens": prompt_tokens,
        "iterations": args.iterations,
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
    }
    def median_of(records: list[dict], key: str) -> float:
        return round(statistics.median(statistics.median(r[key][1:]) for r in records), 2)

    for path, records in runs.items():
        result[path] = {
            "s_per_iteration": median_of(records, "s_per_iteration"),
            "rollout_fraction": median_of(records, "rollout_fraction"),
            "peak_rss_mb": round(max(r["peak_rss_mb"] for r in records)),
        }
    result["speedup"] = round(result["before"]["s_per_iteration"] / result["after"]["s_per_iteration"], 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
