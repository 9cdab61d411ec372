"""Tianshou's DQN on an llm_envs env in token mode, through Tianshou's PettingZoo wrapper (the AEC form): each
learning role has its own Q-network over the next token, and the roles that do not learn pick random tokens
among those their ``action_mask`` allows.

Tianshou (2.x) takes the AEC API (``PettingZooEnv``): sequential ids as they are (CORY's pioneer, then the
observer), parallel ids through ``llm_envs.make_aec`` (PettingZoo's ``parallel_to_aec``). Token mode is its
route: one ``Discrete(V)`` action a step, and the ``action_mask`` becomes the wrapper's ``mask``, which its DQN
and its random policy honour (its multi-agent policy needs that mask: response mode's ``Box`` actions are not
for it). The wrapper keeps only ``observation`` (the ids) and drops ``attention_mask``; the observations are
left-padded, so the Q-network gets the mask back as "everything from the first non-pad token on". Its
collector runs the policy with autograd on and detaches what it keeps: a ``Collector.collect`` of your own
saves that work under ``torch.no_grad()``, as the warm-up below does.

    pip install -e ".[clients]"          # skrl 2.1.1 and tianshou 2.0.1, with the torch you have
    python examples/tianshou_token_dqn.py --env-id sentiment/imdb-cory-v0 --epochs 2
    python examples/tianshou_token_dqn.py --env-id writing/xsum-v0 --learners first   # the other role random

All roles must share one tokenizer (the wrapper asserts that every agent has the same spaces).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from tianshou.algorithm import DQN, MARLRandomDiscreteMaskedOffPolicyAlgorithm, MultiAgentOffPolicyAlgorithm
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Collector, CollectStats, VectorReplayBuffer
from tianshou.env import DummyVectorEnv
from tianshou.env.pettingzoo_env import PettingZooEnv
from tianshou.trainer import OffPolicyTrainerParams
from torch import nn

import llm_envs


@dataclass
class Config:
    env_id: str = "sentiment/imdb-cory-v0"
    """Any id: sequential ids as they are, parallel ids through parallel_to_aec."""
    learners: Literal["all", "first"] = "all"
    """all: every role learns with its own DQN; first: the first role does, the others pick random legal tokens."""
    epochs: int = 1
    epoch_num_steps: int = 64
    """Env steps per epoch (one token of one role each)."""
    collection_step_num_env_steps: int = 16
    """Env steps collected between gradient steps."""
    num_envs: int = 2
    batch_size: int = 16
    buffer_size: int = 200
    """Transitions kept per env (each holds two V-long masks: 49,152 bools each with the default tokenizer)."""
    learning_rate: float = 1e-3
    gamma: float = 0.99
    eps_train: float = 0.1
    target_update_freq: int = 20
    max_new_tokens: int = 4
    max_prompt_tokens: int = 64
    """Observation ids: the prompt (its last tokens if longer: prompt_overflow='truncate_left') and the response."""
    embed_dim: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if self.learners not in ("all", "first"):
            raise ValueError(f"learners must be 'all' or 'first', got {self.learners!r}")
        for name in ("epochs", "epoch_num_steps", "collection_step_num_env_steps", "num_envs", "batch_size",
                     "buffer_size", "max_new_tokens", "max_prompt_tokens", "embed_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")


class TokenQNet(nn.Module):
    """Q-values of every next token from the observation's ids (B, L): the mean embedding of the visible tokens
    and the last token's, mixed, then scored against the (tied) embedding."""

    def __init__(self, vocab_size: int, pad_token_id: int, embed_dim: int) -> None:
        super().__init__()
        self.pad_token_id = pad_token_id
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.mix = nn.Linear(2 * embed_dim, embed_dim)

    def forward(self, obs: Any, state: Any = None, info: Any = None) -> tuple[torch.Tensor, Any]:
        ids = torch.as_tensor(np.asarray(obs), dtype=torch.long)  # (B, L)
        visible = ((ids != self.pad_token_id).cumsum(-1) > 0).unsqueeze(-1)  # left padding: from the first token on
        vectors = self.embed(ids)  # (B, L, D)
        mean = (vectors * visible).sum(1) / visible.sum(1).clamp(min=1)
        hidden = torch.tanh(self.mix(torch.cat([mean, vectors[:, -1]], dim=-1)))  # (B, D)
        return hidden @ self.embed.weight.T, state  # (B, V)


