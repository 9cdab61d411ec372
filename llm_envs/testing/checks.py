"""The checks behind :func:`llm_envs.testing.check_env`: one function per property of the env contract
(docs/env-contract.md), each raising :class:`EnvCheckError` with the property's name, the agent and
the problem where it failed and how to fix the usual causes. No torch, no pytest at import."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import io
import math
import pickle
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from llm_envs.core.base import LLMEnvCore
from llm_envs.core.parallel import ParallelLLMEnv
from llm_envs.core.sequential import SequentialLLMEnv
from llm_envs.core.task import PROTOCOLS, SPLITS, Task
from llm_envs.testing.episodes import (
    MOMENT_PARTS,
    error_text,
    first_difference,
    non_stop_id,
    play,
    problem_label,
    prompt_ids,
    random_actions,
    reset_observe,
    short,
    step_turn,
    why_not_in,
)
from llm_envs.testing.report import CheckReport, CheckSkipped, EnvCheckError

SEED = 11
"""Seed of the episodes the checks play (a second seed, where one is needed, is ``SEED + 1``)."""
TURNS = 3
"""Turns per episode in the multi-turn checks, where the task allows that many and ``num_turns`` is not given."""
OFFICIAL_TURNS = 2
"""Turns per episode in PettingZoo's checks (where the task allows two and ``num_turns`` is not given)."""
OFFICIAL_CYCLES = 4
"""``num_cycles`` of PettingZoo's checks in response mode; in token mode 3 x ``max_new_tokens`` (every turn
resolves within them), at most :data:`MAX_TOKEN_CYCLES`."""
MAX_TOKEN_CYCLES = 48
MAX_CYCLES_TURNS = 6
"""``num_turns`` of PettingZoo's ``max_cycles_test`` (it truncates at 4)."""
PROBLEMS_PER_SPLIT = 4
"""Problems per split whose first observations the spaces and reward checks build: the first ones (a generated eval
split builds its instances in order, so a late index costs every earlier one; the seeded episodes of the other checks
draw problems from anywhere in the train split)."""
TOKEN_MODE_TOKENS = 5
"""``max_new_tokens`` of the token-mode check (responses of every length from 0 to it)."""
VECTOR_ENVS = 2
MAX_PICKLE_BYTES = 1_000_000
"""A pickled env larger than this holds something it should load lazily (a dataset, a model, a pool)."""
SAMPLE_TEXTS = ("The answer is 42, because six times seven is 42.", "A short reply.", "First, list the facts.")
"""Text actions of the text-vs-token-ids check (cut to fit ``max_new_tokens``)."""
QUIET_WARNINGS = (
    # PettingZoo's api_test on the contract's spaces and names (docs/env-contract.md says why they are so).
    "Observation space for each agent probably should be",
    "Observation is not a NumPy array",
    "We recommend agents to be named in the format",
    "Agents have different observation space sizes",
    # Its state_test on the Dict state (docs/env-contract.md, "Global state").
    "State space for each environment probably should be",
    "State is not NumPy array",
    # Its checks reset with options of their own; the env warns that it ignores them.
    "Ignoring unknown reset options",
)
PETTINGZOO_CHECKS = ("pettingzoo_parallel", "pettingzoo_aec", "pettingzoo_seed", "pettingzoo_render")
"""PettingZoo's official checks that apply to every env (``pettingzoo_max_cycles`` needs a multi-turn id)."""


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Subject], list[str] | None]
    what: str
    hint: str


_CHECKS: dict[str, Check] = {}


def _check(name: str, what: str, hint: str) -> Callable:
    def register(fn: Callable[[Subject], list[str] | None]) -> Callable[[Subject], list[str] | None]:
        _CHECKS[name] = Check(name, fn, what, hint)
        return fn

    return register


def _each_protocol(fn: Callable[[Subject, str], None]) -> Callable[[Subject], None]:
    """A check run once under each protocol the subject has."""

    @functools.wraps(fn)
    def run(subject: Subject) -> None:
        for protocol in subject.protocols:
            fn(subject, protocol)

    return run


