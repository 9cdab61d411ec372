"""The settings the learners share, each defined once with one docstring: the ``--flags`` of
``llm-envs train {magrpo,ppo,cory,maac}`` that mean the same thing everywhere.

A learner's ``Config`` subclasses one of the two classes below and adds its own fields. Where its
default differs (the env, sampling, the learning rate) it re-declares the field with its default and
no docstring: tyro keeps the ``--help`` text written here and renders everything as flat ``--flags``.

=================  ===========================================================================
``CoreConfig``     env and data, turns and transitions, sampling, LoRA and optimiser basics, the
                   evaluation size, the run directory and the hardware: every learner (MAAC too)
``LearnerConfig``  ``CoreConfig`` and evaluation during training, transcripts, checkpoints,
                   ``--resume`` and W&B: the learners run by :mod:`baselines.infra.run` (MAGRPO, PPO, CORY)
=================  ===========================================================================

It also names the central critic's adapter (``CRITIC``) and the base it sits on (``with_critic``), which
the learners and ``llm-envs eval`` both read.

>>> from baselines.learners.magrpo import Config
>>> Config(temperature=0).temperature
Traceback (most recent call last):
...
ValueError: temperature must be > 0, got 0
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal


def preset(config_class: Any, presets: Mapping[str, Mapping[str, Any]], name: str,
           overrides: Mapping[str, Any] | None = None) -> Any:
    """``config_class`` with the settings of ``presets[name]`` and ``overrides`` on top (``--preset``)."""
    if name not in presets:
        raise ValueError(f"unknown preset {name!r}; choose one of {sorted(presets)}")
    return dataclasses.replace(config_class(), **{**presets[name], **(overrides or {})})


def check_ints(config: Any, minimum: dict[str, int]) -> None:
    """Raise ``ValueError`` quoting the first field of ``minimum`` that is not an int >= its minimum."""
    for name, low in minimum.items():
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")


def check_ranges(config: Any, ranges: dict[str, tuple[bool, str]]) -> None:
    """``ranges``: field -> (whether its value is allowed, what is allowed). Raise ``ValueError`` quoting
    the first field whose value is not allowed or not finite."""
    for name, (ok, wanted) in ranges.items():
        value = getattr(config, name)
        if not ok or not math.isfinite(value):
            raise ValueError(f"{name} must be {wanted}, got {value!r}")


def check_choice(config: Any, name: str, choices: tuple[str, ...]) -> None:
    """Raise ``ValueError`` quoting ``name``'s value unless it is one of ``choices``."""
    value = getattr(config, name)
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}"
        raise ValueError(f"{name} must be {listed}, got {value!r}")


CENTRALIZED_LEARNERS = ("magrpo", "ppo", "madpo", "marlhf")
"""The learners that train a centralised env (``--centralized``): one model, one agent."""


def check_centralized(config: Any) -> None:
    """Refuse ``--centralized`` for a learner not in :data:`CENTRALIZED_LEARNERS`, or with a sequential env id."""
    if not isinstance(config.centralized, bool):
        raise ValueError(f"centralized must be True or False, got {config.centralized!r}")
    if not isinstance(config.prefill, bool):
        raise ValueError(f"prefill must be True or False, got {config.prefill!r}")
    if config.prefill and not config.centralized:
        raise ValueError("--prefill writes the first role's opening tag of a centralised response: it needs "
                         "--centralized")
    if not config.centralized:
        return
    if config.learner not in CENTRALIZED_LEARNERS:
        raise ValueError(
            f"--centralized trains one model on a parallel env with {' or '.join(CENTRALIZED_LEARNERS)}, not "
            f"{config.learner} (its agents are separate models by design)"
        )
    from llm_envs.core.registry import spec

    try:
        protocol = spec(config.env).protocol
    except KeyError:
        return  # an unknown id is reported when the env is built
    if protocol != "parallel":
        raise ValueError(
            f"--centralized needs a parallel env, and {config.env!r} is {protocol} (later roles read earlier roles' "
            "responses of the same turn); use a parallel id (llm-envs list)"
        )


