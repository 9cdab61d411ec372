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
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

LEARNER = "maac"
CRITIC = "critic"
"""The critic's adapter name in the policy (an env agent may not use it)."""


@dataclass
class Config:
    """MAAC settings. Every field is a ``--flag`` of ``llm-envs train maac``."""

    env: str = "writing/xsum-v0"
    """Registered env id (``llm-envs list``); parallel protocol."""
    model: str | None = None
    """HF model id or local directory; unset for the embedded SmolLM2-135M-Instruct."""
    max_source_words: int | None = None
    """Writing envs: cut source documents to this many words."""
    data_path: str | None = None
    """Local copy of a hub dataset for envs that take ``data_path``."""
    num_turns: int = 1
    """Turns per episode."""
    transition: str | None = None
    """The env's turn transition (llm_envs/transitions.py): unset for the task's feedback, or a
    registered name / module:function."""
    seed: int = 0
    """Seeds python, numpy, torch and the envs."""

    num_iterations: int = 100
    """Training iterations (one batch of rollouts, then the actor and critic updates)."""
    num_problems: int = 2
    """B: problems per iteration."""
    num_generations: int = 4
    """G: episodes per problem."""
    max_new_tokens: int = 64
    """Response length of every agent."""
    temperature: float = 0.7
    """Sampling temperature."""
    top_p: float = 0.9
    """Nucleus sampling mass."""
    top_k: int = 50
    """Top-k sampling; 0 disables it."""

    learning_rate: float = 5e-5
    """AdamW learning rate of every actor's adapter."""
    critic_learning_rate: float = 5e-5
    """AdamW learning rate of the critic's adapter and value head."""
    lora_rank: int = 16
    """LoRA rank of every adapter (actors and critic)."""
    lora_alpha: float = 32.0
    """LoRA alpha."""
    num_epochs: int = 2
    """Actor and critic epochs on each batch (epochs after the first use the clipped ratio)."""
    clip_eps: float = 0.2
    """Ratio clip range of the actors' surrogate."""
    clip_value: float = 0.2
    """Clip range of the critic's estimate around its old one (0 disables)."""
    whiten_advantages: bool = True
    """Normalise the advantages over the batch to mean 0, std 1."""
    gamma: float = 0.9
    """Discount of later turns' rewards."""
    loss_aggregation: Literal["token-mean", "sequence-sum"] = "token-mean"
    """Actor loss over response tokens: mean over the batch's tokens, or sum per response."""
    max_grad_norm: float = 1.0
    """Clip each actor's and the critic's gradient norm; 0 disables clipping."""

    micro_batch_tokens: int = 512
    """Token budget of one forward/backward of the actors' and the critic's updates (rows x columns
    per pass; at least one row): bounds activation memory, the same gradient up to rounding; 0 = none."""

    eval_every: int = 0
    """Evaluate every this many iterations (0: only before and after training)."""
    num_eval_problems: int = 8
    """Eval-split problems evaluated before and after training (0 disables evaluation)."""
    output_dir: str = "runs"
    """Where run directories go."""
    run_name: str | None = None
    """Run directory name; default ``maac__<env>__s<seed>``."""
    checkpoint_every: int = 10
    """Save a checkpoint every this many iterations (0: only at the end and on Ctrl-C)."""
    resume: bool = False
    """Continue the run in ``output_dir/run_name`` from its latest checkpoint."""
    overwrite: bool = False
    """Start afresh in a run directory that already holds a checkpoint (deletes it)."""
    tensorboard: bool = True
    """Also write TensorBoard event files."""
    seed_per_problem: bool | None = None
    """Sample each problem group from its own seed (seed, iteration, turn, problem position), so that
    the samples do not depend on how problems are split across processes. Unset: on with several
    processes (torchrun / accelerate launch), off with one."""
    progress: bool = True
    """Show a progress bar."""
    device: str | None = None
    """torch device; unset picks a GPU when present."""
    dtype: str | None = None
    """Model dtype: float32 on CPU by default, bfloat16 on a GPU."""
    threads: int | None = None
    """torch CPU threads (unset: torch's default)."""

    def __post_init__(self) -> None:
        for name in ("num_turns", "num_iterations", "num_problems", "num_generations", "max_new_tokens",
                     "lora_rank", "num_epochs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        for name in ("top_k", "num_eval_problems", "eval_every", "checkpoint_every", "micro_batch_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        ranges = {
            "temperature": (self.temperature > 0, "> 0"),
            "top_p": (0 < self.top_p <= 1, "in (0, 1]"),
            "learning_rate": (self.learning_rate > 0, "> 0"),
            "critic_learning_rate": (self.critic_learning_rate > 0, "> 0"),
            "lora_alpha": (self.lora_alpha > 0, "> 0"),
            "clip_eps": (0 < self.clip_eps < 1, "in (0, 1)"),
            "clip_value": (self.clip_value >= 0, ">= 0"),
            "gamma": (0 <= self.gamma <= 1, "in [0, 1]"),
            "max_grad_norm": (self.max_grad_norm >= 0, ">= 0"),
        }
        for name, (ok, text) in ranges.items():
            value = getattr(self, name)
            if not ok or not math.isfinite(value):
                raise ValueError(f"{name} must be {text}, got {value!r}")
        if self.loss_aggregation not in ("token-mean", "sequence-sum"):
            raise ValueError(f"loss_aggregation must be 'token-mean' or 'sequence-sum', got {self.loss_aggregation!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be a positive int or None, got {self.threads!r}")
        if self.seed_per_problem is not None and not isinstance(self.seed_per_problem, bool):
            raise ValueError(f"seed_per_problem must be True, False or None, got {self.seed_per_problem!r}")

    def env_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"num_turns": self.num_turns}
        if self.model is not None:
            kwargs["tokenizer"] = self.model
        if self.max_source_words is not None:
            kwargs["max_source_words"] = self.max_source_words
        if self.data_path is not None:
            kwargs["data_path"] = self.data_path
        if self.transition is not None:
            kwargs["transition"] = self.transition
        return kwargs

    def run_dir(self) -> Path:
        name = self.run_name or f"{LEARNER}__{self.env.replace('/', '_')}__s{self.seed}"
        return Path(self.output_dir) / name

    def actor_config(self) -> Any:
        """The settings magrpo's rollout and actor update read (baselines.magrpo.update_agent)."""
        from baselines.magrpo import Config as MAGRPOConfig

        return MAGRPOConfig(
            env=self.env, num_turns=self.num_turns, seed=self.seed, num_problems=self.num_problems,
            num_generations=self.num_generations, max_new_tokens=self.max_new_tokens,
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, learning_rate=self.learning_rate,
            num_epochs=self.num_epochs, clip_eps=self.clip_eps, loss_aggregation=self.loss_aggregation,
            max_grad_norm=self.max_grad_norm, baseline="none", gamma=self.gamma,
            micro_batch_tokens=self.micro_batch_tokens,
        )


