"""The checks of our contract beyond PettingZoo's (docs/env-contract.md): spaces, the global state,
infos, determinism, reset options, text and token-id actions, bad actions and reward bounds."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from pettingzoo import AECEnv

from llm_envs.core.task import SPLITS
from llm_envs.testing.episodes import (
    MOMENT_PARTS,
    encode_text,
    error_text,
    first_difference,
    non_stop_id,
    play,
    problem_label,
    random_actions,
    read_ids,
    reset_observe,
    short,
    step_turn,
    why_not_in,
)
from llm_envs.testing.official import _aec_factory, _official, _other_protocol_note, seeded_spaces
from llm_envs.testing.report import CheckSkipped, EnvCheckError
from llm_envs.testing.subject import (
    OFFICIAL_CYCLES,
    OFFICIAL_TURNS,
    PROBLEMS_PER_SPLIT,
    SAMPLE_TEXTS,
    SEED,
    TURNS,
    Subject,
    _check,
    _each_protocol,
    _sample_problems,
)


def _check_observation(env: Any, agent: str, obs: Any, info: Mapping[str, Any] | None) -> None:
    def fail(detail: str, hint: str | None = None) -> EnvCheckError:
        return EnvCheckError("spaces", detail, agent=agent, problem=problem_label(env), turn=len(env.history),
                             hint=hint)

    space = env.observation_space(agent)
    if space is not env.observation_space(agent) or env.action_space(agent) is not env.action_space(agent):
        raise fail("observation_space(agent) or action_space(agent) returns a new object on each call",
                   "build each agent's spaces once (in __init__ or with functools.cache) and return the same object.")
    if not space.contains(obs):
        raise fail(f"the observation is not in observation_space(agent): {why_not_in(space, obs)}")
    parts = env.split_flat(obs) if env.obs_format == "flat" else obs  # a flat vector is int64 throughout
    ids, mask = parts["observation"], parts["attention_mask"]
    if ids.dtype != np.int64 or mask.dtype != (np.int64 if env.obs_format == "flat" else np.int8):
        raise fail(f"observation ids must be int64 and the attention mask int8, got {ids.dtype} and {mask.dtype}")
    L = env.obs_length
    if ids.shape != (L,) or mask.shape != (L,):
        raise fail(f"observation and attention_mask must have shape ({L},), got {ids.shape} and {mask.shape}")
    n = int(mask.sum())
    if n == 0 or not mask[L - n :].all():
        raise fail(f"the attention mask must be zeros then at least one 1 (left padding), got {short(mask.tolist())}")
    pad = env.pad_token_id_of(agent)
    if (ids[: L - n] != pad).any():
        raise fail(f"the padded positions must hold the pad id {pad}, got {sorted(set(ids[: L - n].tolist()))[:5]}")
    text = env.tokenizer_of(agent).decode(ids[L - n :].tolist(), skip_special_tokens=False)
    if env.text(agent) != text:
        raise fail(f"env.text(agent) is not the observation's ids decoded: {short(env.text(agent))} vs {short(text)}")
    if info is not None and env.step_unit == "response" and info["prompt_tokens"] != n:
        raise fail(f"infos['prompt_tokens'] is {info['prompt_tokens']}, the observation has {n} prompt tokens")


@_check("spaces", "observations in their spaces: int64 ids, int8 mask, left-padded with the pad id, env.text(agent) "
        "their decoding, on sampled problems of both splits and over an episode",
        "Observations are exactly the Dict (or flat Box) of the spaces: int64 ids, an int8 mask, length "
        "max_prompt_tokens, left-padded with the agent's pad id. A prompt longer than max_prompt_tokens: make the env "
        "with a larger max_prompt_tokens (register(..., max_prompt_tokens=N)) or shorten the prompt; an env subclass "
        "must not change the observation's layout.")
@_each_protocol
def check_spaces(subject: Subject, protocol: str) -> None:
    env = subject.env(protocol)
    for split, index in _sample_problems(env):
        try:
            obs, infos = reset_observe(env, seed=0, options={"split": split, "task_index": index})
        except ValueError as err:
            if "max_prompt_tokens" not in str(err):
                raise
            raise EnvCheckError("spaces", f"the prompt does not fit the observation: {err}",
                                problem=problem_label(env)) from err
        for agent, o in obs.items():
            _check_observation(env, agent, o, infos[agent])
    env = subject.env(protocol, **subject.turns(TURNS))

    def check(env: Any, moment: dict[str, Any]) -> None:
        for agent, o in moment["observations"].items():
            _check_observation(env, agent, o, None)

    play(env, SEED, np.random.default_rng(SEED), on_moment=check)


def _state_fail(env: Any, detail: str, hint: str | None = None) -> EnvCheckError:
    return EnvCheckError("state", detail, problem=problem_label(env), turn=len(env.history) if env.started else None,
                         hint=hint)


def _state_parts(env: Any, state: Any) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask) of a state, checked against the state's space and layout."""
    space = env.state_space
    if not space.contains(state):
        raise _state_fail(env, f"state() is not in state_space: {why_not_in(space, state, 'state')}")
    parts = env.split_flat_state(state) if env.obs_format == "flat" else state
    ids, mask = parts["observation"], parts["attention_mask"]
    if ids.dtype != np.int64 or mask.dtype != (np.int64 if env.obs_format == "flat" else np.int8):
        raise _state_fail(env, f"the state's ids must be int64 and its mask int8, got {ids.dtype} and {mask.dtype}")
    S = env.state_length
    if ids.shape != (S,) or mask.shape != (S,):
        raise _state_fail(env, f"the state's ids and mask must have shape ({S},), got {ids.shape} and {mask.shape}")
    n = int(mask.sum())
    if n == 0 or not mask[S - n :].all():
        raise _state_fail(env, f"the state's mask must be zeros then at least one 1 (left padding), got "
                          f"{short(mask.tolist())}")
    pad = env.pad_token_id_of(env.possible_agents[0])
    if (ids[: S - n] != pad).any():
        raise _state_fail(env, f"the state's padded positions must hold the state tokenizer's pad id {pad}, got "
                          f"{sorted(set(ids[: S - n].tolist()))[:5]}")
    text = env.state_tokenizer.decode(ids[S - n :].tolist(), skip_special_tokens=False)
    if env.state_text() != text:
        raise _state_fail(env, f"env.state_text() is not the state's ids decoded: {short(env.state_text())} vs "
                          f"{short(text)}")
    return ids[S - n :], mask


