"""MARLHF: a joint reward model learned from the team's preference pairs, then multi-agent RL on it.

Facts from the reference (CoMLRL 1.3.9-1.4.1); our code and design. Docs: docs/marlhf.md.

1. Pairs as in MADPO (:mod:`baselines.madpo`): offline from N joint candidates per prompt ranked by the
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
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from baselines.config import check_choice, check_ints, check_ranges
from baselines.critic import critic_inputs
from baselines.madpo import (
    PreferenceConfig,
    Team,
    collect_offline,
    iterative_pairs,
    load_preference_state,
    preference_dir,
)
from baselines.metrics import reward_metrics
from baselines.play import Turn, check_shared_tokenizer
from baselines.policy_gradient import Aggregation, Baseline, group_advantages, update_agent
from baselines.preference import Candidates, Pair, bradley_terry_loss, candidate_kl
from baselines.run import Run, mean_over_agents

LEARNER = "marlhf"
REWARD_MODEL = "reward_model"
"""The reward model's adapter name in the policy (an env agent may not use it)."""


@dataclass
class Config(PreferenceConfig):
    """MARLHF settings: the shared ones, the preference ones (candidates, pairs, iterative form) and the
    reward model's and the RL stage's own."""

    learner: ClassVar[str] = LEARNER
    resumable_fields: ClassVar[tuple[str, ...]] = PreferenceConfig.resumable_fields
    rm_learning_rate: float = 1e-4
    """AdamW learning rate of the reward model's adapter and head."""
    rm_epochs: int = 2
    """Offline: passes over the training pairs; iterative: updates on replayed batches per iteration."""
    rm_batch_pairs: int = 8
    """Pairs per reward-model step."""
    rm_holdout: float = 0.2
    """Offline: the fraction of pairs held out from the reward model's training to measure its accuracy."""
    rl_learner: str = "magrpo"
    """The RL stage on the learned reward: ``magrpo`` (group-relative advantages over each prompt's
    ``num_candidates`` joint samples)."""
    baseline: Baseline = "mean"
    """MAGRPO's group baseline of the RL stage (mean, rloo, max, none)."""
    normalize_std: bool = True
    """Divide the RL stage's advantages by the group's std (a learned reward has no fixed scale)."""
    loss_aggregation: Aggregation = "token-mean"
    """token-mean or sequence-sum (as MAGRPO)."""
    num_epochs: int = 1
    """RL updates per batch (above 1 the ratio is clipped, as MAGRPO)."""
    micro_batch_size: int = 0
    """RL update rows per forward/backward (0: all)."""
    micro_batch_tokens: int = 2048
    """RL update token budget per forward/backward (as MAGRPO)."""
    learning_rate: float = 1e-4

    def __post_init__(self) -> None:
        super().__post_init__()
        check_ints(self, {"rm_epochs": 1, "rm_batch_pairs": 1, "num_epochs": 1, "micro_batch_size": 0,
                          "micro_batch_tokens": 0})
        check_ranges(self, {"rm_learning_rate": (self.rm_learning_rate > 0, "> 0"),
                            "rm_holdout": (0 <= self.rm_holdout < 1, "in [0, 1)")})
        check_choice(self, "rl_learner", ("magrpo",))
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
    prompt then response in env order, left-padded (the layout of :func:`baselines.critic.critic_inputs`).

    >>> p = Pair({"a": torch.tensor([1]), "b": torch.tensor([2])}, {"a": torch.tensor([3]), "b": torch.tensor([4])},
    ...          {"a": torch.tensor([5]), "b": torch.tensor([], dtype=torch.long)}, 0, 1.0)
    >>> [row.tolist() for row in pair_inputs([p], ["a", "b"], pad_id=0)[0]]
    [[1, 3, 2, 4], [0, 1, 5, 2]]
    """
    rows = [torch.cat([t for a in agents for t in (p.prompts[a], getattr(p, side)[a])])
            for side in ("winners", "losers") for p in pairs]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    return ids, mask


def reward_scores(policy: Any, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(N,) the reward model's score of each row: its scalar head on the hidden state after the last
    input token (the value before a masked-in one-token probe)."""
    probe = torch.full((len(ids), 1), policy.pad_token_id_of(REWARD_MODEL), dtype=torch.long)
    return policy.values(REWARD_MODEL, ids, mask, probe, torch.ones_like(probe))[:, 0].float()


