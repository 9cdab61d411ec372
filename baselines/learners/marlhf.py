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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from baselines.infra import distributed
from baselines.infra.config import check_choice, check_ints, check_ranges, preset
from baselines.infra.evaluation import summary  # noqa: F401  (the closing lines `llm-envs train marlhf` prints)
from baselines.infra.metrics import reward_metrics
from baselines.infra.play import Turn
from baselines.infra.run import Run, mean_over_agents
from baselines.rl.compiled_update import compile_charts
from baselines.rl.critic import CriticReader
from baselines.rl.policy_gradient import Aggregation, Baseline, group_advantages, update_agent
from baselines.rl.preference import PairBuffer, candidate_kl
from baselines.rl.preference_team import (
    PreferenceConfig,
    Team,
    collect_offline,
    iterative_pairs,
    load_preference_state,
    preference_dir,
)
from baselines.rl.reward_model import (
    REWARD_MODEL,
    LearnedRewardVec,
    fit_offline_reward_model,
    learned_rewards,
    read_pairs,
    reward_model_step,
    reward_scores,
    rm_accuracy,
)
from baselines.rl.reward_model_cache import cache_entry, fit_key, load_cached_fit, save_cached_fit

LEARNER = "marlhf"


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
    (every setting outside :data:`~baselines.rl.reward_model_cache.RL_STAGE_FIELDS`, the models, dtype,
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


def rl_config(config: Config) -> Any:
    """The PPO or MAAC settings of the RL stage: every shared setting of ``config`` (env, model, team,
    sampling, LoRA, learning rate, evaluation, hardware, checkpoints) and the learner's own defaults, in
    ``<run>/rl``. The KL settings stay the learner's own (PPO's adaptive controller, MAAC's none)."""
    import importlib

    from baselines.infra.config import LearnerConfig

    learner = importlib.import_module(f"baselines.learners.{config.rl_learner}")
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
    # The reward model (on the first agent's base) reads an agent of another tokenizer as its text.
    read = CriticReader(policy, agents, critic=REWARD_MODEL)
    stats_path = saved / "stats.json"
    if stats_path.is_file():  # a resumed run: the reward model of its first stage
        policy.load(saved)
        stats = json.loads(stats_path.read_text(encoding="utf-8"))
    else:
        optimizer = policy.optimizer(REWARD_MODEL, lr=config.rm_learning_rate)
        policy.train()
        stats = offline_stage(team, run, config, PairBuffer(), optimizer, read)
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
        ids, mask = read(prompts, responses)
        with torch.no_grad():
            out = [reward_scores(policy, ids[i:i + 8], mask[i:i + 8], config.rm_pooling) for i in range(0, len(ids), 8)]
        return torch.cat(out).double().cpu().numpy()

    learner, settings = rl_config(config)
    result = learner.main(settings, reward_wrapper=lambda venv: LearnedRewardVec(venv, scorer, pad_ids, eos_ids))
    result.update(stats)
    return result


# ----------------------------------------------------------------------------------------- the run
def offline_stage(team: Team, run: Run, config: Config, buffer: PairBuffer,
                  optimizer: torch.optim.Optimizer, read: CriticReader) -> dict[str, float]:
    """Offline MARLHF's first stage: the candidates' pairs collected and the reward model fitted on them
    (as ``read`` reads them: :func:`~baselines.rl.reward_model.read_pairs`), or both loaded from the
    ``rm_cache`` entry of this fit (written when there is none). The pairs go into ``buffer`` and the
    run's preference directory; returns the stage's finite metrics."""
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
    stats.update(fit_offline_reward_model(policy, optimizer, read_pairs(read, pairs), agents, config, run.rng,
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
    # The reward model (on the first agent's base) reads an agent of another tokenizer as its text.
    read = CriticReader(policy, agents, critic=REWARD_MODEL)
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
            run.extra["collected"] = offline_stage(team, run, config, buffer, optimizers[REWARD_MODEL], read)
            run.state = run.boundary(run.start_step)  # the trained reward model is the new boundary
        for iteration in run.iterations():
            t0 = time.perf_counter()
            metrics = {}
            if config.iterative:
                # New pairs: the reward model's accuracy on them before it learns them, then its update.
                problems, pairs, metrics, cands = iterative_pairs(team, run, config, iteration)
                if pairs:  # nothing to measure without new pairs: the metric is left out, never NaN
                    metrics["pref/rm_heldout_accuracy"] = rm_accuracy(policy, read_pairs(read, pairs), agents,
                                                                      rm_batch, config.rm_pooling)
                buffer.add(iteration, pairs)
                rm = {"losses/reward_model": [], "pref/rm_train_accuracy": []}
                for _ in range(config.rm_epochs):
                    batch = buffer.draw(config.rm_batch_pairs, config.replay, run.rng, config.replay_k,
                                        config.replay_lambda)
                    if batch:
                        stats = reward_model_step(policy, optimizers[REWARD_MODEL], read_pairs(read, batch), agents,
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
            learned = learned_rewards(policy, cands, agents, pooling=config.rm_pooling, read=read)
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
            metrics.update(compile_charts(metrics, agents))
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


def apply_preset(name: str, overrides: dict[str, Any] | None = None) -> Config:
    """A Config from ``PRESETS[name]`` with ``overrides`` on top."""
    return preset(Config, PRESETS, name, overrides)


if __name__ == "__main__":
    # `python -m baselines.learners.marlhf` (or `torchrun -m ...`) is `llm-envs train marlhf`: the same flags and
    # presets, one-line errors, and the run's report.html at the end.
    import sys

    from baselines.infra.cli import main as cli

    raise SystemExit(cli(["train", "marlhf", *sys.argv[1:]]))
