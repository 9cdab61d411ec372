"""Preference learning for teams: the pieces MADPO and MARLHF share (:mod:`baselines.learners.madpo`,
:mod:`baselines.learners.marlhf`). Docs: docs/madpo.md, docs/marlhf.md.

=========================  ==========================================================================
``ranked_pairs``           offline pairs: every ordered pair of one prompt's joint candidates with
                           r_w > r_l (ties dropped), then the selection rule keeps ``k`` of them
``matched_pairs``          iterative pairs: candidate j against comparator j, the higher reward wins
``select_pairs``           the selection rules: reward_gap, random, all, comparator_reward
``replay_weights``         the iterations a replay draws from: current, nearest_k, all_history,
                           lambda_decay ((1 - lambda) lambda^age)
``joint_dpo_loss``         agent i's share of the joint preference: -log sigmoid(beta (d_i + sg(sum d_k)))
``bradley_terry_loss``     the reward model's loss -log sigmoid(s_w - s_l)
``PairBuffer``             every iteration's pairs (token ids per agent), saved with the run
``sample_candidates``      N joint candidates per prompt through the env API, scored by the task
=========================  ==========================================================================

A *joint* candidate j of a prompt is the j-th sample of every agent (aligned, as in MAGRPO); the task's
joint reward ranks it. A pair holds, for every agent, its prompt and its winning and losing response.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

Selection = Literal["reward_gap", "random", "all", "comparator_reward"]
Replay = Literal["current", "nearest_k", "all_history", "lambda_decay"]
Comparator = Literal["current", "initial", "history", "model"]
SELECTIONS = ("reward_gap", "random", "all", "comparator_reward")
REPLAYS = ("current", "nearest_k", "all_history", "lambda_decay")
COMPARATORS = ("current", "initial", "history", "model")


# ----------------------------------------------------------------------------------------- pairs
@dataclass(frozen=True)
class Choice:
    """One preference of a prompt: candidate ``winner`` beat ``loser`` by ``gap`` (> 0). In matched
    (iterative) pairs the indices are the candidate slot j and ``team_won`` says which side won;
    ``comparator_reward`` is the comparator sample's reward."""

    winner: int
    loser: int
    gap: float
    team_won: bool = True
    comparator_reward: float = 0.0


def ranked_pairs(rewards: Sequence[float]) -> list[Choice]:
    """Every ordered pair (w, l) of one prompt's candidates with r_w > r_l; ties are dropped. Candidates
    in index order, w before l.

    >>> [(c.winner, c.loser, c.gap) for c in ranked_pairs([1.0, 3.0, 1.0])]
    [(1, 0, 2.0), (1, 2, 2.0)]
    """
    r = [float(x) for x in rewards]
    return [Choice(i, j, r[i] - r[j]) for i in range(len(r)) for j in range(len(r)) if r[i] > r[j]]


def matched_pairs(team: Sequence[float], comparator: Sequence[float]) -> list[Choice]:
    """Candidate j of the team against candidate j of the comparator: the higher reward wins, ties are
    dropped. ``winner``/``loser`` are both j; ``team_won`` says whose response won.

    >>> [(c.winner, c.team_won, c.gap) for c in matched_pairs([1.0, 0.0, 2.0], [0.5, 0.0, 3.0])]
    [(0, True, 0.5), (2, False, 1.0)]
    """
    if len(team) != len(comparator):
        raise ValueError(f"{len(team)} team candidates against {len(comparator)} comparator candidates")
    out = []
    for j, (t, c) in enumerate(zip(team, comparator)):
        if t != c:
            out.append(Choice(j, j, abs(float(t) - float(c)), team_won=t > c, comparator_reward=float(c)))
    return out


