"""MARLHF's reward model: an adapter (``REWARD_MODEL``) with a scalar head on the agents' base that reads
every agent's prompt and response (agents in env order) and scores the joint turn, trained on
preference pairs with the Bradley-Terry loss; and the vector env whose rewards it gives
(:class:`LearnedRewardVec`). The run around it is :mod:`baselines.learners.marlhf`'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from agents.memory import mapped_large_blocks
from agents.rows import left_padded, strip_left
from baselines.infra import distributed
from baselines.rl.critic import CriticReader, critic_inputs, critic_values
from baselines.rl.preference import Candidates, Pair, bradley_terry_loss

REWARD_MODEL = "reward_model"
"""The reward model's adapter name in the policy (an env agent may not use it)."""


def read_pairs(read: CriticReader, pairs: Sequence[Pair]) -> list[Pair]:
    """``pairs`` as the reward model reads them (``read``: a :class:`~baselines.rl.critic.CriticReader` of
    the reward model): each agent of another tokenizer than the reward model's has its prompt, winner
    and loser as their text in the reward model's tokens; the pairs themselves when there is none."""
    if not read.foreign:
        return list(pairs)

    def side(pieces: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {a: read.piece(a, t) for a, t in pieces.items()}

    return [Pair(side(p.prompts), side(p.winners), side(p.losers), p.iteration, p.gap, dict(p.ref)) for p in pairs]


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
                       config: Any, rng: np.random.Generator, epochs: int,
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
                             agents: Sequence[str], config: Any, rng: np.random.Generator,
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
                    pooling: str = "mean", read: CriticReader | None = None) -> np.ndarray:
    """(rows,) the reward model's score of every joint candidate (its long joint rows' blocks handed back
    when freed, as in the fit: the RL stage's resting memory does not grow with them). ``read``: the
    reward model's reader of a team of tokenizers (None: one tokenizer)."""
    prompts = {a: (cands.gens[a].prompt_ids, cands.gens[a].prompt_mask) for a in agents}
    responses = {a: (cands.gens[a].response_ids, cands.gens[a].response_mask) for a in agents}
    ids, mask = (read(prompts, responses) if read is not None
                 else critic_inputs(prompts, responses, agents, policy.pad_token_id_of(REWARD_MODEL)))
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

        before, playing = self._obs, ~self._done
        obs, rewards, terms, truncs, infos = self.venv.step(actions)
        if before is None:
            raise RuntimeError("step before reset")
        acting = [a for a in actions if a in before]
        prompts = {a: tuple(torch.as_tensor(x) for x in strip_left(before[a]["observation"],
                                                                           before[a]["attention_mask"]))
                   for a in acting}
        responses = {a: response_tokens(self._ids(a, actions[a]), self.pad_ids[a], self.eos_ids[a]) for a in acting}
        learned = np.asarray(self.scorer(prompts, responses), dtype=np.float64)
        for a in rewards:
            rewards[a] = np.where(playing, learned, rewards[a])
        self._obs = obs
        self._done = self._done | np.asarray(terms[acting[0]]) | np.asarray(truncs[acting[0]])
        return obs, rewards, terms, truncs, infos
