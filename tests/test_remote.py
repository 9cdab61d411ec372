"""The remote env (llm_envs/remote.py) against real ``llm-envs serve`` servers on 127.0.0.1 (tests/serving.py, each
started once for the module and stopped by its pid): ``check_env`` passes on it unchanged, skipping exactly the checks
that need the env rebuilt; an episode with the same seed and actions is the same locally and remotely (observations,
rewards, flags, infos, state, history, transcript), under both protocols, in token mode and with flat observations;
PettingZoo's own API tests run on it directly; the env's errors cross with their type and change nothing; a vector env
of its copies steps like one of local copies."""

from __future__ import annotations

import contextlib
import copy
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

pytest.importorskip("openenv", reason="the server needs the 'serve' extra: pip install -e '.[serve]'")
pytest.importorskip("websockets", reason="the remote env needs the 'remote' extra: pip install -e '.[remote]'")

from serving import running

import llm_envs
from llm_envs.core.vector import SequentialVectorEnv, VectorEnv
from llm_envs.remote import RemoteAECEnv, RemoteEnv, RemoteParallelEnv, connect
from llm_envs.testing import CHECKS, check_env, first_difference

SERVERS: dict[str, tuple[str, dict[str, Any]]] = {
    "xsum": ("writing/xsum-v0", {"max_new_tokens": 8, "num_turns": 2}),
    "sequential": ("writing/xsum-sequential-v0", {"max_new_tokens": 8, "num_turns": 2}),
    "code": ("coding/humaneval-v0", {"max_new_tokens": 48, "num_turns": 2}),
    "token": ("writing/xsum-v0", {"step_unit": "token", "max_new_tokens": 4}),
    "flat": ("writing/xsum-v0", {"obs_format": "flat", "max_new_tokens": 8, "num_turns": 2}),
}

# What check_env skips on an env object (it is only ever copied, never rebuilt), and the start of each reason.
NEED_REBUILT = "needs the env rebuilt with"
RESPONSE_MODE_SKIPS = {
    "pettingzoo_max_cycles": f"{NEED_REBUILT} num_turns=6",
    "token_mode": f"{NEED_REBUILT} max_new_tokens=5",
    "truncation": f"{NEED_REBUILT} num_turns=3",
}
EXPECTED_SKIPS = {
    "xsum": RESPONSE_MODE_SKIPS,
    "code": RESPONSE_MODE_SKIPS,
    "flat": RESPONSE_MODE_SKIPS,
    "sequential": {
        "pettingzoo_parallel": "the env given runs the sequential protocol",
        "pettingzoo_max_cycles": "max_cycles_test needs the parallel protocol",
        "token_mode": f"{NEED_REBUILT} max_new_tokens=5",
        "truncation": f"{NEED_REBUILT} num_turns=3",
    },
    "token": {
        **{check: f"{NEED_REBUILT} step_unit='response'" for check in (
            "text_vs_ids", "bad_actions", "reward_bounds", "token_mode", "render", "copy", "vector")},
        "pettingzoo_max_cycles": f"{NEED_REBUILT} num_turns=6",
        "truncation": f"{NEED_REBUILT} num_turns=3",
    },
}

# HumanEval's train problem 2 (max_element) and a right answer: the helper and the main function that calls it.
CODE_PROBLEM = {"task_index": 2}
CODE_ANSWER = {"helper": "def aux(l):\n    return max(l)\n",
               "main": "def max_element(l: list):\n    return aux(l)\n"}
TEXTS = ("Wealth shapes the young.", "Parents' wealth matters more.")  # 6 tokens each: they fit 8


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``served(name)``: the running server of :data:`SERVERS`, started on first use; all stop with the module."""
    started: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        def get(name: str) -> Any:
            if name not in started:
                env_id, kwargs = SERVERS[name]
                started[name] = stack.enter_context(
                    running(env_id, log_dir=tmp_path_factory.mktemp(f"serve-{name}"), make_kwargs=kwargs))
            return started[name]

        yield get


def pair(served: Any, name: str) -> tuple[Any, Any]:
    """(local env, remote env) of a server of :data:`SERVERS`: ``llm_envs.make`` with its kwargs, and ``connect``."""
    env_id, kwargs = SERVERS[name]
    return llm_envs.make(env_id, **kwargs), connect(served(name).url)


def ids_of(env: Any, agent: str, text: str, junk: bool = True) -> np.ndarray:
    """``text`` as the agent's token ids, ended by a stop id and junk after it (which the env ignores)."""
    ids = env.tokenizer_of(agent)(text, add_special_tokens=False)["input_ids"][: env.max_new_tokens - 1]
    if junk:
        ids = (ids + [min(env.stop_token_ids_of(agent))] + [42] * env.max_new_tokens)[: env.max_new_tokens]
    return np.array(ids, dtype=np.int64)


