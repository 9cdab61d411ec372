"""A team of bases: the agents of a policy grouped by the base model they sit on.

Agents that share a base model form a :class:`BaseGroup`: one PEFT-wrapped copy of the base with one
LoRA adapter per agent (each with its own rank and alpha), the group's tokenizer ids (pad, EOS,
vocabulary), its device and dtype, and its rollout engine (or ``transformers``' ``generate`` when the
engine does not support the architecture: that group only falls back). An agent fully fine-tuned
(``lora=None``) is a group of its own that owns a trainable copy of its base, with a frozen copy as
its reference. The reference policy of a LoRA agent is its own base with adapters disabled.

A policy with one base is a team of one group: every method takes the same path as before teams.

>>> from agents.team import team_of
>>> team_of(["a", "b", "c"], {"a": "m1", "b": "m2", "c": "m1"}, {"a": 1, "b": 1, "c": 1})
[('a', 'c'), ('b',)]
"""

from __future__ import annotations

import copy
import inspect
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from agents.settings import LoraSettings

ModelLike = Any
"""A ``transformers`` causal LM, or a model name / local path for :func:`agents.models.load_model`."""


def is_name(value: Any) -> bool:
    """Whether ``value`` names a model or tokenizer (an HF id or a local path) rather than being one."""
    return isinstance(value, (str, os.PathLike))


def per_agent(value: Any, agents: Sequence[str], what: str, kinds: tuple[type, ...] = ()) -> dict[str, Any]:
    """``value`` for every agent: a mapping agent -> value, or one value shared by all (a mapping that is
    an instance of ``kinds`` counts as one value). A mapping must name every agent and no other, so
    that a typo never silently trains an agent on the wrong model."""
    if isinstance(value, Mapping) and not (kinds and isinstance(value, kinds)):
        unknown = sorted(set(value) - set(agents))
        if unknown:
            raise ValueError(f"{what} names unknown agents {unknown}; this policy's agents are {list(agents)}")
        missing = [a for a in agents if a not in value]
        if missing:
            raise ValueError(f"{what} gives no value for agents {missing}; name every agent of {list(agents)}")
        return {a: value[a] for a in agents}
    return dict.fromkeys(agents, value)


