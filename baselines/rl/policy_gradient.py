"""The policy-gradient update of MAGRPO (linear and tree rollouts, :mod:`baselines.rl.tree`) and of MAAC's
actors: returns over turns, group-relative advantages, the (clipped) policy-gradient loss with an
optional KL to the reference, and :func:`update_agent`, one agent's gradient steps on its sampled
turns (micro-batched, summed over processes).

The KL to the reference (the base model with adapters disabled) enters in one of two places
(``kl_in``, baselines/infra/config.py): as a loss term, :func:`kl_to_reference` per token inside
:func:`update_agent`; or as a penalty on the reward, :func:`sequence_kl` (that estimator summed over
each response) from :func:`response_kl`, subtracted by :func:`kl_penalized` before returns and
advantages. Both use the k3 estimator ``exp(d) - d - 1``, ``d = log ref - log pi`` per token.

>>> group_advantages(torch.tensor([[1.0, 2.0, 3.0, 6.0]]), "rloo")
tensor([[-2.6667, -1.3333,  0.0000,  4.0000]])
>>> discounted_returns(torch.tensor([[1.0, 2.0]]), 0.5)
tensor([[2., 2.]])
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
import torch

from agents.rows import to_device
from baselines.infra import distributed
from baselines.infra.play import Turn
from baselines.rl.compiled_update import (
    CHARTS,
    CompiledLoss,
    coarse_length,
    compile_wanted,
    compiled_loss,
    compiled_slices,
    pad_rows,
    pad_to,
    scores_fused,
)
from baselines.rl.tensors import masked_mean

Baseline = Literal["mean", "rloo", "max", "none"]
Aggregation = Literal["token-mean", "sequence-sum"]


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
    denominator: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """Policy-gradient loss over response tokens: (N, T) log-probs, (N,) advantages, (N, T) mask -> scalar.

    Without ``old_logprobs``: per-token loss ``-A * log pi``. With them (a batch reused for another
    epoch): the clipped surrogate ``-min(rho A, clip(rho, 1-eps, 1+eps) A)``, ``rho = exp(log pi - old)``.
    ``token-mean`` averages over every unmasked token of the batch; ``sequence-sum`` sums each
    response's tokens and averages over responses. Masked (pad) positions never contribute.

    ``denominator`` replaces the local count (tokens for token-mean, responses for sequence-sum) by a
    given one: with several processes, the global count, so that the rank losses add up to the
    one-process loss (see baselines/infra/distributed.py); a 0-dim tensor is read on the device (the
    compiled update's, baselines/rl/compiled_update.py, whose graph must not depend on its value).
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
            return (per_token * mask).sum() / _at_least_one(denominator)
        return (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    if aggregation == "sequence-sum":
        if denominator is not None:
            return (per_token * mask).sum() / _at_least_one(denominator)
        return (per_token * mask).sum(1).mean()
    raise ValueError(f"aggregation must be 'token-mean' or 'sequence-sum', got {aggregation!r}")


def kl_to_reference(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(pi || ref): (N, T) -> (N, T), ``exp(d) - d - 1`` with
    ``d = log ref - log pi`` of the token sampled from pi; >= 0, unbiased (Schulman's "k3")."""
    delta = ref_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


def sequence_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The KL of each sampled response to the reference: (N, T) log-probs of the sampled tokens under
    the policy and under the reference, (N, T) response mask -> (N,), the per-token k3 estimate
    (:func:`kl_to_reference`) summed over the response's tokens (pads contribute nothing). An unbiased,
    never negative estimate of KL(pi(.|x) || ref(.|x)) over whole responses, which is what a penalty on a
    response's reward needs (the preference learners' reference terms use it too).

    >>> sequence_kl(torch.tensor([[-1.0, -2.0, -3.0]]), torch.tensor([[-1.0, -1.0, 0.0]]),
    ...             torch.tensor([[1, 1, 0]]))  # tokens: 0, e - 2; the pad is ignored
    tensor([0.7183])
    """
    if not logprobs.shape == ref_logprobs.shape == mask.shape or logprobs.dim() != 2:
        raise ValueError(
            f"logprobs, ref_logprobs and mask must be equal (N, T) tensors, got {tuple(logprobs.shape)}, "
            f"{tuple(ref_logprobs.shape)} and {tuple(mask.shape)}"
        )
    per_token = kl_to_reference(logprobs.float(), ref_logprobs.float().to(logprobs.device))
    return (per_token * mask.to(per_token.device, torch.float32)).sum(1)


def kl_penalized(rewards: torch.Tensor, kl: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """Rewards with the KL penalty: (N, turns) rewards and (N, turns) each turn's response KL
    (:func:`sequence_kl`) -> (N, turns) ``r - kl_coef * kl``, what returns and advantages are then
    computed from.

    >>> kl_penalized(torch.tensor([[1.0, 0.0]]), torch.tensor([[2.0, 0.5]]), 0.1)
    tensor([[ 0.8000, -0.0500]])
    """
    return rewards - kl_coef * kl.to(rewards.dtype)


def row_slices(gen: Any, config: Any) -> list[slice]:
    """Row slices of one turn's ``Generation`` for the update's passes: at most ``micro_batch_size``
    rows (0: all) and, with ``micro_batch_tokens``, at most that many tokens (rows x prompt and response
    columns; at least one row). None for a turn without rows."""
    n = len(gen.response_mask)
    size = config.micro_batch_size or max(n, 1)
    if config.micro_batch_tokens:
        width = gen.prompt_ids.shape[1] + gen.response_ids.shape[1]
        size = min(size, max(1, config.micro_batch_tokens // max(width, 1)))
    return [slice(i, i + size) for i in range(0, n, size)]


def reference_logprobs(policy: Any, agent: str, gen: Any, config: Any) -> torch.Tensor:
    """(N, T) log-probs of ``agent``'s sampled responses ``gen`` under the reference (its base with
    adapters disabled), at the agent's scoring temperature, in passes of :func:`row_slices`."""
    if not len(gen.response_mask):
        return gen.response_mask.float()
    return torch.cat([
        policy.ref_logprobs(agent, gen.prompt_ids[c], gen.prompt_mask[c], gen.response_ids[c], gen.response_mask[c],
                            temperature=config.scoring_temperature(agent))
        for c in row_slices(gen, config)
    ])


def response_kl(policy: Any, agent: str, gen: Any, config: Any) -> torch.Tensor:
    """(N,) the KL of each of ``agent``'s sampled responses to the reference, :func:`sequence_kl` of the
    sampling-time log-probs (``gen.logprobs``, at the scoring temperature) and the reference's (one
    reference forward, :func:`reference_logprobs`); on the CPU, float32."""
    ref = reference_logprobs(policy, agent, gen, config)
    return sequence_kl(gen.logprobs.float().cpu(), ref.float().cpu(), gen.response_mask.cpu())


def step_agent(policy: Any, optimizer: torch.optim.Optimizer, agent: str, max_grad_norm: float) -> float:
    """The end of an agent's update: its gradients summed over processes, clipped to ``max_grad_norm``
    (0: not clipped), one optimizer step. Returns the gradient norm before clipping."""
    params = policy.parameters(agent)
    distributed.all_reduce_grads(params, "sum")
    if max_grad_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    else:
        norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
    optimizer.step()
    return float(norm)


def _at_least_one(count: float | torch.Tensor) -> float | torch.Tensor:
    """A given denominator, at least 1: a float on the host, a tensor on its device."""
    return count.clamp(min=1.0) if isinstance(count, torch.Tensor) else max(float(count), 1.0)


def _token_mean(values: torch.Tensor, mask: torch.Tensor, tokens: float | torch.Tensor | None) -> torch.Tensor:
    """Mean of ``values`` over the tokens of ``mask``, or their sum over ``tokens`` (a whole turn's count)."""
    if tokens is None:
        return masked_mean(values, mask)
    return (values * mask.to(values.dtype)).sum() / _at_least_one(tokens)


def micro_batch_loss(
    policy: Any,
    agent: str,
    rows: Any,
    advantages: torch.Tensor,
    config: Any,
    *,
    old: torch.Tensor | None = None,
    denominator: float | torch.Tensor | None = None,
    reference: torch.Tensor | None = None,
    kl_tokens: float | torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The loss of one micro-batch of :func:`update_agent`: ``agent``'s log-probs of ``rows`` (a slice of
    ``policy.checked_rows``), the policy-gradient loss with ``advantages`` (its rows'), ratios to ``old``
    log-probs when given, and with ``reference`` log-probs the k3 KL term (weight ``kl_coef``; a token mean,
    or a sum over ``kl_tokens``). Returns (loss, policy-gradient loss, KL term or None, log-probs).

    Tensor operations only, nothing read back to the host: ``torch.compile(micro_batch_loss, fullgraph=True)``
    traces it whole, with its backward, as a captured GPU graph needs; :func:`update_agent` runs it so with
    ``compile_update`` (baselines/rl/compiled_update.py)."""
    logprobs = policy.logprobs_of(agent, rows, temperature=config.scoring_temperature(agent))
    mask = rows.response_mask
    pg = policy_gradient_loss(logprobs, advantages, mask, config.loss_aggregation, old, config.clip_eps,
                              denominator=denominator)
    if reference is None:
        return pg, pg, None, logprobs
    kl = _token_mean(kl_to_reference(logprobs, reference), mask, kl_tokens)
    return pg + config.kl_coef * kl, pg, kl, logprobs


def _compiled(policy: Any, agent: str, config: Any, device: torch.device) -> CompiledLoss | None:
    """The compiled micro-batch loss of ``agent``'s update, or None when ``compile_update`` keeps it eager
    (baselines/rl/compiled_update.py). ``on`` with a policy that does not score through the fused decoder
    is an error: the model's own forward through PEFT is not traced whole."""
    mode = getattr(config, "compile_update", "off")
    if not compile_wanted(mode, device):
        return None
    if not scores_fused(policy, agent):
        if mode == "auto":
            return None
        raise ValueError(
            f"compile_update='on' compiles the fused decoder's passes (the engine backend, LoRA, no LoRA dropout), "
            f"and agent {agent!r} is scored through the model's own forward; use --compile-update auto or off"
        )
    return compiled_loss(policy, micro_batch_loss, config.compile_backend)


def update_agent(
    policy: Any,
    optimizer: torch.optim.Optimizer,
    agent: str,
    turns: list[Turn],
    advantages: torch.Tensor,
    config: Any,
) -> dict[str, float]:
    """``num_epochs`` gradient steps of one agent on its responses of every turn. ``advantages`` is
    (N, num_turns). One batched forward per turn and epoch; the reference forward and the per-token k3
    KL term (weight ``kl_coef``) only with ``kl_in="loss"`` and ``kl_coef > 0`` (``kl_in="reward"``: the
    KL is already in the advantages).

    With several processes each rank holds its share of the rows: losses are divided by the global
    token (or response) counts and gradients summed over ranks before clipping, which is the gradient
    of the one-process loss; the returned loss statistics are summed over ranks likewise."""
    spread = distributed.world_size() > 1
    masks = [turn.responses[agent].response_mask for turn in turns]
    kl_loss = config.kl_in == "loss" and config.kl_coef > 0
    ref = [reference_logprobs(policy, agent, turn.responses[agent], config) for turn in turns] if kl_loss else []
    # Each turn's rows checked and placed once, and the advantages copied once: in the micro-batch loop
    # below nothing waits for the device (each check, search for repeated prompts or copy from pageable
    # memory would, before the backward is queued).
    rows = [policy.checked_rows(agent, g.prompt_ids, g.prompt_mask, g.response_ids, g.response_mask)
            if len(g.response_mask) else None for g in (turn.responses[agent] for turn in turns)]
    placed = [r for r in rows if r is not None]
    if placed:
        advantages = to_device(advantages, placed[0].response_ids.device)
    compiled = _compiled(policy, agent, config, placed[0].response_ids.device) if placed else None
    chunked = any(len(row_slices(turn.responses[agent], config)) > 1 for turn in turns)
    tokens = denominators = None
    if spread or chunked or compiled is not None:
        # Losses of the parts (ranks, micro-batches) are divided by the whole turn's counts, so they add
        # up to the one-batch loss (and a compiled pass's pad rows and columns change nothing).
        counts = [float(m.sum()) for m in masks]
        n_rows = [float(len(m)) for m in masks]
        tokens = distributed.all_sum(counts) if spread else counts
        row_counts = distributed.all_sum(n_rows) if spread else n_rows
        denominators = tokens if config.loss_aggregation == "token-mean" else row_counts
    counted: tuple[torch.Tensor, torch.Tensor] | None = None
    if compiled is not None and tokens is not None and denominators is not None:
        # On the device, copied once: a compiled graph takes them as inputs, not as constants of one graph each.
        counted = (to_device(torch.tensor(denominators), placed[0].response_ids.device),
                   to_device(torch.tensor(tokens), placed[0].response_ids.device))

    def token_mean(values: torch.Tensor, mask: torch.Tensor, t: int) -> torch.Tensor:
        return _token_mean(values, mask, None if tokens is None else tokens[t])

    stats: dict[str, list[float]] = {"loss": [], "pg_loss": [], "kl": [], "clip_fraction": [], "grad_norm": []}
    first_epoch: dict[tuple[int, int], torch.Tensor] = {}  # (turn, first row) -> log-probs before the update
    for epoch in range(config.num_epochs):
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros(())
        # Per-turn statistics stay on the device (float64 sums, as Python floats summed them) and are read
        # once an epoch: reading each micro-batch's would wait for the device every micro-batch.
        pending: dict[str, list[torch.Tensor]] = {"pg_loss": [], "kl": [], "clip_fraction": []}
        for t, turn in enumerate(turns):
            gen = turn.responses[agent]
            denominator = None if denominators is None else denominators[t]
            turn_pg = turn_kl = turn_clip = torch.zeros((), dtype=torch.float64)
            passes = [(c, 0) for c in row_slices(gen, config)] if counted is None else compiled_slices(gen, config)
            for c, n_pad in passes:
                part = rows[t]
                assert part is not None  # a turn without rows has no slices
                mask = part.response_mask[c]
                # On the first epoch the sampling policy is the current one: the plain policy gradient
                # (ratio 1) is exact; later epochs need the ratio to the sampling-time policy, whose
                # log-probs are the first epoch's own (the same forward; the decode-time log-probs
                # differ from it by rounding in bf16, ~0.03 nats a token).
                old = first_epoch[(t, c.start)] if epoch > 0 else None
                reference = ref[t][c] if kl_loss else None
                if compiled is None or counted is None:
                    loss, pg, kl, logprobs = micro_batch_loss(
                        policy, agent, part[c], advantages[c, t], config, old=old, denominator=denominator,
                        reference=reference, kl_tokens=None if tokens is None else tokens[t],
                    )
                    # Backward per part: only one part's graph is alive at a time.
                    (loss / len(turns)).backward()
                else:
                    width = coarse_length(mask.shape[1])
                    loss, pg, kl, logprobs = compiled.run(
                        agent, len(turns), policy, agent,
                        pad_rows(part[c], n_pad, coarse_length(part.prompt_ids.shape[1]), width),
                        pad_to(advantages[c, t], n_pad), config,
                        old=None if old is None else pad_to(old, n_pad, width), denominator=counted[0][t],
                        reference=None if reference is None else pad_to(reference, n_pad, width),
                        kl_tokens=counted[1][t] if kl_loss else None,
                    )
                    logprobs = logprobs[: len(mask), : mask.shape[1]]
                if epoch == 0 and config.num_epochs > 1:
                    first_epoch[(t, c.start)] = logprobs.detach()
                if kl is not None:
                    turn_kl = turn_kl + kl.detach().double()
                if old is not None:
                    ratio = torch.exp(logprobs.detach() - old)
                    clipped = ((ratio - 1).abs() > config.clip_eps).float()
                    turn_clip = turn_clip + token_mean(clipped, mask, t).double()
                total = total + loss.detach() / len(turns)
                turn_pg = turn_pg + pg.detach().double()
            pending["pg_loss"].append(turn_pg)
            if kl_loss:
                pending["kl"].append(turn_kl)
            if epoch > 0:
                pending["clip_fraction"].append(turn_clip)
        names = [k for k, v in pending.items() for _ in v]
        values = [v.to(total.device) for k in pending for v in pending[k]]
        read = torch.stack([*values, total.detach().double()]).tolist()  # the epoch's one wait for the device
        for name, value in zip(names, read):
            stats[name].append(value)
        # Every rank must see the same verdict, or the others would wait forever in the all-reduce.
        overall = distributed.all_sum(read[-1]) if spread else read[-1]
        if not math.isfinite(overall):
            # Raised before the optimizer step: the weights are left as they were.
            raise FloatingPointError(
                f"agent {agent!r}: non-finite loss {overall} at epoch {epoch}; lower learning_rate "
                f"({config.learning_rate}) or check the rewards"
            )
        norm = step_agent(policy, optimizer, agent, config.max_grad_norm)
        stats["loss"].append(read[-1])
        stats["grad_norm"].append(float(norm))
    # Gradients are not kept between updates: until this agent's next update they would only hold memory
    # (its adapter's size in float32) through the other agents' updates, the rollout and the evaluation.
    optimizer.zero_grad(set_to_none=True)
    out = {k: float(np.mean(v)) for k, v in stats.items() if v}
    if compiled is not None:
        out.update(compiled.take_stats(agent))
    if spread:
        # Each rank's losses are its part of the global sums; the gradient norm is already global, and the
        # compile statistics are this rank's own.
        own = ("grad_norm", *CHARTS)
        summed = distributed.reduce_metrics({k: v for k, v in out.items() if k not in own}, op="sum")
        out.update(summed)
    return out