def assert_same(where: str, local: Any, remote: Any) -> None:
    found = first_difference(local, remote, where)
    assert found is None, f"local vs remote: {found}"


# ------------------------------------------------------------------------------------------------ check_env
@pytest.mark.parametrize("name", list(SERVERS))
def test_check_env_passes_on_a_served_env(served: Any, name: str) -> None:
    local, remote = pair(served, name)
    report = check_env(remote, raise_errors=False)
    assert not report.failed, "\n".join(str(err) for err in report.failed.values())
    expected = EXPECTED_SKIPS[name]
    assert set(report.skipped) == set(expected), report.skipped
    for check, why in report.skipped.items():
        assert why.startswith(expected[check]), (check, why)
    assert set(report.passed) == set(CHECKS) - set(expected)
    # The same checks skip for the local env object with the same kwargs: nothing is skipped for being remote.
    assert check_env(local, raise_errors=False).skipped == report.skipped
    assert not remote.started  # check_env copies the env it is given (forks of its session), never steps it


def test_check_env_on_a_started_remote_env_checks_forks_and_leaves_it_where_it_was(served: Any) -> None:
    local, remote = pair(served, "xsum")
    for env in (local, remote):
        env.reset(seed=4)
        env.step({"brief": TEXTS[0], "detailed": TEXTS[1]})
    before = (remote.transcript(), remote.history, remote.session_id, remote.state_text())
    report = check_env(remote, raise_errors=False)
    assert not report.failed, "\n".join(str(err) for err in report.failed.values())
    assert report.skipped == check_env(local, raise_errors=False).skipped
    assert set(report.skipped) == set(RESPONSE_MODE_SKIPS)
    assert "the env given had started an episode" in " ".join(report.notes["state"])
    assert (remote.transcript(), remote.history, remote.session_id, remote.state_text()) == before


# ------------------------------------------------------------------------------------------------ same episode
def parallel_trace(env: Any, seed: int, options: dict | None, script: list[dict[str, Any]]) -> list[Any]:
    """Every moment of a parallel episode played by ``script`` (one dict of whole-response actions a turn; in token
    mode streamed one token a step, then the pad id): what the step returned and what the env shows."""
    def shown() -> dict[str, Any]:
        return {"state": env.state(), "state_text": env.state_text(), "history": env.history,
                "transcript": env.transcript(), "turns": env.transcript_turns(),
                "texts": {a: env.text(a) for a in env.possible_agents}, "agents": list(env.agents),
                "problem": {k: v for k, v in dict(env.problem).items()}, "where": (env.task_split, env.task_index)}

    obs, infos = env.reset(seed=seed, options=options)
    trace = [("reset", obs, infos, shown())]
    for turn in script:
        if env.step_unit == "response":
            trace.append(("step", *env.step(dict(turn)), shown()))
            continue
        streams = {a: [*(int(t) for t in ids_of(env, a, turn[a], junk=False)), min(env.stop_token_ids_of(a))]
                   for a in env.agents}
        while env.agents and any(env.action_mask(a).all() for a in env.agents):
            actions = {a: streams[a].pop(0) if env.action_mask(a).all() else env.pad_token_id_of(a)
                       for a in env.agents}
            trace.append(("token", *env.step(actions), shown()))
    return trace


def aec_trace(env: Any, seed: int, options: dict | None, script: list[dict[str, Any]]) -> list[Any]:
    """Every moment of an AEC episode played by ``script``: ``last()``, every agent's observation, the rewards and
    the env's state, history and transcript."""
    env.reset(seed=seed, options=options)
    trace = []
    for step, agent in enumerate(env.agent_iter()):
        obs, reward, term, trunc, info = env.last()
        trace.append((agent, obs, reward, term, trunc, info, {a: env.observe(a) for a in env.possible_agents},
                      dict(env.rewards), dict(env._cumulative_rewards), dict(env.terminations),
                      dict(env.truncations), copy.deepcopy(env.infos), env.state(), env.state_text(), env.history,
                      env.transcript(), env.transcript_turns(), {a: env.text(a) for a in env.possible_agents}))
        turn = len(env.history)
        env.step(None if term or trunc else script[turn][agent])
        assert step < 20
    trace.append(("end", env.history, env.transcript(), env.state(), dict(env._cumulative_rewards)))
    return trace