# ------------------------------------------------------------------------------------ the subject
class Subject:
    """What is checked, and how to build fresh envs of it: from an id (``make``), a task (the protocol
    classes) or an env object (deep copies of it, taken before the checks touch it)."""

    def __init__(self, name: str, protocols: Sequence[str], build: Callable[..., Any], *,
                 task: Task, user_kwargs: Mapping[str, Any], template: Any = None) -> None:
        self.name = name
        self.protocols = tuple(protocols)
        self._build = build
        self.task = task
        self.user_kwargs = dict(user_kwargs)
        self.template = template

    @classmethod
    def of(cls, env_or_id: Any, make_kwargs: Mapping[str, Any]) -> Subject:
        if isinstance(env_or_id, str):
            from llm_envs.core.registry import make

            kwargs = dict(make_kwargs)
            chosen = kwargs.pop("protocol", None)
            probe = make(env_or_id, protocol=chosen, **kwargs)  # unknown ids and kwargs fail here, clearly
            protocols = [chosen] if chosen else [p for p in PROTOCOLS if p in probe.task.protocols]
            def build(protocol: str, **o: Any) -> Any:
                return make(env_or_id, protocol=protocol, **{**kwargs, **o})

            return cls(env_or_id, protocols, build,
                       task=probe.task, user_kwargs=kwargs)
        if isinstance(env_or_id, Task):
            raise TypeError("check_env takes an env id or an env; for a Task object call check_task(task).")
        if not isinstance(env_or_id, LLMEnvCore):
            raise TypeError(
                f"check_env takes a registered env id or an llm_envs env (llm_envs.make(...)), got "
                f"{type(env_or_id).__name__}; register a task with llm_envs.register(...) to check it by id."
            )
        if make_kwargs:
            raise TypeError(f"make kwargs {sorted(make_kwargs)} apply to an env id only, not to an env object.")
        template = copy.deepcopy(env_or_id)
        protocol = "parallel" if isinstance(env_or_id, ParallelLLMEnv) else "sequential"
        return cls(f"{type(env_or_id).__name__}({env_or_id.env_id})", [protocol], None, task=env_or_id.task,
                   user_kwargs={}, template=template)

    @classmethod
    def of_task(cls, task: Task, make_kwargs: Mapping[str, Any]) -> Subject:
        if not isinstance(task, Task):
            raise TypeError(f"check_task takes an llm_envs Task, got {type(task).__name__}.")
        kwargs = dict(make_kwargs)
        chosen = kwargs.pop("protocol", None)
        classes = {"parallel": ParallelLLMEnv, "sequential": SequentialLLMEnv}
        protocols = [chosen] if chosen else [p for p in PROTOCOLS if p in task.protocols]
        for p in protocols:
            if p not in classes:
                raise ValueError(f"protocol must be one of {PROTOCOLS}, got {p!r}.")
        classes[protocols[0]](task, **kwargs)  # bad kwargs fail here, clearly
        return cls(type(task).__name__, protocols, lambda protocol, **o: classes[protocol](task, **{**kwargs, **o}),
                   task=task, user_kwargs=kwargs)

    def env(self, protocol: str, **overrides: Any) -> Any:
        """A fresh env of ``protocol`` with ``overrides`` (make kwargs). An env object can only be copied:
        an override that differs from its own value skips the check."""
        if self.template is None:
            return self._build(protocol, **overrides)
        env = copy.deepcopy(self.template)
        for key, value in overrides.items():
            if key == "render_mode":
                env.render_mode = value
            elif getattr(env, key, None) != value:
                raise CheckSkipped(
                    f"needs the env rebuilt with {key}={value!r}: check it by id or with check_task(task)")
        return env

    def turns(self, wanted: int) -> dict[str, int]:
        """``num_turns`` for a multi-turn check: ``wanted`` or the task's maximum, unless the user chose it."""
        if self.template is not None or "num_turns" in self.user_kwargs:
            return {}
        limit = self.task.max_turns
        return {"num_turns": wanted if limit is None else min(wanted, limit)}

    def vector(self, protocol: str, num_envs: int, **overrides: Any) -> Any:
        from llm_envs.core.vector import SequentialVectorEnv, VectorEnv

        cls = VectorEnv if protocol == "parallel" else SequentialVectorEnv
        return cls(lambda: self.env(protocol, **overrides), num_envs)



