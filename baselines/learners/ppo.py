"""PPO for language agents: one independent PPO learner per agent (Ziegler et al. 2019's RLHF recipe,
as in TRL's former ``PPOTrainer``), on single-agent and multi-agent envs. Docs: docs/ppo.md.

1. Draw one response length in [min_new_tokens, max_new_tokens] for the batch; play a batch of
   episodes through the env (parallel envs: all agents at once; sequential envs such as CORY's: role
   by role), each agent sampling from its own LoRA adapter.
2. Per agent and token: reward = -kl_coef * (log pi - log pi_ref) (the reference is the base model
   with adapters off, on the agent's own prompt); the env's reward is added on the last response token
   (of each turn). With ``--kl-in loss`` the rewards carry no KL and step 4 adds the per-token k3 KL
   (``exp(d) - d - 1``, ``d = log pi_ref - log pi``) times the fixed ``init_kl_coef`` to the loss.
3. Values from the agent's value head; GAE (gamma, lambda) gives advantages (whitened) and returns.
4. ``num_ppo_epochs`` passes over shuffled minibatches: clipped policy loss + vf_coef * clipped
   value loss, one optimizer (adapter + value head) per agent.
5. The KL coefficient adapts to the measured KL (target, horizon) or stays fixed (``--kl-in loss``:
   fixed).

Run it::

    llm-envs train ppo --env sentiment/imdb-v0 --num-iterations 100
    llm-envs train ppo --env sentiment/imdb-cory-v0      # two independent PPO agents, no role swaps

CORY (:mod:`baselines.learners.cory`) is this learner with two models that swap roles. Multi-turn episodes
(``--num-turns``): each turn's env reward goes on that turn's last token and GAE runs across the turns
of an agent's episode (:mod:`baselines.rl.experience` says how turns and rewards map to tokens). The run
around the loop (directory, logs, evaluations, checkpoints, Ctrl-C) is :mod:`baselines.infra.run`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from agents import placement
from baselines.infra import distributed, play
from baselines.infra.config import CRITIC, LearnerConfig, check_choice, check_ints, check_ranges, with_critic
from baselines.infra.metrics import reward_metrics
from baselines.infra.play import RoleEnvs, probe_env
from baselines.infra.run import Run, mean_over_agents
from baselines.rl.critic import CriticReader, central_forward, central_view, check_positions, context_rows
from baselines.rl.experience import Experience, make_experience
from baselines.rl.kl_control import kl_controller
from baselines.rl.policy_gradient import kl_to_reference
from baselines.rl.tensors import masked_mean

LEARNER = "ppo"


@dataclass
class Config(LearnerConfig):
    """PPO settings: the shared ones (baselines/infra/config.py) and PPO's own. Every field is a ``--flag``
    of ``llm-envs train ppo``."""

    learner: ClassVar[str] = LEARNER

    # PPO's defaults of shared fields (the CORY paper's IMDB settings; docs/ppo.md says where we differ).
    env: str = "sentiment/imdb-v0"
    max_new_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    learning_rate: float = 1e-4
    gamma: float = 1.0
    num_eval_problems: int = 16
    batch_size: int = 16
    """Episodes per iteration (the paper: 256)."""
    minibatch_size: int = 16
    """Episodes per gradient step; must divide batch_size (the paper: 256 = the whole batch)."""
    num_ppo_epochs: int = 4
    """Passes over the batch per iteration."""
    min_new_tokens: int = 4
    """Shortest response length; one length in [min_new_tokens, max_new_tokens] is drawn per batch and
    shared by every agent (IMDB in the paper: 4-16). Set both equal for a fixed length."""
    repetition_penalty: float = 1.0
    """Repetition penalty while sampling (the CORY code: 1.1). It changes what is sampled, not the
    log-probs PPO uses, so above 1 rollouts are slightly off-policy."""
    init_kl_coef: float = 0.3
    """Initial weight of the per-token KL penalty to the reference (the paper: 0.3); with --kl-in loss the
    fixed weight of the k3 KL term of the loss."""
    adaptive_kl: bool = True
    """Adapt the KL weight towards kl_target (Ziegler et al.); else keep init_kl_coef. The reward
    penalty's only: with --kl-in loss pass --no-adaptive-kl."""
    kl_target: float = 6.0
    """Target KL (summed over a response, nats) of the adaptive controller."""
    kl_horizon: int = 10000
    """Horizon (in episodes) of the adaptive controller."""
    lam: float = 0.95
    """GAE lambda."""
    clip_value: float = 0.2
    """Value clip range (around the rollout's values)."""
    vf_coef: float = 0.1
    """Weight of the value loss."""
    whiten_advantages: bool = True
    """Normalise advantages to mean 0, std 1 over the batch's response tokens."""
    eta: float = 0.01
    """Weight of the KL in the logged combined metric ``r - eta * KL`` (logging only)."""
    critic: Literal["per-agent", "central"] = "per-agent"
    """Value function: ``per-agent`` (a value head on each model's adapter: IAC) or ``central`` (one
    critic adapter + value head, MAAC's, shared by every model, reading every agent's prompt and response
    before the scored tokens; its own optimizer at learning_rate; baselines/rl/critic.py)."""
    critic_model: str | None = None
    """``--critic central``: the base model of the critic's adapter and value head (HF id or local
    directory); unset: the first model's base. A model of another tokenizer than the critic's is read as
    its text in the critic's tokens (docs/maac.md)."""
    seed_per_episode: bool | None = None
    """Sample each episode on its own from a seed of (seed, iteration, episode position), so that the
    samples do not depend on how episodes are split across processes. Unset: on with several
    processes (torchrun / accelerate launch), off with one (one batched generate per step)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_ints(self, {"batch_size": 1, "minibatch_size": 1, "num_ppo_epochs": 1, "min_new_tokens": 1,
                          "kl_horizon": 1})
        if self.batch_size % self.minibatch_size:
            raise ValueError(
                f"minibatch_size must divide batch_size, got batch_size={self.batch_size!r} and "
                f"minibatch_size={self.minibatch_size!r}"
            )
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens ({self.min_new_tokens!r}) must be <= max_new_tokens ({self.max_new_tokens!r})"
            )
        check_ranges(self, {
            "repetition_penalty": (self.repetition_penalty > 0, "> 0"),
            "init_kl_coef": (self.init_kl_coef >= 0, ">= 0"),
            "kl_target": (self.kl_target > 0, "> 0"),
            "lam": (0 <= self.lam <= 1, "in [0, 1]"),
            "clip_value": (self.clip_value > 0, "> 0"),
            "vf_coef": (self.vf_coef >= 0, ">= 0"),
            "eta": (self.eta >= 0, ">= 0"),
        })
        if self.seed_per_episode is not None and not isinstance(self.seed_per_episode, bool):
            raise ValueError(f"seed_per_episode must be True, False or None, got {self.seed_per_episode!r}")
        check_choice(self, "critic", ("per-agent", "central"))
        if self.critic_model is not None and self.critic != "central":
            raise ValueError(f"critic_model={self.critic_model!r} is the base of the central critic: pass it with "
                             "--critic central (the per-agent critics are value heads on each model's own base)")
        if self.kl_in == "loss" and self.adaptive_kl:
            raise ValueError(
                "kl_in='loss' with adaptive_kl=True: the adaptive controller steers the reward penalty's "
                "coefficient; the KL loss term uses init_kl_coef as a fixed weight, so pass --no-adaptive-kl"
            )

    def check_processes(self, world_size: int) -> None:
        """Seeds per episode and at least one episode per process."""
        if world_size > 1 and self.seed_per_episode is False:
            raise ValueError(
                f"seed_per_episode=False with {world_size} processes: each process would sample its share "
                "from its own global RNG stream; leave --seed-per-episode unset (or True) for data-parallel runs"
            )
        if self.batch_size < world_size:
            raise ValueError(
                f"batch_size={self.batch_size} cannot be shared among {world_size} processes; every "
                f"process needs at least one episode per iteration (batch_size >= {world_size})"
            )


# ----------------------------------------------------------------------------------------- math
def _token_mean(values: torch.Tensor, mask: torch.Tensor, denominator: float | None) -> torch.Tensor:
    """Mean over the unmasked entries, or their sum over ``denominator`` (a global token count)."""
    if denominator is None:
        return masked_mean(values, mask)
    return (values * mask.to(values.dtype)).sum() / max(float(denominator), 1.0)


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float,
    denominator: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate: (N, T) inputs -> (loss, clip fraction), means over unmasked tokens.
    ``loss = mean(max(-A rho, -A clip(rho, 1-eps, 1+eps)))``, ``rho = exp(log pi - log pi_old)``.
    ``denominator`` replaces the local token count (data-parallel: the minibatch's global count, so
    that the ranks' losses add up to the one-process loss).

    >>> clipped_policy_loss(torch.log(torch.tensor([[1.5]])), torch.zeros(1, 1), torch.ones(1, 1),
    ...                     torch.ones(1, 1), 0.2)[0]
    tensor(-1.2000)
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
    loss = _token_mean(torch.maximum(unclipped, clipped), mask, denominator)
    fraction = _token_mean((clipped > unclipped).to(logprobs.dtype), mask, denominator)
    return loss, fraction.detach()


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    clip_value: float,
    denominator: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss: (N, T) inputs -> (loss, clip fraction).
    ``loss = 0.5 mean(max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2))`` over unmasked tokens
    (``denominator``: as in :func:`clipped_policy_loss`).

    >>> clipped_value_loss(torch.tensor([[1.0]]), torch.tensor([[0.5]]), torch.tensor([[0.0]]),
    ...                    torch.ones(1, 1), 0.2)[0]
    tensor(0.5000)
    """
    clipped_values = torch.maximum(torch.minimum(values, old_values + clip_value), old_values - clip_value)
    losses = (values - returns) ** 2
    losses_clipped = (clipped_values - returns) ** 2
    loss = 0.5 * _token_mean(torch.maximum(losses, losses_clipped), mask, denominator)
    fraction = _token_mean((losses_clipped > losses).to(values.dtype), mask, denominator)
    return loss, fraction.detach()


