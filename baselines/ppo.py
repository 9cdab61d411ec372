"""PPO for language agents: one independent PPO learner per agent (Ziegler et al. 2019's RLHF recipe,
as in TRL's former ``PPOTrainer``), on single-agent and multi-agent envs. Docs: docs/ppo.md.

1. Draw one response length in [min_new_tokens, max_new_tokens] for the batch; play a batch of
   episodes through the env (parallel envs: all agents at once; sequential envs such as CORY's: role
   by role), each agent sampling from its own LoRA adapter.
2. Per agent and token: reward = -kl_coef * (log pi - log pi_ref) (the reference is the base model
   with adapters off, on the agent's own prompt); the env's reward is added on the last response token.
3. Values from the agent's value head; GAE (gamma, lambda) gives advantages (whitened) and returns.
4. ``num_ppo_epochs`` passes over shuffled minibatches: clipped policy loss + vf_coef * clipped
   value loss, one optimizer (adapter + value head) per agent.
5. The KL coefficient adapts to the measured KL (target, horizon) or stays fixed.

Run it::

    llm-envs train ppo --env sentiment/imdb-v0 --num-iterations 100
    llm-envs train ppo --env sentiment/imdb-cory-v0      # two independent PPO agents, no role swaps

CORY (:mod:`baselines.cory`) is this learner with two models that swap roles.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch

LEARNER = "ppo"


@dataclass
class Config:
    """PPO settings. Every field is a ``--flag`` of ``llm-envs train ppo``."""

    learner: ClassVar[str] = LEARNER

    env: str = "sentiment/imdb-v0"
    """Registered env id (``llm-envs list``); single-turn, parallel or sequential protocol."""
    model: str | None = None
    """HF model id or local directory; unset for the embedded SmolLM2-135M-Instruct."""
    data_path: str | None = None
    """Local copy of a hub dataset for envs that take ``data_path``."""
    seed: int = 0
    """Seeds python, numpy, torch and the envs."""

    num_iterations: int = 100
    """Training iterations (one batch of episodes and one PPO update per agent each)."""
    batch_size: int = 16
    """Episodes per iteration (the paper: 256)."""
    minibatch_size: int = 16
    """Episodes per gradient step; must divide batch_size (the paper: 256 = the whole batch)."""
    num_ppo_epochs: int = 4
    """Passes over the batch per iteration."""
    min_new_tokens: int = 4
    """Shortest response length; one length in [min_new_tokens, max_new_tokens] is drawn per batch and
    shared by every agent (IMDB in the paper: 4-16). Set both equal for a fixed length."""
    max_new_tokens: int = 16
    """Longest response length (the env's action length)."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass (the paper: 1.0)."""
    top_k: int = 0
    """Top-k sampling; 0 disables it (the paper: 0)."""
    logprob_temperature: Literal["raw", "sampling"] = "raw"
    """Temperature of the log-probs the loss uses: ``raw`` (1: the untempered policy, as the reference
    trainers score) or ``sampling`` (the sampling ``temperature``: the tempered distribution, as TRL's
    GRPO scores); the same at generation, in the update and for the reference (docs/magrpo.md)."""
    repetition_penalty: float = 1.0
    """Repetition penalty while sampling (the CORY code: 1.1). It changes what is sampled, not the
    log-probs PPO uses, so above 1 rollouts are slightly off-policy."""

    learning_rate: float = 1e-4
    """AdamW learning rate of each agent's adapter and value head (the paper fully fine-tunes GPT-2 at
    1.41e-5; a LoRA adapter needs a larger step)."""
    lora_rank: int = 16
    """LoRA rank of each agent's adapter."""
    lora_alpha: float = 32.0
    """LoRA alpha (the update is scaled by alpha / rank)."""
    init_kl_coef: float = 0.3
    """Initial weight of the per-token KL penalty to the reference (the paper: 0.3)."""
    adaptive_kl: bool = True
    """Adapt the KL weight towards kl_target (Ziegler et al.); else keep init_kl_coef."""
    kl_target: float = 6.0
    """Target KL (summed over a response, nats) of the adaptive controller."""
    kl_horizon: int = 10000
    """Horizon (in episodes) of the adaptive controller."""
    gamma: float = 1.0
    """Discount over response tokens."""
    lam: float = 0.95
    """GAE lambda."""
    clip_eps: float = 0.2
    """Policy ratio clip range."""
    clip_value: float = 0.2
    """Value clip range (around the rollout's values)."""
    vf_coef: float = 0.1
    """Weight of the value loss."""
    whiten_advantages: bool = True
    """Normalise advantages to mean 0, std 1 over the batch's response tokens."""
    max_grad_norm: float = 1.0
    """Clip each agent's gradient norm; 0 disables clipping."""
    eta: float = 0.01
    """Weight of the KL in the logged combined metric ``r - eta * KL`` (logging only)."""
    critic: Literal["per-agent", "central"] = "per-agent"
    """Value function: ``per-agent`` (a value head on each model's adapter: IAC) or ``central`` (one
    critic adapter + value head, MAAC's, shared by every model, reading every agent's prompt and response
    before the scored tokens; its own optimizer at learning_rate; baselines/maac.py)."""

    eval_every: int = 0
    """Evaluate every this many iterations (0: only before and after training)."""
    num_eval_problems: int = 16
    """Eval-split problems per evaluation (0 disables evaluation)."""
    eval_greedy: bool = True
    """Greedy decoding at evaluation (else the training sampling settings)."""
    samples_every: int = 10
    """Write the first few episodes of every this many training batches to ``<run>/samples.jsonl``
    (0: none); every evaluation writes all its episodes there."""

    output_dir: str = "runs"
    """Where run directories go."""
    run_name: str | None = None
    """Run directory name; default ``<learner>__<env>__s<seed>``."""
    checkpoint_every: int = 10
    """Save a checkpoint every this many iterations (0: only at the end and on Ctrl-C)."""
    resume: bool = False
    """Continue the run in ``output_dir/run_name`` from its latest checkpoint."""
    tensorboard: bool = True
    """Also write TensorBoard event files (``<run>/tb``)."""
    wandb_project: str | None = None
    """Log to this Weights & Biases project (needs ``wandb``; imported only when set)."""
    progress: bool = True
    """Show a progress bar with the live reward."""
    device: str | None = None
    """torch device; unset picks a GPU when present."""
    dtype: str | None = None
    """Base model dtype: unset = bfloat16 on a GPU or on a CPU with native bf16 (avx512_bf16 / AMX), else
    float32 (``agents.models.resolve_dtype``); adapters, value heads and optimizer states stay float32."""
    backend: Literal["auto", "engine", "generate"] = "auto"
    """Generation backend: ``auto`` (the rollout engine, agents/engine.py, when it supports the model,
    else transformers' ``generate``), ``engine`` or ``generate``; see docs/agents.md."""
    threads: int | None = None
    """torch CPU threads (unset: torch's default)."""
    seed_per_episode: bool | None = None
    """Sample each episode on its own from a seed of (seed, iteration, episode position), so that the
    samples do not depend on how episodes are split across processes. Unset: on with several
    processes (torchrun / accelerate launch), off with one (one batched generate per step)."""

    def __post_init__(self) -> None:
        ints = {
            "num_iterations": 1,
            "batch_size": 1,
            "minibatch_size": 1,
            "num_ppo_epochs": 1,
            "min_new_tokens": 1,
            "max_new_tokens": 1,
            "lora_rank": 1,
            "kl_horizon": 1,
            "top_k": 0,
            "eval_every": 0,
            "num_eval_problems": 0,
            "checkpoint_every": 0,
            "samples_every": 0,
        }
        for name, low in ints.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        if self.batch_size % self.minibatch_size:
            raise ValueError(
                f"minibatch_size must divide batch_size, got batch_size={self.batch_size!r} and "
                f"minibatch_size={self.minibatch_size!r}"
            )
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens ({self.min_new_tokens!r}) must be <= max_new_tokens ({self.max_new_tokens!r})"
            )
        ranges: dict[str, tuple[bool, str]] = {
            "temperature": (self.temperature > 0, "> 0"),
            "top_p": (0 < self.top_p <= 1, "in (0, 1]"),
            "repetition_penalty": (self.repetition_penalty > 0, "> 0"),
            "learning_rate": (self.learning_rate > 0, "> 0"),
            "lora_alpha": (self.lora_alpha > 0, "> 0"),
            "init_kl_coef": (self.init_kl_coef >= 0, ">= 0"),
            "kl_target": (self.kl_target > 0, "> 0"),
            "gamma": (0 <= self.gamma <= 1, "in [0, 1]"),
            "lam": (0 <= self.lam <= 1, "in [0, 1]"),
            "clip_eps": (0 < self.clip_eps < 1, "in (0, 1)"),
            "clip_value": (self.clip_value > 0, "> 0"),
            "vf_coef": (self.vf_coef >= 0, ">= 0"),
            "max_grad_norm": (self.max_grad_norm >= 0, ">= 0"),
            "eta": (self.eta >= 0, ">= 0"),
        }
        for name, (ok, wanted) in ranges.items():
            value = getattr(self, name)
            if not ok or not math.isfinite(value):
                raise ValueError(f"{name} must be {wanted}, got {value!r}")
        if self.threads is not None and (isinstance(self.threads, bool) or self.threads < 1):
            raise ValueError(f"threads must be a positive int or None, got {self.threads!r}")
        if self.seed_per_episode is not None and not isinstance(self.seed_per_episode, bool):
            raise ValueError(f"seed_per_episode must be True, False or None, got {self.seed_per_episode!r}")
        if self.critic not in ("per-agent", "central"):
            raise ValueError(f"critic must be 'per-agent' or 'central', got {self.critic!r}")

    def scoring_temperature(self) -> float:
        """The temperature of the log-probs in the loss (1.0 for ``logprob_temperature="raw"``)."""
        return self.temperature if self.logprob_temperature == "sampling" else 1.0

    def env_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {}
        if self.model is not None:
            kwargs["tokenizer"] = self.model  # the env must speak the model's token ids
        if self.data_path is not None:
            kwargs["data_path"] = self.data_path
        return kwargs

    def run_dir(self) -> Path:
        name = self.run_name or f"{self.learner}__{self.env.replace('/', '_')}__s{self.seed}"
        return Path(self.output_dir) / name