def select_pairs(choices: Sequence[Choice], rule: Selection, k: int, rng: np.random.Generator) -> list[Choice]:
    """Keep at most ``k`` of one prompt's pairs. ``reward_gap``: the largest gaps first (ties in the
    order given); ``random``: ``k`` drawn without replacement (kept in the order given); ``all``: every
    pair (``k`` ignored); ``comparator_reward`` (iterative): the pairs whose comparator sample scored
    highest first (the strongest opponents), then by gap.

    >>> cs = ranked_pairs([0.0, 1.0, 3.0])
    >>> [(c.winner, c.loser) for c in select_pairs(cs, "reward_gap", 2, np.random.default_rng(0))]
    [(2, 0), (2, 1)]
    """
    if rule not in SELECTIONS:
        raise ValueError(f"pair selection must be one of {SELECTIONS}, got {rule!r}")
    if rule == "all":
        return list(choices)
    if k < 1:
        raise ValueError(f"pairs per prompt must be >= 1, got {k}")
    if rule == "reward_gap":
        order = sorted(range(len(choices)), key=lambda i: -choices[i].gap)  # stable: ties keep their order
    elif rule == "comparator_reward":
        order = sorted(range(len(choices)), key=lambda i: (-choices[i].comparator_reward, -choices[i].gap))
    else:
        if len(choices) <= k:
            return list(choices)
        order = sorted(rng.choice(len(choices), size=k, replace=False).tolist())
    return [choices[i] for i in order[:k]]


def replay_weights(mode: Replay, num_iterations: int, k: int = 1, lam: float = 0.5) -> np.ndarray:
    """Probability of drawing a replayed pair from each stored iteration, oldest first: (num_iterations,)
    summing to 1 (the pairs of an iteration are then drawn uniformly). Age = num_iterations - 1 - index.

    ``current``: the newest only; ``nearest_k``: the newest ``k`` equally; ``all_history``: every
    iteration equally; ``lambda_decay``: proportional to (1 - lambda) lambda^age.

    >>> replay_weights("lambda_decay", 3, lam=0.5).round(4).tolist()
    [0.1429, 0.2857, 0.5714]
    >>> replay_weights("nearest_k", 4, k=2).tolist()
    [0.0, 0.0, 0.5, 0.5]
    """
    if num_iterations < 1:
        raise ValueError("replay needs at least one stored iteration")
    ages = np.arange(num_iterations - 1, -1, -1, dtype=np.float64)
    if mode == "current":
        w = (ages == 0).astype(np.float64)
    elif mode == "nearest_k":
        if k < 1:
            raise ValueError(f"replay_k must be >= 1, got {k}")
        w = (ages < k).astype(np.float64)
    elif mode == "all_history":
        w = np.ones(num_iterations)
    elif mode == "lambda_decay":
        if not 0 < lam < 1:
            raise ValueError(f"replay_lambda must be in (0, 1), got {lam}")
        w = (1 - lam) * lam**ages
    else:
        raise ValueError(f"replay must be one of {REPLAYS}, got {mode!r}")
    return w / w.sum()