def scripts(env: Any) -> tuple[list[dict[str, Any]], dict | None]:
    """Two turns of actions: text for one role and token ids (ended by a stop id, then junk) for the other, swapped
    on the second turn; the code env answers its problem right."""
    first, second = env.possible_agents
    if env.env_id.startswith("coding/"):
        answer = CODE_ANSWER
        return ([{first: answer[first], second: ids_of(env, second, answer[second])},
                 {first: ids_of(env, first, answer[first]), second: answer[second]}], CODE_PROBLEM)
    if env.step_unit == "token":  # one turn, streamed token by token
        return [{first: TEXTS[0], second: TEXTS[1]}], None
    return ([{first: TEXTS[0], second: ids_of(env, second, TEXTS[1])},
             {first: ids_of(env, first, TEXTS[1]), second: TEXTS[0]}], None)


@pytest.mark.parametrize("name", ["xsum", "sequential", "code", "token", "flat"])
def test_the_same_seed_and_actions_give_the_same_episode_locally_and_remotely(served: Any, name: str) -> None:
    local, remote = pair(served, name)
    for attr in ("vocab_size", "pad_token_id", "stop_token_ids", "chat_template", "mixed_tokenizers", "obs_length",
                 "state_length", "info_keys", "protocol", "metadata"):
        assert getattr(remote, attr) == getattr(local, attr), attr
    for agent in local.possible_agents:
        assert remote.tokenizer_name_of(agent) == local.tokenizer_name_of(agent)
        assert remote.observation_space(agent) == local.observation_space(agent)
        assert remote.action_space(agent) == local.action_space(agent)
    assert remote.state_space == local.state_space
    script, options = scripts(local)
    play = parallel_trace if isinstance(local, llm_envs.core.parallel.ParallelLLMEnv) else aec_trace
    for seed in (0, 7):
        expected = play(local, seed, options, script)
        got = play(remote, seed, options, script)
        assert len(got) == len(expected)
        for i, (a, b) in enumerate(zip(expected, got)):
            assert_same(f"moment {i}", a, b)
    assert len(remote.history) == len(script)
    if name == "code":  # the programs ran in the sandbox on the server, and passed
        assert remote.history[0].components["tests"] > 0 and remote.history[0].reward > 0
    if name == "flat":
        obs = remote.state()
        assert obs.dtype == np.int64 and obs.shape == (2 * remote.state_length,)


def test_token_mode_copies_mid_response_continue_like_local_ones(served: Any) -> None:
    local, remote = pair(served, "token")
    pad = {a: local.pad_token_id_of(a) for a in local.possible_agents}
    first = {a: int(ids_of(local, a, TEXTS[0], junk=False)[0]) for a in local.possible_agents}
    for env in (local, remote):
        env.reset(seed=3)
        env.step(first)
    twins = [(copy.deepcopy(env), pickle.loads(pickle.dumps(env))) for env in (local, remote)]
    stop = {a: min(local.stop_token_ids_of(a)) for a in local.possible_agents}
    for env in (local, remote, *twins[0], *twins[1]):
        env.step({"brief": stop["brief"], "detailed": 30})
        env.step({"brief": pad["brief"], "detailed": stop["detailed"]})
    results = [(env.history, env.transcript(), env.state(), env.agents) for env in (local, *twins[0])]
    for env in (remote, *twins[1]):
        assert_same("token-mode copy", results[0], (env.history, env.transcript(), env.state(), env.agents))
    assert remote.session_id not in {twins[1][0].session_id, twins[1][1].session_id}
    for twin in results[1:]:
        assert_same("local copies", results[0], twin)


# ------------------------------------------------------------------------------------------------ PettingZoo's tests
def seeded(env: Any) -> Any:
    for i, agent in enumerate(env.possible_agents):
        env.action_space(agent).seed(i)
    return env


