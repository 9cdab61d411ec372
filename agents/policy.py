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
>>> policy = MultiAgentPolicy.from_pretrained(["helper", "main"])     # embedded default model
>>> obs, infos = env.reset(seed=0)
>>> obs, rewards, terminations, truncations, infos = env.step(policy.act(obs))
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import json
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from agents.memory import release_memory, tune_allocator
from agents.models import load_model
from llm_envs.tokenizers import load_tokenizer

CHECKPOINT_FORMAT = "llm-envs-policy-v1"
BACKENDS = ("auto", "engine", "generate")
MANIFEST_NAME = "policy.json"

ArrayLike = torch.Tensor | np.ndarray


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapter settings, shared by every agent's adapter."""

    rank: int = 16
    """LoRA rank r."""
    alpha: float = 32.0
    """LoRA scaling numerator (the update is scaled by alpha / rank)."""
    dropout: float = 0.0
    """Dropout on the adapter input (active only in ``policy.train()`` mode)."""
    target_modules: str | tuple[str, ...] = "all-linear"
    """Module names to adapt, or "all-linear" (every linear layer except the LM head)."""

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or self.rank < 1:
            raise ValueError(f"LoraSettings.rank must be a positive int, got {self.rank!r}")
        if not isinstance(self.alpha, (int, float)) or not self.alpha > 0:
            raise ValueError(f"LoraSettings.alpha must be a positive number, got {self.alpha!r}")
        if not isinstance(self.dropout, (int, float)) or not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"LoraSettings.dropout must be in [0, 1), got {self.dropout!r}")
        targets = self.target_modules
        if isinstance(targets, list):
            object.__setattr__(self, "target_modules", tuple(targets))
            targets = self.target_modules
        if isinstance(targets, str):
            if not targets:
                raise ValueError("LoraSettings.target_modules must not be empty")
        elif not targets or not all(isinstance(t, str) and t for t in targets):
            raise ValueError(
                f"LoraSettings.target_modules must be 'all-linear' or a non-empty tuple of module names, "
                f"got {targets!r}"
            )

    def peft_config(self) -> Any:
        from peft import LoraConfig

        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=targets,
            bias="none",
            task_type="CAUSAL_LM",
        )


