"""Batches of envs: N envs of one id stepped together, observations stacked. ``make_vec(id, n)`` gives
the batch for the id's protocol (the name Gymnasium uses): :class:`VectorEnv` for parallel ids,
:class:`SequentialVectorEnv` for sequential ones (CORY's pioneer -> observer). No torch here.

Both classes share one contract:

- ``reset(seed, options)``: ``seed`` is one int (env i gets ``seed + i``), N seeds or None; ``options``
  one dict for every env or N dicts. Each env is reset with its own, so a GRPO-style group of G envs
  can share one problem (``options={"task_index": i}``) while B groups cover B problems.
- ``agents`` lists the roles that act at the next ``step`` (``[]`` once the batch is over);
  observations are stacked for those roles only: ``obs[agent]["observation"]`` is (N, L).
- ``step(actions)`` takes ``{agent: (N, T) token ids, or N strings}`` for exactly those roles and
  returns stacked observations, rewards (N,) for every role, terminations (N,), truncations (N,) and
  infos (numpy arrays keyed like an env's infos). Every row is validated before any env steps, so a
  bad row leaves the whole batch as it was.
- There is no auto-reset: the envs of a batch run the same number of turns and finish together;
  call ``reset`` for the next batch. ``envs`` are the N envs themselves (transcripts, task).

Parallel ids: every role acts at each step::

    >>> import llm_envs
    >>> venv = llm_envs.make_vec("writing/xsum-v0", 4)
    >>> obs, infos = venv.reset(seed=0, options=[{"task_index": 7}] * 4)
    >>> obs["brief"]["observation"].shape[0], infos["brief"]["task_index"].tolist()
    (4, [7, 7, 7, 7])

Sequential ids: one role at a time, each seeing the earlier roles' responses of the turn; the rewards
come when the last role's step resolves the turn (0.0 before)::

    >>> venv = llm_envs.make_vec("sentiment/imdb-cory-v0", 2, max_new_tokens=4)
    >>> obs, _ = venv.reset(seed=0)
    >>> venv.agents, list(obs)
    (['pioneer'], ['pioneer'])
    >>> _, rewards, *_ = venv.step({"pioneer": ["was great", "was awful"]})
    >>> venv.agents, rewards["pioneer"].tolist()
    (['observer'], [0.0, 0.0])
    >>> _, rewards, terms, _, _ = venv.step({"observer": ["a joy", "a mess"]})
    >>> venv.agents, bool(terms["observer"].all()), bool((rewards["pioneer"] == rewards["observer"]).all())
    ([], True, True)

``step_unit`` and ``obs_format`` are ordinary kwargs. In token mode (``step_unit="token"``, parallel
ids only) actions are one token id per env, ``actions[agent]`` of shape (N,), and the envs of a batch
end at different steps (their responses end at different tokens): an env that has finished keeps
returning its last observation (action mask: pad only), reward 0.0 and its final
termination/truncation flags, and its rows must be the pad id, until every env has finished
(``venv.done`` says which have)::

    >>> from llm_envs.core.vector import VectorEnv
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
from llm_envs.core.sequential import SequentialLLMEnv
from llm_envs.core.task import Task


def make_vec(env_id: str, num_envs: int, **kwargs: Any) -> VectorEnv | SequentialVectorEnv:
    """``num_envs`` envs of ``env_id`` as one batch: a :class:`VectorEnv` when the id runs under the
    parallel protocol, a :class:`SequentialVectorEnv` under the sequential one. ``kwargs`` go to
    :func:`llm_envs.make` (``protocol=`` picks a protocol other than the id's registered one).

    >>> import llm_envs
    >>> type(llm_envs.make_vec("sentiment/imdb-cory-v0", 2)).__name__
    'SequentialVectorEnv'
    >>> type(llm_envs.make_vec("writing/xsum-v0", 2, protocol="sequential")).__name__
    'SequentialVectorEnv'
    """
    from llm_envs.core.registry import spec

    protocol = kwargs.pop("protocol", None) or spec(env_id).protocol
    if protocol == "sequential":
        return SequentialVectorEnv(env_id, num_envs, **kwargs)
    if protocol == "parallel":
        return VectorEnv(env_id, num_envs, **kwargs)
    raise ValueError(f"protocol must be 'parallel' or 'sequential', got {protocol!r}.")


class _Batch:
    """What both batches share: N copies of one env, per-env seeds and options, the spaces and text."""

    protocol: str
    env_class: type

    def _build(self, env: Any, num_envs: int, kwargs: Mapping[str, Any]) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}.")
        name = type(self).__name__
        if isinstance(env, str):
            from llm_envs.core.registry import make

            first = make(env, protocol=self.protocol, **kwargs)
        elif isinstance(env, self.env_class):
            if kwargs:
                raise TypeError(f"kwargs {sorted(kwargs)} only apply when env is an id.")
            first = env
        elif callable(env):
            first = env()
        else:
            raise TypeError(
                f"env must be an env id, a {self.env_class.__name__} or a factory, got {type(env).__name__}."
            )
        # llm_envs' own envs, or an env of another kind that runs the protocol (llm_envs.remote's).
        if not isinstance(first, self.env_class) and getattr(first, "protocol", None) != self.protocol:
            raise TypeError(f"{name} needs {self.protocol} llm_envs envs, got {type(first).__name__}.")
        self.envs = [first] + [copy.deepcopy(first) for _ in range(num_envs - 1)]
        self.num_envs = num_envs
        self.possible_agents = list(first.possible_agents)
        self.agents: list[str] = []
        self.step_unit = first.step_unit
        self.done = np.zeros(num_envs, dtype=bool)
        """Which envs of the batch have finished their episode."""

    @property
    def tokenizer(self) -> Any:
        """The tokenizer of the batch's envs (read-only; every copy shares the first env's). With a
        tokenizer per agent this raises ``MixedTokenizersError``: use :meth:`tokenizer_of`."""
        return self.envs[0].tokenizer

    @property
    def tokenizers(self) -> dict[str, Any]:
        """Each agent's tokenizer, ``{agent: tokenizer}`` (shared by every env of the batch)."""
        return self.envs[0].tokenizers

    def tokenizer_of(self, agent: str) -> Any:
        """``agent``'s tokenizer (shared by every env of the batch)."""
        return self.envs[0].tokenizer_of(agent)

    def split_flat(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """``obs_format="flat"``: cut stacked flat observations (N, D) into their parts (see
        :meth:`llm_envs.core.base.LLMEnvCore.split_flat`)."""
        return self.envs[0].split_flat(flat)

    def observation_space(self, agent: str) -> Any:
        """The space of one env's observation (stacked arrays add a leading N axis)."""
        return self.envs[0].observation_space(agent)

    def action_space(self, agent: str) -> Any:
        """The space of one env's action (a batch's actions add a leading N axis)."""
        return self.envs[0].action_space(agent)

    def texts(self, agent: str) -> list[str]:
        """Each env's current prompt text for ``agent``."""
        return [env.text(agent) for env in self.envs]

    @property
    def state_space(self) -> Any:
        """The space of one env's global state (:meth:`state` stacks N of them on a leading axis)."""
        return self.envs[0].state_space

    def state(self) -> Any:
        """Each env's global state (:mod:`llm_envs.core.state`), stacked: ``{"observation": (N, S),
        "attention_mask": (N, S)}``, or ``(N, 2S)`` with ``obs_format="flat"``. A finished env keeps its last."""
        states = [env.state() for env in self.envs]
        if self.envs[0].obs_format == "flat":
            return np.stack(states)
        return {key: np.stack([state[key] for state in states]) for key in states[0]}

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def _per_env(self, name: str, value: Any, broadcast: Callable[[Any, int], Any]) -> list[Any]:
        if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
            if len(value) != self.num_envs:
                raise ValueError(f"{name} has {len(value)} entries, expected num_envs={self.num_envs}.")
            return list(value)
        return [broadcast(value, i) for i in range(self.num_envs)]

    def _check_rows(self, actions: Mapping[str, Any]) -> None:
        if not isinstance(actions, Mapping) or set(actions) != set(self.agents):
            got = sorted(actions) if isinstance(actions, Mapping) else type(actions).__name__
            if self.protocol == "sequential":
                agent = self.agents[0]
                raise KeyError(f"it is {agent!r}'s turn: actions must be {{{agent!r}: (N, T) array}}, got {got}.")
            raise KeyError(f"actions must have one entry per agent {self.agents}, got {got}.")
        for agent, batch in actions.items():
            if len(batch) != self.num_envs:
                raise ValueError(f"actions[{agent!r}] has {len(batch)} rows, expected num_envs={self.num_envs}.")

    def _reset_args(self, seed: Any, options: Any) -> list[tuple[Any, Any]]:
        seeds = self._per_env("seed", seed, lambda s, i: None if s is None else int(s) + i)
        opts = self._per_env("options", options, lambda o, i: o)
        return list(zip(seeds, opts))


class VectorEnv(_Batch):
    """N copies of a parallel env (the first is built, the others are deep copies of it); every role
    acts at each step. See the module docstring for the contract.

    Args:
        env: a registered id, a :class:`ParallelLLMEnv`, or a zero-argument factory returning one.
        num_envs: number of envs N.
        **kwargs: passed to :func:`llm_envs.make` when ``env`` is an id.
    """

    protocol = "parallel"
    env_class = ParallelLLMEnv

    def __init__(self, env: str | ParallelLLMEnv | Callable[[], ParallelLLMEnv], num_envs: int, **kwargs: Any):
        self._build(env, num_envs, kwargs)
        self._last: list[tuple[dict, dict, dict, dict, dict] | None] = [None] * num_envs

    def reset(
        self,
        seed: int | Sequence[int | None] | None = None,
        options: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
    ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict[str, np.ndarray]]]:
        """Reset every env. ``seed``: one int (env i gets ``seed + i``), a list of N seeds, or None.
        ``options``: one dict for all envs or a list of N dicts."""
        results = [env.reset(seed=s, options=o) for env, (s, o) in zip(self.envs, self._reset_args(seed, options))]
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
        self._check_rows(actions)
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
        pad = self.envs[i].pad_token_id_of(agent)
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

    def _stack_obs(self, per_env: list[dict[str, Any]]) -> dict[str, Any]:
        agents = per_env[0].keys()
        if self.envs[0].obs_format == "flat":
            return {a: np.stack([o[a] for o in per_env]) for a in agents}
        return {a: {k: np.stack([o[a][k] for o in per_env]) for k in per_env[0][a]} for a in agents}

    def _stack_infos(self, per_env: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, np.ndarray]]:
        agents = per_env[0].keys()
        return {a: {k: np.array([i[a][k] for i in per_env]) for k in per_env[0][a]} for a in agents}