# ----------------------------------------------------------------------------------------- update
def ppo_update(
    policy: Any, optimizer: torch.optim.Optimizer, model: str, exp: Experience, config: Config,
    critic_optimizer: torch.optim.Optimizer | None = None,
) -> dict[str, float]:
    """``num_ppo_epochs`` passes of shuffled minibatches over one agent's experience; returns the means
    of the losses and diagnostics. ``critic_optimizer`` (``--critic central``): the central critic's,
    stepped on the value loss of the same minibatches (``exp`` holds the critic's contexts).

    With several processes each rank holds its contiguous block of the batch's rows. Every rank
    shuffles the *global* row order the same way (rank 0's permutation), so a minibatch is the same
    set of episodes as in one process; each rank computes its rows of it (possibly none) divided by
    the minibatch's global token count, and the gradients are summed over ranks before clipping: the
    gradient of the one-process minibatch loss. The returned statistics are global."""
    spread = distributed.world_size() > 1
    names = ["policy_loss", "value_loss", "loss", "clip_fraction", "value_clip_fraction", "approx_kl", "grad_norm"]
    if config.kl_in == "loss":
        names.append("kl_loss")
    stats: dict[str, list[float]] = {k: [] for k in names}
    critic_params = [] if critic_optimizer is None else policy.parameters(CRITIC)
    params = policy.parameters(model, value_head=critic_optimizer is None)  # a central critic: no own head
    tokens = exp.response_mask.sum(1)  # (N,) per episode
    batches = distributed.global_minibatches(tokens, config.minibatch_size, config.num_ppo_epochs)
    for epoch, batch, denominator in batches:
        optimizer.zero_grad(set_to_none=True)
        if critic_optimizer is not None:
            critic_optimizer.zero_grad(set_to_none=True)
        if len(batch):
            values_out = _minibatch_loss(policy, model, exp, batch, config, denominator)
        else:  # this rank holds none of the minibatch's episodes: its share of every sum is 0
            zero = torch.zeros(())
            values_out = dict.fromkeys(("policy_loss", "value_loss", "loss", "clip_fraction"), zero)
            values_out.update(value_clip_fraction=zero, approx_kl=zero)
            if config.kl_in == "loss":
                values_out["kl_loss"] = zero
        loss = values_out["loss"]
        # Every rank must see the same verdict, or the others would wait forever in the all-reduce.
        total = distributed.all_sum(float(loss.detach())) if spread else float(loss.detach())
        if not math.isfinite(total):
            raise FloatingPointError(
                f"model {model!r}: non-finite PPO loss {total} at epoch {epoch}; lower learning_rate "
                f"({config.learning_rate}) or check the rewards"
            )
        if loss.requires_grad:
            loss.backward()
        distributed.all_reduce_grads(params, "sum")
        if config.max_grad_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
        optimizer.step()
        if critic_optimizer is not None:  # the value loss's gradient reaches only the critic
            distributed.all_reduce_grads(critic_params, "sum")
            if config.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(critic_params, config.max_grad_norm)
            critic_optimizer.step()
        for key, value in values_out.items():
            stats[key].append(float(value.detach()))
        stats["grad_norm"].append(float(norm))
    # Gradients are not kept between updates (they would only hold memory until the next one).
    optimizer.zero_grad(set_to_none=True)
    if critic_optimizer is not None:
        critic_optimizer.zero_grad(set_to_none=True)
    out = {k: float(np.mean(v)) for k, v in stats.items()}
    if spread:
        # Each rank's values are its parts of the global minibatch sums; the gradient norm is global.
        out.update(distributed.reduce_metrics({k: v for k, v in out.items() if k != "grad_norm"}, op="sum"))
    return out


