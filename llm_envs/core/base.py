"""What both protocols share: turning a task's text into token-id observations and token-id actions
into responses, resolving a turn into rewards and feedback, infos, the transcript and rendering.

The protocol classes (:mod:`llm_envs.core.parallel`, :mod:`llm_envs.core.sequential`) only decide
who acts when and who sees what. Three parts of the env live in files of their own and are
mixed into :class:`LLMEnvCore`: the agents' tokenizers (:mod:`llm_envs.core.agent_tokens`), the
transcript (:mod:`llm_envs.core.transcript`) and the global state, ``state()`` and ``state_space``
(:mod:`llm_envs.core.state`).

Step units and observation formats
----------------------------------
``step_unit="response"`` (default): one step is one whole response per acting agent. Observations
have length ``L = max_prompt_tokens``; actions are ``Box(0, V-1, (max_new_tokens,), int64)``.

``step_unit="token"``: one step is one token per acting agent, so every task is a plain
discrete-action env. Actions are ``Discrete(V)``. The observation is the agent's prompt followed by
its response so far, left-padded to ``L = max_prompt_tokens + max_new_tokens``: a prompt that fits in
response mode fits in token mode too (so ``prompt_overflow`` behaves the same), the latest token is
always the last position (a causal LM reads its next-token logits there), and the layout never
shifts between a turn's first and last step. The Dict gains ``action_mask=Box(0, 1, (V,), int8)``
(PettingZoo's convention): all ones while the agent is composing its response; only the pad id
once its response has ended (at EOS/pad, or after ``max_new_tokens`` tokens) or while it is not its
turn. An agent that has finished waits, stepping the pad id, until every acting agent of the turn
has finished; then the turn resolves exactly as in response mode (same reward, feedback, transcript
and infos). Rewards are 0 on every other step. The stop token itself is not part of the response
(as in response mode) and does not appear in the observation.

``obs_format="flat"``: one int64 vector instead of the Dict: ``observation`` (L ids), then
``attention_mask`` (L), then, in token mode, ``action_mask`` (V), as a
``Box(0, high, (2L [+ V],), int64)`` whose ``high`` is V-1 on the ids and 1 elsewhere. Use
:meth:`LLMEnvCore.split_flat` to cut one back into its parts.

A tokenizer per agent
---------------------
``tokenizer`` may be a mapping ``{agent: tokenizer}`` naming exactly the env's agents (values: objects,
names or paths). Everything token-level above is then per agent: V (the spaces' bounds, ``Discrete(V)``,
the action mask's length), the pad id, the stop ids, the chat template (on where the agent's tokenizer
has one) and the encoding and decoding of its prompts and actions. Text is the interface between
agents: a response that another agent's prompt holds is spliced in as the writer's ids only when the
reader has the writer's tokenizer, otherwise as its text encoded with the reader's. ``tokenizer_of``,
``vocab_size_of``, ``pad_token_id_of``, ``stop_token_ids_of`` and ``chat_template_of`` answer per
agent; ``tokenizer`` (and ``vocab_size``, ...) raise :class:`MixedTokenizersError` where the agents
differ.

>>> import llm_envs
>>> from llm_envs.tokenizers import load_tokenizer
>>> tok = load_tokenizer(None)
>>> env = llm_envs.make("writing/xsum-v0", tokenizer={"brief": tok, "detailed": tok})
>>> env.tokenizer is env.tokenizer_of("detailed") is tok  # one tokenizer for all: the single-tokenizer env
True
>>> env.vocab_size_of("brief"), env.chat_template_of("detailed")
(49152, True)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import gymnasium
import numpy as np
from gymnasium import spaces

from llm_envs.core.actions import Actions
from llm_envs.core.agent_tokens import AgentTokenizers
from llm_envs.core.agent_tokens import MixedTokenizersError as MixedTokenizersError
from llm_envs.core.observations import Observations
from llm_envs.core.state import GlobalState
from llm_envs.core.task import (
    SPLITS,
    Context,
    Problem,
    Response,
    Task,
    TurnRecord,
)
from llm_envs.core.transcript import Transcript
from llm_envs.tokenizers import TokenizerHandle

RENDER_MODES = ("ansi", "human")
PROMPT_OVERFLOW = ("error", "truncate_left")
STEP_UNITS = ("response", "token")
OBS_FORMATS = ("dict", "flat")

ENV_KWARGS = (
    "tokenizer",
    "max_prompt_tokens",
    "max_new_tokens",
    "num_turns",
    "max_cycles",
    "render_mode",
    "chat_template",
    "prompt_overflow",
    "step_unit",
    "obs_format",
    "stop_token_ids",
    "transition",
    "centralized",
    "prefill",
)
"""Keyword arguments that belong to the env; every other ``make`` kwarg goes to the task. ``centralized``
and ``prefill`` are ``make``'s (:mod:`llm_envs.core.centralized`), not arguments of the env classes."""


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return int(value)


