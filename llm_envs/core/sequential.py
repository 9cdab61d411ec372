"""The sequential protocol: roles act in a fixed order within a turn, and a later role sees the
earlier roles' outputs of the same turn (CORY's pioneer -> observer).

=====================  =================================================================
Agents                 the task's roles, acting in that order (``env.possible_agents``)
Observation space      ``Dict(observation=Box(0, V-1, (L,), int64), attention_mask=Box(0, 1, (L,), int8))``
Action space           ``Box(0, V-1, (max_new_tokens,), int64)`` (or a ``str``)
Reward                 delivered to every agent when the turn resolves (after the last role acts)
Termination            after ``num_turns`` turns; truncation after ``max_cycles`` turns if fewer;
                       then each agent is stepped once with ``None`` (PettingZoo's AEC convention)
=====================  =================================================================

``observe(agent)`` is the agent's prompt given what is visible now: for a role that has not acted
yet in the current turn it includes the outputs of the roles that already acted (as their token ids,
or, when a role has another tokenizer than the writer's, as their text encoded with its own: with
``tokenizer={agent: tok}`` each agent has its own V, pad id and chat template).

Token mode (``step_unit="token"``; see :mod:`llm_envs.core.base`): the selected agent steps one token
id (``Discrete(V)``) per step and ``agent_selection`` stays on it until its response ends (EOS/pad,
or ``max_new_tokens`` tokens); then the next role composes, seeing the finished response. Only the
selected, composing agent's ``action_mask`` is open; the others allow only the pad id. Rewards are
0.0 until the last role's response ends and the turn resolves as in response mode; ``infos`` change
only then, as in response mode.

>>> import llm_envs
>>> env = llm_envs.make("writing/xsum-v0", protocol="sequential", step_unit="token", max_new_tokens=3)
>>> env.reset(seed=0)
>>> env.step(30)
>>> env.agent_selection, int(env.observe("brief")["action_mask"].sum())
('brief', 49152)
>>> env.step(env.pad_token_id)
>>> env.agent_selection
'detailed'
"""

from __future__ import annotations

from typing import Any

from pettingzoo import AECEnv

from llm_envs.core.base import RENDER_MODES, LLMEnvCore
from llm_envs.core.task import Task


class SequentialLLMEnv(LLMEnvCore, AECEnv):
    """A task under the sequential protocol (a ``pettingzoo.AECEnv``). See the module docstring; the
    arguments are those of :class:`~llm_envs.core.base.LLMEnvCore`."""

    protocol = "sequential"
    """The protocol this env runs under (``llm_envs.remote`` envs have it too)."""

    def __init__(self, task: Task, **kwargs: Any) -> None:
        self._init_core(task, **kwargs)
        self.metadata = {
            "name": self.env_id,
            "render_modes": list(RENDER_MODES),
            # Later roles must see earlier actions, which aec_to_parallel cannot provide.
            "is_parallelizable": False,
            "render_fps": 1,
        }
        self.rewards: dict[str, float] = {}
        self._cumulative_rewards: dict[str, float] = {}
        self.terminations: dict[str, bool] = {}
        self.truncations: dict[str, bool] = {}
        self.infos: dict[str, dict[str, Any]] = {}
        self.agent_selection = self.possible_agents[0]
        self._last_output: dict[str, Any] = {}

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self._start_episode(seed, options)
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self._last_output = {}
        self.infos = {a: self._info(a, None, None) for a in self.agents}
        self.agent_selection = self.agents[0]
        self._log_prompts([self.agent_selection])

    def observe(self, agent: str) -> dict[str, Any]:
        self._check_agent_name(agent)
        self._require_started()
        return self._observation(agent)

    def step(self, action: Any) -> None:
        self._require_started()
        if not self.agents:
            raise RuntimeError("The episode is over: call reset() before step().")
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            if action is not None:
                raise ValueError(
                    f"Agent {agent!r} is done (terminated or truncated): step it with None, got {action!r}."
                )
            self._was_dead_step(action)
            return
        if self.step_unit == "token":
            token = self.parse_token(agent, action)  # raises before any state changes
            self._cumulative_rewards[agent] = 0.0
            self.rewards = dict.fromkeys(self.agents, 0.0)
            ended = self._push_token(agent, token)
            if ended is None:
                self._accumulate_rewards()
                return
            response = ended
        else:
            response = self.parse_action(agent, action)  # raises before any state changes
            self._cumulative_rewards[agent] = 0.0
            self.rewards = dict.fromkeys(self.agents, 0.0)
        self._visible[agent] = response
        self._last_output[agent] = response
        order = self.possible_agents
        position = order.index(agent)
        if position + 1 < len(order):
            self.agent_selection = order[position + 1]
            self._log_prompts([self.agent_selection])
        else:
            outputs = {role: self._visible[role] for role in order}
            record = self._resolve_turn(outputs)
            terminated, truncated = self._episode_over()
            self.rewards = {a: record.agent_rewards[a] for a in self.agents}
            for a in self.agents:
                self.terminations[a] = terminated
                self.truncations[a] = truncated
                self.infos[a] = self._info_after(a, record)
            self.agent_selection = order[0]
            if not (terminated or truncated):
                self._log_prompts([self.agent_selection])
        self._accumulate_rewards()

    def _composing(self, agent: str) -> bool:
        return (
            agent == self.agent_selection
            and agent in self.agents
            and not (self.terminations[agent] or self.truncations[agent])
            and agent not in self._finished
        )

    def _info_after(self, agent: str, record) -> dict[str, Any]:
        return self._info(agent, record, self._last_output.get(agent))

    def _observe_role(self, role: str):  # type: ignore[override]
        # After the last turn there is no next prompt: show each role's prompt of the last turn,
        # with the outputs it saw then.
        if self._turn >= self.num_turns and self._history:
            saved = (self._turn, self._history, self._visible)
            last = self._history[-1]
            order = self.possible_agents
            self._turn, self._history = self._turn - 1, self._history[:-1]
            self._visible = {r: last.outputs[r] for r in order[: order.index(role)]}
            try:
                return super()._observe_role(role)
            finally:
                self._turn, self._history, self._visible = saved
        if self._visible:
            # A role that already acted this turn keeps seeing the prompt it acted on.
            order = self.possible_agents
            before = order[: order.index(role)]
            if any(r not in before for r in self._visible):
                saved_visible = self._visible
                self._visible = {r: v for r, v in saved_visible.items() if r in before}
                try:
                    return super()._observe_role(role)
                finally:
                    self._visible = saved_visible
        return super()._observe_role(role)