def _contains(seq: np.ndarray, sub: Sequence[int]) -> bool:
    if len(sub) > len(seq):
        return False
    if not len(sub):
        return True
    windows = np.lib.stride_tricks.sliding_window_view(seq, len(sub))
    return bool((windows == np.asarray(sub, dtype=seq.dtype)).all(axis=1).any())


def _check_state_content(env: Any, ids: np.ndarray, seen_turns: int | None) -> None:
    """At reset (``seen_turns`` None) the problem's prompt, after each turn every role's response of it, as the state
    tokenizer reads them; unless the state is full (then it may have been cut from the left)."""
    if len(ids) == env.state_length:
        return
    first = env.possible_agents[0]
    if seen_turns is None and not _contains(ids, encode_text(env, env.problem_statement(), first)):
        raise _state_fail(env, "the state does not hold the problem's prompt (encoded with the state tokenizer)")
    if env.history and len(env.history) != seen_turns:
        for role, response in env.history[-1].outputs.items():
            if not _contains(ids, read_ids(env, response, first)):
                raise _state_fail(env, f"after turn {len(env.history)} the state does not hold the response of "
                                  f"{role!r} {short(response.text)}")


def _states_of_episode(env: Any) -> list[Any]:
    """Play a seeded episode, checking the state at every moment; the states."""
    states: list[Any] = []
    turns: list[int | None] = [None]

    def check(env: Any, moment: dict[str, Any]) -> None:
        state = env.state()
        ids, _ = _state_parts(env, state)
        _check_state_content(env, ids, turns[0])
        turns[0] = len(env.history)
        states.append(state)

    play(env, SEED, np.random.default_rng(SEED), on_moment=check)
    return states


@_check("state", "state() and state_space: int64 ids and an int8 mask, left-padded with the state tokenizer's pad id, "
        "in one space object; the problem's prompt and each turn's responses; deterministic; the same in 'dict' and "
        "'flat' format; PettingZoo's state_test; a clear error before reset",
        "state() is the joint context of llm_envs.core.state: build it from the env's problem and latest responses "
        "(an env subclass that overrides step or _observation must keep _history, _visible and _response_ids), "
        "return new arrays of the state_space built once in __init__, and raise RuntimeError before reset(). States "
        "that differ between two equal episodes: see the determinism check's hint.")
