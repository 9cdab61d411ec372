"""MADPO: multi-agent direct preference optimisation, offline or iterative (online).

Facts from the reference (CoMLRL 1.3.9-1.4.1); our code and design. Docs: docs/madpo.md.

1. Offline: before training, every agent samples N candidates for each of P prompts; the j-th samples
   of all agents form joint candidate j, which the task's joint reward ranks. Iterative: every
   iteration the current team samples N candidates of B prompts and a comparator (``current``: the
   live team on its own RNG stream, ``initial``, ``history``: the team k iterations back, ``model``)
   samples as many; candidate j meets comparator j and the higher reward wins (ties dropped).
2. Pairs: offline every ordered pair with r_w > r_l; a selection rule (``reward_gap``, ``random``,
   ``all``, iterative also ``comparator_reward``) keeps ``pairs_per_prompt`` per prompt. Every
   iteration's pairs are kept; a replay (``current``, ``nearest_k``, ``all_history``,
   ``lambda_decay``) draws a batch from them.
3. For agent i, delta_i = log pi_i(y_w^i) - log pi_i(y_l^i) (summed over tokens), minus the same
   difference under the reference (adapters off) unless ``--no-reference-term``; the loss is
   -log sigmoid(beta (delta_i + stopgrad(sum_{k != i} delta_k))): a *joint* preference, each agent moved
   by its share. A non-finite loss stops the run before any weight changes.

Run it::

    llm-envs train madpo --env writing/xsum-v0 --num-iterations 20
    llm-envs train madpo --iterative --comparator initial --replay lambda_decay
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from baselines.infra import distributed
from baselines.infra.config import check_ranges, preset
from baselines.infra.evaluation import summary  # noqa: F401  (the closing lines `llm-envs train madpo` prints)
from baselines.infra.run import Run
from baselines.rl.policy_gradient import kl_to_reference, step_agent
from baselines.rl.preference import (
    Pair,
    attach_reference,
    joint_dpo_loss,
    pair_rows,
)
from baselines.rl.preference_team import (
    PreferenceConfig,
    Team,
    collect_offline,
    iterative_pairs,
    load_preference_state,
    preference_dir,
)

LEARNER = "madpo"


@dataclass
class Config(PreferenceConfig):
    """MADPO settings: the shared ones (baselines/infra/config.py), the preference ones and MADPO's own."""

    learner: ClassVar[str] = LEARNER
    beta: float = 0.1
    """DPO's beta (the reference's default 0.1)."""
    reference_term: bool = True
    """Subtract the reference's log-prob differences (standard DPO); ``--no-reference-term`` drops them,
    as the reference code does."""
    learning_rate: float = 5e-5

    def __post_init__(self) -> None:
        super().__post_init__()
        check_ranges(self, {"beta": (self.beta > 0, "> 0")})


PRESETS: dict[str, dict[str, Any]] = {
    "demo": dict(env="writing/xsum-v0", max_source_words=60, num_iterations=12, num_candidates=4, num_prompts=8,
                 num_problems=2, pairs_per_prompt=4, batch_pairs=8, max_new_tokens=48, learning_rate=1e-4,
                 lora_rank=8, lora_alpha=16.0, num_eval_problems=8, checkpoint_every=0, run_name="madpo-demo",
                 overwrite=True),
}
"""Named settings for ``--preset``; flags given on the command line override them."""


def dpo_update(policy: Any, optimizers: Mapping[str, torch.optim.Optimizer], pairs: Sequence[Pair],
               config: Config) -> dict[str, float]:
    """One gradient step of every agent on ``pairs`` (the joint DPO loss, mean over pairs), micro-batched
    by ``micro_batch_pairs``. Returns the loss, the preference accuracy (joint margin > 0), the mean
    margin and each agent's share and gradient norm.

    Per micro-batch, a pass without gradients gives every agent's share (the others' terms of each
    agent's loss are constants); then each agent's forward and backward run one after the other, so one
    agent's graph is alive at a time and each agent's gradient is computed under its own adapter."""
    agents = list(optimizers)
    for opt in optimizers.values():
        opt.zero_grad(set_to_none=True)
    total = len(pairs)
    spread = distributed.world_size() > 1
    pairs = distributed.local_block(pairs)  # this process's share; losses are divided by the whole batch
    stats: dict[str, list[float]] = {"margin": [], "accuracy": [], "kl": []}
    share: dict[str, list[float]] = {a: [] for a in agents}
    loss_sum = 0.0
    for start in range(0, len(pairs), config.micro_batch_pairs):
        part = pairs[start:start + config.micro_batch_pairs]
        n = len(part)
        rows = {a: pair_rows(part, a, policy.pad_token_id_of(a)) for a in agents}
        ref = {a: torch.tensor([p.ref[a][0] - p.ref[a][1] for p in part], dtype=torch.float32)
               if config.reference_term else torch.zeros(n) for a in agents}
        with torch.no_grad():
            own = {}
            for a in agents:
                sums = policy.logprobs(a, *rows[a], temperature=config.scoring_temperature(a)).sum(1).float().cpu()
                own[a] = sums[:n] - sums[n:] - ref[a]
        margin = sum(own.values())
        for a in agents:
            temperature = config.scoring_temperature(a)
            logprobs = policy.logprobs(a, *rows[a], temperature=temperature)
            sums = logprobs.sum(1)
            delta = sums[:n] - sums[n:]
            # The others' shares (reference term included) are constants of agent a's loss.
            others = {k: v.to(delta.device) for k, v in own.items() if k != a}
            zeros = {k: torch.zeros_like(v) for k, v in others.items()}
            losses, _ = joint_dpo_loss({a: delta, **others}, config.beta, {a: ref[a].to(delta.device), **zeros})
            loss = losses[a].sum() / (total * len(agents))
            if config.kl_coef > 0 and config.kl_in == "loss":
                reference = policy.ref_logprobs(a, *rows[a], temperature=temperature)
                mask = rows[a][3].to(logprobs.device).float()
                kl = (kl_to_reference(logprobs, reference) * mask).sum() / mask.sum().clamp(min=1.0)
                loss = loss + config.kl_coef * kl * n / (total * len(agents))
                stats["kl"].append(float(kl.detach()) * n / total)
            loss.backward()
            loss_sum += float(loss.detach())
            share[a] += own[a].tolist()
        stats["margin"] += margin.tolist()
        stats["accuracy"] += (margin > 0).float().tolist()
    # Every process must see the same verdict before the all-reduce; the weights are left as they were.
    overall = distributed.all_sum(loss_sum) if spread else loss_sum
    if not math.isfinite(overall):
        for opt in optimizers.values():
            opt.zero_grad(set_to_none=True)
        raise FloatingPointError(f"non-finite preference loss {overall}; lower learning_rate "
                                 f"({config.learning_rate}) or beta ({config.beta})")
    loss_sum = overall
    if spread:
        stats = {k: [x for part in distributed.gather_objects(v) for x in part] for k, v in stats.items()}
        share = {a: [x for part in distributed.gather_objects(v) for x in part] for a, v in share.items()}
    out = {"losses/dpo": loss_sum, "pref/margin": float(np.mean(stats["margin"])),
           "pref/accuracy": float(np.mean(stats["accuracy"])), "pref/pairs": float(total)}
    if stats["kl"]:
        out["losses/kl"] = float(np.sum(stats["kl"])) / len(agents)
    for a in agents:
        norm = step_agent(policy, optimizers[a], a, config.max_grad_norm)
        optimizers[a].zero_grad(set_to_none=True)
        out[f"agent_{a}/delta"] = float(np.mean(share[a]))
        out[f"agent_{a}/grad_norm"] = float(norm)
    return out