def _sample_problems(env: Any) -> list[tuple[str, int]]:
    """(split, task_index) pairs: the first :data:`PROBLEMS_PER_SPLIT` problems of each split."""
    out = []
    for split in SPLITS:
        n = len(env.task.problems(split))
        if n == 0:
            raise EnvCheckError("spaces", f"problems({split!r}) is empty: reset(options={{'split': {split!r}}}) has "
                                "nothing to pick", hint="give the task problems in both splits ('train' and 'eval').")
        out += [(split, i) for i in range(min(n, PROBLEMS_PER_SPLIT))]
    return out


@contextlib.contextmanager
def _quiet() -> Any:
    """PettingZoo's warnings about the contract's own spaces and names off; 'human' renders captured."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        for text in QUIET_WARNINGS:
            warnings.filterwarnings("ignore", message=f".*{text}")
        yield


# ------------------------------------------------------------------------------- official checks
def _official_kwargs(subject: Subject, protocol: str) -> tuple[dict[str, Any], int]:
    """(overrides, num_cycles) for PettingZoo's checks."""
    overrides = subject.turns(OFFICIAL_TURNS)
    env = subject.env(protocol, **overrides)
    cycles = min(3 * env.max_new_tokens, MAX_TOKEN_CYCLES) if env.step_unit == "token" else OFFICIAL_CYCLES
    return overrides, cycles


def _aec_factory(subject: Subject, protocol: str, overrides: Mapping[str, Any]) -> Callable[..., Any]:
    from pettingzoo.utils.conversions import parallel_to_aec

    def build(**k: Any) -> Any:
        env = subject.env(protocol, **overrides, **k)
        return parallel_to_aec(env) if protocol == "parallel" else env

    return build


def _official(check: str, name: str, run: Callable[[], Any]) -> None:
    try:
        run()
    except (CheckSkipped, EnvCheckError):
        raise
    except Exception as err:
        raise EnvCheckError(check, f"PettingZoo's {name} failed: {error_text(err)}") from err


PETTINGZOO_HINT = (
    "PettingZoo's own test failed; its message says which part. With an llm_envs task this is mostly the task "
    "raising (the chained error shows where), or an env subclass that changes the spaces, the agents or what "
    "step/reset return."
)


def seeded_spaces(env: Any) -> Any:
    """``env`` with each agent's action space seeded (0, 1, ...): PettingZoo's random agent and
    render_test draw from them, and unseeded they draw another episode every run. Under a flat
    observation the agent cannot see the action mask, so an unseeded draw of a stop token now and then
    makes the next unmasked draw an action the env refuses (a clear error): a check that passes or fails
    by chance. Seeded, it is the same run every time."""
    for i, agent in enumerate(env.possible_agents):
        env.action_space(agent).seed(i)
    return env


@_check("pettingzoo_parallel", "PettingZoo's parallel_api_test", PETTINGZOO_HINT)
def check_pettingzoo_parallel(subject: Subject) -> list[str] | None:
    from pettingzoo.test import parallel_api_test

    if "parallel" not in subject.protocols:
        raise CheckSkipped("the task runs under the sequential protocol only")
    overrides, cycles = _official_kwargs(subject, "parallel")
    _official("pettingzoo_parallel", "parallel_api_test",
              lambda: parallel_api_test(seeded_spaces(subject.env("parallel", **overrides)), num_cycles=cycles))
    return None


@_check("pettingzoo_aec", "PettingZoo's api_test: the sequential env and parallel_to_aec of the parallel one",
        PETTINGZOO_HINT)