class LLMEnvCore(AgentTokenizers, Transcript, GlobalState, Observations, Actions):
    """Mixin with the state and mechanics common to the parallel and sequential envs.

    Args:
        task: the :class:`~llm_envs.core.task.Task`.
        tokenizer: an HF tokenizer object, name or path; ``None`` for the embedded default
            (SmolLM2-135M-Instruct); or a mapping ``{agent: tokenizer}`` naming exactly the env's
            agents, to give each agent its own (see the module docstring).
        max_prompt_tokens: longest prompt; the observation length L in response mode (prompts are
            left-padded to it); token mode adds ``max_new_tokens`` for the response so far.
        max_new_tokens: action length (longest response, in tokens).
        num_turns: turns per episode; after each non-final turn the task's feedback goes into the
            next prompts.
        max_cycles: truncate after this many turns (default: ``num_turns``, so episodes terminate).
        render_mode: ``"ansi"`` (``render()`` returns the transcript) or ``"human"`` (prints it).
        chat_template: apply the tokenizer's chat template to prompts (default: the task's default,
            and only when the tokenizer has a template; per agent with a tokenizer per agent, and
            ``True`` raises naming an agent whose tokenizer has none).
        prompt_overflow: ``"error"`` (default) raises when a prompt exceeds ``max_prompt_tokens``;
            ``"truncate_left"`` keeps its last L tokens and reports ``prompt_truncated=1`` in infos.
        step_unit: ``"response"`` (default: one response per step) or ``"token"`` (one token per
            step, ``Discrete(V)`` actions and an ``action_mask``); see the module docstring.
        obs_format: ``"dict"`` (default) or ``"flat"`` (one int64 vector); see the module docstring.
        stop_token_ids: token ids that end a response besides the tokenizer's EOS and pad ids, e.g.
            every EOS id of a model's generation config (Llama 3 Instruct: ``<|eot_id|>``,
            ``<|eom_id|>``, ``<|end_of_text|>``). Pass the policy's ``eos_token_ids`` so that the env
            cuts a response exactly where the policy stopped generating it. A mapping ``{agent: ids}``
            gives each agent its own (required when the agents have different tokenizers).
        transition: what each agent sees on later turns (:mod:`llm_envs.transitions`): ``None`` for the
            task's own feedback (default), a registered name (``"level-feedback"``, ``"plain"``), an
            import path ``"module:function"`` or a callable object (``agents.ExpertTransition``). With
            one, infos gain ``transition_s`` (seconds it took).
    """

    metadata: dict[str, Any]

    def _init_core(
        self,
        task: Task,
        *,
        env_id: str | None = None,
        tokenizer: Any = None,
        max_prompt_tokens: int | None = None,
        max_new_tokens: int | None = None,
        num_turns: int = 1,
        max_cycles: int | None = None,
        render_mode: str | None = None,
        chat_template: bool | None = None,
        prompt_overflow: str = "error",
        step_unit: str = "response",
        obs_format: str = "dict",
        stop_token_ids: Sequence[int] | None = None,
        transition: Any = None,
    ) -> None:
        if not isinstance(task, Task):
            raise TypeError(f"task must be a llm_envs Task, got {type(task).__name__}.")
        if not task.roles:
            raise ValueError(f"Task {type(task).__name__} defines no roles.")
        self.task = task
        self.env_id = env_id or type(task).__name__
        self.num_turns = _check_int("num_turns", num_turns, 1)
        self.max_cycles = self.num_turns if max_cycles is None else _check_int("max_cycles", max_cycles, 1)
        self.max_prompt_tokens = _check_int(
            "max_prompt_tokens",
            task.default_max_prompt_tokens if max_prompt_tokens is None else max_prompt_tokens,
            1,
        )
        self.max_new_tokens = _check_int(
            "max_new_tokens", task.default_max_new_tokens if max_new_tokens is None else max_new_tokens, 1
        )
        if render_mode is not None and render_mode not in RENDER_MODES:
            raise ValueError(f"render_mode must be one of {RENDER_MODES} or None, got {render_mode!r}.")
        self.render_mode = render_mode
        if prompt_overflow not in PROMPT_OVERFLOW:
            raise ValueError(f"prompt_overflow must be one of {PROMPT_OVERFLOW}, got {prompt_overflow!r}.")
        self.prompt_overflow = prompt_overflow
        if step_unit not in STEP_UNITS:
            raise ValueError(f"step_unit must be one of {STEP_UNITS}, got {step_unit!r}.")
        self.step_unit = step_unit
        if obs_format not in OBS_FORMATS:
            raise ValueError(f"obs_format must be one of {OBS_FORMATS}, got {obs_format!r}.")
        self.obs_format = obs_format
        if chat_template is not None and not isinstance(chat_template, bool):
            raise ValueError(f"chat_template must be True, False or None, got {chat_template!r}.")

        from llm_envs import transitions

        self.transition_name, self.transition = transitions.resolve(transition)
        self.possible_agents = list(task.roles)
        self.agents: list[str] = []
        token_mode = self.step_unit == "token"
        self._agent_tokens = self._resolve_tokenizers(tokenizer, stop_token_ids, chat_template, token_mode)
        handles = {id(r.handle): r.handle for r in self._agent_tokens.values()}
        # The one tokenizer of every agent, else None (a mixed team: ask per agent).
        self._tok: TokenizerHandle | None = next(iter(handles.values())) if len(handles) == 1 else None
        # Values every agent shares (the single-tokenizer attributes); a mixed team lacks some.
        self._shared: dict[str, Any] = {}
        for name in ("vocab_size", "pad_token_id", "stop_token_ids", "chat_template"):
            values = {getattr(r, name) for r in self._agent_tokens.values()}
            if len(values) == 1:
                self._shared[name] = values.pop()

        T = self.max_new_tokens
        # Token mode: room for the whole response after the longest prompt (module docstring).
        L = self.max_prompt_tokens + (T if token_mode else 0)
        self.obs_length = L
        # One space object per agent, returned as the same object on every call (PettingZoo checks);
        # each agent's bounds come from its own vocabulary size.
        self.observation_spaces: dict[str, spaces.Space] = {}
        self.action_spaces: dict[str, spaces.Space] = {}
        built: dict[int, tuple[spaces.Space, spaces.Space]] = {}
        for agent in self.possible_agents:
            V = self._agent_tokens[agent].vocab_size
            if V in built:
                obs_space, act_space = (_copy_space(s) for s in built[V])
            else:
                obs_space, act_space = built[V] = self._build_spaces(V)
            self.observation_spaces[agent] = obs_space
            self.action_spaces[agent] = act_space
        self.info_keys = (
            "turn",
            "task_index",
            "prompt_tokens",
            "prompt_truncated",
            "response_tokens",
            "reward_total",
            *(f"reward_{c}" for c in task.reward_components),
            *(("transition_s",) if self.transition is not None else ()),
        )
        self._started = False
        self._split = "train"
        self._task_index = 0
        self._problem: Problem = {}
        self._turn = 0
        self._history: list[TurnRecord] = []
        self._visible: dict[str, Response] = {}
        self._prompt_history: dict[str, list[str]] = {a: [] for a in self.possible_agents}
        self._transcript: list[tuple[str, str, str]] = []
        self._obs_cache: dict[Any, tuple[np.ndarray, np.ndarray, int, int, str]] = {}
        self._episode_cache: dict[Any, tuple[np.ndarray, np.ndarray, int, int, str]] = {}
        # Token mode: each agent's response of the current turn so far, and the finished ones.
        self._response_ids: dict[str, list[int]] = {a: [] for a in self.possible_agents}
        self._finished: dict[str, Response] = {}
        self._np_random: np.random.Generator | None = None
        self._np_random_seed: int | None = None
        self._init_state()

    def _build_spaces(self, V: int) -> tuple[spaces.Space, spaces.Space]:
        """(observation space, action space) of an agent whose vocabulary has V tokens."""
        return build_spaces(V, self.max_new_tokens, self.obs_length, self.step_unit, self.obs_format)

    # ----------------------------------------------------------------------------------- spaces
    def observation_space(self, agent: str) -> spaces.Space:
        self._check_agent_name(agent)
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> spaces.Space:
        self._check_agent_name(agent)
        return self.action_spaces[agent]

    def _check_agent_name(self, agent: Any) -> None:
        if agent not in self.observation_spaces:
            raise KeyError(f"Unknown agent {agent!r}; this env's agents are {self.possible_agents}.")

    # ------------------------------------------------------------------------------------ seeding
    @property
    def np_random(self) -> np.random.Generator:
        if self._np_random is None:
            self._np_random, self._np_random_seed = gymnasium.utils.seeding.np_random()
        return self._np_random

    # ------------------------------------------------------------------------------ pickling
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_obs_cache"] = {}
        state["_episode_cache"] = {}
        state["_state_pieces"] = {}
        state["_state_space"] = None
        return state

    # ---------------------------------------------------------------------------- episode start
    def _start_episode(self, seed: int | None, options: Mapping[str, Any] | None) -> None:
        options = dict(options or {})
        unknown = set(options) - {"task_index", "split"}
        if unknown:
            # PettingZoo's own API test passes arbitrary options, so warn instead of raising.
            gymnasium.logger.warn(
                f"Ignoring unknown reset options {sorted(unknown)}; supported: 'task_index', 'split'."
            )
        split = options.get("split", "train")
        if split not in SPLITS:
            raise ValueError(f"reset option split must be one of {SPLITS}, got {split!r}.")
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
                raise ValueError(f"seed must be an int or None, got {seed!r}.")
            self._np_random, self._np_random_seed = gymnasium.utils.seeding.np_random(int(seed))
        problems = self.task.problems(split)
        n = len(problems)
        if n == 0:
            raise ValueError(f"Task {self.env_id} has no problems in split {split!r}.")
        if "task_index" in options:
            index = options["task_index"]
            if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < n:
                raise ValueError(
                    f"reset option task_index must be an int in [0, {n - 1}] for split {split!r}, got {index!r}."
                )
            index = int(index)
        else:
            index = int(self.np_random.integers(n))
        self._split, self._task_index, self._problem = split, index, problems[index]
        self._turn = 0
        self._history = []
        self._visible = {}
        self._prompt_history = {a: [] for a in self.possible_agents}
        self._transcript = []
        self._episode_cache = {}
        self._reset_state()
        self._clear_responses()
        self._started = True

    def _clear_responses(self) -> None:
        self._response_ids = {a: [] for a in self.possible_agents}
        self._finished = {}

    def _context(self) -> Context:
        return Context(
            turn=self._turn,
            num_turns=self.num_turns,
            history=tuple(self._history),
            visible=dict(self._visible),
        )

    # ------------------------------------------------------------------------------ turns
    def _resolve_turn(self, outputs: Mapping[str, Response]) -> TurnRecord:
        """Score a finished turn; compute feedback only when another turn follows."""
        texts = {role: outputs[role].text for role in self.possible_agents}
        total, components = self.task.reward(self._problem, texts)
        total = float(total)
        missing = set(self.task.reward_components) - set(components)
        if missing or not math.isfinite(total):
            raise RuntimeError(
                f"Task {self.env_id} returned reward {total!r} with components {sorted(components)}; "
                f"expected a finite float and components {list(self.task.reward_components)}."
            )
        agent_rewards = self.task.agent_rewards(self._problem, texts, total, components)
        # A truncated episode still gets its next prompt (a learner may bootstrap from it).
        has_next = self._turn + 1 < self.num_turns
        next_prompts: dict[str, str] = {}
        transition_s = 0.0
        acted: dict[str, str] = {}
        if self.transition is not None:
            acted = {role: self._acted_prompt_text(role) for role in self.possible_agents}
            if has_next:
                next_prompts, transition_s = self._next_prompts(outputs, acted)
        feedback = (
            self.task.feedback(self._problem, texts, total, components)
            if has_next and self.transition is None
            else {}
        )
        record = TurnRecord(
            next_prompts=next_prompts,
            transition_s=transition_s,
            outputs=dict(outputs),
            reward=total,
            components={c: float(components[c]) for c in self.task.reward_components},
            agent_rewards={a: float(agent_rewards[a]) for a in self.possible_agents},
            feedback=dict(feedback),
        )
        for role in self.possible_agents:
            self._transcript.append(("response", role, outputs[role].text))
        parts = ", ".join(f"{k}={v:.3f}" for k, v in record.components.items())
        self._transcript.append(("reward", "", f"{total:.3f} ({parts})"))
        for role, text in record.feedback.items():
            self._transcript.append(("feedback", role, text))
        for role, text in acted.items():
            self._prompt_history[role].append(text)
        self._history.append(record)
        self._turn += 1
        self._visible = {}
        self._clear_responses()
        return record

    def _episode_over(self) -> tuple[bool, bool]:
        """(terminated, truncated) after the current number of finished turns."""
        if self._turn >= self.num_turns:
            return True, False
        if self._turn >= self.max_cycles:
            return False, True
        return False, False

    def _info(
        self, role: str, record: TurnRecord | None, response: Response | None, response_tokens: int | None = None
    ) -> dict[str, Any]:
        """Numbers only; ``response_tokens`` overrides the response's length (token mode: so far)."""
        _, _, n_prompt, truncated, _ = self._observe_role(role) if self._started else (0, 0, 0, 0, "")
        if response_tokens is None:
            response_tokens = len(response.ids) if response is not None else 0
        info: dict[str, Any] = {
            "turn": int(self._turn),
            "task_index": int(self._task_index),
            "prompt_tokens": int(n_prompt),
            "prompt_truncated": int(truncated),
            "response_tokens": int(response_tokens),
            "reward_total": float(record.reward) if record is not None else 0.0,
        }
        for c in self.task.reward_components:
            info[f"reward_{c}"] = float(record.components[c]) if record is not None else 0.0
        if self.transition is not None:
            info["transition_s"] = float(record.transition_s) if record is not None else 0.0
        return info

    def _log_prompts(self, roles: Sequence[str]) -> None:
        for role in roles:
            self._transcript.append(("prompt", role, self._observe_role(role)[4]))

    def close(self) -> None:
        """Nothing to release: the env holds no pools, files or models."""

    @property
    def started(self) -> bool:
        """Whether an episode has started (``reset()`` was called)."""
        return self._started

    @property
    def task_split(self) -> str:
        """The split of the current problem (``"train"`` or ``"eval"``; ``"train"`` before ``reset()``)."""
        return self._split

    @property
    def task_index(self) -> int:
        """The index of the current problem in its split (``infos["task_index"]``; 0 before ``reset()``)."""
        return self._task_index

    @property
    def problem(self) -> Problem:
        """The current problem (a read-only mapping from the task's data)."""
        self._require_started()
        return self._problem

    @property
    def history(self) -> tuple[TurnRecord, ...]:
        """The finished turns of the current episode."""
        return tuple(self._history)


