"""MAAC: multi-agent actor-critic with one centralised critic (centralised training, decentralised
execution), after the reference's ``MAAC`` trainer (OpenMLRL/CoMLRL, ``comlrl/trainers/actor_critic``).
Docs: docs/maac.md.

1. Pick B problems; make G envs per problem; every agent samples one response per env from its own
   LoRA adapter (all agents' rows in one ``generate_joint`` call); the env scores the joint response.
2. Multi-turn: repeat with the env's next prompts; returns R_t = r_t + gamma R_{t+1}.
3. The critic, a value head with its own LoRA adapter on the same frozen base, reads the concatenation
   of every agent's prompt and response of a turn (token ids, agents in env order) and estimates the
   joint return V_t: the critic sees everything, each actor only its own prompt.
4. Every actor's advantage is A_t = R_t - V_t (optionally whitened over the batch); each actor
   minimises the PPO-clipped surrogate over its own response tokens for ``num_epochs`` epochs; the
   critic minimises (V_t - R_t)^2 (clipped around its old estimate, as PPO's value loss).

Run it::

    llm-envs train maac --env writing/xsum-v0 --num-iterations 100
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from baselines.config import CoreConfig, check_choice, check_ints, check_ranges

LEARNER = "maac"
CRITIC = "critic"
"""The critic's adapter name in the policy (an env agent may not use it)."""


@dataclass
class Config(CoreConfig):
    """MAAC settings: the shared ones (baselines/config.py) and MAAC's own. Every field is a ``--flag``
    of ``llm-envs train maac``."""

    learner: ClassVar[str] = LEARNER

    num_problems: int = 2
    """B: problems per iteration."""
    num_generations: int = 4
    """G: episodes per problem."""
    critic_learning_rate: float = 5e-5
    """AdamW learning rate of the critic's adapter and value head."""
    num_epochs: int = 2
    """Actor and critic epochs on each batch (epochs after the first use the clipped ratio)."""
    clip_value: float = 0.2
    """Clip range of the critic's estimate around its old one (0 disables)."""
    whiten_advantages: bool = True
    """Normalise the advantages over the batch to mean 0, std 1."""
    loss_aggregation: Literal["token-mean", "sequence-sum"] = "token-mean"
    """Actor loss over response tokens: mean over the batch's tokens, or sum per response."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_ints(self, {"num_problems": 1, "num_generations": 1, "num_epochs": 1})
        check_ranges(self, {
            "critic_learning_rate": (self.critic_learning_rate > 0, "> 0"),
            "clip_value": (self.clip_value >= 0, ">= 0"),
        })
        check_choice(self, "loss_aggregation", ("token-mean", "sequence-sum"))

    def actor_config(self) -> Any:
        """The settings magrpo's rollout and actor update read (baselines.magrpo.update_agent)."""
        from baselines.magrpo import Config as MAGRPOConfig

        return MAGRPOConfig(
            env=self.env, num_turns=self.num_turns, seed=self.seed, num_problems=self.num_problems,
            num_generations=self.num_generations, max_new_tokens=self.max_new_tokens,
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, learning_rate=self.learning_rate,
            num_epochs=self.num_epochs, clip_eps=self.clip_eps, loss_aggregation=self.loss_aggregation,
            max_grad_norm=self.max_grad_norm, baseline="none", gamma=self.gamma,
            logprob_temperature=self.logprob_temperature,
        )


