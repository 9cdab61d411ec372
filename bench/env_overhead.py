"""Env overhead: reset+step per second with random token actions, reward included, per env id.

Prints JSON. For every env that builds offline it reports the median over ``--repeats`` runs of
``--episodes`` episodes of: episodes per second (reset + one step of every agent per turn, reward
included), and the ratio of the env's time to a baseline that does only the unavoidable work of one
episode by hand (decode each agent's response ids and call the task's reward on the texts). The
ratio is measured in the same run, so it is robust to the machine's noise; absolute rates are not.

It also reports token mode (``step_unit="token"``, one token per agent per step, dict observations
with the action mask): steps per second over whole episodes in which every agent writes
``--max-new-tokens`` random tokens (so each turn takes that many steps), reward included, and the
same with ``obs_format="flat"``.

    python bench/env_overhead.py [--episodes 50] [--repeats 5] [--max-new-tokens 64] [--ids writing/xsum-v0]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import llm_envs
from agents.models import machine_description
from llm_envs.core.parallel import ParallelLLMEnv
from llm_envs.data import DatasetUnavailableError


def random_ids(env, rng: np.random.Generator) -> np.ndarray:
    ids = rng.integers(0, env.vocab_size, size=env.max_new_tokens)
    for stop in env.stop_token_ids:
        ids[ids == stop] = 1 if stop != 1 else 0
    return ids.astype(np.int64)


def run_env(env, episodes: int, rng: np.random.Generator) -> float:
    start = time.perf_counter()
    for ep in range(episodes):
        if isinstance(env, ParallelLLMEnv):
            env.reset(seed=ep)
            while env.agents:
                env.step({a: random_ids(env, rng) for a in env.agents})
        else:
            env.reset(seed=ep)
            for _agent in env.agent_iter():
                _, _, term, trunc, _ = env.last()
                env.step(None if term or trunc else random_ids(env, rng))
    return time.perf_counter() - start


def random_token(env, rng: np.random.Generator, obs) -> int:
    """A random non-stop token, or the pad id when the observation's action mask allows only that."""
    mask = env.split_flat(obs)["action_mask"] if env.obs_format == "flat" else obs["action_mask"]
    if mask.sum() == 1:  # the agent's response has ended
        return env.pad_token_id
    token = int(rng.integers(0, env.vocab_size))
    return 1 if token in env.stop_token_ids else token


def run_token_env(env, episodes: int, rng: np.random.Generator) -> tuple[float, int]:
    """(seconds, env steps) for ``episodes`` token-mode episodes of random non-stop tokens."""
    steps = 0
    start = time.perf_counter()
    for ep in range(episodes):
        if isinstance(env, ParallelLLMEnv):
            obs, _ = env.reset(seed=ep)
            while env.agents:
                obs, *_ = env.step({a: random_token(env, rng, obs[a]) for a in env.agents})
                steps += 1
        else:
            env.reset(seed=ep)
            for _agent in env.agent_iter():
                obs, _, term, trunc, _ = env.last()
                env.step(None if term or trunc else random_token(env, rng, obs))
                steps += 1
    return time.perf_counter() - start, steps


def token_mode_results(env_id: str, args: argparse.Namespace) -> dict[str, float]:
    out = {}
    for fmt in ("dict", "flat"):
        env = llm_envs.make(env_id, max_new_tokens=args.max_new_tokens, step_unit="token", obs_format=fmt)
        run_token_env(env, 1, np.random.default_rng(0))  # warm caches
        rates = []
        for r in range(args.repeats):
            seconds, steps = run_token_env(env, args.token_episodes, np.random.default_rng(r))
            rates.append(steps / seconds)
        out[f"token_{fmt}_steps_per_s_median"] = round(statistics.median(rates), 1)
    return out


def run_baseline(env, episodes: int, rng: np.random.Generator) -> float:
    """Decode + reward by hand, the work no env can avoid."""
    tok = env._tok.tokenizer
    problems = env.task.problems("train")
    start = time.perf_counter()
    for ep in range(episodes):
        problem = problems[ep % len(problems)]
        for _ in range(env.num_turns):
            texts = {
                a: tok.decode(random_ids(env, rng).tolist(), skip_special_tokens=True) for a in env.possible_agents
            }
            env.task.reward(problem, texts)
    return time.perf_counter() - start


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (tests/test_docs_commands.py parses the docs' command lines with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--token-episodes", type=int, default=5, help="episodes per repeat in token mode")
    parser.add_argument("--ids", nargs="*", default=None, help="env ids (default: every registered id)")
    return parser


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()

    results, skipped = {}, {}
    for env_id in args.ids or llm_envs.list_envs():
        try:
            env = llm_envs.make(env_id, max_new_tokens=args.max_new_tokens)
            env.reset(seed=0)
        except DatasetUnavailableError as err:
            skipped[env_id] = str(err).split("\n")[0]
            continue
        run_env(env, 2, np.random.default_rng(0))  # warm caches
        env_times, base_times = [], []
        for r in range(args.repeats):
            env_times.append(run_env(env, args.episodes, np.random.default_rng(r)))
            base_times.append(run_baseline(env, args.episodes, np.random.default_rng(r)))
        ratios = [e / b for e, b in zip(env_times, base_times)]
        results[env_id] = {
            "protocol": "parallel" if isinstance(env, ParallelLLMEnv) else "sequential",
            "agents": len(env.possible_agents),
            "episodes_per_s_median": round(args.episodes / statistics.median(env_times), 1),
            "agent_steps_per_s_median": round(
                args.episodes * len(env.possible_agents) * env.num_turns / statistics.median(env_times), 1
            ),
            "ratio_env_to_decode_plus_reward_median": round(statistics.median(ratios), 3),
            **token_mode_results(env_id, args),
        }
        print(f"{env_id}: {results[env_id]}", file=sys.stderr)
    print(json.dumps({
        "benchmark": "env_overhead",
        "settings": vars(args),
        "machine": {**machine_description(None), "python": platform.python_version(), "cpus": os.cpu_count()},
        "results": results,
        "skipped_no_data_offline": skipped,
    }))


if __name__ == "__main__":
    main()
