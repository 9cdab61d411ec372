"""The global state (PettingZoo's ``state()`` and ``state_space``): the joint context a centralised critic
reads, the same for every agent, on every env of either protocol.

=====================  ==========================================================================
What it holds          the problem's prompt, how many turns are finished, and every role's latest
                       response, in role order (:func:`joint_context`)
Tokenizer              the first role's (``env.state_tokenizer``): the env's own when all roles share
                       one; a role with another tokenizer is read as its text re-encoded with it
Space                  ``Dict(observation=Box(0, V-1, (S,), int64), attention_mask=Box(0, 1, (S,), int8))``,
                       left-padded with that tokenizer's pad id; ``obs_format="flat"``: one int64 vector,
                       ids then mask, ``Box(0, high, (2S,), int64)`` (:meth:`GlobalState.split_flat_state`)
Length                 ``S = env.state_length = max_prompt_tokens + N x (max_new_tokens + STATE_ROLE_TOKENS)
                       + STATE_HEADER_TOKENS`` for N roles
Truncation             from the left: a longer state keeps its last S tokens
Text                   ``env.state_text()``: the state's ids decoded (special tokens kept), as ``env.text(agent)``
                       is an observation's
=====================  ==========================================================================

**The problem's prompt** is the problem's ``"prompt"`` field where it has a text one (HumanEval-style
problems), else the first role's first prompt as text, before any chat template: the problem statement
the transitions get (:func:`llm_envs.transitions.problem_statement`). It is fixed for the episode.

**A role's latest response** is the one it is writing or wrote in the current turn, else its response
of the last finished turn, else none yet. So under the parallel protocol the state after each turn
shows that turn's responses; under the sequential protocol a role that acted this turn shows its new
response and a later role its previous one; in token mode (``step_unit="token"``) a role's response so
far replaces its previous one from its first token on, marked as being written. Each response's header
names its turn. At every turn boundary the state of token mode is the state of whole responses.

**Why the first role's tokenizer.** A critic reads one sequence in one vocabulary; a team of two
tokenizers has no common one, so the state takes the first role's (the model a centralised critic
usually sits on, as MAAC's does) and, as everywhere in the env, text is the interface: the other
roles' responses are spliced in as their text encoded with it (as their own ids where their tokenizer is
the state's). ``env.state_tokenizer`` is that tokenizer; ``env.tokenizer`` raises on a mixed team.

**Why the length.** The problem's prompt fits ``max_prompt_tokens`` (the first role's first prompt,
which holds it, must fit it unless ``prompt_overflow="truncate_left"``) and each response
``max_new_tokens``; each role's header and the state's own lines get :data:`STATE_ROLE_TOKENS` and
:data:`STATE_HEADER_TOKENS`. A state outgrows S only when a prompt was itself truncated or a response
re-encoded in another tokenizer takes more tokens than its writer's.

**Why truncate from the left.** The responses, the only part that changes within an episode, come
last, so a left cut keeps them whole and drops the start of the problem's prompt first; a causal LM
critic reads its value at the last position, which stays the end of the latest response; and it is
what ``prompt_overflow="truncate_left"`` does to observations.

The state is not an agent's observation: it has no ``action_mask`` in token mode and is not in
``infos``. The same seed and actions give the same states (``llm_envs.testing``' ``state`` check).

>>> import llm_envs
>>> env = llm_envs.make("writing/xsum-v0", max_new_tokens=16)
>>> obs, infos = env.reset(seed=0)
>>> state = env.state()
>>> sorted(state), state["observation"].shape == (env.state_length,), env.state_space is env.state_space
(['attention_mask', 'observation'], True, True)
>>> _ = env.step({"brief": "Wealth matters more now.", "detailed": "Parents' wealth shapes the young."})
>>> text = env.state_text()
>>> print(text[text.index("Turns finished"):])
Turns finished: 1 of 1.
<BLANKLINE>
Response of brief (turn 1):
Wealth matters more now.
<BLANKLINE>
Response of detailed (turn 1):
Parents' wealth shapes the young.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from gymnasium import spaces

from llm_envs.core.task import Context, Prompt, Response

STATE_PROBLEM = "Problem:\n"
"""The state's first line; the problem's prompt follows it."""
STATE_TURNS = "\n\nTurns finished: {finished} of {num_turns}."
STATE_RESPONSE = "\n\nResponse of {role} (turn {turn}):\n"
"""The header before a role's finished response (``turn`` counts from 1)."""
STATE_RESPONSE_WRITING = "\n\nResponse of {role} (turn {turn}, being written):\n"
"""Token mode: the header before a response that its role is still writing."""
STATE_NO_RESPONSE = "\n\nResponse of {role}: none yet."
STATE_ROLE_TOKENS = 64
"""Room in the state's length for each role's header (a near byte-level tokenizer spends one token a character)."""
STATE_HEADER_TOKENS = 64
"""Room in the state's length for its first lines (``Problem:``, the turns finished)."""