def _minibatch_loss(
    policy: Any, model: str, exp: Experience, rows: torch.Tensor, config: Config, denominator: float | None
) -> dict[str, torch.Tensor]:
    """Clipped policy and value losses of one minibatch's ``rows`` (token means, or token sums over
    ``denominator``) and their diagnostics; one forward per turn, on that turn's prompts. With
    ``kl_in="loss"``, plus ``init_kl_coef`` times the token mean of the k3 KL to the reference
    (``kl_loss``; the reference's log-probs come from the rollout's scoring pass)."""
    temperature = config.scoring_temperature(model)
    outputs = []
    for k, gen in enumerate(exp.turns):
        args = (gen.prompt_ids[rows], gen.prompt_mask[rows], gen.response_ids[rows], gen.response_mask[rows])
        if exp.contexts is None:
            outputs.append(policy.forward(model, *args, with_values=True, temperature=temperature))
        else:  # the central critic's values, reading the turn's context then the same tokens
            outputs.append(central_forward(policy, model, *args, context_rows(exp.contexts[k], rows), temperature))
    logprobs, values = (torch.cat(tensors, 1) for tensors in zip(*outputs))
    mask = exp.response_mask[rows].to(logprobs.device)
    pg_loss, clip_frac = clipped_policy_loss(
        logprobs, exp.old_logprobs[rows], exp.advantages[rows], mask, config.clip_eps, denominator
    )
    vf_loss, vf_clip_frac = clipped_value_loss(
        values, exp.old_values[rows], exp.returns[rows], mask, config.clip_value, denominator
    )
    with torch.no_grad():
        approx_kl = 0.5 * _token_mean((logprobs - exp.old_logprobs[rows]) ** 2, mask, denominator)
    out = {
        "policy_loss": pg_loss,
        "value_loss": vf_loss,
        "loss": pg_loss + config.vf_coef * vf_loss,
        "clip_fraction": clip_frac,
        "value_clip_fraction": vf_clip_frac,
        "approx_kl": approx_kl,
    }
    if config.kl_in == "loss":
        kl_loss = _token_mean(kl_to_reference(logprobs, exp.ref_logprobs[rows]), mask, denominator)
        out["kl_loss"] = kl_loss
        out["loss"] = out["loss"] + config.init_kl_coef * kl_loss
    return out


