"""CORY: two PPO agents that co-evolve as pioneer and observer and swap roles.

Paper: Ma, Hu, Pu, et al., "Coevolving with the Other You: Fine-Tuning LLM with Sequential Cooperative
Multi-Agent Reinforcement Learning" (NeurIPS 2024). Docs: docs/cory.md.

1. Two copies of the model (two LoRA adapters with value heads on one frozen base): ``model_0``
   starts as the pioneer, ``model_1`` as the observer. Or two models (``--agent-models
   model_1=PATH``), of different tokenizers too: each role's env speaks the tokenizer of the model
   playing it (text is what passes between them), so the envs' tokenizers swap with the roles.
2. Each iteration plays a batch on a sequential pioneer -> observer env (``sentiment/imdb-cory-v0``,
   ``math/gsm8k-cory-v0``): the pioneer answers the query, the observer answers after reading it; both
   receive the collective reward r(pioneer) + r(observer) from the env.
3. Each model is updated by its own PPO (:mod:`baselines.learners.ppo`): KL to the frozen base on its own
   prompt, value head, GAE, clipped losses, adaptive KL controller.
4. Every ``swap_every`` iterations the models exchange roles. The swap is by reference: which adapter
   plays which role changes; adapters, value heads, optimizers and KL controllers stay with their model.

Run it::

    llm-envs train cory --env sentiment/imdb-cory-v0 --num-iterations 100
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from baselines.learners import ppo

LEARNER = "cory"
MODELS = ("model_0", "model_1")
"""Adapter names: models, not roles (a model plays both roles over a run)."""


@dataclass
class Config(ppo.Config):
    """CORY settings: PPO's, a role swap period and CORY's env. Every field is a ``--flag`` of
    ``llm-envs train cory``."""

    learner: ClassVar[str] = LEARNER

    env: str = "sentiment/imdb-cory-v0"  # a sequential env with two roles acting in order
    swap_every: int = 5
    """Exchange the two models' roles every this many iterations (the paper: 5); 0 never swaps."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.swap_every, bool) or not isinstance(self.swap_every, int) or self.swap_every < 0:
            raise ValueError(f"swap_every must be an int >= 0, got {self.swap_every!r}")


def role_assignment(
    iteration: int, roles: Sequence[str], swap_every: int, models: Sequence[str] = MODELS
) -> dict[str, str]:
    """Which model plays which role at ``iteration`` (0-based): ``models[i]`` plays ``roles[i]`` in
    iterations [0, swap_every), the reverse in [swap_every, 2 swap_every), and so on.

    >>> role_assignment(5, ("pioneer", "observer"), 5)
    {'pioneer': 'model_1', 'observer': 'model_0'}
    """
    if len(roles) != 2 or len(models) != 2:
        raise ValueError(f"CORY needs two roles and two models, got roles {list(roles)} and models {list(models)}")
    swapped = swap_every > 0 and (iteration // swap_every) % 2 == 1
    order = list(reversed(models)) if swapped else list(models)
    return dict(zip(roles, order))


def main(config: Config) -> dict[str, Any]:
    """Train CORY; returns the last iteration's metrics plus the evaluations before and after."""
    from llm_envs.core.registry import spec

    protocol = spec(config.env).protocol
    if protocol != "sequential":
        raise ValueError(
            f"CORY needs a sequential pioneer -> observer env (the observer reads the pioneer's answer), got "
            f"{config.env!r} (protocol {protocol!r}); use sentiment/imdb-cory-v0 or math/gsm8k-cory-v0"
        )
    import llm_envs

    roles = list(llm_envs.make(config.env, **config.env_kwargs()).possible_agents)
    if len(roles) != 2:
        raise ValueError(f"CORY needs an env with two roles, {config.env!r} has {roles}")
    return ppo.train(
        config, models=MODELS, assign=lambda iteration: role_assignment(iteration, roles, config.swap_every)
    )


summary = ppo.summary

if __name__ == "__main__":
    # `python -m baselines.learners.cory` (or `torchrun -m ...`) is `llm-envs train cory`: the same flags and
    # presets, one-line errors, and the run's report.html at the end.
    import sys

    from baselines.infra.cli import main as cli

    raise SystemExit(cli(["train", "cory", *sys.argv[1:]]))
