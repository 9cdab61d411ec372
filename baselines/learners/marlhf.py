"""MARLHF: a joint reward model learned from the team's preference pairs, then multi-agent RL on it.

Facts from the reference (CoMLRL 1.3.9-1.4.1); our code and design. Docs: docs/marlhf.md.

1. Pairs as in MADPO (:mod:`baselines.learners.madpo`): offline from N joint candidates per prompt ranked by the
   task's joint reward, or iteratively, the current team against a comparator, with replay.
2. The reward model: an adapter (``reward_model``) with a scalar head on the agents' base, reading
   every agent's prompt and response (agents in env order) and scoring the last token; trained with
   the Bradley-Terry loss -log sigmoid(s_w - s_l). Offline it is trained once before RL, with
   ``rm_holdout`` of the pairs held out to measure its accuracy; iteratively it is trained again every
   iteration on the replayed pairs, and its accuracy is measured on the new pairs before it sees them.
3. RL: MAGRPO (group-relative advantages over each prompt's N joint samples) on the learned reward;
   the task's reward is logged beside it (``reward/*``) and evaluation reports the task's reward.

Run it::

    llm-envs train marlhf --env writing/xsum-v0 --num-iterations 20
    llm-envs train marlhf --iterative --comparator history --replay nearest_k
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from agents.memory import mapped_large_blocks
from baselines.infra import distributed
from baselines.infra.config import check_choice, check_ints, check_ranges, preset
from baselines.infra.metrics import reward_metrics
from baselines.infra.play import Turn, check_shared_tokenizer
from baselines.infra.run import Run, mean_over_agents
from baselines.learners.madpo import (
    PreferenceConfig,
    Team,
    collect_offline,
    iterative_pairs,
    load_preference_state,
    preference_dir,
)
from baselines.learners.rm_cache import cache_entry, fit_key, load_cached_fit, save_cached_fit
from baselines.rl.critic import critic_inputs, critic_values
from baselines.rl.policy_gradient import Aggregation, Baseline, group_advantages, update_agent
from baselines.rl.preference import Candidates, Pair, PairBuffer, bradley_terry_loss, candidate_kl

LEARNER = "marlhf"
REWARD_MODEL = "reward_model"
"""The reward model's adapter name in the policy (an env agent may not use it)."""