RESUMABLE_FIELDS = (
    "num_iterations",
    "backend",
    "resume",
    "progress",
    "tensorboard",
    "wandb_project",
    "checkpoint_every",
    "eval_every",
    "samples_every",
    "device",
    "threads",
    "output_dir",
    "run_name",
)
"""Fields that may change when a run is resumed (they do not change what is computed)."""


# ----------------------------------------------------------------------------------------- math
def whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, *, across_ranks: bool = False
) -> torch.Tensor:
    """(N, T) -> (N, T): (x - mean) / std over the unmasked entries (unbiased variance, as TRL);
    ``shift_mean=False`` adds the mean back. Masked entries become 0. ``across_ranks``: the mean and
    variance are those of every process's entries together (data-parallel runs; a no-op difference
    with one process, apart from summing in float64).

    >>> whiten(torch.tensor([[1.0, 3.0, 7.0]]), torch.tensor([[1, 1, 0]]))
    tensor([[-0.7071,  0.7071,  0.0000]])
    """
    from baselines.common import masked_mean

    mask_f = mask.to(values.dtype)
    if across_ranks:
        from baselines.distributed import all_sum

        total, count = all_sum([float((values * mask_f).sum()), float(mask_f.sum())])
        mean = torch.tensor(total / max(count, 1.0), dtype=values.dtype, device=values.device)
        squares = all_sum(float(((values - mean) ** 2 * mask_f).sum()))
        var = torch.tensor(squares / max(count - 1.0, 1.0), dtype=values.dtype, device=values.device)
    else:
        mean = masked_mean(values, mask_f)
        count = mask_f.sum()
        var = ((values - mean) ** 2 * mask_f).sum() / (count - 1).clamp(min=1.0)
    out = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        out = out + mean
    return out * mask_f


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over response tokens: (N, T) rewards, values, mask ->
    (advantages, returns), both (N, T), 0 where the mask is 0.

    ``delta_t = r_t + gamma V_{t+1} - V_t`` with ``V`` past the last unmasked token taken as 0 (the
    episode ends there); ``A_t = delta_t + gamma lam A_{t+1}``; returns ``= A + V``.

    >>> gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.5]]), torch.ones(1, 2), 1.0, 1.0)[0]
    tensor([[0.5000, 0.5000]])
    """
    if not rewards.shape == values.shape == mask.shape or rewards.dim() != 2:
        raise ValueError(
            f"rewards, values and mask must be equal (N, T) tensors, got {tuple(rewards.shape)}, "
            f"{tuple(values.shape)} and {tuple(mask.shape)}"
        )
    mask_f = mask.to(values.dtype)
    values = values * mask_f
    rewards = rewards * mask_f
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(values[:, 0])  # (N,)
    length = values.shape[1]
    for t in range(length - 1, -1, -1):
        next_value = values[:, t + 1] if t + 1 < length else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam * running) * mask_f[:, t]
        advantages[:, t] = running
    return advantages, (advantages + values) * mask_f


def token_rewards(
    scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, kl_coef: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards: (N,) task scores, (N, T) log-probs under the policy and the reference, (N, T)
    mask -> (rewards (N, T), kl (N, T)). ``kl = log pi - log pi_ref``; reward ``= -kl_coef * kl``, plus
    the score on the last unmasked token of each row.

    >>> token_rewards(torch.tensor([2.0]), torch.tensor([[-1.0, -1.0, 0.0]]),
    ...               torch.tensor([[-2.0, -1.5, 0.0]]), torch.tensor([[1, 1, 0]]), 0.1)[0].tolist()
    [[-0.10000000149011612, 1.9500000476837158, -0.0]]
    """
    mask_f = mask.to(logprobs.dtype)
    kl = (logprobs - ref_logprobs) * mask_f
    rewards = -kl_coef * kl
    lengths = mask.long().sum(1)  # (N,)
    if (lengths == 0).any():
        raise ValueError(
            f"every response needs at least one token; rows {(lengths == 0).nonzero().flatten().tolist()} are empty"
        )
    rows = torch.arange(len(rewards))
    rewards[rows, lengths - 1] += scores.to(rewards.dtype)
    return rewards, kl