def make_env(config: Config) -> PettingZooEnv:
    return PettingZooEnv(llm_envs.make_aec(config.env_id, step_unit="token", max_new_tokens=config.max_new_tokens,
                                           max_prompt_tokens=config.max_prompt_tokens,
                                           prompt_overflow="truncate_left"))


def build(config: Config) -> tuple[MultiAgentOffPolicyAlgorithm, dict[str, TokenQNet], Collector]:
    """(the multi-agent algorithm, the learning roles' Q-networks, the training collector over ``num_envs`` envs)."""
    np.random.seed(config.seed)
    torch.manual_seed(config.seed)
    # Every collect warns that the returns are (episodes, agents), not 1-D: true of every multi-agent run.
    logging.getLogger("tianshou.data.stats").setLevel(logging.ERROR)
    env = make_env(config)
    pad = env.env.unwrapped.pad_token_id
    networks: dict[str, TokenQNet] = {}
    algorithms = []
    for i, agent in enumerate(env.agents):
        if config.learners == "first" and i > 0:
            algorithms.append(MARLRandomDiscreteMaskedOffPolicyAlgorithm(action_space=env.action_space))
            continue
        networks[agent] = TokenQNet(int(env.action_space.n), pad, config.embed_dim)
        policy = DiscreteQLearningPolicy(model=networks[agent], action_space=env.action_space,
                                         eps_training=config.eps_train, eps_inference=0.0)
        algorithms.append(DQN(policy=policy, optim=AdamOptimizerFactory(lr=config.learning_rate), gamma=config.gamma,
                              target_update_freq=config.target_update_freq))
    marl = MultiAgentOffPolicyAlgorithm(algorithms=algorithms, env=env)
    train_envs = DummyVectorEnv([lambda: make_env(config) for _ in range(config.num_envs)])
    train_envs.seed(config.seed)
    collector = Collector[CollectStats](marl, train_envs, VectorReplayBuffer(config.buffer_size, config.num_envs),
                                        exploration_noise=True)
    return marl, networks, collector


def main(config: Config) -> dict[str, Any]:
    """Build and train for ``config.epochs`` epochs; returns the multi-agent algorithm, the Q-networks, the
    collector and Tianshou's result."""
    return train(config, *build(config))


def train(config: Config, marl: MultiAgentOffPolicyAlgorithm, networks: dict[str, TokenQNet],
          collector: Collector) -> dict[str, Any]:
    """Train what :func:`build` built; see :func:`main`."""
    collector.reset()
    with torch.no_grad():
        collector.collect(n_step=config.batch_size)  # fill the buffer for the first batch
    result = marl.run_training(OffPolicyTrainerParams(
        training_collector=collector,
        max_epochs=config.epochs,
        epoch_num_steps=config.epoch_num_steps,
        collection_step_num_env_steps=config.collection_step_num_env_steps,
        batch_size=config.batch_size,
        update_step_num_gradient_steps_per_sample=1.0,
        multi_agent_return_reduction=lambda returns: returns.mean(axis=1),  # (episodes, agents) -> the team's
        verbose=False,
        show_progress=False,
    ))
    print(f"DQN ({config.learners}) on {config.env_id}: {result.timing.total_time:.1f} s, "
          f"{result.update_step} gradient steps, {result.train_step} env steps, {result.train_episode} episodes")
    return {"algorithm": marl, "networks": networks, "result": result, "collector": collector}


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (tests/test_docs_commands.py parses the docs' command lines with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for field in dataclasses.fields(Config):
        parser.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default)
    return parser


def parse_args(argv: list[str] | None = None) -> Config:
    parser = build_parser()
    return Config(**vars(parser.parse_args(argv)))


if __name__ == "__main__":
    main(parse_args())
