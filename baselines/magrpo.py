"""MAGRPO: multi-agent group-relative policy optimisation.

Paper: Liu, Chen, Liang, Lyu, Amato, "LLM Collaboration With Multi-Agent Reinforcement Learning"
(reference code: OpenMLRL/CoMLRL and its task repos). Docs: docs/magrpo.md.

1. Pick B problems; make G envs per problem (``reset(options={"task_index": i})``), B*G in all.
2. Every agent samples one response per env from its own LoRA adapter (one batched generate); the
   g-th responses of all agents form joint sample g; ``env.step`` scores it with one joint reward.
3. Multi-turn: repeat with the env's next prompts; returns R_t = r_t + gamma R_{t+1}.
4. Advantages are group-relative per problem and turn: A = R - baseline(R of the group)
   (``mean`` | ``rloo`` | ``max`` | ``none``), optionally divided by the group's std.
5. Each agent minimises -A * log pi(its own response) over its response tokens (token-mean or
   sequence-sum), with a clipped ratio when a batch is reused for several epochs and an optional
   KL to the reference (the base model with adapters disabled).

Run it::

    llm-envs train magrpo --env writing/xsum-v0 --num-iterations 100
    llm-envs train magrpo --preset demo          # the README's demo: ~10 minutes on 2 CPU cores
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

Baseline = Literal["mean", "rloo", "max", "none"]
Aggregation = Literal["token-mean", "sequence-sum"]
LEARNER = "magrpo"


@dataclass
class Config:
    """MAGRPO settings. Every field is a ``--flag`` of ``llm-envs train magrpo``."""

    env: str = "writing/xsum-v0"
    """Registered env id (``llm-envs list``); must use the parallel protocol."""
    model: str | None = None
    """HF model id or local directory; unset for the embedded SmolLM2-135M-Instruct."""
    max_source_words: int | None = None
    """Writing envs: cut source documents to this many words (shorter prompts, faster on CPU)."""
    data_path: str | None = None
    """Local copy of a hub dataset for envs that take ``data_path``."""
    num_turns: int = 1
    """Turns per episode; after each turn the task's feedback goes into the next prompts."""
    seed: int = 0
    """Seeds python, numpy, torch and the envs."""
    rollout: Literal["linear", "tree"] = "linear"
    """linear: G episodes per problem, sample g of every agent forms joint g, each episode continues
    on its own; responses per problem and agent: G * T. tree (the reference's): every joint action of
    a turn branches into a child node with G new samples per agent; responses per problem and agent:
    G + G^2 + ... + G^T (aligned), G * (1 + G^N + G^2N + ...) (cross, N agents). See baselines/tree.py."""
    joint_mode: Literal["aligned", "cross"] = "aligned"
    """aligned: joint action g = the g-th sample of every agent (G joint rewards per problem and turn);
    cross: every combination of the agents' samples (G^N joint rewards), each sample credited with the
    sum of the returns of the joint actions it takes part in (the reference). cross needs --rollout
    tree when num_turns > 1."""
    termination_threshold: float | None = None
    """Tree rollouts: a node whose mean joint reward exceeds this expands no further (the reference's
    early termination; its default is -0.2). Unset: every node expands until the last turn."""
    transition: str | None = None
    """What agents see on later turns (an env argument, llm_envs/transitions.py): unset for the task's
    feedback; level-feedback, plain (self-revision), module:function, or expert (a second model,
    --expert-model, writes edit suggestions into the next prompts; its cost is logged)."""
    expert_model: str | None = None
    """Model of --transition expert: HF id or local directory; unset for the embedded SmolLM2-135M-Instruct."""
    expert_max_new_tokens: int = 64
    """Longest suggestion of the --transition expert model."""
    protocol: Literal["auto", "parallel", "sequential"] = "auto"
    """The env's protocol: ``auto`` (the id's registered one), ``parallel`` (all agents at once) or
    ``sequential`` (agents in order, each seeing the earlier agents' responses of the turn; tree
    rollouts only, baselines/tree.py)."""
    grouping: Literal["auto", "agent-turn", "problem-turn"] = "auto"
    """Advantage groups. agent-turn (AT-GRPO, arXiv 2510.11062; the reference's tree): each agent's G
    samples under one history (one tree node); problem-turn: all of one problem's samples of a turn.
    auto: agent-turn for trees, problem-turn for linear rollouts."""

    num_iterations: int = 100
    """Training iterations (one batch of rollouts and one update per agent each)."""
    num_problems: int = 2
    """B: problems per iteration."""
    num_generations: int = 4
    """G: envs (joint samples) per problem; the group for the advantage baseline."""
    max_new_tokens: int = 64
    """Response length of every agent (the env's action length)."""
    temperature: float = 0.7
    """Sampling temperature."""
    top_p: float = 0.9
    """Nucleus sampling mass."""
    top_k: int = 50
    """Top-k sampling; 0 disables it."""
    logprob_temperature: Literal["raw", "sampling"] = "raw"
    """Temperature of the log-probs the loss uses: ``raw`` (1: the untempered policy, as the reference
    trainers score) or ``sampling`` (the sampling ``temperature``: the tempered distribution, as TRL's
    GRPO scores); the same at generation, in the update and for the reference (docs/magrpo.md)."""

    learning_rate: float = 5e-5
    """AdamW learning rate of every agent's adapter."""
    lora_rank: int = 16
    """LoRA rank of each agent's adapter."""
    lora_alpha: float = 32.0
    """LoRA alpha (the update is scaled by alpha / rank)."""
    baseline: Baseline = "mean"
    """Group baseline subtracted from each return: mean, rloo (mean of the others), max, none."""
    normalize_std: bool = False
    """Divide advantages by the group's std (clamped at 1e-6)."""
    loss_aggregation: Aggregation = "token-mean"
    """token-mean: mean over all response tokens of the batch; sequence-sum: sum per response (the
    reference), mean over responses."""
    num_epochs: int = 1
    """Updates per batch; above 1 the ratio to the sampling policy is clipped (PPO-style)."""
    clip_eps: float = 0.2
    """Ratio clip range when num_epochs > 1."""
    kl_coef: float = 0.0
    """Weight of the per-token KL (k3 estimator) to the reference policy; 0 skips the reference forward."""
    gamma: float = 0.9
    """Discount of later turns' rewards in the returns (multi-turn)."""
    max_grad_norm: float = 1.0
    """Clip each agent's gradient norm; 0 disables clipping."""
    micro_batch_size: int = 0
    """Responses per forward/backward in the update (gradient accumulation): the same gradient up to
    float rounding, with peak memory bounded by this many rows; 0 = all of a turn's rows at once."""
    micro_batch_tokens: int = 512
    """Token budget of one forward/backward of the update: a turn's rows are split so that rows x
    (prompt + response columns) stays within it (at least one row per pass), which bounds the update's
    activation memory whatever the batch and prompt sizes; the gradient is the same up to float
    rounding. 0 = no budget (see docs/agents.md for the memory it bounds)."""

    eval_every: int = 0
    """Evaluate every this many iterations (0: only before and after training)."""
    num_eval_problems: int = 8
    """Eval-split problems per evaluation (0 disables evaluation)."""
    eval_greedy: bool = True
    """Greedy decoding at evaluation (else the training sampling settings)."""
    samples_every: int = 10
    """Write the first few episodes of every this many training batches to ``<run>/samples.jsonl``
    (0: none); every evaluation writes all its episodes there."""

    output_dir: str = "runs"
    """Where run directories go."""
    run_name: str | None = None
    """Run directory name; default ``magrpo__<env>__s<seed>``."""
    checkpoint_every: int = 10
    """Save a checkpoint every this many iterations (0: only at the end and on Ctrl-C)."""
    resume: bool = False
    """Continue the run in ``output_dir/run_name`` from its latest checkpoint."""
    overwrite: bool = False
    """Start afresh in a run directory that already holds checkpoints (deletes them)."""
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
    placement: Literal["data-parallel", "agent-per-device"] = "data-parallel"
    """With several accelerators: ``data-parallel`` (every process holds all agents on one device) or
    ``agent-per-device`` (each agent on its own device, the reference layout; needs CUDA). See
    docs/scaling.md."""
    seed_per_problem: bool | None = None
    """Sample each problem group from its own seed (seed, iteration, turn, problem position), so that
    the samples do not depend on how problems are split across processes. Unset: on with several
    processes (torchrun / accelerate launch), off with one (one batched generate per turn)."""

    def __post_init__(self) -> None:
        positive = (
            "num_turns",
            "num_iterations",
            "num_problems",
            "num_generations",
            "max_new_tokens",
            "lora_rank",
            "num_epochs",
            "expert_max_new_tokens",
        )
        for name in positive:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        nonnegative = ("eval_every", "num_eval_problems", "checkpoint_every", "top_k", "micro_batch_size",
                       "micro_batch_tokens", "samples_every")
        for name in nonnegative:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if self.max_source_words is not None and (
            not isinstance(self.max_source_words, int) or self.max_source_words < 1
        ):
            raise ValueError(f"max_source_words must be a positive int or None, got {self.max_source_words!r}")
        if self.num_generations < 2 and self.baseline != "none":
            raise ValueError(
                f"num_generations={self.num_generations} leaves a group of one: baseline={self.baseline!r} "
                "would make every advantage 0. Use num_generations >= 2 or baseline='none'."
            )
        if self.baseline not in ("mean", "rloo", "max", "none"):
            raise ValueError(f"baseline must be 'mean', 'rloo', 'max' or 'none', got {self.baseline!r}")
        if self.loss_aggregation not in ("token-mean", "sequence-sum"):
            raise ValueError(f"loss_aggregation must be 'token-mean' or 'sequence-sum', got {self.loss_aggregation!r}")
        checks = {
            "temperature": self.temperature > 0,
            "top_p": 0 < self.top_p <= 1,
            "learning_rate": self.learning_rate > 0,
            "lora_alpha": self.lora_alpha > 0,
            "clip_eps": 0 < self.clip_eps < 1,
            "kl_coef": self.kl_coef >= 0,
            "gamma": 0 <= self.gamma <= 1,
            "max_grad_norm": self.max_grad_norm >= 0,
        }
        ranges = {
            "temperature": "> 0",
            "top_p": "in (0, 1]",
            "learning_rate": "> 0",
            "lora_alpha": "> 0",
            "clip_eps": "in (0, 1)",
            "kl_coef": ">= 0",
            "gamma": "in [0, 1]",
            "max_grad_norm": ">= 0",
        }
        for name, ok in checks.items():
            value = getattr(self, name)
            if not ok or not math.isfinite(value):
                raise ValueError(f"{name} must be {ranges[name]}, got {value!r}")
        from baselines.distributed import PLACEMENTS

        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {list(PLACEMENTS)}, got {self.placement!r}")
        if self.seed_per_problem is not None and not isinstance(self.seed_per_problem, bool):
            raise ValueError(f"seed_per_problem must be True, False or None, got {self.seed_per_problem!r}")
        if self.rollout not in ("linear", "tree"):
            raise ValueError(f"rollout must be 'linear' or 'tree', got {self.rollout!r}")
        if self.joint_mode not in ("aligned", "cross"):
            raise ValueError(f"joint_mode must be 'aligned' or 'cross', got {self.joint_mode!r}")
        if self.grouping not in ("auto", "agent-turn", "problem-turn"):
            raise ValueError(f"grouping must be 'auto', 'agent-turn' or 'problem-turn', got {self.grouping!r}")
        if self.termination_threshold is not None and (
            isinstance(self.termination_threshold, bool)
            or not isinstance(self.termination_threshold, (int, float))
            or not math.isfinite(self.termination_threshold)
        ):
            raise ValueError(
                f"termination_threshold must be a finite float or None, got {self.termination_threshold!r}"
            )
        if self.rollout == "linear" and self.num_turns > 1:
            for name, value, hint in (
                ("joint_mode", self.joint_mode, "cross"),
                ("grouping", self.grouping, "agent-turn"),
            ):
                if value == hint:
                    raise ValueError(
                        f"{name}={value!r} with rollout='linear' and num_turns={self.num_turns}: a linear episode "
                        "continues one joint action per env, so later turns have one sample per history; use "
                        "rollout='tree'"
                    )
            if self.termination_threshold is not None:
                raise ValueError(
                    f"termination_threshold={self.termination_threshold!r} prunes tree branches; use rollout='tree'"
                )
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be a positive int or None, got {self.threads!r}")
        if self.protocol not in ("auto", "parallel", "sequential"):
            raise ValueError(f"protocol must be 'auto', 'parallel' or 'sequential', got {self.protocol!r}")
        if self.resolved_protocol() == "sequential" and not self.uses_tree():
            raise ValueError(
                f"protocol={self.protocol!r} is sequential for {self.env!r} and rollout='linear': sequential "
                "episodes are played as trees here (baselines/tree.py); use rollout='tree'"
            )

    def resolved_protocol(self) -> str:
        """The protocol in force (``auto``: the env id's registered one; an unknown id counts as
        parallel here and is reported when the env is built)."""
        if self.protocol != "auto":
            return self.protocol
        from llm_envs.core.registry import spec

        try:
            return spec(self.env).protocol
        except KeyError:
            return "parallel"

    def scoring_temperature(self) -> float:
        """The temperature of the log-probs in the loss (1.0 for ``logprob_temperature="raw"``)."""
        return self.temperature if self.logprob_temperature == "sampling" else 1.0

    def resolved_grouping(self) -> str:
        """The advantage grouping in force (``auto`` resolved)."""
        if self.grouping != "auto":
            return self.grouping
        return "agent-turn" if self.rollout == "tree" else "problem-turn"

    def uses_tree(self) -> bool:
        """Whether this run plays tree rollouts (baselines/tree.py): a tree, or cross joint sampling."""
        return self.rollout == "tree" or self.joint_mode == "cross"

    def env_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"num_turns": self.num_turns}
        if self.model is not None:
            kwargs["tokenizer"] = self.model  # the env must speak the model's token ids
        if self.max_source_words is not None:
            kwargs["max_source_words"] = self.max_source_words
        if self.data_path is not None:
            kwargs["data_path"] = self.data_path
        if self.protocol != "auto":
            kwargs["protocol"] = self.protocol
        if self.transition is not None and self.transition != "expert":
            kwargs["transition"] = self.transition  # the expert is an object: build_env_kwargs adds it
        return kwargs

    def build_env_kwargs(self) -> dict[str, Any]:
        """:meth:`env_kwargs` with the ``--transition expert`` model loaded (agents.ExpertTransition)."""
        kwargs = self.env_kwargs()
        if self.transition == "expert":
            from agents import ExpertTransition

            kwargs["transition"] = ExpertTransition(
                self.expert_model, max_new_tokens=self.expert_max_new_tokens, device=self.device
            )
        return kwargs

    def run_dir(self) -> Path:
        name = self.run_name or f"{LEARNER}__{self.env.replace('/', '_')}__s{self.seed}"
        return Path(self.output_dir) / name