@dataclass
class Config(PreferenceConfig):
    """MARLHF settings: the shared ones, the preference ones (candidates, pairs, iterative form) and the
    reward model's and the RL stage's own."""

    learner: ClassVar[str] = LEARNER
    resumable_fields: ClassVar[tuple[str, ...]] = PreferenceConfig.resumable_fields
    rm_learning_rate: float = 1e-3
    """AdamW learning rate of the reward model's adapter and head (at 1e-4 the few dozen steps of an
    offline fit hardly move the head off its random start)."""
    rm_epochs: int = 4
    """Offline: the most passes over the training pairs (the epoch of best validation accuracy is kept);
    iterative: updates on replayed batches per iteration."""
    rm_batch_pairs: int = 8
    """Pairs per reward-model step: offline, whole prompts' pairs until at least this many (a prompt's
    candidates are scored once a step, not once per pair); iterative, this many drawn from the replay."""
    rm_micro_pairs: int = 2
    """A reward-model pass scores at most ``2 x rm_micro_pairs`` joint rows (the step's gradient accumulated
    over passes: the same step up to rounding); the step's activations, the run's memory peak, scale with it."""
    rm_holdout: float = 0.2
    """Offline: the fraction of prompts whose pairs are held out from the reward model's training and from
    choosing its epoch, to measure its accuracy (``pref/rm_heldout_accuracy``). Split by prompt: a held-out
    pair never shares a candidate with a training pair."""
    rm_validation: float = 0.2
    """Offline: the fraction of prompts whose pairs choose the reward model's epoch (the best validation
    accuracy of the ``rm_epochs`` passes, ``pref/rm_validation_accuracy``); 0: the last epoch is kept."""
    rm_pooling: Literal["last", "mean"] = "mean"
    """What the reward head reads: ``mean`` of its value over every position of the joint row (every agent's
    prompt and response), or ``last``, the hidden state after the last token (the reference's). On
    writing/xsum-v0 the last token carries next to nothing of the first agent's response (a linear head on
    the frozen base's last-token state: 0.52 held-out accuracy; on the mean: 0.73)."""
    rm_cache: str | None = None
    """Offline: a directory of fitted reward models shared between runs. A run whose fit would be the same
    (every setting outside :data:`~baselines.learners.rm_cache.RL_STAGE_FIELDS`, the models, dtype,
    device, CPU kernels and code: the entry's key) loads the entry's pairs, reward model, fit metrics and
    random state instead of collecting and fitting, and then runs exactly as the run that wrote it; a run
    without an entry writes one. A learning-rate sweep of the RL stage fits once."""
    rl_learner: Literal["magrpo", "ppo", "maac"] = "magrpo"
    """The RL stage on the learned reward: ``magrpo`` (group-relative advantages over each prompt's
    ``num_candidates`` joint samples; offline or iterative), or, offline only, ``ppo`` (independent PPO
    per agent) or ``maac`` (actors and a centralised critic), each with its own defaults for its own
    settings, in ``<run>/rl`` (docs/marlhf.md)."""
    rl_args: tuple[str, ...] = ()
    """``field=value`` entries for the PPO or MAAC stage's own settings (``batch_size=8
    num_ppo_epochs=2``; ``llm-envs train ppo --help`` lists them); shared settings come from this run."""
    baseline: Baseline = "mean"
    """MAGRPO's group baseline of the RL stage (mean, rloo, max, none)."""
    normalize_std: bool = True
    """Divide the RL stage's advantages by the group's std (a learned reward has no fixed scale)."""
    loss_aggregation: Aggregation = "token-mean"
    """token-mean or sequence-sum (as MAGRPO)."""
    num_epochs: int = 1
    """RL updates per batch (above 1 the ratio is clipped, as MAGRPO)."""
    learning_rate: float = 1e-4

    def __post_init__(self) -> None:
        super().__post_init__()
        check_ints(self, {"rm_epochs": 1, "rm_batch_pairs": 1, "rm_micro_pairs": 1, "num_epochs": 1})
        check_ranges(self, {"rm_learning_rate": (self.rm_learning_rate > 0, "> 0"),
                            "rm_holdout": (0 <= self.rm_holdout < 1, "in [0, 1)"),
                            "rm_validation": (0 <= self.rm_validation < 1, "in [0, 1)")})
        if self.rm_holdout + self.rm_validation >= 1:
            raise ValueError(f"rm_holdout + rm_validation must leave prompts to train on, got {self.rm_holdout} + "
                             f"{self.rm_validation}")
        check_choice(self, "rm_pooling", ("last", "mean"))
        check_choice(self, "rl_learner", ("magrpo", "ppo", "maac"))
        if self.rl_args and self.rl_learner == "magrpo":
            raise ValueError("rl_args sets a PPO or MAAC stage's own settings; MAGRPO's are this run's flags")
        if self.rm_cache is not None and self.iterative:
            raise ValueError("rm_cache shares an offline fit; --iterative fits the reward model every iteration")
        if self.iterative and self.rl_learner != "magrpo":
            raise ValueError(f"rl_learner={self.rl_learner!r} runs after the reward model is trained (offline); "
                             "--iterative retrains it every iteration inside MAGRPO's loop: use rl_learner='magrpo'")
        check_choice(self, "baseline", ("mean", "rloo", "max", "none"))
        check_choice(self, "loss_aggregation", ("token-mean", "sequence-sum"))


PRESETS: dict[str, dict[str, Any]] = {
    "demo": dict(env="writing/xsum-v0", max_source_words=60, num_iterations=12, num_candidates=4, num_prompts=8,
                 num_problems=2, pairs_per_prompt=4, max_new_tokens=48, learning_rate=1e-3, lora_rank=8,
                 lora_alpha=16.0, num_eval_problems=8, checkpoint_every=0, run_name="marlhf-demo", overwrite=True),
}


