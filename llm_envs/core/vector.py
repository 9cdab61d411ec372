"""A vector helper for learners: N parallel envs stepped together, observations stacked.

Each env is reset with its own seed and options, so a GRPO-style group of G envs can share one
problem (``options={"task_index": i}``) while B groups cover B problems::

    >>> import llm_envs
    >>> from llm_envs.core.vector import VectorEnv
    >>> venv = VectorEnv("writing/xsum-v0", num_envs=4)
    >>> obs, infos = venv.reset(seed=0, options=[{"task_index": 7}] * 4)
    >>> obs["brief"]["observation"].shape[0], infos["brief"]["task_index"].tolist()
    (4, [7, 7, 7, 7])

There is no auto-reset: every env of a batch runs the same number of turns, so they finish together;
call :meth:`reset` for the next batch. Stacked infos are numpy arrays keyed like an env's infos.

``step_unit`` and ``obs_format`` are ordinary kwargs. In token mode (``step_unit="token"``) actions
are one token id per env, ``actions[agent]`` of shape (N,), and the envs of a batch end at different
steps (their responses end at different tokens): an env that has finished keeps returning its last
observation (action mask: pad only), reward 0.0 and its final termination/truncation flags, and its
rows must be the pad id, until every env has finished (``venv.done`` says which have)::

    >>> venv = VectorEnv("writing/xsum-v0", num_envs=2, step_unit="token", max_new_tokens=2)
    >>> obs, _ = venv.reset(seed=0)
    >>> obs["brief"]["action_mask"].shape == (2, venv.envs[0].vocab_size)
    True
    >>> _ = venv.step({a: np.array([venv.envs[0].pad_token_id, 30]) for a in venv.agents})
    >>> venv.done.tolist(), venv.agents
    ([True, False], ['brief', 'detailed'])
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from llm_envs.core.parallel import ParallelLLMEnv
from llm_envs.core.task import Task


class VectorEnv:
    """N copies of a parallel env (the first is built, the others are deep copies of it).

    Args:
        env: a registered id, a :class:`ParallelLLMEnv`, or a zero-argument factory returning one.
        num_envs: number of envs N.
        **kwargs: passed to :func:`llm_envs.make` when ``env`` is an id.
    """

    def __init__(self, env: str | ParallelLLMEnv | Callable[[], ParallelLLMEnv], num_envs: int, **kwargs: Any):
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}.")
        if isinstance(env, str):
            from llm_envs.core.registry import make

            first = make(env, protocol="parallel", **kwargs)
        elif isinstance(env, ParallelLLMEnv):
            if kwargs:
                raise TypeError(f"kwargs {sorted(kwargs)} only apply when env is an id.")
            first = env
        elif callable(env):
            first = env()
        else:
            raise TypeError(f"env must be an env id, a ParallelLLMEnv or a factory, got {type(env).__name__}.")
        if not isinstance(first, ParallelLLMEnv):
            raise TypeError(f"VectorEnv needs parallel llm_envs envs, got {type(first).__name__}.")
        self.envs = [first] + [copy.deepcopy(first) for _ in range(num_envs - 1)]
        self.num_envs = num_envs
        self.possible_agents = list(first.possible_agents)
        self.agents: list[str] = []
        self.step_unit = first.step_unit
        self.done = np.zeros(num_envs, dtype=bool)
        """Which envs of the batch have finished their episode (token mode: they wait for the rest)."""
        self._last: list[tuple[dict, dict, dict, dict, dict] | None] = [None] * num_envs

    @property
    def tokenizer(self) -> Any:
        """The tokenizer of the batch's envs (read-only; every copy shares the first env's)."""
        return self.envs[0].tokenizer

    def split_flat(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """``obs_format="flat"``: cut stacked flat observations (N, D) into their parts (see
        :meth:`llm_envs.core.base.LLMEnvCore.split_flat`)."""
        return self.envs[0].split_flat(flat)

    def observation_space(self, agent: str) -> Any:
        """The space of one env's observation (stacked arrays add a leading N axis)."""
        return self.envs[0].observation_space(agent)

    def action_space(self, agent: str) -> Any:
        return self.envs[0].action_space(agent)

    def reset(
        self,
        seed: int | Sequence[int | None] | None = None,
        options: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
    ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict[str, np.ndarray]]]:
        """Reset every env. ``seed``: one int (env i gets ``seed + i``), a list of N seeds, or None.
        ``options``: one dict for all envs or a list of N dicts."""
        seeds = self._per_env("seed", seed, lambda s, i: None if s is None else int(s) + i)
        opts = self._per_env("options", options, lambda o, i: o)
        results = [env.reset(seed=s, options=o) for env, s, o in zip(self.envs, seeds, opts)]
        self.agents = list(self.possible_agents)
        self.done = np.zeros(self.num_envs, dtype=bool)
        self._last = [None] * self.num_envs
        return self._stack_obs([r[0] for r in results]), self._stack_infos([r[1] for r in results])

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Step every env. ``actions[agent]`` is an (N, T) integer array, or a list of N actions (token
        id arrays or strings); in token mode an (N,) array of token ids. Returns stacked observations,
        rewards (N,), terminations (N,), truncations (N,) and infos per agent."""
        if not self.agents:
            raise RuntimeError("Call reset() before step() (the batch is over or was never started).")
        if not isinstance(actions, Mapping) or set(actions) != set(self.agents):
            got = sorted(actions) if isinstance(actions, Mapping) else type(actions).__name__
            raise KeyError(f"actions must have one entry per agent {self.agents}, got {got}.")
        for agent, batch in actions.items():
            if len(batch) != self.num_envs:
                raise ValueError(f"actions[{agent!r}] has {len(batch)} rows, expected num_envs={self.num_envs}.")
        # Validate every env's actions before stepping any, so a bad row leaves the whole batch as it was.
        for i, env in enumerate(self.envs):
            for agent in self.agents:
                if self.done[i]:
                    self._check_pad(i, agent, actions[agent][i])
                else:
                    env.check_action(agent, actions[agent][i])
        self._prepare_rewards(actions)
        results = []
        for i, env in enumerate(self.envs):
            if self.done[i]:
                results.append(self._waiting_result(i))
                continue
            result = env.step({a: actions[a][i] for a in self.agents})
            results.append(result)
            if not env.agents:
                self.done[i] = True
                self._last[i] = result
        obs = self._stack_obs([r[0] for r in results])
        rewards = {a: np.array([r[1][a] for r in results], dtype=np.float64) for a in self.agents}
        terms = {a: np.array([r[2][a] for r in results], dtype=bool) for a in self.agents}
        truncs = {a: np.array([r[3][a] for r in results], dtype=bool) for a in self.agents}
        infos = self._stack_infos([r[4] for r in results])
        if all(not env.agents for env in self.envs):
            self.agents = []
        elif any(not env.agents for env in self.envs) and self.step_unit != "token":
            raise RuntimeError("Envs of one batch finished at different turns; give them the same num_turns.")
        return obs, rewards, terms, truncs, infos

    def _prepare_rewards(self, actions: Mapping[str, Any]) -> None:
        """Hand every env's turn of this step to the task at once (:meth:`Task.prepare_rewards`: the
        coding tasks run the programs of the whole batch concurrently). In token mode the envs end
        their turns at different steps, so each scores its own."""
        task = self.envs[0].task
        if self.step_unit == "token" or type(task).prepare_rewards is Task.prepare_rewards:
            return
        turns = [(env.problem, {a: env.parse_action(a, actions[a][i]).text for a in self.agents})
                 for i, env in enumerate(self.envs) if not self.done[i]]
        if len(turns) > 1:
            task.prepare_rewards(turns)

    def _check_pad(self, i: int, agent: str, action: Any) -> None:
        pad = self.envs[i].pad_token_id
        if not (isinstance(action, (int, np.integer)) and not isinstance(action, (bool, np.bool_)) and action == pad):
            shown = int(action) if isinstance(action, np.integer) else action
            raise ValueError(
                f"Env {i} of the batch has finished its episode: actions[{agent!r}][{i}] must be the pad id {pad} "
                f"(its action mask), got {shown!r}."
            )

    def _waiting_result(self, i: int) -> tuple[dict, dict, dict, dict, dict]:
        """A finished env's step while the others go on: last observation, reward 0, final flags."""
        obs, _, terms, truncs, infos = self._last[i]  # type: ignore[misc]
        return obs, dict.fromkeys(obs, 0.0), terms, truncs, infos

    def texts(self, agent: str) -> list[str]:
        """Each env's current prompt text for ``agent``."""
        return [env.text(agent) for env in self.envs]

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def _per_env(self, name: str, value: Any, broadcast: Callable[[Any, int], Any]) -> list[Any]:
        if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
            if len(value) != self.num_envs:
                raise ValueError(f"{name} has {len(value)} entries, expected num_envs={self.num_envs}.")
            return list(value)
        return [broadcast(value, i) for i in range(self.num_envs)]

    def _stack_obs(self, per_env: list[dict[str, Any]]) -> dict[str, Any]:
        agents = per_env[0].keys()
        if self.envs[0].obs_format == "flat":
            return {a: np.stack([o[a] for o in per_env]) for a in agents}
        return {a: {k: np.stack([o[a][k] for o in per_env]) for k in per_env[0][a]} for a in agents}

    def _stack_infos(self, per_env: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, np.ndarray]]:
        agents = per_env[0].keys()
        return {a: {k: np.array([i[a][k] for i in per_env]) for k in per_env[0][a]} for a in agents}
