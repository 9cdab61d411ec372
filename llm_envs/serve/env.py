"""One session of a served env (:mod:`llm_envs.serve.server`): the wire models OpenEnv publishes at ``/schema``
(an action of every acting agent, an observation of every agent, the session's state) and :class:`ServedEnv`, an
``llm_envs.make(id)`` env behind OpenEnv's ``Environment``, with the replays that make a resent reset or step
exactly-once, the sequential protocol's turn check and OpenEnv's task API."""

from __future__ import annotations

import copy
import uuid
from typing import Any, Literal

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, EnvironmentMetadata, Observation, State
from pydantic import BaseModel, Field

import llm_envs
from llm_envs.core.parallel import ParallelLLMEnv
from llm_envs.serve.wire import decode_action, encode_observation, encode_state, json_value

RESET_KEYWORDS = ("seed", "episode_id", "task_index", "split", "options")


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

    def check(self, agent: str, action: Any) -> None:
        """Check one agent's action by the env's own rules (``env.check_action``) without stepping: what a batch of
        remote envs asks of every row before any of them steps."""
        if self.episode_id is None:
            raise RuntimeError("Call reset() before checking an action: this session has no episode yet.")
        if not isinstance(agent, str):
            raise TypeError(f"check takes an agent name, got {type(agent).__name__}.")
        self.env._check_agent_name(agent)
        self.env.check_action(agent, decode_action(action))

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
            last_observation=serialize(self._last) if self._last is not None else None,
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


def serialize(obs: Observation) -> dict[str, Any]:
    """An observation as an ``observation`` answer's data (OpenEnv's layout; unused agent fields left out)."""
    data = obs.model_dump(exclude={"reward", "done"})
    data["observations"] = {a: {k: v for k, v in o.items() if v is not None} for a, o in data["observations"].items()}
    return {"observation": data, "reward": obs.reward, "done": obs.done, "metadata": obs.metadata}
