"""A multi-agent LLM policy: one frozen base model, one LoRA adapter (and optional value head) per agent.

Every env agent (``"helper"``, ``"main"``, ``"pioneer"``, ...) owns a PEFT LoRA adapter named after
it, all on the same frozen base model. The reference policy for KL penalties is that base with the
adapters disabled, so no second model is held in memory. With ``lora=None`` a single agent is fully
fine-tuned instead; then a frozen copy of the initial model serves as the reference.

=================  ============================================================================
Method             What it gives (B rows, P prompt columns, T response columns)
=================  ============================================================================
``generate``       ``Generation``: prompts repeated ``num_samples`` times, response ids (pad id
                   after EOS), response masks (1 up to and including EOS) and log-probs, (B*G, T)
``generate_joint`` the same for several agents in one call, their rows batched together
``logprobs``       (B, T) log-probs of given responses under one agent, one forward, grad on
``ref_logprobs``   (B, T) the same with the adapters disabled (no grad)
``values``         (B, T) value head outputs (grad on); ``forward`` gives log-probs and values
                   from one pass
``act``            env observations -> env actions: ``env.step(policy.act(obs))`` (response or token
                   mode, Dict or flat observations)
``parameters``     one agent's trainable parameters, for one optimizer per agent
``save``/``load``  adapters and value heads per agent, checked against the policy on load
=================  ============================================================================

**Log-probs are of the raw policy.** ``generate`` records ``log softmax(logits)`` of each sampled token
before temperature, top-k or top-p act on the logits (a logits processor placed ahead of the warpers
reads them), so they are ``log pi(a | s)`` of the untempered policy, the quantity ``logprobs``
recomputes and the learners' importance ratios and KL terms use. They are *not* the log-probs of the
warped sampling distribution when temperature != 1 or top-p/top-k cut the vocabulary. A repetition
penalty is applied after the recorder too, so it changes what is sampled, never the recorded values.
Every distribution (sampled, greedy, recorded, scored) is over the tokenizer's ids only: an LM head
with more rows than the tokenizer has tokens (Qwen2.5: 151936 rows, 151665 tokens) has those logits
masked to -inf, so such ids are never chosen and the log-probs sum to 1 over real tokens.

**Positions.** Prompts are left-padded (``prompt_mask`` rows are 0s then 1s) and responses right-padded
(``response_mask`` rows are 1s then 0s). Position ids are ``cumsum(mask) - 1`` over prompt and
response, exactly as ``transformers`` generation computes them, so a recomputed log-prob matches the
one recorded while sampling. The pad token of the default tokenizer is its end-of-turn token, which
also occurs inside chat prompts: boundaries always come from the masks, never from searching pad ids.
The log-prob of response token t is read from the logits at position ``P - 1 + t``; the LM head runs on
those T positions only (``logits_to_keep``), the last response token is included and pads give 0.

Values (PPO, CORY) use the same positions: ``values[:, t]`` is the value of the state just before
response token t, read by a per-agent ``Linear(hidden, 1)`` from the base model's last hidden state.

>>> import llm_envs
>>> from agents import MultiAgentPolicy
>>> env = llm_envs.make("coding/humaneval-v0")
>>> policy = MultiAgentPolicy.from_pretrained(env.possible_agents)   # the embedded default, one adapter each
>>> obs, infos = env.reset(seed=0)
>>> obs, rewards, terminations, truncations, infos = env.step(policy.act(obs, max_new_tokens=8))
>>> sorted(rewards), all(terminations.values())
(['helper', 'main'], True)
"""
from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from agents.acting import ActingMixin
from agents.generation import Generation, GenerationMixin
from agents.memory import check_activation_budget, tune_allocator
from agents.persistence import CHECKPOINT_FORMAT, MANIFEST_NAME, PersistenceMixin
from agents.rows import ArrayLike, check_rows
from agents.scoring import ScoringMixin
from agents.settings import DEFAULT_LORA, DEFAULT_SAMPLING, LoraSettings, Sampling, check_agent_names
from agents.team import BaseGroup, is_name, per_agent, resolve_models, team_of
from llm_envs.tokenizers import load_tokenizer

__all__ = [
    "BACKENDS", "CHECKPOINT_FORMAT", "MANIFEST_NAME", "Generation", "LoraSettings", "MultiAgentPolicy", "Sampling",
]