def check_state(subject: Subject) -> list[str] | None:
    notes: list[str] = []
    for protocol in subject.protocols:
        notes += _check_state(subject, protocol)
    return (notes + (_other_protocol_note(subject) or [])) or None


def _check_state(subject: Subject, protocol: str) -> list[str]:
    from pettingzoo.test.state_test import test_parallel_env, test_state, test_state_space

    turns = subject.turns(2)
    env = subject.env(protocol, **turns)
    if env.state_space is not env.state_space:
        raise _state_fail(env, "state_space is a new object on each access",
                          "build it once (in __init__) and keep it in an attribute.")
    notes = []
    if env.started:  # copies of an env object given mid-episode
        notes.append(f"state() before reset() ({protocol}): the env given had started an episode")
    else:
        try:
            env.state()
        except RuntimeError as err:
            if "reset()" not in str(err):
                raise _state_fail(env, "state() before reset() raised a RuntimeError that does not say to call "
                                  f"reset(): {err}") from err
        else:
            raise _state_fail(env, "state() before reset() returned a state; it must raise a RuntimeError saying to "
                              "call reset()")
    # A second episode with the same seed and actions in the other format: the same states (determinism), one
    # as the other's ids then mask (the formats agree). An env object that cannot be rebuilt plays its own format.
    states = _states_of_episode(env)
    other_format = "dict" if env.obs_format == "flat" else "flat"
    try:
        other = _states_of_episode(subject.env(protocol, obs_format=other_format, **turns))
    except CheckSkipped as why:
        notes.append(f"the state in obs_format={other_format!r} ({protocol}): {why}")
        how = f"{protocol}, obs_format {env.obs_format!r}"
        found = first_difference(states, _states_of_episode(subject.env(protocol, **turns)), "states")
    else:
        how = f"{protocol}, obs_format 'dict' and 'flat': the flat state must be the Dict's ids then mask"
        flat, dicts = (other, states) if other_format == "flat" else (states, other)
        joined = [np.concatenate([d["observation"], d["attention_mask"]], dtype=np.int64) for d in dicts]
        found = first_difference(flat, joined, "states")
    if found:
        raise _state_fail(env, f"two episodes with seed {SEED} and the same actions gave different states ({how}): "
                          f"{found}")
    try:
        overrides = {"step_unit": "response", **subject.turns(OFFICIAL_TURNS)}
        aec = seeded_spaces(_aec_factory(subject, protocol, overrides)())
        _official("state", f"state_test ({protocol})",
                  lambda: (test_state_space(aec), test_state(aec, OFFICIAL_CYCLES)))
        if protocol == "parallel":
            _official("state", "state_test (parallel env)",
                      lambda: test_parallel_env(seeded_spaces(subject.env("parallel", **overrides))))
    except CheckSkipped as why:
        notes.append(f"PettingZoo's state_test ({protocol}): {why}")
    return notes


@_check("infos", "infos: numbers only, the same keys and types at reset and after every step",
        "infos hold numbers only (int or float, no strings, bools or arrays) with the same keys and types at reset "
        "and at every step (TorchRL and RLlib build their specs from the first infos): give every key a value at "
        "reset (0 or 0.0) and never add one later; name reward components in the task's reward_components.")
@_each_protocol
def check_infos(subject: Subject, protocol: str) -> None:
    env = subject.env(protocol, **subject.turns(TURNS))
    moments = play(env, SEED, np.random.default_rng(SEED))
    first = moments[0]["infos"]
    for step, moment in enumerate(moments):
        for agent, info in moment["infos"].items():
            where = {"agent": agent, "problem": problem_label(env), "turn": moment["turn"]}
            if not isinstance(info, Mapping):
                raise EnvCheckError("infos", f"infos[agent] is a {type(info).__name__}, not a dict", **where)
            for key, value in info.items():
                if not isinstance(value, (int, float)) or isinstance(value, bool):
                    raise EnvCheckError("infos", f"infos[{key!r}] is {short(value)} ({type(value).__name__}) "
                                        f"at step {step}: numbers only (int or float)", **where)
            if agent not in first:
                continue
            added, removed = sorted(set(info) - set(first[agent])), sorted(set(first[agent]) - set(info))
            if added or removed:
                raise EnvCheckError("infos", f"infos keys changed between reset and step {step}: added {added}, "
                                    f"removed {removed}", **where)
            for key, value in info.items():
                if type(value) is not type(first[agent][key]):
                    raise EnvCheckError("infos", f"infos[{key!r}] is {type(first[agent][key]).__name__} at reset "
                                        f"but {type(value).__name__} at step {step}", **where)


