"""Generated planning/puzzle families: instances generated per second, and env steps per second.

Instances: train-split instances per second at each family's default (medium) difficulty on fresh
indices (what ``reset`` pays: eval-class rejection included, no cache hits), and the bare generator's
calls per second; medians over ``--repeats`` runs. The target is >= 10,000 instances/s for
plan-path and sudoku4.

Env steps: a fresh parallel env of each family on fresh train instances, one-turn episodes of
``reset`` + ``step`` with strings (the planner gives the reference answer, so the whole reward is
computed), in two settings:

- ``no_tool``: the tool's response is prose that does not parse as Python, so no program runs: the
  env's own cost (prompts, tokenization, reward, infos).
- ``with_tool``: the tool's response is the family's ``reference_program`` (BFS / backtracking), run
  in the sandbox every step: one sandboxed process per step.

Building families (``building/letters-v0``, ``building/house-v0``, default level): train instances per
second as above, and over the first ``--eval-instances`` (200) eval instances the oracle's reward
(:meth:`solve`, the maximum on every instance) and random commands' (rng seed 0: letters, as many random
in-bounds ``/setblock`` with each builder's own blocks as its budget; houses, ten random ``/fill`` rows
per builder with random blocks of the house), plus reward evaluations (simulation + score) per second.

Prints one JSON object (the last line of stdout), with the CPU model, its SIMD flags and the dtype
(pure Python: no tensors).

    python bench/procgen.py [--instances 2000] [--episodes 200] [--tool-episodes 20] [--repeats 5]
                            [--eval-instances 200] [--only building]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import llm_envs
from llm_envs.procgen import TRAIN_SEED_OFFSET
from llm_envs.tasks.building import ROLES
from llm_envs.tasks.planning import generate_plan_path
from llm_envs.tasks.puzzle import generate_sokoban, generate_sudoku

FAMILIES = {
    "plan-path": ("planning/plan-path-v0", lambda seed: generate_plan_path(seed, size=7, wall_fraction=0.3)),
    "sudoku4": ("puzzle/sudoku4-v0", lambda seed: generate_sudoku(seed, n=4, blanks=8)),
    "sudoku9": ("puzzle/sudoku9-v0", lambda seed: generate_sudoku(seed, n=9, blanks=44)),
    "sokoban": ("puzzle/sokoban-v0", lambda seed: generate_sokoban(seed, size=7, boxes=2, inner_walls=3, min_moves=8)),
}
BUILDING = {"letters": "building/letters-v0", "house": "building/house-v0"}
SLOW = {"sudoku9": 20, "sokoban": 10}  # these generate far fewer instances per run (divisor of --instances)
NOT_CODE = "I would search the board breadth-first and print the answer."


def instances_per_s(name: str, count: int, repeat: int, via_split: bool) -> float:
    """Generator calls per second on fresh seeds, or (``via_split``) train-split instances per second on
    fresh indices: what ``reset`` pays, eval-class rejection and caching included."""
    env_id, generate = FAMILIES[name]
    first = 10_000_000 * (repeat + 1)
    if via_split:
        train = llm_envs.make(env_id).task.problems("train")
        start = time.perf_counter()
        for index in range(first, first + count):
            train[index]
    else:
        start = time.perf_counter()
        for seed in range(TRAIN_SEED_OFFSET + first, TRAIN_SEED_OFFSET + first + count):
            generate(seed)
    return count / (time.perf_counter() - start)


def steps_per_s(env_id: str, episodes: int, with_tool: bool, repeat: int) -> float:
    """reset + step per second of a fresh env on fresh train instances (generated and solved before the
    clock starts, so this is the env's cost: prompts, tokenization, reward and, with the tool, its run)."""
    env = llm_envs.make(env_id, max_new_tokens=512)
    tool = env.task.reference_program if with_tool else NOT_CODE
    first = 1_000_000 * (repeat + 1) + (1000 if with_tool else 0)  # instances no other run has used
    indices = range(first, first + episodes)
    train = env.task.problems("train")
    answers = [env.task.solve(train[i]) for i in indices]
    start = time.perf_counter()
    for index, answer in zip(indices, answers):
        env.reset(options={"task_index": index})
        env.step({"tool": tool, "planner": answer})
    return episodes / (time.perf_counter() - start)


def cpu_info() -> dict:
    """The CPU model and the SIMD flags that matter for numeric code (from /proc/cpuinfo on Linux)."""
    model, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and model in ("", platform.machine(), platform.processor()):
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    wanted = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "fma")
                    flags = [f for f in value.split() if f in wanted]
    except OSError:
        pass
    return {"cpu": model, "isa": flags}


