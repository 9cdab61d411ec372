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
   KL to the reference (the base model with adapters disabled): a per-token k3 loss term
   (``--kl-in loss``, the default) or, with ``--kl-in reward``, each agent's own response KL (k3
   summed over its tokens) times ``kl_coef`` subtracted from its reward before step 3.

Run it::

    llm-envs train magrpo --env writing/xsum-v0 --num-iterations 100
    llm-envs train magrpo --preset demo          # the README's demo: ~10 minutes on 2 CPU cores

The math of steps 3-5 (``discounted_returns``, ``group_advantages``, ``policy_gradient_loss``) and
``update_agent`` are in :mod:`baselines.rl.policy_gradient`, shared with the tree rollouts
(:mod:`baselines.rl.tree`) and MAAC's actors; the rollout in :mod:`baselines.infra.play`; the run around the
loop (directory, logs, evaluations, checkpoints, Ctrl-C) in :mod:`baselines.infra.run`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from agents import placement
from baselines.infra import distributed
from baselines.infra.config import LearnerConfig, check_choice, check_ints, check_ranges, preset
from baselines.infra.metrics import reward_metrics
from baselines.infra.play import Turn, probe_env, rollout, team_env_kwargs
from baselines.infra.run import Run, mean_over_agents
from baselines.rl import tree
from baselines.rl.compiled_update import compile_charts
from baselines.rl.policy_gradient import (
    Aggregation,
    Baseline,
    discounted_returns,
    group_advantages,
    kl_penalized,
    response_kl,
    update_agent,
)
from llm_envs.core.vector import make_vec

LEARNER = "magrpo"


