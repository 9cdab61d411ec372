"""IPPO and MAPPO from skrl on an llm_envs parallel env, one token a step: each agent's policy samples its
next token among those its ``action_mask`` allows, and MAPPO's critic reads ``env.state()``, the global state
(the problem's prompt and every role's latest response: docs/env-contract.md, "Global state").

skrl (2.x, torch) wraps the parallel form with ``wrap_env(env, wrapper="pettingzoo")``, which flattens every
Dict observation (and the Dict state) into one float32 vector; a model gets the Dict back with
``unflatten_tensorized_space`` (token ids up to 2^24 are exact in float32). Its trainer calls ``env.state()``
after every step, for IPPO too; its configs may name a value per agent. The models here are deliberately tiny
(an embedding, a mean over the visible tokens, the policy's logits tied to the embedding): the wiring is the
point, not the model.

    pip install -e ".[clients]"          # skrl 2.1.1 and tianshou 2.0.1, with the torch you have
    python examples/skrl_ippo_mappo.py --algorithm mappo --env-id writing/xsum-v0 --timesteps 64
    python examples/skrl_ippo_mappo.py --algorithm ippo --env-id coding/humaneval-v0

Only parallel ids: skrl's PettingZoo wrapper takes the parallel API (CORY's sequential ids need the AEC form:
examples/tianshou_token_dqn.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

import torch
from skrl.envs.wrappers.torch import wrap_env
from skrl.memories.torch import RandomMemory
from skrl.models.torch import CategoricalMixin, DeterministicMixin, Model
from skrl.multi_agents.torch.base import ExperimentCfg
from skrl.multi_agents.torch.ippo import IPPO, IPPO_CFG
from skrl.multi_agents.torch.mappo import MAPPO, MAPPO_CFG
from skrl.trainers.torch import SequentialTrainer
from skrl.utils import set_seed
from skrl.utils.spaces.torch import unflatten_tensorized_space
from torch import nn

import llm_envs


@dataclass
class Config:
    env_id: str = "writing/xsum-v0"
    """A parallel env id."""
    algorithm: Literal["mappo", "ippo"] = "mappo"
    """mappo: each agent's critic reads env.state(); ippo: its own observation."""
    timesteps: int = 64
    """Env steps (one token per agent each)."""
    rollouts: int = 16
    """Steps collected between updates."""
    learning_epochs: int = 2
    mini_batches: int = 2
    learning_rate: float = 1e-3
    max_new_tokens: int = 8
    """Tokens per response (a turn is at most this many steps)."""
    max_prompt_tokens: int = 128
    """Observation length; longer prompts keep their last tokens (prompt_overflow='truncate_left')."""
    embed_dim: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        if self.algorithm not in ("mappo", "ippo"):
            raise ValueError(f"algorithm must be 'mappo' or 'ippo', got {self.algorithm!r}")
        for name in ("timesteps", "rollouts", "learning_epochs", "mini_batches", "max_new_tokens",
                     "max_prompt_tokens", "embed_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.rollouts % self.mini_batches:
            raise ValueError(f"rollouts={self.rollouts} must be a multiple of mini_batches={self.mini_batches}")


def encode(embed: nn.Embedding, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, L) float ids and mask -> (B, D): the mean embedding of the visible tokens, then the last token's."""
    vectors = embed(ids.long())  # (B, L, D)
    weights = mask.unsqueeze(-1)  # (B, L, 1)
    mean = (vectors * weights).sum(1) / weights.sum(1).clamp(min=1.0)
    return torch.cat([mean, vectors[:, -1]], dim=-1)  # (B, 2D)


class TokenPolicy(CategoricalMixin, Model):
    """The next token's logits (tied to the embedding), with the tokens the action mask forbids at the float
    minimum: a finished agent can only step the pad id."""

    def __init__(self, observation_space: Any, action_space: Any, device: Any, embed_dim: int) -> None:
        Model.__init__(self, observation_space=observation_space, action_space=action_space, device=device)
        CategoricalMixin.__init__(self, unnormalized_log_prob=True)
        self.embed = nn.Embedding(int(action_space.n), embed_dim)
        self.mix = nn.Linear(2 * embed_dim, embed_dim)

    def compute(self, inputs: dict[str, Any], role: str = "") -> tuple[torch.Tensor, dict]:
        obs = unflatten_tensorized_space(self.observation_space, inputs["observations"])
        hidden = torch.tanh(self.mix(encode(self.embed, obs["observation"], obs["attention_mask"])))
        logits = hidden @ self.embed.weight.T  # (B, V)
        return logits.masked_fill(obs["action_mask"] == 0, torch.finfo(logits.dtype).min), {}


class Critic(DeterministicMixin, Model):
    """A value from the global state (MAPPO: ``inputs["states"]``) or the agent's observation (IPPO)."""

    def __init__(self, space: Any, source: str, vocab_size: int, device: Any, embed_dim: int, **spaces: Any) -> None:
        Model.__init__(self, device=device, **spaces)
        DeterministicMixin.__init__(self)
        self.space, self.source = space, source
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.head = nn.Sequential(nn.Linear(2 * embed_dim, embed_dim), nn.Tanh(), nn.Linear(embed_dim, 1))

    def compute(self, inputs: dict[str, Any], role: str = "") -> tuple[torch.Tensor, dict]:
        seen = unflatten_tensorized_space(self.space, inputs[self.source])
        return self.head(encode(self.embed, seen["observation"], seen["attention_mask"])), {}


def per_agent(cfg: Any, agents: list[str]) -> None:
    """skrl 2.1.1 reads a config field holding a dict as one value per agent, so its fields whose default is an
    empty dict (the ``*_kwargs``) fail with "Specified keys (set()) do not match possible agents": give them one
    empty dict per agent."""
    for field in dataclasses.fields(cfg):
        if getattr(cfg, field.name) == {}:
            setattr(cfg, field.name, {agent: {} for agent in agents})


def make_env(config: Config) -> Any:
    env = llm_envs.make(config.env_id, protocol="parallel", step_unit="token", max_new_tokens=config.max_new_tokens,
                        max_prompt_tokens=config.max_prompt_tokens, prompt_overflow="truncate_left")
    return wrap_env(env, wrapper="pettingzoo")


def build(config: Config) -> tuple[Any, Any, dict[str, dict[str, Model]]]:
    """(the wrapped env, the multi-agent IPPO or MAPPO, each agent's policy and value models)."""
    set_seed(config.seed)
    env = make_env(config)
    device = env.device
    models: dict[str, dict[str, Model]] = {}
    for agent in env.possible_agents:
        obs_space, action_space = env.observation_space(agent), env.action_space(agent)
        if config.algorithm == "mappo":
            state_space = env.state_space(agent)  # the llm env's state_space, the same for every agent
            critic = Critic(state_space, "states", int(state_space["observation"].high[0]) + 1, device,
                            config.embed_dim, state_space=state_space)
        else:
            critic = Critic(obs_space, "observations", int(action_space.n), device, config.embed_dim,
                            observation_space=obs_space)
        models[agent] = {"policy": TokenPolicy(obs_space, action_space, device, config.embed_dim), "value": critic}
    memories = {a: RandomMemory(memory_size=config.rollouts, num_envs=env.num_envs, device=device)
                for a in env.possible_agents}
    settings = dict(rollouts=config.rollouts, learning_epochs=config.learning_epochs,
                    mini_batches=config.mini_batches, learning_rate=config.learning_rate,
                    experiment=ExperimentCfg(write_interval=0, checkpoint_interval=0))
    cfg = (MAPPO_CFG if config.algorithm == "mappo" else IPPO_CFG)(**settings)
    per_agent(cfg, env.possible_agents)
    multi_agent = (MAPPO if config.algorithm == "mappo" else IPPO)(
        possible_agents=env.possible_agents, models=models, memories=memories, cfg=cfg, device=device,
        observation_spaces=env.observation_spaces, state_spaces=env.state_spaces, action_spaces=env.action_spaces)
    return env, multi_agent, models


def main(config: Config) -> dict[str, Any]:
    """Build and train for ``config.timesteps`` steps; returns the env, the multi-agent, its models, what skrl
    tracked and the last losses."""
    return train(config, *build(config))


def train(config: Config, env: Any, multi_agent: Any, models: dict[str, dict[str, Model]]) -> dict[str, Any]:
    """Train what :func:`build` built; see :func:`main`."""
    # close_environment_at_exit: skrl would close the env from an atexit hook (and log there); the loop closes it.
    trainer = SequentialTrainer(env=env, agents=multi_agent, cfg={
        "timesteps": config.timesteps, "headless": True, "disable_progressbar": True,
        "close_environment_at_exit": False})
    trainer.train()
    env.close()
    tracked = {key: list(values) for key, values in multi_agent.tracking_data.items()}
    losses = {key: values[-1] for key, values in tracked.items() if key.startswith("Loss")}
    print(f"{config.algorithm} on {config.env_id}, {config.timesteps} steps: "
          + ", ".join(f"{key} {value:.4f}" for key, value in sorted(losses.items())))
    if not losses or not all(math.isfinite(v) for v in losses.values()):
        raise RuntimeError(f"no update, or non-finite losses: {losses}")
    return {"env": env, "multi_agent": multi_agent, "models": models, "tracked": tracked, "losses": losses}


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