def random_commands(problem: dict, rng: random.Random) -> dict[str, str]:
    """Random in-bounds commands with each builder's own blocks (see the module docstring)."""
    X, Y, Z = problem["bounds"]
    out = {}
    for i, role in enumerate(ROLES):
        if "palettes" in problem:
            lines = [f"/setblock {rng.randrange(X)} {rng.randrange(Y)} 0 {rng.choice(problem['palettes'][i])}"
                     for _ in range(problem["budget"])]
        else:
            blocks = [b for b, _ in problem["resources"]]
            lines = []
            for _ in range(10):
                x, y, z = rng.randrange(X), rng.randrange(Y), rng.randrange(Z)
                lines.append(f"/fill {x} {y} {z} {rng.randrange(x, X)} {y} {rng.randrange(z, Z)} "
                             f"{rng.choice(blocks)}")
        out[role] = "\n".join(lines)
    return out


def building(name: str, instances: int, eval_instances: int, repeats: int) -> dict:
    """Train instances/s (median of ``repeats``), oracle and random rewards over the first eval instances,
    and reward evaluations per second (the oracle's commands)."""
    task = llm_envs.make(BUILDING[name]).task
    runs = []
    for repeat in range(repeats):
        train = task.problems("train")
        first = 10_000_000 * (repeat + 1)
        start = time.perf_counter()
        for index in range(first, first + instances):
            train[index]
        runs.append(instances / (time.perf_counter() - start))
    problems = [task.problems("eval")[i] for i in range(eval_instances)]
    rng = random.Random(0)
    answers = [task.solve(p) for p in problems]
    start = time.perf_counter()
    oracle = [task.reward(p, a)[0] for p, a in zip(problems, answers)]
    rewards_per_s = len(problems) / (time.perf_counter() - start)
    randoms = [task.reward(p, random_commands(p, rng))[0] for p in problems]
    return {"instances_per_s": round(statistics.median(runs), 1), "rewards_per_s": round(rewards_per_s, 1),
            "oracle_mean": round(statistics.fmean(oracle), 4), "oracle_min": round(min(oracle), 4),
            "random_mean": round(statistics.fmean(randoms), 4), "random_max": round(max(randoms), 4),
            "max_reward": task.max_reward, "eval_instances": len(problems)}


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (tests/test_docs_commands.py parses the docs' command lines with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, default=2000, help="instances per run (fewer for slow families)")
    parser.add_argument("--episodes", type=int, default=200, help="env steps per run without the tool program")
    parser.add_argument("--tool-episodes", type=int, default=20, help="env steps per run with the tool program")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--eval-instances", type=int, default=200, help="eval instances of the building families")
    parser.add_argument("--only", choices=["all", "building"], default="all",
                        help="building: only the building families (the others take minutes)")
    return parser


def main(argv: list[str] | None = None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("instances", "episodes", "tool_episodes", "repeats", "eval_instances"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")

    out: dict = {"instances_per_s": {}, "generator_calls_per_s": {}, "env_steps_per_s": {}, "building": {},
                 "repeats": args.repeats, "cores": os.cpu_count(), "python": platform.python_version(),
                 **cpu_info(), "dtype": "none (pure Python)"}
    for name in BUILDING:
        out["building"][name] = building(name, args.instances, args.eval_instances, args.repeats)
    if args.only == "building":
        print(json.dumps(out))
        return out
    for name in FAMILIES:
        count = max(1, args.instances // SLOW.get(name, 1))
        for key, via_split in (("instances_per_s", True), ("generator_calls_per_s", False)):
            runs = [instances_per_s(name, count, r, via_split) for r in range(args.repeats)]
            out[key][name] = round(statistics.median(runs), 1)
    for env_id, _ in FAMILIES.values():
        llm_envs.make(env_id).reset(seed=0)  # the tokenizer loaded before the clock starts
        plain = [steps_per_s(env_id, args.episodes, False, r) for r in range(args.repeats)]
        tool = [steps_per_s(env_id, args.tool_episodes, True, r) for r in range(args.repeats)]
        out["env_steps_per_s"][env_id] = {"no_tool": round(statistics.median(plain), 1),
                                          "with_tool": round(statistics.median(tool), 1)}
    out["target_met"] = all(out["instances_per_s"][n] >= 10_000 for n in ("plan-path", "sudoku4"))
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