# ----------------------------------------------------------------------------------------- the run
def main(config: Config) -> dict[str, Any]:
    """Train MADPO; returns the final metrics with ``eval/*`` before and after (``eval_before/*``)."""
    run = Run.begin(config)
    team = Team(config, run)
    policy, agents = team.policy, team.agents
    optimizers = {a: policy.optimizer(a, lr=config.learning_rate_of(a)) for a in agents}
    run.resume(policy, optimizers)
    buffer, history = load_preference_state(team, run, config)
    run.start(policy, optimizers, env_kwargs=team.env_kwargs)

    metrics: dict[str, float] = {}
    with run.interruptible():
        run.evaluate_before()
        if not config.iterative and "collected" not in run.extra:
            pairs, collected = collect_offline(team, run, config)
            if config.reference_term:
                attach_reference(policy, pairs, config.scoring_temperature, config.micro_batch_pairs)
            buffer.add(0, pairs)
            if run.main:
                buffer.save_iteration(preference_dir(run), 0)
            run.extra["collected"] = collected
            run.state = run.boundary(run.start_step)  # the collection's RNG draws belong to the boundary
            if not pairs:
                raise ValueError(f"no preference pairs: every candidate of the {config.num_prompts} prompts tied; "
                                 "raise num_candidates or temperature")
        for iteration in run.iterations():
            t0 = time.perf_counter()
            metrics = {}
            if config.iterative:
                problems, pairs, metrics, _ = iterative_pairs(team, run, config, iteration)
                if config.reference_term:
                    attach_reference(policy, pairs, config.scoring_temperature, config.micro_batch_pairs)
                buffer.add(iteration, pairs)
            else:
                metrics.update(run.extra.get("collected", {}))
            t_sample = time.perf_counter() - t0
            for _ in range(config.updates_per_iteration):
                mode = config.replay if config.iterative else "all_history"
                batch = buffer.draw(config.batch_pairs, mode, run.rng, config.replay_k, config.replay_lambda)
                if batch:
                    stats = dpo_update(policy, optimizers, batch, config)
                    for k, v in stats.items():
                        metrics[k] = metrics.get(k, 0.0) + v / config.updates_per_iteration
            step = iteration + 1
            if config.iterative:
                if run.main:
                    buffer.save_iteration(preference_dir(run), iteration)
                history.save(team, step)
            elapsed = time.perf_counter() - t0
            metrics.update({"charts/iteration": step, "charts/s_per_iteration": elapsed,
                            "charts/rollout_fraction": t_sample / elapsed, "pref/buffer": float(len(buffer)),
                            "charts/learning_rate": config.learning_rate})
            if config.iterative:
                local = distributed.shard(problems)
                options = [{"task_index": p, "split": "train"} for p in local for _ in range(config.num_candidates)]
                run.write_samples(step, team.last_venv.envs, [None] * len(options), options)
            postfix = {"loss": f"{metrics.get('losses/dpo', float('nan')):.3f}", "s_it": f"{elapsed:.1f}"}
            if "reward/total" in metrics:
                postfix["reward"] = f"{metrics['reward/total']:.3f}"
            run.end_iteration(step, metrics, **postfix)
        run.evaluate_after()
    result = run.finish(metrics)
    team.close()
    return result


def apply_preset(name: str, overrides: dict[str, Any] | None = None) -> Config:
    """A Config from ``PRESETS[name]`` with ``overrides`` on top."""
    return preset(Config, PRESETS, name, overrides)


if __name__ == "__main__":
    # `python -m baselines.learners.madpo` (or `torchrun -m ...`) is `llm-envs train madpo`: the same flags and
    # presets, one-line errors, and the run's report.html at the end.
    import sys

    from baselines.infra.cli import main as cli

    raise SystemExit(cli(["train", "madpo", *sys.argv[1:]]))