def build_spaces(V: int, max_new_tokens: int, obs_length: int, step_unit: str,
                 obs_format: str) -> tuple[spaces.Space, spaces.Space]:
    """(observation space, action space) of an agent whose vocabulary has V tokens, by the env's settings (the
    module docstring); the remote env (:mod:`llm_envs.remote`) builds its spaces with it too."""
    T, L = max_new_tokens, obs_length
    token_mode = step_unit == "token"
    parts: dict[str, spaces.Box] = {
        "observation": spaces.Box(0, V - 1, (L,), np.int64),
        "attention_mask": spaces.Box(0, 1, (L,), np.int8),
    }
    if token_mode:
        parts["action_mask"] = spaces.Box(0, 1, (V,), np.int8)
    obs_space: spaces.Space
    if obs_format == "flat":
        high = np.concatenate([np.full(L, V - 1, np.int64), np.ones(L + (V if token_mode else 0), np.int64)])
        obs_space = spaces.Box(np.zeros_like(high), high, dtype=np.int64)
    else:
        obs_space = spaces.Dict(parts)
    act_space: spaces.Space = spaces.Discrete(V) if token_mode else spaces.Box(0, V - 1, (T,), np.int64)
    return obs_space, act_space


def _copy_space(space: spaces.Space) -> spaces.Space:
    import copy

    return copy.deepcopy(space)


StepUnit = Literal["response", "token"]
ObsFormat = Literal["dict", "flat"]