@pytest.mark.parametrize("name", ["xsum", "token", "flat"])
def test_pettingzoo_parallel_api_test_runs_on_the_remote_env(served: Any, name: str) -> None:
    from pettingzoo.test import api_test, parallel_api_test
    from pettingzoo.utils.conversions import parallel_to_aec

    remote = seeded(connect(served(name).url))
    assert isinstance(remote, RemoteParallelEnv)
    cycles = 3 * remote.max_new_tokens if remote.step_unit == "token" else 4
    parallel_api_test(remote, num_cycles=cycles)
    api_test(seeded(parallel_to_aec(connect(served(name).url))), num_cycles=cycles)


def test_pettingzoo_api_test_runs_on_the_remote_aec_env(served: Any) -> None:
    from pettingzoo.test import api_test, seed_test

    remote = seeded(connect(served("sequential").url))
    assert isinstance(remote, RemoteAECEnv)
    api_test(remote, num_cycles=4)
    seed_test(lambda **kw: seeded(connect(served("sequential").url, **kw)), num_cycles=4)


# ------------------------------------------------------------------------------------------------ errors
def snapshot(env: Any) -> Any:
    aec = (env.agent_selection, dict(env.rewards), dict(env._cumulative_rewards)) if isinstance(env, RemoteAECEnv) \
        else ()
    return (env.transcript(), env.history, list(env.agents), {a: env.text(a) for a in env.agents},
            env.state_text(), aec)


def raised(fn: Callable[[], Any]) -> BaseException:
    try:
        fn()
    except Exception as err:
        return err
    raise AssertionError("did not raise")


def test_parallel_errors_cross_with_their_type_and_message_and_change_nothing(served: Any) -> None:
    local, remote = pair(served, "xsum")
    V = local.vocab_size_of("brief")
    good = {"brief": TEXTS[0], "detailed": TEXTS[1]}
    cases = [
        ({**good, "nobody": "x"}, KeyError),                                       # an unknown agent key
        ({"brief": TEXTS[0]}, KeyError),                                           # a missing one
        ({**good, "brief": np.array([1, V], np.int64)}, ValueError),               # an id out of range
        ({**good, "detailed": np.array([-1], np.int64)}, ValueError),
        ({**good, "brief": np.zeros((2, 2), np.int64)}, ValueError),               # 2-D
        ({**good, "brief": np.full(local.max_new_tokens + 1, 30, np.int64)}, ValueError),  # too many ids
        ({**good, "brief": "word " * 40}, ValueError),                             # a too-long text
        ({**good, "brief": np.array([1.0, 2.0])}, TypeError),                      # float ids
        ({**good, "brief": None}, TypeError),
    ]
    for env in (local, remote):
        env.reset(seed=5)
    before = snapshot(remote)
    for actions, error in cases:
        errors = [raised(lambda env=env, actions=actions: env.step(actions)) for env in (local, remote)]
        assert [type(e) for e in errors] == [error, error], (actions, errors)
        assert str(errors[1]) == str(errors[0])
        assert snapshot(remote) == before, actions
    assert_same("steps after the errors", local.step(good), remote.step(good))
    assert_same("last turn", local.step(good), remote.step(good))
    assert not remote.agents
    errors = [raised(lambda env=env: env.step(good)) for env in (local, remote)]
    assert [type(e) for e in errors] == [RuntimeError, RuntimeError] and "reset()" in str(errors[1])
    assert remote.reset(seed=5)[1] == local.reset(seed=5)[1]  # and the session goes on