@torch.no_grad()
def rm_accuracy(policy: Any, pairs: Sequence[Pair], agents: Sequence[str], batch: int) -> float:
    """The fraction of ``pairs`` whose winner the reward model scores higher (NaN without pairs)."""
    if not pairs:
        return float("nan")
    right = 0
    for start in range(0, len(pairs), batch):
        part = pairs[start:start + batch]
        s = reward_scores(policy, *pair_inputs(part, agents, policy.pad_token_id_of(REWARD_MODEL)))
        right += int((s[: len(part)] > s[len(part):]).sum())
    return right / len(pairs)


def reward_model_step(policy: Any, optimizer: torch.optim.Optimizer, pairs: Sequence[Pair], agents: Sequence[str],
                      max_grad_norm: float) -> dict[str, float]:
    """One Bradley-Terry step of the reward model on ``pairs``; returns its loss and batch accuracy."""
    optimizer.zero_grad(set_to_none=True)
    s = reward_scores(policy, *pair_inputs(pairs, agents, policy.pad_token_id_of(REWARD_MODEL)))
    n = len(pairs)
    loss = bradley_terry_loss(s[:n], s[n:]).mean()
    if not math.isfinite(float(loss.detach())):
        optimizer.zero_grad(set_to_none=True)
        raise FloatingPointError(f"non-finite reward-model loss {float(loss.detach())}; lower rm_learning_rate")
    loss.backward()
    params = policy.parameters(REWARD_MODEL)
    if max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {"loss": float(loss.detach()), "accuracy": float((s[:n] > s[n:]).float().mean())}


def train_reward_model(policy: Any, optimizer: torch.optim.Optimizer, pairs: Sequence[Pair], agents: Sequence[str],
                       config: Config, rng: np.random.Generator, epochs: int) -> dict[str, float]:
    """``epochs`` shuffled passes over ``pairs`` in batches of ``rm_batch_pairs``."""
    losses, accs = [], []
    for _ in range(epochs):
        order = rng.permutation(len(pairs))
        for start in range(0, len(pairs), config.rm_batch_pairs):
            batch = [pairs[i] for i in order[start:start + config.rm_batch_pairs]]
            stats = reward_model_step(policy, optimizer, batch, agents, config.max_grad_norm)
            losses.append(stats["loss"])
            accs.append(stats["accuracy"])
    return {"losses/reward_model": float(np.mean(losses)), "pref/rm_train_accuracy": float(np.mean(accs))}


@torch.no_grad()
def learned_rewards(policy: Any, cands: Candidates, agents: Sequence[str], batch: int = 8) -> np.ndarray:
    """(rows,) the reward model's score of every joint candidate."""
    prompts = {a: (cands.gens[a].prompt_ids, cands.gens[a].prompt_mask) for a in agents}
    responses = {a: (cands.gens[a].response_ids, cands.gens[a].response_mask) for a in agents}
    ids, mask = critic_inputs(prompts, responses, agents, policy.pad_token_id_of(REWARD_MODEL))
    out = [reward_scores(policy, ids[i:i + batch], mask[i:i + batch]) for i in range(0, len(ids), batch)]
    return torch.cat(out).double().cpu().numpy()