def team_of(agents: Sequence[str], models: Mapping[str, Any], full: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """The groups of a team: LoRA agents (``full[a]`` truthy) that share a model object decode
    together; a fully fine-tuned agent (``full[a]`` falsy: ``lora=None``) is always a group of its own.
    Groups in the order of their first agent."""
    groups: dict[Any, list[str]] = {}
    for agent in agents:
        key = ("lora", id(models[agent])) if full[agent] else ("full", agent)
        groups.setdefault(key, []).append(agent)
    return [tuple(g) for g in groups.values()]


class BaseGroup:
    """One base model and the agents on it (see the module docs).

    Args:
        model: the causal LM (wrapped by PEFT in place unless ``lora`` is ``None``).
        tokenizer: the tokenizer the group's agents' envs speak.
        agents: the group's agents.
        lora: agent -> its adapter settings; ``None`` (a single agent) for full fine-tuning.
        backend: ``"auto"``, ``"engine"`` or ``"generate"`` (see :class:`agents.policy.MultiAgentPolicy`).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        agents: Sequence[str],
        lora: Mapping[str, LoraSettings] | None,
        backend: str,
    ) -> None:
        self.agents = tuple(agents)
        self.tokenizer = tokenizer
        self._tokenizer_record: dict[str, Any] | None = None
        self.lora = None if lora is None else dict(lora)
        """agent -> its LoRA settings, or ``None`` under full fine-tuning."""
        self.full = lora is None
        self.vocab_size = int(model.get_input_embeddings().num_embeddings)
        self.token_count = len(tokenizer)
        """The tokenizer's ids: the group samples and scores over ``[0, token_count)`` only. An embedding
        may have more rows (Qwen2.5: 151936 rows, 151665 tokens); the envs refuse those ids, so their
        logits are masked out of every distribution the group samples from or scores with."""
        names = ", ".join(repr(a) for a in self.agents)
        if self.token_count > self.vocab_size:
            raise ValueError(
                f"agent {names}: the tokenizer has {len(tokenizer)} tokens but the model's embedding has "
                f"{self.vocab_size} rows: they do not belong together (give each agent its own model's tokenizer)"
            )
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise ValueError(f"agent {names}: the tokenizer has neither a pad token nor an EOS token; set "
                             "tokenizer.pad_token")
        self.pad_token_id = int(pad)
        eos: set[int] = set()
        for source in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
            if isinstance(source, int):
                eos.add(source)
            elif source is not None:
                eos.update(int(i) for i in source)
        if not eos:
            raise ValueError(f"agent {names}: neither the tokenizer nor the model's generation config defines "
                             "an EOS token")
        if self.pad_token_id >= self.vocab_size:
            raise ValueError(
                f"agent {names}: the tokenizer's pad id {self.pad_token_id} lies outside the model's "
                f"{self.vocab_size}-token embedding: the tokenizer and the model do not belong together"
            )
        self.eos_token_ids: tuple[int, ...] = tuple(sorted(eos))

        self.device = next(model.parameters()).device
        self.dtype = model.get_input_embeddings().weight.dtype
        for param in model.parameters():
            param.requires_grad_(False)
        self.reference: Any = None
        if self.lora is None:
            self.reference = copy.deepcopy(model).eval()
            self.model = model
            self.causal_lm = model
            for param in model.parameters():
                param.requires_grad_(True)
        else:
            from peft import get_peft_model

            first = self.agents[0]
            with warnings.catch_warnings():
                # PEFT reads transformers' deprecated ``is_gradient_checkpointing``: a FutureWarning on
                # every run that the user can do nothing about.
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
                self.model = get_peft_model(model, self.lora[first].peft_config(), adapter_name=first)
            for name in self.agents[1:]:
                self.model.add_adapter(name, self.lora[name].peft_config())
            self.causal_lm = self.model.get_base_model()
        self.hidden_size = int(model.get_input_embeddings().embedding_dim)
        self.active: str | None = None
        self.adapter_params: dict[str, list[nn.Parameter]] = {a: self._collect_adapter_params(a) for a in self.agents}
        self.set_agent(self.agents[0])
        self.keeps_logits = "logits_to_keep" in inspect.signature(self.causal_lm.forward).parameters
        # LoRA's dropout modules: the only modules train() switches to training mode.
        self.lora_dropouts: list[nn.Module] = [
            module for name, module in self.model.named_modules() if name.rsplit(".", 2)[-2:-1] == ["lora_dropout"]
        ]
        self.dropout = self.lora is not None and any(s.dropout > 0 for s in self.lora.values())
        self.model.eval()

        from agents.engine import RolloutEngine, engine_support

        self.engine: RolloutEngine | None = None
        reason = engine_support(self.model) if backend != "generate" else "backend='generate' was chosen"
        if backend == "engine" and reason is not None:
            raise ValueError(f"backend='engine' cannot decode this model: {reason} (the base of agent {names}); "
                             "use backend='generate'")
        if reason is None:
            self.engine = RolloutEngine(self.model, trainable_base=self.lora is None)
        self.backend = "engine" if self.engine is not None else "generate"
        self.backend_reason = reason

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

    def set_agent(self, agent: str) -> None:
        if self.lora is None or agent == self.active:
            return
        self.model.set_adapter(agent)
        # PEFT freezes every adapter but the active one; each agent's optimizer holds its own adapter
        # and a forward only ever uses the active one, so keep them all trainable.
        for params in self.adapter_params.values():
            for param in params:
                param.requires_grad_(True)
        self.active = agent

    def apply_mode(self, dropout: bool) -> None:
        self.model.eval()
        if dropout:
            for module in self.lora_dropouts:
                module.train()

    def describe(self) -> dict[str, Any]:
        """The base and tokenizer as a checkpoint records them (:mod:`agents.persistence`)."""
        config = self.causal_lm.config
        return {
            "model_type": getattr(config, "model_type", None),
            "name_or_path": getattr(config, "_name_or_path", None),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
        }

    def tokenizer_record(self) -> dict[str, Any]:
        """The tokenizer's name, size and fingerprint (:func:`tokenizer_fingerprint`)."""
        if self._tokenizer_record is None:
            self._tokenizer_record = {
                "name_or_path": getattr(self.tokenizer, "name_or_path", None) or None,
                "size": len(self.tokenizer),
                "fingerprint": tokenizer_fingerprint(self.tokenizer),
            }
        return self._tokenizer_record


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A short hash of what decides a tokenizer's ids: its vocabulary (token -> id), pad and EOS ids.
    Two tokenizers with the same fingerprint turn the same text into the same ids."""
    import hashlib

    vocab = tokenizer.get_vocab()
    digest = hashlib.sha256()
    for token, index in sorted(vocab.items(), key=lambda kv: kv[1]):
        digest.update(f"{index}\t{token}\n".encode("utf-8", "surrogatepass"))
    digest.update(f"pad={tokenizer.pad_token_id} eos={tokenizer.eos_token_id}".encode())
    return digest.hexdigest()[:16]


def resolve_models(
    models: Mapping[str, ModelLike],
    dtype: str | torch.dtype | None,
    device: Mapping[str, Any],
) -> dict[str, Any]:
    """Model objects for every agent: names and paths loaded with :func:`agents.models.load_model`
    once per (name, device) so that agents naming the same model share one base."""
    from agents.models import load_model

    loaded: dict[tuple[str, str], Any] = {}
    out = {}
    for agent, model in models.items():
        if model is None or is_name(model):
            key = (str(model), str(device[agent]))
            if key not in loaded:
                loaded[key] = load_model(model, dtype=dtype, device=device[agent])
            out[agent] = loaded[key]
        else:
            out[agent] = model
    return out
