"""Batches of envs (``llm_envs.core.vector``): ``make_vec`` picks the batch by protocol; the sequential
batch keeps the parallel one's contract (per-env seeds and options, whole-batch validation, stacked
arrays, no auto-reset), steps one role at a time over several turns, and needs no torch."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import llm_envs
from llm_envs.core.vector import SequentialVectorEnv, VectorEnv, make_vec


def test_make_vec_picks_the_batch_of_the_ids_protocol():
    assert isinstance(make_vec("writing/xsum-v0", 2), VectorEnv)
    assert isinstance(make_vec("sentiment/imdb-cory-v0", 2), SequentialVectorEnv)
    assert isinstance(make_vec("writing/xsum-v0", 2, protocol="sequential"), SequentialVectorEnv)
    assert llm_envs.make_vec is make_vec
    with pytest.raises(ValueError, match="'diagonal'"):
        make_vec("writing/xsum-v0", 2, protocol="diagonal")
    with pytest.raises(ValueError, match="supports the protocols"):
        make_vec("sentiment/imdb-cory-v0", 2, protocol="parallel")
    with pytest.raises(KeyError, match="Unknown env id"):
        make_vec("writing/nope-v0", 2)
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match=f"got {bad!r}"):
            make_vec("sentiment/imdb-cory-v0", bad)


def test_sequential_batch_takes_ids_envs_and_factories():
    env = llm_envs.make("sentiment/imdb-cory-v0", max_new_tokens=4)
    from_env = SequentialVectorEnv(env, 3)
    assert from_env.envs[0] is env and len(from_env.envs) == 3 and from_env.envs[1] is not env
    from_factory = SequentialVectorEnv(lambda: llm_envs.make("sentiment/imdb-cory-v0", max_new_tokens=4), 2)
    assert from_factory.possible_agents == ["pioneer", "observer"]
    with pytest.raises(TypeError, match="only apply when env is an id"):
        SequentialVectorEnv(env, 2, max_new_tokens=4)
    with pytest.raises(TypeError, match="needs sequential llm_envs envs, got ParallelLLMEnv"):
        SequentialVectorEnv(lambda: llm_envs.make("writing/xsum-v0"), 2)
    with pytest.raises(ValueError, match="step_unit='token'"):
        SequentialVectorEnv("sentiment/imdb-cory-v0", 2, step_unit="token")


def test_sequential_batch_seeds_options_and_whole_batch_validation():
    venv = make_vec("sentiment/imdb-cory-v0", 3, max_new_tokens=4)
    obs, infos = venv.reset(seed=[5, 6, 7], options=[{"task_index": 1}, {"task_index": 1}, {"task_index": 2}])
    assert infos["pioneer"]["task_index"].tolist() == [1, 1, 2]
    assert obs["pioneer"]["observation"].shape == (3, venv.envs[0].max_prompt_tokens)
    assert obs["pioneer"]["observation"].dtype == np.int64
    np.testing.assert_array_equal(obs["pioneer"]["observation"][0], obs["pioneer"]["observation"][1])
    before = [env.observe("observer")["observation"].copy() for env in venv.envs]
    actions = np.ones((3, 4), np.int64)
    actions[2, 0] = 10**7
    with pytest.raises(ValueError, match="out of range"):
        venv.step({"pioneer": actions})
    # Nothing stepped: every env still waits for the pioneer and shows the same observer prompt.
    assert venv.agents == ["pioneer"] and all(env.agent_selection == "pioneer" for env in venv.envs)
    for env, obs_before in zip(venv.envs, before):
        np.testing.assert_array_equal(env.observe("observer")["observation"], obs_before)
    with pytest.raises(ValueError, match="2 rows, expected num_envs=3"):
        venv.step({"pioneer": actions[:2]})
    with pytest.raises(ValueError, match="seed has 2 entries"):
        venv.reset(seed=[1, 2])
    with pytest.raises(RuntimeError, match="reset"):
        make_vec("sentiment/imdb-cory-v0", 2).step({"pioneer": actions[:2]})


def test_sequential_batch_over_two_turns_shows_earlier_roles_and_feedback():
    venv = make_vec("writing/xsum-v0", 2, protocol="sequential", num_turns=2, max_new_tokens=6)
    obs, _ = venv.reset(seed=0, options={"task_index": 3})
    order, rewards_seen = [], []
    while venv.agents:
        agent = venv.agents[0]
        order.append(agent)
        text = f"{agent} draft {len(order)}"
        obs, rewards, terms, truncs, infos = venv.step({agent: [text, text]})
        rewards_seen.append(rewards["brief"].tolist())
        if venv.agents == ["detailed"]:  # the second role reads the first role's response of this turn
            assert all(f"brief draft {len(order)}" in t for t in venv.texts("detailed"))
    assert order == ["brief", "detailed", "brief", "detailed"]
    assert obs == {} and terms["brief"].all() and not truncs["brief"].any() and venv.done.all()
    # Rewards come when the last role resolves a turn, 0.0 before.
    assert rewards_seen[0] == [0.0, 0.0] and rewards_seen[2] == [0.0, 0.0]
    assert rewards_seen[3] == infos["brief"]["reward_total"].tolist()
    # The second turn's prompts held the first turn's feedback and each role's own previous answer.
    turns = venv.envs[0].transcript_turns()
    assert len(turns) == 2 and "brief draft 1" in turns[1]["prompts"]["brief"]


def test_sequential_batch_flat_observations():
    venv = make_vec("sentiment/imdb-cory-v0", 2, obs_format="flat", max_new_tokens=4)
    obs, _ = venv.reset(seed=0)
    flat = obs["pioneer"]
    length = venv.envs[0].max_prompt_tokens
    assert flat.shape == (2, 2 * length) and flat.dtype == np.int64
    parts = venv.split_flat(flat)
    assert parts["observation"].shape == (2, length) and set(np.unique(parts["attention_mask"])) <= {0, 1}


def test_sequential_batch_scores_the_whole_batch_at_once(monkeypatch):
    """Like VectorEnv, the sequential batch hands every env's finished turn to the task together (the
    coding tasks run the batch's programs concurrently); the rewards are those of single envs."""
    from llm_envs.tasks.coding import CodingTask

    calls = []
    real = CodingTask.prepare_rewards

    def recording(self, turns):
        calls.append([dict(outputs) for _, outputs in turns])
        return real(self, turns)

    monkeypatch.setattr(CodingTask, "prepare_rewards", recording)
    helper = "def aux(x):\n    return x\n"
    venv = make_vec("coding/humaneval-v0", 2, protocol="sequential", max_new_tokens=256)
    venv.reset(seed=0, options={"task_index": 0})
    entry = venv.envs[0].problem["entry_point"]
    mains = [f"def {entry}(*args):\n    return aux(args[0])\n", "def nope(:\n"]
    venv.step({"helper": [helper, helper]})
    assert calls == []  # nothing to score before the turn's last role acts
    _, rewards, *_ = venv.step({"main": mains})
    assert len(calls) == 1 and [c["main"] for c in calls[0]] == mains and calls[0][0]["helper"] == helper
    for row, main in enumerate(mains):
        env = llm_envs.make("coding/humaneval-v0", protocol="sequential", max_new_tokens=256)
        env.reset(seed=0, options={"task_index": 0})
        env.step(helper)
        env.step(main)
        assert env.rewards["main"] == rewards["main"][row]
    assert rewards["main"][0] > rewards["main"][1]  # the syntax error scores less


def test_make_vec_imports_no_torch():
    """Outside MARL code batches CORY's envs without torch: importing llm_envs, building the batch and
    playing an episode leave torch unloaded (the default tokenizer is read from its cache)."""
    from llm_envs.tokenizers import load_tokenizer

    load_tokenizer(None)  # builds the cache if this machine has none yet (that needs torch, once)
    code = (
        "import sys, llm_envs\n"
        "venv = llm_envs.make_vec('sentiment/imdb-cory-v0', 4)\n"
        "obs, _ = venv.reset(seed=0)\n"
        "while venv.agents:\n"
        "    obs, rewards, *_ = venv.step({venv.agents[0]: ['was a delight'] * 4})\n"
        "assert rewards['pioneer'].shape == (4,)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
