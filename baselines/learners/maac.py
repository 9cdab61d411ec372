"""MAAC: multi-agent actor-critic with one centralised critic (centralised training, decentralised
execution), after the reference's ``MAAC`` trainer (OpenMLRL/CoMLRL, ``comlrl/trainers/actor_critic``).
Docs: docs/maac.md.

1. Pick B problems; make G envs per problem; every agent samples one response per env from its own
   LoRA adapter (all agents' rows in one ``generate_joint`` call); the env scores the joint response.
2. Multi-turn: repeat with the env's next prompts; returns R_t = r_t + gamma R_{t+1}.
3. The critic, a value head with its own LoRA adapter on the first agent's base (or ``--critic-model``),
   reads the concatenation of every agent's prompt and response of a turn (token ids, agents in env
   order; an agent of another tokenizer than the critic's as its text in the critic's tokens) and
   estimates the joint return V_t: the critic sees everything, each actor only its own prompt.
4. Every actor's advantage is A_t = R_t - V_t (optionally whitened over the batch); each actor
   minimises the PPO-clipped surrogate over its own response tokens for ``num_epochs`` epochs; the
   critic minimises (V_t - R_t)^2 (clipped around its old estimate, as PPO's value loss).
5. Optional KL to the reference (``--kl-coef`` > 0): ``--kl-in reward`` (the default) subtracts
   ``kl_coef`` times the team's KL (every agent's response KL, k3 summed over its tokens, added up)
   from the joint reward of step 2, so the critic's targets and the advantages include it;
   ``--kl-in loss`` adds a per-token k3 term to each actor's loss.

Run it::

    llm-envs train maac --env writing/xsum-v0 --num-iterations 100

The critic's pieces (shared with PPO's and CORY's ``--critic central``) are in :mod:`baselines.rl.critic`;
the actors' rollout and update are MAGRPO's (:mod:`baselines.infra.play`, :mod:`baselines.rl.policy_gradient`);
the run around the loop (directory, logs, evaluations, checkpoints, ``--resume``, Ctrl-C) is
:mod:`baselines.infra.run`'s.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from agents import placement
from baselines.infra import distributed
from baselines.infra.config import CRITIC, LearnerConfig, check_choice, check_ints, check_ranges, with_critic
from baselines.infra.evaluation import summary
from baselines.infra.metrics import reward_metrics
from baselines.infra.play import probe_env, rollout, team_env_kwargs
from baselines.infra.run import Run, mean_over_agents
from baselines.rl.compiled_update import compile_charts
from baselines.rl.critic import (
    CriticReader,
    central_context,
    central_forward,
    check_context,
    critic_inputs,
    critic_values,
    row_chunks,
    value_loss,
)
from baselines.rl.policy_gradient import discounted_returns, kl_penalized, response_kl, update_agent

LEARNER = "maac"
__all__ = [
    "CRITIC", "LEARNER", "Config", "central_context", "central_forward", "critic_inputs", "critic_values", "main",
    "returns_and_advantages", "row_chunks", "summary", "update_critic", "value_loss", "whiten",
]


@dataclass
class Config(LearnerConfig):
    """MAAC settings: the shared ones (baselines/infra/config.py) and MAAC's own. Every field is a ``--flag``
    of ``llm-envs train maac``."""

    learner: ClassVar[str] = LEARNER
    micro_batch_size: ClassVar[int] = 0
    """Rows per pass of the actors' update (baselines.rl.policy_gradient.update_agent): all of a turn's,
    within the --micro-batch-tokens budget."""

    num_problems: int = 2
    """B: problems per iteration."""
    num_generations: int = 4
    """G: episodes per problem."""
    critic_learning_rate: float = 5e-5
    """AdamW learning rate of the critic's adapter and value head."""
    critic_model: str | None = None
    """Base model of the critic's adapter and value head (HF id or local directory); unset: the first
    agent's base. The critic reads every agent's prompt and response: an agent whose tokenizer is not
    the critic's is read as its text, encoded by the critic's tokenizer (docs/maac.md "Teams")."""
    num_epochs: int = 2
    """Actor and critic epochs on each batch (epochs after the first use the clipped ratio)."""
    clip_value: float = 0.2
    """Clip range of the critic's estimate around its old one (0 disables)."""
    whiten_advantages: bool = True
    """Normalise the advantages over the batch to mean 0, std 1."""
    loss_aggregation: Literal["token-mean", "sequence-sum"] = "token-mean"
    """Actor loss over response tokens: mean over the batch's tokens, or sum per response."""
    kl_coef: float = 0.0
    """Weight of the KL (k3 estimator) to the reference policy (the base with adapters disabled): with
    --kl-in reward a penalty on the joint reward of the team's KL, the sum of every agent's response KL
    (the KL of the joint policy, whose agents sample independently); with --kl-in loss a per-token term of
    each actor's loss. 0 skips the reference forward (the reference code switches it on at 0.1)."""
    micro_batch_tokens: int = 2048
    """Token budget of one forward/backward of the actors' and the critic's updates (rows x columns
    per pass; at least one row): bounds activation memory, the same gradient up to rounding; 0 = none
    (MAGRPO's default, measured in docs/agents.md)."""
    seed_per_problem: bool | None = None
    """Sample each problem group from its own seed (seed, iteration, turn, problem position), so that
    the samples do not depend on how problems are split across processes. Unset: on with several
    processes (torchrun / accelerate launch), off with one."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_ints(self, {"num_problems": 1, "num_generations": 1, "num_epochs": 1, "micro_batch_tokens": 0})
        check_ranges(self, {
            "critic_learning_rate": (self.critic_learning_rate > 0, "> 0"),
            "clip_value": (self.clip_value >= 0, ">= 0"),
            "kl_coef": (self.kl_coef >= 0, ">= 0"),
        })
        check_choice(self, "loss_aggregation", ("token-mean", "sequence-sum"))
        if self.seed_per_problem is not None and not isinstance(self.seed_per_problem, bool):
            raise ValueError(f"seed_per_problem must be True, False or None, got {self.seed_per_problem!r}")

    def check_processes(self, world_size: int) -> None:
        """Seeds per problem and at least one problem per process."""
        if world_size > 1 and self.seed_per_problem is False:
            raise ValueError(
                f"seed_per_problem=False with {world_size} processes: each process would sample its share "
                "from its own global RNG stream; leave --seed-per-problem unset (or True) for data-parallel runs"
            )
        if self.num_problems < world_size:
            raise ValueError(
                f"num_problems={self.num_problems} cannot be shared among {world_size} processes; every "
                f"process needs at least one problem per iteration (num_problems >= {world_size})"
            )


# ----------------------------------------------------------------------------------------- critic
def whiten(x: torch.Tensor, *, across_ranks: bool = False) -> torch.Tensor:
    """(N, T) -> mean 0, std 1 over every entry (unbiased std clamped at 1e-6). ``across_ranks``: the
    mean and std of every process's entries together (data-parallel runs)."""
    if not across_ranks:
        return (x - x.mean()) / x.std().clamp(min=1e-6) if x.numel() > 1 else x - x.mean()
    total, count = distributed.all_sum([float(x.sum()), float(x.numel())])
    mean = total / count
    squares = distributed.all_sum(float(((x.double() - mean) ** 2).sum()))
    if count <= 1:
        return x - mean
    return (x - mean) / max(math.sqrt(squares / (count - 1)), 1e-6)