@_check("determinism", "same seed and actions: the same observations, rewards, flags, infos and transcript over a "
        "whole multi-turn episode; the seed picks the problem",
        "The same seed and actions must give the same episode. Usual causes: the reward or a prompt uses global "
        "randomness (random, np.random, uuid), the clock, a set's order or a cache that changes the result; make any "
        "randomness a function of the problem (e.g. random.Random(problem['id']), as llm_envs.procgen.instance_random "
        "does). An env subclass must draw the problem from self.np_random, which reset(seed) seeds.")
@_each_protocol
def check_determinism(subject: Subject, protocol: str) -> None:
    envs = [subject.env(protocol, **subject.turns(TURNS)) for _ in range(2)]
    runs = [play(env, SEED, np.random.default_rng(SEED)) for env in envs]
    if len(runs[0]) != len(runs[1]):
        raise EnvCheckError("determinism", f"two episodes with seed {SEED} and the same actions took "
                            f"{len(runs[0])} "
                            f"and {len(runs[1])} steps", problem=problem_label(envs[0]))
    for step, (m1, m2) in enumerate(zip(*runs)):
        for part in MOMENT_PARTS:
            for agent in dict.fromkeys([*m1[part], *m2[part]]):
                found = first_difference(m1[part].get(agent), m2[part].get(agent), part)
                if found:
                    raise EnvCheckError(
                        "determinism", f"{part} differ between two episodes with seed {SEED} and the same actions "
                        f"({protocol}, step {step}): {found}", agent=agent, problem=problem_label(envs[0]),
                        turn=m1["turn"])
    t1, t2 = (env.transcript() for env in envs)
    if t1 != t2:
        line = next(i for i, (x, y) in enumerate(zip([*t1.splitlines(), ""], [*t2.splitlines(), ""])) if x != y)
        raise EnvCheckError("determinism", f"the transcripts of two episodes with seed {SEED} differ at line "
                            f"{line}: "
                            f"{short(t1.splitlines()[line:line + 1])} vs {short(t2.splitlines()[line:line + 1])}",
                            problem=problem_label(envs[0]))
    env = envs[0]
    n = len(env.task.problems("train"))
    if n > 1:
        picked = {reset_observe(env, seed=s)[1][env.possible_agents[0]]["task_index"] for s in range(16)}
        if len(picked) == 1:
            raise EnvCheckError("determinism", f"reset(seed=s) for 16 seeds picked the same problem {picked} "
                                f"of {n}: "
                                "the seed does not choose the problem")


@_check("options", "reset options: task_index pins the problem whatever the seed; split='eval' picks the eval split",
        "reset(options={'task_index': i}) must give problems(split)[i] whatever the seed: problems(split) must "
        "return the same items in the same order on every call (no shuffling, no iteration over a set).")
def check_options(subject: Subject) -> list[str] | None:
    protocol = subject.protocols[0]
    for split in SPLITS:
        env, other = subject.env(protocol), subject.env(protocol)
        n = len(env.task.problems(split))
        index = min(n - 1, 2)
        obs_a, infos_a = reset_observe(env, seed=0, options={"split": split, "task_index": index})
        obs_b, _ = reset_observe(other, seed=1, options={"split": split, "task_index": index})
        obs_c, _ = reset_observe(env, seed=2, options={"split": split, "task_index": index})
        for agent in env.possible_agents:
            where = {"agent": agent, "problem": problem_label(env)}
            if infos_a[agent]["task_index"] != index:
                raise EnvCheckError("options", f"infos['task_index'] is {infos_a[agent]['task_index']} after "
                                    f"reset(options={{'task_index': {index}}})", **where)
            found = first_difference(obs_a[agent], obs_b[agent], "observation") or first_difference(
                obs_a[agent], obs_c[agent], "observation")
            if found:
                raise EnvCheckError("options", f"resets with task_index={index} of split {split!r} and different seeds "
                                    f"gave different observations: {found}", **where)
        try:
            env.reset(seed=0, options={"split": split, "task_index": n})
        except ValueError:
            pass
        else:
            raise EnvCheckError("options", f"reset(options={{'task_index': {n}}}) did not raise, with {n} problems in "
                                f"split {split!r}", hint="an out-of-range task_index must raise a ValueError.")
    return None


