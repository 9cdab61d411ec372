"""Token-level stepping (``step_unit="token"``) and flat observations (``obs_format="flat"``) on every
registered id: PettingZoo's official checks in each variant (token steps against whole responses are the
contract's token_mode check, tests/test_env_contract.py), layout, masks, bad input, copying and the vector
helper."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import llm_envs
from llm_envs.core.parallel import ParallelLLMEnv
from llm_envs.core.vector import VectorEnv
from llm_envs.testing import PETTINGZOO_CHECKS, assert_same, check_env, prompt_ids

ALL_IDS = llm_envs.list_envs()
VARIANTS = {
    "token-dict": {"step_unit": "token"},
    "token-flat": {"step_unit": "token", "obs_format": "flat"},
    "response-flat": {"obs_format": "flat"},
}
T = 4  # max_new_tokens: small so that turns resolve within the official checks' few cycles


# --------------------------------------------------------------------------------- official checks
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("env_id", ALL_IDS)
def test_pettingzoo_official_checks(env_id, variant, env_kwargs_for):
    """PettingZoo's checks in each variant (llm_envs.testing runs 3 x T cycles in token mode, so that every turn
    resolves). Token steps against whole responses: the token_mode check of tests/test_env_contract.py."""
    check_env(env_id, checks=PETTINGZOO_CHECKS, max_new_tokens=T, **VARIANTS[variant], **env_kwargs_for(env_id))


# ------------------------------------------------------------------------------------ layout
@pytest.fixture
def token_env():
    env = llm_envs.make("writing/xsum-v0", step_unit="token", max_new_tokens=4, num_turns=2)
    env.reset(seed=3)
    return env


def test_observation_is_prompt_plus_response_so_far_left_padded(token_env):
    env = token_env
    P, V = env.max_prompt_tokens, env.vocab_size
    assert env.obs_length == P + 4
    obs0 = env._observation("brief")
    prompt = prompt_ids(obs0)
    assert obs0["observation"].shape == (P + 4,) and obs0["action_mask"].shape == (V,)
    assert obs0["observation"].dtype == np.int64 and obs0["action_mask"].dtype == np.int8
    assert env.text("brief") == env._tok.tokenizer.decode(prompt, skip_special_tokens=False)
    obs, rewards, _, _, infos = env.step({"brief": 100, "detailed": 200})
    assert prompt_ids(obs["brief"]) == prompt + [100]
    assert infos["brief"]["response_tokens"] == 1 and rewards == {"brief": 0.0, "detailed": 0.0}
    assert obs["brief"]["observation"][-1] == 100 and obs["detailed"]["observation"][-1] == 200
    assert env.text("brief").endswith(env._tok.tokenizer.decode([100]))
    assert env.observation_space("brief").contains(obs["brief"])
    # brief ends with EOS: it waits (pad only), its observation keeps its response without the EOS.
    obs, *_ = env.step({"brief": env._tok.tokenizer.eos_token_id, "detailed": 201})
    assert prompt_ids(obs["brief"]) == prompt + [100]
    mask = obs["brief"]["action_mask"]
    assert mask.sum() == 1 and mask[env.pad_token_id] == 1 and obs["detailed"]["action_mask"].all()
    env.step({"brief": env.pad_token_id, "detailed": 202})
    obs, rewards, terms, _, infos = env.step({"brief": env.pad_token_id, "detailed": 203})
    assert env.history[0].outputs["brief"].ids == (100,)
    assert env.history[0].outputs["detailed"].ids == (200, 201, 202, 203)
    assert infos["detailed"]["turn"] == 1 and infos["detailed"]["response_tokens"] == 4
    assert rewards["brief"] == env.history[0].reward and not any(terms.values())
    assert obs["brief"]["action_mask"].all(), "a new turn opens every mask"
    assert "Your previous answer:" in env.text("brief")


def test_flat_observation_is_the_dict_concatenated():
    for unit in ("token", "response"):
        d = llm_envs.make("writing/xsum-v0", step_unit=unit, max_new_tokens=4)
        f = llm_envs.make("writing/xsum-v0", step_unit=unit, obs_format="flat", max_new_tokens=4)
        od, _ = d.reset(seed=5)
        of, _ = f.reset(seed=5)
        keys = ["observation", "attention_mask"] + (["action_mask"] if unit == "token" else [])
        for agent in d.possible_agents:
            flat = of[agent]
            assert flat.dtype == np.int64 and flat.ndim == 1
            assert np.array_equal(flat, np.concatenate([od[agent][k] for k in keys]).astype(np.int64))
            assert f.observation_space(agent).contains(flat)
            parts = f.split_flat(flat)
            assert list(parts) == keys
            for k in keys:
                assert np.array_equal(parts[k], od[agent][k])
        assert f.split_flat(np.stack([of["brief"]] * 3))["observation"].shape == (3, d.obs_length)
        with pytest.raises(ValueError, match="entries on its last axis.*shape \\(5,\\)"):
            f.split_flat(np.zeros(5, np.int64))


def test_spaces_are_built_once_and_match_the_mode():
    from gymnasium import spaces

    env = llm_envs.make("writing/xsum-v0", step_unit="token", obs_format="flat", max_new_tokens=4)
    for agent in env.possible_agents:
        assert env.action_space(agent) is env.action_space(agent)
        assert env.observation_space(agent) is env.observation_space(agent)
        assert env.action_space(agent) == spaces.Discrete(env.vocab_size)
        L = env.max_prompt_tokens + 4
        assert env.observation_space(agent).shape == (2 * L + env.vocab_size,)
        assert env.observation_space(agent).high[L - 1] == env.vocab_size - 1
        assert env.observation_space(agent).high[L] == 1
    assert env.action_space("brief") is not env.action_space("detailed"), "per-agent seeding needs own objects"


def test_prompt_is_not_rebuilt_on_token_steps(token_env, monkeypatch):
    env = token_env
    env.step({"brief": 100, "detailed": 100})
    calls = []
    original = type(env.task).prompt
    monkeypatch.setattr(type(env.task), "prompt", lambda self, *a, **k: calls.append(a[0]) or original(self, *a, **k))
    env.step({"brief": 101, "detailed": 101})
    env.step({"brief": 102, "detailed": 102})
    assert calls == []
    env.step({"brief": 103, "detailed": 103})  # resolves: next turn's prompts are built once each
    assert sorted(calls) == ["brief", "detailed"]
    env.step({"brief": 1, "detailed": 1})
    env.text("brief")
    assert sorted(calls) == ["brief", "detailed"]


def test_sequential_selection_stays_until_the_response_ends():
    env = llm_envs.make("writing/xsum-v0", protocol="sequential", step_unit="token", max_new_tokens=3)
    env.reset(seed=0)
    detailed_before = prompt_ids(env.observe("detailed"))
    env.step(300)
    env.step(301)
    assert env.agent_selection == "brief" and env.observe("detailed")["action_mask"].sum() == 1
    env.step(302)  # max_new_tokens reached: the response ends without an EOS
    assert env.agent_selection == "detailed"
    seen = prompt_ids(env.observe("detailed"))
    assert seen != detailed_before
    assert any(seen[i : i + 3] == [300, 301, 302] for i in range(len(seen))), "the brief's ids, verbatim"
    assert prompt_ids(env.observe("brief"))[-3:] == [300, 301, 302]
    env.step(env._tok.tokenizer.eos_token_id)
    assert env.history[0].outputs["detailed"].ids == ()
    assert all(env.terminations.values()) and env.rewards["brief"] == env.history[0].reward


# ------------------------------------------------------------------------------------ bad input
def snapshot(env):
    return (copy.deepcopy(env._response_ids), dict(env._finished), env._turn, list(env.agents),
            list(env._transcript), {a: env.text(a) for a in env.possible_agents})


@pytest.mark.parametrize(
    "actions, error, message",
    [
        ({"brief": 49152, "detailed": 5}, ValueError, "'brief' is token id 49152, out of range \\[0, 49151\\]"),
        ({"brief": -1, "detailed": 5}, ValueError, "'brief' is token id -1"),
        ({"brief": 5, "detailed": 7}, ValueError, "Agent 'brief' is not composing.*pad id 2, got 5"),
        ({"brief": 2.0, "detailed": 5}, TypeError, "'brief' must be one token id.*float"),
        ({"brief": "hi", "detailed": 5}, TypeError, "'brief' must be one token id.*str"),
        ({"brief": np.array([1, 2]), "detailed": 5}, TypeError, "'brief' must be one token id.*ndarray"),
        ({"brief": True, "detailed": 5}, TypeError, "'brief' must be one token id.*bool"),
        ({"brief": None, "detailed": 5}, TypeError, "'brief' must be one token id.*NoneType"),
        ({"brief": 2}, KeyError, "missing \\['detailed'\\]"),
    ],
)
def test_bad_tokens_raise_naming_the_agent_and_change_nothing(actions, error, message):
    env = llm_envs.make("writing/xsum-v0", step_unit="token", max_new_tokens=4, num_turns=2)
    env.reset(seed=7)
    env.step({"brief": 2, "detailed": 9})  # brief has finished: only the pad id (2) is legal for it
    before = snapshot(env)
    with pytest.raises(error, match=message):
        env.step(actions)
    assert snapshot(env) == before
    twin = llm_envs.make("writing/xsum-v0", step_unit="token", max_new_tokens=4, num_turns=2)
    twin.reset(seed=7)
    twin.step({"brief": 2, "detailed": 9})
    good = {"brief": np.int64(2), "detailed": np.array(10)}
    assert_same(env.step(good), twin.step(good))


def test_sequential_bad_token_and_mode_errors():
    env = llm_envs.make("writing/xsum-v0", protocol="sequential", step_unit="token", max_new_tokens=4)
    env.reset(seed=0)
    with pytest.raises(TypeError, match="'brief' must be one token id.*list"):
        env.step([1, 2])
    with pytest.raises(ValueError, match="'brief' is token id 60000"):
        env.step(60000)
    assert env._response_ids["brief"] == [] and env.agent_selection == "brief"
    with pytest.raises(ValueError, match="step_unit must be one of \\('response', 'token'\\), got 'word'"):
        llm_envs.make("writing/xsum-v0", step_unit="word")
    with pytest.raises(ValueError, match="obs_format must be one of \\('dict', 'flat'\\), got 'tuple'"):
        llm_envs.make("writing/xsum-v0", obs_format="tuple")
    with pytest.raises(RuntimeError, match="token mode only"):
        llm_envs.make("writing/xsum-v0").action_mask("brief")
    with pytest.raises(RuntimeError, match="reset"):
        llm_envs.make("writing/xsum-v0", step_unit="token").action_mask("brief")


# ------------------------------------------------------------------------------ episode, copying
def test_truncation_and_the_end_of_the_episode():
    env = llm_envs.make("writing/xsum-v0", step_unit="token", max_new_tokens=2, num_turns=5, max_cycles=2)
    env.reset(seed=0)
    steps = 0
    while env.agents:
        _, _, terms, truncs, _ = env.step({a: 40 for a in env.agents})
        steps += 1
    assert steps == 4 and all(truncs.values()) and not any(terms.values()) and len(env.history) == 2
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step({"brief": 2, "detailed": 2})


def test_copies_mid_response_continue_identically(token_env):
    env = token_env
    env.step({"brief": 100, "detailed": 2})
    clone, twin = pickle.loads(pickle.dumps(env)), copy.deepcopy(env)
    for _ in range(3):
        actions = {"brief": 101, "detailed": 2}
        out = env.step(actions)
        assert_same(out, clone.step(actions))
        assert_same(out, twin.step(actions))
    assert env.history == clone.history == twin.history


def test_registry_and_pettingzoo_make_route_the_kwargs():
    import pettingzoo

    env = llm_envs.make("writing/xsum-v0", step_unit="token", obs_format="flat")
    assert (env.step_unit, env.obs_format) == ("token", "flat")
    pz = pettingzoo.make("parallel", "writing/xsum-v0", step_unit="token")
    assert isinstance(pz, ParallelLLMEnv) and pz.step_unit == "token"


# ------------------------------------------------------------------------------------ vector
def test_vector_env_in_token_mode_waits_for_every_env():
    venv = VectorEnv("writing/xsum-v0", num_envs=3, step_unit="token", obs_format="flat", max_new_tokens=3)
    obs, _ = venv.reset(seed=0)
    env0 = venv.envs[0]
    assert obs["brief"].shape == (3, env0.observation_space("brief").shape[0])
    eos, pad = env0._tok.tokenizer.eos_token_id, env0.pad_token_id
    obs, rewards, terms, _, _ = venv.step({a: np.array([eos, 50, 50]) for a in venv.agents})
    assert venv.done.tolist() == [True, False, False] and terms["brief"].tolist() == [True, False, False]
    assert rewards["brief"][0] == env0.history[0].reward
    mask = env0.split_flat(obs["brief"])["action_mask"]
    assert mask[0].sum() == 1 and mask[1:].all()
    with pytest.raises(ValueError, match="Env 0 of the batch has finished.*pad id 2.*got 50"):
        venv.step({a: np.array([50, 50, 50]) for a in venv.agents})
    with pytest.raises(ValueError, match="'detailed' is token id 99999"):
        venv.step({"brief": np.array([pad, 51, 51]), "detailed": np.array([pad, 51, 99999])})
    assert [e._response_ids["brief"] for e in venv.envs[1:]] == [[50], [50]]
    _, rewards, _, _, _ = venv.step({a: np.array([pad, 51, eos]) for a in venv.agents})
    assert rewards["brief"][0] == 0.0 and venv.done.tolist() == [True, False, True]
    _, _, terms, _, infos = venv.step({a: np.array([pad, 52, pad]) for a in venv.agents})
    assert terms["brief"].all() and venv.agents == [] and infos["brief"]["response_tokens"].tolist() == [0, 3, 1]
