"""Generated planning/puzzle families: instances generated per second, and env steps per second.

Instances: each family's generator at its default (medium) difficulty on fresh train seeds (the env's
instance cache bypassed), the median over ``--repeats`` runs. The target is >= 10,000 instances/s
for plan-path and sudoku4.

Env steps: a parallel env of each registered id, one-turn episodes of ``reset`` + ``step`` with
strings (the planner gives the reference answer, so the whole reward is computed), in two settings:

- ``no_tool``: the tool's response is prose that does not parse as Python, so no program runs: the
  env's own cost (prompts, tokenization, reward, infos).
- ``with_tool``: the tool's response is the family's ``reference_program`` (BFS / backtracking), run
  in the sandbox every step: one sandboxed process per step.

Prints one JSON object (the last line of stdout).

    python bench/procgen.py [--instances 2000] [--episodes 200] [--tool-episodes 20] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import llm_envs
from llm_envs.procgen import TRAIN_SEED_OFFSET
from llm_envs.tasks.planning import generate_plan_path
from llm_envs.tasks.puzzle import generate_sokoban, generate_sudoku

GENERATORS = {
    "plan-path": lambda seed: generate_plan_path(seed, size=7, wall_fraction=0.3),
    "sudoku4": lambda seed: generate_sudoku(seed, n=4, blanks=8),
    "sudoku9": lambda seed: generate_sudoku(seed, n=9, blanks=44),
    "sokoban": lambda seed: generate_sokoban(seed, size=7, boxes=2, inner_walls=3, min_moves=8),
}
SLOW = {"sudoku9": 20, "sokoban": 10}  # these generate far fewer instances per run (divisor of --instances)
ENV_IDS = ["planning/plan-path-v0", "puzzle/sudoku4-v0", "puzzle/sudoku9-v0", "puzzle/sokoban-v0"]
NOT_CODE = "I would search the board breadth-first and print the answer."


def instances_per_s(name: str, count: int, repeat: int) -> float:
    generate = GENERATORS[name]
    start_seed = TRAIN_SEED_OFFSET + 10_000_000 * (repeat + 1)  # fresh seeds every run
    start = time.perf_counter()
    for seed in range(start_seed, start_seed + count):
        generate(seed)
    return count / (time.perf_counter() - start)


def steps_per_s(env_id: str, episodes: int, with_tool: bool, repeat: int) -> float:
    env = llm_envs.make(env_id, max_new_tokens=512)
    tool = env.task.reference_program if with_tool else NOT_CODE
    # Instances generated (and reference answers solved) before timing: this measures the env.
    seeds = [repeat * 100_000 + k for k in range(episodes)]
    answers = []
    for seed in seeds:
        env.reset(seed=seed)
        answers.append(env.task.solve(env.problem))
    start = time.perf_counter()
    for seed, answer in zip(seeds, answers):
        env.reset(seed=seed)
        env.step({"tool": tool, "planner": answer})
    return episodes / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=2000, help="instances per run (fewer for slow families)")
    parser.add_argument("--episodes", type=int, default=200, help="env steps per run without the tool program")
    parser.add_argument("--tool-episodes", type=int, default=20, help="env steps per run with the tool program")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    for name in ("instances", "episodes", "tool_episodes", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")

    out: dict = {"instances_per_s": {}, "env_steps_per_s": {}, "repeats": args.repeats,
                 "cores": os.cpu_count(), "python": platform.python_version()}
    for name in GENERATORS:
        count = max(1, args.instances // SLOW.get(name, 1))
        runs = [instances_per_s(name, count, r) for r in range(args.repeats)]
        out["instances_per_s"][name] = round(statistics.median(runs), 1)
    for env_id in ENV_IDS:
        llm_envs.make(env_id).reset(seed=0)  # tokenizer loaded, caches warm
        plain = [steps_per_s(env_id, args.episodes, False, r) for r in range(args.repeats)]
        tool = [steps_per_s(env_id, args.tool_episodes, True, r) for r in range(args.repeats)]
        out["env_steps_per_s"][env_id] = {"no_tool": round(statistics.median(plain), 1),
                                          "with_tool": round(statistics.median(tool), 1)}
    out["target_met"] = all(out["instances_per_s"][n] >= 10_000 for n in ("plan-path", "sudoku4"))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