def returns_and_advantages(
    rewards: torch.Tensor,
    old_values: torch.Tensor,
    config: Config,
    kl: torch.Tensor | None = None,
    *,
    across_ranks: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The critic's targets and the actors' advantages: (N, turns) joint rewards, the critic's (N, turns)
    old estimates and, with ``kl_in="reward"``, the team's (N, turns) response KL (summed over agents)
    -> (returns, advantages). ``R = discounted(r - kl_coef * kl)``, ``A = R - V``, whitened over the batch
    (of every process with ``across_ranks``) when ``whiten_advantages``.

    >>> config = Config(gamma=0.5, kl_coef=0.1, whiten_advantages=False)
    >>> returns, adv = returns_and_advantages(torch.tensor([[1.0, 2.0]]), torch.tensor([[0.5, 0.0]]), config,
    ...                                       torch.tensor([[2.0, 4.0]]))
    >>> returns, adv  # rewards 0.8, 1.6 -> R_1 = 1.6, R_0 = 0.8 + 0.5 * 1.6
    (tensor([[1.6000, 1.6000]]), tensor([[1.1000, 1.6000]]))
    """
    if kl is not None:
        rewards = kl_penalized(rewards, kl, config.kl_coef)
    returns = discounted_returns(rewards, config.gamma)  # (N, turns)
    advantages = returns - old_values
    if config.whiten_advantages:
        advantages = whiten(advantages, across_ranks=across_ranks)
    return returns, advantages


def update_critic(
    policy: Any,
    optimizer: torch.optim.Optimizer,
    inputs: list[tuple[torch.Tensor, torch.Tensor]],
    old_values: torch.Tensor,
    returns: torch.Tensor,
    config: Config,
) -> dict[str, float]:
    """``num_epochs`` steps of the critic on one batch: ``inputs`` per turn (:func:`critic_inputs`),
    (N, turns) old estimates and returns. Each turn's value loss is a mean over the batch's rows (of
    every process: each rank sums its rows over the global count and the gradients are summed over
    ranks), turns weighted equally; passes of at most ``micro_batch_tokens`` tokens."""
    spread = distributed.world_size() > 1
    rows = float(len(old_values))
    denominator = distributed.all_sum(rows) if spread else rows
    params = policy.parameters(CRITIC)
    losses, norms = [], []
    for epoch in range(config.num_epochs):
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for t, (ids, mask) in enumerate(inputs):
            for c in row_chunks(ids, config.micro_batch_tokens):
                values = critic_values(policy, ids[c], mask[c])
                loss = value_loss(values, old_values[c, t].to(values.device), returns[c, t].to(values.device),
                                  config.clip_value, denominator) / len(inputs)
                loss.backward()
                total += float(loss.detach())
        overall = distributed.all_sum(total) if spread else total
        if not math.isfinite(overall):
            raise FloatingPointError(
                f"critic: non-finite value loss {overall} at epoch {epoch}; lower critic_learning_rate "
                f"({config.critic_learning_rate}) or check the rewards"
            )
        distributed.all_reduce_grads(params, "sum")
        if config.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
        optimizer.step()
        losses.append(overall)
        norms.append(float(norm))
    optimizer.zero_grad(set_to_none=True)  # not kept between updates: they would only hold memory
    return {"value_loss": float(np.mean(losses)), "grad_norm": float(np.mean(norms))}


def old_critic_values(policy: Any, inputs: list[tuple[torch.Tensor, torch.Tensor]], budget: int) -> torch.Tensor:
    """(N, turns) the critic's estimates of every turn before the update, in passes within ``budget`` tokens."""
    with torch.no_grad():
        return torch.stack(
            [torch.cat([critic_values(policy, ids[c], mask[c]).float().cpu() for c in row_chunks(ids, budget)])
             for ids, mask in inputs],
            1,
        )


# ----------------------------------------------------------------------------------------- main
def main(config: Config, *, reward_wrapper: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """Train MAAC; returns the last iteration's metrics plus ``eval_before/*`` and ``eval/*``.

    Under torchrun or accelerate launch (``WORLD_SIZE`` > 1) every process plays its share of each
    iteration's problems (each problem group sampled from its own seed); advantages are whitened over
    the whole batch and the actors' and the critic's gradients summed over processes
    (baselines/infra/distributed.py). Only rank 0 evaluates, logs, plots and writes checkpoints. Ctrl-C saves
    the last finished iteration; ``--resume`` continues from the newest checkpoint."""
    from agents import LoraSettings, MultiAgentPolicy
    from llm_envs.core.registry import spec
    from llm_envs.core.vector import VectorEnv

    run = Run.begin(config)  # threads, processes, run directory, seeds
    per_problem = run.info.distributed if config.seed_per_problem is None else config.seed_per_problem
    positions = distributed.shard(range(config.num_problems))  # this rank's problems of each batch
    g = config.num_generations
    n_envs = config.num_problems * g
    env_kwargs = config.build_env_kwargs()
    agents, _ = probe_env(config.env, max_new_tokens=config.max_new_tokens, **env_kwargs)
    if CRITIC in agents:
        raise ValueError(f"env {config.env!r} has an agent named {CRITIC!r}, the name of MAAC's critic adapter")
    config.check_agents(agents)
    device = placement.device_for("data-parallel", agents, run.info, config.device)[agents[0]]
    # The critic sits on the first agent's base (or --critic-model) and reads every agent's prompt and
    # response in its own tokens: an agent of another tokenizer as its text, re-encoded (CriticReader).
    models = with_critic(config.model_of(agents), agents, config.critic_model)
    lora = config.lora_of(agents)
    if isinstance(lora, dict):
        lora[CRITIC] = LoraSettings(rank=config.lora_rank, alpha=config.lora_alpha)
    policy = MultiAgentPolicy.from_pretrained(
        [*agents, CRITIC], models, dtype=config.dtype, device=device, value_head=True,
        lora=lora, backend=config.backend,
        gradient_checkpointing=config.gradient_checkpointing,
        activation_budget_mb=config.activation_budget_mb,
        share_prompts=config.share_prompts,
    )
    read = CriticReader(policy, agents)
    env_kwargs = team_env_kwargs(env_kwargs, policy, agents)
    venv = VectorEnv(config.env, len(positions) * g, max_new_tokens=config.max_new_tokens, **env_kwargs)
    if reward_wrapper is not None:  # MARLHF: the training envs' rewards are a learned model's (eval: the task's)
        venv = reward_wrapper(venv)
    n_train = len(venv.envs[0].task.problems("train"))
    optimizers = {a: policy.optimizer(a, lr=config.learning_rate_of(a)) for a in agents}
    optimizers[CRITIC] = policy.optimizer(CRITIC, lr=config.critic_learning_rate)
    if spec(config.env).protocol == "sequential":
        raise ValueError(f"MAAC plays parallel episodes (every agent acts at once each turn); {config.env!r} is "
                         "sequential (its agents act in order)")
    run.resume(policy, optimizers)
    run.start(policy, optimizers, env_kwargs=env_kwargs, weights="actor and critic weights")

    metrics: dict[str, float] = {}
    with run.interruptible():
        run.evaluate_before()
        for iteration in run.iterations():
            t0 = time.perf_counter()
            problems = run.draw_problems(n_train, config.num_problems)
            options = [{"task_index": int(problems[b]), "split": "train"} for b in positions for _ in range(g)]
            seeds = [config.seed * 1_000_003 + iteration * n_envs + b * g + k for b in positions for k in range(g)]
            turns = rollout(policy, venv, seeds, options, config, positions if per_problem else None, iteration)
            t_rollout = time.perf_counter() - t0
            distributed.check_equal(len(turns), "turns per episode")

            # Joint returns (every agent gets the joint reward under the parallel protocol; the critic
            # estimates the first agent's, which is the joint one unless a task pays agents separately).
            rewards = torch.tensor(np.stack([turn.rewards[agents[0]] for turn in turns], 1), dtype=torch.float32)
            metrics = {}
            team_kl = None
            if config.kl_in == "reward" and config.kl_coef > 0:
                # The team's KL: the agents sample independently, so the joint policy's KL is the sum.
                team_kl = torch.zeros_like(rewards)
                for agent in agents:
                    kl = torch.stack([response_kl(policy, agent, turn.responses[agent], config)
                                      for turn in turns], 1)  # (N, turns)
                    team_kl += kl
                    metrics[f"agent_{agent}/kl"] = float(distributed.gather_rows(kl).mean())
            recoded = read.seconds
            inputs = [  # once per batch: the old values and every epoch of the critic read them
                read(turn.prompts, {a: (g.response_ids, g.response_mask) for a, g in turn.responses.items()})
                for turn in turns
            ]
            recoded = read.seconds - recoded
            check_context(policy, inputs)
            old_values = old_critic_values(policy, inputs, config.micro_batch_tokens)  # (N, turns)
            returns, advantages = returns_and_advantages(
                rewards, old_values, config, team_kl, across_ranks=run.info.distributed
            )

            for agent in agents:
                stats = update_agent(policy, optimizers[agent], agent, turns, advantages, config)
                metrics.update({f"agent_{agent}/{key}": value for key, value in stats.items()})
            critic_stats = update_critic(policy, optimizers[CRITIC], inputs, old_values, returns, config)
            rows = distributed.gather_rows({"returns": returns, "old_values": old_values})
            last = distributed.gather_rows(dict(turns[-1].infos[agents[0]]))
            explained = 1 - (rows["returns"] - rows["old_values"]).var() / rows["returns"].var().clamp(min=1e-8)
            step = iteration + 1
            elapsed = time.perf_counter() - t0
            metrics.update(reward_metrics(last))
            metrics.update({
                "losses/value_loss": critic_stats["value_loss"],
                "losses/pg_loss": float(np.mean([metrics[f"agent_{a}/pg_loss"] for a in agents])),
                **mean_over_agents(metrics, ("kl",), agents),
                **compile_charts(metrics, agents),
                "agent_critic/grad_norm": critic_stats["grad_norm"],
                "charts/critic_value": float(rows["old_values"].mean()),
                "charts/critic_explained_variance": float(explained),
                "charts/episode_return": float(rows["returns"][:, 0].mean()),
                "charts/iteration": step,
                "charts/s_per_iteration": elapsed,
                "charts/rollout_fraction": t_rollout / elapsed,
            })
            if read.foreign:  # the critic reads some agents as text, re-encoded in its tokens
                metrics["charts/critic_reencode_fraction"] = recoded / elapsed
            run.write_samples(step, venv.envs, seeds, options)
            run.end_iteration(step, metrics, reward=f"{metrics['reward/total']:.3f}")
        run.evaluate_after()
    result = run.finish(metrics)
    venv.close()
    return result


if __name__ == "__main__":
    # `python -m baselines.learners.maac` (or `torchrun -m ...`) is `llm-envs train maac`: the same flags and
    # presets, one-line errors, and the run's report.html at the end.
    import sys

    from baselines.infra.cli import main as cli

    raise SystemExit(cli(["train", "maac", *sys.argv[1:]]))
