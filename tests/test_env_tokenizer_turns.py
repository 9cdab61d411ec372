"""``env.tokenizer`` (public, read-only, the env's own object) on every env and on both vector envs, and
``env.transcript_turns()`` (the episode as data) on both protocols."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import llm_envs
from llm_envs.core.vector import SequentialVectorEnv, VectorEnv

ALL_IDS = llm_envs.list_envs()


@pytest.mark.parametrize("env_id", ALL_IDS)
def test_tokenizer_is_the_one_the_env_uses(env_id, env_kwargs_for):
    env = llm_envs.make(env_id, **env_kwargs_for(env_id))
    tok = env.tokenizer
    assert tok is env.tokenizer and len(tok) == env.vocab_size
    with pytest.raises(AttributeError):
        env.tokenizer = tok
    if hasattr(env, "agent_selection"):  # AEC (sequential ids)
        env.reset(seed=0)
        agent = env.agent_selection
        observation = env.observe(agent)
    else:
        agent = env.possible_agents[0]
        observation = env.reset(seed=0)[0][agent]
    ids = observation["observation"][observation["attention_mask"] == 1]
    assert tok.decode(ids.tolist(), skip_special_tokens=False) == env.text(agent)
    assert copy.deepcopy(env).tokenizer is tok


def test_a_user_tokenizer_is_returned_as_given():
    from llm_envs.tokenizers import load_tokenizer

    mine = copy.deepcopy(load_tokenizer(None))
    env = llm_envs.make("writing/xsum-v0", tokenizer=mine)
    assert env.tokenizer is mine


def test_token_mode_response_encoded_with_env_tokenizer():
    env = llm_envs.make("writing/xsum-v0", step_unit="token", max_new_tokens=8)
    env.reset(seed=0)
    text = " Rain fell."
    ids = env.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) < env.max_new_tokens
    for token in ids + [env.tokenizer.eos_token_id]:
        env.step({"brief": token, "detailed": token})
    assert env.history[0].outputs["brief"].text == text


def test_vector_envs_share_the_tokenizer():
    venv = VectorEnv("writing/xsum-v0", 2)
    assert venv.tokenizer is venv.envs[0].tokenizer is venv.envs[1].tokenizer
    seq = SequentialVectorEnv("sentiment/imdb-cory-v0", 2)
    assert seq.tokenizer is seq.envs[1].tokenizer
    obs, _ = seq.reset(seed=0)
    first = obs["pioneer"]
    assert seq.tokenizer.decode(first["observation"][0][first["attention_mask"][0] == 1].tolist()) == seq.envs[0].text(
        "pioneer"
    )
    with pytest.raises(AttributeError):
        venv.tokenizer = None


def test_vector_split_flat_matches_the_env():
    venv = VectorEnv("writing/xsum-v0", 2, obs_format="flat", step_unit="token", max_new_tokens=3)
    obs, _ = venv.reset(seed=0)
    parts = venv.split_flat(obs["brief"])
    L = venv.envs[0].obs_length
    assert parts["observation"].shape == (2, L) and parts["action_mask"].shape == (2, venv.envs[0].vocab_size)
    with pytest.raises(ValueError, match="entries on its last axis"):
        venv.split_flat(obs["brief"][:, :-1])


def test_transcript_turns_parallel_multi_turn():
    env = llm_envs.make("writing/xsum-v0", num_turns=2, max_source_words=30)
    env.reset(seed=1)
    assert env.transcript_turns() == [
        {"prompts": {a: env.text(a) for a in env.possible_agents}, "responses": {}, "reward": None,
         "components": {}, "agent_rewards": {}, "feedback": {}}
    ]
    seen = []
    for answers in (("One line.", "A longer line, moreover."), ("Second go.", "Second, longer go; however.")):
        prompts = {a: env.text(a) for a in env.possible_agents}
        _, rewards, _, _, infos = env.step(dict(zip(env.possible_agents, answers)))
        seen.append((prompts, answers, rewards, infos))
    turns = env.transcript_turns()
    assert len(turns) == 2
    for turn, (prompts, answers, rewards, infos), record in zip(turns, seen, env.history):
        assert turn["prompts"] == prompts
        assert turn["responses"] == dict(zip(env.possible_agents, answers))
        assert turn["reward"] == rewards["brief"] == infos["brief"]["reward_total"]
        assert turn["components"] == {c: infos["brief"][f"reward_{c}"] for c in env.task.reward_components}
        assert turn["feedback"] == dict(record.feedback)
        assert turn["agent_rewards"] == dict.fromkeys(env.possible_agents, turn["reward"])
    assert turns[0]["feedback"] and not turns[1]["feedback"]  # feedback only when another turn follows
    assert turns[1]["prompts"] != turns[0]["prompts"]


def test_transcript_turns_sequential_observer_sees_pioneer():
    env = llm_envs.make("sentiment/imdb-cory-v0")
    env.reset(seed=0)
    env.step("It was wonderful.")
    observer_prompt = env.text("observer")
    env.step("Truly great.")
    (turn,) = env.transcript_turns()
    assert turn["prompts"]["observer"] == observer_prompt and "It was wonderful." in observer_prompt
    assert turn["responses"] == {"pioneer": "It was wonderful.", "observer": "Truly great."}
    assert turn["reward"] == pytest.approx(env.history[0].reward)
    assert turn["agent_rewards"] == env.history[0].agent_rewards
    assert np.isfinite(turn["reward"])