def _token_mean(values: torch.Tensor, mask: torch.Tensor, denominator: float | None) -> torch.Tensor:
    from baselines.common import masked_mean

    if denominator is None:
        return masked_mean(values, mask)
    return (values * mask.to(values.dtype)).sum() / max(float(denominator), 1.0)


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    denominator: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate: (N, T) inputs -> (loss, clip fraction), means over unmasked tokens.
    ``loss = mean(max(-A rho, -A clip(rho, 1-eps, 1+eps)))``, ``rho = exp(log pi - log pi_old)``.
    ``denominator`` replaces the local token count (data-parallel: the minibatch's global count, so
    that the ranks' losses add up to the one-process loss).

    >>> clipped_policy_loss(torch.log(torch.tensor([[1.5]])), torch.zeros(1, 1), torch.ones(1, 1),
    ...                     torch.ones(1, 1), 0.2)[0]
    tensor(-1.2000)
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
    loss = _token_mean(torch.maximum(unclipped, clipped), mask, denominator)
    fraction = _token_mean((clipped > unclipped).to(logprobs.dtype), mask, denominator)
    return loss, fraction.detach()


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_value: float,
    denominator: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss: (N, T) inputs -> (loss, clip fraction).
    ``loss = 0.5 mean(max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2))`` over unmasked tokens
    (``denominator``: as in :func:`clipped_policy_loss`).

    >>> clipped_value_loss(torch.tensor([[1.0]]), torch.tensor([[0.5]]), torch.tensor([[0.0]]),
    ...                    torch.ones(1, 1), 0.2)[0]
    tensor(0.5000)
    """
    clipped_values = torch.maximum(torch.minimum(values, old_values + clip_value), old_values - clip_value)
    losses = (values - returns) ** 2
    losses_clipped = (clipped_values - returns) ** 2
    loss = 0.5 * _token_mean(torch.maximum(losses, losses_clipped), mask, denominator)
    fraction = _token_mean((losses_clipped > losses).to(values.dtype), mask, denominator)
    return loss, fraction.detach()


class AdaptiveKLController:
    """Ziegler et al.'s adaptive KL coefficient (TRL's ``AdaptiveKLController``):
    ``e = clip(KL / target - 1, -0.2, 0.2)``; ``coef *= 1 + e * n_steps / horizon``.

    >>> ctl = AdaptiveKLController(0.3, target=6.0, horizon=10000)
    >>> ctl.update(12.0, n_steps=256); round(ctl.value, 6)
    0.301536
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: int) -> None:
        if not init_kl_coef >= 0 or not target > 0 or not horizon >= 1:
            raise ValueError(
                f"need init_kl_coef >= 0, target > 0, horizon >= 1; got {init_kl_coef!r}, {target!r}, {horizon!r}"
            )
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        if not math.isfinite(current_kl):
            raise FloatingPointError(f"the measured KL is {current_kl!r}; the KL controller cannot adapt to it")
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


