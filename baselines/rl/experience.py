"""From played turns to PPO's per-token training signal: how an agent's turns and the env's rewards map
to tokens.

An agent's episode of K turns is its K responses laid end to end: per-token tensors are (N, T) with
T = T_1 + ... + T_K, each turn's block keeping its own right padding (masked). Every response token gets
the reward ``-kl_coef * (log pi - log pi_ref)``, both log-probs computed on that turn's own prompt (the
env's observation: its feedback after earlier turns, and under the sequential protocol the earlier
roles' responses of the same turn); turn k's reward from the env is added on turn k's last token (its
EOS, or its last sampled token). The value head reads the same prompts, so V_t of a token in turn k
is conditioned on everything the agent saw at turn k. GAE runs backwards over the unmasked tokens of
the whole episode, skipping the padding between turns: the last token of turn k bootstraps from the
value of turn k+1's first token, and the advantage carries across (gamma and lambda per token).
One turn (the IMDB and GSM8K settings) is the K = 1 case.

The KL penalty's estimator is "k1", ``log pi - log pi_ref`` of each sampled token (Ziegler et al.,
TRL): a token's may be negative, its sum over a response is an unbiased estimate of the response's
KL(pi || ref), and ``-kl_coef`` times it per token sums (undiscounted) to ``-kl_coef`` times that
estimate. ``--kl-in loss`` passes ``kl_coef=0`` here and puts a k3 term into the loss instead
(baselines/learners/ppo.py); the log-ratio is still computed and logged as the episode's KL.

>>> masks = [torch.tensor([[1, 1, 0]]), torch.tensor([[1, 0]])]   # turn 0: 2 tokens, turn 1: 1 token
>>> ends = turn_ends(masks)
>>> ends.tolist()
[[1, 3]]
>>> mask = torch.cat(masks, 1)
>>> rewards, _ = token_rewards(torch.tensor([[1.0, 2.0]]), torch.zeros(1, 5), torch.zeros(1, 5), mask, 0.1, ends)
>>> (rewards + 0.0).tolist()  # + 0.0: the masked entries are -0.0
[[0.0, 1.0, 0.0, 2.0, 0.0]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from baselines.infra import distributed
from baselines.rl.critic import Context, central_values
from baselines.rl.tensors import masked_mean


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
    mask_f = mask.to(values.dtype)
    if across_ranks:
        total, count = distributed.all_sum([float((values * mask_f).sum()), float(mask_f.sum())])
        mean = torch.tensor(total / max(count, 1.0), dtype=values.dtype, device=values.device)
        squares = distributed.all_sum(float(((values - mean) ** 2 * mask_f).sum()))
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

    ``delta_t = r_t + gamma V_{t'} - V_t`` where ``t'`` is the next unmasked token (masked columns, such
    as the padding between the turns of an episode laid end to end, are skipped) and ``V`` past the
    last unmasked token is 0 (the episode ends there); ``A_t = delta_t + gamma lam A_{t'}``; returns
    ``= A + V``.

    >>> gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.5]]), torch.ones(1, 2), 1.0, 1.0)[0]
    tensor([[0.5000, 0.5000]])
    >>> gae(torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 9.0, 0.5]]), torch.tensor([[1, 0, 1]]), 1.0, 1.0)[0]
    tensor([[0.5000, 0.0000, 0.5000]])
    """
    if not rewards.shape == values.shape == mask.shape or rewards.dim() != 2:
        raise ValueError(
            f"rewards, values and mask must be equal (N, T) tensors, got {tuple(rewards.shape)}, "
            f"{tuple(values.shape)} and {tuple(mask.shape)}"
        )
    mask_f = mask.to(values.dtype)
    unmasked = mask.bool()
    values = values * mask_f
    rewards = rewards * mask_f
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(values[:, 0])  # (N,) A of the next unmasked token
    next_value = torch.zeros_like(running)  # (N,) V of the next unmasked token
    for t in range(values.shape[1] - 1, -1, -1):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(unmasked[:, t], delta + gamma * lam * running, running)
        next_value = torch.where(unmasked[:, t], values[:, t], next_value)
        advantages[:, t] = running * mask_f[:, t]
    return advantages, (advantages + values) * mask_f


def turn_ends(masks: Sequence[torch.Tensor]) -> torch.Tensor:
    """Where each turn ends when the turns' responses are laid end to end: K (N, T_k) response masks ->
    (N, K) column of each turn's last token in the (N, T_1 + ... + T_K) concatenation.

    >>> turn_ends([torch.tensor([[1, 1, 0], [1, 0, 0]]), torch.tensor([[1, 0], [1, 1]])]).tolist()
    [[1, 3], [0, 4]]
    """
    ends, offset = [], 0
    for k, mask in enumerate(masks):
        lengths = mask.long().sum(1)  # (N,)
        if (lengths == 0).any():
            empty = (lengths == 0).nonzero().flatten().tolist()
            raise ValueError(f"every response needs at least one token; rows {empty} of turn {k} are empty")
        ends.append(offset + lengths - 1)
        offset += mask.shape[1]
    return torch.stack(ends, 1)


