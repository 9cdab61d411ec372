"""The checks of an env as an object: ``render``, ``copy`` (deepcopy and pickle mid-episode), ``vector``
(each row of ``make_vec`` a single env) and ``truncation`` (``max_cycles``)."""

from __future__ import annotations

import contextlib
import copy
import io
import pickle
from collections.abc import Mapping
from typing import Any

import numpy as np
from pettingzoo import ParallelEnv

from llm_envs.testing.episodes import (
    error_text,
    first_difference,
    play,
    problem_label,
    random_actions,
    reset_observe,
    short,
    step_turn,
)
from llm_envs.testing.report import CheckSkipped, EnvCheckError
from llm_envs.testing.subject import MAX_PICKLE_BYTES, SEED, VECTOR_ENVS, Subject, _check, _each_protocol


@_check("render", "render_mode 'ansi' returns env.transcript() with every prompt and response, 'human' prints it; "
        "transcript_turns() has one entry per turn",
        "render() in 'ansi' mode returns env.transcript() (prompts, responses, rewards, feedback), in 'human' mode "
        "prints it and returns None, and '' before reset; transcript_turns() has one dict per finished turn with its "
        "reward. An env subclass that overrides render or the transcript must keep these.")
@_each_protocol
def check_render(subject: Subject, protocol: str) -> None:
    env = subject.env(protocol, render_mode="ansi", step_unit="response", **subject.turns(2))
    if not env.started and env.render() != "":  # (copies of an env object given mid-episode have started)
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
    by_value = {id(tok): tok for agent in env.possible_agents if env.tokenizer_name_of(agent) is None
                for tok in [env.tokenizer_of(agent)]}
    own = len(blob) - sum(len(pickle.dumps(tok)) for tok in by_value.values())
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
            if isinstance(env, ParallelEnv):
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