RESUMABLE_FIELDS = (
    "num_iterations", "resume", "progress", "tensorboard", "checkpoint_every", "eval_every", "device",
    "threads", "output_dir", "run_name",
)
"""Fields that may change when a run is resumed (they do not change what is computed)."""


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
    from baselines import distributed

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
    (baselines/distributed.py). Only rank 0 evaluates, logs, plots and writes checkpoints. Ctrl-C saves
    the last finished iteration; ``--resume`` continues from the newest checkpoint."""
    import shutil

    from tqdm.auto import tqdm

    from agents import LoraSettings, MultiAgentPolicy
    from baselines import distributed
    from baselines.common import (
        MetricLogger,
        TrainerState,
        check_run_dir,
        evaluate,
        interrupted,
        plot_metrics,
        probe_env,
        resume_checkpoint,
        save_checkpoint,
        seed_everything,
    )
    from baselines.magrpo import discounted_returns, rollout, update_agent
    from llm_envs.core.vector import VectorEnv

    if config.threads is not None:
        torch.set_num_threads(config.threads)
    info = distributed.init_from_env()
    main_rank = info.is_main
    per_problem = info.distributed if config.seed_per_problem is None else config.seed_per_problem
    if info.distributed and not per_problem:
        raise ValueError(
            f"seed_per_problem=False with {info.world_size} processes: each process would sample its share "
            "from its own global RNG stream; leave --seed-per-problem unset (or True) for data-parallel runs"
        )
    if config.num_problems < info.world_size:
        raise ValueError(
            f"num_problems={config.num_problems} cannot be shared among {info.world_size} processes; every "
            f"process needs at least one problem per iteration (num_problems >= {info.world_size})"
        )
    run_dir = config.run_dir()
    check_run_dir(run_dir, resume=config.resume, overwrite=config.overwrite)  # before loading a model
    distributed.barrier()  # every rank has checked the directory before rank 0 changes it
    if not config.resume and config.overwrite and main_rank and (run_dir / "checkpoints").exists():
        shutil.rmtree(run_dir / "checkpoints")
    rng = seed_everything(config.seed)
    positions = distributed.shard(range(config.num_problems))  # this rank's problems of each batch
    g = config.num_generations
    n_envs = config.num_problems * g
    agents, _ = probe_env(config.env, max_new_tokens=config.max_new_tokens, **config.env_kwargs())
    if CRITIC in agents:
        raise ValueError(f"env {config.env!r} has an agent named {CRITIC!r}, the name of MAAC's critic adapter")
    device = distributed.device_for("data-parallel", agents, info, config.device)[agents[0]]
    policy = MultiAgentPolicy.from_pretrained(
        [*agents, CRITIC], config.model, dtype=config.dtype, device=device, value_head=True,
        lora=LoraSettings(rank=config.lora_rank, alpha=config.lora_alpha),
    )
    venv = VectorEnv(config.env, len(positions) * g, max_new_tokens=config.max_new_tokens,
                     stop_token_ids=list(policy.eos_token_ids), **config.env_kwargs())
    n_train = len(venv.envs[0].task.problems("train"))
    optimizers = {a: policy.optimizer(a, lr=config.learning_rate) for a in agents}
    optimizers[CRITIC] = policy.optimizer(CRITIC, lr=config.critic_learning_rate)
    actor_config = config.actor_config()

    start, extra = 0, {}
    if config.resume:
        trainer = resume_checkpoint(run_dir, learner=LEARNER, config=config, policy=policy, optimizers=optimizers,
                                    rng=rng, ignore=RESUMABLE_FIELDS)
        start, extra = int(trainer["step"]), dict(trainer["extra"])
    all_params = [p for name in optimizers for p in policy.parameters(name)]
    distributed.broadcast_params(all_params)  # identical replicas whatever each rank's RNG did
    logger = None
    if main_rank:
        logger = MetricLogger(run_dir, tensorboard=config.tensorboard, config=config,
                              resume_step=start if config.resume else None)

    def log(step: int, values: dict[str, float]) -> None:
        if logger is not None:
            logger.log(step, values)

    def run_eval() -> dict[str, float]:
        if config.num_eval_problems == 0:
            return {}
        if not main_rank:  # the replicas are identical: rank 0 evaluates, the others wait for it
            distributed.barrier()
            return {}
        result = evaluate(policy, config.env, num_problems=config.num_eval_problems,
                          max_new_tokens=config.max_new_tokens, greedy=True, seed=config.seed,
                          env_kwargs=config.env_kwargs())
        distributed.barrier()
        return result

    def boundary(step: int) -> TrainerState | None:
        """The state after iteration ``step`` (rank 0 only: it alone writes checkpoints)."""
        if not main_rank:
            return None
        return TrainerState.capture(step=step, policy=policy, optimizers=optimizers, rng=rng, extra=extra)

    def checkpoint(state: TrainerState | None, step: int, wait: bool = True) -> Path:
        path = run_dir / "checkpoints" / f"step_{step:06d}"
        if wait:
            distributed.check_in_sync(all_params, "actor and critic weights")
        if state is not None:
            path = save_checkpoint(run_dir, state, learner=LEARNER, config=config, policy=policy)
        if wait:
            distributed.barrier()  # nobody reads or resumes from a half-written checkpoint
        return path

    metrics: dict[str, float] = {}
    bar = tqdm(range(start, config.num_iterations), initial=start, total=config.num_iterations,
               disable=not (config.progress and main_rank), desc="maac", dynamic_ncols=True)
    step = start
    state = boundary(start)  # Ctrl-C saves the last iteration boundary's state, never a half-done iteration
    policy.train()
    try:
        if "eval_before" not in extra:
            before = run_eval()
            if main_rank:
                extra["eval_before"] = before
            if before:
                log(0, before)
            state = boundary(start)
        for iteration in bar:
            t0 = time.perf_counter()
            problems = rng.choice(n_train, size=config.num_problems, replace=n_train < config.num_problems)
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
                advantages = whiten(advantages, across_ranks=info.distributed)

            metrics = {}
            for agent in agents:
                stats = update_agent(policy, optimizers[agent], agent, turns, advantages, actor_config)
                for key, value in stats.items():
                    metrics[f"agent_{agent}/{key}"] = value
            critic_stats = update_critic(policy, optimizers[CRITIC], inputs, old_values, returns, config)
            rows = distributed.gather_rows({"returns": returns, "old_values": old_values})
            last = distributed.gather_rows(dict(turns[-1].infos[agents[0]]))
            explained = 1 - (rows["returns"] - rows["old_values"]).var() / rows["returns"].var().clamp(min=1e-8)
            step = iteration + 1
            elapsed = time.perf_counter() - t0
            metrics.update({
                "losses/value_loss": critic_stats["value_loss"],
                "losses/pg_loss": float(np.mean([metrics[f"agent_{a}/pg_loss"] for a in agents])),
                "agent_critic/grad_norm": critic_stats["grad_norm"],
                "charts/critic_value": float(rows["old_values"].mean()),
                "charts/critic_explained_variance": float(explained),
                "reward/total": float(np.mean(last["reward_total"])),
                "charts/episode_return": float(rows["returns"][:, 0].mean()),
                "charts/iteration": step,
                "charts/s_per_iteration": elapsed,
                "charts/rollout_fraction": t_rollout / elapsed,
            })
            for key, value in last.items():
                if key.startswith("reward_") and key != "reward_total":
                    metrics[f"reward/{key[len('reward_'):]}"] = float(np.mean(value))
            if config.eval_every and step % config.eval_every == 0 and step < config.num_iterations:
                metrics.update(run_eval())
            log(step, metrics)
            bar.set_postfix(reward=f"{metrics['reward/total']:.3f}")
            state = boundary(step)
            if config.checkpoint_every and step % config.checkpoint_every == 0 and step < config.num_iterations:
                checkpoint(state, step)
        bar.close()
        final_eval = run_eval()
    except KeyboardInterrupt:
        bar.close()
        interrupted(state, run_dir, checkpoint, wait=not info.distributed)
        if logger is not None:
            logger.close()
        raise

    if final_eval:
        log(step, final_eval)
    checkpoint(state, step)
    if logger is not None:
        logger.close()
    venv.close()
    result: dict[str, Any] = dict(metrics)
    result.update(final_eval)
    result.update({f"eval_before/{k.split('/', 1)[1]}": v for k, v in extra.get("eval_before", {}).items()})
    if main_rank:
        try:
            result["plot"] = str(plot_metrics(run_dir / "metrics.jsonl"))
        except ValueError:
            pass  # nothing to plot yet (no iteration ran)
    result["run_dir"] = str(run_dir)
    return result


def summary(result: dict[str, Any]) -> str:
    """Closing lines of a run: eval reward before and after per component, and where the plot is."""
    from baselines.common import eval_table

    lines = eval_table(result)
    if "reward/total" in result:
        lines.append(f"last training reward {result['reward/total']:.3f}")
    lines.append(f"run:  {result.get('run_dir')}")
    return "\n".join(lines)


if __name__ == "__main__":
    import tyro

    print(summary(main(tyro.cli(Config))))
