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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from baselines import distributed
from baselines.config import LearnerConfig, check_choice, check_ints, check_ranges
from baselines.metrics import reward_metrics
from baselines.play import probe_env, rollout
from baselines.policy_gradient import discounted_returns, update_agent
from baselines.run import Run

LEARNER = "maac"
CRITIC = "critic"
"""The critic's adapter name in the policy (an env agent may not use it)."""


@dataclass
class Config(LearnerConfig):
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
    micro_batch_tokens: int = 2048
    """Token budget of one forward/backward of the actors' and the critic's updates (rows x columns per
    pass; at least one row): bounds activation memory, the same gradient up to rounding; 0 = none."""
    seed_per_problem: bool | None = None
    """Sample each problem group from its own seed (seed, iteration, turn, problem position), so that
    the samples do not depend on how problems are split across processes. Unset: on with several
    processes (torchrun / accelerate launch), off with one."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_ints(self, {"num_problems": 1, "num_generations": 1, "num_epochs": 1, "micro_batch_tokens": 0})
        if self.seed_per_problem is not None and not isinstance(self.seed_per_problem, bool):
            raise ValueError(f"seed_per_problem must be True, False or None, got {self.seed_per_problem!r}")
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
            logprob_temperature=self.logprob_temperature, micro_batch_tokens=self.micro_batch_tokens,
        )

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


def central_context(
    gens: Mapping[str, Any], roles: Sequence[str], role: str, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The centralised critic's context for ``role``'s response, as PPO and CORY use it (``--critic
    central``): per row, every other role's prompt and response (roles in env order), then ``role``'s
    own prompt -> (N, L) ids, mask, left-padded (:func:`critic_inputs`). The critic reads ``role``'s
    response tokens after it, so its value before each of them has seen every agent's prompt and
    response (the later tokens of ``role``'s own response excepted, as a token-level value must).
    ``gens``: role -> ``agents.Generation`` of one batch (rows aligned across roles)."""
    others = [r for r in roles if r != role]
    n = len(gens[role].prompt_ids)
    empty = torch.zeros((n, 0), dtype=torch.long)
    prompts = {r: (gens[r].prompt_ids, gens[r].prompt_mask) for r in [*others, role]}
    responses = {r: (gens[r].response_ids, gens[r].response_mask) for r in others}
    responses[role] = (empty, empty)
    return critic_inputs(prompts, responses, [*others, role], pad_id)