class SequentialVectorEnv(_Batch):
    """N copies of a sequential (AEC) env stepped together, one role at a time: ``agents`` holds the one
    role that acts next (``[]`` once the episodes are over), observations are stacked for that role
    only, ``step`` takes its actions and returns every role's rewards (0.0 until the turn resolves)
    and infos. See the module docstring for the contract.

    CORY's envs (pioneer -> observer) run only under this protocol: the observer's prompt holds the
    pioneer's answer of the same turn. Every env of a batch runs the same roles in the same order, so
    they stay in step. Whole responses only: in token mode the envs of a batch would finish a role's
    response at different steps, so ``step_unit="token"`` is refused (step the AEC envs one by one).

    Args:
        env: a registered id, a :class:`SequentialLLMEnv`, or a zero-argument factory returning one.
        num_envs: number of envs N.
        **kwargs: passed to :func:`llm_envs.make` (with ``protocol="sequential"``) when ``env`` is an id.
    """

    protocol = "sequential"
    env_class = SequentialLLMEnv

    def __init__(
        self, env: str | SequentialLLMEnv | Callable[[], SequentialLLMEnv], num_envs: int, **kwargs: Any
    ) -> None:
        self._build(env, num_envs, kwargs)
        if self.step_unit == "token":
            raise ValueError(
                "SequentialVectorEnv steps whole responses (step_unit='response'), got step_unit='token': the "
                "envs of a batch would end a role's response at different steps; step the AEC envs one by one, "
                "or batch the parallel protocol with VectorEnv"
            )

    def reset(
        self,
        seed: int | Sequence[int | None] | None = None,
        options: Mapping[str, Any] | Sequence[Mapping[str, Any] | None] | None = None,
    ) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
        """Reset every env. ``seed``: one int (env i gets ``seed + i``), a list of N seeds, or None.
        ``options``: one dict for all envs or a list of N dicts. Observations are the first role's."""
        for env, (s, o) in zip(self.envs, self._reset_args(seed, options)):
            env.reset(seed=s, options=o)
        self.agents = [self.envs[0].agent_selection]
        self.done = np.zeros(self.num_envs, dtype=bool)
        return self._observe(), self._infos()

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        """Step the acting role of every env: ``actions`` is ``{role: (N, T) ids or N strings}`` for the
        one role in ``agents``. Returns the next role's stacked observations (``{}`` at the end),
        every role's rewards (N,), terminations (N,), truncations (N,) and infos."""
        if not self.agents:
            raise RuntimeError("Call reset() before step() (the batch is over or was never started).")
        self._check_rows(actions)
        agent = self.agents[0]
        rows = actions[agent]
        for env, row in zip(self.envs, rows):  # validate every row before stepping any env
            env.check_action(agent, row)
        self._prepare_rewards(agent, rows)
        for env, row in zip(self.envs, rows):
            env.step(row)
        every = self.possible_agents
        rewards = {a: np.array([env.rewards[a] for env in self.envs], dtype=np.float64) for a in every}
        terms = {a: np.array([env.terminations[a] for env in self.envs], dtype=bool) for a in every}
        truncs = {a: np.array([env.truncations[a] for env in self.envs], dtype=bool) for a in every}
        over = [all(env.terminations[a] or env.truncations[a] for a in every) for env in self.envs]
        if all(over):
            self.agents = []
            self.done[:] = True
        elif any(over):
            raise RuntimeError("Envs of one batch finished at different turns; give them the same num_turns.")
        else:
            self.agents = [self.envs[0].agent_selection]
        return self._observe(), rewards, terms, truncs, self._infos()

    def _prepare_rewards(self, agent: str, rows: Sequence[Any]) -> None:
        """When the turn's last role acts, hand every env's finished turn to the task at once, as
        :class:`VectorEnv` does (the coding tasks run the programs of the whole batch concurrently)."""
        task = self.envs[0].task
        if agent != self.possible_agents[-1] or type(task).prepare_rewards is Task.prepare_rewards:
            return
        turns = [
            (env.problem, {**{r: v.text for r, v in env._visible.items()}, agent: env.parse_action(agent, row).text})
            for env, row in zip(self.envs, rows)
        ]
        if len(turns) > 1:
            task.prepare_rewards(turns)

    def _observe(self) -> dict[str, Any]:
        if not self.agents:
            return {}
        agent = self.agents[0]
        per_env = [env.observe(agent) for env in self.envs]
        if self.envs[0].obs_format == "flat":
            return {agent: np.stack(per_env)}
        return {agent: {k: np.stack([o[k] for o in per_env]) for k in per_env[0]}}

    def _infos(self) -> dict[str, dict[str, np.ndarray]]:
        return {
            a: {k: np.array([env.infos[a][k] for env in self.envs]) for k in self.envs[0].infos[a]}
            for a in self.possible_agents
        }