# ----------------------------------------------------------------------------------------- main
Assignment = Callable[[int], dict[str, str]]
"""Iteration -> {env role: model (adapter) that plays it}."""


def role_scores(
    rewards: Mapping[str, np.ndarray], infos: Mapping[str, Mapping[str, np.ndarray]], role: str
) -> np.ndarray:
    """A role's own task reward (N,): its ``reward_<component>_<role>`` component when the env splits the
    reward by role (CORY's envs), else the single component of a one-agent env, else its env reward."""
    info = infos[role]
    own = [k for k in info if k.startswith("reward_") and k.endswith(f"_{role}")]
    if len(own) == 1:
        return np.asarray(info[own[0]], dtype=np.float64)
    parts = [k for k in info if k.startswith("reward_") and k != "reward_total"]
    if len(rewards) == 1 and len(parts) == 1:
        return np.asarray(info[parts[0]], dtype=np.float64)
    return np.asarray(rewards[role], dtype=np.float64)


def model_metrics(
    model: str, role: str, exp: Experience, stats: Mapping[str, float], task: float, kl_coef: float,
    roles: Sequence[str], config: Config,
) -> dict[str, float]:
    """``agent_<model>/*``: the update's statistics, the task reward of the role the model played,
    the reward it was trained on (summed over the turns), its KL to the reference (summed over an
    episode's responses, mean over every process's episodes), ``task - eta * KL``, its KL coefficient,
    role, response tokens (every turn's) and mean value."""
    rows = distributed.gather_rows(
        {"kl": exp.kl.sum(1), "score": exp.scores.sum(1), "tokens": exp.response_mask.sum(1).float()}
    )
    # Tensor sums, so that one process computes exactly what it always did.
    value_sum = distributed.all_sum(exp.old_values.sum())
    token_sum = distributed.all_sum(exp.response_mask.sum())
    kl = float(rows["kl"].mean())
    values = {
        **stats,
        "task_reward": task,
        "env_reward": float(rows["score"].mean()),
        "kl": kl,
        "combined": task - config.eta * kl,
        "kl_coef": kl_coef,
        "role": float(roles.index(role)),
        "response_tokens": float(rows["tokens"].mean()),
        "value": float(value_sum / token_sum.clamp(min=1)),
    }
    return {f"agent_{model}/{k}": v for k, v in values.items()}