def check_pettingzoo_aec(subject: Subject) -> list[str] | None:
    from pettingzoo.test import api_test

    for protocol in subject.protocols:
        overrides, cycles = _official_kwargs(subject, protocol)
        env = seeded_spaces(_aec_factory(subject, protocol, overrides)())
        _official("pettingzoo_aec", f"api_test ({protocol})",
                  lambda env=env, cycles=cycles: api_test(env, num_cycles=cycles))
    return _other_protocol_note(subject)


def _other_protocol_note(subject: Subject) -> list[str] | None:
    missing = [p for p in PROTOCOLS if p not in subject.protocols]
    return [f"the {p} protocol: the task (or the env given) does not run it" for p in missing] or None


@_check("pettingzoo_seed", "PettingZoo's parallel_seed_test and seed_test", PETTINGZOO_HINT
        + " A seed test failing alone: see the determinism check's hint.")
def check_pettingzoo_seed(subject: Subject) -> list[str] | None:
    from pettingzoo.test import parallel_seed_test, seed_test

    for protocol in subject.protocols:
        overrides, cycles = _official_kwargs(subject, protocol)
        if protocol == "parallel":
            _official("pettingzoo_seed", "parallel_seed_test",
                      lambda o=overrides: parallel_seed_test(lambda **k: subject.env("parallel", **o, **k)))
        build = _aec_factory(subject, protocol, overrides)
        _official("pettingzoo_seed", f"seed_test ({protocol})", lambda b=build, c=cycles: seed_test(b, num_cycles=c))
    return _other_protocol_note(subject)


@_check("pettingzoo_render", "PettingZoo's render_test ('ansi' and 'human')", PETTINGZOO_HINT)
def check_pettingzoo_render(subject: Subject) -> list[str] | None:
    from pettingzoo.test import render_test

    for protocol in subject.protocols:
        overrides, _ = _official_kwargs(subject, protocol)
        build = _aec_factory(subject, protocol, overrides)
        _official("pettingzoo_render", f"render_test ({protocol})",
                  lambda b=build: render_test(lambda **k: seeded_spaces(b(**k))))
    return _other_protocol_note(subject)


@_check("pettingzoo_max_cycles", "PettingZoo's max_cycles_test (truncation after max_cycles turns)", PETTINGZOO_HINT)
def check_pettingzoo_max_cycles(subject: Subject) -> list[str] | None:
    import types

    from pettingzoo.test import max_cycles_test

    if "parallel" not in subject.protocols:
        raise CheckSkipped("max_cycles_test needs the parallel protocol (the truncation check covers the sequential)")
    limit = subject.task.max_turns
    if limit is not None and limit < MAX_CYCLES_TURNS:
        raise CheckSkipped(f"max_cycles_test needs {MAX_CYCLES_TURNS} turns per episode; the task allows {limit}")
    aec_protocol = "sequential" if "sequential" in subject.protocols else "parallel"
    turns_kw = {"num_turns": MAX_CYCLES_TURNS}
    subject.env("parallel", **turns_kw, max_cycles=MAX_CYCLES_TURNS)  # an env object skips here
    mod = types.SimpleNamespace(
        env=lambda max_cycles: _aec_factory(subject, aec_protocol, {**turns_kw, "max_cycles": max_cycles})(),
        parallel_env=lambda max_cycles: subject.env("parallel", **turns_kw, max_cycles=max_cycles),
    )
    _official("pettingzoo_max_cycles", "max_cycles_test", lambda: max_cycles_test(mod))
    return None