# ----------------------------------------------------------------------------------------- critic
def critic_inputs(
    turn_prompts: dict[str, tuple[torch.Tensor, torch.Tensor]],
    turn_responses: dict[str, tuple[torch.Tensor, torch.Tensor]],
    agents: list[str],
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The critic's view of one turn: for each row, every agent's prompt tokens then its response tokens
    (masks decide what is a token), agents in env order, left-padded -> (N, L) ids, mask.

    >>> p = {"a": (torch.tensor([[0, 5]]), torch.tensor([[0, 1]])), "b": (torch.tensor([[7]]), torch.tensor([[1]]))}
    >>> r = {"a": (torch.tensor([[6, 0]]), torch.tensor([[1, 0]])), "b": (torch.tensor([[8]]), torch.tensor([[1]]))}
    >>> critic_inputs(p, r, ["a", "b"], pad_id=0)[0].tolist()
    [[5, 6, 7, 8]]
    """
    n = len(next(iter(turn_prompts.values()))[0])
    rows = []
    for i in range(n):
        parts = []
        for a in agents:
            for ids, mask in (turn_prompts[a], turn_responses[a]):
                parts.append(ids[i][mask[i].bool()])
        rows.append(torch.cat(parts))
    width = max(len(r) for r in rows)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = r
        mask[i, width - len(r):] = 1
    return ids, mask


def critic_values(policy: Any, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N,) the critic's estimate after reading the whole joint turn: the value of the state before a
    one-token probe response (the pad id, masked in), i.e. after the last input token."""
    probe = torch.full((len(ids), 1), policy.pad_token_id, dtype=torch.long)
    return policy.values(CRITIC, ids, mask, probe, torch.ones_like(probe))[:, 0]


def value_loss(values: torch.Tensor, old: torch.Tensor, returns: torch.Tensor, clip: float) -> torch.Tensor:
    """PPO's value loss: (N,) -> scalar, 0.5 * max((V - R)^2, (clip(V, old +- clip) - R)^2) averaged.

    >>> float(value_loss(torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([0.0]), 0.5))
    2.0
    """
    loss = (values - returns) ** 2
    if clip > 0:
        clipped = old + (values - old).clamp(-clip, clip)
        loss = torch.maximum(loss, (clipped - returns) ** 2)
    return 0.5 * loss.mean()


def whiten(x: torch.Tensor) -> torch.Tensor:
    """(N, T) -> mean 0, std 1 over every entry (std clamped at 1e-6)."""
    return (x - x.mean()) / x.std().clamp(min=1e-6) if x.numel() > 1 else x - x.mean()


# ----------------------------------------------------------------------------------------- main
def main(config: Config) -> dict[str, float]:
    """Train MAAC; returns the last iteration's metrics plus ``eval_before/*`` and ``eval/*``."""
    import shutil

    from tqdm.auto import tqdm

    from agents import LoraSettings, MultiAgentPolicy
    from baselines.checkpoints import TrainerState, check_run_dir, save_checkpoint
    from baselines.evaluation import evaluate
    from baselines.metrics import MetricLogger
    from baselines.play import probe_env, rollout
    from baselines.plots import plot_metrics
    from baselines.policy_gradient import discounted_returns, update_agent
    from baselines.rng import seed_everything
    from llm_envs.core.vector import VectorEnv

    if config.threads is not None:
        torch.set_num_threads(config.threads)
    run_dir = config.run_dir()
    check_run_dir(run_dir, resume=False, overwrite=config.overwrite)
    if config.overwrite and (run_dir / "checkpoints").exists():
        shutil.rmtree(run_dir / "checkpoints")
    rng = seed_everything(config.seed)
    env_kwargs = config.build_env_kwargs()
    agents, _ = probe_env(config.env, max_new_tokens=config.max_new_tokens, **env_kwargs)
    if CRITIC in agents:
        raise ValueError(f"env {config.env!r} has an agent named {CRITIC!r}, the name of MAAC's critic adapter")
    policy = MultiAgentPolicy.from_pretrained(
        [*agents, CRITIC], config.model, dtype=config.dtype, device=config.device, value_head=True,
        lora=LoraSettings(rank=config.lora_rank, alpha=config.lora_alpha), backend=config.backend,
    )
    n_envs = config.num_problems * config.num_generations
    venv = VectorEnv(config.env, n_envs, max_new_tokens=config.max_new_tokens,
                     stop_token_ids=list(policy.eos_token_ids), **env_kwargs)
    n_train = len(venv.envs[0].task.problems("train"))
    optimizers = {a: policy.optimizer(a, lr=config.learning_rate) for a in agents}
    optimizers[CRITIC] = policy.optimizer(CRITIC, lr=config.critic_learning_rate)
    actor_config = config.actor_config()
    logger = MetricLogger(run_dir, tensorboard=config.tensorboard, config=config)

    def run_eval() -> dict[str, float]:
        if config.num_eval_problems == 0:
            return {}
        return evaluate(policy, config.env, num_problems=config.num_eval_problems,
                        max_new_tokens=config.max_new_tokens, greedy=True, seed=config.seed,
                        env_kwargs=env_kwargs)

    before = run_eval()
    if before:
        logger.log(0, before)
    policy.train()
    metrics: dict[str, float] = {}
    bar = tqdm(range(config.num_iterations), disable=not config.progress, desc="maac", dynamic_ncols=True)
    for iteration in bar:
        t0 = time.perf_counter()
        problems = rng.choice(n_train, size=config.num_problems, replace=n_train < config.num_problems)
        g = config.num_generations
        options = [{"task_index": int(problems[b]), "split": "train"} for b in range(config.num_problems)
                   for _ in range(g)]
        seeds = [config.seed * 1_000_003 + iteration * n_envs + k for k in range(n_envs)]
        turns = rollout(policy, venv, seeds, options, actor_config)
        t_rollout = time.perf_counter() - t0

        # Joint returns (every agent gets the joint reward under the parallel protocol; the critic
        # estimates the first agent's, which is the joint one unless a task pays agents separately).
        rewards = torch.tensor(np.stack([turn.rewards[agents[0]] for turn in turns], 1), dtype=torch.float32)
        returns = discounted_returns(rewards, config.gamma)  # (N, turns)
        inputs = [
            critic_inputs(
                turn.prompts,
                {a: (turn.responses[a].response_ids, turn.responses[a].response_mask) for a in agents},
                agents,
                policy.pad_token_id,
            )
            for turn in turns
        ]
        with torch.no_grad():
            old_values = torch.stack([critic_values(policy, *x) for x in inputs], 1)  # (N, turns)
        advantages = returns - old_values
        if config.whiten_advantages:
            advantages = whiten(advantages)

        metrics = {}
        for agent in agents:
            stats = update_agent(policy, optimizers[agent], agent, turns, advantages, actor_config)
            for key, value in stats.items():
                metrics[f"agent_{agent}/{key}"] = value
        critic_stats = []
        for _ in range(config.num_epochs):
            optimizers[CRITIC].zero_grad(set_to_none=True)
            total = torch.zeros(())
            for t, x in enumerate(inputs):
                loss = value_loss(critic_values(policy, *x), old_values[:, t], returns[:, t], config.clip_value)
                (loss / len(inputs)).backward()
                total = total + loss.detach() / len(inputs)
            if not math.isfinite(float(total)):
                raise FloatingPointError(
                    f"critic: non-finite value loss {float(total)}; lower critic_learning_rate "
                    f"({config.critic_learning_rate}) or check the rewards"
                )
            if config.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(policy.parameters(CRITIC), config.max_grad_norm)
            optimizers[CRITIC].step()
            critic_stats.append(float(total))
        last = turns[-1].infos[agents[0]]
        elapsed = time.perf_counter() - t0
        metrics.update({
            "losses/value_loss": float(np.mean(critic_stats)),
            "losses/pg_loss": float(np.mean([metrics[f"agent_{a}/pg_loss"] for a in agents])),
            "charts/critic_value": float(old_values.mean()),
            "charts/critic_explained_variance": float(1 - (returns - old_values).var() / returns.var().clamp(min=1e-8)),
            "reward/total": float(np.mean(last["reward_total"])),
            "charts/episode_return": float(returns[:, 0].mean()),
            "charts/iteration": iteration + 1,
            "charts/s_per_iteration": elapsed,
            "charts/rollout_fraction": t_rollout / elapsed,
        })
        for key, value in last.items():
            if key.startswith("reward_") and key != "reward_total":
                metrics[f"reward/{key[len('reward_'):]}"] = float(np.mean(value))
        logger.log(iteration + 1, metrics)
        bar.set_postfix(reward=f"{metrics['reward/total']:.3f}")
    bar.close()
    after = run_eval()
    if after:
        logger.log(config.num_iterations, after)
    state = TrainerState.capture(step=config.num_iterations, policy=policy, optimizers=optimizers, rng=rng)
    save_checkpoint(run_dir, state, learner=LEARNER, config=config, policy=policy)
    logger.close()
    venv.close()
    result: dict[str, Any] = dict(metrics)
    result.update(after)
    result.update({f"eval_before/{k.split('/', 1)[1]}": v for k, v in before.items()})
    result["plot"] = str(plot_metrics(run_dir / "metrics.jsonl"))
    result["run_dir"] = str(run_dir)
    return result


def summary(result: dict[str, Any]) -> str:
    """Closing lines of a run: eval reward before and after per component, and where the plot is."""
    from baselines.evaluation import eval_table

    lines = eval_table(result)
    if "reward/total" in result:
        lines.append(f"last training reward {result['reward/total']:.3f}")
    lines.append(f"run:  {result.get('run_dir')}")
    return "\n".join(lines)


if __name__ == "__main__":
    import tyro

    print(summary(main(tyro.cli(Config))))
