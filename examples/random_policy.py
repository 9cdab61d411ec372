"""A random policy on any registered env, in token mode: the smallest complete MARL loop.

Every step each acting agent samples one token id from its action space, restricted by the
``action_mask`` in its observation (PettingZoo's convention), so a finished agent steps the pad id
until the turn resolves. Works with both protocols: the parallel API (``env.step({agent: token})``)
and the AEC API (``env.agent_iter()`` / ``env.last()`` / ``env.step(token)``).

    python examples/random_policy.py --env-id writing/xsum-v0 --episodes 3
    python examples/random_policy.py --env-id sentiment/imdb-cory-v0 --protocol sequential
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import numpy as np

import llm_envs
from llm_envs.core.parallel import ParallelLLMEnv


def run(
    env_id: str,
    episodes: int = 3,
    protocol: str | None = None,
    max_new_tokens: int = 16,
    seed: int = 0,
    obs_format: str = "dict",
) -> list[dict[str, float]]:
    """Play ``episodes`` episodes with a masked uniform-random policy; the return of each agent per
    episode."""
    env = llm_envs.make(env_id, protocol=protocol, step_unit="token", obs_format=obs_format,
                        max_new_tokens=max_new_tokens)
    for i, agent in enumerate(env.possible_agents):
        env.action_space(agent).seed(seed + i)  # own stream per agent: same seed, same tokens otherwise

    def mask_of(obs: object) -> np.ndarray:
        # Discrete.sample wants an int8 mask; a flat observation holds it as int64.
        return env.split_flat(obs)["action_mask"].astype(np.int8) if obs_format == "flat" else obs["action_mask"]

    returns = []
    for episode in range(episodes):
        totals = dict.fromkeys(env.possible_agents, 0.0)
        if isinstance(env, ParallelLLMEnv):
            obs, _ = env.reset(seed=seed + episode)
            while env.agents:
                actions = {a: env.action_space(a).sample(mask_of(obs[a])) for a in env.agents}
                obs, rewards, _, _, _ = env.step(actions)
                for agent, reward in rewards.items():
                    totals[agent] += reward
        else:
            env.reset(seed=seed + episode)
            for agent in env.agent_iter():
                obs, reward, terminated, truncated, _ = env.last()
                totals[agent] += reward
                env.step(None if terminated or truncated else env.action_space(agent).sample(mask_of(obs)))
        returns.append(totals)
        print(f"episode {episode}: returns {totals}; responses "
              f"{ {a: r.text[:40] for a, r in env.history[-1].outputs.items()} }")
    return returns


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (tests/test_docs_commands.py parses the docs' command lines with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--env-id", default="writing/xsum-v0", help="a registered id (llm-envs list)")
    parser.add_argument("--episodes", type=int, default=3)
    parser.add_argument("--protocol", choices=["parallel", "sequential"], default=None,
                        help="default: the id's registered protocol")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--obs-format", choices=["dict", "flat"], default="dict")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: Sequence[str] | None = None) -> list[dict[str, float]]:
    parser = build_parser()
    args = parser.parse_args(argv)
    return run(args.env_id, args.episodes, args.protocol, args.max_new_tokens, args.seed, args.obs_format)


if __name__ == "__main__":
    main()