@dataclass(frozen=True)
class Sampling:
    """Sampling settings of :meth:`MultiAgentPolicy.act` (``generate`` takes the same as arguments)."""

    max_new_tokens: int = 64
    """Response length; must equal the env's action length (``env.action_space(agent).shape[-1]``)."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    repetition_penalty: float = 1.0
    greedy: bool = False
    """Take the arg-max token instead of sampling (temperature/top-p/top-k are then unused)."""

    def __post_init__(self) -> None:
        _check_sampling(self.max_new_tokens, self.temperature, self.top_p, self.top_k, self.repetition_penalty)


def _check_sampling(max_new_tokens: int, temperature: float, top_p: float, top_k: int, rep: float) -> None:
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if not isinstance(temperature, (int, float)) or not temperature > 0:
        raise ValueError(f"temperature must be > 0 (use greedy=True for arg-max decoding), got {temperature!r}")
    if not isinstance(top_p, (int, float)) or not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 0:
        raise ValueError(f"top_k must be an int >= 0 (0 disables it), got {top_k!r}")
    if not isinstance(rep, (int, float)) or not rep > 0:
        raise ValueError(f"repetition_penalty must be > 0, got {rep!r}")


@dataclass
class Generation:
    """Sampled responses of one agent. Rows are prompt-major: row ``b * num_samples + g`` is sample g of
    prompt b, so ``x.view(B, num_samples, ...)`` gives groups."""

    agent: str
    num_samples: int
    prompt_ids: torch.Tensor
    """(B*G, P) the prompts, each repeated ``num_samples`` times, left-padded."""
    prompt_mask: torch.Tensor
    """(B*G, P) 1 on prompt tokens."""
    response_ids: torch.Tensor
    """(B*G, T) sampled tokens; after the first EOS every id is the pad id. T <= max_new_tokens."""
    response_mask: torch.Tensor
    """(B*G, T) 1 up to and including the first EOS, 0 after it."""
    logprobs: torch.Tensor
    """(B*G, T) raw policy log-prob of each sampled token (see the module docs); 0 where the mask is 0."""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def response_lengths(self) -> torch.Tensor:
        """(B*G,) number of response tokens, the EOS included."""
        return self.response_mask.sum(-1)


class _LogProbRecorder:
    """Logits processor that records the log-prob of each sampled token under the unprocessed logits.

    It sees the logits of step t before the warpers; the token chosen at step t is only known at step
    t + 1 (the last column of ``input_ids``), so one (N, V) log-softmax is kept between calls and the
    last step is read by :meth:`finish`.
    """

    def __init__(self, temperature: float = 1.0) -> None:
        self._previous: torch.Tensor | None = None
        self.steps: list[torch.Tensor] = []
        self.temperature = temperature

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._previous is not None:
            self.steps.append(self._previous.gather(-1, input_ids[:, -1:]).squeeze(-1))
        self._previous = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, response_ids: torch.Tensor) -> torch.Tensor:
        if self._previous is not None:
            self.steps.append(self._previous.gather(-1, response_ids[:, -1:]).squeeze(-1))
            self._previous = None
        if len(self.steps) != response_ids.shape[1]:
            raise RuntimeError(
                f"recorded {len(self.steps)} log-prob steps for {response_ids.shape[1]} generated tokens; "
                "another logits processor or the model's generation config changed the decoding loop"
            )
        return torch.stack(self.steps, dim=1) if self.steps else response_ids.new_zeros((len(response_ids), 0))


class MultiAgentPolicy:
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
        lora: LoraSettings | None = LoraSettings(),
        value_head: bool = False,
        sampling: Sampling = Sampling(),
        mixed_batches: bool = True,
        backend: str = "auto",
        gradient_checkpointing: bool = True,
        activation_budget_mb: float = 0.0,
        share_prompts: bool = True,
    ) -> None:
        self.agents: tuple[str, ...] = _check_agent_names(agents)
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
        ids_t = _to_tensor(ids, f"{what}_ids").to(self.device, torch.long)
        mask_t = _to_tensor(mask, f"{what}_mask").to(self.device, torch.long)
        if ids_t.dim() != 2:
            raise ValueError(f"{what}_ids must be 2-D (batch, length), got shape {tuple(ids_t.shape)}")
        if mask_t.shape != ids_t.shape:
            raise ValueError(
                f"{what}_mask shape {tuple(mask_t.shape)} differs from {what}_ids shape {tuple(ids_t.shape)}"
            )
        if mask_t.numel():
            if ((mask_t != 0) & (mask_t != 1)).any():
                raise ValueError(f"{what}_mask must hold only 0 and 1, got values {mask_t.unique().tolist()}")
            if ids_t.min() < 0 or ids_t.max() >= self.vocab_size:
                raise ValueError(
                    f"{what}_ids must lie in [0, {self.vocab_size - 1}], got min {ids_t.min().item()} "
                    f"and max {ids_t.max().item()}"
                )
        steps = mask_t.diff(dim=1) if mask_t.shape[1] > 1 else mask_t[:, :0]
        if what == "prompt":
            bad = (steps < 0).any(-1) | (mask_t[:, -1] == 0 if mask_t.shape[1] else torch.ones_like(mask_t[:, 0]))
            if mask_t.shape[1] == 0 or bad.any():
                row = int(bad.nonzero()[0, 0]) if mask_t.shape[1] else 0
                raise ValueError(
                    f"prompt row {row} is not a non-empty left-padded prompt (mask must be 0s then 1s and end "
                    f"with 1), got mask {mask_t[row].tolist() if len(mask_t) else []}"
                )
        elif (steps > 0).any():
            row = int((steps > 0).any(-1).nonzero()[0, 0])
            raise ValueError(
                f"response row {row} is not right-padded (mask must be 1s then 0s), got {mask_t[row].tolist()}"
            )
        return ids_t, mask_t

    def _pair(self, prompt_ids, prompt_mask, response_ids, response_mask):
        p_ids, p_mask = self._rows(prompt_ids, prompt_mask, "prompt")
        r_ids, r_mask = self._rows(response_ids, response_mask, "response")
        if len(p_ids) != len(r_ids):
            raise ValueError(f"{len(p_ids)} prompts but {len(r_ids)} responses; they must pair row by row")
        return p_ids, p_mask, r_ids, r_mask

    # ------------------------------------------------------------------ scoring
    def _fused(self) -> bool:
        """Whether scoring passes run through the fused decoder (:mod:`agents.decoder`) rather than the
        model's own forward through PEFT: with the engine backend and LoRA adapters, except for
        gradient passes in train mode with LoRA dropout (PEFT draws dropout per adapted module)."""
        if self.engine is None or self.lora is None:
            return False
        return not (torch.is_grad_enabled() and self._training and self.lora.dropout > 0)

    def _score(
        self,
        p_ids: torch.Tensor,
        p_mask: torch.Tensor,
        r_ids: torch.Tensor,
        r_mask: torch.Tensor,
        adapter: str | None,
        value_agent: str | None,
        temperature: float = 1.0,
        with_reference: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(B, T) log-probs under ``adapter`` (``None``: the base), values from ``value_agent``'s head and,
        with ``with_reference``, the base's log-probs too (one forward of both row blocks when fused)."""
        width, length = p_ids.shape[1], r_ids.shape[1]
        if length == 0:
            empty = r_ids.new_zeros(r_ids.shape, dtype=torch.float32)
            return empty, (empty if value_agent is not None else None), (empty if with_reference else None)
        input_ids = torch.cat([p_ids, r_ids], dim=1)  # (B, P+T)
        attention_mask = torch.cat([p_mask, r_mask], dim=1)
        # Position P-1+t predicts response token t: the last prompt token predicts the first.
        keep = torch.arange(width - 1, width + length - 1, device=self.device)
        if self._fused():
            from agents.decoder import Block, bucket_length, chosen_logprobs, pad_left

            rows = len(input_ids)
            adapters = [adapter, None] if with_reference else [adapter]
            blocks = [Block(a, rows) for a in adapters]
            assert self.engine is not None
            distinct, index = _distinct_rows(p_ids, p_mask) if self.share_prompts else (None, None)
            if distinct is not None and index is not None:  # the G samples of a problem: its prompt once
                u = len(distinct)
                bucket = bucket_length(width)
                prompt_ids, prompt_mask = pad_left(p_ids[distinct], p_mask[distinct], bucket, self.pad_token_id)
                extra = bucket_length(length) - length  # right pads: masked, cut off below
                ids = torch.nn.functional.pad(r_ids, (0, extra), value=self.pad_token_id)
                mask = torch.nn.functional.pad(r_mask, (0, extra), value=0)
                n = len(adapters)
                hidden = self.engine.hidden_states_shared(  # (B or 2B, T, H)
                    prompt_ids.repeat(n, 1), prompt_mask.repeat(n, 1), [Block(a, u) for a in adapters],
                    torch.cat([index + k * u for k in range(n)]), ids.repeat(n, 1), mask.repeat(n, 1), blocks,
                    checkpoint=self.gradient_checkpointing, keep_mb=self.activation_budget_mb,
                )[:, :length]
            else:
                bucket = bucket_length(input_ids.shape[1])  # few distinct shapes (see bucket_length)
                keep = keep + (bucket - input_ids.shape[1])
                input_ids, attention_mask = pad_left(input_ids, attention_mask, bucket, self.pad_token_id)
                if with_reference:
                    input_ids, attention_mask = input_ids.repeat(2, 1), attention_mask.repeat(2, 1)
                hidden = self.engine.hidden_states(  # (B or 2B, T, H)
                    input_ids, attention_mask, blocks, keep, checkpoint=self.gradient_checkpointing,
                    keep_mb=self.activation_budget_mb,
                )
            head = self._causal_lm.lm_head
            targets = r_ids.repeat(len(blocks), 1)
            if head.bias is None:
                scores = chosen_logprobs(hidden, head.weight, targets, temperature)  # chunked over the vocabulary
            else:
                scores = self._token_logprobs(head(hidden), targets, r_mask.repeat(len(blocks), 1), temperature)
            scores = scores.masked_fill(r_mask.repeat(len(blocks), 1) == 0, 0.0)
            values = None
            if value_agent is not None:
                assert self.value_heads is not None
                values = self.value_heads[value_agent](hidden[:rows].float()).squeeze(-1).masked_fill(r_mask == 0, 0.0)
            return scores[:rows], values, (scores[rows:] if with_reference else None)

        logprobs, values = self._score_hf(input_ids, attention_mask, keep, r_ids, r_mask, adapter, value_agent,
                                          temperature)
        ref = None
        if with_reference:
            ref = self._score_hf(input_ids, attention_mask, keep, r_ids, r_mask, None, None, temperature)[0]
        return logprobs, values, ref

    def _score_hf(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        keep: torch.Tensor,
        r_ids: torch.Tensor,
        r_mask: torch.Tensor,
        adapter: str | None,
        value_agent: str | None,
        temperature: float,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The model's own forward (through PEFT): ``adapter`` active, or the reference when ``None``."""
        model = self.model
        context: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
        if adapter is None:
            if self.lora is None:
                model = self._reference
            else:
                context = self.model.disable_adapter()
        else:
            self._set_agent(adapter)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        captured: list[torch.Tensor] = []
        hook = None
        if value_agent is not None:
            body = self._causal_lm.base_model

            def grab(_module: nn.Module, _args: Any, output: Any) -> None:
                captured.append(output[0] if isinstance(output, tuple) else output.last_hidden_state)

            hook = body.register_forward_hook(grab)
        try:
            kwargs: dict[str, Any] = {"logits_to_keep": keep} if self._keeps_logits else {}
            with context:
                logits = model(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    position_ids=position_ids,
                    use_cache=False,
                    **kwargs,
                ).logits
        finally:
            if hook is not None:
                hook.remove()
        if not self._keeps_logits:
            logits = logits[:, keep]
        logprobs = self._token_logprobs(logits, r_ids, r_mask, temperature)
        values = None
        if value_agent is not None:
            assert self.value_heads is not None
            hidden = captured[-1][:, keep].float()  # (B, T, H)
            values = self.value_heads[value_agent](hidden).squeeze(-1).masked_fill(r_mask == 0, 0.0)
        return logprobs, values

    @staticmethod
    def _token_logprobs(
        logits: torch.Tensor, r_ids: torch.Tensor, r_mask: torch.Tensor, temperature: float
    ) -> torch.Tensor:
        """(B, T, V) logits -> (B, T) float32 log-probs of the response tokens, 0 on pads."""
        if temperature != 1.0:
            logits = logits.float() / temperature
        logprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)  # one fused pass over the vocabulary
        return logprobs.gather(-1, r_ids.unsqueeze(-1)).squeeze(-1).masked_fill(r_mask == 0, 0.0)

    def forward(
        self,
        agent: str,
        prompt_ids: ArrayLike,
        prompt_mask: ArrayLike,
        response_ids: ArrayLike,
        response_mask: ArrayLike,
        *,
        with_values: bool = False,
        temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward with ``agent``'s adapter: (B, T) log-probs and, if ``with_values``, (B, T) values.

        Gradients flow when torch's grad mode is on (wrap in ``torch.no_grad()`` for old log-probs).
        ``temperature``: log-probs of ``softmax(logits / temperature)`` (1: the raw policy).
        """
        _check_temperature(temperature)
        self._check_agent(agent)
        if with_values and self.value_heads is None:
            raise ValueError("with_values=True needs a policy built with value_head=True")
        tensors = self._pair(prompt_ids, prompt_mask, response_ids, response_mask)
        # A pass without gradients scores (old log-probs, values): no dropout, whatever the mode.
        with contextlib.nullcontext() if torch.is_grad_enabled() else self._eval_mode():
            logprobs, values, _ = self._score(
                *tensors, adapter=agent, value_agent=agent if with_values else None, temperature=temperature
            )
        return logprobs, values

    def logprobs(
        self,
        agent: str,
        prompt_ids: ArrayLike,
        prompt_mask: ArrayLike,
        response_ids: ArrayLike,
        response_mask: ArrayLike,
        *,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """(B, T) log-prob of each response token under ``agent``'s policy (at ``temperature``; 1: raw);
        0 on pads. Differentiable."""
        return self.forward(agent, prompt_ids, prompt_mask, response_ids, response_mask, temperature=temperature)[0]

    def values(
        self,
        agent: str,
        prompt_ids: ArrayLike,
        prompt_mask: ArrayLike,
        response_ids: ArrayLike,
        response_mask: ArrayLike,
    ) -> torch.Tensor:
        """(B, T) value of the state before each response token under ``agent``; 0 on pads. Differentiable
        (value head and adapter)."""
        return self.forward(agent, prompt_ids, prompt_mask, response_ids, response_mask, with_values=True)[1]

    @torch.no_grad()
    def ref_logprobs(
        self,
        agent: str,
        prompt_ids: ArrayLike,
        prompt_mask: ArrayLike,
        response_ids: ArrayLike,
        response_mask: ArrayLike,
        *,
        temperature: float = 1.0,
    ) -> torch.Tensor:
        """(B, T) log-probs under the reference policy (the base model with adapters disabled; under full
        fine-tuning, the frozen initial model), at ``temperature``. No grad, no dropout."""
        self._check_agent(agent)
        _check_temperature(temperature)
        tensors = self._pair(prompt_ids, prompt_mask, response_ids, response_mask)
        with self._eval_mode():
            return self._score(*tensors, adapter=None, value_agent=None, temperature=temperature)[0]

    @torch.no_grad()
    def score(
        self,
        agent: str,
        prompt_ids: ArrayLike,
        prompt_mask: ArrayLike,
        response_ids: ArrayLike,
        response_mask: ArrayLike,
        *,
        with_values: bool = False,
        with_reference: bool = False,
        temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Everything an update reads before its first gradient step, in as few passes as possible:
        (B, T) log-probs under ``agent``'s policy, its values (``with_values``) and the reference's
        log-probs (``with_reference``); ``None`` for what was not asked. No grad, no dropout.

        With the engine backend the policy's rows and the reference's rows go through one forward
        (two row blocks: the adapter's and the bare base's) and values come from the same hidden
        states; otherwise it is :meth:`forward` then :meth:`ref_logprobs`. The numbers equal those
        calls' either way.
        """
        _check_temperature(temperature)
        self._check_agent(agent)
        if with_values and self.value_heads is None:
            raise ValueError("with_values=True needs a policy built with value_head=True")
        tensors = self._pair(prompt_ids, prompt_mask, response_ids, response_mask)
        with self._eval_mode():
            return self._score(
                *tensors, adapter=agent, value_agent=agent if with_values else None, temperature=temperature,
                with_reference=with_reference,
            )

    # ------------------------------------------------------------------ generation
    def generate(
        self,
        agent: str,
        prompt_ids: ArrayLike,
        prompt_mask: ArrayLike,
        num_samples: int = 1,
        *,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        repetition_penalty: float = 1.0,
        greedy: bool = False,
        logprob_temperature: float = 1.0,
        seeds: Sequence[int] | None = None,
    ) -> Generation:
        """Sample ``num_samples`` responses per prompt with ``agent``'s adapter, in one batched decode.

        Prompts are (B, P) left-padded rows; see :class:`Generation` for the outputs and the module docs
        for what the log-probs are. Sampling draws from torch's global RNG (``torch.manual_seed``), or
        from one generator per row when ``seeds`` (one per prompt row) are given; see
        :meth:`generate_joint`.
        """
        return self.generate_joint(
            {agent: (prompt_ids, prompt_mask)},
            num_samples,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            repetition_penalty=repetition_penalty,
            greedy=greedy,
            logprob_temperature=logprob_temperature,
            seeds=seeds,
        )[agent]

    def generate_joint(
        self,
        prompts: Mapping[str, tuple[ArrayLike, ArrayLike]],
        num_samples: int = 1,
        *,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        repetition_penalty: float = 1.0,
        greedy: bool = False,
        logprob_temperature: float = 1.0,
        seeds: Sequence[int] | None = None,
    ) -> dict[str, Generation]:
        """:meth:`generate` for several agents: ``{agent: (prompt_ids, prompt_mask)}`` in, ``{agent:
        Generation}`` out. With the engine every agent's rows share one decode loop, each row with its
        own adapter; with ``generate``, one call per agent (or one PEFT mixed batch).

        ``seeds``: one int per prompt row (every agent has the same number of rows); sample g of row b
        of an agent is then drawn from its own generator seeded from (``seeds[b]``, the agent's
        name, g), so it does not depend on the rest of the batch. Unset: torch's global RNG.
        ``logprob_temperature``: the recorded log-probs are of ``softmax(logits / logprob_temperature)``
        (1: the raw policy; the sampling temperature: the tempered policy, as TRL scores)."""
        if not isinstance(prompts, Mapping) or not prompts:
            raise ValueError(f"prompts must be a non-empty mapping agent -> (prompt_ids, prompt_mask), got {prompts!r}")
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
        _check_sampling(max_new_tokens, temperature, top_p, top_k, repetition_penalty)
        _check_temperature(logprob_temperature, "logprob_temperature")
        rows: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for agent, pair in prompts.items():
            self._check_agent(agent)
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise ValueError(f"prompts[{agent!r}] must be a (prompt_ids, prompt_mask) tuple, got {type(pair)}")
            rows[agent] = self._rows(*pair, "prompt")
        if seeds is not None:
            counts = {len(ids) for ids, _ in rows.values()}
            if len(counts) != 1 or len(seeds) != counts.pop():
                raise ValueError(
                    f"seeds must hold one int per prompt row and every agent the same number of rows; got "
                    f"{len(seeds)} seeds for rows {({a: len(r[0]) for a, r in rows.items()})}"
                )
            if any(isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 0 for x in seeds):
                raise ValueError(f"seeds must be ints >= 0, got {list(seeds)[:8]}")
        settings = dict(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            repetition_penalty=repetition_penalty,
            greedy=greedy,
            logprob_temperature=logprob_temperature,
        )
        if self.engine is not None:
            # The last update's activations are freed by now: give their pages back before decoding.
            release_memory()
            return self._engine_generate(rows, num_samples, seeds, settings)
        if seeds is not None:
            return self._generate_seeded(rows, num_samples, seeds, settings)
        return self._generate_hf(rows, num_samples, settings)

    def _engine_generate(
        self,
        rows: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
        num_samples: int,
        seeds: Sequence[int] | None,
        settings: Mapping[str, Any],
    ) -> dict[str, Generation]:
        from agents.engine import Block, row_seed

        names = list(rows)
        width = max(rows[a][0].shape[1] for a in names)
        ids = torch.cat([_left_pad(rows[a][0], width, self.pad_token_id) for a in names])
        mask = torch.cat([_left_pad(rows[a][1], width, 0) for a in names])
        blocks = [Block(a if self.lora is not None else None, len(rows[a][0])) for a in names]
        row_seeds = None
        if seeds is not None:
            row_seeds = [
                row_seed(int(seeds[b]), a, g)
                for a in names
                for b in range(len(rows[a][0]))
                for g in range(num_samples)
            ]
        r_ids, r_mask, r_logprobs = self.engine.generate(
            ids,
            mask,
            blocks,
            num_samples=num_samples,
            eos_token_ids=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            seeds=row_seeds,
            **settings,
        )
        out: dict[str, Generation] = {}
        start = 0
        for agent in names:
            p_ids, p_mask = rows[agent]
            n = len(p_ids) * num_samples
            out[agent] = Generation(
                agent=agent,
                num_samples=num_samples,
                prompt_ids=p_ids.repeat_interleave(num_samples, 0),
                prompt_mask=p_mask.repeat_interleave(num_samples, 0),
                response_ids=r_ids[start : start + n],
                response_mask=r_mask[start : start + n],
                logprobs=r_logprobs[start : start + n],
            )
            start += n
        return out

    def _generate_seeded(
        self,
        rows: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
        num_samples: int,
        seeds: Sequence[int],
        settings: Mapping[str, Any],
    ) -> dict[str, Generation]:
        """The ``generate`` backend with per-row seeds: one prompt row (of every agent) at a time, each
        under its own seed in a forked RNG, its padding stripped to its own prompt."""
        from agents.engine import row_seed

        devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        parts = []
        for b, seed in enumerate(seeds):
            one = {}
            for agent, (ids, mask) in rows.items():
                keep = int(mask[b].sum())
                one[agent] = (ids[b : b + 1, ids.shape[1] - keep :], mask[b : b + 1, mask.shape[1] - keep :])
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(row_seed(int(seed), "", 0))
                parts.append(self._generate_hf(one, num_samples, settings))
        out = {}
        for agent in rows:
            gens = [part[agent] for part in parts]
            width = max(g.prompt_ids.shape[1] for g in gens)
            length = max(g.response_ids.shape[1] for g in gens)
            out[agent] = Generation(
                agent=agent,
                num_samples=num_samples,
                prompt_ids=torch.cat([_left_pad(g.prompt_ids, width, self.pad_token_id) for g in gens]),
                prompt_mask=torch.cat([_left_pad(g.prompt_mask, width, 0) for g in gens]),
                response_ids=torch.cat([_right_pad(g.response_ids, length, self.pad_token_id) for g in gens]),
                response_mask=torch.cat([_right_pad(g.response_mask, length, 0) for g in gens]),
                logprobs=torch.cat([_right_pad(g.logprobs, length, 0.0) for g in gens]),
            )
        return out

    def _generate_hf(
        self,
        rows: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
        num_samples: int,
        settings: Mapping[str, Any],
    ) -> dict[str, Generation]:
        rows = {
            a: (ids.repeat_interleave(num_samples, 0), m.repeat_interleave(num_samples, 0))
            for a, (ids, m) in rows.items()
        }
        if len(rows) > 1 and self.mixed_batches and self.lora is not None:
            groups = [list(rows)]
        else:
            groups = [[agent] for agent in rows]
        out: dict[str, Generation] = {}
        for group in groups:
            width = max(rows[a][0].shape[1] for a in group)
            ids = torch.cat([_left_pad(rows[a][0], width, self.pad_token_id) for a in group])
            mask = torch.cat([_left_pad(rows[a][1], width, 0) for a in group])
            names = [a for a in group for _ in range(len(rows[a][0]))]
            r_ids, r_mask, r_logprobs = self._sample(ids, mask, names, **settings)
            start = 0
            for agent in group:
                n = len(rows[agent][0])
                out[agent] = Generation(
                    agent=agent,
                    num_samples=num_samples,
                    prompt_ids=rows[agent][0],
                    prompt_mask=rows[agent][1],
                    response_ids=r_ids[start : start + n],
                    response_mask=r_mask[start : start + n],
                    logprobs=r_logprobs[start : start + n],
                )
                start += n
        return out

    @torch.no_grad()
    def _sample(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        agent_per_row: list[str],
        *,
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        top_k: int,
        repetition_penalty: float,
        greedy: bool,
        logprob_temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from transformers import GenerationConfig, LogitsProcessorList
        from transformers.generation.logits_process import (
            RepetitionPenaltyLogitsProcessor,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        recorder = _LogProbRecorder(logprob_temperature)
        # Our processors run after generate's own (none, with this config) and in this order; the
        # recorder comes first so it sees the raw logits.
        processors = LogitsProcessorList([recorder])
        if repetition_penalty != 1.0:
            processors.append(RepetitionPenaltyLogitsProcessor(repetition_penalty))
        if not greedy:
            if temperature != 1.0:
                processors.append(TemperatureLogitsWarper(temperature))
            if top_k > 0:
                processors.append(TopKLogitsWarper(top_k))
            if top_p < 1.0:
                processors.append(TopPLogitsWarper(top_p))
        # Neutral values set explicitly: generate fills unset ones from the model's generation config.
        config = GenerationConfig(
            do_sample=not greedy,
            max_new_tokens=max_new_tokens,
            temperature=1.0 if not greedy else None,
            top_k=0 if not greedy else None,
            top_p=1.0 if not greedy else None,
            repetition_penalty=1.0,
            pad_token_id=self.pad_token_id,
            eos_token_id=list(self.eos_token_ids),
        )
        kwargs: dict[str, Any] = {}
        distinct = sorted(set(agent_per_row))
        if self.lora is not None:
            if len(distinct) == 1:
                self._set_agent(distinct[0])
            else:
                kwargs["adapter_names"] = agent_per_row
        with self._eval_mode():
            sequences = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                generation_config=config,
                logits_processor=processors,
                **kwargs,
            )
        response = sequences[:, ids.shape[1] :]  # (N, T)
        logprobs = recorder.finish(response)
        is_eos = torch.isin(response, torch.tensor(self.eos_token_ids, device=response.device))
        after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
        response_mask = (~after_eos).long()
        response = response.masked_fill(after_eos, self.pad_token_id)
        return response, response_mask, logprobs.masked_fill(after_eos, 0.0)

    # ------------------------------------------------------------------ env interface
    def act(
        self,
        observations: Mapping[str, Any],
        agent: str | None = None,
        *,
        max_new_tokens: int | None = None,
        sampling: Sampling | None = None,
        env: Any = None,
    ) -> Any:
        """Env observations in, env actions out: ``env.step(policy.act(obs))``.

        - Parallel env: ``{agent: observation}`` -> ``{agent: action}``.
        - AEC env: ``policy.act(obs, agent=env.agent_selection)`` with one observation -> one action.
        - Vector env: the same with a leading N axis on every array -> N actions per agent.

        Observations may take every form the envs give:

        - Response mode (``step_unit="response"``), ``{"observation": (L,) ids, "attention_mask": (L,)}``:
          the action is the response ids, ``(max_new_tokens,)`` int64 padded with the pad (= EOS) id
          after its end. ``max_new_tokens`` must match the env's action length; it defaults to
          ``sampling.max_new_tokens``.
        - Token mode (``step_unit="token"``; the Dict also holds ``action_mask``): the action is one
          token id (an ``int``; an (N,) int64 array for a vector env), sampled from the agent's adapter
          after the observation (its prompt and its response so far) among the tokens the action mask
          allows. A row whose mask allows a single token (an agent that has finished or waits for its
          turn) gets that token without running the model; a sampled EOS is returned as the pad id,
          which ends the response in every env. Each call runs the whole observation (no KV cache
          between steps): convenient for generic MARL loops, not a fast decoder. ``max_new_tokens`` is
          not used.
        - Flat observations (``obs_format="flat"``, either step unit): pass ``env=`` the env or vector
          env the observations come from; its ``split_flat`` cuts them into the parts above.

        Only the columns that are padding in every row are dropped before generating, so the result
        does not depend on how much left padding the env adds.
        """
        settings = sampling if sampling is not None else self.sampling
        if not isinstance(settings, Sampling):
            raise TypeError(f"sampling must be a Sampling, got {settings!r}")
        length = settings.max_new_tokens if max_new_tokens is None else max_new_tokens
        if agent is not None:
            return self.act({agent: observations}, max_new_tokens=length, sampling=settings, env=env)[agent]
        if not isinstance(observations, Mapping):
            raise TypeError(f"observations must be a mapping agent -> observation, got {type(observations)}")
        if "observation" in observations and not isinstance(observations["observation"], Mapping):
            raise ValueError("got a single agent's observation dict; pass agent=<name> (AEC envs: env.agent_selection)")
        parts = {name: self._observation_parts(name, obs, env) for name, obs in observations.items()}
        if not parts:
            return {}
        token_mode = {name: "action_mask" in p for name, p in parts.items()}
        if len(set(token_mode.values())) > 1:
            raise ValueError(
                f"observations mix token mode (with action_mask) and response mode: {sorted(token_mode.items())}"
            )
        if next(iter(token_mode.values())):
            return self._act_tokens(parts, settings)
        prompts = {name: _strip_left(p["observation"], p["attention_mask"]) for name, p in parts.items()}
        generations = self.generate_joint(
            prompts,
            1,
            max_new_tokens=length,
            temperature=settings.temperature,
            top_p=settings.top_p,
            top_k=settings.top_k,
            repetition_penalty=settings.repetition_penalty,
            greedy=settings.greedy,
        )
        actions = {}
        for name, gen in generations.items():
            resp = gen.response_ids
            padded = resp.new_full((len(resp), length), self.pad_token_id)
            padded[:, : resp.shape[1]] = resp
            action = padded.cpu().numpy().astype(np.int64)
            actions[name] = action if parts[name]["batched"] else action[0]
        return actions

    def _observation_parts(self, name: str, obs: Any, env: Any) -> dict[str, Any]:
        """One agent's observation as (N, L) ``observation`` / ``attention_mask`` tensors, (N, V)
        ``action_mask`` in token mode, and whether it came batched."""
        self._check_agent(name)
        if not isinstance(obs, Mapping):
            if env is None or not hasattr(env, "split_flat"):
                raise ValueError(
                    f"observation of agent {name!r} is a flat array (obs_format='flat'): pass env=<the env or vector "
                    f"env it comes from> so that its split_flat can cut it into its parts, got env={env!r}"
                )
            obs = env.split_flat(np.asarray(obs))
        if "observation" not in obs or "attention_mask" not in obs:
            raise ValueError(
                f"observation of agent {name!r} must be a dict with 'observation' and 'attention_mask', "
                f"got {type(obs).__name__} with keys {list(obs)}"
            )
        ids = _to_tensor(obs["observation"], f"observation of agent {name!r}")
        mask = _to_tensor(obs["attention_mask"], f"attention_mask of agent {name!r}")
        if ids.dim() not in (1, 2):
            raise ValueError(f"observation of agent {name!r} must be (L,) or (N, L), got shape {tuple(ids.shape)}")
        if mask.shape != ids.shape:
            raise ValueError(
                f"attention_mask of agent {name!r} has shape {tuple(mask.shape)}, its observation {tuple(ids.shape)}"
            )
        out: dict[str, Any] = {
            "observation": ids.reshape(-1, ids.shape[-1]),
            "attention_mask": mask.reshape(-1, mask.shape[-1]),
            "batched": ids.dim() == 2,
        }
        if "action_mask" in obs:
            legal = _to_tensor(obs["action_mask"], f"action_mask of agent {name!r}")
            legal = legal.reshape(-1, legal.shape[-1])
            if len(legal) != len(out["observation"]) or legal.shape[-1] > self.vocab_size:
                raise ValueError(
                    f"action_mask of agent {name!r} has shape {tuple(legal.shape)}: expected one row of at most "
                    f"{self.vocab_size} entries per observation row ({len(out['observation'])})"
                )
            out["action_mask"] = legal != 0
        return out

    def _act_tokens(self, parts: Mapping[str, dict[str, Any]], settings: Sampling) -> dict[str, Any]:
        """Token mode: one token per row, within its action mask (see :meth:`act`)."""
        chosen: dict[str, np.ndarray] = {}
        prompts: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        open_rows: dict[str, torch.Tensor] = {}
        for name, p in parts.items():
            legal = p["action_mask"]
            allowed = legal.sum(-1)
            if (allowed == 0).any():
                row = int((allowed == 0).nonzero()[0, 0])
                raise ValueError(f"action_mask of agent {name!r} allows no token in row {row}")
            full = allowed == legal.shape[-1]
            partial = ~full & (allowed > 1)
            if partial.any():
                row = int(partial.nonzero()[0, 0])
                raise ValueError(
                    f"action_mask of agent {name!r} allows {int(allowed[row])} of {legal.shape[-1]} tokens in row "
                    f"{row}; act samples from masks that allow every token or exactly one (the envs' two masks)"
                )
            # Rows with one legal token take it; the others are sampled below.
            chosen[name] = legal.long().argmax(-1).cpu().numpy().astype(np.int64)
            rows = full.nonzero().flatten()
            if len(rows):
                open_rows[name] = rows
                prompts[name] = _strip_left(p["observation"][rows], p["attention_mask"][rows])
        if prompts:
            generations = self.generate_joint(
                prompts,
                1,
                max_new_tokens=1,
                temperature=settings.temperature,
                top_p=settings.top_p,
                top_k=settings.top_k,
                repetition_penalty=settings.repetition_penalty,
                greedy=settings.greedy,
            )
            eos = torch.tensor(self.eos_token_ids)
            for name, gen in generations.items():
                token = gen.response_ids[:, 0].cpu()
                token = torch.where(torch.isin(token, eos), torch.full_like(token, self.pad_token_id), token)
                chosen[name][open_rows[name].cpu().numpy()] = token.numpy()
        return {name: chosen[name] if parts[name]["batched"] else int(chosen[name][0]) for name in parts}

    # ------------------------------------------------------------------ checkpoints
    def _manifest(self) -> dict[str, Any]:
        config = self._causal_lm.config
        return {
            "format": CHECKPOINT_FORMAT,
            "agents": list(self.agents),
            "mode": "full" if self.lora is None else "lora",
            "lora": None if self.lora is None else _lora_json(self.lora),
            "value_head": self.value_heads is not None,
            "base_model": {
                "model_type": getattr(config, "model_type", None),
                "name_or_path": getattr(config, "_name_or_path", None),
                "vocab_size": self.vocab_size,
                "hidden_size": int(self._causal_lm.get_input_embeddings().embedding_dim),
            },
        }

    def _agent_state(self, agent: str) -> dict[str, torch.Tensor]:
        if self.lora is None:
            return {n: p for n, p in self.model.state_dict().items()}
        from peft import get_peft_model_state_dict

        return get_peft_model_state_dict(self.model, adapter_name=agent)

    def state(self, agents: Sequence[str] | None = None) -> dict[str, dict[str, torch.Tensor]]:
        """A copy of everything :meth:`save` writes, as ``{file name: {key: CPU tensor}}``: the trained
        state at one moment, which later updates do not change (``save(dir, state)`` writes it).
        ``agents``: only these agents' files (all by default)."""
        files: dict[str, dict[str, torch.Tensor]] = {}
        for agent in self.agents if agents is None else agents:
            self._check_agent(agent)
            state = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in self._agent_state(agent).items()}
            if self.lora is None:
                state = _untie(state)
            files[f"{agent}.adapter.safetensors"] = state
            if self.value_heads is not None:
                files[f"{agent}.value_head.safetensors"] = {
                    k: v.detach().to("cpu", copy=True).contiguous()
                    for k, v in self.value_heads[agent].state_dict().items()
                }
        return files

    def save(
        self, directory: str | os.PathLike[str], state: Mapping[str, Mapping[str, torch.Tensor]] | None = None
    ) -> Path:
        """Write each agent's adapter (``<agent>.adapter.safetensors``; the whole model under full
        fine-tuning) and value head, then ``policy.json`` naming agents and settings. Returns the dir.
        ``state``: a :meth:`state` taken earlier, written instead of the live weights."""
        from safetensors.torch import save_file

        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        files = self.state() if state is None else state
        for name, tensors in files.items():
            tmp = root / f".{name}.tmp"
            save_file(dict(tensors), str(tmp))
            os.replace(tmp, root / name)
        # The manifest goes last: a directory without it is an unfinished save.
        tmp = root / f".{MANIFEST_NAME}.tmp"
        tmp.write_text(json.dumps(self._manifest(), indent=2))
        os.replace(tmp, root / MANIFEST_NAME)
        return root

    def load(self, directory: str | os.PathLike[str]) -> None:
        """Load a :meth:`save` directory into this policy. Everything is read and checked (agent names,
        mode, LoRA settings, base model, tensor names and shapes) before any weight changes."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        root = Path(directory)
        manifest_path = root / MANIFEST_NAME
        if not manifest_path.is_file():
            raise FileNotFoundError(f"{manifest_path} not found: {str(root)!r} is not a saved policy")
        try:
            manifest = json.loads(manifest_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"corrupt checkpoint manifest {manifest_path}: {err}") from err
        if not isinstance(manifest, dict) or manifest.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{manifest_path} is not a {CHECKPOINT_FORMAT} manifest: {manifest!r:.200}")
        ours = self._manifest()
        if sorted(manifest.get("agents", [])) != sorted(self.agents):
            raise ValueError(
                f"checkpoint {str(root)!r} holds agents {manifest.get('agents')}, this policy has {list(self.agents)}"
            )
        for key in ("mode", "lora", "value_head", "base_model"):
            theirs, mine = manifest.get(key), ours[key]
            if key == "base_model" and isinstance(theirs, dict):
                # Same architecture is what matters; a renamed local copy of the model is fine.
                theirs = {k: v for k, v in theirs.items() if k != "name_or_path"}
                mine = {k: v for k, v in mine.items() if k != "name_or_path"}
            if theirs != mine:
                raise ValueError(f"checkpoint {str(root)!r} has {key}={theirs!r}, this policy has {key}={mine!r}")

        staged: dict[str, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]] = {}
        for agent in self.agents:
            parts = []
            for kind, expected in (
                ("adapter", self._agent_state(agent)),
                ("value_head", None if self.value_heads is None else self.value_heads[agent].state_dict()),
            ):
                if expected is None:
                    parts.append(None)
                    continue
                path = root / f"{agent}.{kind}.safetensors"
                try:
                    state = load_file(str(path), device="cpu")
                except FileNotFoundError as err:
                    raise FileNotFoundError(f"checkpoint file {path} is missing") from err
                except (SafetensorError, OSError, ValueError) as err:
                    raise ValueError(f"corrupt checkpoint file {path}: {err}") from err
                if self.lora is None:
                    state = _retie(state, expected)
                _check_state(path, state, expected)
                parts.append(state)
            staged[agent] = (parts[0], parts[1])

        with torch.no_grad():
            for agent, (adapter, head) in staged.items():
                if self.lora is None:
                    self.model.load_state_dict(adapter)
                else:
                    from peft import set_peft_model_state_dict

                    result = set_peft_model_state_dict(self.model, adapter, adapter_name=agent)
                    if result.unexpected_keys:
                        raise RuntimeError(f"PEFT did not place {result.unexpected_keys[:5]} for agent {agent!r}")
                if head is not None:
                    self.value_heads[agent].load_state_dict(head)
        # load_state_dict keeps the Parameter objects, so optimizers built earlier still hold them.
        active, self._active = self._active, None
        self._set_agent(active or self.agents[0])


def _check_temperature(value: Any, name: str = "temperature") -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a number > 0, got {value!r}")


def _check_agent_names(agents: Sequence[str]) -> tuple[str, ...]:
    if isinstance(agents, str) or not isinstance(agents, Sequence) or not agents:
        raise ValueError(f"agents must be a non-empty sequence of names, got {agents!r}")
    for name in agents:
        # PEFT keys adapters by name inside module paths, reserves "__base__" for "no adapter" in mixed
        # batches, and mistakes names contained in its "lora_" prefix for that prefix when loading.
        if not isinstance(name, str) or not name or "." in name or name == "__base__" or name in "lora_":
            raise ValueError(
                f"agent name {name!r} is not usable as an adapter name (a non-empty str without '.', not "
                "'__base__' and not part of 'lora_')"
            )
    if len(set(agents)) != len(agents):
        raise ValueError(f"agent names must be distinct, got {list(agents)}")
    return tuple(agents)


def _to_tensor(value: Any, what: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        tensor = value
    else:
        try:
            tensor = torch.as_tensor(np.asarray(value))
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"{what} must be an integer array, got {type(value).__name__}: {err}") from err
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise TypeError(f"{what} must hold integers, got dtype {tensor.dtype}")
    return tensor


def _strip_left(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop the leading columns that are padding in every row (envs left-pad to a fixed length)."""
    if ids.numel() == 0 or not mask.any():
        return ids, mask
    start = int((mask != 0).any(0).nonzero()[0, 0])
    return ids[:, start:], mask[:, start:]


def _left_pad(rows: torch.Tensor, width: int, value: int) -> torch.Tensor:
    if rows.shape[1] == width:
        return rows
    return torch.cat([rows.new_full((len(rows), width - rows.shape[1]), value), rows], dim=1)


def _right_pad(rows: torch.Tensor, width: int, value: float) -> torch.Tensor:
    if rows.shape[1] == width:
        return rows
    return torch.cat([rows, rows.new_full((len(rows), width - rows.shape[1]), value)], dim=1)


def _lora_json(lora: LoraSettings) -> dict[str, Any]:
    data = asdict(lora)
    if not isinstance(data["target_modules"], str):
        data["target_modules"] = list(data["target_modules"])
    return data


def _check_state(path: Path, state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> None:
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [
        f"{k}: {tuple(state[k].shape)} in the file, {tuple(expected[k].shape)} here"
        for k in sorted(set(state) & set(expected))
        if state[k].shape != expected[k].shape
    ]
    if missing or unexpected or wrong:
        raise ValueError(
            f"checkpoint file {path} does not fit this policy: missing {missing[:5]}, unexpected "
            f"{unexpected[:5]}, wrong shapes {wrong[:5]}"
        )


def _distinct_rows(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(first, index)`` for rows that repeat: ``first`` (U,) the first row of each distinct (ids, mask)
    row in order of appearance and ``index`` (N,) each row's position in ``first``; ``(None, None)``
    when every row is distinct.

    >>> _distinct_rows(torch.tensor([[1, 2], [3, 4], [1, 2]]), torch.ones(3, 2, dtype=torch.long))
    (tensor([0, 1]), tensor([0, 1, 0]))
    """
    if len(ids) < 2:
        return None, None
    _, inverse = torch.unique(torch.cat([ids, mask.to(ids.dtype)], dim=1), dim=0, return_inverse=True)
    if int(inverse.max()) + 1 == len(ids):
        return None, None
    first_of: dict[int, int] = {}
    for row, key in enumerate(inverse.tolist()):
        first_of.setdefault(key, row)
    order = {key: i for i, key in enumerate(first_of)}  # distinct rows in order of appearance
    first = torch.tensor(list(first_of.values()), device=ids.device)
    index = torch.tensor([order[key] for key in inverse.tolist()], device=ids.device)
    return first, index


def _untie(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share memory (tied embeddings): store each once."""
    seen: dict[int, str] = {}
    out = {}
    for key, tensor in state.items():
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in seen:
            continue
        seen[ptr] = key
        out[key] = tensor
    return out


def _retie(state: dict[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of :func:`_untie` against the live state dict: fill keys that alias a saved tensor."""
    ptrs = {tensor.untyped_storage().data_ptr(): key for key, tensor in expected.items() if key in state}
    out = dict(state)
    for key, tensor in expected.items():
        if key not in out:
            source = ptrs.get(tensor.untyped_storage().data_ptr())
            if source is not None:
                out[key] = state[source]
    return out