class FixedKLController:
    """A constant KL coefficient with the adaptive controller's interface."""

    def __init__(self, kl_coef: float) -> None:
        if not kl_coef >= 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef!r}")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing adapts."""


def kl_controller(config: Config) -> AdaptiveKLController | FixedKLController:
    if config.adaptive_kl:
        return AdaptiveKLController(config.init_kl_coef, config.kl_target, config.kl_horizon)
    return FixedKLController(config.init_kl_coef)


# ----------------------------------------------------------------------------------------- update
@dataclass
class Experience:
    """One agent's share of a batch, everything (N, T) but ``scores`` (N,)."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor
    old_values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    kl: torch.Tensor
    scores: torch.Tensor
    critic_context: tuple[torch.Tensor, torch.Tensor] | None = None
    """``--critic central``: the central critic's (N, L) context ids and mask (``maac.central_context``)."""


@torch.no_grad()
def make_experience(
    policy: Any, model: str, gen: Any, scores: torch.Tensor, kl_coef: float, config: Config,
    critic_context: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> Experience:
    """Score one agent's rollout: old log-probs and values (one forward with its adapter; the central
    critic's values given ``critic_context``), reference log-probs (adapters off, on the same prompt),
    per-token rewards, GAE."""
    from baselines.maac import central_forward

    args = (gen.prompt_ids, gen.prompt_mask, gen.response_ids, gen.response_mask)
    temperature = config.scoring_temperature()
    if critic_context is None:
        old_logprobs, old_values = policy.forward(model, *args, with_values=True, temperature=temperature)
    else:
        old_logprobs, old_values = central_forward(policy, model, *args, critic_context, temperature)
    ref_logprobs = policy.ref_logprobs(model, *args, temperature=temperature)
    mask = gen.response_mask.to(old_logprobs.device)
    rewards, kl = token_rewards(scores.to(old_logprobs.device), old_logprobs, ref_logprobs, mask, kl_coef)
    advantages, returns = gae(rewards, old_values, mask, config.gamma, config.lam)
    if config.whiten_advantages:
        from baselines.distributed import world_size

        advantages = whiten(advantages, mask, across_ranks=world_size() > 1)
    return Experience(*args, old_logprobs, old_values, advantages, returns, kl, scores, critic_context)


def ppo_update(
    policy: Any, optimizer: torch.optim.Optimizer, model: str, exp: Experience, config: Config,
    critic_optimizer: torch.optim.Optimizer | None = None,
) -> dict[str, float]:
    """``num_ppo_epochs`` passes of shuffled minibatches over one agent's experience; returns the means
    of the losses and diagnostics. ``critic_optimizer`` (``--critic central``): the central critic's,
    stepped on the value loss of the same minibatches (``exp`` holds the critic's context).

    With several processes each rank holds its contiguous block of the batch's rows. Every rank
    shuffles the *global* row order the same way (rank 0's permutation), so a minibatch is the same
    set of episodes as in one process; each rank computes its rows of it (possibly none) divided by
    the minibatch's global token count, and the gradients are summed over ranks before clipping: the
    gradient of the one-process minibatch loss. The returned statistics are global."""
    from baselines import distributed

    n = len(exp.response_ids)
    spread = distributed.world_size() > 1
    offset, n_total, lengths = 0, n, None
    if spread:
        counts = distributed.gather_rows(torch.tensor([n], dtype=torch.long))
        offset, n_total = int(counts[: distributed.rank()].sum()), int(counts.sum())
        lengths = distributed.gather_rows(exp.response_mask.sum(1).double().cpu())  # (n_total,)
    size = min(config.minibatch_size, n_total)
    stats: dict[str, list[float]] = {
        k: []
        for k in ("policy_loss", "value_loss", "loss", "clip_fraction", "value_clip_fraction", "approx_kl", "grad_norm")
    }
    from baselines.maac import CRITIC

    critic_params = [] if critic_optimizer is None else policy.parameters(CRITIC)
    params = policy.parameters(model, value_head=critic_optimizer is None)  # a central critic: no own head
    for epoch in range(config.num_ppo_epochs):
        order = distributed.broadcast(torch.randperm(n_total))
        for start in range(0, n_total, size):
            batch = order[start : start + size]
            denominator = None
            if spread:
                assert lengths is not None
                denominator = float(lengths[batch].sum())
                batch = batch[(batch >= offset) & (batch < offset + n)] - offset
            optimizer.zero_grad(set_to_none=True)
            if critic_optimizer is not None:
                critic_optimizer.zero_grad(set_to_none=True)
            if len(batch):
                values_out = _minibatch_loss(policy, model, exp, batch, config, denominator)
            else:  # this rank holds none of the minibatch's episodes: its share of every sum is 0
                zero = torch.zeros(())
                values_out = dict.fromkeys(("policy_loss", "value_loss", "loss", "clip_fraction"), zero)
                values_out.update(value_clip_fraction=zero, approx_kl=zero)
            loss = values_out["loss"]
            # Every rank must see the same verdict, or the others would wait forever in the all-reduce.
            total = distributed.all_sum(float(loss.detach())) if spread else float(loss.detach())
            if not math.isfinite(total):
                raise FloatingPointError(
                    f"model {model!r}: non-finite PPO loss {total} at epoch {epoch}; lower learning_rate "
                    f"({config.learning_rate}) or check the rewards"
                )
            if loss.requires_grad:
                loss.backward()
            distributed.all_reduce_grads(params, "sum")
            if config.max_grad_norm > 0:
                norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
            else:
                norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
            optimizer.step()
            if critic_optimizer is not None:  # the value loss's gradient reaches only the critic
                distributed.all_reduce_grads(critic_params, "sum")
                if config.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(critic_params, config.max_grad_norm)
                critic_optimizer.step()
            for key, value in values_out.items():
                stats[key].append(float(value.detach()))
            stats["grad_norm"].append(float(norm))
    out = {k: float(np.mean(v)) for k, v in stats.items()}
    if spread:
        # Each rank's values are its parts of the global minibatch sums; the gradient norm is global.
        out.update(distributed.reduce_metrics({k: v for k, v in out.items() if k != "grad_norm"}, op="sum"))
    return out


def _minibatch_loss(
    policy: Any, model: str, exp: Experience, rows: torch.Tensor, config: Config, denominator: float | None
) -> dict[str, torch.Tensor]:
    """Clipped policy and value losses of one minibatch's ``rows`` (token means, or token sums over
    ``denominator``) and their diagnostics."""
    from baselines.maac import central_forward

    mask = exp.response_mask[rows]
    args = (exp.prompt_ids[rows], exp.prompt_mask[rows], exp.response_ids[rows], mask)
    if exp.critic_context is None:
        logprobs, values = policy.forward(model, *args, with_values=True, temperature=config.scoring_temperature())
    else:
        context = (exp.critic_context[0][rows], exp.critic_context[1][rows])
        logprobs, values = central_forward(policy, model, *args, context, config.scoring_temperature())
    mask = mask.to(logprobs.device)
    pg_loss, clip_frac = clipped_policy_loss(
        logprobs, exp.old_logprobs[rows], exp.advantages[rows], mask, config.clip_eps, denominator
    )
    vf_loss, vf_clip_frac = clipped_value_loss(
        values, exp.old_values[rows], exp.returns[rows], mask, config.clip_value, denominator
    )
    with torch.no_grad():
        approx_kl = 0.5 * _token_mean((logprobs - exp.old_logprobs[rows]) ** 2, mask, denominator)
    return {
        "policy_loss": pg_loss,
        "value_loss": vf_loss,
        "loss": pg_loss + config.vf_coef * vf_loss,
        "clip_fraction": clip_frac,
        "value_clip_fraction": vf_clip_frac,
        "approx_kl": approx_kl,
    }


# ----------------------------------------------------------------------------------------- main
Assignment = Callable[[int], dict[str, str]]
"""Iteration -> {env role: model (adapter) that plays it}."""


def role_scores(
    rewards: Mapping[str, np.ndarray], infos: Mapping[str, Mapping[str, np.ndarray]], role: str
) -> np.ndarray:
    """A role's own task reward (N,): its ``reward_<component>_<role>`` component when the env splits the
    reward by role (CORY's envs), else the single component of a one-agent env, else its env reward."""
    info = infos[role]
    own = [k for k in info if k.startswith("reward_") and k.endswith(f"_{role}")]
    if len(own) == 1:
        return np.asarray(info[own[0]], dtype=np.float64)
    parts = [k for k in info if k.startswith("reward_") and k != "reward_total"]
    if len(rewards) == 1 and len(parts) == 1:
        return np.asarray(info[parts[0]], dtype=np.float64)
    return np.asarray(rewards[role], dtype=np.float64)


def train(config: Config, *, models: Sequence[str] | None = None, assign: Assignment | None = None) -> dict[str, Any]:
    """The PPO loop shared by PPO and CORY. ``models`` names the adapters (default: the env's agents);
    ``assign(iteration)`` says which model plays which role (default: each agent plays itself). Each
    model keeps its own adapter, value head, optimizer and KL controller whichever role it plays.

    Under torchrun or accelerate launch (``WORLD_SIZE`` > 1) every process plays its contiguous share
    of each iteration's episodes, each episode sampled under its own seed; advantages are whitened
    over the whole batch, minibatches are the same global rows on every rank, gradients are summed
    over ranks and the KL controllers see the global mean KL (baselines/distributed.py). Only rank 0
    evaluates, logs, plots and writes checkpoints, so ``eval*`` and ``plot`` are in its result only."""
    from tqdm.auto import tqdm

    from agents import LoraSettings, MultiAgentPolicy
    from baselines import distributed
    from baselines.common import (
        MetricLogger,
        TrainerState,
        check_run_dir,
        evaluate,
        interrupted,
        make_vector_env,
        play_episodes,
        plot_metrics,
        probe_env,
        resume_checkpoint,
        save_checkpoint,
        seed_everything,
    )
    from baselines.samples import SampleWriter

    learner = config.learner
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    info = distributed.init_from_env()
    main_rank = info.is_main
    per_episode = info.distributed if config.seed_per_episode is None else config.seed_per_episode
    if info.distributed and not per_episode:
        raise ValueError(
            f"seed_per_episode=False with {info.world_size} processes: each process would sample its share "
            "from its own global RNG stream; leave --seed-per-episode unset (or True) for data-parallel runs"
        )
    if config.batch_size < info.world_size:
        raise ValueError(
            f"batch_size={config.batch_size} cannot be shared among {info.world_size} processes; every "
            f"process needs at least one episode per iteration (batch_size >= {info.world_size})"
        )
    run_dir = config.run_dir()
    check_run_dir(run_dir, resume=config.resume)
    distributed.barrier()  # every rank has checked the directory before rank 0 writes to it
    rng = seed_everything(config.seed)
    positions = distributed.shard(range(config.batch_size))  # this rank's episodes of each batch
    roles, num_turns = probe_env(config.env, max_new_tokens=config.max_new_tokens, **config.env_kwargs())
    if num_turns != 1:
        raise ValueError(f"{learner} trains single-turn episodes; {config.env} has num_turns={num_turns}")
    models = list(roles if models is None else models)
    assign = assign or (lambda _iteration: {r: r for r in roles})
    from baselines.maac import CRITIC, central_context

    critic = [CRITIC] if config.critic == "central" else []  # the central critic: one more adapter
    if critic and CRITIC in models:
        raise ValueError(f"--critic central names its adapter {CRITIC!r}, which is also a model of {config.env!r}")
    policy = MultiAgentPolicy.from_pretrained(
        [*models, *critic],
        config.model,
        dtype=config.dtype,
        device=distributed.device_for("data-parallel", models, info, config.device)[models[0]],
        lora=LoraSettings(rank=config.lora_rank, alpha=config.lora_alpha),
        value_head=True,
        mixed_batches=False,  # the generate backend only: PEFT's mixed batches measured slower on CPU
        backend=config.backend,
    )
    # The envs end each response at any of the policy's EOS ids, exactly where generation stopped.
    venv = make_vector_env(
        config.env,
        len(positions),
        max_new_tokens=config.max_new_tokens,
        stop_token_ids=list(policy.eos_token_ids),
        **config.env_kwargs(),
    )
    n_train = len(venv.envs[0].task.problems("train"))
    optimizers = {m: policy.optimizer(m, lr=config.learning_rate) for m in [*models, *critic]}
    controllers = {m: kl_controller(config) for m in models}

    start, extra = 0, {}
    if config.resume:
        trainer = resume_checkpoint(
            run_dir,
            learner=learner,
            config=config,
            policy=policy,
            optimizers=optimizers,
            rng=rng,
            ignore=RESUMABLE_FIELDS,
        )
        start, extra = int(trainer["step"]), dict(trainer["extra"])
        for m, value in extra["kl_coef"].items():
            controllers[m].value = float(value)
    all_params = [p for m in optimizers for p in policy.parameters(m)]
    distributed.broadcast_params(all_params)  # identical replicas whatever each rank's RNG did
    logger = None
    if main_rank:
        logger = MetricLogger(
            run_dir,
            tensorboard=config.tensorboard,
            wandb_project=config.wandb_project,
            config=config,
            resume_step=start if config.resume else None,
        )

    samples = None
    if main_rank:
        samples = SampleWriter(run_dir, logger=logger, resume_step=start if config.resume else None,
                               train_every=config.samples_every, num_iterations=config.num_iterations)

    def log(step: int, values: dict[str, float]) -> None:
        if logger is not None:
            logger.log(step, values)

    def run_eval(step: int) -> dict[str, float]:
        """Evaluate with the roles of the last trained iteration (step - 1; the first before training).
        Rank 0 only (the replicas are identical); the others wait for it."""
        if config.num_eval_problems == 0:
            return {}
        if not main_rank:
            distributed.barrier()
            return {}
        episodes: list[dict[str, Any]] = []
        result = evaluate(
            policy,
            config.env,
            num_problems=config.num_eval_problems,
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            greedy=config.eval_greedy,
            seed=config.seed,
            env_kwargs=config.env_kwargs(),
            adapters=assign(max(step - 1, 0)),
            episodes=episodes,
        )
        samples.write_eval(step, episodes)
        distributed.barrier()
        return result

    def boundary(step: int) -> TrainerState | None:
        """The state after iteration ``step``, KL coefficients included (rank 0 only: it alone writes
        checkpoints)."""
        if not main_rank:
            return None
        extra["kl_coef"] = {m: c.value for m, c in controllers.items()}
        return TrainerState.capture(step=step, policy=policy, optimizers=optimizers, rng=rng, extra=extra)

    def checkpoint(state: TrainerState | None, step: int, wait: bool = True) -> Path:
        path = run_dir / "checkpoints" / f"step_{step:06d}"
        if wait:
            distributed.check_in_sync(all_params, "adapter and value-head weights")
        if state is not None:
            path = save_checkpoint(run_dir, state, learner=learner, config=config, policy=policy)
        if wait:
            distributed.barrier()  # nobody reads or resumes from a half-written checkpoint
        return path

    bar = tqdm(
        range(start, config.num_iterations),
        initial=start,
        total=config.num_iterations,
        disable=not (config.progress and main_rank),
        desc=learner,
        dynamic_ncols=True,
    )
    metrics: dict[str, float] = {}
    step = start
    # Ctrl-C saves the last iteration boundary's state, never a half-done iteration.
    state = boundary(start)
    policy.train()
    try:
        if "eval_before" not in extra:
            before = run_eval(start)
            if main_rank:
                extra["eval_before"] = before
            if before:
                log(0, before)
            state = boundary(start)
        for iteration in bar:
            t0 = time.perf_counter()
            players = assign(iteration)  # role -> model
            problems = rng.choice(n_train, size=config.batch_size, replace=n_train < config.batch_size)
            length = int(rng.integers(config.min_new_tokens, config.max_new_tokens + 1))
            sample_seeds = [distributed.group_seed(config.seed, iteration, 0, b) for b in positions]
            seeds = [config.seed * 1_000_003 + iteration * config.batch_size + i for i in positions]
            options = [{"task_index": int(problems[i]), "split": "train"} for i in positions]
            steps, returns, infos = play_episodes(
                policy,
                venv,
                seeds=seeds,
                options=options,
                action_length=config.max_new_tokens,
                adapters=players,
                sample_seeds=sample_seeds if per_episode else None,
                max_new_tokens=length,
                temperature=config.temperature,
                top_p=config.top_p,
                top_k=config.top_k,
                repetition_penalty=config.repetition_penalty,
            )
            t_rollout = time.perf_counter() - t0
            gens = {role: gen for s in steps for role, gen in s.items()}

            metrics = {}
            for role, model in players.items():
                scores = torch.as_tensor(returns[role], dtype=torch.float32)
                context = central_context(gens, roles, role, policy.pad_token_id) if critic else None
                exp = make_experience(policy, model, gens[role], scores, controllers[model].value, config, context)
                # Per-episode values of every rank, in rank order (this rank's own in one process).
                rows = distributed.gather_rows(
                    {
                        "kl": exp.kl.sum(1),  # summed over the response, mean over episodes
                        "score": scores,
                        "tokens": exp.response_mask.sum(1).float(),
                    }
                )
                # Tensor sums, so that one process computes exactly what it always did.
                value_sum = distributed.all_sum(exp.old_values.sum())
                token_sum = distributed.all_sum(exp.response_mask.sum())
                kl = float(rows["kl"].mean())
                stats = ppo_update(policy, optimizers[model], model, exp, config, optimizers.get(CRITIC))
                task = float(np.mean(distributed.gather_rows(role_scores(returns, infos, role))))
                prefix = f"agent_{model}/"
                metrics.update({prefix + k: v for k, v in stats.items()})
                metrics.update(
                    {
                        prefix + "task_reward": task,
                        prefix + "env_reward": float(rows["score"].mean()),
                        prefix + "kl": kl,
                        prefix + "combined": task - config.eta * kl,
                        prefix + "kl_coef": controllers[model].value,
                        prefix + "role": float(roles.index(role)),
                        prefix + "response_tokens": float(rows["tokens"].mean()),
                        prefix + "value": float(value_sum / token_sum.clamp(min=1)),
                    }
                )
                controllers[model].update(kl, config.batch_size)
            step = iteration + 1

            last = distributed.gather_rows(dict(infos[roles[0]]))
            metrics["reward/total"] = float(np.mean(last["reward_total"]))
            for key, value in last.items():
                if key.startswith("reward_") and key != "reward_total":
                    metrics[f"reward/{key[len('reward_') :]}"] = float(np.mean(value))
            for name in ("policy_loss", "value_loss", "kl", "clip_fraction"):
                metrics[f"losses/{name}"] = float(np.mean([metrics[f"agent_{m}/{name}"] for m in models]))
            elapsed = time.perf_counter() - t0
            metrics.update(
                {
                    "charts/iteration": step,
                    "charts/episodes": step * config.batch_size,
                    "charts/response_length": length,
                    "charts/s_per_iteration": elapsed,
                    "charts/rollout_fraction": t_rollout / elapsed,
                    "charts/learning_rate": config.learning_rate,
                }
            )
            if samples is not None:
                samples.write_train(step, venv.envs, seeds=seeds, options=options, models=players)
            if config.eval_every and step % config.eval_every == 0 and step < config.num_iterations:
                metrics.update(run_eval(step))
            log(step, metrics)
            bar.set_postfix(
                reward=f"{metrics['reward/total']:.3f}", kl=f"{metrics['losses/kl']:.2f}", s_it=f"{elapsed:.1f}"
            )
            state = boundary(step)
            if config.checkpoint_every and step % config.checkpoint_every == 0 and step < config.num_iterations:
                checkpoint(state, step)
        bar.close()
        final_eval = run_eval(step)
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
    result: dict[str, Any] = dict(metrics)
    result.update(final_eval)
    result.update({f"eval_before/{k.split('/', 1)[1]}": v for k, v in extra.get("eval_before", {}).items()})
    if main_rank:
        try:
            result["plot"] = str(plot_metrics(run_dir / "metrics.jsonl"))
        except ValueError:
            pass  # nothing to plot yet (no iteration ran)
    result["run_dir"] = str(run_dir)
    venv.close()
    return result


def main(config: Config) -> dict[str, Any]:
    """Train independent PPO agents (each env agent has its own adapter, value head and optimizer)."""
    return train(config)


def summary(result: Mapping[str, Any]) -> str:
    """Closing lines of a run: eval before/after, per-model task reward and KL, where the plot is."""
    from baselines.common import eval_table

    lines = eval_table(result)
    for key in sorted(k for k in result if k.endswith("/task_reward")):
        model = key[len("agent_") : -len("/task_reward")]
        lines.append(f"{model}: task reward {result[key]:.3f}, KL {result[f'agent_{model}/kl']:.3f}")
    if "plot" in result:
        lines.append(f"plot: {result['plot']}")
    lines.append(f"run:  {result.get('run_dir')}")
    return "\n".join(lines)


if __name__ == "__main__":
    import tyro

    print(summary(main(tyro.cli(Config))))
