"""The OpenEnv server of one registered env: OpenEnv's own app (``HTTPEnvServer``: ``/health``, ``/schema``,
``/metadata``, ``/reset``, ``/step``, ``/mcp``, the task API) with its WebSocket route made to keep a session whose
connection dropped, so that the client can resume the episode (docs/serving.md).

What is OpenEnv's and what is ours:

======================  =================================================================================
OpenEnv 0.10            one env per session on ``WS /ws``; ``/ws?session_id=`` attaches a socket to a live
                        session; ``max_concurrent_envs`` and its capacity error; the task API
                        (``/{name}/splits|tasks|num_tasks|task|task_range``); the messages ``reset``,
                        ``step``, ``state``, ``close`` and their answers ``observation``, ``state``, ``error``
ours                    a session outlives its socket: a dropped connection leaves it *detached* for
                        ``resume_timeout_s`` (then it is closed), and ``/ws?session_id=`` (or
                        ``?episode_id=``) resumes it, the newest socket taking over; a step carries its
                        ``step_index`` and a reset its ``episode_id``, so a request resent after a drop is
                        answered from the one it repeats, never applied twice; SIGTERM drains (steps in
                        flight finish and are answered, new ones are refused with ``SHUTTING_DOWN``);
                        messages over ``max_message_bytes`` and idle sockets get an error, not a crash;
                        ``observe`` and ``fork`` messages (any agent's observation under the sequential
                        protocol; a copy of the session, for ``copy.deepcopy`` and pickling of the
                        remote env); ``GET /state?session_id=`` (a session's state) and
                        ``GET /llm-envs/spec`` (what a client rebuilds the spaces from)
======================  =================================================================================

Generated code never runs in this process: the code envs hand it to the sandbox's pool of fork servers
(:mod:`llm_envs.sandbox`), one short-lived process per program, taken for the program's run and given back.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import logging
import math
import os
import re
import threading
import time
import uuid
from typing import Any, Literal

from fastapi import FastAPI, HTTPException, Request, WebSocket
from fastapi.responses import JSONResponse
from openenv.core.env_server.exceptions import EnvironmentFactoryError, SessionCapacityError
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import (
    Action,
    ConcurrencyConfig,
    EnvironmentMetadata,
    Observation,
    State,
    WSErrorCode,
)
from pydantic import BaseModel, Field, ValidationError
from starlette.websockets import WebSocketDisconnect, WebSocketState

import llm_envs
from llm_envs.core.parallel import ParallelLLMEnv
from llm_envs.serve.wire import (
    ERROR_TYPES,
    WIRE_VERSION,
    decode_action,
    encode_observation,
    encode_state,
    env_spec,
    json_value,
)

log = logging.getLogger("llm_envs.serve")

DEFAULT_MAX_SESSIONS = 64
DEFAULT_RESUME_TIMEOUT_S = 60.0
"""How long a session whose connection dropped waits for its client to resume it."""
DEFAULT_IDLE_TIMEOUT_S = 900.0
"""How long a connected socket may stay silent before its session is closed (a trainer generating for minutes
stays well inside it)."""
DEFAULT_MAX_MESSAGE_BYTES = 1 << 20
"""The longest message the server reads; a longer one gets ``MESSAGE_TOO_LARGE`` (the session is unchanged)."""
DEFAULT_DRAIN_TIMEOUT_S = 30.0
DEFAULT_MAX_CONCURRENT_STEPS = 2 * (os.cpu_count() or 1)
"""Resets and steps that run at once, whatever the number of sessions: a code env's step runs programs in the
sandbox, one fork server each, so without a cap 64 sessions would run 64 programs (and keep 64 servers) on 2 cores.
Twice the cores keeps them busy while programs wait on their pipes; the others queue in order."""
"""How long SIGTERM waits for steps in flight before the server stops anyway."""
RESET_KEYWORDS = ("seed", "episode_id", "task_index", "split", "options")
SPEC_ROUTE = "/llm-envs/spec"

# Error codes beyond OpenEnv's WSErrorCode (strings on the wire, as OpenEnv's are).
SHUTTING_DOWN = "SHUTTING_DOWN"
MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"
IDLE_TIMEOUT = "IDLE_TIMEOUT"
UNKNOWN_SESSION = "UNKNOWN_SESSION"


# ------------------------------------------------------------------------------------------------ wire models
class MultiAgentAction(Action):
    """One step of a served env: each acting agent's action, as text or token ids."""

    actions: dict[str, Any] = Field(
        description="agent -> action: a string (tokenized by the env), a list of token ids (at most "
        "max_new_tokens; everything after the first stop id is ignored) or, with step_unit='token', one token id. "
        "Parallel envs: one entry per live agent. Sequential envs: one entry, the agent named by the last "
        "observation's agent_selection (null for a done agent's closing step)."
    )
    step_index: int | None = Field(
        default=None, ge=0,
        description="How many steps the episode had taken before this one. A step resent after a dropped "
        "connection with the index of the last step is answered from it instead of being applied twice.",
    )