BACKENDS = ("auto", "engine", "generate")


class MultiAgentPolicy(ScoringMixin, GenerationMixin, ActingMixin, PersistenceMixin):
    """One LoRA adapter (and optional value head) per agent on a base causal LM, or a team of bases;
    see the module docs and :mod:`agents.team`.

    Args:
        model: a ``transformers`` causal LM (``agents.models.load_model``), wrapped by PEFT in place; or
            a mapping agent -> model (objects, or names / local paths loaded with ``load_model``): the
            agents that share a model object form a group that decodes together (:mod:`agents.team`).
        tokenizer: the tokenizer whose ids the envs emit (``llm_envs.tokenizers.load_tokenizer``), or a
            mapping agent -> tokenizer (objects or names); used for the pad and EOS ids and to check
            that each agent's tokenizer fits its model.
        agents: env agent names; each names its adapter. No dots (PEFT module keys), no duplicates.
        lora: adapter settings, ``None`` for full fine-tuning of a single agent, or a mapping agent ->
            settings (its own rank and alpha) or ``None`` (that agent alone fully fine-tuned, on a
            trainable copy of its base).
        value_head: add a trainable ``Linear(hidden, 1)`` per agent (PPO, CORY), of its base's width.
        sampling: defaults for :meth:`act`: one :class:`Sampling` or a mapping agent -> Sampling.
        mixed_batches: with the ``generate`` backend, run all agents' rows through one ``generate``
            call (PEFT mixed-adapter batches) instead of one call per agent.
        backend: ``"auto"`` (default): the rollout engine (:mod:`agents.engine`: all agents' rows in
            one decode loop) when it supports the model, else ``transformers``' ``generate`` (per group
            of a team); ``"engine"`` (an error if unsupported) or ``"generate"``. With the engine,
            scoring and training passes also run through its fused forward (:mod:`agents.decoder`; the
            model's own forward through PEFT for LoRA dropout in gradient passes and for full
            fine-tuning); with ``"generate"``, through the model's own forward.
        gradient_checkpointing: in the fused forward's gradient passes, recompute in the backward the
            layers whose activations do not fit in ``activation_budget_mb`` instead of keeping them
            (``False``: every layer keeps its activations, whatever the budget).
        activation_budget_mb: with ``gradient_checkpointing``, the megabytes of activations a gradient
            pass may keep: as many layers as fit keep theirs (estimated by
            :meth:`agents.decoder.FusedDecoder.activation_bytes`), only the rest are recomputed (one
            more forward of those layers). ``"auto"`` (default): read at each gradient pass from the
            free memory of the device it runs on (:func:`agents.memory.auto_activation_budget_mb`: a
            quarter of CUDA's free memory, or of the host's available memory on the CPU), so a small
            model's update with gigabytes free recomputes nothing and a pass that would not fit
            recomputes what it must; 0: every layer is recomputed (the least memory).
        share_prompts: in the fused forward, compute a prompt that several rows of a pass repeat once
            (MAGRPO's G samples of a problem; docs/agents.md). ``False`` computes every row whole: the
            same numbers up to rounding, and the same rounding whatever else is in the pass.
        dtype, device: for models given by name (``load_model``); ``device`` may map agent -> device.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        agents: Sequence[str],
        *,
        lora: LoraSettings | Mapping[str, LoraSettings | None] | None = DEFAULT_LORA,
        value_head: bool = False,
        sampling: Sampling | Mapping[str, Sampling] = DEFAULT_SAMPLING,
        mixed_batches: bool = True,
        backend: str = "auto",
        gradient_checkpointing: bool = True,
        activation_budget_mb: float | str = "auto",
        share_prompts: bool = True,
        dtype: str | torch.dtype | None = None,
        device: str | torch.device | Mapping[str, str | torch.device | None] | None = None,
    ) -> None:
        self.agents: tuple[str, ...] = check_agent_names(agents)
        budget = check_activation_budget(activation_budget_mb)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        loras = per_agent(lora, self.agents, "lora")
        for agent, settings in loras.items():
            if settings is not None and not isinstance(settings, LoraSettings):
                raise TypeError(f"lora of agent {agent!r} must be a LoraSettings or None (full fine-tuning), "
                                f"got {settings!r}")
        if lora is None and len(self.agents) != 1:
            raise ValueError(
                f"full fine-tuning (lora=None) supports exactly one agent, got {list(self.agents)}; "
                "use LoRA adapters to train several agents on one base model, or lora={agent: None, ...} to "
                "fully fine-tune one agent on its own copy of the base"
            )
        samplings = per_agent(sampling, self.agents, "sampling")
        for agent, settings in samplings.items():
            if not isinstance(settings, Sampling):
                raise TypeError(f"sampling of agent {agent!r} must be a Sampling, got {settings!r}")
        self.lora = lora if not isinstance(lora, Mapping) else None
        """The LoRA settings when every agent shares them (``None`` under full fine-tuning or per-agent settings)."""
        self.lora_of: dict[str, LoraSettings | None] = loras
        """agent -> its LoRA settings (``None``: fully fine-tuned)."""
        self.sampling = sampling if isinstance(sampling, Sampling) else samplings[self.agents[0]]
        self.sampling_of: dict[str, Sampling] = samplings
        """agent -> its default sampling settings (:meth:`act`)."""
        self.mixed_batches = bool(mixed_batches)

        devices = per_agent(device, self.agents, "device", kinds=(str, torch.device))
        models = resolve_models(per_agent(model, self.agents, "model"), dtype, devices)
        # Large activations reused, not page-faulted in again, up to a size that a float32 base's working
        # set can afford (agents/memory.py).
        tune_allocator(float32=any(_cpu_float32(m) for m in models.values()))
        tokenizers = per_agent(tokenizer, self.agents, "tokenizer")
        named: dict[str, Any] = {}
        for agent, tok in tokenizers.items():
            if tok is None or is_name(tok):
                key = str(tok)
                if key not in named:
                    named[key] = load_tokenizer(tok)
                tokenizers[agent] = named[key]
        groups = team_of(self.agents, models, {a: loras[a] is not None for a in self.agents})
        users: dict[int, int] = {}
        for agent in self.agents:
            users[id(models[agent])] = users.get(id(models[agent]), 0) + 1
        self.groups: list[BaseGroup] = []
        self._group_of: dict[str, BaseGroup] = {}
        for members in groups:
            first = members[0]
            base = models[first]
            if loras[first] is None and users[id(base)] > 1:
                base = copy.deepcopy(base)  # a fully fine-tuned agent owns its copy of a shared base
            toks = {tokenizers[a] for a in members}
            if len(toks) > 1:
                ids = {a: (len(tokenizers[a]), tokenizers[a].pad_token_id, tokenizers[a].eos_token_id) for a in members}
                if len(set(ids.values())) > 1:
                    raise ValueError(
                        f"agents {list(members)} share one base model but their tokenizers differ (size, pad id, "
                        f"EOS id: {ids}); give agents with different tokenizers different models"
                    )
            group = BaseGroup(
                base, tokenizers[first], members,
                None if loras[first] is None else {a: loras[a] for a in members}, backend,
            )
            self.groups.append(group)
            for agent in members:
                self._group_of[agent] = group

        self.value_heads: nn.ModuleDict | None = None
        if value_head:
            self.value_heads = nn.ModuleDict(
                {a: nn.Linear(self._group_of[a].hidden_size, 1).to(self._group_of[a].device) for a in self.agents}
            )
        self._training = False
        self.gradient_checkpointing = bool(gradient_checkpointing)
        """Gradient passes of the fused forward recompute in the backward the layers whose activations do
        not fit in :attr:`activation_budget_mb` (docs/agents.md: each recomputed layer costs one more
        forward of it); ``False`` keeps every layer's."""
        self.activation_budget_mb: float | str = budget
        """With gradient checkpointing, the megabytes of activations a gradient pass keeps (the layers
        that fit keep theirs; the rest are recomputed in the backward), or ``"auto"``: a share of the
        free memory of the pass's device, read at each pass (:meth:`activation_keep_mb`)."""
        self.share_prompts = bool(share_prompts)
        """Passes of the fused forward compute a prompt that several rows repeat once (MAGRPO's G samples
        of a problem); ``False`` computes every row whole (the same numbers, up to rounding)."""

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def from_pretrained(
        cls,
        agents: Sequence[str],
        model: str | os.PathLike[str] | Mapping[str, str | os.PathLike[str] | None] | None = None,
        *,
        tokenizer: Any = None,
        dtype: str | torch.dtype | None = None,
        device: str | torch.device | Mapping[str, str | torch.device | None] | None = None,
        **kwargs: Any,
    ) -> MultiAgentPolicy:
        """Load ``model`` (``None``: the embedded default; a mapping agent -> model for a team, agents it
        does not name on the default) and its tokenizer, then build the policy.

        ``tokenizer`` defaults to each model's own (for ``None``, the default tokenizer the envs use).
        Other keyword arguments go to the constructor (``lora``, ``value_head``, ``sampling``, ...).
        """
        names = list(agents)
        models = dict(model) if isinstance(model, Mapping) else dict.fromkeys(names, model)
        unknown = sorted(set(models) - set(names))
        if unknown:
            raise ValueError(f"models are given for unknown agents {unknown}; the agents are {names}")
        models = {a: models.get(a) for a in names}
        if tokenizer is None:
            tokenizer = {a: models[a] for a in names}
        elif isinstance(tokenizer, Mapping):
            tokenizer = {a: tokenizer.get(a, models[a]) for a in names}
        return cls(models, tokenizer, names, dtype=dtype, device=device, **kwargs)

    def group(self, agent: str) -> BaseGroup:
        """The :class:`~agents.team.BaseGroup` (base model, tokenizer ids, engine) ``agent`` sits on."""
        return self._group_of[self._check_agent(agent)]

    def _check_agent(self, agent: str) -> str:
        if agent not in self.agents:
            raise KeyError(f"unknown agent {agent!r}; this policy's agents are {list(self.agents)}")
        return agent

    def _one(self, what: str) -> BaseGroup:
        """The only group, for attributes that belong to a base (``model``, ``engine``, ...)."""
        if len(self.groups) != 1:
            raise AttributeError(
                f"policy.{what} is a base model's and this team has {len(self.groups)} bases "
                f"({[list(g.agents) for g in self.groups]}); use policy.group(agent).{what}"
            )
        return self.groups[0]

    def _agreed(self, what: str) -> Any:
        """An attribute every group shares (the pad id of a team with one tokenizer)."""
        values = {repr(getattr(g, what)): getattr(g, what) for g in self.groups}
        if len(values) != 1:
            raise AttributeError(
                f"policy.{what} differs between this team's bases "
                f"({ {g.agents: getattr(g, what) for g in self.groups} }); use policy.group(agent).{what}"
            )
        return next(iter(values.values()))

    # One base (or a team that agrees): the attributes of a policy before teams.
    model = property(lambda self: self._one("model").model)

    @property
    def engine(self) -> Any:
        return self._one("engine").engine

    @engine.setter
    def engine(self, engine: Any) -> None:  # switch one base between the engine and generate (tests)
        self._one("engine").engine = engine

    backend = property(lambda self: self._one("backend").backend)
    backend_reason = property(lambda self: self._one("backend_reason").backend_reason)
    _causal_lm = property(lambda self: self._one("causal_lm").causal_lm)
    _reference = property(lambda self: self._one("reference").reference)
    tokenizer = property(lambda self: self._one("tokenizer").tokenizer)
    device = property(lambda self: self._agreed("device"))
    vocab_size = property(lambda self: self._agreed("vocab_size"))
    pad_token_id = property(lambda self: self._agreed("pad_token_id"))
    eos_token_ids = property(lambda self: self._agreed("eos_token_ids"))

    def tokenizer_of(self, agent: str) -> Any:
        """``agent``'s tokenizer (its env must speak it)."""
        return self.group(agent).tokenizer

    def pad_token_id_of(self, agent: str) -> int:
        """The pad id of ``agent``'s tokenizer (its actions are padded with it)."""
        return self.group(agent).pad_token_id

    def eos_token_ids_of(self, agent: str) -> tuple[int, ...]:
        """The ids that end ``agent``'s responses (its env's ``stop_token_ids``)."""
        return self.group(agent).eos_token_ids

    def _set_agent(self, agent: str) -> None:
        self._group_of[agent].set_agent(agent)

    # ------------------------------------------------------------------ parameters and modes
    def parameters(self, agent: str, *, value_head: bool = True) -> list[nn.Parameter]:
        """Trainable parameters of ``agent``: its adapter (all weights under full fine-tuning) and, when
        there is one and ``value_head``, its value head."""
        params = list(self._group_of[self._check_agent(agent)].adapter_params[agent])
        if value_head and self.value_heads is not None:
            params += list(self.value_heads[agent].parameters())
        return params

    def value_head_parameters(self, agent: str) -> list[nn.Parameter]:
        """Parameters of ``agent``'s value head (for a separate learning rate)."""
        if self.value_heads is None:
            raise ValueError("this policy has no value heads; build it with value_head=True")
        return list(self.value_heads[self._check_agent(agent)].parameters())

    def optimizer(self, agent: str, lr: float, **adamw_kwargs: Any) -> torch.optim.AdamW:
        """An AdamW over :meth:`parameters` of ``agent`` (one per agent; its state stays with that agent).

        On CUDA the fused implementation (one kernel for all of the agent's tensors, instead of a few
        launches per tensor: at RL sizes a step costs what launching it costs), unless ``adamw_kwargs``
        says ``fused`` or ``foreach``; on the CPU torch's default, unchanged."""
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr!r}")
        params = self.parameters(agent)
        if "fused" not in adamw_kwargs and "foreach" not in adamw_kwargs and fused_adamw_applies(params):
            adamw_kwargs = {**adamw_kwargs, "fused": True}
        return torch.optim.AdamW(params, lr=lr, **adamw_kwargs)

    @property
    def training(self) -> bool:
        """Whether :meth:`train` mode is on (LoRA dropout active in gradient passes)."""
        return self._training

    def train(self, mode: bool = True) -> MultiAgentPolicy:
        """Train mode enables LoRA dropout, and only that: the base model stays in eval mode, so a base
        with dropout (GPT-2, OPT, Phi) scores the same tokens the same way in every pass and the
        policy equals the reference until its adapter changes (PPO's KL and MAGRPO's ratios start at
        exactly 0 and 1). Under full fine-tuning the model's own dropout stays off likewise (TRL's
        ``disable_dropout``). Passes run without gradients (old log-probs, values, reference
        log-probs) and generation always run in eval mode."""
        self._training = bool(mode)
        self._apply_mode(self._training)
        if self.value_heads is not None:
            self.value_heads.train(mode)
        return self

    def eval(self) -> MultiAgentPolicy:
        return self.train(False)

    def _apply_mode(self, dropout: bool) -> None:
        for group in self.groups:
            group.apply_mode(dropout)

    @contextlib.contextmanager
    def _eval_mode(self) -> Iterator[None]:
        self._apply_mode(False)
        try:
            yield
        finally:
            self._apply_mode(self._training)

    # ------------------------------------------------------------------ input checks
    def _rows(
        self, ids: ArrayLike, mask: ArrayLike, what: str, group: BaseGroup | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        group = group or self._one("device")
        return check_rows(ids, mask, what, group.device, group.vocab_size)

    def _pair(self, group: BaseGroup, prompt_ids, prompt_mask, response_ids, response_mask):
        p_ids, p_mask = self._rows(prompt_ids, prompt_mask, "prompt", group)
        r_ids, r_mask = self._rows(response_ids, response_mask, "response", group)
        if r_ids.numel() and int(r_ids.max()) >= group.token_count:
            # Log-probs are over the tokenizer's ids (rows of the head beyond it are masked): an id
            # beyond it was never sampled and has no log-prob.
            raise ValueError(
                f"response_ids must lie below the tokenizer's size {group.token_count} (agents "
                f"{list(group.agents)}), got max {int(r_ids.max())}"
            )
        if len(p_ids) != len(r_ids):
            raise ValueError(f"{len(p_ids)} prompts but {len(r_ids)} responses; they must pair row by row")
        return p_ids, p_mask, r_ids, r_mask


def fused_adamw_applies(params: Sequence[torch.Tensor]) -> bool:
    """Whether torch's fused AdamW takes ``params``: all floating point, all on CUDA."""
    return bool(params) and all(p.is_cuda and p.is_floating_point() for p in params)


def _cpu_float32(model: Any) -> bool:
    """Whether ``model``'s base computes in float32 on the CPU."""
    weight = model.get_input_embeddings().weight
    return weight.is_cpu and weight.dtype == torch.float32
