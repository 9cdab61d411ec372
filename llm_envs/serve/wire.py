"""The wire format of a served env, shared by the server (:mod:`llm_envs.serve.env`) and the remote client
(:mod:`llm_envs.remote`): numpy and plain Python only, no web framework.

An agent's observation travels as its prompt's token ids without the padding, plus its text:

=================  ======================================================================================
``text``           ``env.text(agent)``: the observation's ids decoded
``token_ids``      the ids where the attention mask is 1 (the prompt); the observation is these ids
                   left-padded to ``obs_length`` with the agent's pad id, its mask 1 on exactly them
``action_mask``    token mode only: ``"all"`` (every token allowed) or the list of allowed ids
``observation``,   only where an observation is not left-padded (an env subclass that changed the
``attention_mask`` layout): the whole arrays, so that nothing is lost
=================  ======================================================================================

A 2,048-position observation of a 300-token prompt is 300 ids on the wire, not 4,096 numbers, and token mode's
action mask (V = 49,152 entries) is one word. :func:`decode_observation` rebuilds the exact arrays (dtypes and
``obs_format`` included) from the spec the server publishes (:func:`env_spec`).

>>> import llm_envs
>>> env = llm_envs.make("writing/xsum-v0", max_new_tokens=8)
>>> obs, _ = env.reset(seed=0)
>>> wire = encode_observation(env, "brief", obs["brief"])
>>> len(wire["token_ids"]) == int(obs["brief"]["attention_mask"].sum())
True
>>> back = decode_observation(env_spec(env), "brief", wire)
>>> all((back[k] == obs["brief"][k]).all() and back[k].dtype == obs["brief"][k].dtype for k in obs["brief"])
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

WIRE_VERSION = 1
"""Bumped when the wire format changes; the client refuses a server of another version."""

ERROR_TYPES = ("KeyError", "ValueError", "TypeError", "RuntimeError", "IndexError")
"""Exception types of the env that cross the wire by name: the remote client raises the same type, so code that
catches the env's errors locally catches them remotely."""


def _json_value(value: Any) -> Any:
    """A value as JSON data: numbers, strings, lists and dicts as they are; numpy scalars and arrays as Python;
    anything else as its ``repr`` (a task's problem may hold objects the wire cannot carry)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, np.generic):
        return _json_value(value.item())
    if isinstance(value, np.ndarray):
        return [_json_value(v) for v in value.tolist()]
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_value(v) for v in value]
    return repr(value)


json_value = _json_value


def encode_observation(env: Any, agent: str, obs: Any) -> dict[str, Any]:
    """One agent's observation (the Dict, or the flat vector) as wire data (the module docstring)."""
    parts = env.split_flat(obs) if env.obs_format == "flat" else obs
    ids, mask = parts["observation"], parts["attention_mask"]
    L = ids.shape[0]
    n = int(mask.sum())
    out: dict[str, Any] = {"text": env.text(agent), "token_ids": ids[L - n :].tolist()}
    pad = env.pad_token_id_of(agent)
    if not mask[L - n :].all() or (ids[: L - n] != pad).any():
        out["observation"] = ids.tolist()
        out["attention_mask"] = mask.tolist()
    if "action_mask" in parts:
        action_mask = parts["action_mask"]
        out["action_mask"] = "all" if action_mask.all() else np.flatnonzero(action_mask).tolist()
    return out


def decode_observation(spec: Mapping[str, Any], agent: str, wire: Mapping[str, Any]) -> Any:
    """The exact observation arrays (dtypes, padding, ``obs_format``) of ``agent`` from wire data and the spec."""
    L = spec["obs_length"]
    agent_spec = spec["agents"][agent]
    if wire.get("observation") is not None:
        ids = np.asarray(wire["observation"], dtype=np.int64)
        mask = np.asarray(wire["attention_mask"], dtype=np.int8)
    else:
        token_ids = wire["token_ids"]
        n = len(token_ids)
        ids = np.full(L, agent_spec["pad_token_id"], dtype=np.int64)
        mask = np.zeros(L, dtype=np.int8)
        if n:
            ids[L - n :] = token_ids
            mask[L - n :] = 1
    parts: dict[str, np.ndarray] = {"observation": ids, "attention_mask": mask}
    if spec["step_unit"] == "token":
        allowed = wire.get("action_mask", "all")
        V = agent_spec["vocab_size"]
        if allowed == "all":
            action_mask = np.ones(V, dtype=np.int8)
        else:
            action_mask = np.zeros(V, dtype=np.int8)
            action_mask[np.asarray(allowed, dtype=np.int64)] = 1
        parts["action_mask"] = action_mask
    if spec["obs_format"] == "flat":
        return np.concatenate([p.astype(np.int64) for p in parts.values()])
    return parts


