"""Playing and comparing episodes, for the checks and for tests of one's own: random actions of each
agent's own vocabulary, whole episodes recorded step by step (either protocol), the first difference
between two recordings."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from pettingzoo import ParallelEnv

from llm_envs.core.task import Response


def first_difference(a: Any, b: Any, path: str = "") -> str | None:
    """Where ``a`` and ``b`` first differ (None when equal): dicts, sequences, numpy arrays (dtype
    included) and scalars of the same type.

    >>> first_difference({"x": [1, 2.0]}, {"x": [1, 2]})
    "['x'][1]: 2.0 (float) vs 2 (int)"
    """
    here = path or "value"
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        if not (isinstance(a, Mapping) and isinstance(b, Mapping)) or a.keys() != b.keys():
            keys = [sorted(x) if isinstance(x, Mapping) else short(x) for x in (a, b)]
            return f"{here}: keys {keys[0]} vs {keys[1]}"
        for k in a:
            found = first_difference(a[k], b[k], f"{path}[{k!r}]")
            if found:
                return found
        return None
    if isinstance(a, (tuple, list)) or isinstance(b, (tuple, list)):
        if not (isinstance(a, (tuple, list)) and isinstance(b, (tuple, list))) or len(a) != len(b):
            return f"{here}: {short(a)} vs {short(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.dtype != b.dtype or a.shape != b.shape:
            return f"{here}: {_describe(a)} vs {_describe(b)}"
        if not np.array_equal(a, b):
            flat_a, flat_b = a.reshape(-1), b.reshape(-1)
            at = np.flatnonzero(flat_a != flat_b)
            return f"{here}: {len(at)} positions differ, first at {int(at[0])}: {flat_a[at[0]]} vs {flat_b[at[0]]}"
        return None
    if type(a) is not type(b) or a != b:
        return f"{here}: {short(a)} ({type(a).__name__}) vs {short(b)} ({type(b).__name__})"
    return None


def assert_same(a: Any, b: Any) -> None:
    """``AssertionError`` naming the first difference unless ``a`` and ``b`` are the same (see
    :func:`first_difference`)."""
    found = first_difference(a, b)
    if found:
        raise AssertionError(f"not the same: {found}")


def prompt_ids(obs: Mapping[str, np.ndarray]) -> list[int]:
    """The ids of a Dict observation that its attention mask marks (the prompt, left-padded away)."""
    n = int(obs["attention_mask"].sum())
    return obs["observation"][len(obs["observation"]) - n :].tolist()


def non_stop_id(V: int, stops: Iterable[int]) -> int:
    return next(t for t in range(V) if t not in stops)


def random_actions(env: Any, rng: np.random.Generator, agents: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Whole-response actions: random ids of each agent's own vocabulary that avoid its stop ids for a
    random prefix length, then a stop id (so every length from 0 to ``max_new_tokens`` comes up)."""
    out = {}
    for agent in env.agents if agents is None else agents:
        T, V, stops = env.max_new_tokens, env.vocab_size_of(agent), env.stop_token_ids_of(agent)
        ids = rng.integers(0, V, size=T)
        ids[np.isin(ids, list(stops))] = non_stop_id(V, stops)
        n = int(rng.integers(0, T + 1))
        if n < T:
            ids[n] = min(stops)
        out[agent] = ids.astype(np.int64)
    return out


def random_tokens(env: Any, rng: np.random.Generator, agents: Iterable[str]) -> dict[str, int]:
    """Token mode: a random id (a stop id one time in four) for a composing agent, the pad id otherwise."""
    out = {}
    for agent in agents:
        V, stops = env.vocab_size_of(agent), env.stop_token_ids_of(agent)
        if env.action_mask(agent).all():
            token = int(rng.integers(0, V))
            out[agent] = min(stops) if rng.random() < 0.25 else token if token not in stops else non_stop_id(V, stops)
        else:
            out[agent] = env.pad_token_id_of(agent)
    return out


def random_step(env: Any, rng: np.random.Generator, agents: Iterable[str]) -> dict[str, Any]:
    return random_tokens(env, rng, agents) if env.step_unit == "token" else random_actions(env, rng, agents)