def _fit_text(env: Any, agent: str, text: str, room: int) -> str:
    """``text`` cut (by words) to at most ``room`` tokens of the agent's tokenizer."""
    words = text.split(" ")
    while words and len(encode_text(env, " ".join(words), agent)) > room:
        words.pop()
    return " ".join(words)


@_check("text_vs_ids", "a str action and its token ids (with junk after a stop id) give the same responses, rewards "
        "and infos",
        "A str action and its token ids (anything after the first EOS/pad ignored) must give the same response, "
        "reward and infos. Usual causes: a reward that reads something else than outputs[role] (the raw action, "
        "env state), or a task that caches results by object identity.")
@_each_protocol
def check_text_vs_ids(subject: Subject, protocol: str) -> None:
    by_text, by_ids = (subject.env(protocol, step_unit="response") for _ in range(2))
    T = by_text.max_new_tokens
    texts, ids = {}, {}
    for k, agent in enumerate(by_text.possible_agents):
        texts[agent] = _fit_text(by_text, agent, SAMPLE_TEXTS[k % len(SAMPLE_TEXTS)], T - 1)
        stops = by_text.stop_token_ids_of(agent)
        tail = [min(stops), *[non_stop_id(by_text.vocab_size_of(agent), stops)] * T]  # junk after the stop id
        own = encode_text(by_text, texts[agent], agent)
        ids[agent] = np.array((own + tail)[:T], dtype=np.int64)
    results = []
    for env, actions in ((by_text, texts), (by_ids, ids)):
        reset_observe(env, seed=SEED)
        results.append(step_turn(env, actions))
    for agent in by_text.possible_agents:
        where = {"agent": agent, "problem": problem_label(by_text), "turn": 0}
        got = [env.history[-1].outputs[agent] for env in (by_text, by_ids)]
        if got[0].ids != got[1].ids or got[0].text != got[1].text:
            raise EnvCheckError("text_vs_ids", f"the text action {texts[agent]!r} became the response "
                                f"{got[0].text!r} {list(got[0].ids)}, its ids the response {got[1].text!r} "
                                f"{list(got[1].ids)}", **where)
        for i, part in enumerate(("rewards", "infos")):
            found = first_difference(results[0][i][agent], results[1][i][agent], part)
            if found:
                raise EnvCheckError("text_vs_ids", f"{part} of the text actions and of their token ids differ: "
                                    f"{found}",
                                    **where)


def _snapshot(env: Any) -> Any:
    aec = ()
    if isinstance(env, AECEnv):
        aec = (env.agent_selection, dict(env.rewards), dict(env._cumulative_rewards))
    return (env.transcript(), env.history, list(env.agents), {a: env.text(a) for a in env.agents}, aec)


def _bad_inputs(env: Any, agent: str) -> list[tuple[str, Any, type]]:
    T, V = env.max_new_tokens, env.vocab_size_of(agent)
    word = non_stop_id(V, env.stop_token_ids_of(agent))
    return [
        (f"token id {V} (out of range [0, {V - 1}])", np.array([1, V], np.int64), ValueError),
        ("token id -1", np.array([-1, 2], np.int64), ValueError),
        (f"{T + 1} ids (more than max_new_tokens={T})", np.full(T + 1, word, np.int64), ValueError),
        ("a 2-D array", np.zeros((2, 2), np.int64), ValueError),
        (f"a string of {T + 8} words (more than max_new_tokens={T} tokens)", "word " * (T + 8), ValueError),
        ("float ids", np.array([1.0, 2.0]), TypeError),
        ("None", None, TypeError),
    ]


@_check("bad_actions", "empty and junk responses get a finite reward; out-of-range, overlong, float, 2-D and None "
        "actions and wrong agent keys raise naming the agent and leave the env as it was",
        "The reward must return a finite float for any text, empty and junk included (score it 0 instead of raising "
        "on text it cannot parse). A bad action must raise at once (ValueError for ids out of range or too many, "
        "TypeError for floats or None, KeyError for a missing or unknown agent), name the agent, and change nothing.")
