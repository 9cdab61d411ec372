"""A served env as a PettingZoo env again: ``connect(url)`` returns a ``ParallelEnv`` (or an ``AECEnv`` for a
sequential id) whose every call goes to an ``llm-envs serve`` server (docs/serving.md), so PettingZoo clients,
``make_vec`` and ``llm_envs.testing.check_env`` run against a remote env unchanged.

=====================  ==============================================================================
Spaces                 the served env's, rebuilt from ``GET /llm-envs/spec`` (the same objects on every
                       call); observations are the exact arrays (int64 ids, int8 masks, left-padded)
Actions                as the local env's: token ids (arrays, lists) or strings; the server's env
                       checks them and its errors are raised here with the same type and message
A dropped connection   reconnects to the same session (``/ws?session_id=``) until ``resume_timeout_s``
                       and resends the request; a resent reset or step is answered from the one it
                       repeats (its ``episode_id``, its ``step_index``), never applied twice
Copies                 ``copy.deepcopy`` and pickling fork the session on the server (a new session at
                       the same point of the same episode), so copies continue independently
Tokenizers             ``tokenizer_of(agent)`` loads the agent's tokenizer here by the name the server
                       gives (the embedded default needs nothing), or takes ``tokenizer=``
=====================  ==============================================================================

Needs ``websockets`` (``pip install 'llm-envs[remote]'``); the server needs the ``serve`` extra.

    import llm_envs.remote
    env = llm_envs.remote.connect("http://127.0.0.1:8000")   # llm-envs serve writing/xsum-v0
    obs, infos = env.reset(seed=0)
    obs, rewards, terms, truncs, infos = env.step({"brief": "A short summary.", "detailed": "A longer one."})
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium
import numpy as np
from pettingzoo import AECEnv, ParallelEnv

from llm_envs.core.agent_tokens import MixedTokenizersError, SharedTokenValues
from llm_envs.core.base import build_spaces
from llm_envs.core.parallel import check_step_call
from llm_envs.core.state import build_state_space
from llm_envs.core.task import Response, Task, TurnRecord
from llm_envs.core.transcript import Transcript
from llm_envs.serve.channel import Channel, ConnectionLost, RemoteEnvError, get_json, http_base
from llm_envs.serve.wire import WIRE_VERSION, decode_observation, decode_state, encode_action

__all__ = ["ConnectionLost", "RemoteAECEnv", "RemoteEnv", "RemoteEnvError", "RemoteParallelEnv", "RemoteTask",
           "connect"]

DEFAULT_TIMEOUT_S = 300.0
"""How long a request may wait for its answer (a code env's step runs programs)."""


class RemoteTask:
    """What the remote env knows of its task: the spec's fields, and ``problems(split)`` read through OpenEnv's
    task API (``POST /{name}/task``), one problem at a time."""

    def __init__(self, base: str, name: str, spec: Mapping[str, Any], timeout_s: float) -> None:
        self._base, self._name, self._timeout_s = base, name, timeout_s
        self.name = spec["name"]
        self.reward_components = tuple(spec["reward_components"])
        self.min_reward = float(spec["min_reward"])
        self.max_reward = float(spec["max_reward"])
        self.max_turns = spec["max_turns"]
        self.protocols = tuple(spec["protocols"])
        self._counts = dict(spec["num_problems"])
        self.roles: tuple[str, ...] = ()

    # The server's env scores each session's turns itself: a batch of remote envs has nothing to hand over at once.
    prepare_rewards = Task.prepare_rewards

    def problems(self, split: str = "train") -> _RemoteProblems:
        if split not in self._counts:
            raise ValueError(f"split must be one of {sorted(self._counts)}, got {split!r}.")
        return _RemoteProblems(self, split)

    def render_turn(self, problem: Any, outputs: Mapping[str, str]) -> str | None:
        return None  # the server renders the transcript (RemoteParallelEnv.transcript)

    def _task(self, split: str, index: int) -> Any:
        url = f"{self._base}/{self._name}/task"
        return get_json(url, self._timeout_s, {"split": split, "index": index})["task"]["problem"]


class _RemoteProblems(Sequence):
    def __init__(self, task: RemoteTask, split: str) -> None:
        self._task, self._split = task, split

    def __len__(self) -> int:
        return self._task._counts[self._split]

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        if not -len(self) <= index < len(self):
            raise IndexError(f"problem index {index} out of range for {len(self)} problems")
        return self._task._task(self._split, index % len(self))


class RemoteEnv(SharedTokenValues):
    """What both remote protocols share: the spec, the spaces, the channel, the tokenizers and the state.
    ``isinstance(env, RemoteEnv)`` tells a remote env of either protocol."""

    def _connect(self, url: str, *, tokenizer: Any, timeout_s: float, resume_timeout_s: float | None,
                 session_id: str | None, render_mode: str | None, spec: Mapping[str, Any] | None = None) -> None:
        self.url = url
        self._base = http_base(url)
        self._timeout_s = float(timeout_s)
        spec = dict(spec) if spec is not None else get_json(f"{self._base}/llm-envs/spec", self._timeout_s)
        if spec.get("wire_version") != WIRE_VERSION:
            raise RemoteEnvError(f"The server at {url} speaks wire version {spec.get('wire_version')}, this client "
                                 f"{WIRE_VERSION}: install the same llm-envs version on both sides.")
        self.spec = spec
        self._resume_timeout_s = float(spec["resume_timeout_s"] if resume_timeout_s is None else resume_timeout_s)
        self._channel = Channel(self._base, session_id=session_id, timeout_s=self._timeout_s,
                                 resume_timeout_s=self._resume_timeout_s)
        self.env_id = spec["env_id"]
        self.protocol = spec["protocol"]
        self.possible_agents = list(spec["possible_agents"])
        self.agents: list[str] = []
        if render_mode is not None and render_mode not in ("ansi", "human"):
            raise ValueError(f"render_mode must be 'ansi', 'human' or None, got {render_mode!r}.")
        self.render_mode = render_mode if render_mode is not None else spec["render_mode"]
        self.metadata = dict(spec["metadata"])
        for key in ("obs_length", "state_length", "obs_format", "step_unit", "max_new_tokens", "max_prompt_tokens",
                    "num_turns", "max_cycles"):
            setattr(self, key, spec[key])
        self.info_keys = tuple(spec["info_keys"])
        self.task = RemoteTask(self._base, spec["env_id"].replace("/", "-"), spec["task"], self._timeout_s)
        self.task.roles = tuple(self.possible_agents)
        self.observation_spaces: dict[str, gymnasium.Space] = {}
        self.action_spaces: dict[str, gymnasium.Space] = {}
        for agent in self.possible_agents:
            obs_space, act_space = build_spaces(spec["agents"][agent]["vocab_size"], self.max_new_tokens,
                                                self.obs_length, self.step_unit, self.obs_format)
            self.observation_spaces[agent], self.action_spaces[agent] = obs_space, act_space
        self.state_space = build_state_space(self.state_length, spec["agents"][self.possible_agents[0]]["vocab_size"],
                                             self.obs_format)
        self._tokenizer_arg = tokenizer
        self._tokenizers: dict[str, Any] = {}
        self._wire_obs: dict[str, Any] = {}
        self._state_cache: dict[str, Any] | None = None
        self._started = False
        self.episode_id: str | None = None
        self.step_count = 0

    # ------------------------------------------------------------------------------------ spaces and names
    def observation_space(self, agent: str) -> gymnasium.Space:
        self._check_agent_name(agent)
        return self.observation_spaces[agent]

    def action_space(self, agent: str) -> gymnasium.Space:
        self._check_agent_name(agent)
        return self.action_spaces[agent]

    def _check_agent_name(self, agent: Any) -> None:
        if agent not in self.observation_spaces:
            raise KeyError(f"Unknown agent {agent!r}; this env's agents are {self.possible_agents}.")

    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeError("Call reset() before step() (or before reading observations and text).")

    @property
    def session_id(self) -> str | None:
        """The server's id of this env's session (``/ws?session_id=`` resumes it)."""
        return self._channel.session_id

    @property
    def reconnects(self) -> int:
        """How many times the connection was re-established after a drop."""
        return self._channel.reconnects

    # ------------------------------------------------------------------------------------ tokens
    def tokenizer_of(self, agent: str) -> Any:
        """The agent's tokenizer, loaded here: ``tokenizer=`` (one, or ``{agent: tokenizer}``), else the name the
        server gives (the embedded default's needs no download)."""
        self._check_agent_name(agent)
        if agent not in self._tokenizers:
            given = self._tokenizer_arg
            if isinstance(given, Mapping):
                given = given[agent]
            if given is None or isinstance(given, str):
                from llm_envs.tokenizers import load_tokenizer

                name = given if given is not None else self.spec["agents"][agent]["tokenizer"]
                if name is None:
                    raise RuntimeError(f"The server's tokenizer of {agent!r} is an object, not a name: pass "
                                       "tokenizer= to connect().")
                given = load_tokenizer(name)
            self._tokenizers[agent] = given
        return self._tokenizers[agent]

    @property
    def state_tokenizer(self) -> Any:
        return self.tokenizer_of(self.possible_agents[0])

    @property
    def tokenizer(self) -> Any:
        """The one tokenizer of every agent (loaded here, see :meth:`tokenizer_of`); on a team of tokenizers
        :class:`~llm_envs.MixedTokenizersError`, as the local env: use :meth:`tokenizer_of`."""
        if self.mixed_tokenizers:
            raise MixedTokenizersError(f"The agents of env {self.env_id} have different tokenizers: use "
                                       "env.tokenizer_of(agent) or env.tokenizers.")
        return self.tokenizer_of(self.possible_agents[0])

    def _shared_value(self, name: str) -> Any:
        values = {agent: getattr(self, f"{name}_of")(agent) for agent in self.possible_agents}
        if len(set(values.values())) > 1:
            raise MixedTokenizersError(f"The agents of env {self.env_id} have different tokenizers, and their "
                                       f"{name} differs ({values}): use env.{name}_of(agent).")
        return values[self.possible_agents[0]]


    @property
    def tokenizers(self) -> dict[str, Any]:
        """Each agent's tokenizer, ``{agent: tokenizer}`` (loaded here, see :meth:`tokenizer_of`)."""
        return {agent: self.tokenizer_of(agent) for agent in self.possible_agents}

    @property
    def mixed_tokenizers(self) -> bool:
        """Whether the agents have different tokenizers."""
        return len({id(self.tokenizer_of(agent)) for agent in self.possible_agents}) > 1

    def tokenizer_name_of(self, agent: str) -> str | None:
        """The name or path :meth:`tokenizer_of` loads ``agent``'s tokenizer by; None where ``tokenizer=`` gave
        an object (a pickled remote env holds such an object by value)."""
        self._check_agent_name(agent)
        given = self._tokenizer_arg
        if isinstance(given, Mapping):
            given = given[agent]
        if given is None:
            return self.spec["agents"][agent]["tokenizer"]
        return given if isinstance(given, str) else None

    def chat_template_of(self, agent: str) -> bool:
        """Whether the served env renders ``agent``'s prompts with its tokenizer's chat template."""
        self._check_agent_name(agent)
        return bool(self.spec["agents"][agent]["chat_template"])

    def vocab_size_of(self, agent: str) -> int:
        self._check_agent_name(agent)
        return int(self.spec["agents"][agent]["vocab_size"])

    def pad_token_id_of(self, agent: str) -> int:
        self._check_agent_name(agent)
        return int(self.spec["agents"][agent]["pad_token_id"])

    def stop_token_ids_of(self, agent: str) -> frozenset[int]:
        self._check_agent_name(agent)
        return frozenset(self.spec["agents"][agent]["stop_token_ids"])

    def split_flat(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        arr = np.asarray(flat)
        L = self.obs_length
        out = {"observation": arr[..., :L], "attention_mask": arr[..., L : 2 * L]}
        if self.step_unit == "token":
            out["action_mask"] = arr[..., 2 * L :]
        return out

    def split_flat_state(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        arr = np.asarray(flat)
        S = self.state_length
        return {"observation": arr[..., :S], "attention_mask": arr[..., S:]}

    # ------------------------------------------------------------------------------------ actions
    def action_mask(self, agent: str) -> np.ndarray:
        """Token mode: the agent's legal tokens now, an int8 array of length V (as the served env's)."""
        self._check_agent_name(agent)
        if self.step_unit != "token":
            raise RuntimeError("action_mask() exists in token mode only; serve the env with step_unit='token'.")
        self._require_started()
        obs = self._decode(agent, self._wire_observation(agent))
        return (self.split_flat(obs) if self.obs_format == "flat" else obs)["action_mask"].copy()

    def check_action(self, agent: str, action: Any) -> None:
        """Validate one agent's action by the served env's own rules (range, length, dtype, the action mask in
        token mode) without stepping (the ``check`` message): a batch of remote envs (``llm_envs.core.vector``)
        checks every row before any env steps. Raises the ``ValueError`` / ``TypeError`` the served env raises."""
        self._check_agent_name(agent)
        self._require_started()
        self._request({"type": "check", "data": {"agent": agent, "action": encode_action(action)}})

    # ------------------------------------------------------------------------------------ requests
    def _request(self, message: dict[str, Any]) -> dict[str, Any]:
        return self._channel.request(message)

    def _reset_request(self, seed: int | None, options: Mapping[str, Any] | None) -> dict[str, Any]:
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
            raise ValueError(f"seed must be an int or None, got {seed!r}.")
        episode_id = uuid.uuid4().hex
        data: dict[str, Any] = {"episode_id": episode_id}
        if seed is not None:
            data["seed"] = int(seed)
        if options:
            data["options"] = {k: (int(v) if isinstance(v, np.integer) else v) for k, v in dict(options).items()}
        answer = self._request({"type": "reset", "data": data})
        self._channel.session_id = answer["observation"]["session_id"]
        self._started = True
        self.step_count = 0
        self.episode_id = episode_id
        return answer

    def _step_request(self, actions: dict[str, Any]) -> dict[str, Any]:
        data = {"actions": {agent: encode_action(a) for agent, a in actions.items()}, "step_index": self.step_count}
        answer = self._request({"type": "step", "data": data})
        self.step_count += 1
        return answer

    def _take(self, answer: Mapping[str, Any]) -> dict[str, Any]:
        obs = answer["observation"]
        self._wire_obs = dict(obs["observations"])
        self._state_cache = None
        self.agents = list(obs["agents"])
        return obs

    def _decode(self, agent: str, wire: Mapping[str, Any]) -> Any:
        return decode_observation(self.spec, agent, wire)

    def _wire_observation(self, agent: str) -> Mapping[str, Any]:
        if agent not in self._wire_obs:
            data = self._request({"type": "observe", "data": {"agent": agent}})
            self._wire_obs[agent] = data["observation"]
        return self._wire_obs[agent]

    def _remote_state(self) -> dict[str, Any]:
        if self._state_cache is None:
            self._state_cache = self._request({"type": "state", "data": {}})
        return self._state_cache

    # ------------------------------------------------------------------------------------ what the env shows
    def text(self, agent: str) -> str:
        """The agent's current observation as text (as the served env's ``text(agent)``)."""
        self._check_agent_name(agent)
        self._require_started()
        return self._wire_observation(agent)["text"]

    def state(self) -> Any:
        """The global state now (the served env's ``state()``), as the exact arrays."""
        if not self._started:
            raise RuntimeError("Call reset() before state(): the state is the current episode's problem and "
                               "responses.")
        return decode_state(self.spec, self._remote_state()["global_state"])

    def state_text(self) -> str:
        self.state()
        return self._remote_state()["global_state"]["text"]

    @property
    def history(self) -> tuple[TurnRecord, ...]:
        """The finished turns of the current episode (from the server's state)."""
        if not self._started:
            return ()
        turns = []
        for t in self._remote_state()["history"]:
            outputs = {a: Response(ids=tuple(o["ids"]), text=o["text"], agent=a) for a, o in t["outputs"].items()}
            turns.append(TurnRecord(outputs=outputs, reward=float(t["reward"]), components=dict(t["components"]),
                                    agent_rewards=dict(t["agent_rewards"]), feedback=dict(t["feedback"]),
                                    next_prompts=dict(t["next_prompts"]), transition_s=float(t["transition_s"])))
        return tuple(turns)

    @property
    def started(self) -> bool:
        """Whether an episode has started (``reset()`` was called)."""
        return self._started

    @property
    def task_split(self) -> str:
        """The split of the current problem (``"train"`` before ``reset()``)."""
        return self._remote_state()["split"] if self._started else "train"

    @property
    def task_index(self) -> int:
        """The index of the current problem in its split (0 before ``reset()``)."""
        return int(self._remote_state()["task_index"]) if self._started else 0

    @property
    def problem(self) -> Mapping[str, Any]:
        """The current problem, as the server sends it (JSON data; values JSON cannot carry as their ``repr``)."""
        self._require_started()
        return self._remote_state()["problem"]

    def problem_statement(self) -> str:
        """The problem's prompt the global state opens with (the served env's ``problem_statement()``)."""
        if not self._started:
            raise RuntimeError("Call reset() before state(): the state is the current episode's problem and "
                               "responses.")
        return self._remote_state()["problem_statement"]

    def transcript_turns(self) -> list[dict[str, Any]]:
        """The episode so far as data, one dict per turn (the served env's ``transcript_turns()``)."""
        if not self._started:
            return []
        history = self.history
        turns: list[dict[str, Any]] = []
        prompts: dict[str, str] = {}
        for kind, role, text in self._remote_state()["transcript"]:
            if kind == "prompt":
                prompts[role] = text
            elif kind == "reward":
                record = history[len(turns)]
                turns.append({"prompts": prompts,
                              "responses": {r: record.outputs[r].text for r in self.possible_agents},
                              "reward": record.reward, "components": dict(record.components),
                              "agent_rewards": dict(record.agent_rewards), "feedback": dict(record.feedback)})
                prompts = {}
        if prompts:
            turns.append({"prompts": prompts, "responses": {}, "reward": None, "components": {}, "agent_rewards": {},
                          "feedback": {}})
        return turns

    def transcript(self) -> str:
        """The episode so far as text (the served env's ``transcript()``)."""
        if not self._started:
            return ""
        return self._remote_state()["transcript_text"]

    render = Transcript.render  # the served env's transcript, rendered as a local env renders its own

    def close(self) -> None:
        """Close the session on the server (its env is freed) and the connection."""
        self._channel.close()

    def drop_connection(self) -> None:
        """Drop the connection as a network fault would, keeping the session: the next call resumes it."""
        self._channel.drop_connection()

    # ------------------------------------------------------------------------------------ copies
    def _fork_session(self) -> str | None:
        if not self._started:
            return None
        return self._request({"type": "fork", "data": {}})["session_id"]

    def _copy_state(self, session_id: str | None) -> dict[str, Any]:
        state = {k: v for k, v in self.__dict__.items() if k not in ("_channel", "_tokenizers", "_state_cache")}
        state["_channel_args"] = (self._base, session_id, self._timeout_s, self._resume_timeout_s)
        return state

    def __getstate__(self) -> dict[str, Any]:
        return self._copy_state(self._fork_session())

    def __setstate__(self, state: dict[str, Any]) -> None:
        base, session_id, timeout_s, resume_timeout_s = state.pop("_channel_args")
        self.__dict__.update(state)
        self._channel = Channel(base, session_id=session_id, timeout_s=timeout_s, resume_timeout_s=resume_timeout_s)
        self._tokenizers = {}
        self._state_cache = None

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        import copy

        other = type(self).__new__(type(self))
        other.__setstate__(copy.deepcopy(self._copy_state(self._fork_session()), memo))
        return other

    def __del__(self) -> None:
        # A remote env that is garbage collected frees its session on the server at once (a copy's fork included)
        # instead of leaving it to its resume timeout; at interpreter exit anything may already be gone.
        channel = self.__dict__.get("_channel")
        if channel is not None and (channel._ws is not None or channel.session_id is not None):
            try:
                channel.close()
            except Exception:
                pass

    def _take_resumed(self) -> None:
        """After ``connect(session_id=...)``: pick up the session's episode where it is."""
        state = self._request({"type": "state", "data": {}})
        self._started = bool(state["started"])
        self.episode_id = state["episode_id"]
        self.step_count = int(state["step_count"])
        if state["last_observation"] is not None:
            self._take(state["last_observation"])


class RemoteParallelEnv(RemoteEnv, ParallelEnv):
    """A served parallel env as a ``pettingzoo.ParallelEnv`` (the module docstring)."""

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        obs = self._take(self._reset_request(seed, options))
        observations = {a: self._decode(a, w) for a, w in obs["observations"].items()}
        return observations, {a: dict(i) for a, i in obs["infos"].items()}

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        check_step_call(self, actions)
        obs = self._take(self._step_request(dict(actions)))
        observations = {a: self._decode(a, w) for a, w in obs["observations"].items()}
        return (observations, dict(obs["rewards"]), dict(obs["terminations"]), dict(obs["truncations"]),
                {a: dict(i) for a, i in obs["infos"].items()})


class RemoteAECEnv(RemoteEnv, AECEnv):
    """A served sequential env as a ``pettingzoo.AECEnv`` (the module docstring)."""

    def _take(self, answer: Mapping[str, Any]) -> dict[str, Any]:
        obs = super()._take(answer)
        self.agent_selection = obs["agent_selection"]
        self.rewards = dict(obs["rewards"])
        self._cumulative_rewards = dict(obs["cumulative_rewards"])
        self.terminations = dict(obs["terminations"])
        self.truncations = dict(obs["truncations"])
        self.infos = {a: dict(i) for a, i in obs["infos"].items()}
        return obs

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self._take(self._reset_request(seed, options))

    def observe(self, agent: str) -> Any:
        self._check_agent_name(agent)
        self._require_started()
        return self._decode(agent, self._wire_observation(agent))

    def step(self, action: Any) -> None:
        self._require_started()
        if not self.agents:
            raise RuntimeError("The episode is over: call reset() before step().")
        self._take(self._step_request({self.agent_selection: action}))


def connect(url: str, *, tokenizer: Any = None, timeout_s: float = DEFAULT_TIMEOUT_S,
            resume_timeout_s: float | None = None, session_id: str | None = None,
            render_mode: str | None = None) -> RemoteParallelEnv | RemoteAECEnv:
    """A PettingZoo env whose calls go to the server at ``url`` (``llm-envs serve ID``).

    Args:
        url: the server's address, ``http://127.0.0.1:8000``.
        tokenizer: what ``tokenizer_of(agent)`` returns (one, or ``{agent: tokenizer}``; objects or names); by
            default the tokenizer the server names, loaded here. Stepping needs none (text goes as text).
        timeout_s: how long one request may wait for its answer.
        resume_timeout_s: how long to keep reconnecting after a drop (default: the server's).
        session_id: resume an existing session (another process's, after a crash) instead of starting one.
        render_mode: ``"ansi"`` or ``"human"`` (default: the served env's).

    Returns:
        A :class:`RemoteParallelEnv` for a parallel env, a :class:`RemoteAECEnv` for a sequential one.
    """
    base = http_base(url)
    spec = get_json(f"{base}/llm-envs/spec", float(timeout_s))
    cls = RemoteParallelEnv if spec.get("protocol") == "parallel" else RemoteAECEnv
    env = cls.__new__(cls)
    env._connect(url, tokenizer=tokenizer, timeout_s=timeout_s, resume_timeout_s=resume_timeout_s,
                 session_id=session_id, render_mode=render_mode, spec=spec)
    if session_id is not None:
        env._take_resumed()
    return env

