"""The skrl and Tianshou recipes of docs/marl-integration.md run: a couple of updates of skrl's IPPO and MAPPO
(examples/skrl_ippo_mappo.py; MAPPO's critic reads ``env.state()``) and of Tianshou's DQN in token mode through its
PettingZoo wrapper, the AEC form (examples/tianshou_token_dqn.py; every role learning, or the first one against
random legal tokens). Skipped, with the install command, where the ``clients`` extra is not installed."""

from __future__ import annotations

import math

import pytest
import torch
from test_examples import load

import llm_envs
from llm_envs.core.parallel import ParallelLLMEnv

INSTALL = "pip install -e '.[clients]' (skrl 2.1.1 and tianshou 2.0.1, with the torch you have)"


def snapshot(modules) -> dict[str, torch.Tensor]:
    return {f"{owner}.{name}": value.detach().clone()
            for owner, module in modules.items() for name, value in module.state_dict().items()}


def changed(before: dict[str, torch.Tensor], modules) -> set[str]:
    after = snapshot(modules)
    return {name for name, value in before.items() if not torch.equal(value, after[name])}


# ------------------------------------------------------------------------------------------------ skrl
@pytest.fixture(scope="module")
def skrl_example():
    pytest.importorskip("skrl", reason=f"skrl is not installed: {INSTALL}")
    return load("skrl_ippo_mappo")


SKRL_TINY = dict(timesteps=8, rollouts=4, mini_batches=2, learning_epochs=1, max_new_tokens=2, max_prompt_tokens=32,
                 embed_dim=8)


@pytest.mark.parametrize("algorithm", ["mappo", "ippo"])
def test_skrl_trains_each_agent_and_mappo_reads_the_global_state(skrl_example, algorithm, monkeypatch):
    calls = []
    state = ParallelLLMEnv.state
    monkeypatch.setattr(ParallelLLMEnv, "state", lambda self: calls.append(1) or state(self))
    config = skrl_example.Config(algorithm=algorithm, **SKRL_TINY)
    env, multi_agent, models = skrl_example.build(config)
    llm_env = env.unwrapped
    modules = {f"{agent}.{role}": model for agent, pair in models.items() for role, model in pair.items()}
    before = snapshot(modules)
    out = skrl_example.train(config, env, multi_agent, models)
    assert len(calls) >= config.timesteps  # skrl asks for the state after every step (IPPO too)
    for agent in llm_env.possible_agents:
        critic = models[agent]["value"]
        if algorithm == "mappo":
            assert critic.source == "states" and critic.space is llm_env.state_space
        else:
            assert critic.source == "observations" and critic.space is llm_env.observation_space(agent)
        # Two updates (8 steps, 4 a rollout) move every agent's policy and value weights.
        for role in ("policy", "value"):
            assert any(name.startswith(f"{agent}.{role}.") for name in changed(before, modules)), (agent, role)
        assert math.isfinite(out["losses"][f"Loss / Value loss ({agent})"])


def test_skrl_config_checks(skrl_example):
    with pytest.raises(ValueError, match="algorithm must be 'mappo' or 'ippo', got 'qmix'"):
        skrl_example.Config(algorithm="qmix")
    with pytest.raises(ValueError, match="rollouts=5 must be a multiple of mini_batches=2"):
        skrl_example.Config(rollouts=5, mini_batches=2)
    assert skrl_example.parse_args(["--algorithm", "ippo", "--timesteps", "3"]).timesteps == 3


# -------------------------------------------------------------------------------------------- Tianshou
@pytest.fixture(scope="module")
def tianshou_example():
    # numba's JIT is off for the whole session (tests/conftest.py): Tianshou's helpers run interpreted.
    pytest.importorskip("tianshou", reason=f"tianshou is not installed: {INSTALL}")
    return load("tianshou_token_dqn")


TIANSHOU_TINY = dict(epoch_num_steps=16, collection_step_num_env_steps=8, batch_size=8, buffer_size=32,
                     max_new_tokens=3, max_prompt_tokens=32, embed_dim=8)


@pytest.mark.parametrize("env_id, learners", [("sentiment/imdb-cory-v0", "all"), ("writing/xsum-v0", "first")])
def test_tianshou_dqn_in_token_mode_on_the_aec_form(tianshou_example, env_id, learners):
    config = tianshou_example.Config(env_id=env_id, learners=learners, **TIANSHOU_TINY)
    marl, networks, collector = tianshou_example.build(config)
    roles = llm_envs.make(env_id).possible_agents
    assert list(networks) == (roles if learners == "all" else roles[:1])
    before = snapshot(networks)
    out = tianshou_example.train(config, marl, networks, collector)
    result = out["result"]
    assert result.update_step >= 2 and result.train_episode >= 1  # 3-token responses: an episode every 4-8 steps
    for agent in networks:
        assert any(name.startswith(f"{agent}.") for name in changed(before, networks)), agent


def test_tianshou_config_checks(tianshou_example):
    with pytest.raises(ValueError, match="learners must be 'all' or 'first', got 'none'"):
        tianshou_example.Config(learners="none")
    assert tianshou_example.parse_args(["--learners", "first"]).learners == "first"
