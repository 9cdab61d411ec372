"""What an agent does: its action (token ids, or a string) checked and turned into a response, or in
token mode one token at a time against its action mask. A mixin of :class:`~llm_envs.core.base.LLMEnvCore`,
which holds the state it reads; the protocols say who is composing (``_composing``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from llm_envs.core.agent_tokens import MixedTokenizersError as MixedTokenizersError
from llm_envs.core.agent_tokens import _short
from llm_envs.core.task import (
    Response,
)


class Actions:
    """Mixin of :class:`~llm_envs.core.base.LLMEnvCore`: actions and token mode."""

    # ------------------------------------------------------------------------------ token mode
    def _composing(self, agent: str) -> bool:
        """Whether ``agent`` is writing a response now (its action mask is open). Protocols override."""
        raise NotImplementedError

    def action_mask(self, agent: str) -> np.ndarray:
        """Token mode: the agent's legal tokens now, an int8 array of length V (all ones while it is
        composing a response; only the pad id otherwise)."""
        self._check_agent_name(agent)
        if self.step_unit != "token":
            raise RuntimeError("action_mask() exists in token mode only; make the env with step_unit='token'.")
        self._require_started()
        record = self._agent_tokens[agent]
        return (record.mask_open if self._composing(agent) else record.mask_wait).copy()

    def parse_token(self, agent: str, action: Any) -> int:
        """Token mode: validate one action (a single token id) of ``agent`` against its range and its
        action mask. Raises ``TypeError``/``ValueError`` naming the agent and the value; changes nothing."""
        record = self._agent_tokens[agent]
        V = record.vocab_size
        if isinstance(action, (int, np.integer)) and not isinstance(action, (bool, np.bool_)):
            token = int(action)
        elif isinstance(action, np.ndarray) and action.ndim == 0 and np.issubdtype(action.dtype, np.integer):
            token = int(action)
        else:
            raise TypeError(
                f"Action of agent {agent!r} must be one token id (an int in [0, {V - 1}]) with step_unit='token', "
                f"got {type(action).__name__}: {_short(action)}."
            )
        if not 0 <= token < V:
            raise ValueError(f"Action of agent {agent!r} is token id {token}, out of range [0, {V - 1}].")
        if token != record.pad_token_id and not self._composing(agent):
            raise ValueError(
                f"Agent {agent!r} is not composing a response now (it has finished this turn's response or it "
                f"is not its turn): its action mask allows only the pad id {record.pad_token_id}, got {token}."
            )
        return token

    def check_action(self, agent: str, action: Any) -> None:
        """Validate one agent's action for the current step unit without changing the env."""
        if self.step_unit == "token":
            self.parse_token(agent, action)
        else:
            self.parse_action(agent, action)

    def _push_token(self, agent: str, token: int) -> Response | None:
        """Add a validated token to the agent's response; the Response once it has ended, else None."""
        ids = self._response_ids[agent]
        if token not in self._agent_tokens[agent].stop_token_ids:
            ids.append(token)
            if len(ids) < self.max_new_tokens:
                return None
        response = self._make_response(agent, ids)
        self._finished[agent] = response
        return response

    # ------------------------------------------------------------------------------ actions
    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeError("Call reset() before step() (or before reading observations and text).")

    def parse_action(self, agent: str, action: Any) -> Response:
        """Validate an action (token ids, or a string to tokenize) and turn it into a Response.

        Token ids: a 1-D integer array (or list) of at most ``max_new_tokens`` ids in ``[0, V-1]`` (V and
        the tokenizer are the agent's own); everything from the first EOS/pad id on is ignored. Raises
        ``ValueError``/``TypeError`` naming the agent and the value; nothing in the env changes.
        """
        record = self._agent_tokens[agent]
        T, V = self.max_new_tokens, record.vocab_size
        if isinstance(action, str):
            ids = self._encode_text(action, agent)
            if len(ids) > T:
                raise ValueError(
                    f"Action of agent {agent!r}: the text is {len(ids)} tokens long, more than "
                    f"max_new_tokens={T}. Shorten it or make the env with a larger max_new_tokens."
                )
        else:
            if action is None:
                raise TypeError(
                    f"Action of agent {agent!r} is None; a live agent must act with token ids or a string."
                )
            arr = np.asarray(action)
            if arr.dtype == object or not (np.issubdtype(arr.dtype, np.integer)):
                raise TypeError(
                    f"Action of agent {agent!r} must hold integer token ids (or be a str), got dtype "
                    f"{arr.dtype}: {_short(action)}."
                )
            if arr.ndim != 1 or arr.shape[0] > T:
                raise ValueError(
                    f"Action of agent {agent!r} must be a 1-D array of at most max_new_tokens={T} token ids, "
                    f"got shape {arr.shape}."
                )
            if arr.size and (arr.min() < 0 or arr.max() >= V):
                bad = arr[(arr < 0) | (arr >= V)]
                raise ValueError(
                    f"Action of agent {agent!r} has token ids out of range [0, {V - 1}]: {bad[:5].tolist()}."
                )
            ids = arr.tolist()
        stops = record.stop_token_ids
        end = next((i for i, t in enumerate(ids) if t in stops), len(ids))
        return self._make_response(agent, ids[:end])

    def _make_response(self, agent: str, ids: Sequence[int]) -> Response:
        tok = self._agent_tokens[agent].handle.tokenizer
        text = tok.decode(list(ids), skip_special_tokens=True) if ids else ""
        return Response(ids=tuple(int(t) for t in ids), text=text, agent=agent)