class AgentObservation(BaseModel):
    """One agent's observation on the wire (llm_envs.serve.wire)."""

    text: str = Field(description="the prompt as text (env.text(agent))")
    token_ids: list[int] = Field(description="the prompt's token ids; the observation is these, left-padded to "
                                 "obs_length with the agent's pad id, its attention mask 1 on exactly them")
    action_mask: list[int] | Literal["all"] | None = Field(
        default=None, description="step_unit='token': 'all' or the ids the agent may step now")
    observation: list[int] | None = Field(default=None, description="the whole ids where they are not "
                                          "left-padded (an env subclass that changed the layout)")
    attention_mask: list[int] | None = Field(default=None, description="the whole mask, with 'observation'")


class MultiAgentObservation(Observation):
    """What a reset or a step returns: every agent's observation, reward, flags and infos. ``reward`` is the
    team reward (the joint reward of the turn this step resolved, 0.0 on a step that resolved none, null at
    reset) and ``done`` is true when every agent is done (terminated or truncated)."""

    protocol: Literal["parallel", "sequential"]
    agents: list[str] = Field(description="the live agents (env.agents)")
    agent_selection: str | None = Field(default=None, description="sequential envs: the agent to act next")
    observations: dict[str, AgentObservation] = Field(
        description="parallel: each agent the step returned an observation for; sequential: the agent to act")
    rewards: dict[str, float | int] = Field(description="each agent's reward of this step (an int 0 where "
                                            "PettingZoo's own bookkeeping clears it: a done agent's step)")
    cumulative_rewards: dict[str, float | int] = Field(
        default_factory=dict, description="sequential envs: PettingZoo's _cumulative_rewards (what last() returns)")
    terminations: dict[str, bool]
    truncations: dict[str, bool]
    infos: dict[str, dict[str, float | int]] = Field(description="numbers only, the same keys at every step")
    turn: int = Field(description="turns finished in this episode")
    step_count: int = Field(description="steps taken in this episode")
    episode_id: str | None = None
    session_id: str | None = Field(default=None, description="reconnect with /ws?session_id= after a drop")


class MultiAgentState(State):
    """A session's state: the episode's position, the global state (PettingZoo's ``state()``) and the finished
    turns. ``GET /state?session_id=`` or the ``state`` message return it."""

    env_id: str = ""
    protocol: str = ""
    session_id: str | None = None
    started: bool = False
    split: str | None = None
    task_index: int | None = None
    turn: int = 0
    num_turns: int = 1
    agents: list[str] = Field(default_factory=list)
    agent_selection: str | None = None
    global_state: dict[str, Any] | None = Field(
        default=None, description="env.state() as {text, token_ids}, left-padded to state_length like an observation")
    history: list[dict[str, Any]] = Field(
        default_factory=list, description="each finished turn: outputs {agent: {text, ids}}, reward, components, "
        "agent_rewards, feedback, next_prompts, transition_s")
    transcript: list[list[str]] = Field(default_factory=list, description="(kind, role, text) lines")
    transcript_text: str = Field(default="", description="env.transcript(): what render() shows")
    problem: dict[str, Any] | None = Field(default=None, description="the current problem (env.problem)")
    problem_statement: str | None = Field(default=None, description="env.problem_statement(): the problem's "
                                          "prompt the global state opens with")
    last_observation: dict[str, Any] | None = Field(
        default=None, description="the last reset's or step's answer, as sent (a client resuming after a crash)")


