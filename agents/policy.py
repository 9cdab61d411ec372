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

**Positions.** Prompts are left-padded (``prompt_mask`` rows are 0s then 1s) and responses right-padded
(``response_mask`` rows are 1s then 0s). Position ids are ``cumsum(mask) - 1`` over prompt and
response, exactly as ``transformers`` generation computes them, so a recomputed log-prob matches the
one recorded while sampling. The pad token of the default tokenizer is its end-of-turn token, which
also occurs inside chat prompts: boundaries always come from the masks, never from searching pad ids.
The log-prob of response token t is read from the logits at position ``P - 1 + t``; the LM head runs on
those T positions only (``logits_to_keep``), the last response token is included and pads give 0.

Values (PPO, CORY) use the same positions: ``values[:, t]`` is the value of the state just before
response token t, read by a per-agent ``Linear(hidden, 1)`` from the base model's last hidden state.

>>> from agents import MultiAgentPolicy                          # doctest: +SKIP
>>> policy = MultiAgentPolicy.from_pretrained(["helper", "main"])     # doctest: +SKIP
>>> obs, infos = env.reset(seed=0)                              # doctest: +SKIP
>>> obs, rewards, terminations, truncations, infos = env.step(policy.act(obs))  # doctest: +SKIP
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import os
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from agents.acting import ActingMixin
from agents.generation import Generation, GenerationMixin
from agents.memory import tune_allocator
from agents.models import load_model
from agents.persistence import CHECKPOINT_FORMAT, MANIFEST_NAME, PersistenceMixin
from agents.rows import ArrayLike, check_rows
from agents.scoring import ScoringMixin
from agents.settings import DEFAULT_LORA, DEFAULT_SAMPLING, LoraSettings, Sampling, check_agent_names
from llm_envs.tokenizers import load_tokenizer

__all__ = [
    "BACKENDS", "CHECKPOINT_FORMAT", "MANIFEST_NAME", "Generation", "LoraSettings", "MultiAgentPolicy", "Sampling",
]

BACKENDS = ("auto", "engine", "generate")