@dataclass
class Config(LearnerConfig):
    """MAGRPO settings: the shared ones (baselines/infra/config.py) and MAGRPO's own. Every field is a
    ``--flag`` of ``llm-envs train magrpo``."""

    learner: ClassVar[str] = LEARNER
    resumable_fields: ClassVar[tuple[str, ...]] = (*LearnerConfig.resumable_fields, "placement")

    rollout: Literal["linear", "tree"] = "linear"
    """linear: G episodes per problem, sample g of every agent forms joint g, each episode continues
    on its own; responses per problem and agent: G * T. tree (the reference's): every joint action of
    a turn branches into a child node with G new samples per agent; responses per problem and agent:
    G + G^2 + ... + G^T (aligned), G * (1 + G^N + G^2N + ...) (cross, N agents). See baselines/rl/tree.py."""
    joint_mode: Literal["aligned", "cross"] = "aligned"
    """aligned: joint action g = the g-th sample of every agent (G joint rewards per problem and turn);
    cross: every combination of the agents' samples (G^N joint rewards), each sample credited with the
    sum of the returns of the joint actions it takes part in (the reference). cross needs --rollout
    tree when num_turns > 1."""
    termination_threshold: float | None = None
    """Tree rollouts: a node whose mean joint reward exceeds this expands no further (the reference's
    early termination; its default is -0.2). Unset: every node expands until the last turn."""
    protocol: Literal["auto", "parallel", "sequential"] = "auto"
    """The env's protocol: ``auto`` (the id's registered one), ``parallel`` (all agents at once) or
    ``sequential`` (agents in order, each seeing the earlier agents' responses of the turn; tree
    rollouts only, baselines/rl/tree.py)."""
    grouping: Literal["auto", "agent-turn", "problem-turn"] = "auto"
    """Advantage groups. agent-turn (AT-GRPO, arXiv 2510.11062; the reference's tree): each agent's G
    samples under one history (one tree node); problem-turn: all of one problem's samples of a turn.
    auto: agent-turn for trees, problem-turn for linear rollouts."""
    num_problems: int = 2
    """B: problems per iteration."""
    num_generations: int = 4
    """G: envs (joint samples) per problem; the group for the advantage baseline."""
    baseline: Baseline = "mean"
    """Group baseline subtracted from each return: mean, rloo (mean of the others), max, none."""
    normalize_std: bool = False
    """Divide advantages by the group's std (clamped at 1e-6)."""
    loss_aggregation: Aggregation = "token-mean"
    """token-mean: mean over all response tokens of the batch; sequence-sum: sum per response (the
    reference), mean over responses."""
    num_epochs: int = 1
    """Updates per batch; above 1 the ratio to the sampling policy is clipped (PPO-style)."""
    kl_coef: float = 0.0
    """Weight of the KL (k3 estimator) to the reference policy, as a loss term or a reward penalty
    (--kl-in); 0 skips the reference forward."""
    kl_in: Literal["reward", "loss"] = "loss"
    micro_batch_size: int = 0
    """Responses per forward/backward in the update (gradient accumulation): the same gradient up to
    float rounding, with peak memory bounded by this many rows; 0 = all of a turn's rows at once."""
    micro_batch_tokens: int = 2048
    """Token budget of one forward/backward of the update: a turn's rows are split so that rows x
    (prompt + response columns) stays within it (at least one row per pass), which bounds the update's
    activation memory whatever the batch and prompt sizes; the gradient is the same up to float
    rounding. 0 = no budget (see docs/agents.md for the memory it bounds and the measurements behind
    the default)."""
    placement: Literal["data-parallel", "agent-per-device"] = "data-parallel"
    """With several accelerators: ``data-parallel`` (every process holds all agents on one device) or
    ``agent-per-device`` (each agent on its own device, the reference layout; needs CUDA). See
    docs/scaling.md."""
    seed_per_problem: bool | None = None
    """Sample each problem group from its own seed (seed, iteration, turn, problem position), so that
    the samples do not depend on how problems are split across processes. Unset: on with several
    processes (torchrun / accelerate launch), off with one (one batched generate per turn)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self)

    def check_processes(self, world_size: int) -> None:
        """Seeds per problem and at least one problem per process."""
        if world_size > 1 and self.seed_per_problem is False:
            raise ValueError(
                f"seed_per_problem=False with {world_size} processes: each process would sample its share "
                "from its own global RNG stream; leave --seed-per-problem unset (or True) for data-parallel runs"
            )
        if self.num_problems < world_size:
            raise ValueError(
                f"num_problems={self.num_problems} cannot be shared among {world_size} processes; every "
                f"process needs at least one problem per iteration (num_problems >= {world_size})"
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

    def env_kwargs(self) -> dict[str, Any]:
        """The shared env arguments and ``protocol`` when it is not the id's own."""
        kwargs = super().env_kwargs()
        if self.protocol != "auto":
            kwargs["protocol"] = self.protocol
        return kwargs

    def resolved_grouping(self) -> str:
        """The advantage grouping in force (``auto`` resolved)."""
        if self.grouping != "auto":
            return self.grouping
        return "agent-turn" if self.rollout == "tree" else "problem-turn"

    def uses_tree(self) -> bool:
        """Whether this run plays tree rollouts (baselines/rl/tree.py): a tree, or cross joint sampling."""
        return self.rollout == "tree" or self.joint_mode == "cross"