def token_rewards(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    mask: torch.Tensor,
    kl_coef: float,
    ends: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards: (N, K) task scores of K turns ((N,) for one), (N, T) log-probs under the policy
    and the reference, (N, T) mask -> (rewards (N, T), kl (N, T)). ``kl = log pi - log pi_ref`` (the k1
    estimator per token); reward
    ``= -kl_coef * kl``, plus turn k's score on its last token, column ``ends[:, k]`` (:func:`turn_ends`;
    default, one turn: the last unmasked token of each row).

    >>> token_rewards(torch.tensor([2.0]), torch.tensor([[-1.0, -1.0, 0.0]]),
    ...               torch.tensor([[-2.0, -1.5, 0.0]]), torch.tensor([[1, 1, 0]]), 0.1)[0].tolist()
    [[-0.10000000149011612, 1.9500000476837158, -0.0]]
    """
    mask_f = mask.to(logprobs.dtype)
    kl = (logprobs - ref_logprobs) * mask_f
    rewards = -kl_coef * kl
    scores = scores.reshape(len(scores), -1)  # (N, K)
    if ends is None:
        ends = turn_ends([mask])
    if ends.shape != scores.shape:
        raise ValueError(f"got scores of {scores.shape[1]} turn(s) for {ends.shape[1]} turn end(s)")
    rows = torch.arange(len(rewards))
    for k in range(scores.shape[1]):
        rewards[rows, ends[:, k].to(rewards.device)] += scores[:, k].to(rewards.dtype)
    return rewards, kl


@dataclass
class Experience:
    """One model's share of a batch over the K turns of its episodes. ``turns``: each turn's prompts and
    responses (``agents.Generation``); the per-token tensors cover the turns' responses laid end to end,
    (N, T) with T = T_1 + ... + T_K (each turn's padding stays between them, masked); ``scores`` (N, K)
    the env's reward of each turn."""

    turns: list[Any]
    response_mask: torch.Tensor
    old_logprobs: torch.Tensor
    old_values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    kl: torch.Tensor
    scores: torch.Tensor
    contexts: list[Context] | None = None
    """``--critic central``: each turn's context of the central critic (:func:`baselines.rl.critic.central_view`,
    or the (N, L) ids and mask of :func:`~baselines.rl.critic.central_context`); ``None``: the model's own
    value head."""
    ref_logprobs: torch.Tensor | None = None
    """(N, T) the reference's log-probs of the responses (``--kl-in loss``'s KL term reads them)."""


def score_turn(
    policy: Any, model: str, gen: Any, temperature: float, context: Context | None = None
) -> tuple[torch.Tensor, ...]:
    """One turn under ``model``: (N, T_k) log-probs and values (its adapter and value head) and the
    reference's log-probs (adapters off, on the same prompt), in one pass where the policy can
    (:meth:`MultiAgentPolicy.score`). ``context`` (``--critic central``): the values are the central
    critic's, reading ``context`` then the same response tokens."""
    args = (gen.prompt_ids, gen.prompt_mask, gen.response_ids, gen.response_mask)
    if context is None:
        return policy.score(model, *args, with_values=True, with_reference=True, temperature=temperature)
    logprobs, _, ref = policy.score(model, *args, with_reference=True, temperature=temperature)
    return logprobs, central_values(policy, context, gen.response_ids, gen.response_mask), ref


@torch.no_grad()
def make_experience(
    policy: Any,
    model: str,
    turns: Any,
    scores: torch.Tensor,
    kl_coef: float,
    config: Any,
    contexts: Sequence[Context] | None = None,
) -> Experience:
    """Score one model's episodes. ``turns``: its ``Generation`` of each turn, in order (one
    ``Generation``: single-turn episodes); ``scores``: (N, K) the env's reward of each turn ((N,) for
    one). Each turn is scored on its own prompt (:func:`score_turn`: the value head reads the turn's
    prompt, the env's feedback included); then over the responses laid end to end: per-token rewards
    (KL penalty, each turn's score on its last token), GAE across the turns, whitened advantages.
    ``config``: a PPO config (``scoring_temperature()``, ``gamma``, ``lam``, ``whiten_advantages``).
    ``contexts`` (``--critic central``): each turn's central-critic context, whose values replace the
    model's own head's."""
    gens = list(turns) if isinstance(turns, Sequence) else [turns]
    if contexts is not None and len(contexts) != len(gens):
        raise ValueError(f"got {len(contexts)} critic contexts for {len(gens)} turns")
    ctx = list(contexts) if contexts is not None else [None] * len(gens)
    parts = [score_turn(policy, model, gen, config.scoring_temperature(model), c) for gen, c in zip(gens, ctx)]
    old_logprobs, old_values, ref_logprobs = (torch.cat(tensors, 1) for tensors in zip(*parts))
    device = old_logprobs.device
    mask = torch.cat([gen.response_mask for gen in gens], 1).to(device)
    scores = scores.reshape(len(scores), -1).to(device)  # (N, K)
    ends = turn_ends([gen.response_mask for gen in gens])
    rewards, kl = token_rewards(scores, old_logprobs, ref_logprobs, mask, kl_coef, ends)
    advantages, returns = gae(rewards, old_values, mask, config.gamma, config.lam)
    if config.whiten_advantages:
        advantages = whiten(advantages, mask, across_ranks=distributed.world_size() > 1)
    return Experience(gens, mask, old_logprobs, old_values, advantages, returns, kl, scores,
                      None if contexts is None else list(contexts), ref_logprobs)