class MultiAgentPolicy(ScoringMixin, GenerationMixin, ActingMixin, PersistenceMixin):
    """One base causal LM, one LoRA adapter (and optional value head) per agent; see the module docs.

    Args:
        model: a ``transformers`` causal LM (``agents.models.load_model``). It is wrapped by PEFT in place.
        tokenizer: the tokenizer whose ids the envs emit (``llm_envs.tokenizers.load_tokenizer``); used
            for the pad and EOS ids and to check that the vocabularies agree.
        agents: env agent names; each names its adapter. No dots (PEFT module keys), no duplicates.
        lora: adapter settings, or ``None`` for full fine-tuning of a single agent.
        value_head: add a trainable ``Linear(hidden, 1)`` per agent (PPO, CORY).
        sampling: defaults for :meth:`act`.
        mixed_batches: with the ``generate`` backend, run all agents' rows through one ``generate``
            call (PEFT mixed-adapter batches) instead of one call per agent.
        backend: ``"auto"`` (default): the rollout engine (:mod:`agents.engine`: all agents' rows in
            one decode loop) when it supports the model, else ``transformers``' ``generate``;
            ``"engine"`` (an error if unsupported) or ``"generate"``. With the engine, scoring and
            training passes also run through its fused forward (:mod:`agents.decoder`; the model's own
            forward through PEFT for LoRA dropout in gradient passes and for full fine-tuning); with
            ``"generate"``, through the model's own forward.
        gradient_checkpointing: in the fused forward's gradient passes, recompute each layer in the
            backward instead of keeping its activations (less memory, ~20% more update time).
        activation_budget_mb: with ``gradient_checkpointing``, the megabytes of activations a gradient
            pass may keep: as many layers as fit keep theirs (estimated by
            :meth:`agents.decoder.FusedDecoder.activation_bytes`), only the rest are recomputed. 0
            (default): every layer is recomputed.
        share_prompts: in the fused forward, compute a prompt that several rows of a pass repeat once
            (MAGRPO's G samples of a problem; docs/agents.md). ``False`` computes every row whole: the
            same numbers up to rounding, and the same rounding whatever else is in the pass.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        agents: Sequence[str],
        *,
        lora: LoraSettings | None = DEFAULT_LORA,
        value_head: bool = False,
        sampling: Sampling = DEFAULT_SAMPLING,
        mixed_batches: bool = True,
        backend: str = "auto",
        gradient_checkpointing: bool = True,
        activation_budget_mb: float = 0.0,
        share_prompts: bool = True,
    ) -> None:
        self.agents: tuple[str, ...] = check_agent_names(agents)
        tune_allocator()  # large activations reused, not page-faulted in again (agents/memory.py)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if lora is not None and not isinstance(lora, LoraSettings):
            raise TypeError(f"lora must be a LoraSettings or None (full fine-tuning), got {lora!r}")
        if lora is None and len(self.agents) != 1:
            raise ValueError(
                f"full fine-tuning (lora=None) supports exactly one agent, got {list(self.agents)}; "
                "use LoRA adapters to train several agents on one base model"
            )
        if not isinstance(sampling, Sampling):
            raise TypeError(f"sampling must be a Sampling, got {sampling!r}")
        self.lora = lora
        self.sampling = sampling
        self.mixed_batches = bool(mixed_batches)
        self.tokenizer = tokenizer

        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        if len(tokenizer) > self.vocab_size:
            raise ValueError(
                f"tokenizer has {len(tokenizer)} tokens but the model's embedding has {self.vocab_size} rows: "
                "they do not belong together"
            )
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise ValueError("the tokenizer has neither a pad token nor an EOS token; set tokenizer.pad_token")
        self.pad_token_id = int(pad)
        eos: set[int] = set()
        for source in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
            if isinstance(source, int):
                eos.add(source)
            elif source is not None:
                eos.update(int(i) for i in source)
        if not eos:
            raise ValueError("neither the tokenizer nor the model's generation config defines an EOS token")
        self.eos_token_ids: tuple[int, ...] = tuple(sorted(eos))

        self.device = next(model.parameters()).device
        for param in model.parameters():
            param.requires_grad_(False)
        self._reference: Any = None
        if lora is None:
            self._reference = copy.deepcopy(model).eval()
            self.model = model
            self._causal_lm = model
            for param in model.parameters():
                param.requires_grad_(True)
        else:
            from peft import get_peft_model

            with warnings.catch_warnings():
                # PEFT reads transformers' deprecated ``is_gradient_checkpointing``: a FutureWarning on
                # every run that the user can do nothing about.
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
                self.model = get_peft_model(model, lora.peft_config(), adapter_name=self.agents[0])
            for name in self.agents[1:]:
                self.model.add_adapter(name, lora.peft_config())
            self._causal_lm = self.model.get_base_model()
        self._active: str | None = None
        self._adapter_params: dict[str, list[nn.Parameter]] = {a: self._collect_adapter_params(a) for a in self.agents}
        self._set_agent(self.agents[0])

        hidden = int(model.get_input_embeddings().embedding_dim)
        self.value_heads: nn.ModuleDict | None = None
        if value_head:
            self.value_heads = nn.ModuleDict({a: nn.Linear(hidden, 1) for a in self.agents}).to(self.device)
        self._keeps_logits = "logits_to_keep" in inspect.signature(self._causal_lm.forward).parameters
        # LoRA's dropout modules: the only modules train() switches to training mode.
        self._lora_dropouts: list[nn.Module] = [
            module for name, module in self.model.named_modules() if name.rsplit(".", 2)[-2:-1] == ["lora_dropout"]
        ]
        self._training = False
        self.model.eval()
        self.gradient_checkpointing = bool(gradient_checkpointing)
        """Gradient passes of the fused forward recompute each layer in the backward instead of keeping
        its activations (docs/agents.md: about 1/10 of the update's memory for ~20% more update time)."""
        if (isinstance(activation_budget_mb, bool) or not isinstance(activation_budget_mb, (int, float))
                or not 0 <= activation_budget_mb < float("inf")):
            raise ValueError(f"activation_budget_mb must be a number >= 0, got {activation_budget_mb!r}")
        self.activation_budget_mb = float(activation_budget_mb)
        """With gradient checkpointing, the megabytes of activations a gradient pass keeps (the layers
        that fit keep theirs; the rest are recomputed in the backward)."""
        self.share_prompts = bool(share_prompts)
        """Passes of the fused forward compute a prompt that several rows repeat once (MAGRPO's G samples
        of a problem); ``False`` computes every row whole (the same numbers, up to rounding)."""
        from agents.engine import RolloutEngine, engine_support

        self.engine: RolloutEngine | None = None
        reason = engine_support(self.model) if backend != "generate" else "backend='generate' was chosen"
        if backend == "engine" and reason is not None:
            raise ValueError(f"backend='engine' cannot decode this model: {reason}; use backend='generate'")
        if reason is None:
            self.engine = RolloutEngine(self.model, trainable_base=lora is None)
        self.backend = "engine" if self.engine is not None else "generate"
        """The generation backend in use: ``"engine"`` or ``"generate"``."""
        self.backend_reason = reason
        """Why the engine is not in use (``None`` when it is)."""

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def from_pretrained(
        cls,
        agents: Sequence[str],
        model: str | os.PathLike[str] | None = None,
        *,
        tokenizer: Any = None,
        dtype: str | torch.dtype | None = None,
        device: str | torch.device | None = None,
        **kwargs: Any,
    ) -> MultiAgentPolicy:
        """Load ``model`` (``None``: the embedded default) and its tokenizer, then build the policy.

        ``tokenizer`` defaults to the model's own (for ``None``, the default tokenizer the envs use).
        Other keyword arguments go to the constructor (``lora``, ``value_head``, ``sampling``, ...).
        """
        tok = load_tokenizer(tokenizer if tokenizer is not None else model)
        return cls(load_model(model, dtype=dtype, device=device), tok, agents, **kwargs)

    def _collect_adapter_params(self, agent: str) -> list[nn.Parameter]:
        if self.lora is None:
            return list(self.model.parameters())
        from peft.tuners.tuners_utils import BaseTunerLayer

        params: list[nn.Parameter] = []
        for module in self.model.modules():
            if isinstance(module, BaseTunerLayer):
                for layer_name in module.adapter_layer_names:
                    per_adapter = getattr(module, layer_name)
                    if agent in per_adapter:
                        item = per_adapter[agent]
                        params += list(item.parameters()) if isinstance(item, nn.Module) else [item]
        if not params:
            raise RuntimeError(f"PEFT created no adapter weights for agent {agent!r}; check target_modules")
        return params

    def _set_agent(self, agent: str) -> None:
        if self.lora is None or agent == self._active:
            return
        self.model.set_adapter(agent)
        # PEFT freezes every adapter but the active one; each agent's optimizer holds its own adapter
        # and a forward only ever uses the active one, so keep them all trainable.
        for params in self._adapter_params.values():
            for param in params:
                param.requires_grad_(True)
        self._active = agent

    def _check_agent(self, agent: str) -> str:
        if agent not in self.agents:
            raise KeyError(f"unknown agent {agent!r}; this policy's agents are {list(self.agents)}")
        return agent

    # ------------------------------------------------------------------ parameters and modes
    def parameters(self, agent: str, *, value_head: bool = True) -> list[nn.Parameter]:
        """Trainable parameters of ``agent``: its adapter (all weights under full fine-tuning) and, when
        there is one and ``value_head``, its value head."""
        params = list(self._adapter_params[self._check_agent(agent)])
        if value_head and self.value_heads is not None:
            params += list(self.value_heads[agent].parameters())
        return params

    def value_head_parameters(self, agent: str) -> list[nn.Parameter]:
        """Parameters of ``agent``'s value head (for a separate learning rate)."""
        if self.value_heads is None:
            raise ValueError("this policy has no value heads; build it with value_head=True")
        return list(self.value_heads[self._check_agent(agent)].parameters())

    def optimizer(self, agent: str, lr: float, **adamw_kwargs: Any) -> torch.optim.AdamW:
        """An AdamW over :meth:`parameters` of ``agent`` (one per agent; its state stays with that agent)."""
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr!r}")
        return torch.optim.AdamW(self.parameters(agent), lr=lr, **adamw_kwargs)

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
        self.model.eval()
        if dropout:
            for module in self._lora_dropouts:
                module.train()

    @contextlib.contextmanager
    def _eval_mode(self) -> Iterator[None]:
        self._apply_mode(False)
        try:
            yield
        finally:
            self._apply_mode(self._training)

    # ------------------------------------------------------------------ input checks
    def _rows(self, ids: ArrayLike, mask: ArrayLike, what: str) -> tuple[torch.Tensor, torch.Tensor]:
        return check_rows(ids, mask, what, self.device, self.vocab_size)

    def _pair(self, prompt_ids, prompt_mask, response_ids, response_mask):
        p_ids, p_mask = self._rows(prompt_ids, prompt_mask, "prompt")
        r_ids, r_mask = self._rows(response_ids, response_mask, "response")
        if len(p_ids) != len(r_ids):
            raise ValueError(f"{len(p_ids)} prompts but {len(r_ids)} responses; they must pair row by row")
        return p_ids, p_mask, r_ids, r_mask