# ----------------------------------------------------------------------------------- our contract
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
    return EnvCheckError("state", detail, problem=problem_label(env), turn=len(env.history) if env._started else None,
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
    if seen_turns is None and not _contains(ids, env._encode_text(env._problem_statement(), first)):
        raise _state_fail(env, "the state does not hold the problem's prompt (encoded with the state tokenizer)")
    if env.history and len(env.history) != seen_turns:
        for role, response in env.history[-1].outputs.items():
            if not _contains(ids, list(env._response_ids_for(response, first))):
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
    try:
        env.state()
    except RuntimeError as err:
        if "reset()" not in str(err):
            raise _state_fail(env, f"state() before reset() raised a RuntimeError that does not say to call reset(): "
                              f"{err}") from err
    else:
        raise _state_fail(env, "state() before reset() returned a state; it must raise a RuntimeError saying to call "
                          "reset()")
    # A second episode with the same seed and actions in the other format: the same states (determinism), one
    # as the other's ids then mask (the formats agree). An env object that cannot be rebuilt plays its own format.
    states = _states_of_episode(env)
    notes = []
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
    while words and len(env._encode_text(" ".join(words), agent)) > room:
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
        own = by_text._encode_text(texts[agent], agent)
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
    if isinstance(env, SequentialLLMEnv):
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


# --------------------------------------------------------------------------------- token mode
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


# ------------------------------------------------------------------------------ render, copies, batches
@_check("render", "render_mode 'ansi' returns env.transcript() with every prompt and response, 'human' prints it; "
        "transcript_turns() has one entry per turn",
        "render() in 'ansi' mode returns env.transcript() (prompts, responses, rewards, feedback), in 'human' mode "
        "prints it and returns None, and '' before reset; transcript_turns() has one dict per finished turn with its "
        "reward. An env subclass that overrides render or the transcript must keep these.")
@_each_protocol
def check_render(subject: Subject, protocol: str) -> None:
    env = subject.env(protocol, render_mode="ansi", step_unit="response", **subject.turns(2))
    if env.render() != "":
        raise EnvCheckError("render", f"render() before reset returned {short(env.render())}, expected ''")
    prompts: dict[str, list[str]] = {a: [] for a in env.possible_agents}

    def policy(e: Any, agents: list[str]) -> dict[str, Any]:
        for a in agents:
            prompts[a].append(e.text(a))
        return random_actions(e, rng, agents)

    rng = np.random.default_rng(SEED)
    play(env, SEED, rng, policy=policy)
    text = env.render()
    where = {"problem": problem_label(env)}
    if text != env.transcript():
        raise EnvCheckError("render", "render() in 'ansi' mode is not env.transcript()", **where)
    for turn, record in enumerate(env.history):
        for agent, response in record.outputs.items():
            for piece, what in ((prompts[agent][turn], "prompt"), (response.text, "response")):
                if piece not in text:
                    raise EnvCheckError("render", f"the transcript lacks the {what} of turn {turn}: "
                                        f"{short(piece)}", agent=agent, **where)
    turns = env.transcript_turns()
    if len(turns) != len(env.history) or [t["reward"] for t in turns] != [r.reward for r in env.history]:
        raise EnvCheckError("render", f"transcript_turns() has {len(turns)} turns with rewards "
                            f"{[t['reward'] for t in turns]}; the episode had {[r.reward for r in env.history]}",
                            **where)
    human = subject.env(protocol, render_mode="human", step_unit="response", **subject.turns(2))
    play(human, SEED, np.random.default_rng(SEED))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        returned = human.render()
    if returned is not None or out.getvalue().strip() != human.transcript().strip():
        raise EnvCheckError("render", "render() in 'human' mode must print the transcript and return None; it "
                            f"returned {short(returned)} and printed {len(out.getvalue())} characters", **where)


@_check("copy", "copy.deepcopy and pickle mid-episode continue identically; a pickled env is small",
        "Envs must deep-copy and pickle cheaply (vector wrappers copy them) and continue identically: keep datasets, "
        "models, pools, locks and open files out of the task's instance state (load data through a module-level "
        "functools.cache function; create pools lazily, outside the env).")
@_each_protocol
def check_copy(subject: Subject, protocol: str) -> None:
    env = subject.env(protocol, step_unit="response", **subject.turns(2))
    rng = np.random.default_rng(SEED)
    reset_observe(env, seed=SEED)
    if env.num_turns > 1:
        step_turn(env, random_actions(env, rng, env.possible_agents))
    actions = random_actions(env, rng, env.possible_agents)
    if protocol == "sequential" and len(env.possible_agents) > 1:  # copy it mid-turn, after the first role acted
        env.step(actions[env.agent_selection])
    where = {"problem": problem_label(env), "turn": len(env.history)}
    try:
        blob = pickle.dumps(env)
        clone = pickle.loads(blob)
        twin = copy.deepcopy(env)
    except Exception as err:
        hint = None
        if "local object" in str(err) or "lambda" in str(err):
            hint = ("pickle stores a function by its import path, so a task cannot hold a lambda or a function "
                    "defined inside another: define the reward (and any other callable the task keeps) at module "
                    "level, e.g. `def reward(problem, outputs): ...` next to the register() call.")
        raise EnvCheckError("copy", f"the env does not pickle or deep-copy: {error_text(err)}", hint=hint,
                            **where) from err
    # Tokenizers given as objects pickle by value (docs/env-contract.md, "Copying"): they are not the env's weight.
    handles = {id(tokens.handle): tokens.handle for tokens in env._agent_tokens.values()}
    own = len(blob) - sum(len(pickle.dumps(h)) for h in handles.values() if h.spec is None)
    if own > MAX_PICKLE_BYTES:
        raise EnvCheckError("copy", f"a pickled env is {own:,} bytes besides its tokenizers (more than "
                            f"{MAX_PICKLE_BYTES:,})", **where)
    results = [step_turn(e, actions) for e in (env, clone, twin)]
    for label, result, other in (("the pickled copy", results[1], clone), ("the deep copy", results[2], twin)):
        found = first_difference(results[0], result, "step") or (
            None if other.transcript() == env.transcript() else "the transcripts differ")
        if found:
            raise EnvCheckError("copy", f"{label} continued differently from the env: {found}", **where)


def _row(batch: Any, i: int) -> Any:
    if isinstance(batch, Mapping):
        return {k: _row(v, i) for k, v in batch.items()}
    value = batch[i]
    return value.item() if isinstance(value, np.generic) else value


@_check("vector", "a vector env of it (make_vec) steps each row exactly as a single env with the same seed and actions "
        "(observations, infos, rewards, states)",
        "Each row of a batch must be what a single env with the same seed and actions gives. A task's prepare_rewards "
        "(called with the whole batch's turns) must store per (problem, outputs) what reward() then returns.")
@_each_protocol
def check_vector(subject: Subject, protocol: str) -> None:
    overrides = {"step_unit": "response", **subject.turns(2)}
    venv = subject.vector(protocol, VECTOR_ENVS, **overrides)
    singles = [subject.env(protocol, **overrides) for _ in range(VECTOR_ENVS)]
    seeds = [SEED + i for i in range(VECTOR_ENVS)]
    obs, infos = venv.reset(seed=seeds)
    single = [reset_observe(env, seed=s) for env, s in zip(singles, seeds)]
    rng = np.random.default_rng(SEED)
    step = 0
    while True:
        states = venv.state()
        for i, env in enumerate(singles):
            for agent in obs:
                for part, batch, one in (("observation", obs, single[i][0]), ("infos", infos, single[i][1])):
                    found = first_difference(_row(batch[agent], i), one[agent], part)
                    if found:
                        raise EnvCheckError("vector", f"row {i} of the batch (seed {seeds[i]}) differs from a "
                                            "single "
                                            f"env at step {step}: {found}", agent=agent, problem=problem_label(env))
            found = first_difference(_row(states, i), env.state(), "state")
            if found:
                raise EnvCheckError("vector", f"row {i} of the batch's state() (seed {seeds[i]}) differs from a "
                                    f"single env's at step {step}: {found}", problem=problem_label(env))
        if not venv.agents:
            break
        rows = [random_actions(env, rng, venv.agents) for env in singles]
        obs, rewards, _, _, infos = venv.step({a: np.stack([r[a] for r in rows]) for a in venv.agents})
        single = []
        for env, row in zip(singles, rows):
            if isinstance(env, ParallelLLMEnv):
                o, r, _, _, inf = env.step(row)
            else:
                env.step(row[env.agent_selection])
                o, r, inf = {a: env.observe(a) for a in venv.agents}, dict(env.rewards), dict(env.infos)
            single.append((o, inf, r))
        for i, env in enumerate(singles):
            for agent, reward in single[i][2].items():
                if rewards[agent][i] != reward:
                    raise EnvCheckError("vector", f"row {i}'s reward is {rewards[agent][i]}, a single env's "
                                        f"{reward} "
                                        f"(step {step})", agent=agent, problem=problem_label(env))
        step += 1


@_check("truncation", "max_cycles < num_turns truncates the episode after max_cycles turns (both protocols)",
        "With max_cycles < num_turns the episode must end after max_cycles turns with truncations set and "
        "terminations not; an env subclass must keep the base class's _episode_over.")
def check_truncation(subject: Subject) -> list[str] | None:
    limit = subject.task.max_turns
    if limit is not None and limit < 2:
        raise CheckSkipped(f"truncation needs 2 turns per episode; the task allows {limit}")
    num_turns = 3 if limit is None else min(3, limit)
    for protocol in subject.protocols:
        env = subject.env(protocol, num_turns=num_turns, max_cycles=num_turns - 1, step_unit="response")
        moments = play(env, SEED, np.random.default_rng(SEED))
        last = moments[-1] if protocol == "parallel" else moments[-len(env.possible_agents) - 1]
        where = {"problem": problem_label(env)}
        if len(env.history) != num_turns - 1:
            raise EnvCheckError("truncation", f"with num_turns={num_turns} and max_cycles={num_turns - 1} the episode "
                                f"lasted {len(env.history)} turns", **where)
        if not all(last["truncations"].values()) or any(last["terminations"].values()):
            raise EnvCheckError("truncation", f"the last step's truncations are {last['truncations']} and terminations "
                                f"{last['terminations']}; expected all truncated, none terminated", **where)
    return None


CHECKS: tuple[str, ...] = tuple(_CHECKS)
"""Every check's name, in the order :func:`check_env` runs them."""


def describe_checks() -> dict[str, str]:
    """{check: what it checks}."""
    return {name: check.what for name, check in _CHECKS.items()}


# ---------------------------------------------------------------------------------------- entry points
def _selected(checks: Iterable[str] | None, skip: Iterable[str]) -> list[str]:
    chosen = list(CHECKS if checks is None else ([checks] if isinstance(checks, str) else checks))
    skip = [skip] if isinstance(skip, str) else list(skip)
    unknown = [c for c in [*chosen, *skip] if c not in _CHECKS]
    if unknown:
        raise ValueError(f"Unknown check(s) {unknown}; the checks are {list(CHECKS)}.")
    return [c for c in chosen if c not in skip]


def run_checks(subject: Subject, checks: Iterable[str] | None = None, skip: Iterable[str] = (),
               raise_errors: bool = True) -> CheckReport:
    """Run the checks on ``subject``; see :func:`check_env`."""
    __tracebackhide__ = True
    selected = _selected(checks, skip)
    report = CheckReport(subject.name, what={name: _CHECKS[name].what for name in selected})
    for name in selected:
        start = time.perf_counter()
        try:
            with _quiet():
                notes = _CHECKS[name].run(subject)
        except CheckSkipped as why:
            report.skipped[name] = str(why)
        except EnvCheckError as err:
            report.failed[name] = err
        except Exception as err:
            wrapped = EnvCheckError(name, f"{error_text(err)}")
            wrapped.__cause__ = err
            report.failed[name] = wrapped
        else:
            report.passed[name] = time.perf_counter() - start
            if notes:
                report.notes[name] = list(notes)
    for name, err in report.failed.items():
        err.subject, err.report = subject.name, report
        if err.hint is None:
            err.hint = _CHECKS[name].hint
    if report.failed and raise_errors:
        raise next(iter(report.failed.values()))
    return report