@dataclass(frozen=True)
class LatestResponse:
    """A role's latest response in a state: ``response`` of turn ``turn`` (counted from 0); ``finished`` is
    False while its role is still writing it (token mode)."""

    response: Response
    turn: int
    finished: bool = True


def joint_context(problem: str, roles: Sequence[str], latest: Mapping[str, LatestResponse | None],
                  finished_turns: int, num_turns: int) -> list[str | Response]:
    """The global state as prompt parts (strings and the responses, in ``roles`` order): the problem's
    prompt, the turns finished, then each role's latest response under a header naming its role and turn
    (a role missing from ``latest`` has none yet). Torch-free and tokenizer-free: an env encodes it with
    its state tokenizer (a :class:`Response` as its ids where the tokenizer is its writer's, else as its
    text), and a learner may encode it with its critic's.

    >>> parts = joint_context("Add 2 and 2.", ["a", "b"], {"a": LatestResponse(Response((), "4"), 0)}, 1, 2)
    >>> print(context_text(parts))
    Problem:
    Add 2 and 2.
    <BLANKLINE>
    Turns finished: 1 of 2.
    <BLANKLINE>
    Response of a (turn 1):
    4
    <BLANKLINE>
    Response of b: none yet.
    """
    parts: list[str | Response] = [STATE_PROBLEM, problem, STATE_TURNS.format(finished=finished_turns,
                                                                             num_turns=num_turns)]
    for role in roles:
        entry = latest.get(role)
        if entry is None:
            parts.append(STATE_NO_RESPONSE.format(role=role))
            continue
        header = STATE_RESPONSE if entry.finished else STATE_RESPONSE_WRITING
        parts += [header.format(role=role, turn=entry.turn + 1), entry.response]
    return parts


def context_text(parts: Prompt) -> str:
    """Prompt parts (or a prompt string) as one text: each :class:`Response` as its text."""
    if isinstance(parts, str):
        return parts
    return "".join(p if isinstance(p, str) else p.text for p in parts)


def build_state_space(S: int, V: int, obs_format: str) -> spaces.Space:
    """The state's space: S positions of ids below V and their mask (a Dict, or one flat int64 Box)."""
    if obs_format == "flat":
        high = np.concatenate([np.full(S, V - 1, np.int64), np.ones(S, np.int64)])
        return spaces.Box(np.zeros_like(high), high, dtype=np.int64)
    return spaces.Dict({
        "observation": spaces.Box(0, V - 1, (S,), np.int64),
        "attention_mask": spaces.Box(0, 1, (S,), np.int8),
    })


def state_length(max_prompt_tokens: int, max_new_tokens: int, num_roles: int) -> int:
    """S, the length of a state's ids (module docstring).

    >>> state_length(2048, 256, 2)
    2752
    """
    return max_prompt_tokens + num_roles * (max_new_tokens + STATE_ROLE_TOKENS) + STATE_HEADER_TOKENS