AGENT_FIELDS = ("temperature", "top_p", "top_k", "max_new_tokens", "stop", "learning_rate", "lora_rank", "lora_alpha")
"""The fields ``--agent-settings agent.field=value`` may set."""


def parse_agent_models(entries: Any) -> dict[str, str]:
    """``("brief=PATH", ...)`` (or a dict) -> ``{"brief": "PATH"}``, with a one-line error for a bad entry.

    >>> parse_agent_models(("brief=/m/a", "detailed=org/b"))
    {'brief': '/m/a', 'detailed': 'org/b'}
    """
    if isinstance(entries, Mapping):
        return {str(k): str(v) for k, v in entries.items()}
    out: dict[str, str] = {}
    for entry in entries:
        agent, eq, model = str(entry).partition("=")
        if not eq or not agent or not model:
            raise ValueError(f"agent_models entries are agent=MODEL, got {entry!r}")
        if agent in out:
            raise ValueError(f"agent_models names agent {agent!r} twice")
        out[agent] = model
    return out


CRITIC = "critic"
"""The critic's adapter name in the policy (an env agent or a model may not use it)."""


def with_critic(
    models: str | Mapping[str, str | None] | None, agents: Sequence[str], critic_model: str | None = None
) -> str | dict[str, str | None] | None:
    """The models of a policy with a central critic: ``models`` (one model for every agent, or agent ->
    model in a team) plus the critic's, ``critic_model`` or by default the first agent's base. One
    model stays one when the critic shares it.

    >>> with_critic("m", ["a", "b"]), with_critic({"a": "m", "b": "n"}, ["a", "b"])
    ('m', {'a': 'm', 'b': 'n', 'critic': 'm'})
    >>> with_critic(None, ["a", "b"], "c")
    {'a': None, 'b': None, 'critic': 'c'}
    """
    first = models[agents[0]] if isinstance(models, Mapping) else models
    critic = first if critic_model is None else critic_model
    if not isinstance(models, Mapping) and critic == models:
        return models
    out = dict(models) if isinstance(models, Mapping) else dict.fromkeys(agents, models)
    out[CRITIC] = critic
    return out


def parse_agent_settings(entries: Any) -> dict[str, dict[str, Any]]:
    """``("brief.temperature=1.0", ...)`` (or a nested dict) -> ``{"brief": {"temperature": 1.0}}``; bad
    fields get a one-line error listing the valid ones.

    >>> parse_agent_settings(("brief.temperature=1.0", "detailed.stop=END", "detailed.lora_rank=8"))
    {'brief': {'temperature': 1.0}, 'detailed': {'stop': ('END',), 'lora_rank': 8}}
    """
    pairs: list[tuple[str, str, Any]] = []
    if isinstance(entries, Mapping):
        for agent, fields in entries.items():
            if not isinstance(fields, Mapping):
                raise ValueError(f"agent_settings[{agent!r}] must be a mapping field -> value, got {fields!r}")
            pairs += [(str(agent), str(k), v) for k, v in fields.items()]
    else:
        for entry in entries:
            key, eq, value = str(entry).partition("=")
            agent, dot, name = key.partition(".")
            if not eq or not dot or not agent or not name:
                raise ValueError(f"agent_settings entries are agent.field=value, got {entry!r}")
            pairs.append((agent, name, value))
    out: dict[str, dict[str, Any]] = {}
    for agent, name, value in pairs:
        if name not in AGENT_FIELDS:
            raise ValueError(f"agent_settings: unknown field {name!r} (agent {agent!r}); valid fields: "
                             f"{', '.join(AGENT_FIELDS)}")
        if name == "stop":
            stops = (value,) if isinstance(value, str) else tuple(value)
            out.setdefault(agent, {}).setdefault("stop", ())
            out[agent]["stop"] += stops
            continue
        kind = int if name in ("top_k", "max_new_tokens", "lora_rank") else float
        try:
            converted = kind(value) if not isinstance(value, bool) else value
        except (TypeError, ValueError):
            raise ValueError(f"agent_settings: {agent}.{name} must be a{'n int' if kind is int else ' number'}, "
                             f"got {value!r}") from None
        out.setdefault(agent, {})[name] = converted
    return out


