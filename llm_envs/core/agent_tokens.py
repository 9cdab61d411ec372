"""Each agent's tokenizer and what an env derives from it (vocabulary size, pad id, stop ids, chat
template): :class:`AgentTokens`, and :class:`AgentTokenizers`, the env's side of it (resolving the
``tokenizer`` and ``stop_token_ids`` arguments, and answering per agent or, where the agents agree, for
all of them). See "A tokenizer per agent" in :mod:`llm_envs.core.base`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from llm_envs.tokenizers import TokenizerHandle


def _check_stop_ids(ids: Any, vocab_size: int, name: str = "stop_token_ids") -> list[int]:
    if ids is None:
        return []
    if isinstance(ids, (str, bytes)) or not isinstance(ids, (Sequence, set, frozenset, np.ndarray)):
        raise ValueError(f"{name} must be a sequence of token ids, got {ids!r}.")
    out = []
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab_size:
            raise ValueError(f"{name} must hold token ids in [0, {vocab_size - 1}], got {t!r} in {ids!r}.")
        out.append(int(t))
    return out


def _check_agent_keys(name: str, mapping: Mapping[Any, Any], agents: Sequence[str], every: bool) -> None:
    """A per-agent mapping must use the env's agent names (all of them when ``every``)."""
    unknown = [k for k in mapping if k not in agents]
    missing = [a for a in agents if a not in mapping] if every else []
    if unknown or missing:
        need = "exactly" if every else "only"
        raise ValueError(
            f"{name} as a mapping must name {need} the env's agents {list(agents)}; got unknown {unknown}"
            + (f", missing {missing}" if every else "") + "."
        )


class MixedTokenizersError(RuntimeError):
    """Asked an env whose agents have different tokenizers for the one tokenizer (or vocabulary size,
    pad id, ...) of all its agents: ask per agent instead (``env.tokenizer_of(agent)``, ...)."""


class AgentTokens:
    """One agent's tokenizer and what the env derives from it: vocabulary size V, pad id, stop ids
    (EOS, pad and any extra ``stop_token_ids``) and whether its prompts get the chat template. Agents
    with the same tokenizer and stop ids share one object."""

    def __init__(self, handle: TokenizerHandle, pad_token_id: int, stop_token_ids: frozenset[int],
                 chat_template: bool, token_mode: bool) -> None:
        self.handle = handle
        self.vocab_size = len(handle.tokenizer)
        self.pad_token_id = pad_token_id
        self.stop_token_ids = stop_token_ids
        self.chat_template = chat_template
        if token_mode:
            self.mask_open = np.ones(self.vocab_size, np.int8)
            self.mask_wait = np.zeros(self.vocab_size, np.int8)
            self.mask_wait[pad_token_id] = 1
            for arr in (self.mask_open, self.mask_wait):
                arr.flags.writeable = False

    @property
    def tokenizer(self) -> Any:
        return self.handle.tokenizer


class SharedTokenValues:
    """The single-tokenizer forms of the per-agent values (``vocab_size`` for ``vocab_size_of(agent)``, ...): the
    local env's and the remote env's (:mod:`llm_envs.remote`), each with its own ``_shared_value(name)``."""

    def _shared_value(self, name: str) -> Any:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        """V, when every agent has the same (else :class:`MixedTokenizersError`: see :meth:`vocab_size_of`)."""
        return self._shared_value("vocab_size")

    @property
    def pad_token_id(self) -> int:
        """The pad id, when every agent has the same (else see :meth:`pad_token_id_of`)."""
        return self._shared_value("pad_token_id")

    @property
    def stop_token_ids(self) -> frozenset[int]:
        """The stop ids, when every agent has the same (else see :meth:`stop_token_ids_of`)."""
        return self._shared_value("stop_token_ids")

    @property
    def chat_template(self) -> bool:
        """Whether prompts get the chat template, when that holds for every agent (else see
        :meth:`chat_template_of`)."""
        return self._shared_value("chat_template")


