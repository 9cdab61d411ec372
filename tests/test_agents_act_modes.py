"""``MultiAgentPolicy.act`` on every observation form: token mode (one token per step, within the action
mask) and flat observations, on single envs, AEC envs and vector envs."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_models import tiny_model

import llm_envs
from agents import LoraSettings, MultiAgentPolicy, Sampling
from llm_envs.core.vector import VectorEnv
from llm_envs.tokenizers import load_tokenizer

T = 5
GREEDY = Sampling(max_new_tokens=T, greedy=True)
ENV = dict(max_source_words=20, max_new_tokens=T)


def make_policy(agents, extra_eos=()):
    tok = load_tokenizer(None)
    return MultiAgentPolicy(tiny_model(tok, seed=3, extra_eos=extra_eos), tok, agents,
                            lora=LoraSettings(rank=2, alpha=4), sampling=GREEDY)


def responses(env):
    return {a: r.ids for a, r in env.history[-1].outputs.items()}


def test_token_mode_greedy_equals_response_mode():
    """Token by token (one forward of the whole observation per step) gives the same greedy response
    as one response-mode generate with its KV cache."""
    env = llm_envs.make("writing/xsum-v0", **ENV)
    policy = make_policy(env.possible_agents)
    obs, _ = env.reset(seed=0)
    env.step(policy.act(obs))
    expected = responses(env)

    token_env = llm_envs.make("writing/xsum-v0", step_unit="token", **ENV)
    obs, _ = token_env.reset(seed=0)
    steps = 0
    while token_env.agents:
        actions = policy.act(obs)
        for agent, action in actions.items():
            assert type(action) is int and token_env.action_space(agent).contains(action)
            assert obs[agent]["action_mask"][action] == 1
        obs, *_ = token_env.step(actions)
        steps += 1
    assert responses(token_env) == expected and steps == T
    assert all(len(ids) == T for ids in expected.values())  # no EOS: the comparison covers every token


def test_token_mode_eos_ends_the_response_and_waiting_rows_get_pad():
    """A model that often emits EOS: responses end at different steps, every EOS becomes the pad id
    (the env's stop token), and an agent that has finished gets the pad id without sampling."""
    venv = VectorEnv("writing/xsum-v0", 4, step_unit="token", **{**ENV, "max_new_tokens": 12})
    policy = make_policy(venv.possible_agents, extra_eos=range(1000, 40000))
    obs, _ = venv.reset(seed=0)
    pad = venv.envs[0].pad_token_id
    while venv.agents:
        actions = policy.act(obs, sampling=Sampling(max_new_tokens=12))
        for agent, batch in actions.items():
            assert batch.shape == (4,) and batch.dtype == np.int64
            waiting = obs[agent]["action_mask"].sum(-1) == 1
            assert (batch[waiting] == pad).all()
            assert not np.isin(batch[~waiting], [t for t in policy.eos_token_ids if t != pad]).any()
        obs, *_ = venv.step(actions)
    lengths = [len(r.ids) for env in venv.envs for r in env.history[0].outputs.values()]
    assert min(lengths) < 12 and len(set(lengths)) > 1


def test_flat_observations_need_the_env_and_act_like_dicts():
    dict_env = llm_envs.make("writing/xsum-v0", **ENV)
    flat_env = llm_envs.make("writing/xsum-v0", obs_format="flat", **ENV)
    policy = make_policy(dict_env.possible_agents)
    dict_obs, _ = dict_env.reset(seed=1)
    flat_obs, _ = flat_env.reset(seed=1)
    with pytest.raises(ValueError, match=r"flat array \(obs_format='flat'\): pass env="):
        policy.act(flat_obs)
    expected = policy.act(dict_obs)
    got = policy.act(flat_obs, env=flat_env)
    assert all(np.array_equal(got[a], expected[a]) for a in expected)
    flat_env.step(got)
    assert not flat_env.agents


def test_flat_token_mode_vector_env():
    venv = VectorEnv("writing/xsum-v0", 2, obs_format="flat", step_unit="token", **ENV)
    policy = make_policy(venv.possible_agents)
    obs, _ = venv.reset(seed=2)
    while venv.agents:
        actions = policy.act(obs, env=venv)
        assert all(a.shape == (2,) for a in actions.values())
        obs, *_ = venv.step(actions)
    dict_env = llm_envs.make("writing/xsum-v0", **ENV)
    dict_obs, _ = dict_env.reset(seed=2)
    dict_env.step(policy.act(dict_obs))
    assert responses(venv.envs[0]) == responses(dict_env)


def test_aec_token_mode_agent_by_agent():
    env = llm_envs.make("sentiment/imdb-cory-v0", step_unit="token", obs_format="flat", max_new_tokens=4)
    policy = make_policy(env.possible_agents)
    env.reset(seed=0)
    for agent in env.agent_iter():
        obs, _, term, trunc, _ = env.last()
        env.step(None if term or trunc else policy.act(obs, agent=agent, env=env))
    assert len(env.history) == 1 and set(env.history[0].outputs) == {"pioneer", "observer"}


def test_token_mode_bad_masks():
    env = llm_envs.make("writing/xsum-v0", step_unit="token", **ENV)
    policy = make_policy(env.possible_agents)
    obs, _ = env.reset(seed=0)
    brief = dict(obs["brief"])
    brief["action_mask"] = np.zeros_like(brief["action_mask"])
    with pytest.raises(ValueError, match="allows no token in row 0"):
        policy.act({"brief": brief})
    brief["action_mask"][:3] = 1
    with pytest.raises(ValueError, match="allows 3 of 49152 tokens in row 0"):
        policy.act({"brief": brief})
    brief["action_mask"] = brief["action_mask"][:-1].reshape(1, -1).repeat(2, 0)
    with pytest.raises(ValueError, match="one row of at most"):
        policy.act({"brief": brief})
    mixed = {"brief": obs["brief"], "detailed": {k: v for k, v in obs["detailed"].items() if k != "action_mask"}}
    with pytest.raises(ValueError, match="mix token mode"):
        policy.act(mixed)