def check(config: Config) -> None:
    """MAGRPO's rules for its fields, alone and together: a ``ValueError`` naming the fields and the fix.
    :class:`Config` runs it after the shared settings' checks."""
    check_ints(config, {"num_problems": 1, "num_generations": 1, "num_epochs": 1, "micro_batch_size": 0,
                        "micro_batch_tokens": 0})
    check_choice(config, "baseline", ("mean", "rloo", "max", "none"))
    if config.num_generations < 2 and config.baseline != "none":
        raise ValueError(
            f"num_generations={config.num_generations} leaves a group of one: baseline={config.baseline!r} "
            "would make every advantage 0. Use num_generations >= 2 or baseline='none'."
        )
    check_choice(config, "loss_aggregation", ("token-mean", "sequence-sum"))
    check_ranges(config, {"kl_coef": (config.kl_coef >= 0, ">= 0")})
    check_choice(config, "placement", placement.PLACEMENTS)
    if config.seed_per_problem is not None and not isinstance(config.seed_per_problem, bool):
        raise ValueError(f"seed_per_problem must be True, False or None, got {config.seed_per_problem!r}")
    check_choice(config, "rollout", ("linear", "tree"))
    check_choice(config, "joint_mode", ("aligned", "cross"))
    check_choice(config, "grouping", ("auto", "agent-turn", "problem-turn"))
    if config.termination_threshold is not None and (
        isinstance(config.termination_threshold, bool)
        or not isinstance(config.termination_threshold, (int, float))
        or not math.isfinite(config.termination_threshold)
    ):
        raise ValueError(
            f"termination_threshold must be a finite float or None, got {config.termination_threshold!r}"
        )
    if config.rollout == "linear" and config.num_turns > 1:
        for name, value, hint in (
            ("joint_mode", config.joint_mode, "cross"),
            ("grouping", config.grouping, "agent-turn"),
        ):
            if value == hint:
                raise ValueError(
                    f"{name}={value!r} with rollout='linear' and num_turns={config.num_turns}: a linear episode "
                    "continues one joint action per env, so later turns have one sample per history; use "
                    "rollout='tree'"
                )
        if config.termination_threshold is not None:
            raise ValueError(
                f"termination_threshold={config.termination_threshold!r} prunes tree branches; use rollout='tree'"
            )
    check_choice(config, "protocol", ("auto", "parallel", "sequential"))
    if config.resolved_protocol() == "sequential" and not config.uses_tree():
        raise ValueError(
            f"protocol={config.protocol!r} is sequential for {config.env!r} and rollout='linear': sequential "
            "episodes are played as trees here (baselines/rl/tree.py); use rollout='tree'"
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


# ----------------------------------------------------------------------------------------- a linear batch
def grouped_advantages(returns: torch.Tensor, num_groups: int, config: Config) -> torch.Tensor:
    """Advantages of a linear batch: (N, turns) returns -> (N, turns), one group per problem and turn.
    Rows are problem-major (``b * G + g``), so group b holds rows ``b*G .. b*G + G - 1``; a group never
    straddles processes (problems are sharded whole), so this is local to each one."""
    turns = returns.shape[1]
    grouped = returns.T.reshape(turns, num_groups, config.num_generations)  # (turns, B, G)
    adv = torch.stack([group_advantages(x, config.baseline, config.normalize_std) for x in grouped])
    return adv.reshape(turns, -1).T


def agent_metrics(agent: str, turns: list[Turn], advantages: torch.Tensor, returns: torch.Tensor) -> dict[str, float]:
    """Response length, mean |advantage| and first-turn return of ``agent`` over every process's rows."""
    lengths = torch.cat([turn.responses[agent].response_lengths.float().cpu() for turn in turns])
    rows = distributed.gather_rows({"lengths": lengths, "adv": advantages, "returns": returns})
    return {
        f"agent_{agent}/response_tokens": float(rows["lengths"].mean()),
        f"agent_{agent}/advantage_abs": float(rows["adv"].abs().mean()),
        f"agent_{agent}/return": float(rows["returns"][:, 0].mean()),
    }


# ----------------------------------------------------------------------------------------- main
def main(config: Config) -> dict[str, float]:
    """Train MAGRPO; returns the final metrics (the last iteration's, plus ``eval/*`` before and after
    as ``eval_before/*`` and ``eval/*``).

    Under torchrun or accelerate launch (``WORLD_SIZE`` > 1) every process plays its share of each
    iteration's problems and the gradients are summed over processes (baselines/infra/distributed.py); only
    rank 0 evaluates, logs, plots and writes checkpoints, so ``eval*`` and ``plot`` are in rank 0's
    result only."""
    run = Run.begin(config)  # threads, processes, run directory, seeds
    per_problem = run.info.distributed if config.seed_per_problem is None else config.seed_per_problem
    positions = distributed.shard(range(config.num_problems))  # this rank's problems of each batch
    env_kwargs = config.build_env_kwargs()
    agents, _ = probe_env(config.env, max_new_tokens=config.max_new_tokens, **env_kwargs)
    config.check_agents(agents)
    policy = team_policy(config, agents, run)
    # The envs end each response at any of the policy's EOS ids, exactly where generation stopped; in
    # a team each agent's env speaks its own tokenizer.
    env_kwargs = team_env_kwargs(env_kwargs, policy, agents)
    venv = make_vec(config.env, len(positions) * config.num_generations, max_new_tokens=config.max_new_tokens,
                    **env_kwargs)  # sequential: trees only
    n_train = len(venv.envs[0].task.problems("train"))
    optimizers = {a: policy.optimizer(a, lr=config.learning_rate_of(a)) for a in agents}
    run.resume(policy, optimizers)
    run.start(policy, optimizers, env_kwargs=env_kwargs)

    metrics: dict[str, float] = {}
    with run.interruptible():
        run.evaluate_before()
        for iteration in run.iterations():
            t0 = time.perf_counter()
            problems = run.draw_problems(n_train, config.num_problems)
            if config.uses_tree():  # expand, returns leaves-up, advantages per node, update: baselines/rl/tree.py
                metrics, t_rollout, joint_samples = tree_step(policy, optimizers, venv, config, problems, positions,
                                                              per_problem, iteration)
            else:
                seeds, options = linear_batch(config, problems, positions, iteration)
                metrics, t_rollout, joint_samples = linear_step(policy, optimizers, venv, config, agents, seeds,
                                                                options, positions, per_problem, iteration, t0)
            step = iteration + 1
            elapsed = add_charts(metrics, run, config, agents, env_kwargs.get("transition"), step, joint_samples,
                                 t0, t_rollout)
            if not config.uses_tree():
                run.write_samples(step, venv.envs, seeds, options)
            run.end_iteration(step, metrics, reward=f"{metrics['reward/total']:.3f}", s_it=f"{elapsed:.1f}")
        run.evaluate_after()
    result = run.finish(metrics)
    venv.close()
    return result


def team_policy(config: Config, agents: list[str], run: Run) -> Any:
    """The team's policy, placed on this process's devices as ``--placement`` says."""
    return placement.build_policy(
        agents,
        config.model_of(agents),  # a team: agent -> its own base (--agent-models)
        placement.device_for(config.placement, agents, run.info, config.device),
        dtype=config.dtype,
        lora=config.lora_of(agents),
        mixed_batches=False,  # the generate backend only: PEFT's mixed batches measured slower on CPU
        backend=config.backend,
        gradient_checkpointing=config.gradient_checkpointing,
        activation_budget_mb=config.activation_budget_mb,
        share_prompts=config.share_prompts,
    )


def tree_step(
    policy: Any, optimizers: dict[str, Any], venv: Any, config: Config, problems: Any, positions: list[int],
    per_problem: bool, iteration: int,
) -> tuple[dict[str, float], float, int]:
    """One iteration of tree rollouts, handed whole to :func:`baselines.rl.tree.train_step`: (metrics,
    rollout seconds, joint rewards)."""
    seeds = [config.seed * 1_000_003 + iteration * config.num_problems + b for b in positions]
    options = [{"task_index": int(problems[b]), "split": "train"} for b in positions]
    sample_seeds = [distributed.group_seed(config.seed, iteration, 0, b) for b in positions]
    metrics = tree.train_step(policy, optimizers, venv.envs[0], seeds, options, config,
                              sample_seeds if per_problem else None)
    t_rollout = metrics.pop("charts/rollout_s")
    return metrics, t_rollout, int(metrics["charts/joint_rewards"])


def linear_batch(config: Config, problems: Any, positions: list[int], iteration: int) -> tuple[list[int], list[dict]]:
    """The env seeds and reset options of this rank's B*G linear episodes, problem-major."""
    g = config.num_generations
    n_envs = config.num_problems * g
    options = [{"task_index": int(problems[b]), "split": "train"} for b in positions for _ in range(g)]
    seeds = [config.seed * 1_000_003 + iteration * n_envs + b * g + k for b in positions for k in range(g)]
    return seeds, options


def linear_step(
    policy: Any, optimizers: dict[str, Any], venv: Any, config: Config, agents: list[str], seeds: list[int],
    options: list[dict], positions: list[int], per_problem: bool, iteration: int, t0: float,
) -> tuple[dict[str, float], float, int]:
    """One iteration of linear rollouts: (metrics, seconds from ``t0`` to the rollout's end, joint samples)."""
    # 1. Rollout: B*G envs, problem-major; every turn one batched generate of all agents.
    turns = rollout(policy, venv, seeds, options, config, positions if per_problem else None, iteration)
    t_rollout = time.perf_counter() - t0
    distributed.check_equal(len(turns), "turns per episode")
    metrics: dict[str, float] = {}
    for agent in agents:
        # 2. Returns over turns, 3. group-relative advantages, 4. the agent's update.
        rewards = torch.tensor(np.stack([turn.rewards[agent] for turn in turns], 1), dtype=torch.float32)
        if config.kl_in == "reward" and config.kl_coef > 0:
            # The joint reward is shared; the penalty is this agent's own responses' KL.
            kl = torch.stack([response_kl(policy, agent, turn.responses[agent], config)
                              for turn in turns], 1)  # (N, turns)
            rewards = kl_penalized(rewards, kl, config.kl_coef)
            metrics[f"agent_{agent}/kl"] = float(distributed.gather_rows(kl).mean())
        returns = discounted_returns(rewards, config.gamma)  # (N, turns)
        adv = grouped_advantages(returns, len(positions), config)  # (N, turns)
        stats = update_agent(policy, optimizers[agent], agent, turns, adv, config)
        metrics.update({f"agent_{agent}/{key}": value for key, value in stats.items()})
        metrics.update(agent_metrics(agent, turns, adv, returns))
    n_envs = config.num_problems * config.num_generations
    last = distributed.gather_rows(dict(turns[-1].infos[agents[0]]))
    episode_return = distributed.gather_rows(sum(turn.rewards[agents[0]] for turn in turns))
    metrics.update(reward_metrics(last))
    metrics["charts/episode_return"] = float(np.mean(episode_return))
    metrics["charts/reward_std"] = float(np.std(last["reward_total"]))
    metrics["charts/responses"] = float(n_envs * len(turns) * len(agents))
    return metrics, t_rollout, n_envs * len(turns)


def add_charts(
    metrics: dict[str, float], run: Run, config: Config, agents: list[str], expert: Any, step: int,
    joint_samples: int, t0: float, t_rollout: float,
) -> float:
    """5. The iteration's counters, rates and means over agents, added to ``metrics``; returns its seconds."""
    from agents import ExpertTransition

    if isinstance(expert, ExpertTransition):  # the expert model's cost so far
        metrics["charts/expert_tokens"] = expert.stats["generated_tokens"]
        metrics["charts/expert_s"] = expert.stats["seconds"]
    n_envs = config.num_problems * config.num_generations
    run.extra["samples"] = int(run.extra.get("samples", run.start_step * n_envs * config.num_turns))
    run.extra["samples"] += joint_samples
    metrics.update(mean_over_agents(metrics, ("pg_loss", "loss", "kl", "clip_fraction"), agents))
    metrics.update(compile_charts(metrics, agents))  # --compile-update: seconds spent compiling, graphs so far
    elapsed = time.perf_counter() - t0
    metrics.update({
        "charts/iteration": step,
        "charts/samples": run.extra["samples"],
        "charts/s_per_iteration": elapsed,
        "charts/rollout_fraction": t_rollout / elapsed,
        "charts/samples_per_s": joint_samples / elapsed,
        "charts/responses_per_s": metrics["charts/responses"] / t_rollout,
        "charts/learning_rate": config.learning_rate,
    })
    return elapsed


def summary(result: dict[str, Any]) -> str:
    """Closing lines of a run: :func:`baselines.infra.evaluation.summary`."""
    from baselines.infra.evaluation import summary as closing_lines

    return closing_lines(result)


def apply_preset(name: str, overrides: dict[str, Any] | None = None) -> Config:
    """A Config from ``PRESETS[name]`` with ``overrides`` on top."""
    return preset(Config, PRESETS, name, overrides)


if __name__ == "__main__":
    # `python -m baselines.learners.magrpo` (or `torchrun -m ...`) is `llm-envs train magrpo`: the same flags and
    # presets, one-line errors, and the run's report.html at the end.
    import sys

    from baselines.infra.cli import main as cli

    raise SystemExit(cli(["train", "magrpo", *sys.argv[1:]]))