def central_forward(
    policy: Any,
    model: str,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    context: tuple[torch.Tensor, torch.Tensor],
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``policy.forward(model, ..., with_values=True)`` with the values of the central critic instead
    of ``model``'s own head: (N, T) log-probs of ``model``'s response under its adapter and (N, T) values
    of the critic adapter reading ``context`` (:func:`central_context`) then the same response tokens."""
    logprobs = policy.logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature=temperature)
    values = policy.values(CRITIC, context[0], context[1], response_ids, response_mask)
    return logprobs, values


def central_contexts(
    turns: Mapping[str, Sequence[Any]], roles: Sequence[str], role: str, pad_id: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """:func:`central_context` of each turn of ``role``'s episodes: ``turns`` maps every role to its
    ``Generation`` of each turn (PPO's multi-turn episodes; every role acts on every turn)."""
    counts = {r: len(turns[r]) for r in roles}
    if len(set(counts.values())) != 1:
        raise ValueError(f"--critic central needs every role to act on every turn, got turns per role {counts}")
    return [central_context({r: turns[r][k] for r in roles}, roles, role, pad_id) for k in range(counts[role])]


def central_score_turn(
    policy: Any, model: str, gen: Any, context: tuple[torch.Tensor, torch.Tensor], temperature: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``experience.score_turn`` with the central critic's values: (N, T) log-probs of ``model`` and of
    the reference (one pass where the policy can), and the critic's values reading ``context`` then
    the response. No grad."""
    args = (gen.prompt_ids, gen.prompt_mask, gen.response_ids, gen.response_mask)
    logprobs, _, ref_logprobs = policy.score(model, *args, with_reference=True, temperature=temperature)
    with torch.no_grad():
        values = policy.values(CRITIC, context[0], context[1], gen.response_ids, gen.response_mask)
    return logprobs, values, ref_logprobs


def value_loss(
    values: torch.Tensor, old: torch.Tensor, returns: torch.Tensor, clip: float, denominator: float | None = None
) -> torch.Tensor:
    """PPO's value loss: (N,) -> scalar, 0.5 * max((V - R)^2, (clip(V, old +- clip) - R)^2) averaged
    (``denominator``: summed and divided by it instead, e.g. the rows of every process and part).

    >>> float(value_loss(torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([0.0]), 0.5))
    2.0
    """
    loss = (values - returns) ** 2
    if clip > 0:
        clipped = old + (values - old).clamp(-clip, clip)
        loss = torch.maximum(loss, (clipped - returns) ** 2)
    if denominator is not None:
        return 0.5 * loss.sum() / max(float(denominator), 1.0)
    return 0.5 * loss.mean()


def whiten(x: torch.Tensor, *, across_ranks: bool = False) -> torch.Tensor:
    """(N, T) -> mean 0, std 1 over every entry (unbiased std clamped at 1e-6). ``across_ranks``: the
    mean and std of every process's entries together (data-parallel runs)."""
    if not across_ranks:
        return (x - x.mean()) / x.std().clamp(min=1e-6) if x.numel() > 1 else x - x.mean()
    from baselines.distributed import all_sum

    total, count = all_sum([float(x.sum()), float(x.numel())])
    mean = total / count
    squares = all_sum(float(((x.double() - mean) ** 2).sum()))
    if count <= 1:
        return x - mean
    return (x - mean) / max(math.sqrt(squares / (count - 1)), 1e-6)


def row_chunks(ids: torch.Tensor, token_budget: int) -> list[slice]:
    """Slices of at most ``token_budget // width`` rows of an (N, width) batch (at least one row per
    slice; 0: one slice of every row)."""
    n = len(ids)
    size = max(1, token_budget // max(ids.shape[1], 1)) if token_budget else max(n, 1)
    return [slice(i, i + size) for i in range(0, n, size)]


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
    return {"value_loss": float(np.mean(losses)), "grad_norm": float(np.mean(norms))}


# ----------------------------------------------------------------------------------------- main
def main(config: Config) -> dict[str, Any]:
    """Train MAAC; returns the last iteration's metrics plus ``eval_before/*`` and ``eval/*``.

    Under torchrun or accelerate launch (``WORLD_SIZE`` > 1) every process plays its share of each
    iteration's problems (each problem group sampled from its own seed); advantages are whitened over
    the whole batch and the actors' and the critic's gradients summed over processes
    (baselines/distributed.py). The run around the loop (directory, logs, evaluations, checkpoints,
    Ctrl-C, ``--resume``; rank 0 alone evaluates, logs and writes checkpoints) is :mod:`baselines.run`'s."""
    from agents import LoraSettings, MultiAgentPolicy
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
    policy = MultiAgentPolicy.from_pretrained(
        [*agents, CRITIC], config.model, dtype=config.dtype, value_head=True,
        device=distributed.device_for("data-parallel", agents, run.info, config.device)[agents[0]],
        lora=LoraSettings(rank=config.lora_rank, alpha=config.lora_alpha), backend=config.backend,
    )
    venv = VectorEnv(config.env, len(positions) * g, max_new_tokens=config.max_new_tokens,
                     stop_token_ids=list(policy.eos_token_ids), **env_kwargs)
    n_train = len(venv.envs[0].task.problems("train"))
    optimizers = {a: policy.optimizer(a, lr=config.learning_rate) for a in agents}
    optimizers[CRITIC] = policy.optimizer(CRITIC, lr=config.critic_learning_rate)
    actor_config = config.actor_config()
    run.resume(policy, optimizers)
    run.start(policy, optimizers, env_kwargs=env_kwargs, weights="actor and critic weights")

    metrics: dict[str, float] = {}
    with run.interruptible():
        run.evaluate_before()
        for iteration in run.iterations():
            t0 = time.perf_counter()
            problems = run.rng.choice(n_train, size=config.num_problems, replace=n_train < config.num_problems)
            options = [{"task_index": int(problems[b]), "split": "train"} for b in positions for _ in range(g)]
            seeds = [config.seed * 1_000_003 + iteration * n_envs + b * g + k for b in positions for k in range(g)]
            turns = rollout(policy, venv, seeds, options, actor_config, positions if per_problem else None, iteration)
            t_rollout = time.perf_counter() - t0
            distributed.check_equal(len(turns), "turns per episode")

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
                old_values = torch.stack(
                    [torch.cat([critic_values(policy, ids[c], mask[c]).float().cpu()
                                for c in row_chunks(ids, config.micro_batch_tokens)])
                     for ids, mask in inputs],
                    1,
                )  # (N, turns)
            advantages = returns - old_values
            if config.whiten_advantages:
                advantages = whiten(advantages, across_ranks=run.info.distributed)

            metrics = {}
            for agent in agents:
                stats = update_agent(policy, optimizers[agent], agent, turns, advantages, actor_config)
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
                "agent_critic/grad_norm": critic_stats["grad_norm"],
                "charts/critic_value": float(rows["old_values"].mean()),
                "charts/critic_explained_variance": float(explained),
                "charts/episode_return": float(rows["returns"][:, 0].mean()),
                "charts/iteration": step,
                "charts/s_per_iteration": elapsed,
                "charts/rollout_fraction": t_rollout / elapsed,
            })
            run.write_samples(step, venv.envs, seeds, options)
            run.end_iteration(step, metrics, reward=f"{metrics['reward/total']:.3f}", s_it=f"{elapsed:.1f}")
        run.evaluate_after()
    result = run.finish(metrics)
    venv.close()
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