def check_agent_value(agent: str, name: str, value: Any, max_new_tokens: int) -> None:
    """One-line errors for an out-of-range per-agent value."""
    ok = {
        "temperature": lambda v: v > 0, "top_p": lambda v: 0 < v <= 1, "top_k": lambda v: v >= 0,
        "max_new_tokens": lambda v: 1 <= v <= max_new_tokens, "learning_rate": lambda v: v > 0,
        "lora_rank": lambda v: v >= 1, "lora_alpha": lambda v: v > 0,
        "stop": lambda v: all(isinstance(s, str) and s for s in v),
    }[name]
    wanted = {"top_p": "in (0, 1]", "top_k": ">= 0", "max_new_tokens": f"in [1, max_new_tokens={max_new_tokens}]",
              "lora_rank": ">= 1", "stop": "non-empty strings"}.get(name, "> 0")
    if isinstance(value, bool) or not ok(value) or (name != "stop" and not math.isfinite(value)):
        raise ValueError(f"agent_settings: {agent}.{name} must be {wanted}, got {value!r}")


@dataclass
class CoreConfig:
    """The fields every learner shares. Subclasses set ``learner`` (the run directory's prefix and the
    checkpoint's learner name)."""

    learner: ClassVar[str] = ""

    # ---------------------------------------------------------------------------------- env
    env: str = "writing/xsum-v0"
    """Registered env id (``llm-envs list``): MAGRPO and MAAC take parallel ids, PPO either protocol,
    CORY a sequential two-role id (pioneer -> observer)."""
    model: str | None = None
    """HF model id or local directory; unset for the embedded SmolLM2-135M-Instruct."""
    data_path: str | None = None
    """Local copy of a hub dataset for envs that take ``data_path``."""
    max_source_words: int | None = None
    """Writing envs: cut source documents to this many words (shorter prompts, faster on CPU)."""
    num_turns: int = 1
    """Turns per episode (on the envs that allow several); after each turn the task's feedback (or
    --transition) goes into the next prompts."""
    transition: str | None = None
    """What agents see on later turns (an env argument, llm_envs/transitions.py): unset for the task's
    feedback; level-feedback, plain (self-revision), module:function, or expert (a second model,
    --expert-model, writes edit suggestions into the next prompts; its cost is logged)."""
    centralized: bool = False
    """One model writes every role of a parallel env in one response, as tagged sections
    (``<brief>...</brief>``; llm_envs.core.centralized, docs/centralized.md): the env's one agent is
    ``central`` and --max-new-tokens is its whole response (N x the team's for the same budget). MAGRPO
    and PPO only."""
    prefill: bool = False
    """With --centralized: the env writes the first role's opening tag (``<brief>``) at the start of every
    response and the model continues it (docs/centralized.md "Prefill"); off: the reference's format."""
    expert_model: str | None = None
    """Model of --transition expert: HF id or local directory; unset for the embedded SmolLM2-135M-Instruct."""
    expert_max_new_tokens: int = 64
    """Longest suggestion of the --transition expert model."""
    seed: int = 0
    """Seeds python, numpy, torch and the envs."""
    num_iterations: int = 100
    """Training iterations (one batch of episodes and one update of every agent each)."""

    agent_models: tuple[str, ...] = ()
    """A team of bases: ``agent=MODEL`` entries (HF id or local directory) giving named agents their own
    base model and tokenizer; agents not named use --model (docs/teams.md). CORY names its models
    ``model_0``/``model_1``. In Python also a dict ``{agent: model}``."""
    agent_settings: tuple[str, ...] = ()
    """Per-agent overrides, ``agent.field=value`` entries: sampling (temperature, top_p, top_k,
    max_new_tokens, stop) and optimisation (learning_rate, lora_rank, lora_alpha); ``stop`` may repeat.
    In Python also a dict ``{agent: {field: value}}``."""

    # ---------------------------------------------------------------------------------- sampling
    max_new_tokens: int = 64
    """Longest response of an agent, in tokens (the env's action length)."""
    temperature: float = 0.7
    """Sampling temperature."""
    top_p: float = 0.9
    """Nucleus sampling mass."""
    top_k: int = 50
    """Top-k sampling; 0 disables it."""
    logprob_temperature: Literal["raw", "sampling"] = "raw"
    """Temperature of the log-probs the loss uses: ``raw`` (1: the untempered policy, as the reference
    trainers score) or ``sampling`` (the sampling ``temperature``: the tempered distribution, as TRL's
    GRPO scores); the same at generation, in the update and for the reference (docs/magrpo.md)."""

    # ---------------------------------------------------------------------------------- optimisation
    learning_rate: float = 5e-5
    """AdamW learning rate of every agent's adapter (PPO and CORY: and its value head)."""
    lora_rank: int = 16
    """LoRA rank of every adapter."""
    lora_alpha: float = 32.0
    """LoRA alpha (the update is scaled by alpha / rank)."""
    clip_eps: float = 0.2
    """Clip range of the ratio pi / pi_old in the clipped surrogate (MAGRPO and MAAC: epochs after the
    first; PPO: every minibatch)."""
    gamma: float = 0.9
    """Discount: of later turns' rewards in MAGRPO's and MAAC's returns; per response token in PPO's GAE
    (across the turns of a multi-turn episode)."""
    max_grad_norm: float = 1.0
    """Clip each agent's gradient norm; 0 disables clipping."""
    kl_in: Literal["reward", "loss"] = "reward"
    """Where the KL to the reference (the base model with adapters disabled) enters, weighted by
    --kl-coef (PPO, CORY: --init-kl-coef): ``reward``, a penalty on each response's reward before returns
    and advantages (MAGRPO, MAAC: the k3 estimate ``exp(d) - d - 1``, ``d = log ref - log pi``, summed
    over the response's tokens; PPO, CORY: ``-coef * (log pi - log ref)`` on every token, the adaptive
    controller's); or ``loss``, a per-token k3 term of the loss. Defaults: MAGRPO ``loss``, the others
    ``reward`` (the reference code's choice for every learner, with coefficient 0.1)."""

    # ---------------------------------------------------------------------------------- evaluation
    num_eval_problems: int = 8
    """Eval-split problems per evaluation (0 disables evaluation)."""
    num_validation_problems: int = 0
    """Hold out the last N problems of the train split: training never draws them, and the run scores
    the trained policy on them at the end (``val/*``, with the evaluation's sampling and seed), the split
    to choose settings (a learning rate) on without looking at the eval split. 0: none held out."""

    # ---------------------------------------------------------------------------------- run
    output_dir: str = "runs"
    """Where run directories go."""
    run_name: str | None = None
    """Run directory name; default ``<learner>__<env>__s<seed>``."""
    overwrite: bool = False
    """Start afresh in a run directory that already holds checkpoints (deletes them)."""
    tensorboard: bool = True
    """Also write TensorBoard event files (``<run>/tb``)."""
    progress: bool = True
    """Show a progress bar with the live reward."""

    # ---------------------------------------------------------------------------------- hardware
    device: str | None = None
    """torch device; unset picks a GPU when present."""
    dtype: str | None = None
    """Base model dtype: unset = bfloat16 on a GPU or on a CPU with native bf16 (avx512_bf16 / AMX), else
    float32 (``agents.models.resolve_dtype``); adapters, value heads and optimizer states stay float32."""
    backend: Literal["auto", "engine", "generate"] = "auto"
    """Generation backend: ``auto`` (the rollout engine, agents/engine.py, when it supports the model,
    else transformers' ``generate``), ``engine`` or ``generate``; see docs/agents.md."""
    threads: int | None = None
    """torch CPU threads (unset: torch's default)."""
    gradient_checkpointing: bool = True
    """Recompute in the backward the decoder layers whose activations do not fit in
    --activation-budget-mb, instead of keeping them (the fused forward, agents/decoder.py).
    ``--no-gradient-checkpointing`` keeps every layer's activations, whatever the budget (docs/agents.md)."""
    activation_budget_mb: float | Literal["auto"] = "auto"
    """With gradient checkpointing, the megabytes of activations one gradient pass may keep: the decoder
    layers whose activations fit keep them (~40 KB a token a layer for SmolLM2-135M in bf16), only the
    rest are recomputed in the backward (one more forward of each). ``auto``: a quarter of the free
    memory of the pass's device, read at each gradient pass (CUDA's free memory; on the CPU the host's
    available memory, within a container's limit): an update that fits recomputes nothing, one that
    does not recomputes what it must. 0: every layer is recomputed (the least memory)."""
    share_prompts: bool = True
    """Compute a prompt that several rows of a pass repeat (MAGRPO's G samples of a problem) once in the
    fused forward's scoring and training passes (docs/agents.md). ``--no-share-prompts`` computes every
    row whole: the same update up to rounding, with rounding that does not depend on how rows are batched
    (runs on 1 and on N processes then agree to float32 rounding; with shared prompts they agree to it
    only until a rounding difference changes a sampled token)."""
    compile_update: Literal["auto", "on", "off"] = "auto"
    """Run the policy-gradient update's micro-batches (MAGRPO, MAAC's actors, MARLHF's RL stage) through one
    ``torch.compile`` graph, forward and backward (baselines/rl/compiled_update.py): ``auto`` for an agent
    on a CUDA device scored by the fused decoder, ``on`` everywhere, ``off`` never (the CPU default: eager).
    Rows and widths are padded to coarse buckets, so a run compiles a few graphs, each at its shape's first
    call (``charts/update_compile_s``); a graph break or too many recompiles is an error."""
    compile_backend: str = "inductor"
    """The ``torch.compile`` backend of --compile-update (``inductor``: generated kernels; ``aot_eager``:
    forward and backward traced through AOTAutograd and run by the eager kernels, for tests)."""

    def __post_init__(self) -> None:
        check_ints(self, {"num_turns": 1, "num_iterations": 1, "max_new_tokens": 1, "lora_rank": 1,
                          "expert_max_new_tokens": 1, "top_k": 0, "num_eval_problems": 0,
                          "num_validation_problems": 0})
        check_ranges(self, {
            "temperature": (self.temperature > 0, "> 0"),
            "top_p": (0 < self.top_p <= 1, "in (0, 1]"),
            "learning_rate": (self.learning_rate > 0, "> 0"),
            "lora_alpha": (self.lora_alpha > 0, "> 0"),
            "clip_eps": (0 < self.clip_eps < 1, "in (0, 1)"),
            "gamma": (0 <= self.gamma <= 1, "in [0, 1]"),
            "max_grad_norm": (self.max_grad_norm >= 0, ">= 0"),
        })
        budget = self.activation_budget_mb
        if isinstance(budget, (str, bool)) or not isinstance(budget, (int, float)):
            if budget != "auto":
                raise ValueError(f"activation_budget_mb must be 'auto' or a number >= 0, got {budget!r}")
        else:
            check_ranges(self, {"activation_budget_mb": (0 <= budget < float("inf"), ">= 0 and finite")})
        check_choice(self, "logprob_temperature", ("raw", "sampling"))
        check_choice(self, "backend", ("auto", "engine", "generate"))
        check_choice(self, "compile_update", ("auto", "on", "off"))
        if not isinstance(self.compile_backend, str) or not self.compile_backend:
            raise ValueError(f"compile_backend must name a torch.compile backend, got {self.compile_backend!r}")
        check_centralized(self)
        check_choice(self, "kl_in", ("reward", "loss"))
        if self.max_source_words is not None and (
            isinstance(self.max_source_words, bool) or not isinstance(self.max_source_words, int)
            or self.max_source_words < 1
        ):
            raise ValueError(f"max_source_words must be a positive int or None, got {self.max_source_words!r}")
        if self.threads is not None and (isinstance(self.threads, bool) or self.threads < 1):
            raise ValueError(f"threads must be a positive int or None, got {self.threads!r}")
        self._models_of = parse_agent_models(self.agent_models)
        self._overrides = parse_agent_settings(self.agent_settings)
        for agent, fields in self._overrides.items():
            for name, value in fields.items():
                check_agent_value(agent, name, value, self.max_new_tokens)

    # ---------------------------------------------------------------------------------- per agent
    def check_agents(self, agents: Sequence[str]) -> None:
        """Refuse --agent-models / --agent-settings entries for agents the run does not have."""
        for what, named in (("agent_models", self._models_of), ("agent_settings", self._overrides)):
            unknown = sorted(set(named) - set(agents))
            if unknown:
                raise ValueError(f"{what} names unknown agents {unknown}; valid agents: {', '.join(agents)}")

    def is_team(self) -> bool:
        """Whether any agent has its own model or settings."""
        return bool(self._models_of or self._overrides)

    def setting(self, agent: str | None, name: str) -> Any:
        """``agent``'s value of field ``name``: its override, else the run's."""
        if agent is not None and name in self._overrides.get(agent, {}):
            return self._overrides[agent][name]
        return () if name == "stop" else getattr(self, name)

    def model_of(self, agents: Sequence[str]) -> str | dict[str, str | None] | None:
        """--model, or agent -> model when agents have their own (a team of bases)."""
        if not self._models_of:
            return self.model
        return {a: self._models_of.get(a, self.model) for a in agents}

    def lora_of(self, agents: Sequence[str]) -> Any:
        """One ``LoraSettings`` for every agent, or agent -> its own when ranks or alphas differ."""
        from agents import LoraSettings

        own = {a: LoraSettings(rank=self.setting(a, "lora_rank"), alpha=self.setting(a, "lora_alpha")) for a in agents}
        shared = LoraSettings(rank=self.lora_rank, alpha=self.lora_alpha)
        return shared if all(v == shared for v in own.values()) else own

    def learning_rate_of(self, agent: str) -> float:
        return float(self.setting(agent, "learning_rate"))

    def scoring_temperature(self, agent: str | None = None) -> float:
        """The temperature of the log-probs in the loss (1.0 for ``logprob_temperature="raw"``); an
        agent's own sampling temperature with ``sampling``."""
        return float(self.setting(agent, "temperature")) if self.logprob_temperature == "sampling" else 1.0

    def sampling_kwargs(self, agents: Sequence[str], **extra: Any) -> dict[str, Any]:
        """``generate_joint`` keywords for ``agents``: the run's sampling settings, and, when any agent
        has its own, ``sampling`` (agent -> ``agents.Sampling``) and per-agent ``logprob_temperature``.
        ``extra`` (``repetition_penalty``, a batch's ``max_new_tokens``) applies to every agent."""
        kwargs: dict[str, Any] = dict(
            max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            logprob_temperature=self.scoring_temperature(),
        )
        kwargs.update(extra)
        if not self._overrides:
            return kwargs
        from agents import Sampling

        limit = kwargs["max_new_tokens"]
        sampling = {}
        for a in agents:
            own = self._overrides.get(a, {})
            sampling[a] = Sampling(
                max_new_tokens=min(int(own.get("max_new_tokens", limit)), limit),
                temperature=own.get("temperature", kwargs["temperature"]), top_p=own.get("top_p", kwargs["top_p"]),
                top_k=own.get("top_k", kwargs["top_k"]), repetition_penalty=kwargs.get("repetition_penalty", 1.0),
                stop=tuple(own.get("stop", ())),
            )
        kwargs["sampling"] = sampling
        kwargs["logprob_temperature"] = {a: self.scoring_temperature(a) for a in agents}
        return kwargs

    def env_kwargs(self) -> dict[str, Any]:
        """The env arguments these settings imply (without the expert model: see :meth:`build_env_kwargs`)."""
        kwargs: dict[str, Any] = {"num_turns": self.num_turns}
        if self.model is not None:
            kwargs["tokenizer"] = self.model  # the env must speak the model's token ids
        if self.max_source_words is not None:
            kwargs["max_source_words"] = self.max_source_words
        if self.data_path is not None:
            kwargs["data_path"] = self.data_path
        if self.centralized:
            kwargs["centralized"] = True  # one agent writes every role (llm_envs.core.centralized)
            if self.prefill:
                kwargs["prefill"] = True  # the env writes the first role's opening tag
        if self.transition is not None and self.transition != "expert":
            kwargs["transition"] = self.transition  # the expert is an object: build_env_kwargs adds it
        return kwargs

    def build_env_kwargs(self) -> dict[str, Any]:
        """:meth:`env_kwargs` with the ``--transition expert`` model loaded (agents.ExpertTransition)."""
        kwargs = self.env_kwargs()
        if self.transition == "expert":
            from agents import ExpertTransition

            kwargs["transition"] = ExpertTransition(
                self.expert_model, max_new_tokens=self.expert_max_new_tokens, device=self.device
            )
        return kwargs

    def run_dir(self) -> Path:
        """``output_dir/run_name``, by default ``<learner>__<env>__s<seed>``."""
        name = self.run_name or f"{self.learner}__{self.env.replace('/', '_')}__s{self.seed}"
        return Path(self.output_dir) / name


