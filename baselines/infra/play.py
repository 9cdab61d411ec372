"""Playing episodes through the env API: a batch of envs (``llm_envs.make_vec``, either protocol), every
role sampling from its adapter whenever it must act, responses sent to the env as token ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from agents.rows import pad_actions, strip_left
from baselines.infra import distributed


def probe_env(env_id: str, **kwargs: Any) -> tuple[list[str], int]:
    """The agents and turns per episode of ``env_id`` built with ``kwargs`` (one env, closed again):
    what a learner checks and builds its policy from before the envs (which take the policy's stop
    ids) exist. Bad env arguments fail here, before a model is loaded."""
    import llm_envs

    env = llm_envs.make(env_id, **kwargs)
    try:
        return list(env.possible_agents), int(env.num_turns)
    finally:
        env.close()

def team_env_kwargs(
    env_kwargs: Mapping[str, Any],
    policy: Any,
    agents: Sequence[str] | Mapping[str, str],
    fingerprints: dict[int, str] | None = None,
) -> dict[str, Any]:
    """``env_kwargs`` with what the envs need from ``policy`` for ``agents``: the env agents, each
    played by the policy agent of the same name, or a mapping env agent -> the policy agent playing it
    (CORY's role -> model). Added: the EOS ids where a response ends (``stop_token_ids``) and, in a team
    whose players speak different tokenizers, each env agent's tokenizer and EOS ids, its player's
    (``tokenizer={agent: tok}``, ``stop_token_ids={agent: ids}``). ``fingerprints``: a dict in which
    to keep the tokenizers' fingerprints (``id(tokenizer)`` -> fingerprint) for a caller that asks
    about the same live tokenizers again (:class:`RoleEnvs`; a fingerprint hashes a whole vocabulary).

    >>> from types import SimpleNamespace as Fake
    >>> tok = Fake(get_vocab=lambda: {"a": 0, "b": 1}, pad_token_id=0, eos_token_id=1)
    >>> other = Fake(get_vocab=lambda: {"c": 0, "d": 1, "e": 2}, pad_token_id=0, eos_token_id=2)
    >>> eos = {"model_0": (1,), "model_1": (2,)}.get
    >>> cory = {"pioneer": "model_1", "observer": "model_0"}
    >>> team_env_kwargs({}, Fake(tokenizer_of=lambda m: tok, eos_token_ids_of=eos), cory)  # one tokenizer
    {'stop_token_ids': [1, 2]}
    >>> two = Fake(tokenizer_of={"model_0": tok, "model_1": other}.get, eos_token_ids_of=eos)
    >>> mixed = team_env_kwargs({}, two, cory)  # two tokenizers: each role its player's
    >>> mixed["tokenizer"]["pioneer"] is other, mixed["stop_token_ids"]
    (True, {'pioneer': [2], 'observer': [1]})
    """
    from agents.team import tokenizer_fingerprint

    players = dict(agents) if isinstance(agents, Mapping) else {a: a for a in agents}
    kwargs = dict(env_kwargs)
    tokenizers = {a: policy.tokenizer_of(m) for a, m in players.items()}
    known = {} if fingerprints is None else fingerprints
    distinct = {id(t): t for t in tokenizers.values()}
    for key, tok in distinct.items():
        if key not in known:
            known[key] = tokenizer_fingerprint(tok)
    prints = {known[key] for key in distinct}
    first = next(iter(tokenizers))
    if len(prints) > 1:
        kwargs["tokenizer"] = tokenizers
        kwargs["stop_token_ids"] = {a: list(policy.eos_token_ids_of(m)) for a, m in players.items()}
    else:
        if len({id(t) for t in tokenizers.values()}) > 1 or "tokenizer" in kwargs:
            kwargs["tokenizer"] = tokenizers[first]  # one vocabulary: the same object for every agent
        kwargs["stop_token_ids"] = sorted({i for m in players.values() for i in policy.eos_token_ids_of(m)})
    return kwargs


class RoleEnvs:
    """The vector envs of a run whose models may swap roles (CORY): each role's env speaks the
    tokenizer of the model playing it and ends its responses at that model's EOS ids, so when models of
    different tokenizers swap roles, the envs' tokenizers swap with them.

    ``kwargs(players)`` are the env arguments of an assignment ``{role: model}``
    (:func:`team_env_kwargs`) and ``vector(players)`` its vector env of ``num_envs`` envs. Both are
    built on first use and kept: a swap back costs nothing, and assignments whose arguments are the same
    (models of one tokenizer: every CORY run of one base) share one vector env."""

    def __init__(
        self, env_id: str, num_envs: int, policy: Any, env_kwargs: Mapping[str, Any], **make_kwargs: Any
    ) -> None:
        self.env_id, self.num_envs, self.policy = env_id, num_envs, policy
        self.env_kwargs, self.make_kwargs = dict(env_kwargs), make_kwargs
        self._kwargs: dict[tuple[tuple[str, str], ...], dict[str, Any]] = {}
        self._fingerprints: dict[int, str] = {}  # the policy's tokenizers: alive as long as it is
        self._vectors: list[tuple[dict[str, Any], Any]] = []  # (env arguments, vector env)

    def kwargs(self, players: Mapping[str, str]) -> dict[str, Any]:
        """The env arguments when ``players`` (role -> model) play the roles."""
        key = tuple(sorted(players.items()))
        if key not in self._kwargs:
            self._kwargs[key] = team_env_kwargs(self.env_kwargs, self.policy, players, self._fingerprints)
        return self._kwargs[key]

    def vector(self, players: Mapping[str, str]) -> Any:
        """The vector env (``llm_envs.make_vec``) in which ``players`` (role -> model) play the roles."""
        from llm_envs.core.vector import make_vec

        kwargs = self.kwargs(players)
        for built, venv in self._vectors:
            if built == kwargs:  # tokenizers and other objects compare by identity, ids by value
                return venv
        venv = make_vec(self.env_id, self.num_envs, **self.make_kwargs, **kwargs)
        self._vectors.append((kwargs, venv))
        return venv

    def close(self) -> None:
        """Close every vector env built."""
        for _, venv in self._vectors:
            venv.close()
        self._vectors.clear()


def play_episodes(
    policy: Any,
    venv: Any,
    *,
    seeds: Sequence[int] | int,
    options: Sequence[Mapping[str, Any]],
    action_length: int,
    adapters: Mapping[str, str] | None = None,
    sample_seeds: Sequence[int] | None = None,
    step_rewards: list[dict[str, np.ndarray]] | None = None,
    **sampling: Any,
) -> tuple[list[dict[str, Any]], dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
    """Play one batch of episodes on ``venv`` (parallel or sequential): whenever roles must act, each
    samples from its adapter (``adapters[role]``, default the role's own name) in one batched
    generate; responses go to the env padded to ``action_length`` (the env's action length).
    ``sampling`` goes to ``policy.generate_joint`` (``max_new_tokens`` may be below ``action_length``).

    ``sample_seeds`` (one int >= 0 per episode): sample each episode on its own, at step k under the
    seed ``distributed.group_seed(sample_seeds[i], 0, k, 0)`` in a forked RNG, so that an episode's
    samples depend neither on the rest of the batch nor on the process playing it (data-parallel
    runs). Unset: one batched generate per step from torch's global RNG.

    Returns the generations step by step (``[{role: Generation}]``), each role's summed reward (N,)
    and the infos of the last step. ``step_rewards``: a list to extend with every step's rewards
    (``{role: (N,)}``, every role), which :func:`episode_turns` credits to the turns."""
    names = {a: a for a in venv.possible_agents} if adapters is None else dict(adapters)
    missing = [a for a in venv.possible_agents if a not in names]
    if missing:
        raise ValueError(f"adapters maps {sorted(names)} but the env's agents include {missing}")
    if sample_seeds is not None and len(sample_seeds) != venv.num_envs:
        raise ValueError(f"got {len(sample_seeds)} sample_seeds for {venv.num_envs} episodes")
    obs, infos = venv.reset(seed=seeds if isinstance(seeds, int) else list(seeds), options=list(options))
    steps: list[dict[str, Any]] = []
    returns = {a: np.zeros(venv.num_envs) for a in venv.possible_agents}
    while venv.agents:
        if sample_seeds is None:
            prompts = {}
            for a in venv.agents:
                ids, mask = strip_left(obs[a]["observation"], obs[a]["attention_mask"])
                prompts[names[a]] = (torch.as_tensor(ids), torch.as_tensor(mask))
            out = policy.generate_joint(prompts, 1, **sampling)
        else:
            step_seeds = [distributed.group_seed(int(s), 0, len(steps), 0) for s in sample_seeds]
            raw = {names[a]: (obs[a]["observation"], obs[a]["attention_mask"]) for a in venv.agents}
            out = distributed.generate_per_group(policy, raw, 1, step_seeds, **sampling)
        gens = {a: out[names[a]] for a in venv.agents}
        actions = {
            a: pad_actions(g.response_ids, action_length, policy.pad_token_id_of(names[a])) for a, g in gens.items()
        }
        obs, rewards, _, _, infos = venv.step(actions)
        for a in rewards:
            returns[a] += rewards[a]
        steps.append(gens)
        if step_rewards is not None:
            step_rewards.append(rewards)
    return steps, returns, infos


def episode_turns(
    steps: Sequence[Mapping[str, Any]], step_rewards: Sequence[Mapping[str, np.ndarray]]
) -> dict[str, list[tuple[Any, np.ndarray]]]:
    """Each role's turns of a batch :func:`play_episodes` played: ``{role: [(Generation, reward (N,))]}``
    in turn order. A reward a role receives at a step is credited to its latest response (to its first
    one when it arrives before the role has acted): under the sequential protocol the turn resolves at
    its last role's step, and every role's response of that turn earns that turn's reward. The rewards
    of a role's turns add up to its return.

    >>> steps = [{"pioneer": "p0"}, {"observer": "o0"}, {"pioneer": "p1"}, {"observer": "o1"}]
    >>> zero, r = np.zeros(1), lambda x: np.array([x])
    >>> rewards = [{"pioneer": zero, "observer": zero}, {"pioneer": r(1.0), "observer": r(1.0)},
    ...            {"pioneer": zero, "observer": zero}, {"pioneer": r(2.0), "observer": r(2.0)}]
    >>> [(gen, float(reward[0])) for gen, reward in episode_turns(steps, rewards)["pioneer"]]
    [('p0', 1.0), ('p1', 2.0)]
    """
    if len(steps) != len(step_rewards):
        raise ValueError(f"got {len(step_rewards)} steps' rewards for {len(steps)} steps")
    turns: dict[str, list[list[Any]]] = {}
    early: dict[str, np.ndarray] = {}  # rewards of a role that has not acted yet
    for gens, rewards in zip(steps, step_rewards):
        for role, gen in gens.items():
            start = early.pop(role) if role in early else np.zeros(len(next(iter(rewards.values()))))
            turns.setdefault(role, []).append([gen, start])
        for role, reward in rewards.items():
            if role in turns:
                turns[role][-1][1] = turns[role][-1][1] + reward
            else:
                early[role] = early.get(role, np.zeros(len(reward))) + reward
    return {role: [(gen, reward) for gen, reward in records] for role, records in turns.items()}


@dataclass
class Turn:
    """One turn of B*G envs: each agent's prompts and sampled responses, and the env's rewards."""

    prompts: dict[str, tuple[torch.Tensor, torch.Tensor]]  # agent -> (N, P) ids, mask (left padding stripped)
    responses: dict[str, Any]  # agent -> agents.Generation
    rewards: dict[str, np.ndarray]  # agent -> (N,)
    infos: dict[str, dict[str, np.ndarray]]


def rollout(
    policy: Any,
    venv: Any,
    seeds: Sequence[int],
    options: Sequence[dict],
    config: Any,
    groups: Sequence[int] | None = None,
    iteration: int = 0,
) -> list[Turn]:
    """Play one batch of episodes through the env API. Returns the turns in order.

    ``groups`` unset: every agent's actions come from one batched generate per turn. Set: the
    problem positions (0..B-1 in the iteration's batch) of the envs' consecutive groups of
    ``num_generations``; each group is sampled under its own seed (``distributed.group_seed``), so
    the samples of a problem do not depend on the rest of the batch or on the process playing it."""
    obs, _ = venv.reset(seed=list(seeds), options=list(options))
    sampling = config.sampling_kwargs(list(venv.possible_agents))  # per agent in a team
    turns = []
    while venv.agents:
        if groups is None:
            prompts = {
                a: tuple(
                    torch.as_tensor(x) for x in strip_left(obs[a]["observation"], obs[a]["attention_mask"])
                )
                for a in venv.agents
            }
            gens = policy.generate_joint(prompts, 1, **sampling)
        else:
            group_seeds = [distributed.group_seed(config.seed, iteration, len(turns), b) for b in groups]
            raw = {a: (obs[a]["observation"], obs[a]["attention_mask"]) for a in venv.agents}
            gens = distributed.generate_per_group(policy, raw, config.num_generations, group_seeds, **sampling)
            prompts = {a: (g.prompt_ids, g.prompt_mask) for a, g in gens.items()}
        actions = {
            a: pad_actions(g.response_ids, config.max_new_tokens, policy.pad_token_id_of(a)) for a, g in gens.items()
        }
        obs, rewards, _, _, infos = venv.step(actions)
        turns.append(Turn(prompts=prompts, responses=gens, rewards=rewards, infos=infos))
    return turns