class GlobalState:
    """Mixin of :class:`~llm_envs.core.base.LLMEnvCore`: ``state()``, ``state_space``, ``state_text()``
    (see the module docstring). The env calls :meth:`_init_state` once its agents' tokenizers are known
    and :meth:`_reset_state` at each reset."""

    possible_agents: list[str]
    num_turns: int
    max_prompt_tokens: int
    max_new_tokens: int
    obs_format: str
    step_unit: str
    task: Any
    _agent_tokens: dict[str, Any]
    _started: bool
    _problem: Any
    _turn: int
    _history: list[Any]
    _visible: dict[str, Response]
    _finished: dict[str, Response]
    _response_ids: dict[str, list[int]]

    def _init_state(self) -> None:
        self.state_length = state_length(self.max_prompt_tokens, self.max_new_tokens, len(self.possible_agents))
        self._state_space: spaces.Space | None = None
        self._reset_state()

    @property
    def state_space(self) -> spaces.Space:
        """The space of :meth:`state`: the same object on every access (built on the first; a pickled or copied
        env builds its own, so that its S-long bounds do not travel with it)."""
        if self._state_space is None:
            V = self._agent_tokens[self.possible_agents[0]].vocab_size
            self._state_space = build_state_space(self.state_length, V, self.obs_format)
        return self._state_space

    def _reset_state(self) -> None:
        """A new episode: its problem's prompt and the encoded pieces are found again when first asked."""
        self._state_problem: str | None = None
        self._state_pieces: dict[str, list[int]] = {}

    @property
    def state_tokenizer(self) -> Any:
        """The tokenizer of the state's ids: the first role's (every role's, when they share one)."""
        return self._agent_tokens[self.possible_agents[0]].handle.tokenizer

    def _require_state(self) -> None:
        if not self._started:
            raise RuntimeError("Call reset() before state(): the state is the current episode's problem and "
                               "responses.")

    def state(self) -> Any:
        """The global state now (module docstring): ``{"observation": ids, "attention_mask": mask}`` (int64
        and int8, length ``state_length``, left-padded with the state tokenizer's pad id), or with
        ``obs_format="flat"`` the two concatenated as one int64 vector. New arrays on every call."""
        self._require_state()
        S = self.state_length
        ids = self._state_ids()[-S:]
        n = len(ids)
        obs = np.full(S, self._agent_tokens[self.possible_agents[0]].pad_token_id, dtype=np.int64)
        mask = np.zeros(S, dtype=np.int8)
        if n:
            obs[S - n :] = ids
            mask[S - n :] = 1
        if self.obs_format == "flat":
            return np.concatenate([obs, mask], dtype=np.int64)
        return {"observation": obs, "attention_mask": mask}

    def state_text(self) -> str:
        """The state as text: its ids decoded with the state tokenizer, special tokens kept (after a left
        truncation, the text of the tokens kept)."""
        self._require_state()
        ids = self._state_ids()[-self.state_length :]
        return self.state_tokenizer.decode(ids, skip_special_tokens=False)

    def split_flat_state(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Cut a flat state (``obs_format="flat"``, any leading batch axes) into ``observation`` and
        ``attention_mask`` (views)."""
        arr = np.asarray(flat)
        S = self.state_length
        if arr.shape[-1:] != (2 * S,):
            raise ValueError(f"A flat state of this env has {2 * S} entries on its last axis, got shape {arr.shape}.")
        return {"observation": arr[..., :S], "attention_mask": arr[..., S:]}

    # ---------------------------------------------------------------------------------- assembly
    def joint_context(self) -> list[str | Response]:
        """The state as prompt parts (:func:`joint_context` of this env's problem and latest responses)."""
        self._require_state()
        latest = {role: self._latest_response(role) for role in self.possible_agents}
        return joint_context(self._problem_statement(), self.possible_agents, latest, len(self._history),
                             self.num_turns)

    def problem_statement(self) -> str:
        """The problem's prompt the state opens with (and the transitions get): the problem's ``"prompt"`` field
        where it has a text one, else the first role's first prompt as text (no chat template)."""
        self._require_state()
        return self._problem_statement()

    def _problem_statement(self) -> str:
        from llm_envs import transitions

        if self._state_problem is None:
            first = self.possible_agents[0]
            prompt = self.task.prompt(first, self._problem, Context(turn=0, num_turns=self.num_turns))
            self._state_problem = transitions.problem_statement(self._problem, context_text(prompt))
        return self._state_problem

    def _latest_response(self, role: str) -> LatestResponse | None:
        turn = len(self._history)
        if role in self._visible:
            return LatestResponse(self._visible[role], turn)
        if role in self._finished:
            return LatestResponse(self._finished[role], turn)
        so_far = self._response_ids.get(role)
        if so_far:
            tok = self._agent_tokens[role].handle.tokenizer
            text = tok.decode(so_far, skip_special_tokens=True)
            return LatestResponse(Response(ids=tuple(so_far), text=text, agent=role), turn, finished=False)
        if self._history:
            return LatestResponse(self._history[-1].outputs[role], turn - 1)
        return None

    def _state_ids(self) -> list[int]:
        """The state's token ids before truncation: each text piece encoded on its own (the first with the
        tokenizer's special prefix, e.g. BOS) and cached for the episode; each response as the first role
        reads it (:meth:`_response_ids_for`)."""
        reader = self.possible_agents[0]
        ids: list[int] = []
        for i, part in enumerate(self.joint_context()):
            if isinstance(part, Response):
                ids.extend(self._response_ids_for(part, reader))  # type: ignore[attr-defined]
                continue
            if part not in self._state_pieces:
                tok = self.state_tokenizer
                self._state_pieces[part] = list(tok(part, add_special_tokens=(i == 0))["input_ids"])
            ids.extend(self._state_pieces[part])
        return ids