def play(env: Any, seed: int | None, rng: np.random.Generator, options: Mapping[str, Any] | None = None,
         policy: Callable[[Any, list[str]], dict[str, Any]] | None = None,
         on_moment: Callable[[Any, dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Reset ``env`` and step it to the end of the episode with random actions (or ``policy(env, agents)``).
    Returns one moment per reset and step: ``observations``, ``rewards``, ``terminations``,
    ``truncations`` and ``infos`` of the live agents (either protocol), ``turn`` (finished turns),
    ``agent`` (who acted; None at reset and for a parallel step) and ``dead_step`` (an AEC agent already
    done was stepped with None). ``on_moment(env, moment)`` sees each moment as it happens."""
    act = policy or (lambda e, agents: random_step(e, rng, agents))
    moments: list[dict[str, Any]] = []

    def record(moment: dict[str, Any]) -> None:
        moments.append(moment)
        if on_moment is not None:
            on_moment(env, moment)

    if isinstance(env, ParallelEnv):
        obs, infos = env.reset(seed=seed, options=options)
        record(_moment(env, None, False, obs, {}, {}, {}, infos))
        while env.agents:
            record(_moment(env, None, False, *env.step(act(env, list(env.agents)))))
        return moments
    env.reset(seed=seed, options=options)
    record(_aec_moment(env, None, False))
    for agent in env.agent_iter():
        _, _, term, trunc, _ = env.last()
        env.step(None if term or trunc else act(env, [agent])[agent])
        record(_aec_moment(env, agent, term or trunc))
    return moments


def _moment(env: Any, agent: str | None, dead: bool, obs, rewards, terms, truncs, infos) -> dict[str, Any]:
    return {"turn": len(env.history), "agent": agent, "dead_step": dead, "observations": obs, "rewards": rewards,
            "terminations": terms, "truncations": truncs, "infos": infos}


def _aec_moment(env: Any, agent: str | None, dead: bool) -> dict[str, Any]:
    return _moment(env, agent, dead, {a: env.observe(a) for a in env.agents}, dict(env.rewards),
                   dict(env.terminations), dict(env.truncations), {a: dict(i) for a, i in env.infos.items()})


MOMENT_PARTS = ("rewards", "terminations", "truncations", "infos", "observations")
"""The parts of a moment, causes first: a reward that differs changes the next prompts' feedback too."""


def reset_observe(env: Any, seed: int | None = None, options: Mapping[str, Any] | None = None) -> tuple[dict, dict]:
    """(observations, infos) of every agent just after reset, for either protocol."""
    if isinstance(env, ParallelEnv):
        return env.reset(seed=seed, options=options)
    env.reset(seed=seed, options=options)
    return {a: env.observe(a) for a in env.agents}, {a: dict(i) for a, i in env.infos.items()}


def step_turn(env: Any, actions: Mapping[str, Any]) -> tuple[dict, dict]:
    """The rest of a turn (from its start: every role's action) for either protocol: (rewards, infos) of
    every agent once it has resolved."""
    if isinstance(env, ParallelEnv):
        _, rewards, _, _, infos = env.step(dict(actions))
        return rewards, infos
    finished = len(env.history)
    while len(env.history) == finished:
        env.step(actions[env.agent_selection])
    return dict(env.rewards), {a: dict(i) for a, i in env.infos.items()}


def problem_label(env: Any) -> str | None:
    if not env.started:
        return None
    return f"{env.task_split}[{env.task_index}] {short(dict(env.problem), 100)}"


def encode_text(env: Any, text: str, agent: str) -> list[int]:
    """``text`` as ``agent``'s token ids (its tokenizer, no special tokens): a str action's ids."""
    return list(env.tokenizer_of(agent)(text, add_special_tokens=False)["input_ids"])


def read_ids(env: Any, response: Response, reader: str) -> list[int]:
    """A response as ``reader`` reads it in a prompt or the state: its own ids when its writer has the reader's
    tokenizer, else its text encoded with the reader's (text is the interface between agents)."""
    writer = response.agent
    if writer is None or env.tokenizer_of(writer) is env.tokenizer_of(reader):
        return list(response.ids)
    return encode_text(env, response.text, reader) if response.text else []


def short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _describe(x: Any) -> str:
    if isinstance(x, np.ndarray):
        return f"array(shape={x.shape}, dtype={x.dtype})"
    return f"{type(x).__name__} {short(x)}"


def why_not_in(space: Any, value: Any, path: str = "observation") -> str:
    """Why a Dict/Box space does not contain ``value`` (the first reason found)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        if not isinstance(value, Mapping) or set(value) != set(space.spaces):
            got = sorted(value) if isinstance(value, Mapping) else type(value).__name__
            return f"{path} has keys {got}, the space {sorted(space.spaces)}"
        for key, sub in space.spaces.items():
            if not sub.contains(value[key]):
                return why_not_in(sub, value[key], f"{path}[{key!r}]")
    if isinstance(space, spaces.Box):
        if not isinstance(value, np.ndarray):
            return f"{path} is a {type(value).__name__}, not a numpy array"
        if value.shape != space.shape:
            return f"{path} has shape {value.shape}, the space {space.shape}"
        if value.dtype != space.dtype:
            return f"{path} has dtype {value.dtype}, the space {space.dtype}"
        low, high = np.broadcast_to(space.low, value.shape), np.broadcast_to(space.high, value.shape)
        bad = np.flatnonzero((value < low) | (value > high))
        if bad.size:
            i = int(bad[0])
            bounds = f"[{low.reshape(-1)[i]}, {high.reshape(-1)[i]}]"
            return f"{path} holds {value.reshape(-1)[i]} at position {i}, outside the space's {bounds}"
    return f"{path} is not in {space}"


def error_text(err: BaseException) -> str:
    """``Type: message (raised at file:line in function)``, the message cut to a few lines."""
    frames = traceback.extract_tb(err.__traceback__)
    where = f" (raised at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    text = str(err)
    return f"{type(err).__name__}: {text if len(text) <= 400 else text[:397] + '...'}{where}"