# ------------------------------------------------------------------------------------------------ the env
class ServedEnv(Environment):
    """One session's env: an ``llm_envs.make(env_id, **make_kwargs)`` env behind OpenEnv's ``Environment``."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, env_id: str, make_kwargs: dict[str, Any], env: Any = None) -> None:
        super().__init__()
        self.env_id = env_id
        self.make_kwargs = dict(make_kwargs)
        self.env = env if env is not None else llm_envs.make(env_id, **self.make_kwargs)
        self.protocol = "parallel" if isinstance(self.env, ParallelLLMEnv) else "sequential"
        self.session_id: str | None = None
        self.episode_id: str | None = None
        self.step_count = 0
        self._last: MultiAgentObservation | None = None

    # -------------------------------------------------------------------------------- reset and step
    def reset(self, seed: int | None = None, episode_id: str | None = None, task_index: int | None = None,
              split: str | None = None, options: dict[str, Any] | None = None, **kwargs: Any) -> MultiAgentObservation:
        if kwargs:
            raise TypeError(f"Unknown reset keyword(s) {sorted(kwargs)}; reset takes {list(RESET_KEYWORDS)}.")
        if options is not None and not isinstance(options, dict):
            raise TypeError(f"reset option 'options' must be a dict, got {type(options).__name__}.")
        if episode_id is not None and not isinstance(episode_id, str):
            raise TypeError(f"episode_id must be a string, got {type(episode_id).__name__}.")
        if (episode_id is not None and episode_id == self.episode_id and self.step_count == 0
                and self._last is not None):
            return self._last  # the same reset resent after a dropped connection
        options = dict(options or {})
        for key, value in (("task_index", task_index), ("split", split)):
            if value is not None:
                if key in options and options[key] != value:
                    raise ValueError(f"reset got {key}={value!r} and options[{key!r}]={options[key]!r}.")
                options[key] = value
        if self.protocol == "parallel":
            obs, infos = self.env.reset(seed=seed, options=options)
        else:
            self.env.reset(seed=seed, options=options)
            obs, infos = None, None
        self.episode_id = episode_id or uuid.uuid4().hex
        self.step_count = 0
        self._last = self._observation(obs, None, None, None, infos, team_reward=None)
        return self._last

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> MultiAgentObservation:
        if not isinstance(action, MultiAgentAction):
            raise TypeError(f"step takes a MultiAgentAction, got {type(action).__name__}.")
        if self.episode_id is None:
            raise RuntimeError("Call reset() before step(): this session has no episode yet.")
        index = action.step_index
        if index is not None:
            if index == self.step_count - 1 and self._last is not None:
                return self._last  # the same step resent after a dropped connection
            if index != self.step_count:
                raise ValueError(f"step_index is {index} but the episode has taken {self.step_count} steps: send "
                                 f"step_index={self.step_count} (or none).")
        turns_before = len(self.env.history)
        if self.protocol == "parallel":
            actions = {agent: decode_action(value) for agent, value in action.actions.items()}
            obs, rewards, terms, truncs, infos = self.env.step(actions)
            result = (obs, rewards, terms, truncs, infos)
        else:
            env = self.env
            if not env.agents:
                raise RuntimeError("The episode is over: call reset() before step().")
            if len(action.actions) != 1:
                raise KeyError(f"A sequential env takes one agent's action a step, {{{env.agent_selection!r}: "
                               f"action}}; got {len(action.actions)} entries {sorted(action.actions)}.")
            ((agent, value),) = action.actions.items()
            if agent not in env.possible_agents:
                raise KeyError(f"Unknown agent {agent!r}; this env's agents are {env.possible_agents}.")
            if agent != env.agent_selection:
                raise ValueError(f"It is {env.agent_selection!r}'s turn to act, got an action of {agent!r}; nothing "
                                 "changed.")
            env.step(decode_action(value))
            result = (None, None, None, None, None)
        self.step_count += 1
        turns = self.env.history
        team = float(turns[-1].reward) if len(turns) > turns_before else 0.0
        self._last = self._observation(*result, team_reward=team)
        return self._last

    def observe(self, agent: str) -> dict[str, Any]:
        """Any agent's observation now, as wire data (``env.observe(agent)`` of a sequential env)."""
        if self.episode_id is None:
            raise RuntimeError("Call reset() before observe(): this session has no episode yet.")
        if not isinstance(agent, str):
            raise TypeError(f"observe takes an agent name, got {type(agent).__name__}.")
        if self.protocol == "parallel":
            self.env._check_agent_name(agent)
            obs = self.env._observation(agent)
        else:
            obs = self.env.observe(agent)
        return encode_observation(self.env, agent, obs)

    def fork(self) -> ServedEnv:
        """A copy of this session's env and episode (``copy.deepcopy`` on the server)."""
        other = ServedEnv(self.env_id, self.make_kwargs, env=copy.deepcopy(self.env))
        other.episode_id, other.step_count, other._last = self.episode_id, self.step_count, self._last
        return other

    def _observation(self, obs: Any, rewards: Any, terms: Any, truncs: Any, infos: Any,
                     team_reward: float | None) -> MultiAgentObservation:
        env = self.env
        if self.protocol == "parallel":
            observations = {a: AgentObservation.model_construct(**encode_observation(env, a, o))
                            for a, o in obs.items()}
            acting = list(obs)
            rewards = {a: float(rewards[a]) for a in acting} if rewards is not None else dict.fromkeys(acting, 0.0)
            terms = {a: bool(terms[a]) for a in acting} if terms is not None else dict.fromkeys(acting, False)
            truncs = {a: bool(truncs[a]) for a in acting} if truncs is not None else dict.fromkeys(acting, False)
            cumulative: dict[str, float] = {}
            selection = None
            done = not env.agents
        else:
            selection = env.agent_selection
            observations = ({selection: AgentObservation.model_construct(
                **encode_observation(env, selection, env.observe(selection)))} if env.agents else {})
            # As the env has them: PettingZoo's dead steps clear them to the int 0, which stays an int.
            rewards = {a: r if type(r) is int else float(r) for a, r in env.rewards.items()}
            cumulative = {a: r if type(r) is int else float(r) for a, r in env._cumulative_rewards.items()}
            terms = {a: bool(t) for a, t in env.terminations.items()}
            truncs = {a: bool(t) for a, t in env.truncations.items()}
            infos = env.infos
            done = not env.agents or all(terms.get(a) or truncs.get(a) for a in env.agents)
        return MultiAgentObservation.model_construct(
            done=bool(done),
            reward=team_reward,
            metadata={"episode_id": self.episode_id, "session_id": self.session_id},
            protocol=self.protocol,
            agents=list(env.agents),
            agent_selection=selection,
            observations=observations,
            rewards=rewards,
            cumulative_rewards=cumulative,
            terminations=terms,
            truncations=truncs,
            infos={a: dict(i) for a, i in infos.items()},
            turn=len(env.history),
            step_count=self.step_count,
            episode_id=self.episode_id,
            session_id=self.session_id,
        )

    # -------------------------------------------------------------------------------- state and metadata
    @property
    def state(self) -> MultiAgentState:
        env = self.env
        started = self.episode_id is not None
        history = []
        for record in env.history if started else ():
            history.append({
                "outputs": {a: {"text": r.text, "ids": list(r.ids)} for a, r in record.outputs.items()},
                "reward": json_value(record.reward),
                "components": json_value(record.components),
                "agent_rewards": json_value(record.agent_rewards),
                "feedback": dict(record.feedback),
                "next_prompts": dict(record.next_prompts),
                "transition_s": float(record.transition_s),
            })
        return MultiAgentState(
            episode_id=self.episode_id,
            step_count=self.step_count,
            env_id=self.env_id,
            protocol=self.protocol,
            session_id=self.session_id,
            started=started,
            split=env.task_split if started else None,
            task_index=env.task_index if started else None,
            turn=len(env.history) if started else 0,
            num_turns=env.num_turns,
            agents=list(env.agents),
            agent_selection=getattr(env, "agent_selection", None) if started else None,
            global_state=encode_state(env) if started else None,
            history=history,
            transcript=[list(line) for line in env._transcript] if started else [],
            transcript_text=env.transcript() if started else "",
            problem=json_value(env.problem) if started else None,
            problem_statement=env.problem_statement() if started else None,
            last_observation=_serialize(self._last) if self._last is not None else None,
        )

    def get_metadata(self) -> EnvironmentMetadata:
        description = llm_envs.describe_envs().get(self.env_id, type(self.env.task).__name__)
        return EnvironmentMetadata(
            name=self.env_id,
            description=f"{description} ({self.protocol} protocol, agents {self.env.possible_agents}; served by "
                        "llm-envs: every agent's observation and reward in one message)",
            version=llm_envs.__version__,
            author="llm-envs",
            documentation_url="https://github.com/llm-envs/llm-envs/blob/main/docs/serving.md",
        )

    # -------------------------------------------------------------------------------- OpenEnv's task API
    def list_splits(self) -> list[str]:
        return ["train", "eval"]

    def num_tasks(self, split: str) -> int:
        return len(self._problems(split))

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        problems = self._problems(split)
        if not 0 <= index < len(problems):
            raise IndexError(f"task index {index} is out of range [0, {len(problems) - 1}] for split {split!r}.")
        return {"split": split, "index": index, "problem": json_value(problems[index])}

    def list_tasks(self, split: str) -> list[dict[str, Any]]:
        return [self.get_task(split, i) for i in range(self.num_tasks(split))]

    def get_task_range(self, split: str, start: int | None, stop: int | None) -> list[dict[str, Any]]:
        return [self.get_task(split, i) for i in range(self.num_tasks(split))[start:stop]]

    def _problems(self, split: str) -> Any:
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}.")
        return self.env.task.problems(split)


