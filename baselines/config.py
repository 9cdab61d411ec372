"""The settings the learners share, each defined once with one docstring: the ``--flags`` of
``llm-envs train {magrpo,ppo,cory,maac}`` that mean the same thing everywhere.

A learner's ``Config`` subclasses one of the two classes below and adds its own fields. Where its
default differs (the env, sampling, the learning rate) it re-declares the field with its default and
no docstring: tyro keeps the ``--help`` text written here and renders everything as flat ``--flags``.

=================  ===========================================================================
``CoreConfig``     env and data, turns and transitions, sampling, LoRA and optimiser basics, the
                   evaluation size, the run directory and the hardware: every learner (MAAC too)
``LearnerConfig``  ``CoreConfig`` and evaluation during training, transcripts, checkpoints,
                   ``--resume`` and W&B: the learners run by :mod:`baselines.run` (MAGRPO, PPO, CORY)
=================  ===========================================================================

>>> from baselines.magrpo import Config
>>> Config(temperature=0).temperature
Traceback (most recent call last):
...
ValueError: temperature must be > 0, got 0
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal


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
    expert_model: str | None = None
    """Model of --transition expert: HF id or local directory; unset for the embedded SmolLM2-135M-Instruct."""
    expert_max_new_tokens: int = 64
    """Longest suggestion of the --transition expert model."""
    seed: int = 0
    """Seeds python, numpy, torch and the envs."""
    num_iterations: int = 100
    """Training iterations (one batch of episodes and one update of every agent each)."""

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

    # ---------------------------------------------------------------------------------- evaluation
    num_eval_problems: int = 8
    """Eval-split problems per evaluation (0 disables evaluation)."""

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
    """Recompute each decoder layer in the backward instead of keeping its activations (the fused
    forward, agents/decoder.py): ~0.1 instead of ~0.9 MB a token for SmolLM2-135M in bf16, for ~1/3 more
    update time. ``--no-gradient-checkpointing`` trades the memory for speed (docs/agents.md)."""
    activation_budget_mb: float = 0.0
    """With gradient checkpointing, the megabytes of activations one gradient pass may keep: the decoder
    layers whose activations fit keep them (~40 KB a token a layer for SmolLM2-135M in bf16), only the
    rest are recomputed in the backward. 0: every layer is recomputed (the least memory)."""
    share_prompts: bool = True
    """Compute a prompt that several rows of a pass repeat (MAGRPO's G samples of a problem) once in the
    fused forward's scoring and training passes (docs/agents.md). ``--no-share-prompts`` computes every
    row whole: the same update up to rounding, with rounding that does not depend on how rows are batched
    (runs on 1 and on N processes then agree to float32 rounding; with shared prompts they agree to it
    only until a rounding difference changes a sampled token)."""

    def __post_init__(self) -> None:
        check_ints(self, {"num_turns": 1, "num_iterations": 1, "max_new_tokens": 1, "lora_rank": 1,
                          "expert_max_new_tokens": 1, "top_k": 0, "num_eval_problems": 0})
        check_ranges(self, {
            "temperature": (self.temperature > 0, "> 0"),
            "top_p": (0 < self.top_p <= 1, "in (0, 1]"),
            "learning_rate": (self.learning_rate > 0, "> 0"),
            "lora_alpha": (self.lora_alpha > 0, "> 0"),
            "clip_eps": (0 < self.clip_eps < 1, "in (0, 1)"),
            "gamma": (0 <= self.gamma <= 1, "in [0, 1]"),
            "max_grad_norm": (self.max_grad_norm >= 0, ">= 0"),
            "activation_budget_mb": (0 <= self.activation_budget_mb < float("inf"), ">= 0 and finite"),
        })
        check_choice(self, "logprob_temperature", ("raw", "sampling"))
        check_choice(self, "backend", ("auto", "engine", "generate"))
        if self.max_source_words is not None and (
            isinstance(self.max_source_words, bool) or not isinstance(self.max_source_words, int)
            or self.max_source_words < 1
        ):
            raise ValueError(f"max_source_words must be a positive int or None, got {self.max_source_words!r}")
        if self.threads is not None and (isinstance(self.threads, bool) or self.threads < 1):
            raise ValueError(f"threads must be a positive int or None, got {self.threads!r}")

    def scoring_temperature(self) -> float:
        """The temperature of the log-probs in the loss (1.0 for ``logprob_temperature="raw"``)."""
        return self.temperature if self.logprob_temperature == "sampling" else 1.0

    def env_kwargs(self) -> dict[str, Any]:
        """The env arguments these settings imply (without the expert model: see :meth:`build_env_kwargs`)."""
        kwargs: dict[str, Any] = {"num_turns": self.num_turns}
        if self.model is not None:
            kwargs["tokenizer"] = self.model  # the env must speak the model's token ids
        if self.max_source_words is not None:
            kwargs["max_source_words"] = self.max_source_words
        if self.data_path is not None:
            kwargs["data_path"] = self.data_path
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
    """``CoreConfig`` and the fields of a run on :class:`baselines.run.Run`: evaluations during
    training, transcripts, periodic checkpoints, ``--resume`` and W&B."""

    resumable_fields: ClassVar[tuple[str, ...]] = (
        "num_iterations", "backend", "resume", "progress", "tensorboard", "wandb_project", "checkpoint_every",
        "eval_every", "samples_every", "device", "threads", "output_dir", "run_name",
    )
    """Fields that may change when a run is resumed (they do not change what is computed)."""

    eval_every: int = 0
    """Evaluate every this many iterations (0: only before and after training)."""
    eval_greedy: bool = True
    """Greedy decoding at evaluation (else the training sampling settings)."""
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

    def check_processes(self, world_size: int) -> None:
        """Raise ``ValueError`` if these settings cannot run on ``world_size`` processes (data-parallel
        runs under torchrun or accelerate launch); the learners add their own conditions."""
