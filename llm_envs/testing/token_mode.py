"""The ``token_mode`` check: ``step_unit="token"`` (one token a step, action masks) ends every turn
exactly as whole responses do, under both protocols."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from llm_envs.testing.episodes import (
    first_difference,
    non_stop_id,
    problem_label,
    prompt_ids,
)
from llm_envs.testing.report import EnvCheckError
from llm_envs.testing.subject import SEED, TOKEN_MODE_TOKENS, Subject, _check, _each_protocol


def _scripted_responses(env: Any, rng: np.random.Generator, num_turns: int) -> list[dict[str, list[int]]]:
    """Per turn, per agent: ids without stop ids, of every length from 0 to max_new_tokens."""
    script = []
    for _ in range(num_turns):
        turn = {}
        for agent in env.possible_agents:
            stops, V = env.stop_token_ids_of(agent), env.vocab_size_of(agent)
            filler = non_stop_id(V, stops)
            n = int(rng.integers(0, env.max_new_tokens + 1))
            turn[agent] = [t if t not in stops else filler for t in (int(x) for x in rng.integers(0, V, size=n))]
        script.append(turn)
    return script


def _as_response(env: Any, agent: str, ids: list[int]) -> np.ndarray:
    """A whole response; a shorter one ends with a stop id and junk after it (ignored)."""
    stops = env.stop_token_ids_of(agent)
    out = np.full(env.max_new_tokens, non_stop_id(env.vocab_size_of(agent), stops), np.int64)
    out[: len(ids)] = ids
    if len(ids) < env.max_new_tokens:
        out[len(ids)] = min(stops)
    return out


def _token_stream(env: Any, agent: str, ids: list[int]) -> list[int]:
    """The same response one token at a time: its ids, then a stop id if it ends before max_new_tokens."""
    return ids + ([min(env.stop_token_ids_of(agent))] if len(ids) < env.max_new_tokens else [])


def _token_fail(env: Any, detail: str, agent: str | None = None) -> EnvCheckError:
    return EnvCheckError("token_mode", detail, agent=agent, problem=problem_label(env), turn=len(env.history))


def _run_parallel(env: Any, script: list[dict[str, list[int]]], seed: int) -> list[Any]:
    """Per turn boundary: (prompt ids per agent, rewards, terminations, truncations, infos, state)."""
    obs, infos = env.reset(seed=seed)
    trace = [({a: prompt_ids(o) for a, o in obs.items()}, infos, env.state())]
    for turn in script:
        if env.step_unit == "response":
            out = env.step({a: _as_response(env, a, turn[a]) for a in env.agents})
        else:
            streams = {a: _token_stream(env, a, turn[a]) for a in env.agents}
            steps = max(len(s) for s in streams.values())
            for k in range(steps):
                for agent in env.agents:
                    if bool(obs[agent]["action_mask"].all()) != (k < len(streams[agent])):
                        state = "open" if k >= len(streams[agent]) else "closed"
                        raise _token_fail(env, f"the action mask at token {k} is {state}"
                                          f" for a response of {len(turn[agent])} tokens", agent)
                out = env.step({a: s[k] if k < len(s) else env.pad_token_id_of(a) for a, s in streams.items()})
                obs = out[0]
                if k < steps - 1 and (set(out[1].values()) != {0.0} or any(out[2].values())):
                    raise _token_fail(env, f"a step within the turn (token {k}) returned rewards {out[1]} and "
                                      f"terminations {out[2]}; expected 0.0 and False until the turn resolves")
        obs = out[0]
        trace.append(({a: prompt_ids(o) for a, o in out[0].items()}, *out[1:], env.state()))
    return trace


def _run_sequential(env: Any, script: list[dict[str, list[int]]], seed: int) -> list[Any]:
    """Per turn boundary: (prompt ids per agent, rewards, cumulative rewards, terminations, truncations, infos,
    state)."""
    env.reset(seed=seed)

    def snapshot() -> tuple:
        prompts = {a: prompt_ids(env.observe(a)) for a in env.possible_agents}
        return (prompts, dict(env.rewards), dict(env._cumulative_rewards), dict(env.terminations),
                dict(env.truncations), copy.deepcopy(env.infos), env.state())

    trace = [snapshot()]
    for turn in script:
        for agent in env.possible_agents:
            if env.agent_selection != agent:
                raise _token_fail(env, f"agent_selection is {env.agent_selection!r}, expected {agent!r}")
            if env.step_unit == "response":
                env.step(_as_response(env, agent, turn[agent]))
                continue
            stream = _token_stream(env, agent, turn[agent])
            for k, token in enumerate(stream):
                if env.agent_selection != agent or not env.observe(agent)["action_mask"].all():
                    raise _token_fail(env, f"at token {k} of its response the agent is not selected with an open mask",
                                      agent)
                env.step(token)
                if (agent != env.possible_agents[-1] or k < len(stream) - 1) and set(env.rewards.values()) != {0.0}:
                    raise _token_fail(env, f"rewards {env.rewards} before the turn resolved; expected 0.0", agent)
        trace.append(snapshot())
    return trace


@_check("token_mode", "step_unit='token' (one token a step, action masks) ends in the same prompts, rewards, infos, "
        "states, history and transcript as whole responses",
        "Token mode must end each turn exactly as response mode does. A task must not depend on how a response was "
        "stepped; an env subclass that overrides step, _observation or _info must handle step_unit='token' too.")
@_each_protocol
def check_token_mode(subject: Subject, protocol: str) -> None:
    kw = {"max_new_tokens": TOKEN_MODE_TOKENS, "obs_format": "dict", **subject.turns(2)}
    for seed in (SEED, SEED + 1):
        whole = subject.env(protocol, step_unit="response", **kw)
        tokens = subject.env(protocol, step_unit="token", **kw)
        script = _scripted_responses(whole, np.random.default_rng(seed), whole.num_turns)
        run = _run_parallel if protocol == "parallel" else _run_sequential
        expected, got = run(whole, script, seed), run(tokens, script, seed)
        found = first_difference(got, expected, "turn boundaries")
        if found:
            raise _token_fail(tokens, f"token mode vs whole responses ({protocol}, seed {seed}): {found}")
        if tokens.transcript() != whole.transcript() or tokens.history != whole.history:
            raise _token_fail(tokens, f"the transcript or history of token mode differs from whole responses' "
                              f"({protocol}, seed {seed})")
        got_ids = [r.outputs[a].ids for r in tokens.history for a in tokens.possible_agents]
        want = [tuple(turn[a]) for turn in script for a in tokens.possible_agents]
        if got_ids != want:
            raise _token_fail(tokens, f"the responses are {got_ids}, the tokens stepped {want}")