@_each_protocol
def check_bad_actions(subject: Subject, protocol: str) -> None:
    def build() -> Any:
        return subject.env(protocol, step_unit="response", **subject.turns(2))

    env = build()
    rng = np.random.default_rng(SEED)
    for label, actions in (
        ("empty strings", dict.fromkeys(env.possible_agents, "")),
        ("empty id arrays", {a: np.zeros(0, np.int64) for a in env.possible_agents}),
        ("random token ids", random_actions(env, rng, env.possible_agents)),
    ):
        reset_observe(env, seed=SEED)
        try:
            rewards, _ = step_turn(env, actions)
        except Exception as err:
            raise EnvCheckError("bad_actions", f"a turn of {label} raised {error_text(err)}",
                                problem=problem_label(env)) from err
        for agent, reward in rewards.items():
            if not isinstance(reward, float) or not math.isfinite(reward):
                raise EnvCheckError("bad_actions", f"a turn of {label} got the reward {reward!r}, not a finite float",
                                    agent=agent, problem=problem_label(env))
    reset_observe(env, seed=SEED)
    before = _snapshot(env)
    agent = env.agents[0] if protocol == "parallel" else env.agent_selection
    others = {a: "" for a in env.possible_agents if a != agent}
    cases = [(label, {agent: bad, **others} if protocol == "parallel" else bad, error, agent)
             for label, bad, error in _bad_inputs(env, agent)]
    if protocol == "parallel":
        cases += [(f"actions without agent {agent!r}", others, KeyError, agent),
                  ("actions for an unknown agent 'nobody'", {agent: "", **others, "nobody": ""}, KeyError, "nobody")]
    for label, actions, error, named in cases:
        where = {"agent": agent, "problem": problem_label(env)}
        try:
            env.step(actions)
        except error as err:
            if named not in str(err):
                raise EnvCheckError("bad_actions", f"{label}: the {error.__name__} does not name the agent: "
                                    f"{short(str(err), 300)}",
                                    **where) from err
        except Exception as err:
            raise EnvCheckError("bad_actions", f"{label}: expected a {error.__name__}, got {error_text(err)}",
                                **where) from err
        else:
            raise EnvCheckError("bad_actions", f"{label} was accepted; expected a {error.__name__}", **where)
        found = first_difference(before, _snapshot(env), "env")
        if found:
            raise EnvCheckError("bad_actions", f"{label}: the rejected step changed the env: {found}", **where)
    fresh = build()
    reset_observe(fresh, seed=SEED)
    good = dict.fromkeys(env.possible_agents, "")
    found = first_difference(step_turn(env, good), step_turn(fresh, good), "step")
    if found:
        raise EnvCheckError("bad_actions", "after the rejected actions a valid turn differs from a fresh env's: "
                            f"{found}", problem=problem_label(env))


@_check("reward_bounds", "rewards are finite floats within the task's declared [min_reward, max_reward], over random "
        "and empty responses on sampled problems",
        "Rewards are finite floats, and within [min_reward, max_reward] where the task declares them (class "
        "attributes of the Task): fix the reward, or the declared bounds.")
def check_reward_bounds(subject: Subject) -> list[str] | None:
    low, high = float(subject.task.min_reward), float(subject.task.max_reward)
    protocol = subject.protocols[0]
    env = subject.env(protocol, step_unit="response", **subject.turns(2))
    rng = np.random.default_rng(SEED)
    empty = lambda e, agents: dict.fromkeys(agents, "")  # noqa: E731
    for (split, index), policy in zip(_sample_problems(env), [None, empty] * PROBLEMS_PER_SPLIT):
        moments = play(env, SEED, rng, options={"split": split, "task_index": index}, policy=policy)
        for turn, record in enumerate(env.history):
            values = {"the joint reward": record.reward,
                      **{f"agent {a!r}'s reward": r for a, r in record.agent_rewards.items()}}
            for what, value in values.items():
                if not math.isfinite(value) or not low <= value <= high:
                    raise EnvCheckError("reward_bounds", f"{what} is {value!r}, outside the declared "
                                        f"[min_reward={low}, max_reward={high}]", problem=problem_label(env), turn=turn)
        for moment in moments:
            if moment["dead_step"]:  # PettingZoo's own bookkeeping: it clears rewards to int 0
                continue
            for agent, reward in moment["rewards"].items():
                if type(reward) is not float or not math.isfinite(reward):
                    raise EnvCheckError("reward_bounds", f"the step returned the reward {reward!r} "
                                        f"({type(reward).__name__}), not a finite float", agent=agent,
                                        problem=problem_label(env), turn=moment["turn"])
    if math.isinf(low) and math.isinf(high):
        return ["bounds: the task declares neither max_reward nor min_reward (finite floats checked)"]
    return None