def test_sequential_and_token_errors_cross_with_their_type_and_change_nothing(served: Any) -> None:
    local, remote = pair(served, "sequential")
    V = local.vocab_size_of("brief")
    for env in (local, remote):
        env.reset(seed=2)
    before = snapshot(remote)
    for bad, error in ((np.array([V]), ValueError), (np.array([0.5]), TypeError), (None, TypeError)):
        errors = [raised(lambda env=env, bad=bad: env.step(bad)) for env in (local, remote)]
        assert [type(e) for e in errors] == [error, error] and str(errors[1]) == str(errors[0])
        assert snapshot(remote) == before
    for env in (local, remote):
        with pytest.raises(KeyError, match="nobody"):
            env.observe("nobody")
    for env in (local, remote):
        env.step(TEXTS[0])
    assert_same("after the errors", *((env.last(), env.observe("detailed")) for env in (local, remote)))

    local, remote = pair(served, "token")
    pad = local.pad_token_id_of("brief")
    for env in (local, remote):
        env.reset(seed=2)
        env.step({"brief": min(env.stop_token_ids_of("brief")), "detailed": 30})  # brief has finished its response
    before = snapshot(remote)
    for actions, error in (({"brief": pad, "detailed": V}, ValueError), ({"brief": pad, "detailed": 1.5}, TypeError),
                           ({"brief": 30, "detailed": 31}, ValueError),  # brief's action mask allows the pad only
                           ({"brief": pad, "detailed": 31, "x": 1}, KeyError)):
        errors = [raised(lambda env=env, actions=actions: env.step(actions)) for env in (local, remote)]
        assert [type(e) for e in errors] == [error, error] and str(errors[1]) == str(errors[0])
        assert snapshot(remote) == before
        if error is not KeyError:  # the client's own check, as a batch runs it, says the same
            agent = "detailed" if actions["brief"] == pad else "brief"
            mine = raised(lambda agent=agent, action=actions[agent]: remote.check_action(agent, action))
            assert type(mine) is error and str(mine) == str(errors[0])
    assert_same("after the errors", *(env.step({"brief": pad, "detailed": 31}) for env in (local, remote)))


# ------------------------------------------------------------------------------------------------ vector envs
def test_a_vector_env_of_remote_copies_steps_like_local(served: Any) -> None:
    local, remote = pair(served, "xsum")
    batches = [VectorEnv(lambda env=env: copy.deepcopy(env), 2) for env in (local, remote)]
    assert all(isinstance(env, RemoteEnv) for env in batches[1].envs)
    assert_same("reset", *(b.reset(seed=[3, 8]) for b in batches))
    assert len({env.session_id for env in batches[1].envs}) == 2  # one session each on the server
    assert_same("state", *(b.state() for b in batches))
    T = local.max_new_tokens
    bad = {"brief": np.stack([ids_of(local, "brief", TEXTS[0]), np.full(T, local.vocab_size_of("brief"))]),
           "detailed": [TEXTS[1], TEXTS[0]]}
    for batch in batches:  # row 1 is out of range: no env of the batch steps
        with pytest.raises(ValueError, match="out of range"):
            batch.step(bad)
    assert [env.history for env in batches[1].envs] == [(), ()]
    good = {"brief": np.stack([ids_of(local, "brief", TEXTS[0]), ids_of(local, "brief", TEXTS[1])]),
            "detailed": [TEXTS[1], TEXTS[0]]}
    for _ in range(2):
        assert_same("step", *(b.step(good) for b in batches))
        assert_same("state", *(b.state() for b in batches))
    assert batches[1].agents == [] == batches[0].agents
    assert_same("transcripts", *([env.transcript() for env in b.envs] for b in batches))


def test_a_sequential_vector_env_of_remote_copies_steps_like_local(served: Any) -> None:
    local, remote = pair(served, "sequential")
    batches = [SequentialVectorEnv(lambda env=env: copy.deepcopy(env), 2) for env in (local, remote)]
    assert_same("reset", *(b.reset(seed=4) for b in batches))
    while batches[0].agents:
        agent = batches[0].agents[0]
        actions = {agent: [TEXTS[0], ids_of(local, agent, TEXTS[1])]}
        assert_same(f"step of {agent}", *(b.step(actions) for b in batches))
        assert batches[1].agents == batches[0].agents
    assert_same("states", *(b.state() for b in batches))


def test_torchrl_pettingzoo_wrapper_rolls_out_on_a_served_env(served: Any) -> None:
    """TorchRL's PettingZooWrapper (docs/marl-integration.md's recipe) on a remote env in token mode: its rollout
    steps the server, the action masks travel, and the episode ends as a local one of the same length."""
    torchrl_envs = pytest.importorskip("torchrl.envs", reason="needs the clients extra: pip install -e '.[clients]'")
    local, remote = pair(served, "token")
    env = torchrl_envs.PettingZooWrapper(remote, use_mask=True, categorical_actions=True, done_on_any=False)
    rollout = env.rollout(3 * local.max_new_tokens)
    assert rollout.batch_size[0] <= local.max_new_tokens + 1  # every agent's response ends within max_new_tokens
    assert bool(rollout[-1]["next", "done"].all())
    assert remote.history and len(remote.history) == 1  # the turn resolved on the server
    remote.close()