def rollout_sampling(config: Config, models: Sequence[str], length: int) -> dict[str, Any]:
    """The sampling keywords of a PPO batch of response length ``length`` (per model in a team)."""
    kwargs = config.sampling_kwargs(models, max_new_tokens=length, repetition_penalty=config.repetition_penalty)
    kwargs.pop("logprob_temperature")  # PPO rescores every response (baselines/rl/experience.py)
    return kwargs


def train(
    config: Config,
    *,
    models: Sequence[str] | None = None,
    assign: Assignment | None = None,
    reward_wrapper: Callable[[Any], Any] | None = None,
) -> dict[str, Any]:
    """The PPO loop shared by PPO and CORY. ``models`` names the adapters (default: the env's agents);
    ``assign(iteration)`` says which model plays which role (default: each agent plays itself). Each
    model keeps its own adapter, value head, optimizer and KL controller whichever role it plays, and
    each role's env speaks the tokenizer of the model playing it (:class:`baselines.infra.play.RoleEnvs`): the
    models may have different tokenizers. ``--critic central``'s critic (on the first model's base) reads a
    model of another tokenizer as its text re-encoded, each of its response tokens valued at the aligned
    position (:func:`baselines.rl.critic.central_view`).

    Under torchrun or accelerate launch (``WORLD_SIZE`` > 1) every process plays its contiguous share
    of each iteration's episodes, each episode sampled under its own seed; advantages are whitened
    over the whole batch, minibatches are the same global rows on every rank, gradients are summed
    over ranks and the KL controllers see the global mean KL (baselines/infra/distributed.py). Only rank 0
    evaluates, logs, plots and writes checkpoints, so ``eval*`` and ``plot`` are in its result only."""
    from agents import LoraSettings, MultiAgentPolicy

    run = Run.begin(config)  # threads, processes, run directory, seeds
    per_episode = run.info.distributed if config.seed_per_episode is None else config.seed_per_episode
    positions = distributed.shard(range(config.batch_size))  # this rank's episodes of each batch
    env_kwargs = config.build_env_kwargs()
    roles, _ = probe_env(config.env, max_new_tokens=config.max_new_tokens, **env_kwargs)
    models = list(roles if models is None else models)
    assign = assign or (lambda _iteration: {r: r for r in roles})
    critic = [CRITIC] if config.critic == "central" else []  # the central critic: one more adapter
    if critic and (CRITIC in models or CRITIC in roles):
        raise ValueError(f"--critic central names its adapter {CRITIC!r}, which is also a model of {config.env!r}")
    config.check_agents(models)
    # --critic central: the critic sits on --critic-model, by default the first model's base.
    team_models = config.model_of(models)
    if critic:
        team_models = with_critic(team_models, models, config.critic_model)
    lora = config.lora_of(models)
    if isinstance(lora, dict) and critic:
        lora[CRITIC] = LoraSettings(rank=config.lora_rank, alpha=config.lora_alpha)
    policy = MultiAgentPolicy.from_pretrained(
        [*models, *critic],
        team_models,
        dtype=config.dtype,
        device=placement.device_for("data-parallel", models, run.info, config.device)[models[0]],
        lora=lora,
        value_head=True,
        mixed_batches=False,  # the generate backend only: PEFT's mixed batches measured slower on CPU
        backend=config.backend,
        gradient_checkpointing=config.gradient_checkpointing,
        activation_budget_mb=config.activation_budget_mb,
        share_prompts=config.share_prompts,
    )
    # --critic central: the critic reads each model of another tokenizer than its own as text (CriticReader).
    read = CriticReader(policy, models) if critic else None
    # Each role's env speaks the tokenizer of the model playing it and ends a response at that model's
    # EOS ids, exactly where generation stopped. CORY's models swap roles, and with them the tokenizers
    # the roles' envs speak: one vector env per assignment (one in all when the models share a tokenizer).
    envs = RoleEnvs(config.env, len(positions), policy, env_kwargs, max_new_tokens=config.max_new_tokens)
    n_train = len(envs.vector(assign(0)).envs[0].task.problems("train"))
    optimizers = {m: policy.optimizer(m, lr=config.learning_rate_of(m if m != CRITIC else None))
                  for m in [*models, *critic]}
    controllers = {m: kl_controller(config) for m in models}
    for m, value in run.resume(policy, optimizers).get("kl_coef", {}).items():
        controllers[m].value = float(value)
    run.start(policy, optimizers, env_kwargs=envs.kwargs, adapters=assign, weights="adapter and value-head weights",
              extra_state=lambda: {"kl_coef": {m: c.value for m, c in controllers.items()}})

    metrics: dict[str, float] = {}
    with run.interruptible():
        run.evaluate_before()
        for iteration in run.iterations():
            t0 = time.perf_counter()
            players = assign(iteration)  # role -> model
            venv = envs.vector(players)
            if reward_wrapper is not None:  # MARLHF: the training envs' rewards are a learned model's
                venv = reward_wrapper(venv)
            # 1. Rollout: one response length for the whole batch; roles act as the env's protocol says.
            problems = run.draw_problems(n_train, config.batch_size)
            length = int(run.rng.integers(config.min_new_tokens, config.max_new_tokens + 1))
            sample_seeds = [distributed.group_seed(config.seed, iteration, 0, b) for b in positions]
            seeds = [config.seed * 1_000_003 + iteration * config.batch_size + i for i in positions]
            options = [{"task_index": int(problems[i]), "split": "train"} for i in positions]
            step_rewards: list[dict[str, np.ndarray]] = []
            steps, returns, infos = play.play_episodes(
                policy,
                venv,
                seeds=seeds,
                options=options,
                action_length=config.max_new_tokens,
                adapters=players,
                sample_seeds=sample_seeds if per_episode else None,
                step_rewards=step_rewards,
                **rollout_sampling(config, models, length),
            )
            t_rollout = time.perf_counter() - t0
            turns = play.episode_turns(steps, step_rewards)  # role -> [(its Generation, its reward (N,))]

            metrics = {}
            recoded = read.seconds if read is not None else 0.0
            for role, model in players.items():
                # 2. Per-token rewards (KL penalty, each turn's reward on its last token), values, GAE.
                scores = torch.as_tensor(np.stack([reward for _, reward in turns[role]], 1), dtype=torch.float32)
                gens = [gen for gen, _ in turns[role]]
                contexts = [  # --critic central: every role's prompt and response of each turn
                    central_view({r: turns[r][k][0] for r in roles}, roles, role, players, read)
                    for k in range(len(gens))
                ] if read is not None else None
                if contexts is not None:
                    width = max(c.width(int(g.response_ids.shape[1])) for c, g in zip(contexts, gens))
                    check_positions(policy, width, f"up to {width} tokens (every role's prompt and response, "
                                    f"in its own tokens) to value {role!r}'s response")
                penalty = controllers[model].value if config.kl_in == "reward" else 0.0  # loss: in ppo_update
                exp = make_experience(policy, model, gens, scores, penalty, config, contexts)
                # 3. PPO epochs over shuffled minibatches; 4. the KL coefficient adapts.
                stats = ppo_update(policy, optimizers[model], model, exp, config, optimizers.get(CRITIC))
                task = float(np.mean(distributed.gather_rows(role_scores(returns, infos, role))))
                metrics.update(model_metrics(model, role, exp, stats, task, controllers[model].value, roles, config))
                controllers[model].update(metrics[f"agent_{model}/kl"], config.batch_size)

            # 5. Log.
            step = iteration + 1
            metrics.update(reward_metrics(distributed.gather_rows(dict(infos[roles[0]]))))
            metrics.update(mean_over_agents(metrics, ("policy_loss", "value_loss", "kl", "kl_loss", "clip_fraction"),
                                            models))
            elapsed = time.perf_counter() - t0
            metrics.update({
                "charts/iteration": step,
                "charts/episodes": step * config.batch_size,
                "charts/response_length": length,
                "charts/s_per_iteration": elapsed,
                "charts/rollout_fraction": t_rollout / elapsed,
                "charts/learning_rate": config.learning_rate,
            })
            if read is not None and read.foreign:  # the critic reads some models as text, re-encoded in its tokens
                metrics["charts/critic_reencode_fraction"] = (read.seconds - recoded) / elapsed
            run.write_samples(step, venv.envs, seeds, options, models=players)
            run.end_iteration(step, metrics, reward=f"{metrics['reward/total']:.3f}",
                              kl=f"{metrics['losses/kl']:.2f}", s_it=f"{elapsed:.1f}")
        run.evaluate_after()
    result = run.finish(metrics)
    envs.close()
    return result


