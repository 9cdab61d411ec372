"""The parallel protocol: every role acts at once each turn; the joint reward goes to every agent.

This is MAGRPO's setting. With ``num_turns > 1`` the task's feedback on turn t (and each role's own
previous response) goes into that role's prompt of turn t+1.

=====================  =================================================================
Agents                 the task's roles (``env.possible_agents``)
Observation space      ``Dict(observation=Box(0, V-1, (L,), int64), attention_mask=Box(0, 1, (L,), int8))``,
                       left-padded with the tokenizer's pad id (with a tokenizer per agent: each
                       agent's own V and pad id)
Action space           ``Box(0, V-1, (max_new_tokens,), int64)``; ids after the first EOS/pad are
                       ignored; a ``str`` is accepted and tokenized
Reward                 the task's joint reward (or per-role rewards if the task defines them), each turn
Termination            after ``num_turns`` turns; truncation after ``max_cycles`` turns if fewer
Infos                  numbers only, same keys at reset and every step: ``turn``, ``task_index``,
                       ``prompt_tokens``, ``prompt_truncated``, ``response_tokens``, ``reward_total``,
                       ``reward_<component>``
=====================  =================================================================

On termination the returned observations are the last prompts (there is no next prompt); on
truncation they are the prompts of the turn that would have followed.

Token mode (``step_unit="token"``; see :mod:`llm_envs.core.base`): every live agent steps one token id
(``Discrete(V)``) per step. An agent whose response has ended (EOS/pad, or ``max_new_tokens``
tokens) steps the pad id, as its ``action_mask`` says, until all have ended; that step resolves the
turn as in response mode. Other steps return reward 0.0 and infos with the same keys
(``response_tokens`` counts the tokens so far, ``reward_*`` are 0.0). ``obs_format="flat"`` returns
one int64 vector per agent instead of the Dict.

>>> import llm_envs
>>> env = llm_envs.make("writing/xsum-v0", step_unit="token", max_new_tokens=4)
>>> obs, infos = env.reset(seed=0)
>>> sorted(obs["brief"])
['action_mask', 'attention_mask', 'observation']
>>> steps = 0
>>> while env.agents:
...     _, rewards, terms, truncs, infos = env.step({a: 30 for a in env.agents})
...     steps += 1
>>> steps, env.history[-1].outputs["brief"].ids
(4, (30, 30, 30, 30))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pettingzoo import ParallelEnv

from llm_envs.core.base import RENDER_MODES, LLMEnvCore
from llm_envs.core.task import Response, Task


def check_step_call(env: Any, actions: Any) -> None:
    """What a parallel ``step`` refuses before looking at the actions: a step before reset or after the episode's
    end, and actions that are not a mapping (the local env's and the remote env's, with the same messages)."""
    env._require_started()
    if not env.agents:
        raise RuntimeError("The episode is over: call reset() before step().")
    if not isinstance(actions, Mapping):
        raise TypeError(f"actions must be a dict {{agent: action}}, got {type(actions).__name__}.")


class ParallelLLMEnv(LLMEnvCore, ParallelEnv):
    """A task under the parallel protocol (a ``pettingzoo.ParallelEnv``). See the module docstring;
    the arguments are those of :class:`~llm_envs.core.base.LLMEnvCore`."""

    protocol = "parallel"
    """The protocol this env runs under (``llm_envs.remote`` envs have it too)."""

    def __init__(self, task: Task, **kwargs: Any) -> None:
        self._init_core(task, **kwargs)
        self.metadata = {
            "name": self.env_id,
            "render_modes": list(RENDER_MODES),
            "is_parallelizable": True,
            "render_fps": 1,
        }

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        self._start_episode(seed, options)
        self.agents = list(self.possible_agents)
        self._log_prompts(self.agents)
        observations = {a: self._observation(a) for a in self.agents}
        infos = {a: self._info(a, None, None) for a in self.agents}
        return observations, infos

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        check_step_call(self, actions)
        unknown = [a for a in actions if a not in self.agents]
        missing = [a for a in self.agents if a not in actions]
        if unknown or missing:
            raise KeyError(
                f"actions must have exactly one entry per live agent {self.agents}; "
                f"missing {missing}, unknown {unknown}."
            )
        if self.step_unit == "token":
            return self._step_token(actions)
        # Parse everything before touching state, so a rejected step leaves the env as it was.
        outputs: dict[str, Response] = {a: self.parse_action(a, actions[a]) for a in self.agents}
        return self._finish_turn(outputs)

    def _step_token(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        tokens = {a: self.parse_token(a, actions[a]) for a in self.agents}  # raises before any change
        for agent, token in tokens.items():
            if agent not in self._finished:
                self._push_token(agent, token)
        if len(self._finished) == len(self.agents):
            return self._finish_turn({a: self._finished[a] for a in self.agents})
        acting = self.agents
        observations = {a: self._observation(a) for a in acting}
        rewards = dict.fromkeys(acting, 0.0)
        flags = dict.fromkeys(acting, False)
        infos = {a: self._info(a, None, None, len(self._response_ids[a])) for a in acting}
        return observations, rewards, flags, dict(flags), infos

    def _finish_turn(self, outputs: dict[str, Response]) -> tuple[dict, dict, dict, dict, dict]:
        record = self._resolve_turn(outputs)
        terminated, truncated = self._episode_over()
        acting = list(self.agents)
        if not terminated:
            self._log_prompts(acting)
        observations = {a: self._observation(a) for a in acting}
        rewards = {a: record.agent_rewards[a] for a in acting}
        terminations = dict.fromkeys(acting, terminated)
        truncations = dict.fromkeys(acting, truncated)
        infos = {a: self._info(a, record, outputs[a]) for a in acting}
        if terminated or truncated:
            self.agents = []
        return observations, rewards, terminations, truncations, infos

    def _composing(self, agent: str) -> bool:
        # The episode-over check closes the masks of the final observations, built before agents empties.
        return agent in self.agents and agent not in self._finished and not any(self._episode_over())

    def _observe_role(self, role: str):  # type: ignore[override]
        # After termination the turn counter is past the last turn: show the last prompt.
        if self._turn >= self.num_turns and self._history:
            saved_turn, saved_history = self._turn, self._history
            self._turn, self._history = self._turn - 1, self._history[:-1]
            try:
                return super()._observe_role(role)
            finally:
                self._turn, self._history = saved_turn, saved_history
        return super()._observe_role(role)