# ------------------------------------------------------------------------------------------------ the server
class _Session:
    """What the server keeps of a session beyond OpenEnv's registry: its socket, when it was detached, and the
    lock that serialises its messages across sockets."""

    __slots__ = ("detached_at", "lock", "socket")

    def __init__(self) -> None:
        self.socket: WebSocket | None = None
        self.detached_at: float | None = None
        self.lock = asyncio.Lock()


class LLMEnvServer(HTTPEnvServer):
    """OpenEnv's ``HTTPEnvServer`` with sessions that survive their socket (the module docstring)."""

    def __init__(self, env_id: str, make_kwargs: dict[str, Any], *, max_sessions: int = DEFAULT_MAX_SESSIONS,
                 resume_timeout_s: float = DEFAULT_RESUME_TIMEOUT_S, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S, replica: str | None = None,
                 max_concurrent_steps: int = DEFAULT_MAX_CONCURRENT_STEPS) -> None:
        if replica is not None and not re.fullmatch(r"[A-Za-z0-9_]{1,32}", replica):
            raise ValueError(f"replica must be 1-32 letters, digits or underscores, got {replica!r}.")
        for name, value in (("resume_timeout_s", resume_timeout_s), ("idle_timeout_s", idle_timeout_s),
                            ("drain_timeout_s", drain_timeout_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}.")
        for name, value in (("max_sessions", max_sessions), ("max_message_bytes", max_message_bytes),
                            ("max_concurrent_steps", max_concurrent_steps)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
        self.probe = ServedEnv(env_id, make_kwargs)  # an unknown id or a bad kwarg fails here, before serving
        self.spec = {**env_spec(self.probe.env), "make_kwargs": json_value(make_kwargs)}
        super().__init__(
            functools.partial(ServedEnv, env_id, dict(make_kwargs)),
            MultiAgentAction,
            MultiAgentObservation,
            concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=None),
            env_name=env_id.replace("/", "-"),
            state_cls=MultiAgentState,
        )
        self.env_id = env_id
        self.replica = replica
        self.resume_timeout_s = float(resume_timeout_s)
        self.idle_timeout_s = float(idle_timeout_s)
        self.max_message_bytes = max_message_bytes
        self.drain_timeout_s = float(drain_timeout_s)
        self._extra: dict[str, _Session] = {}
        self._inflight = 0
        self._inflight_lock = threading.Lock()
        self.draining = False
        self._reaper: asyncio.Task | None = None
        self.max_concurrent_steps = max_concurrent_steps
        self._step_slots = asyncio.Semaphore(max_concurrent_steps)

    # -------------------------------------------------------------------------------- sessions
    async def _new_session(self, env: ServedEnv | None = None) -> tuple[str, ServedEnv]:
        if env is None:
            session_id, env = await self._create_session()
            if self.replica is not None:
                session_id = await self._rename_session(session_id, f"{self.replica}-{session_id}")
        else:  # a fork: the copy takes a slot like any session
            async with self._session_lock:
                if len(self._sessions) >= self._max_concurrent_envs:
                    raise SessionCapacityError(active_sessions=len(self._sessions),
                                               max_sessions=self._max_concurrent_envs)
                from concurrent.futures import ThreadPoolExecutor

                from openenv.core.env_server.types import SessionInfo

                session_id = str(uuid.uuid4()) if self.replica is None else f"{self.replica}-{uuid.uuid4()}"
                self._sessions[session_id] = env
                self._session_executors[session_id] = ThreadPoolExecutor(max_workers=1)
                now = time.time()
                self._session_info[session_id] = SessionInfo(
                    session_id=session_id, created_at=now, last_activity_at=now, step_count=0,
                    environment_type=type(env).__name__)
        env.session_id = session_id
        if env._last is not None:
            env._last = env._last.model_copy(update={"session_id": session_id,
                                                      "metadata": {**env._last.metadata, "session_id": session_id}})
        self._extra[session_id] = _Session()
        return session_id, env

    async def _rename_session(self, old: str, new: str) -> str:
        """Move OpenEnv's records of a session to another id (the replica's prefix: docs/serving.md, replicas)."""
        async with self._session_lock:
            for table in (self._sessions, self._session_executors, self._session_stacks, self._session_info):
                if old in table:
                    table[new] = table.pop(old)
            if new in self._session_info:
                self._session_info[new].session_id = new
        return new

    def find_session(self, session_id: str | None = None, episode_id: str | None = None) -> str:
        """The live session of ``session_id`` or holding the episode ``episode_id``; KeyError if none."""
        if session_id is not None:
            if session_id in self._extra and self._sessions.get(session_id) is not None:
                return session_id
            raise KeyError(f"Unknown session_id {session_id!r}: it was closed, expired (a dropped connection is kept "
                           f"{self.resume_timeout_s:g} s) or never existed.")
        for sid, env in self._sessions.items():
            if env is not None and sid in self._extra and env.episode_id == episode_id:
                return sid
        raise KeyError(f"No session holds episode_id {episode_id!r}: it was closed, expired or never existed.")

    async def close_session(self, session_id: str) -> None:
        self._extra.pop(session_id, None)
        await self._destroy_session(session_id)

    async def _reap(self) -> None:
        interval = min(1.0, self.resume_timeout_s / 4)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            expired = [sid for sid, s in list(self._extra.items()) if s.socket is None
                       and s.detached_at is not None and now - s.detached_at > self.resume_timeout_s]
            for sid in expired:
                log.info("session %s expired (detached for over %g s)", sid, self.resume_timeout_s)
                await self.close_session(sid)

    # -------------------------------------------------------------------------------- draining (SIGTERM)
    def begin_drain(self) -> None:
        """Refuse new resets and steps from now on; the ones in flight finish and are answered."""
        self.draining = True

    def inflight(self) -> int:
        return self._inflight

    # -------------------------------------------------------------------------------- routes
    def register(self, app: FastAPI) -> None:
        self.register_routes(app)
        # OpenEnv's /ws and /state are replaced by ours (same messages; sessions that outlive their socket).
        app.router.routes[:] = [r for r in app.router.routes if getattr(r, "path", None) not in ("/ws", "/state")]

        async def start_reaper() -> None:
            self._reaper = asyncio.create_task(self._reap())

        async def stop() -> None:
            if self._reaper is not None:
                self._reaper.cancel()
            for sid in list(self._extra):
                await self.close_session(sid)

        app.router.on_startup.append(start_reaper)
        app.router.on_shutdown.append(stop)

        @app.get(SPEC_ROUTE, tags=["Environment Info"], summary="What a client rebuilds the env's spaces from")
        async def spec() -> dict[str, Any]:
            return {**self.spec, "max_sessions": self._max_concurrent_envs, "replica": self.replica,
                "max_concurrent_steps": self.max_concurrent_steps,
                    "resume_timeout_s": self.resume_timeout_s, "max_message_bytes": self.max_message_bytes}

        @app.get("/state", response_model=MultiAgentState, tags=["State Management"],
                 summary="A session's state (?session_id= or ?episode_id=), else a fresh env's")
        async def state(session_id: str | None = None, episode_id: str | None = None) -> MultiAgentState:
            if session_id is None and episode_id is None:
                return self.probe.state.model_copy(update={"session_id": None})
            try:
                sid = self.find_session(session_id, episode_id)
            except KeyError as err:
                raise HTTPException(status_code=404, detail=err.args[0]) from err
            env = self._sessions[sid]
            async with self._extra[sid].lock:
                return await self._run_in_session_executor(sid, lambda: env.state)

        @app.websocket("/ws")
        async def ws(websocket: WebSocket) -> None:
            await self._serve_socket(websocket)

        @app.exception_handler(ValidationError)
        async def validation_error(request: Request, err: ValidationError) -> JSONResponse:
            return JSONResponse(status_code=422, content={"detail": json_value(err.errors())})

        for kind in (KeyError, ValueError, TypeError, RuntimeError, IndexError):
            app.add_exception_handler(kind, _env_error_response)

    # -------------------------------------------------------------------------------- the socket
    async def _serve_socket(self, websocket: WebSocket) -> None:
        await websocket.accept()
        sid: str | None = None
        keep = True  # a dropped connection keeps its session; an explicit close or a fatal error does not
        try:
            if self.draining:
                await _send(websocket, _error("The server is shutting down; connect to another replica.",
                                              SHUTTING_DOWN))
                return
            wanted_session = websocket.query_params.get("session_id")
            wanted_episode = websocket.query_params.get("episode_id")
            if wanted_session is not None or wanted_episode is not None:
                try:
                    sid = self.find_session(wanted_session, wanted_episode)
                except KeyError as err:
                    await _send(websocket, _error(err.args[0], UNKNOWN_SESSION))
                    return
                extra = self._extra[sid]
                old = extra.socket
                extra.socket, extra.detached_at = websocket, None
                if old is not None and old is not websocket:
                    # The newest socket takes over (the old one is usually half-open after a network fault).
                    await _close_quietly(old, code=4000, reason="taken over by a resumed connection")
                log.info("session %s resumed", sid)
            else:
                try:
                    sid, _ = await self._new_session()
                except SessionCapacityError as err:
                    await _send(websocket, _error(str(err), WSErrorCode.CAPACITY_REACHED.value,
                                                  active_sessions=err.active_sessions, max_sessions=err.max_sessions))
                    return
                except EnvironmentFactoryError as err:
                    await _send(websocket, _error(str(err), WSErrorCode.FACTORY_ERROR.value))
                    return
                self._extra[sid].socket = websocket
            self._session_websocket_attachments.add(sid)
            self._update_session_activity(sid)
            keep = await self._message_loop(websocket, sid)
        except WebSocketDisconnect:
            keep = True
        finally:
            if sid is not None and sid in self._extra:
                extra = self._extra[sid]
                if extra.socket is websocket:
                    extra.socket = None
                    self._session_websocket_attachments.discard(sid)
                    if keep:
                        extra.detached_at = time.monotonic()
                        log.info("session %s detached; kept %g s for a resume", sid, self.resume_timeout_s)
                    else:
                        await self.close_session(sid)
            await _close_quietly(websocket)

    async def _message_loop(self, websocket: WebSocket, sid: str) -> bool:
        """Answer messages until the socket drops (True: keep the session) or the client closes it (False)."""
        while True:
            try:
                message = await asyncio.wait_for(websocket.receive(), timeout=self.idle_timeout_s)
            except asyncio.TimeoutError:
                await _send(websocket, _error(f"No message for {self.idle_timeout_s:g} s: the session is closed.",
                                              IDLE_TIMEOUT))
                return False
            if message["type"] == "websocket.disconnect":
                return True
            raw = message.get("text")
            if raw is None:
                data = message.get("bytes") or b""
                if len(data) > self.max_message_bytes:
                    await _send(websocket, _too_large(len(data), self.max_message_bytes))
                    continue
                try:
                    raw = data.decode("utf-8")
                except UnicodeDecodeError:
                    await _send(websocket, _error("A binary message must be UTF-8 JSON.",
                                                  WSErrorCode.INVALID_JSON.value))
                    continue
            if len(raw) > self.max_message_bytes:
                await _send(websocket, _too_large(len(raw), self.max_message_bytes))
                continue
            try:
                msg = json.loads(raw)
            except ValueError as err:
                await _send(websocket, _error(f"Invalid JSON: {err}", WSErrorCode.INVALID_JSON.value))
                continue
            if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
                await _send(websocket, _error('A message is a JSON object {"type": ..., "data": {...}}.',
                                              WSErrorCode.VALIDATION_ERROR.value))
                continue
            kind = msg["type"]
            if kind == "close":
                return False
            data = msg.get("data", {})
            if not isinstance(data, dict):
                await _send(websocket, _error(f"'data' must be a JSON object, got {type(data).__name__}.",
                                              WSErrorCode.VALIDATION_ERROR.value))
                continue
            reply = await self._answer(sid, kind, data)
            self._update_session_activity(sid, increment_step=kind == "step")
            try:
                await _send(websocket, reply)
            except (WebSocketDisconnect, RuntimeError):
                return True  # the answer is kept (the step's replay) for the resumed connection

    async def _answer(self, sid: str, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        env: ServedEnv = self._sessions[sid]
        extra = self._extra[sid]
        if kind in ("reset", "step", "fork") and self.draining:
            return _error("The server is shutting down: this request was not applied.", SHUTTING_DOWN)
        with self._inflight_lock:
            self._inflight += 1
        try:
            async with extra.lock:
                if kind == "reset":
                    async with self._step_slots:
                        obs = await self._run_in_session_executor(sid, env.reset, **data)
                    return {"type": "observation", "data": _serialize(obs)}
                if kind == "step":
                    action = MultiAgentAction.model_validate(data)
                    async with self._step_slots:
                        obs = await self._run_in_session_executor(sid, env.step, action)
                    return {"type": "observation", "data": _serialize(obs)}
                if kind == "state":
                    state = await self._run_in_session_executor(sid, lambda: env.state)
                    return {"type": "state", "data": state.model_dump()}
                if kind == "observe":
                    if set(data) != {"agent"}:
                        raise TypeError(f"observe takes {{'agent': name}}, got keys {sorted(data)}.")
                    wire = await self._run_in_session_executor(sid, env.observe, data["agent"])
                    return {"type": "observation", "data": {"agent": data["agent"], "observation": wire}}
                if kind == "fork":
                    copy_env = await self._run_in_session_executor(sid, env.fork)
                    new_sid, _ = await self._new_session(copy_env)
                    self._extra[new_sid].detached_at = time.monotonic()  # resumable, reaped if never attached
                    return {"type": "fork", "data": {"session_id": new_sid}}
                return _error(f"Unknown message type {kind!r}; the types are reset, step, state, observe, fork, "
                              "close.", WSErrorCode.UNKNOWN_TYPE.value)
        except ValidationError as err:
            return _error(f"Invalid {kind} message: {_validation_text(err)}", WSErrorCode.VALIDATION_ERROR.value,
                          errors=json_value(err.errors(include_url=False, include_context=False)))
        except SessionCapacityError as err:
            return _error(str(err), WSErrorCode.CAPACITY_REACHED.value)
        except Exception as err:  # the env's own errors: reported, the session unchanged (the env's contract)
            kind_name = type(err).__name__
            text = err.args[0] if isinstance(err, KeyError) and len(err.args) == 1 else str(err)
            if kind_name not in ERROR_TYPES:
                log.exception("session %s: %s failed", sid, kind)
            return _error(str(text), WSErrorCode.EXECUTION_ERROR.value, error_type=kind_name)
        finally:
            with self._inflight_lock:
                self._inflight -= 1


def _serialize(obs: Observation) -> dict[str, Any]:
    data = obs.model_dump(exclude={"reward", "done"})
    data["observations"] = {a: {k: v for k, v in o.items() if v is not None} for a, o in data["observations"].items()}
    return {"observation": data, "reward": obs.reward, "done": obs.done, "metadata": obs.metadata}


def _error(message: str, code: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code, **extra}}


def _too_large(size: int, limit: int) -> dict[str, Any]:
    return _error(f"The message is {size} bytes, over the server's max_message_bytes={limit}; it was not read.",
                  MESSAGE_TOO_LARGE)


def _validation_text(err: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'message'}: {e['msg']}" for e in err.errors())


async def _send(websocket: WebSocket, payload: dict[str, Any]) -> None:
    await websocket.send_text(json.dumps(payload, allow_nan=False, separators=(",", ":")))


async def _close_quietly(websocket: WebSocket, code: int = 1000, reason: str = "") -> None:
    if websocket.client_state == WebSocketState.DISCONNECTED or websocket.application_state == \
            WebSocketState.DISCONNECTED:
        return
    try:
        await websocket.close(code=code, reason=reason)
    except (RuntimeError, WebSocketDisconnect):
        pass


async def _env_error_response(request: Request, err: Exception) -> JSONResponse:
    text = err.args[0] if isinstance(err, KeyError) and len(err.args) == 1 else str(err)
    return JSONResponse(status_code=400, content={"detail": str(text), "error_type": type(err).__name__})


def create_app(env_id: str, *, max_sessions: int = DEFAULT_MAX_SESSIONS,
               resume_timeout_s: float = DEFAULT_RESUME_TIMEOUT_S, idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
               max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES, drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
               replica: str | None = None, max_concurrent_steps: int = DEFAULT_MAX_CONCURRENT_STEPS,
               **make_kwargs: Any) -> FastAPI:
    """The OpenEnv app serving ``llm_envs.make(env_id, **make_kwargs)``, one env per WebSocket session.

    Args:
        env_id: a registered id (``llm_envs.list_envs()``).
        max_sessions: sessions at once (connected or waiting for a resume); past it a new socket gets OpenEnv's
            ``CAPACITY_REACHED`` error.
        resume_timeout_s: how long a session whose connection dropped is kept for its client to resume it.
        idle_timeout_s: how long a connected socket may stay silent before its session is closed.
        max_message_bytes: the longest message read; a longer one gets ``MESSAGE_TOO_LARGE``.
        drain_timeout_s: on SIGTERM (:func:`serve`), how long steps in flight may take to finish.
        replica: this replica's name, the prefix of its session ids (``r1-...``), so that a proxy in front of
            several replicas sends a resumed connection (``/ws?session_id=r1-...``) to the replica that holds it.
        max_concurrent_steps: resets and steps that run at once (:data:`DEFAULT_MAX_CONCURRENT_STEPS`: twice the
            cores); the others wait their turn, so a code env runs that many programs at most.
        **make_kwargs: arguments of ``llm_envs.make`` (``protocol=``, ``max_new_tokens=``, ...).

    The app's ``state.llm_env_server`` is the :class:`LLMEnvServer`.
    """
    server = LLMEnvServer(env_id, make_kwargs, max_sessions=max_sessions, resume_timeout_s=resume_timeout_s,
                          idle_timeout_s=idle_timeout_s, max_message_bytes=max_message_bytes,
                          drain_timeout_s=drain_timeout_s, replica=replica, max_concurrent_steps=max_concurrent_steps)
    app = FastAPI(title=f"llm-envs: {env_id}", version=f"{llm_envs.__version__}+wire{WIRE_VERSION}",
                  description=f"The llm-envs env {env_id!r} served over OpenEnv: "
                              f"{server.probe.get_metadata().description}")
    server.register(app)
    app.state.llm_env_server = server
    return app