# ----------------------------------------------------------------------------------------- the reward model
def pair_inputs(pairs: Sequence[Pair], agents: Sequence[str], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The reward model's view of a batch of pairs: 2P rows (winners, then losers), each every agent's
    prompt then response in env order, left-padded (the layout of :func:`baselines.rl.critic.critic_inputs`).

    >>> p = Pair({"a": torch.tensor([1]), "b": torch.tensor([2])}, {"a": torch.tensor([3]), "b": torch.tensor([4])},
    ...          {"a": torch.tensor([5]), "b": torch.tensor([], dtype=torch.long)}, 0, 1.0)
    >>> [row.tolist() for row in pair_inputs([p], ["a", "b"], pad_id=0)[0]]
    [[1, 3, 2, 4], [0, 1, 5, 2]]
    """
    return left_padded([joint_row(p, side, agents) for side in ("winners", "losers") for p in pairs], pad_id)


def joint_row(pair: Pair, side: str, agents: Sequence[str]) -> torch.Tensor:
    """The joint row of ``pair``'s ``side`` (``winners`` or ``losers``): every agent's prompt then response."""
    return torch.cat([t for a in agents for t in (pair.prompts[a], getattr(pair, side)[a])])


def left_padded(rows: Sequence[torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D rows as (N, L) ids and mask, left-padded with ``pad_id``."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    return ids, mask


def distinct_rows(pairs: Sequence[Pair], agents: Sequence[str]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Each distinct joint row of ``pairs`` once (a prompt's N candidates make up to N(N-1)/2 pairs), and
    (P, 2) the index of each pair's winner and loser among them.

    >>> t = torch.tensor
    >>> ps = [Pair({"a": t([7])}, {"a": t([w])}, {"a": t([l])}, 0, 1.0) for w, l in ((1, 2), (1, 3), (2, 3))]
    >>> rows, index = distinct_rows(ps, ["a"])
    >>> [r.tolist() for r in rows], index.tolist()
    ([[7, 1], [7, 2], [7, 3]], [[0, 1], [0, 2], [1, 2]])
    """
    seen: dict[tuple[int, ...], int] = {}
    rows: list[torch.Tensor] = []
    index = torch.zeros((len(pairs), 2), dtype=torch.long)
    for i, p in enumerate(pairs):
        for j, side in enumerate(("winners", "losers")):
            row = joint_row(p, side, agents)
            key = tuple(row.tolist())
            if key not in seen:
                seen[key] = len(rows)
                rows.append(row)
            index[i, j] = seen[key]
    return rows, index


def by_prompt(pairs: Sequence[Pair]) -> list[list[Pair]]:
    """``pairs`` grouped by their prompt (every agent's prompt tokens), groups and pairs in first-seen order."""
    groups: dict[tuple, list[Pair]] = {}
    for p in pairs:
        groups.setdefault(prompt_key(p), []).append(p)
    return list(groups.values())


def prompt_key(pair: Pair) -> tuple:
    return tuple(tuple(t.tolist()) for t in pair.prompts.values())


def pooled_inputs(ids: torch.Tensor, mask: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, ...]:
    """Left-padded rows (N, L) as the scoring pass of every position's value reads them: each row's first
    token as a one-column prompt, then the rest and a probe (the pad id) as a right-padded response, so
    the value before response token t is the state after row token t (N, 1), (N, 1), (N, T), (N, T).

    >>> ids, mask = torch.tensor([[0, 5, 6], [7, 8, 9]]), torch.tensor([[0, 1, 1], [1, 1, 1]])
    >>> [t.tolist() for t in pooled_inputs(ids, mask, pad_id=0)]
    [[[5], [7]], [[1], [1]], [[6, 0, 0], [8, 9, 0]], [[1, 1, 0], [1, 1, 1]]]
    """
    rows = [r[m.bool()] for r, m in zip(ids, mask)]
    width = max(len(r) for r in rows)
    r_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    r_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        r_ids[i, : len(r) - 1] = r[1:]
        r_mask[i, : len(r)] = 1
    first = torch.stack([r[:1] for r in rows])
    return first, torch.ones_like(first), r_ids, r_mask


def reward_scores(policy: Any, ids: torch.Tensor, mask: torch.Tensor, pooling: str = "mean") -> torch.Tensor:
    """(N,) the reward model's score of each left-padded row (float32): its scalar head on the hidden
    state after the last token (``last``: :func:`baselines.rl.critic.critic_values` of the ``reward_model``
    adapter), or averaged over the states after every token of the row (``mean``)."""
    if pooling == "last":
        return critic_values(policy, ids, mask, adapter=REWARD_MODEL).float()
    p_ids, p_mask, r_ids, r_mask = pooled_inputs(ids, mask, policy.pad_token_id_of(REWARD_MODEL))
    values = policy.values(REWARD_MODEL, p_ids, p_mask, r_ids, r_mask).float()  # (N, T), 0 on pads
    return values.sum(1) / r_mask.sum(1).to(values)


@torch.no_grad()
def rm_accuracy(policy: Any, pairs: Sequence[Pair], agents: Sequence[str], batch: int, pooling: str = "mean") -> float:
    """The fraction of ``pairs`` whose winner the reward model scores higher (NaN without pairs); each
    distinct joint row is scored once, ``2 x batch`` rows a pass."""
    if not pairs:
        return float("nan")
    rows, index = distinct_rows(pairs, agents)
    pad_id, width = policy.pad_token_id_of(REWARD_MODEL), 2 * max(1, batch)
    s = torch.cat([reward_scores(policy, *left_padded(rows[i:i + width], pad_id), pooling).cpu()
                   for i in range(0, len(rows), width)])
    return int((s[index[:, 0]] > s[index[:, 1]]).sum()) / len(pairs)


def reward_model_step(policy: Any, optimizer: torch.optim.Optimizer, pairs: Sequence[Pair], agents: Sequence[str],
                      max_grad_norm: float, pooling: str = "mean", micro_pairs: int = 2) -> dict[str, float]:
    """One Bradley-Terry step of the reward model on ``pairs`` (with several processes each scores its
    share and the gradients are summed); returns its loss and batch accuracy.

    Each prompt's distinct joint rows are scored once (its N candidates, not the 2 rows of each of its up to
    N(N-1)/2 pairs): the same gradient as scoring every pair's rows, in fewer passes. A pass holds at most
    ``2 x micro_pairs`` rows (the step's activations, the run's memory peak); a prompt with more rows
    is scored without gradients first, then each part again with its rows' gradient of the loss."""
    from baselines.infra import distributed

    optimizer.zero_grad(set_to_none=True)
    total = len(pairs)
    width = 2 * max(1, micro_pairs)
    pad_id = policy.pad_token_id_of(REWARD_MODEL)

    def scores(rows: Sequence[torch.Tensor]) -> torch.Tensor:
        return reward_scores(policy, *left_padded(rows, pad_id), pooling)

    loss_sum, right = 0.0, 0.0
    for group in by_prompt(distributed.local_block(pairs)):
        rows, index = distinct_rows(group, agents)
        if len(rows) <= width:  # one pass
            s = scores(rows)
            index = index.to(s.device)
            loss = bradley_terry_loss(s[index[:, 0]], s[index[:, 1]]).sum() / total
            loss.backward()
        else:  # scores, the loss's gradient in each score, then each part's backward with its own
            with torch.no_grad():
                s = torch.cat([scores(rows[i:i + width]) for i in range(0, len(rows), width)])
            s.requires_grad_(True)
            index = index.to(s.device)
            loss = bradley_terry_loss(s[index[:, 0]], s[index[:, 1]]).sum() / total
            (grad,) = torch.autograd.grad(loss, s)
            for i in range(0, len(rows), width):
                (scores(rows[i:i + width]) * grad[i:i + width]).sum().backward()
        loss_sum += float(loss.detach())
        right += float((s[index[:, 0]] > s[index[:, 1]]).float().sum())
    if distributed.world_size() > 1:
        loss_sum, right = distributed.all_sum([loss_sum, right])
    params = policy.parameters(REWARD_MODEL)
    if not math.isfinite(loss_sum):  # the same verdict on every process, before any weight changes
        optimizer.zero_grad(set_to_none=True)
        raise FloatingPointError(f"non-finite reward-model loss {loss_sum}; lower rm_learning_rate")
    distributed.all_reduce_grads(params, "sum")
    # The head's bias shifts both scores of a pair: the Bradley-Terry loss cannot see it, its gradient is
    # rounding noise, and Adam would turn that noise into steps of ~lr. It stays as initialised.
    policy.value_heads[REWARD_MODEL].bias.grad = None
    if max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": loss_sum, "accuracy": right / total}


def split_by_prompt(pairs: Sequence[Pair], fractions: Sequence[float],
                    rng: np.random.Generator) -> list[list[Pair]]:
    """Pairs split by their prompt (every agent's prompt tokens): ``round(f * prompts)`` shuffled prompts
    for each fraction ``f``, in order, then the rest; a prompt's pairs stay together, so no pair of one
    part shares a candidate with a pair of another. Parts keep the pairs' order.

    >>> t = torch.tensor
    >>> ps = [Pair({"a": t([p])}, {"a": t([1])}, {"a": t([2])}, 0, 1.0) for p in (7, 7, 8, 9, 9)]
    >>> [[int(p.prompts["a"]) for p in part] for part in split_by_prompt(ps, [1 / 3], np.random.default_rng(0))]
    [[9, 9], [7, 7, 8]]
    """
    keys: dict[tuple, int] = {}
    of = [keys.setdefault(prompt_key(p), len(keys)) for p in pairs]
    order = rng.permutation(len(keys))
    part_of = np.full(len(keys), len(fractions))
    start = 0
    for i, f in enumerate(fractions):
        count = round(f * len(keys))
        part_of[order[start:start + count]] = i
        start += count
    parts: list[list[Pair]] = [[] for _ in range(len(fractions) + 1)]
    for p, k in zip(pairs, of):
        parts[part_of[k]].append(p)
    return parts


def prompt_batches(groups: Sequence[Sequence[Pair]], order: Sequence[int], size: int) -> list[list[Pair]]:
    """The steps of one pass: the prompts' pair ``groups`` in ``order``, each step whole prompts until it
    holds at least ``size`` pairs (the last step may hold fewer).

    >>> [len(b) for b in prompt_batches([[1] * 6, [2] * 6, [3] * 2, [4] * 6], [3, 2, 1, 0], 8)]
    [8, 12]
    """
    batches: list[list[Pair]] = []
    batch: list[Pair] = []
    for g in order:
        batch.extend(groups[g])
        if len(batch) >= size:
            batches.append(batch)
            batch = []
    if batch:
        batches.append(batch)
    return batches


def best_epoch(accuracies: Sequence[float]) -> int:
    """The index of the highest validation accuracy, the earliest on ties (the fewer passes).

    >>> best_epoch([0.5, 0.75, 0.75, 0.6])
    1
    """
    return int(np.argmax(np.asarray(accuracies, dtype=np.float64)))


def train_reward_model(policy: Any, optimizer: torch.optim.Optimizer, pairs: Sequence[Pair], agents: Sequence[str],
                       config: Config, rng: np.random.Generator, epochs: int,
                       validation: Sequence[Pair] = (), progress: bool = False) -> dict[str, float]:
    """``epochs`` shuffled passes over ``pairs``, a step on whole prompts' pairs, at least ``rm_batch_pairs``
    (:func:`prompt_batches`: a prompt's candidates are scored once a step); with ``validation``
    pairs, the weights of the epoch that scores them best are kept (its accuracy in
    ``pref/rm_validation_accuracy``, its number in ``pref/rm_epoch``). ``progress``: a bar over the steps."""
    from tqdm.auto import tqdm

    losses, accs, val_accs, kept = [], [], [], None
    params = policy.parameters(REWARD_MODEL)
    groups = by_prompt(pairs)
    bar = tqdm(total=epochs * len(pairs), desc="reward model", unit="pair", disable=not progress)
    for _ in range(epochs):
        for batch in prompt_batches(groups, rng.permutation(len(groups)), config.rm_batch_pairs):
            stats = reward_model_step(policy, optimizer, batch, agents, config.max_grad_norm, config.rm_pooling,
                                      config.rm_micro_pairs)
            losses.append(stats["loss"])
            accs.append(stats["accuracy"])
            bar.update(len(batch))
            bar.set_postfix(loss=f"{stats['loss']:.3f}")
        if validation:
            val_accs.append(rm_accuracy(policy, validation, agents, config.rm_batch_pairs, config.rm_pooling))
            bar.set_postfix(validation=f"{val_accs[-1]:.3f}")
            if best_epoch(val_accs) == len(val_accs) - 1:
                kept = [p.detach().clone() for p in params]
    bar.close()
    out = {"losses/reward_model": float(np.mean(losses)), "pref/rm_train_accuracy": float(np.mean(accs))}
    if val_accs:
        with torch.no_grad():
            for p, v in zip(params, kept or []):
                p.copy_(v)
        out["pref/rm_validation_accuracy"] = max(val_accs)
        out["pref/rm_epoch"] = float(best_epoch(val_accs) + 1)
    return out


def fit_offline_reward_model(policy: Any, optimizer: torch.optim.Optimizer, pairs: Sequence[Pair],
                             agents: Sequence[str], config: Config, rng: np.random.Generator,
                             progress: bool = False) -> dict[str, float]:
    """The offline fit: the pairs split by prompt into held-out (``rm_holdout``), validation
    (``rm_validation``) and training; the accuracy on the held-out pairs before and after training
    (``progress``: a bar over the steps)."""
    test, validation, train = split_by_prompt(pairs, [config.rm_holdout, config.rm_validation], rng)
    batch, pooling = config.rm_batch_pairs, config.rm_pooling
    # The joint rows (every agent's prompt and response) are the run's longest: their activations are
    # handed back when freed rather than kept in the heap, so the fit does not set the run's memory peak.
    with mapped_large_blocks():
        stats = {"pref/rm_accuracy_before": rm_accuracy(policy, test, agents, batch, pooling)}
        stats.update(train_reward_model(policy, optimizer, train, agents, config, rng, config.rm_epochs, validation,
                                        progress))
        stats["pref/rm_heldout_accuracy"] = rm_accuracy(policy, test, agents, batch, pooling)
    stats.update({"pref/rm_pairs": float(len(train)), "pref/rm_validation_pairs": float(len(validation)),
                  "pref/rm_heldout_pairs": float(len(test))})
    return stats


@torch.no_grad()
def learned_rewards(policy: Any, cands: Candidates, agents: Sequence[str], batch: int = 8,
                    pooling: str = "mean") -> np.ndarray:
    """(rows,) the reward model's score of every joint candidate (its long joint rows' blocks handed back
    when freed, as in the fit: the RL stage's resting memory does not grow with them)."""
    prompts = {a: (cands.gens[a].prompt_ids, cands.gens[a].prompt_mask) for a in agents}
    responses = {a: (cands.gens[a].response_ids, cands.gens[a].response_mask) for a in agents}
    ids, mask = critic_inputs(prompts, responses, agents, policy.pad_token_id_of(REWARD_MODEL))
    with mapped_large_blocks():
        out = [reward_scores(policy, ids[i:i + batch], mask[i:i + batch], pooling)
               for i in range(0, len(ids), batch)]
    return torch.cat(out).double().cpu().numpy()


# ----------------------------------------------------------------------------------------- learned rewards
def response_tokens(actions: np.ndarray, pad_id: int, eos_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Env actions (N, L) padded with ``pad_id`` -> the response tokens as the policy sampled them
    (ids, mask): everything before the padding, and the first pad too when the pad id is an EOS id (the
    sampled EOS), as ``agents.Generation.response_mask`` marks them.

    >>> response_tokens(np.array([[5, 2, 2], [5, 6, 7]]), pad_id=2, eos_ids=[2])[1].tolist()
    [[1, 1, 0], [1, 1, 1]]
    """
    ids = torch.as_tensor(np.asarray(actions), dtype=torch.long)
    pad = ids == pad_id
    first = torch.where(pad.any(1), pad.float().argmax(1), torch.full((len(ids),), ids.shape[1]))
    keep = first + (1 if pad_id in eos_ids else 0)
    mask = (torch.arange(ids.shape[1])[None, :] < keep[:, None]).long()
    return ids, mask


class LearnedRewardVec:
    """A vector env whose rewards are a reward model's: every step's rewards of the rows that were still
    playing are replaced by ``scorer(prompts, responses)`` ((N,) from each agent's prompt and response,
    as the reward model reads them); observations, infos (the task's ``reward_*`` components) and
    everything else are the wrapped env's. What PPO and MAAC train on in MARLHF."""

    def __init__(self, venv: Any, scorer: Any, pad_ids: Mapping[str, int], eos_ids: Mapping[str, Sequence[int]]):
        self.venv, self.scorer, self.pad_ids, self.eos_ids = venv, scorer, dict(pad_ids), dict(eos_ids)
        self._obs: dict[str, Any] | None = None
        self._done = np.zeros(venv.num_envs, dtype=bool)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.venv, name)

    def reset(self, *args: Any, **kwargs: Any) -> tuple[dict, dict]:
        obs, infos = self.venv.reset(*args, **kwargs)
        self._obs, self._done = obs, np.zeros(self.venv.num_envs, dtype=bool)
        return obs, infos

    def _ids(self, agent: str, actions: Any) -> np.ndarray:
        """Token-id actions as they are; text actions (a list of str) encoded with the agent's tokenizer."""
        if len(actions) and isinstance(actions[0], str):
            tok = self.venv.tokenizer_of(agent)
            rows = [tok.encode(t, add_special_tokens=False) for t in actions]
            out = np.full((len(rows), max(1, max(map(len, rows)))), self.pad_ids[agent], dtype=np.int64)
            for i, r in enumerate(rows):
                out[i, : len(r)] = r
            return out
        return np.asarray(actions)

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        from baselines.rl.tensors import strip_left_padding

        before, playing = self._obs, ~self._done
        obs, rewards, terms, truncs, infos = self.venv.step(actions)
        if before is None:
            raise RuntimeError("step before reset")
        acting = [a for a in actions if a in before]
        prompts = {a: tuple(torch.as_tensor(x) for x in strip_left_padding(before[a]["observation"],
                                                                           before[a]["attention_mask"]))
                   for a in acting}
        responses = {a: response_tokens(self._ids(a, actions[a]), self.pad_ids[a], self.eos_ids[a]) for a in acting}
        learned = np.asarray(self.scorer(prompts, responses), dtype=np.float64)
        for a in rewards:
            rewards[a] = np.where(playing, learned, rewards[a])
        self._obs = obs
        self._done = self._done | np.asarray(terms[acting[0]]) | np.asarray(truncs[acting[0]])
        return obs, rewards, terms, truncs, infos


def rl_config(config: Config) -> Any:
    """The PPO or MAAC settings of the RL stage: every shared setting of ``config`` (env, model, team,
    sampling, LoRA, learning rate, evaluation, hardware, checkpoints) and the learner's own defaults, in
    ``<run>/rl``. The KL settings stay the learner's own (PPO's adaptive controller, MAAC's none)."""
    import importlib

    from baselines.infra.config import LearnerConfig

    learner = importlib.import_module(f"baselines.{config.rl_learner}")
    shared = {f.name for f in dataclasses.fields(LearnerConfig)} - {"kl_in", "output_dir", "run_name"}
    own = {f.name for f in dataclasses.fields(learner.Config)}
    values = {k: getattr(config, k) for k in shared & own}
    defaults = {f.name: f.default for f in dataclasses.fields(learner.Config)}
    for entry in config.rl_args:
        name, eq, text = str(entry).partition("=")
        if not eq or name not in own or name in shared:
            valid = ", ".join(sorted(own - shared - {"kl_in"}))
            raise ValueError(f"rl_args entry {entry!r}: name one of {config.rl_learner}'s own settings as field=value "
                             f"({valid})")
        kind = type(defaults.get(name))
        try:
            if kind is bool:
                value: Any = text.lower() in ("1", "true", "yes")
            else:
                value = kind(text) if kind in (int, float) else text
        except ValueError:
            wanted = "an int" if kind is int else "a number"
            raise ValueError(f"rl_args: {name} must be {wanted}, got {text!r}") from None
        values[name] = value
    return learner, learner.Config(**values, output_dir=str(config.run_dir()), run_name="rl")


def two_stage(config: Config) -> dict[str, Any]:
    """Offline MARLHF with PPO or MAAC: the pairs and the reward model in ``<run>`` (written once: a
    resumed run loads them), then the learner's own run in ``<run>/rl`` on :class:`LearnedRewardVec`."""
    import gc
    import shutil

    from baselines.infra.rng import seed_everything

    # Checkpoints and --resume of the RL stage are the learner's own (in <run>/rl); this stage's output
    # is the reward model, written once.
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    info = distributed.init_from_env(device=config.device)
    config.check_processes(info.world_size)
    saved = config.run_dir() / "reward_model"
    if saved.exists() and not config.resume:
        if not config.overwrite:
            raise FileExistsError(f"{config.run_dir()} holds a trained reward model: pass --resume to continue the "
                                  "run or --overwrite to start afresh")
        if info.is_main:
            shutil.rmtree(config.run_dir())
        distributed.barrier()
    if config.resume and not saved.exists():
        raise FileNotFoundError(f"nothing to resume in {config.run_dir()}: no trained reward model")
    run = Run(config, info, config.run_dir(), seed_everything(config.seed))
    team = Team(config, run, extra_agents=(REWARD_MODEL,), value_head=True)
    policy, agents = team.policy, team.agents
    check_shared_tokenizer(policy, [*agents, REWARD_MODEL], "trains a reward model that reads every agent's tokens")
    stats_path = saved / "stats.json"
    if stats_path.is_file():  # a resumed run: the reward model of its first stage
        policy.load(saved)
        stats = json.loads(stats_path.read_text(encoding="utf-8"))
    else:
        optimizer = policy.optimizer(REWARD_MODEL, lr=config.rm_learning_rate)
        policy.train()
        stats = offline_stage(team, run, config, PairBuffer(), optimizer)
        del optimizer
        if run.main:
            policy.save(saved)
            stats_path.write_text(json.dumps(stats, indent=1), encoding="utf-8")
        distributed.barrier()  # the other processes start the RL stage once the reward model is written
    policy.eval()
    team.close()
    gc.collect()
    pad_ids = {a: policy.pad_token_id_of(a) for a in agents}
    eos_ids = {a: list(policy.eos_token_ids_of(a)) for a in agents}

    def scorer(prompts: Mapping[str, Any], responses: Mapping[str, Any]) -> np.ndarray:
        ids, mask = critic_inputs(prompts, responses, list(prompts), policy.pad_token_id_of(REWARD_MODEL))
        with torch.no_grad():
            out = [reward_scores(policy, ids[i:i + 8], mask[i:i + 8], config.rm_pooling) for i in range(0, len(ids), 8)]
        return torch.cat(out).double().cpu().numpy()

    learner, settings = rl_config(config)
    result = learner.main(settings, reward_wrapper=lambda venv: LearnedRewardVec(venv, scorer, pad_ids, eos_ids))
    result.update(stats)
    return result


# ----------------------------------------------------------------------------------------- the run
def offline_stage(team: Team, run: Run, config: Config, buffer: PairBuffer,
                  optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """Offline MARLHF's first stage: the candidates' pairs collected and the reward model fitted on them,
    or both loaded from the ``rm_cache`` entry of this fit (written when there is none). The pairs go
    into ``buffer`` and the run's preference directory; returns the stage's finite metrics."""
    policy, agents = team.policy, team.agents
    entry = key = None
    if config.rm_cache is not None:
        key = fit_key(config, policy)
        entry = cache_entry(config, key)
        cached = load_cached_fit(policy, entry, key, run.rng, REWARD_MODEL)
        if cached is not None:
            loaded, stats = cached
            buffer.add(0, loaded.by_iteration.get(0, []))
            if run.main:
                buffer.save_iteration(preference_dir(run), 0)
                if config.progress:
                    print(f"reward model: the fit of {entry} (held-out accuracy "
                          f"{stats.get('pref/rm_heldout_accuracy', float('nan')):.3f})", flush=True)
            return stats
    pairs, stats = collect_offline(team, run, config)
    if not pairs:
        raise ValueError(f"no preference pairs: every candidate of the {config.num_prompts} prompts tied; "
                         "raise num_candidates or temperature")
    buffer.add(0, pairs)
    if run.main:
        buffer.save_iteration(preference_dir(run), 0)
    stats.update(fit_offline_reward_model(policy, optimizer, pairs, agents, config, run.rng,
                                          progress=config.progress and run.main))
    stats = {k: v for k, v in stats.items() if math.isfinite(v)}
    if entry is not None and key is not None and run.main:
        save_cached_fit(policy, entry, key, buffer, stats, run.rng, REWARD_MODEL)
    return stats


def main(config: Config) -> dict[str, Any]:
    """Train MARLHF; returns the final metrics with ``eval/*`` (the task's reward) before and after."""
    if config.rl_learner != "magrpo":
        return two_stage(config)
    run = Run.begin(config)
    team = Team(config, run, extra_agents=(REWARD_MODEL,), value_head=True)
    policy, agents = team.policy, team.agents
    check_shared_tokenizer(policy, [*agents, REWARD_MODEL], "trains a reward model that reads every agent's tokens")
    optimizers = {a: policy.optimizer(a, lr=config.learning_rate_of(a)) for a in agents}
    optimizers[REWARD_MODEL] = policy.optimizer(REWARD_MODEL, lr=config.rm_learning_rate)
    run.resume(policy, optimizers)
    buffer, history = load_preference_state(team, run, config)
    run.start(policy, optimizers, env_kwargs=team.env_kwargs)
    # The RL stage's actor update is MAGRPO's; with kl_in=reward the KL is in the rewards instead.
    actor = dataclasses.replace(config, kl_coef=config.kl_coef if config.kl_in == "loss" else 0.0)
    rm_batch = max(config.rm_batch_pairs, 1)

    metrics: dict[str, float] = {}
    with run.interruptible():
        run.evaluate_before()
        if not config.iterative and "collected" not in run.extra:
            run.extra["collected"] = offline_stage(team, run, config, buffer, optimizers[REWARD_MODEL])
            run.state = run.boundary(run.start_step)  # the trained reward model is the new boundary
        for iteration in run.iterations():
            t0 = time.perf_counter()
            metrics = {}
            if config.iterative:
                # New pairs: the reward model's accuracy on them before it learns them, then its update.
                problems, pairs, metrics, cands = iterative_pairs(team, run, config, iteration)
                if pairs:  # nothing to measure without new pairs: the metric is left out, never NaN
                    metrics["pref/rm_heldout_accuracy"] = rm_accuracy(policy, pairs, agents, rm_batch,
                                                                      config.rm_pooling)
                buffer.add(iteration, pairs)
                rm = {"losses/reward_model": [], "pref/rm_train_accuracy": []}
                for _ in range(config.rm_epochs):
                    batch = buffer.draw(config.rm_batch_pairs, config.replay, run.rng, config.replay_k,
                                        config.replay_lambda)
                    if batch:
                        stats = reward_model_step(policy, optimizers[REWARD_MODEL], batch, agents,
                                                  config.max_grad_norm, config.rm_pooling, config.rm_micro_pairs)
                        rm["losses/reward_model"].append(stats["loss"])
                        rm["pref/rm_train_accuracy"].append(stats["accuracy"])
                metrics.update({k: float(np.mean(v)) for k, v in rm.items() if v})
            else:
                metrics.update(run.extra.get("collected", {}))
                problems = [int(p) for p in run.draw_problems(team.n_train, config.num_problems)]
                cands = team.candidates(problems, iteration, stream=0)
                metrics.update(reward_metrics(distributed.gather_rows(dict(cands.infos[agents[0]]))))
            t_sample = time.perf_counter() - t0
            # RL on the learned reward: MAGRPO's group-relative update of every agent.
            learned = learned_rewards(policy, cands, agents, pooling=config.rm_pooling)
            if config.kl_coef > 0 and config.kl_in == "reward":
                learned = learned - config.kl_coef * candidate_kl(policy, cands, config)
            rewards = torch.tensor(learned, dtype=torch.float32).view(-1, config.num_candidates)
            adv = group_advantages(rewards, config.baseline, config.normalize_std).reshape(-1, 1)
            turn = Turn(prompts={a: (cands.gens[a].prompt_ids, cands.gens[a].prompt_mask) for a in agents},
                        responses={a: cands.gens[a] for a in agents},
                        rewards={a: learned for a in agents}, infos=cands.infos)
            for agent in agents:
                stats = update_agent(policy, optimizers[agent], agent, [turn], adv, actor)
                metrics.update({f"agent_{agent}/{k}": v for k, v in stats.items()})
            metrics.update(mean_over_agents(metrics, ("pg_loss", "loss", "kl"), agents))
            step = iteration + 1
            if config.iterative:
                if run.main:
                    buffer.save_iteration(preference_dir(run), iteration)
                history.save(team, step)
            elapsed = time.perf_counter() - t0
            metrics.update({
                "pref/learned_reward": float(np.mean(distributed.gather_rows(learned))),
                "pref/buffer": float(len(buffer)),
                "charts/iteration": step,
                "charts/s_per_iteration": elapsed,
                "charts/rollout_fraction": t_sample / elapsed,
                "charts/learning_rate": config.learning_rate,
            })
            options = [{"task_index": p, "split": "train"} for p in distributed.shard(problems)
                       for _ in range(config.num_candidates)]
            run.write_samples(step, team.last_venv.envs, [None] * len(options), options)
            run.end_iteration(step, metrics, reward=f"{metrics['reward/total']:.3f}",
                              learned=f"{metrics['pref/learned_reward']:.3f}", s_it=f"{elapsed:.1f}")
        run.evaluate_after()
    result = run.finish(metrics)
    team.close()
    return result


def summary(result: Mapping[str, Any]) -> str:
    from baselines.learners.magrpo import summary as magrpo_summary

    return magrpo_summary(result)


def apply_preset(name: str, overrides: dict[str, Any] | None = None) -> Config:
    """A Config from ``PRESETS[name]`` with ``overrides`` on top."""
    return preset(Config, PRESETS, name, overrides)