class AgentTokenizers(SharedTokenValues):
    """Mixin of :class:`~llm_envs.core.base.LLMEnvCore`: the agents' tokenizers. The env sets
    ``_agent_tokens`` (from :meth:`_resolve_tokenizers`), ``_tok`` (the one tokenizer of all agents, or
    None) and ``_shared`` (the values every agent has in common)."""

    possible_agents: list[str]
    env_id: str
    task: Any
    _agent_tokens: dict[str, AgentTokens]
    _tok: TokenizerHandle | None
    _shared: dict[str, Any]

    def _resolve_tokenizers(
        self, tokenizer: Any, stop_token_ids: Any, chat_template: bool | None, token_mode: bool
    ) -> dict[str, AgentTokens]:
        """Each agent's :class:`AgentTokens`, from one tokenizer spec or a mapping agent -> spec. Every
        key and value is checked before the env keeps anything."""
        agents = self.possible_agents
        team = isinstance(tokenizer, Mapping)
        if team:
            _check_agent_keys("tokenizer", tokenizer, agents, every=True)
        if isinstance(stop_token_ids, Mapping):
            _check_agent_keys("stop_token_ids", stop_token_ids, agents, every=False)
        handles: dict[str, TokenizerHandle] = {}
        if team:
            by_object: dict[int, TokenizerHandle] = {}
            for agent in agents:
                try:
                    handle = TokenizerHandle(tokenizer[agent])
                except OSError as err:
                    raise OSError(f"The tokenizer of agent {agent!r}: {err}") from err
                # Agents given the same tokenizer (object, or name through the process cache) share it.
                handles[agent] = by_object.setdefault(id(handle.tokenizer), handle)
        else:
            handles = dict.fromkeys(agents, TokenizerHandle(tokenizer))
        mixed = len({id(h) for h in handles.values()}) > 1
        if mixed and stop_token_ids is not None and not isinstance(stop_token_ids, Mapping):
            raise ValueError(
                f"The agents of this env have different tokenizers, so stop_token_ids must be a mapping "
                f"{{agent: token ids}} (agents {agents}), got {_short(stop_token_ids)}."
            )
        records: dict[str, AgentTokens] = {}
        shared_records: dict[tuple[int, frozenset[int]], AgentTokens] = {}
        for agent in agents:
            handle = handles[agent]
            tok = handle.tokenizer
            whose = f"The tokenizer of agent {agent!r}" if mixed else "The tokenizer"
            eos, pad = tok.eos_token_id, tok.pad_token_id
            if pad is None:
                pad = eos
            if pad is None:
                raise ValueError(
                    f"{whose} has neither a pad nor an EOS token; set "
                    f"{'its' if mixed else 'tokenizer.'}pad_token before making the env."
                )
            if isinstance(stop_token_ids, Mapping):
                extra = _check_stop_ids(stop_token_ids.get(agent), len(tok), f"stop_token_ids[{agent!r}]")
            else:
                extra = _check_stop_ids(stop_token_ids, len(tok))
            stops = frozenset([int(t) for t in (eos, pad) if t is not None] + extra)
            has_template = bool(getattr(tok, "chat_template", None))
            if chat_template and not has_template:
                if mixed:
                    raise ValueError(
                        f"chat_template=True but the tokenizer of agent {agent!r} has no chat template; leave "
                        "chat_template unset to apply each agent's template where its tokenizer has one."
                    )
                raise ValueError("chat_template=True but the tokenizer has no chat template.")
            wanted = self.task.use_chat_template if chat_template is None else chat_template
            key = (id(handle), stops)
            if key not in shared_records:
                shared_records[key] = AgentTokens(handle, int(pad), stops, bool(wanted and has_template), token_mode)
            records[agent] = shared_records[key]
        return records

    # ----------------------------------------------------------------------------------- tokenizer
    @property
    def tokenizer(self) -> Any:
        """The tokenizer this env encodes prompts and decodes actions with (read-only): the same object
        the env uses, so ``env.tokenizer.decode(obs["observation"][mask == 1])`` is the prompt as text
        and ``env.tokenizer(text, add_special_tokens=False)["input_ids"]`` is a response as token ids.
        Copies of an env (``copy.deepcopy``, vector envs) share it. When the agents have different
        tokenizers there is no one tokenizer: this raises :class:`MixedTokenizersError`; use
        :meth:`tokenizer_of` or :attr:`tokenizers`."""
        if self._tok is None:
            raise MixedTokenizersError(
                f"The agents of env {self.env_id} have different tokenizers "
                f"({self._describe_tokenizers()}): use env.tokenizer_of(agent) or env.tokenizers."
            )
        return self._tok.tokenizer

    @property
    def tokenizers(self) -> dict[str, Any]:
        """Each agent's tokenizer, ``{agent: tokenizer}`` (a new dict; the objects are the env's own)."""
        return {a: r.handle.tokenizer for a, r in self._agent_tokens.items()}

    @property
    def mixed_tokenizers(self) -> bool:
        """Whether the agents have different tokenizers (then :attr:`tokenizer`, :attr:`vocab_size`, ...
        may raise :class:`MixedTokenizersError`: ask per agent)."""
        return self._tok is None

    def tokenizer_of(self, agent: str) -> Any:
        """The tokenizer ``agent``'s observations are encoded with and its actions decoded with."""
        self._check_agent_name(agent)
        return self._agent_tokens[agent].handle.tokenizer

    def tokenizer_name_of(self, agent: str) -> str | None:
        """The name or path ``agent``'s tokenizer was given by (the embedded default's name), None where it was
        given as an object (an env pickles a named tokenizer as its name, an object by value)."""
        self._check_agent_name(agent)
        return self._agent_tokens[agent].handle.spec

    def vocab_size_of(self, agent: str) -> int:
        """V of ``agent``: its observations' ids and its actions lie in ``[0, V-1]``."""
        self._check_agent_name(agent)
        return self._agent_tokens[agent].vocab_size

    def pad_token_id_of(self, agent: str) -> int:
        """The id ``agent``'s observations are left-padded with (its tokenizer's pad id, else EOS)."""
        self._check_agent_name(agent)
        return self._agent_tokens[agent].pad_token_id

    def stop_token_ids_of(self, agent: str) -> frozenset[int]:
        """The ids that end ``agent``'s response: its tokenizer's EOS and pad, and its ``stop_token_ids``."""
        self._check_agent_name(agent)
        return self._agent_tokens[agent].stop_token_ids

    def chat_template_of(self, agent: str) -> bool:
        """Whether ``agent``'s prompts are rendered with its tokenizer's chat template."""
        self._check_agent_name(agent)
        return self._agent_tokens[agent].chat_template

    def _shared_value(self, name: str) -> Any:
        try:
            return self._shared[name]
        except KeyError:
            per_agent = {a: getattr(r, name) for a, r in self._agent_tokens.items()}
            raise MixedTokenizersError(
                f"The agents of env {self.env_id} have different tokenizers, and their {name} differs "
                f"({_short(per_agent, 200)}): use env.{name}_of(agent)."
            ) from None

    def _describe_tokenizers(self) -> str:
        return ", ".join(
            f"{a}: {r.handle.spec or type(r.handle.tokenizer).__name__} (V={r.vocab_size})"
            for a, r in self._agent_tokens.items()
        )

    def _check_agent_name(self, agent: Any) -> None:
        """Raise ``KeyError`` for a name that is not one of the env's agents (the env's own check)."""
        raise NotImplementedError


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