def main(config: Config, *, reward_wrapper: Callable[[Any], Any] | None = None) -> dict[str, Any]:
    """Train independent PPO agents (each env agent has its own adapter, value head and optimizer).
    ``reward_wrapper(venv)``: the training envs as the learner sees them (MARLHF's learned reward; the
    evaluations keep the task's)."""
    return train(config, reward_wrapper=reward_wrapper)


def summary(result: Mapping[str, Any]) -> str:
    """Closing lines of a run: eval before/after, per-model task reward and KL, where the plot is."""
    from baselines.infra.evaluation import eval_table

    lines = eval_table(result)
    for key in sorted(k for k in result if k.endswith("/task_reward")):
        model = key[len("agent_") : -len("/task_reward")]
        lines.append(f"{model}: task reward {result[key]:.3f}, KL {result[f'agent_{model}/kl']:.3f}")
    if "plot" in result:
        lines.append(f"plot: {result['plot']}")
    lines.append(f"run:  {result.get('run_dir')}")
    return "\n".join(lines)


if __name__ == "__main__":
    # `python -m baselines.learners.ppo` (or `torchrun -m ...`) is `llm-envs train ppo`: the same flags and
    # presets, one-line errors, and the run's report.html at the end.
    import sys

    from baselines.infra.cli import main as cli

    raise SystemExit(cli(["train", "ppo", *sys.argv[1:]]))