@dataclass
class LearnerConfig(CoreConfig):
    """``CoreConfig`` and the fields of a run on :class:`baselines.infra.run.Run`: evaluations during
    training, transcripts, periodic checkpoints, ``--resume`` and W&B."""

    resumable_fields: ClassVar[tuple[str, ...]] = (
        "num_iterations", "backend", "resume", "progress", "tensorboard", "wandb_project", "checkpoint_every",
        "eval_every", "samples_every", "device", "threads", "output_dir", "run_name", "compile_update",
        "compile_backend", "gradient_checkpointing", "activation_budget_mb",
    )
    """Fields that may change when a run is resumed (they do not change what is computed)."""

    eval_every: int = 0
    """Evaluate every this many iterations (0: only before and after training)."""
    eval_greedy: bool = True
    """Greedy decoding at evaluation (else each agent's training sampling settings); either way each agent
    keeps its own max new tokens and stop strings."""
    samples_every: int = 10
    """Write the first few episodes of every this many training batches to ``<run>/samples.jsonl``
    (0: none); every evaluation writes all its episodes there."""
    checkpoint_every: int = 10
    """Save a checkpoint every this many iterations (0: only at the end and on Ctrl-C)."""
    resume: bool = False
    """Continue the run in ``output_dir/run_name`` from its latest checkpoint."""
    wandb_project: str | None = None
    """Log to this Weights & Biases project (needs ``wandb``; imported only when set)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_ints(self, {"eval_every": 0, "samples_every": 0, "checkpoint_every": 0})

    def eval_sampling(self, agents: Sequence[str]) -> dict[str, Any] | None:
        """Each agent's own ``agents.Sampling`` for the evaluations (its max new tokens and stop strings,
        and its temperature/top-p/top-k when the evaluation samples; greedy stays greedy), or ``None``
        when no agent has settings of its own (the run's settings then apply to all)."""
        sampling = self.sampling_kwargs(agents).get("sampling")
        if sampling is None:
            return None
        return {a: dataclasses.replace(s, greedy=True) if self.eval_greedy else s for a, s in sampling.items()}

    def check_processes(self, world_size: int) -> None:
        """Raise ``ValueError`` if these settings cannot run on ``world_size`` processes (data-parallel
        runs under torchrun or accelerate launch); the learners add their own conditions."""