# ----------------------------------------------------------------------------------------- losses
def joint_dpo_loss(
    deltas: Mapping[str, torch.Tensor],
    beta: float,
    ref_deltas: Mapping[str, torch.Tensor] | None = None,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The joint preference loss of every agent, (P,) per agent, and the joint margin (P,).

    ``deltas[i]`` = log pi_i(y_w^i) - log pi_i(y_l^i) (summed over tokens, differentiable in agent i's
    weights). With ``ref_deltas`` (the reference policy's same differences) each agent's term is
    d_i = delta_i - ref_delta_i (DPO's reference term); without, d_i = delta_i (the reference code).
    Agent i's loss: -log sigmoid(beta * (d_i + stopgrad(sum_{k != i} d_k))): every agent sees the joint
    margin, but only its own share carries its gradient. The value of every agent's loss is the same.

    >>> d = {"a": torch.tensor([1.0]), "b": torch.tensor([-0.5])}
    >>> losses, margin = joint_dpo_loss(d, beta=1.0)
    >>> round(float(losses["a"][0]), 4), float(margin[0])
    (0.4741, 0.5)
    """
    if not beta > 0 or not math.isfinite(beta):
        raise ValueError(f"beta must be > 0, got {beta!r}")
    own = {a: d - (ref_deltas[a] if ref_deltas is not None else 0.0) for a, d in deltas.items()}
    total = sum(d.detach() for d in own.values())
    losses = {a: -F.logsigmoid(beta * (d + (total - d.detach()))) for a, d in own.items()}
    return losses, total


def bradley_terry_loss(winner_scores: torch.Tensor, loser_scores: torch.Tensor) -> torch.Tensor:
    """(P,) Bradley-Terry loss of a reward model: -log sigmoid(s_w - s_l).

    >>> round(float(bradley_terry_loss(torch.tensor([1.0]), torch.tensor([0.0]))[0]), 4)
    0.3133
    """
    return -F.logsigmoid(winner_scores - loser_scores)


# ----------------------------------------------------------------------------------------- the buffer
@dataclass
class Pair:
    """One joint preference: for every agent its prompt, winning and losing response (1-D token ids,
    no padding), the reference's summed log-probs of both (``ref``: agent -> (w, l); empty without the
    reference term), the iteration that made it and the reward gap."""

    prompts: dict[str, torch.Tensor]
    winners: dict[str, torch.Tensor]
    losers: dict[str, torch.Tensor]
    iteration: int
    gap: float
    ref: dict[str, tuple[float, float]] = field(default_factory=dict)

    def to_record(self) -> dict[str, Any]:
        return {"prompts": self.prompts, "winners": self.winners, "losers": self.losers,
                "iteration": int(self.iteration), "gap": float(self.gap),
                "ref": {a: torch.tensor(v, dtype=torch.float64) for a, v in self.ref.items()}}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> Pair:
        return cls(dict(record["prompts"]), dict(record["winners"]), dict(record["losers"]), int(record["iteration"]),
                   float(record["gap"]), {a: (float(v[0]), float(v[1])) for a, v in record["ref"].items()})


class PairBuffer:
    """Every iteration's pairs, kept for replay and written to ``<run>/preference/pairs_<step>.pt`` as
    each iteration ends (a resumed run reads back those up to its checkpoint's step and drops later
    ones, so it continues with exactly the pairs the uninterrupted run had)."""

    def __init__(self) -> None:
        self.by_iteration: dict[int, list[Pair]] = {}

    def __len__(self) -> int:
        return sum(len(v) for v in self.by_iteration.values())

    def add(self, iteration: int, pairs: Sequence[Pair]) -> None:
        self.by_iteration.setdefault(int(iteration), []).extend(pairs)

    def iterations(self) -> list[int]:
        return sorted(self.by_iteration)

    def draw(self, size: int, mode: Replay, rng: np.random.Generator, k: int = 1, lam: float = 0.5) -> list[Pair]:
        """``size`` pairs without replacement (all of them when fewer can be drawn): an iteration by
        :func:`replay_weights` over the stored iterations that hold pairs, then a pair of it uniformly.
        Iterations with no pairs (every candidate tied) are skipped; the weights renormalise."""
        iters = [i for i in self.iterations() if self.by_iteration[i]]
        if not iters:
            return []
        newest = max(self.by_iteration)
        weights = replay_weights(mode, newest - min(iters) + 1, k, lam)  # by age, gaps included
        w_iter = np.array([weights[i - min(iters)] for i in iters])
        probs = np.concatenate([np.full(len(self.by_iteration[i]), w / len(self.by_iteration[i]))
                                for i, w in zip(iters, w_iter)])
        pool = [p for i in iters for p in self.by_iteration[i]]
        if probs.sum() <= 0:
            return []
        probs = probs / probs.sum()
        n = min(size, int((probs > 0).sum()))
        picked = rng.choice(len(pool), size=n, replace=False, p=probs)
        return [pool[i] for i in picked]

    # ------------------------------------------------------------------ files
    def save_iteration(self, directory: Path, iteration: int) -> Path:
        """Write iteration ``iteration``'s pairs (atomically)."""
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"pairs_{iteration:06d}.pt"
        tmp = path.with_suffix(".tmp")
        torch.save([p.to_record() for p in self.by_iteration.get(iteration, [])], tmp)
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, directory: Path, before: int, prune: bool = True) -> PairBuffer:
        """The pairs of iterations < ``before`` saved in ``directory``; later files (an interrupted
        iteration's) are removed when ``prune`` (the process that writes them). A missing file of an
        earlier iteration is an error."""
        buffer = cls()
        if not directory.exists():
            if before > 0:
                raise FileNotFoundError(f"no saved preference pairs in {directory} to resume from")
            return buffer
        for path in sorted(directory.glob("pairs_*.pt")):
            it = int(path.stem.split("_")[1])
            if it >= before:
                if prune:
                    path.unlink(missing_ok=True)
                continue
            try:
                records = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as err:
                raise ValueError(f"corrupt preference pairs file {path}: {type(err).__name__}") from err
            buffer.add(it, [Pair.from_record(r) for r in records])
        missing = sorted(set(range(before)) - set(buffer.by_iteration))
        if missing:
            raise FileNotFoundError(f"preference pairs of iterations {missing[:5]} are missing from {directory}")
        return buffer


# ----------------------------------------------------------------------------------------- tensors
def pair_rows(pairs: Sequence[Pair], agent: str, pad_id: int) -> tuple[torch.Tensor, ...]:
    """One agent's rows of a batch of pairs: 2P rows (the P winners, then the P losers) as left-padded
    prompts and right-padded responses: prompt ids, prompt mask, response ids, response mask (an empty
    response is one masked pad column: log-prob 0).

    >>> pair = Pair({"a": torch.tensor([5, 6])}, {"a": torch.tensor([7])}, {"a": torch.tensor([8, 9])}, 0, 1.0)
    >>> [t.tolist() for t in pair_rows([pair], "a", pad_id=0)]
    [[[5, 6], [5, 6]], [[1, 1], [1, 1]], [[7, 0], [8, 9]], [[1, 0], [1, 1]]]
    """
    prompts = [p.prompts[agent] for p in pairs] * 2
    responses = [p.winners[agent] for p in pairs] + [p.losers[agent] for p in pairs]
    n, pw, rw = len(prompts), max(len(x) for x in prompts), max(1, max(len(x) for x in responses))
    p_ids = torch.full((n, pw), pad_id, dtype=torch.long)
    p_mask = torch.zeros((n, pw), dtype=torch.long)
    r_ids = torch.full((n, rw), pad_id, dtype=torch.long)
    r_mask = torch.zeros((n, rw), dtype=torch.long)
    for i, (x, y) in enumerate(zip(prompts, responses)):
        if len(x):
            p_ids[i, pw - len(x):], p_mask[i, pw - len(x):] = x, 1
        if len(y):
            r_ids[i, : len(y)], r_mask[i, : len(y)] = y, 1
    return p_ids, p_mask, r_ids, r_mask


def sequence_logprob_sums(policy: Any, agent: str, rows: tuple[torch.Tensor, ...], reference: bool = False,
                          temperature: float = 1.0) -> torch.Tensor:
    """(2P,) summed log-probs of the rows' responses under ``agent`` (differentiable) or the reference."""
    fn = policy.ref_logprobs if reference else policy.logprobs
    return fn(agent, *rows, temperature=temperature).sum(1)


def row_tokens(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The tokens of one padded row (mask 1), as a 1-D CPU tensor of its own."""
    return ids[mask.bool()].detach().to("cpu", torch.long).clone()


# ----------------------------------------------------------------------------------------- candidates
@dataclass
class Candidates:
    """A batch of joint candidates: B prompts x N samples (prompt-major rows), each agent's
    ``agents.Generation``, the joint task reward per row and the env's last infos."""

    gens: dict[str, Any]
    rewards: np.ndarray
    infos: dict[str, dict[str, np.ndarray]]
    num_samples: int

    def row_prompt(self, agent: str, row: int) -> torch.Tensor:
        g = self.gens[agent]
        return row_tokens(g.prompt_ids[row], g.prompt_mask[row])

    def row_response(self, agent: str, row: int) -> torch.Tensor:
        g = self.gens[agent]
        return row_tokens(g.response_ids[row], g.response_mask[row])


@dataclass
class PromptCandidates:
    """One prompt's N joint candidates in a form every process can hold (gathered across ranks): each
    agent's prompt tokens and N response tokens, and the rewards that rank them (N,)."""

    prompts: dict[str, torch.Tensor]
    responses: dict[str, list[torch.Tensor]]
    rewards: np.ndarray


def per_prompt(cands: Candidates, rewards: np.ndarray) -> list[PromptCandidates]:
    """``cands`` (prompt-major rows) as one :class:`PromptCandidates` per prompt, ranked by ``rewards``."""
    n = cands.num_samples
    agents = list(cands.gens)
    return [
        PromptCandidates({a: cands.row_prompt(a, b * n) for a in agents},
                         {a: [cands.row_response(a, b * n + j) for j in range(n)] for a in agents},
                         np.asarray(rewards[b * n:(b + 1) * n], dtype=np.float64))
        for b in range(len(rewards) // n)
    ]


def sample_candidates(
    policy: Any,
    venv: Any,
    problems: Sequence[int],
    num_samples: int,
    group_seeds: Sequence[int],
    env_seeds: Sequence[int],
    sampling: Mapping[str, Any],
    action_length: int,
) -> Candidates:
    """Play one turn of ``len(problems) * num_samples`` envs (``venv`` has exactly that many): env
    ``b * N + j`` holds problem ``problems[b]``; every agent samples its N responses of a problem under
    ``group_seeds[b]`` (:func:`baselines.infra.distributed.generate_per_group`: the same samples whatever
    else is in the batch); the env scores the joint candidates. Single-turn envs only."""
    from agents.rows import pad_actions
    from baselines.infra import distributed

    options = [{"task_index": int(p), "split": "train"} for p in problems for _ in range(num_samples)]
    obs, _ = venv.reset(seed=list(env_seeds), options=options)
    agents = list(venv.agents)
    raw = {a: (obs[a]["observation"], obs[a]["attention_mask"]) for a in agents}
    gens = distributed.generate_per_group(policy, raw, num_samples, list(group_seeds), **sampling)
    actions = {a: pad_actions(g.response_ids, action_length, policy.pad_token_id_of(a)) for a, g in gens.items()}
    _, rewards, terms, truncs, infos = venv.step(actions)
    if venv.agents:
        raise ValueError("preference learners play single-turn episodes; this env asks for another turn "
                         "(use num_turns=1)")
    return Candidates(gens, np.asarray(rewards[agents[0]], dtype=np.float64), infos, num_samples)


def candidate_kl(policy: Any, cands: Candidates, config: Any) -> np.ndarray:
    """(rows,) the summed per-agent sequence KL to the reference of every joint candidate
    (:func:`baselines.rl.policy_gradient.response_kl`: k3 per token from the sampling-time log-probs, summed
    over each agent's response, in passes bounded by ``config``'s micro-batch settings), summed over agents."""
    from baselines.rl.policy_gradient import response_kl

    return sum(response_kl(policy, a, g, config).double().numpy() for a, g in cands.gens.items())


@torch.no_grad()
def attach_reference(policy: Any, pairs: Sequence[Pair], temperature_of: Any, micro_batch: int = 8) -> None:
    """Fill every pair's ``ref`` (agent -> summed reference log-probs of winner and loser): the
    reference is fixed, so it is computed once per pair, when the pair is made."""
    for agent in policy.agents:
        if not pairs or agent not in pairs[0].prompts:
            continue
        for start in range(0, len(pairs), micro_batch):
            part = pairs[start : start + micro_batch]
            rows = pair_rows(part, agent, policy.pad_token_id_of(agent))
            sums = sequence_logprob_sums(policy, agent, rows, reference=True, temperature=temperature_of(agent))
            n = len(part)
            for i, p in enumerate(part):
                p.ref[agent] = (float(sums[i]), float(sums[n + i]))