def encode_state(env: Any) -> dict[str, Any]:
    """The global state (``env.state()``) as wire data: its ids without padding and its text."""
    state = env.state()
    parts = env.split_flat_state(state) if env.obs_format == "flat" else state
    ids, mask = parts["observation"], parts["attention_mask"]
    S = ids.shape[0]
    n = int(mask.sum())
    out: dict[str, Any] = {"text": env.state_text(), "token_ids": ids[S - n :].tolist()}
    pad = env.pad_token_id_of(env.possible_agents[0])
    if not mask[S - n :].all() or (ids[: S - n] != pad).any():
        out["observation"] = ids.tolist()
        out["attention_mask"] = mask.tolist()
    return out


def decode_state(spec: Mapping[str, Any], wire: Mapping[str, Any]) -> Any:
    """The exact ``state()`` arrays from wire data and the spec."""
    first = spec["possible_agents"][0]
    flat_spec = {**spec, "obs_length": spec["state_length"], "step_unit": "response"}
    return decode_observation(flat_spec, first, wire)


def encode_action(action: Any) -> Any:
    """An action as JSON data: a str as it is, token ids as a list of ints (an integer array keeps its
    integer type even when empty), one token id as an int, anything else as close as JSON gets, so that the
    env on the server rejects it with the same error it would give locally."""
    if isinstance(action, np.ndarray):
        if action.dtype == object:
            return [_json_value(v) for v in action.tolist()]
        if action.ndim == 1 and action.size == 0 and np.issubdtype(action.dtype, np.integer):
            return {"empty_int_ids": True}
        return action.tolist()
    if isinstance(action, np.generic):
        return action.item()
    if isinstance(action, (list, tuple)):
        return [encode_action(a) if isinstance(a, (np.ndarray, np.generic, list, tuple)) else a for a in action]
    return action


def decode_action(data: Any) -> Any:
    """The inverse of :func:`encode_action` on the server: lists of numbers become arrays of their type, an
    empty list an empty int64 array (an empty response)."""
    if isinstance(data, dict) and data == {"empty_int_ids": True}:
        return np.zeros(0, dtype=np.int64)
    if isinstance(data, list):
        if not data:
            return np.zeros(0, dtype=np.int64)
        if all(isinstance(v, int) and not isinstance(v, bool) for v in data):
            if all(-(2**63) <= v < 2**63 for v in data):
                return np.asarray(data, dtype=np.int64)
            return np.asarray(data, dtype=object)
        return np.asarray(data, dtype=object) if any(isinstance(v, (str, dict)) or v is None for v in data) \
            else np.asarray(data)
    return data


def env_spec(env: Any) -> dict[str, Any]:
    """What a client needs to rebuild the env's spaces and observations: published at ``GET /llm-envs/spec``."""
    from llm_envs.core.parallel import ParallelLLMEnv

    task = env.task
    agents = {}
    for agent in env.possible_agents:
        agents[agent] = {
            "vocab_size": int(env.vocab_size_of(agent)),
            "pad_token_id": int(env.pad_token_id_of(agent)),
            "stop_token_ids": sorted(int(t) for t in env.stop_token_ids_of(agent)),
            # The tokenizer's name or path (the embedded default's name), None where an object was passed.
            "tokenizer": env.tokenizer_name_of(agent),
            "chat_template": bool(env.chat_template_of(agent)),
        }
    return {
        "wire_version": WIRE_VERSION,
        "env_id": env.env_id,
        "protocol": "parallel" if isinstance(env, ParallelLLMEnv) else "sequential",
        "possible_agents": list(env.possible_agents),
        "agents": agents,
        "obs_length": int(env.obs_length),
        "state_length": int(env.state_length),
        "obs_format": env.obs_format,
        "step_unit": env.step_unit,
        "max_new_tokens": int(env.max_new_tokens),
        "max_prompt_tokens": int(env.max_prompt_tokens),
        "num_turns": int(env.num_turns),
        "max_cycles": int(env.max_cycles),
        "render_mode": env.render_mode,
        "metadata": _json_value(env.metadata),
        "info_keys": list(env.info_keys),
        "transition": env.transition_name,
        "task": {
            "name": type(task).__name__,
            "reward_components": list(task.reward_components),
            "min_reward": repr(float(task.min_reward)),  # float(...) reads it back, inf included
            "max_reward": repr(float(task.max_reward)),
            "max_turns": task.max_turns,
            "protocols": list(task.protocols),
            "num_problems": {split: len(task.problems(split)) for split in ("train", "eval")},
        },
    }