# ----------------------------------------------------------------------------------------- the run
def main(config: Config) -> dict[str, Any]:
    """Train MARLHF; returns the final metrics with ``eval/*`` (the task's reward) before and after."""
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
            pairs, collected = collect_offline(team, run, config)
            if not pairs:
                raise ValueError(f"no preference pairs: every candidate of the {config.num_prompts} prompts tied; "
                                 "raise num_candidates or temperature")
            buffer.add(0, pairs)
            if run.main:
                buffer.save_iteration(preference_dir(run), 0)
            held = round(config.rm_holdout * len(pairs))
            order = run.rng.permutation(len(pairs))
            train = [pairs[i] for i in order[held:]]
            test = [pairs[i] for i in order[:held]]
            collected["pref/rm_accuracy_before"] = rm_accuracy(policy, test, agents, rm_batch)
            collected.update(train_reward_model(policy, optimizers[REWARD_MODEL], train, agents, config, run.rng,
                                                config.rm_epochs))
            collected["pref/rm_heldout_accuracy"] = rm_accuracy(policy, test, agents, rm_batch)
            collected["pref/rm_pairs"] = float(len(train))
            run.extra["collected"] = {k: v for k, v in collected.items() if math.isfinite(v)}
            run.state = run.boundary(run.start_step)  # the trained reward model is the new boundary
        for iteration in run.iterations():
            t0 = time.perf_counter()
            metrics = {}
            if config.iterative:
                # New pairs: the reward model's accuracy on them before it learns them, then its update.
                problems, pairs, metrics = iterative_pairs(team, run, config, iteration)
                metrics["pref/rm_heldout_accuracy"] = rm_accuracy(policy, pairs, agents, rm_batch)
                buffer.add(iteration, pairs)
                rm = {"losses/reward_model": [], "pref/rm_train_accuracy": []}
                for _ in range(config.rm_epochs):
                    batch = buffer.draw(config.rm_batch_pairs, config.replay, run.rng, config.replay_k,
                                        config.replay_lambda)
                    if batch:
                        stats = reward_model_step(policy, optimizers[REWARD_MODEL], batch, agents,
                                                  config.max_grad_norm)
                        rm["losses/reward_model"].append(stats["loss"])
                        rm["pref/rm_train_accuracy"].append(stats["accuracy"])
                metrics.update({k: float(np.mean(v)) for k, v in rm.items() if v})
                cands = team.last_team_candidates
            else:
                metrics.update(run.extra.get("collected", {}))
                problems = [int(p) for p in run.rng.choice(team.n_train, size=config.num_problems,
                                                            replace=team.n_train < config.num_problems)]
                cands = team.candidates(problems, iteration, stream=0)
                metrics.update(reward_metrics(dict(cands.infos[agents[0]])))
            t_sample = time.perf_counter() - t0
            # RL on the learned reward: MAGRPO's group-relative update of every agent.
            learned = learned_rewards(policy, cands, agents)
            if config.kl_coef > 0 and config.kl_in == "reward":
                learned = learned - config.kl_coef * candidate_kl(policy, cands, config.scoring_temperature)
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
                "pref/learned_reward": float(np.mean(learned)),
                "pref/buffer": float(len(buffer)),
                "charts/iteration": step,
                "charts/s_per_iteration": elapsed,
                "charts/rollout_fraction": t_sample / elapsed,
                "charts/learning_rate": config.learning_rate,
            })
            run.write_samples(step, team.venv(len(problems)).envs, [None] * len(problems) * config.num_candidates,
                              [{"task_index": p, "split": "train"} for p in problems
                               for _ in range(config.num_candidates)])
            run.end_iteration(step, metrics, reward=f"{metrics['reward/total']:.3f}",
                              learned=f"{metrics['pref/learned_reward']:.3f}", s_it=f"{elapsed:.1f}")
        run.evaluate_after()
    result = run.finish(metrics)
    team.close()
    return result


def summary(result: Mapping[str, Any]) -> str:
    from baselines.magrpo import summary as magrpo_summary

    return magrpo_summary(result)


def apply_preset(name: str, overrides: dict[str, Any] | None = None) -> Config:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
    return dataclasses.replace(Config(), **{**PRESETS[name], **(overrides or {})})