# Fields that may change when a run is resumed (they do not change what is computed).
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
    "placement",
)

PRESETS: dict[str, dict[str, Any]] = {
    "demo": dict(
        env="writing/xsum-v0",
        max_source_words=60,
        num_iterations=12,
        num_problems=2,
        num_generations=4,
        max_new_tokens=48,
        learning_rate=1e-3,
        lora_rank=8,
        lora_alpha=16.0,
        normalize_std=True,
        num_eval_problems=8,
        checkpoint_every=0,
        run_name="demo",
        overwrite=True,
    ),
}
"""Named settings for ``--preset``; flags given on the command line override them."""


# ----------------------------------------------------------------------------------------- math
def group_advantages(rewards: torch.Tensor, baseline: Baseline = "mean", normalize_std: bool = False) -> torch.Tensor:
    """Group-relative advantages: (B, G) returns -> (B, G).

    ``mean``: R - mean(R); ``rloo``: R - mean of the other G-1 returns; ``max``: R - max(R); ``none``: R.
    ``normalize_std`` divides by the group's (unbiased) std, clamped at 1e-6 so that a group of equal
    returns gives 0, not NaN.

    >>> group_advantages(torch.tensor([[1.0, 2.0, 3.0, 6.0]]))
    tensor([[-2., -1.,  0.,  3.]])
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be (B, G), got shape {tuple(rewards.shape)}")
    g = rewards.shape[1]
    if baseline == "mean":
        adv = rewards - rewards.mean(1, keepdim=True)
    elif baseline == "rloo":
        if g < 2:
            raise ValueError("baseline='rloo' needs at least 2 samples per group")
        adv = rewards - (rewards.sum(1, keepdim=True) - rewards) / (g - 1)
    elif baseline == "max":
        adv = rewards - rewards.max(1, keepdim=True).values
    elif baseline == "none":
        adv = rewards.clone()
    else:
        raise ValueError(f"baseline must be 'mean', 'rloo', 'max' or 'none', got {baseline!r}")
    if normalize_std:
        std = rewards.std(1, keepdim=True) if g > 1 else torch.zeros_like(rewards[:, :1])
        adv = adv / std.clamp(min=1e-6)
    return adv


def discounted_returns(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """Returns per turn: (N, T) rewards -> (N, T) with R_t = r_t + gamma * R_{t+1}.

    >>> discounted_returns(torch.tensor([[1.0, 2.0]]), 0.5)
    tensor([[2., 2.]])
    """
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns


def policy_gradient_loss(
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    aggregation: Aggregation = "token-mean",
    old_logprobs: torch.Tensor | None = None,
    clip_eps: float = 0.2,
    denominator: float | None = None,
) -> torch.Tensor:
    """Policy-gradient loss over response tokens: (N, T) log-probs, (N,) advantages, (N, T) mask -> scalar.

    Without ``old_logprobs``: per-token loss ``-A * log pi``. With them (a batch reused for another
    epoch): the clipped surrogate ``-min(rho A, clip(rho, 1-eps, 1+eps) A)``, ``rho = exp(log pi - old)``.
    ``token-mean`` averages over every unmasked token of the batch; ``sequence-sum`` sums each
    response's tokens and averages over responses. Masked (pad) positions never contribute.

    ``denominator`` replaces the local count (tokens for token-mean, responses for sequence-sum) by a
    given one: with several processes, the global count, so that the rank losses add up to the
    one-process loss (see baselines/distributed.py).
    """
    mask = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype).unsqueeze(1)  # (N, 1)
    if old_logprobs is None:
        per_token = -adv * logprobs
    else:
        ratio = torch.exp(logprobs - old_logprobs)
        per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    if aggregation == "token-mean":
        if denominator is not None:
            return (per_token * mask).sum() / max(float(denominator), 1.0)
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    if aggregation == "sequence-sum":
        if denominator is not None:
            return (per_token * mask).sum() / max(float(denominator), 1.0)
        return (per_token * mask).sum(1).mean()
    raise ValueError(f"aggregation must be 'token-mean' or 'sequence-sum', got {aggregation!r}")


def kl_to_reference(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || ref): (N, T) -> (N, T), >= 0, exact in expectation."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


# ----------------------------------------------------------------------------------------- rollouts
@dataclass
class Turn:
    """One turn of B*G envs: each agent's prompts and sampled responses, and the env's rewards."""

    prompts: dict[str, tuple[torch.Tensor, torch.Tensor]]  # agent -> (N, P) ids, mask (left padding stripped)
    responses: dict[str, Any]  # agent -> agents.Generation
    rewards: dict[str, np.ndarray]  # agent -> (N,)
    infos: dict[str, dict[str, np.ndarray]]


def rollout(
    policy: Any,
    venv: Any,
    seeds: Sequence[int],
    options: Sequence[dict],
    config: Config,
    groups: Sequence[int] | None = None,
    iteration: int = 0,
) -> list[Turn]:
    """Play one batch of episodes through the env API. Returns the turns in order.

    ``groups`` unset: every agent's actions come from one batched generate per turn. Set: the
    problem positions (0..B-1 in the iteration's batch) of the envs' consecutive groups of
    ``num_generations``; each group is sampled under its own seed (``distributed.group_seed``), so
    the samples of a problem do not depend on the rest of the batch or on the process playing it."""
    from baselines.common import pad_actions, strip_left_padding
    from baselines.distributed import generate_per_group, group_seed

    obs, _ = venv.reset(seed=list(seeds), options=list(options))
    sampling = dict(
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        logprob_temperature=config.scoring_temperature(),
    )
    turns = []
    while venv.agents:
        if groups is None:
            prompts = {
                a: tuple(
                    torch.as_tensor(x) for x in strip_left_padding(obs[a]["observation"], obs[a]["attention_mask"])
                )
                for a in venv.agents
            }
            gens = policy.generate_joint(prompts, 1, **sampling)
        else:
            group_seeds = [group_seed(config.seed, iteration, len(turns), b) for b in groups]
            raw = {a: (obs[a]["observation"], obs[a]["attention_mask"]) for a in venv.agents}
            gens = generate_per_group(policy, raw, config.num_generations, group_seeds, **sampling)
            prompts = {a: (g.prompt_ids, g.prompt_mask) for a, g in gens.items()}
        actions = {a: pad_actions(g.response_ids, config.max_new_tokens, policy.pad_token_id) for a, g in gens.items()}
        obs, rewards, _, _, infos = venv.step(actions)
        turns.append(Turn(prompts=prompts, responses=gens, rewards=rewards, infos=infos))
    return turns


def update_agent(
    policy: Any,
    optimizer: torch.optim.Optimizer,
    agent: str,
    turns: list[Turn],
    advantages: torch.Tensor,
    config: Config,
) -> dict[str, float]:
    """``num_epochs`` gradient steps of one agent on its responses of every turn. ``advantages`` is
    (N, num_turns). One batched forward per turn and epoch; the reference forward only if kl_coef > 0.

    With several processes each rank holds its share of the rows: losses are divided by the global
    token (or response) counts and gradients summed over ranks before clipping, which is the gradient
    of the one-process loss; the returned loss statistics are summed over ranks likewise."""
    from baselines import distributed
    from baselines.common import masked_mean

    spread = distributed.world_size() > 1
    masks = [turn.responses[agent].response_mask for turn in turns]

    def rows_per_pass(gen: Any) -> int:
        n = len(gen.response_mask)
        size = config.micro_batch_size or max(n, 1)
        if config.micro_batch_tokens:
            width = gen.prompt_ids.shape[1] + gen.response_ids.shape[1]
            size = min(size, max(1, config.micro_batch_tokens // max(width, 1)))
        return size

    chunked = any(rows_per_pass(turn.responses[agent]) < len(turn.responses[agent].response_mask) for turn in turns)
    tokens = denominators = None
    if spread or chunked:
        # Losses of the parts (ranks, micro-batches) are divided by the whole turn's counts, so they add
        # up to the one-batch loss.
        counts = [float(m.sum()) for m in masks]
        n_rows = [float(len(m)) for m in masks]
        tokens = distributed.all_sum(counts) if spread else counts
        rows = distributed.all_sum(n_rows) if spread else n_rows
        denominators = tokens if config.loss_aggregation == "token-mean" else rows

    def token_mean(values: torch.Tensor, mask: torch.Tensor, t: int) -> torch.Tensor:
        if tokens is None:
            return masked_mean(values, mask)
        return (values * mask.to(values.dtype)).sum() / max(tokens[t], 1.0)

    def chunks(gen: Any) -> list[slice]:
        n, size = len(gen.response_mask), rows_per_pass(gen)
        return [slice(i, i + size) for i in range(0, n, size)]  # none for a turn without rows

    ref = []
    if config.kl_coef > 0:
        for turn in turns:
            gen = turn.responses[agent]
            ref.append(torch.cat([
                policy.ref_logprobs(agent, gen.prompt_ids[c], gen.prompt_mask[c], gen.response_ids[c],
                                    gen.response_mask[c], temperature=config.scoring_temperature())
                for c in chunks(gen)
            ]) if len(gen.response_mask) else gen.response_mask.float())
    stats: dict[str, list[float]] = {"loss": [], "pg_loss": [], "kl": [], "clip_fraction": [], "grad_norm": []}
    first_epoch: dict[tuple[int, int], torch.Tensor] = {}  # (turn, first row) -> log-probs before the update
    for epoch in range(config.num_epochs):
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros(())
        for t, turn in enumerate(turns):
            gen = turn.responses[agent]
            denominator = None if denominators is None else denominators[t]
            turn_pg = turn_kl = turn_clip = 0.0
            for c in chunks(gen):
                logprobs = policy.logprobs(
                    agent, gen.prompt_ids[c], gen.prompt_mask[c], gen.response_ids[c], gen.response_mask[c],
                    temperature=config.scoring_temperature(),
                )
                mask = gen.response_mask[c]
                # On the first epoch the sampling policy is the current one: the plain policy gradient
                # (ratio 1) is exact; later epochs need the ratio to the sampling-time policy, whose
                # log-probs are the first epoch's own (the same forward; the decode-time log-probs
                # differ from it by rounding in bf16, ~0.03 nats a token).
                old = first_epoch[(t, c.start)] if epoch > 0 else None
                if epoch == 0 and config.num_epochs > 1:
                    first_epoch[(t, c.start)] = logprobs.detach()
                adv = advantages[c, t].to(logprobs.device)
                pg = policy_gradient_loss(
                    logprobs, adv, mask, config.loss_aggregation, old, config.clip_eps, denominator=denominator
                )
                loss = pg
                if config.kl_coef > 0:
                    kl = token_mean(kl_to_reference(logprobs, ref[t][c]), mask, t)
                    loss = loss + config.kl_coef * kl
                    turn_kl += float(kl.detach())
                if old is not None:
                    ratio = torch.exp(logprobs.detach() - old)
                    clipped = ((ratio - 1).abs() > config.clip_eps).float()
                    turn_clip += float(token_mean(clipped, mask, t))
                # Backward per part: only one part's graph is alive at a time.
                (loss / len(turns)).backward()
                total = total + loss.detach() / len(turns)
                turn_pg += float(pg.detach())
            stats["pg_loss"].append(turn_pg)
            if config.kl_coef > 0:
                stats["kl"].append(turn_kl)
            if epoch > 0:
                stats["clip_fraction"].append(turn_clip)
        # Every rank must see the same verdict, or the others would wait forever in the all-reduce.
        overall = distributed.all_sum(float(total.detach())) if spread else float(total.detach())
        if not math.isfinite(overall):
            # Raised before the optimizer step: the weights are left as they were.
            raise FloatingPointError(
                f"agent {agent!r}: non-finite loss {overall} at epoch {epoch}; lower learning_rate "
                f"({config.learning_rate}) or check the rewards"
            )
        params = policy.parameters(agent)
        distributed.all_reduce_grads(params, "sum")
        if config.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
        optimizer.step()
        stats["loss"].append(float(total.detach()))
        stats["grad_norm"].append(float(norm))
    out = {k: float(np.mean(v)) for k, v in stats.items() if v}
    if spread:
        # Each rank's losses are its part of the global sums; the gradient norm is already global.
        summed = distributed.reduce_metrics({k: v for k, v in out.items() if k != "grad_norm"}, op="sum")
        out.update(summed)
    return out


# ----------------------------------------------------------------------------------------- main
def main(config: Config) -> dict[str, float]:
    """Train MAGRPO; returns the final metrics (the last iteration's, plus ``eval/*`` before and after
    as ``eval_before/*`` and ``eval/*``).

    Under torchrun or accelerate launch (``WORLD_SIZE`` > 1) every process plays its share of each
    iteration's problems and the gradients are summed over processes (baselines/distributed.py); only
    rank 0 evaluates, logs, plots and writes checkpoints, so ``eval*`` and ``plot`` are in rank 0's
    result only."""
    from tqdm.auto import tqdm

    from agents import ExpertTransition, LoraSettings
    from baselines import distributed
    from baselines.common import (
        MetricLogger,
        TrainerState,
        check_run_dir,
        evaluate,
        interrupted,
        make_vector_env,
        plot_metrics,
        probe_env,
        resume_checkpoint,
        save_checkpoint,
        seed_everything,
    )
    from baselines.samples import SampleWriter

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
    # Every rank has checked the directory before rank 0 changes it.
    distributed.barrier()
    if not config.resume and config.overwrite and main_rank and (run_dir / "checkpoints").exists():
        shutil.rmtree(run_dir / "checkpoints")
    rng = seed_everything(config.seed)
    positions = distributed.shard(range(config.num_problems))  # this rank's problems of each batch
    n_envs = config.num_problems * config.num_generations
    n_local = len(positions) * config.num_generations
    env_kwargs = config.build_env_kwargs()
    agents, _ = probe_env(config.env, max_new_tokens=config.max_new_tokens, **env_kwargs)
    devices = distributed.device_for(config.placement, agents, info, config.device)
    policy = distributed.build_policy(
        agents,
        config.model,
        devices,
        dtype=config.dtype,
        lora=LoraSettings(rank=config.lora_rank, alpha=config.lora_alpha),
        # PEFT's mixed-adapter batches measured 4.5x slower than one generate call per agent on CPU.
        mixed_batches=False,  # the generate backend only: PEFT's mixed batches measured slower on CPU
        backend=config.backend,
    )
    # The envs end each response at any of the policy's EOS ids, exactly where generation stopped.
    venv = make_vector_env(  # parallel, or sequential (trees only)
        config.env,
        n_local,
        max_new_tokens=config.max_new_tokens,
        stop_token_ids=list(policy.eos_token_ids),
        **env_kwargs,
    )
    n_train = len(venv.envs[0].task.problems("train"))
    optimizers = {a: policy.optimizer(a, lr=config.learning_rate) for a in agents}

    start = 0
    extra: dict[str, Any] = {}
    if config.resume:
        trainer = resume_checkpoint(
            run_dir,
            learner=LEARNER,
            config=config,
            policy=policy,
            optimizers=optimizers,
            rng=rng,
            ignore=RESUMABLE_FIELDS,
        )
        start, extra = int(trainer["step"]), dict(trainer["extra"])
    all_params = [p for a in agents for p in policy.parameters(a)]
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
        if config.num_eval_problems == 0:
            return {}
        if not main_rank:  # the replicas are identical: rank 0 evaluates, the others wait for it
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
            env_kwargs=env_kwargs,
            episodes=episodes,
        )
        samples.write_eval(step, episodes)
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
            distributed.check_in_sync(all_params, "adapter weights")
        if state is not None:
            path = save_checkpoint(run_dir, state, learner=LEARNER, config=config, policy=policy)
        if wait:
            distributed.barrier()  # nobody reads or resumes from a half-written checkpoint
        return path

    metrics: dict[str, float] = {}
    bar = tqdm(
        range(start, config.num_iterations),
        initial=start,
        total=config.num_iterations,
        disable=not (config.progress and main_rank),
        desc="magrpo",
        dynamic_ncols=True,
    )
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
            problems = rng.choice(n_train, size=config.num_problems, replace=n_train < config.num_problems)
            g = config.num_generations
            if config.uses_tree():
                from baselines import tree

                tree_seeds = [config.seed * 1_000_003 + iteration * config.num_problems + b for b in positions]
                tree_options = [{"task_index": int(problems[b]), "split": "train"} for b in positions]
                sample_seeds = [distributed.group_seed(config.seed, iteration, 0, b) for b in positions]
                metrics = tree.train_step(policy, optimizers, venv.envs[0], tree_seeds, tree_options, config,
                                          sample_seeds if per_problem else None)
                t_rollout = metrics.pop("charts/rollout_s")
                joint_samples = int(metrics["charts/joint_rewards"])
            else:
                options = [{"task_index": int(problems[b]), "split": "train"} for b in positions for _ in range(g)]
                seeds = [config.seed * 1_000_003 + iteration * n_envs + b * g + k for b in positions for k in range(g)]
                turns = rollout(policy, venv, seeds, options, config, positions if per_problem else None, iteration)
                t_rollout = time.perf_counter() - t0
                distributed.check_equal(len(turns), "turns per episode")

                metrics = {}
                for agent in agents:
                    rewards = torch.tensor(np.stack([turn.rewards[agent] for turn in turns], 1), dtype=torch.float32)
                    returns = discounted_returns(rewards, config.gamma)  # (N, turns)
                    # Group per problem and per turn: rows are problem-major (b * G + g).
                    # Groups never straddle ranks (problems are sharded whole), so advantages are local.
                    grouped = returns.T.reshape(len(turns), len(positions), config.num_generations)
                    adv = torch.stack([group_advantages(x, config.baseline, config.normalize_std) for x in grouped])
                    adv = adv.reshape(len(turns), -1).T  # (N, turns)
                    stats = update_agent(policy, optimizers[agent], agent, turns, adv, config)
                    for key, value in stats.items():
                        metrics[f"agent_{agent}/{key}"] = value
                    lengths = torch.cat([turn.responses[agent].response_lengths.float().cpu() for turn in turns])
                    rows = distributed.gather_rows({"lengths": lengths, "adv": adv, "returns": returns})
                    metrics[f"agent_{agent}/response_tokens"] = float(rows["lengths"].mean())
                    metrics[f"agent_{agent}/advantage_abs"] = float(rows["adv"].abs().mean())
                    metrics[f"agent_{agent}/return"] = float(rows["returns"][:, 0].mean())

                last = distributed.gather_rows(dict(turns[-1].infos[agents[0]]))
                episode_return = distributed.gather_rows(sum(turn.rewards[agents[0]] for turn in turns))
                metrics["reward/total"] = float(np.mean(last["reward_total"]))
                metrics["charts/episode_return"] = float(np.mean(episode_return))
                metrics["charts/reward_std"] = float(np.std(last["reward_total"]))
                metrics["charts/responses"] = float(n_envs * len(turns) * len(agents))
                joint_samples = n_envs * len(turns)
                for key, value in last.items():
                    if key.startswith("reward_") and key != "reward_total":
                        metrics[f"reward/{key[len('reward_') :]}"] = float(np.mean(value))
            expert = env_kwargs.get("transition")
            if isinstance(expert, ExpertTransition):  # the expert model's cost so far
                metrics["charts/expert_tokens"] = expert.stats["generated_tokens"]
                metrics["charts/expert_s"] = expert.stats["seconds"]
            step = iteration + 1
            extra["samples"] = int(extra.get("samples", start * n_envs * config.num_turns)) + joint_samples
            for name in ("pg_loss", "loss", "kl", "clip_fraction"):
                values = [metrics[f"agent_{a}/{name}"] for a in agents if f"agent_{a}/{name}" in metrics]
                if values:
                    metrics[f"losses/{name}"] = float(np.mean(values))
            elapsed = time.perf_counter() - t0
            metrics.update(
                {
                    "charts/iteration": step,
                    "charts/samples": extra["samples"],
                    "charts/s_per_iteration": elapsed,
                    "charts/rollout_fraction": t_rollout / elapsed,
                    "charts/samples_per_s": joint_samples / elapsed,
                    "charts/responses_per_s": metrics["charts/responses"] / t_rollout,
                    "charts/learning_rate": config.learning_rate,
                }
            )
            if samples is not None and not config.uses_tree():
                samples.write_train(step, venv.envs, seeds=seeds, options=options)
            if config.eval_every and step % config.eval_every == 0 and step < config.num_iterations:
                metrics.update(run_eval(step))
            log(step, metrics)
            bar.set_postfix(reward=f"{metrics['reward/total']:.3f}", s_it=f"{elapsed:.1f}")
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
    result = dict(metrics)
    result.update(final_eval)
    result.update({f"eval_before/{k.split('/', 1)[1]}": v for k, v in extra.get("eval_before", {}).items()})
    if main_rank:
        try:
            result["plot"] = str(plot_metrics(run_dir / "metrics.jsonl"))  # type: ignore[assignment]
        except ValueError:
            pass  # nothing to plot yet (no iteration ran)
    result["run_dir"] = str(run_dir)  # type: ignore[assignment]
    venv.close()
    return result


def summary(result: dict[str, Any]) -> str:
    """Closing lines of a run: eval reward before and after per component, and where the plot is."""
    from baselines.common import eval_table

    lines = eval_table(result)
    if "reward/total" in result:
        lines.append(f"last training reward {result['reward/total']:.3f}")
    if "plot" in result:
        lines.append(f"plot: {result['plot']}")
    lines.append(f"run:  {result.get('run_dir')}")
    return "\n".join(lines)


def apply_preset(name: str, overrides: dict[str, Any] | None = None) -> Config:
    """A Config from ``PRESETS[name]`` with ``overrides`` on top."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return dataclasses.replace(Config(), **{**PRESETS[name], **(overrides or {})})


if __name__ == "__main__":
    import tyro

    print(summary(main(tyro.cli(Config))))
