"""The env contract, checked on every registered id by ``llm_envs.testing.check_env`` (the same code users
run on their own tasks): PettingZoo's official checks, spaces and observation layout, infos, multi-turn
determinism, reset options, text vs token-id actions, bad input, reward bounds, token mode, render,
copying, vector envs and truncation. Then the writing env's own behaviour, bad input in detail and the
registry."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pettingzoo
import pytest
from pettingzoo.test import parallel_api_test

import llm_envs
from llm_envs.core.parallel import ParallelLLMEnv
from llm_envs.core.sequential import SequentialLLMEnv
from llm_envs.testing import CHECKS, assert_same, run_check

ALL_IDS = llm_envs.list_envs()


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("env_id", ALL_IDS)
def test_contract(env_id, check, env_kwargs_for):
    """One check of the contract on one id; a check that does not apply (a single-turn id has no truncation)
    is skipped with its reason."""
    run_check(env_id, check, **env_kwargs_for(env_id))


# ------------------------------------------------------------------------- writing env behaviour
def test_string_and_token_actions_agree_and_tail_after_eos_is_ignored():
    env = llm_envs.make("writing/xsum-v0")
    tok = env._tok.tokenizer
    brief = "The council will build a new bridge next year."
    detailed = "In addition, the council explained that the bridge will, however, cost more than planned."
    env.reset(seed=1)
    _, r_text, *_ = env.step({"brief": brief, "detailed": detailed})
    env.reset(seed=1)
    b_ids = tok(brief, add_special_tokens=False)["input_ids"]
    d_ids = tok(detailed, add_special_tokens=False)["input_ids"]
    eos = tok.eos_token_id
    junk = [5, 6, 7]
    _, r_ids, *_ = env.step({"brief": np.array(b_ids + [eos] + junk), "detailed": np.array(d_ids + [eos] + junk)})
    assert r_text == r_ids
    assert env.history[-1].outputs["brief"].ids == tuple(b_ids)
    assert env.history[-1].outputs["brief"].text == brief


def test_reward_is_joint_and_matches_the_reward_function():
    from llm_envs.rewards.writing import tldr_reward

    env = llm_envs.make("writing/xsum-v0")
    env.reset(seed=2)
    brief = "Flood planning helps towns and farmers."
    detailed = ("Moreover, the report explains that river flow measurements help towns plan for floods, "
                "while farmers consequently adjust planting schedules as seasonal rain shifts.")
    _, rewards, _, _, infos = env.step({"brief": brief, "detailed": detailed})
    total, comps = tldr_reward(brief, detailed)
    assert rewards == {"brief": total, "detailed": total}
    for name, value in comps.items():
        assert infos["brief"][f"reward_{name}"] == value


def test_multi_turn_feedback_and_previous_answer_reach_the_next_prompt():
    env = llm_envs.make("writing/xsum-v0", num_turns=2)
    env.reset(seed=4)
    first_prompt = env.text("brief")
    obs, _, terms, _, infos = env.step({"brief": "Tiny.", "detailed": "Also tiny."})
    assert not any(terms.values()) and infos["brief"]["turn"] == 1
    second = env.text("brief")
    assert "Your previous answer:" in second and "Tiny." in second and "Score 0.00" in second
    assert second != first_prompt
    _, _, terms, _, _ = env.step({"brief": "Short again.", "detailed": "Longer text this time around."})
    assert all(terms.values()) and env.agents == []


def test_sequential_second_role_sees_first_role_tokens_verbatim():
    env = llm_envs.make("writing/xsum-v0", protocol="sequential")
    env.reset(seed=5)
    assert env.agent_selection == "brief"
    before = env.observe("detailed")["observation"].copy()
    # Ids whose decode -> encode round trip differs: they must still appear exactly as given.
    ids = np.array([260, 261, 262, 263, 264, 265], dtype=np.int64)
    env.step(ids)
    assert env.agent_selection == "detailed"
    after = env.observe("detailed")
    n = int(after["attention_mask"].sum())
    seq = after["observation"][-n:].tolist()
    assert any(seq[i : i + len(ids)] == ids.tolist() for i in range(len(seq))), "pioneer ids spliced verbatim"
    assert not np.array_equal(before, after["observation"])
    # The acting role's own observation does not change when a later role is told about it.
    env.step("A detailed answer.")
    assert env.rewards["brief"] == env.rewards["detailed"]


def test_chat_template_can_be_turned_off():
    on = llm_envs.make("writing/xsum-v0")
    off = llm_envs.make("writing/xsum-v0", chat_template=False)
    on.reset(seed=0)
    off.reset(seed=0)
    assert on.text("brief").startswith("<|im_start|>")
    assert not off.text("brief").startswith("<|im_start|>")
    assert off.text("brief").startswith("Create a concise summary")


def test_prompt_overflow_error_or_documented_truncation():
    env = llm_envs.make("writing/xsum-v0", max_prompt_tokens=32)
    with pytest.raises(ValueError, match="max_prompt_tokens=32"):
        env.reset(seed=0)
    env = llm_envs.make("writing/xsum-v0", max_prompt_tokens=32, prompt_overflow="truncate_left")
    obs, infos = env.reset(seed=0)
    assert obs["brief"]["attention_mask"].all() and infos["brief"]["prompt_truncated"] == 1
    assert env.text("brief").endswith("<|im_start|>assistant\n")


def test_task_index_and_split_options():
    env = llm_envs.make("writing/xsum-v0")
    a, ia = env.reset(seed=0, options={"task_index": 3})
    b, ib = env.reset(seed=99, options={"task_index": 3})
    assert np.array_equal(a["brief"]["observation"], b["brief"]["observation"])
    assert ia["brief"]["task_index"] == 3
    n_train = len(env.task.problems("train"))
    n_eval = len(env.task.problems("eval"))
    assert (n_train, n_eval) == (900, 100)
    e, _ = env.reset(options={"task_index": 3, "split": "eval"})
    assert not np.array_equal(a["brief"]["observation"], e["brief"]["observation"])
    train_docs = {p["source"] for p in env.task.problems("train")}
    assert not train_docs & {p["source"] for p in env.task.problems("eval")}


# ------------------------------------------------------------------------------- bad input
@pytest.fixture
def started_env():
    env = llm_envs.make("writing/xsum-v0", num_turns=2, max_new_tokens=16)
    env.reset(seed=7)
    return env


def snapshot(env):
    return (copy.deepcopy(env.__dict__["_history"]), env._turn, list(env.agents),
            {a: env.text(a) for a in env.agents}, list(env._transcript))


@pytest.mark.parametrize(
    "actions, error, message",
    [
        ({"brief": "x"}, KeyError, "missing \\['detailed'\\]"),
        ({"brief": "x", "detailed": "y", "critic": "z"}, KeyError, "unknown \\['critic'\\]"),
        ({"brief": np.array([1, 2, 49152]), "detailed": "y"}, ValueError, "'brief'.*out of range.*49152"),
        ({"brief": np.array([-1, 2]), "detailed": "y"}, ValueError, "'brief'.*out of range"),
        ({"brief": np.array([1.0, 2.0]), "detailed": "y"}, TypeError, "'brief'.*integer token ids.*float64"),
        ({"brief": np.zeros((2, 3), np.int64), "detailed": "y"}, ValueError, "'brief'.*1-D.*shape \\(2, 3\\)"),
        ({"brief": np.ones(17, np.int64), "detailed": "y"}, ValueError, "'brief'.*max_new_tokens=16"),
        ({"brief": "word " * 40, "detailed": "y"}, ValueError, "'brief'.*tokens long.*max_new_tokens=16"),
        ({"brief": None, "detailed": "y"}, TypeError, "'brief' is None"),
        ({"brief": ["a", "b"], "detailed": "y"}, TypeError, "'brief'"),
        (["brief", "detailed"], TypeError, "dict"),
    ],
)
def test_bad_actions_raise_clearly_and_leave_the_env_unchanged(started_env, actions, error, message):
    before = snapshot(started_env)
    with pytest.raises(error, match=message):
        started_env.step(actions)
    assert snapshot(started_env) == before
    # The env still works, exactly as an untouched env with the same seed.
    fresh = llm_envs.make("writing/xsum-v0", num_turns=2, max_new_tokens=16)
    fresh.reset(seed=7)
    good = {"brief": "Short.", "detailed": "A longer answer."}
    assert_same(started_env.step(good), fresh.step(good))


def test_step_before_reset_and_after_the_end():
    env = llm_envs.make("writing/xsum-v0")
    with pytest.raises(RuntimeError, match="reset"):
        env.step({"brief": "a", "detailed": "b"})
    with pytest.raises(RuntimeError, match="reset"):
        env.text("brief")
    env.reset(seed=0)
    env.step({"brief": "a", "detailed": "b"})
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step({"brief": "a", "detailed": "b"})
    seq = llm_envs.make("writing/xsum-v0", protocol="sequential")
    with pytest.raises(RuntimeError, match="reset"):
        seq.step("a")
    seq.reset(seed=0)
    seq.step("a")
    seq.step("b")
    with pytest.raises(ValueError, match="step it with None"):
        seq.step("c")
    seq.step(None)
    seq.step(None)
    with pytest.raises(RuntimeError, match="episode is over"):
        seq.step(None)


def test_unknown_ids_kwargs_agents_and_options():
    with pytest.raises(KeyError, match="Unknown env id 'writing/xsum-v9'.*Did you mean"):
        llm_envs.make("writing/xsum-v9")
    with pytest.raises(TypeError, match="Unknown argument.*'max_new_token'"):
        llm_envs.make("writing/xsum-v0", max_new_token=3)
    with pytest.raises(ValueError, match="protocol must be one of"):
        llm_envs.make("writing/xsum-v0", protocol="async")
    for bad in ({"max_new_tokens": 0}, {"num_turns": 1.5}, {"render_mode": "rgb_array"}, {"chat_template": "yes"},
                {"prompt_overflow": "cut"}, {"max_prompt_tokens": True}):
        with pytest.raises(ValueError, match=repr(next(iter(bad.values()))).replace("(", "\\(")[:6]):
            llm_envs.make("writing/xsum-v0", **bad)
    with pytest.raises(ValueError, match="source must be"):
        llm_envs.make("writing/xsum-v0", source="wiki")
    with pytest.raises(ValueError, match="at most 1 turn.*num_turns=2"):
        llm_envs.make("sentiment/imdb-cory-v0", num_turns=2)
    with pytest.raises(ValueError, match="supports the protocols \\['sequential'\\], not 'parallel'"):
        llm_envs.make("sentiment/imdb-cory-v0", protocol="parallel")
    env = llm_envs.make("writing/xsum-v0")
    with pytest.raises(KeyError, match="Unknown agent 'critic'.*brief"):
        env.observation_space("critic")
    with pytest.raises(ValueError, match="task_index must be an int in \\[0, 899\\].*900"):
        env.reset(options={"task_index": 900})
    with pytest.raises(ValueError, match="split must be one of.*'test'"):
        env.reset(options={"split": "test"})
    with pytest.raises(ValueError, match="seed must be an int"):
        env.reset(seed="1")


def test_hub_source_without_hub_or_copy_fails_with_instructions():
    from llm_envs.data import DatasetUnavailableError

    env = llm_envs.make("writing/tldr-v0")
    with pytest.raises(DatasetUnavailableError, match="(?s)trl-lib/tldr.*save_to_disk.*data_path"):
        env.reset(seed=0)
    with pytest.raises(DatasetUnavailableError, match="does not exist"):
        llm_envs.make("writing/arxiv-v0", data_path="/nonexistent/arxiv").reset()


def test_hub_loaders_read_save_to_disk_copies(tmp_path):
    import datasets

    rows = [{"prompt": f"POST: story number {i} " + "word " * 30, "completion": "x"} for i in range(5)]
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:3]),
                               "test": datasets.Dataset.from_list(rows[3:])})
    dd.save_to_disk(str(tmp_path / "tldr"))
    env = llm_envs.make("writing/tldr-v0", data_path=str(tmp_path / "tldr"))
    assert len(env.task.problems("train")) == 3 and len(env.task.problems("eval")) == 2
    env.reset(seed=0, options={"split": "eval", "task_index": 1})
    assert "story number 4" in env.text("brief")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt field"}\n')
    with pytest.raises(ValueError, match="string field 'prompt'"):
        llm_envs.make("writing/tldr-v0", data_path=str(bad)).reset()


# --------------------------------------------------------------------------- copying, registry
def test_envs_pickle_and_copy_cheaply_and_continue_identically():
    env = llm_envs.make("writing/xsum-v0", num_turns=2)
    env.reset(seed=8)
    env.step({"brief": "First.", "detailed": "Second one."})
    blob = pickle.dumps(env)
    assert len(blob) < 200_000, "an env must not carry its tokenizer or dataset when pickled"
    clone = pickle.loads(blob)
    twin = copy.deepcopy(env)
    actions = {"brief": "Again.", "detailed": "Again, longer."}
    out = env.step(actions)
    assert_same(out, clone.step(actions))
    assert_same(out, twin.step(actions))
    assert clone._tok.tokenizer is env._tok.tokenizer


def test_user_defined_task_registers_in_a_few_lines():
    task_id = "custom/echo-v0"
    if task_id not in llm_envs.list_envs():
        llm_envs.register(
            task_id,
            lambda: llm_envs.TemplateTask(
                roles=("writer", "critic"),
                problems=[{"topic": "tides"}, {"topic": "volcanoes"}],
                prompts={"writer": "Write about {topic}.", "critic": "Critique a text about {topic}."},
                reward=lambda problem, outputs: float(problem["topic"] in outputs["writer"]),
            ),
            description="A toy example",
        )
    env = llm_envs.make(task_id)
    env.reset(options={"task_index": 1})
    _, rewards, *_ = env.step({"writer": "volcanoes erupt", "critic": "fine"})
    assert rewards == {"writer": 1.0, "critic": 1.0}
    parallel_api_test(llm_envs.make(task_id), num_cycles=2)
    with pytest.raises(ValueError, match="already registered with a different definition.*replace=True"):
        llm_envs.register(task_id, lambda: None)
    # replace=True redefines an id of your own (a fixed task, a re-run notebook cell), never a built-in one.
    echo = llm_envs.spec(task_id)
    try:
        llm_envs.register(task_id, lambda: echo.task(), description="redefined", replace=True)
        assert llm_envs.describe_envs()[task_id] == "redefined"
    finally:
        llm_envs.register(task_id, echo.task, description=echo.description, replace=True)
    with pytest.raises(ValueError, match="'writing/xsum-v0' is built in and cannot be redefined"):
        llm_envs.register("writing/xsum-v0", lambda: None, replace=True)
    assert llm_envs.spec("writing/xsum-v0").task.__name__ == "WritingTask"
    with pytest.raises(ValueError, match="versioned"):
        llm_envs.register("Custom Echo", lambda: None)


def test_registered_in_pettingzoo_registry():
    env = pettingzoo.make("parallel", "writing/xsum-v0")
    assert isinstance(env, ParallelLLMEnv)
    aec = pettingzoo.make("aec", "writing/xsum-v0")
    aec.reset(seed=0)
    assert aec.agent_selection == "brief"
    assert isinstance(llm_envs.make("writing/xsum-v0", protocol="sequential"), SequentialLLMEnv)


def test_every_id_has_a_description():
    for env_id, text in llm_envs.describe_envs().items():
        assert text and "\n" not in text, env_id


# ------------------------------------------------------------------------------------- vector
def test_vector_env_groups_share_a_problem_and_validate_the_whole_batch():
    from llm_envs.core.vector import VectorEnv

    venv = VectorEnv("writing/xsum-v0", num_envs=4, max_new_tokens=8)
    obs, infos = venv.reset(seed=0, options=[{"task_index": 2}] * 2 + [{"task_index": 5}] * 2)
    assert obs["brief"]["observation"].shape == (4, venv.envs[0].max_prompt_tokens)
    assert infos["brief"]["task_index"].tolist() == [2, 2, 5, 5]
    acts = {"brief": np.ones((4, 8), np.int64), "detailed": np.ones((4, 8), np.int64)}
    acts["detailed"][3, 0] = 10**6
    with pytest.raises(ValueError, match="out of range"):
        venv.step(acts)
    assert all(env._turn == 0 for env in venv.envs)
    acts["detailed"][3, 0] = 1
    _, rewards, terms, _, infos = venv.step(acts)
    assert rewards["brief"].shape == (4,) and terms["brief"].all()
    assert infos["detailed"]["response_tokens"].tolist() == [8, 8, 8, 8]
    with pytest.raises(RuntimeError, match="reset"):
        venv.step(acts)


def test_any_tokenizer_object_works_and_pickles_by_value():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = [p["source"] for p in llm_envs.make("writing/xsum-v0").task.problems("eval")]
    raw.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=["[PAD]", "[EOS]", "[UNK]"]))
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="[PAD]", eos_token="[EOS]", unk_token="[UNK]")
    env = llm_envs.make("writing/xsum-v0", tokenizer=tok, max_new_tokens=32)
    assert env.vocab_size == len(tok) and env.pad_token_id == 0 and not env.chat_template
    with pytest.raises(ValueError, match="no chat template"):
        llm_envs.make("writing/xsum-v0", tokenizer=tok, chat_template=True)
    obs, _ = env.reset(seed=0, options={"split": "eval", "task_index": 0})
    assert obs["brief"]["observation"].max() < len(tok)
    _, rewards, *_ = env.step({"brief": "the council said", "detailed": np.array([5, 6, 7, 1, 9], np.int64)})
    assert env.history[-1].outputs["detailed"].ids == (5, 6, 7)
    clone = pickle.loads(pickle.dumps(env))
    assert clone._tok.tokenizer is not tok and len(clone._tok.tokenizer) == len(tok)
    parallel_api_test(llm_envs.make("writing/xsum-v0", tokenizer=tok, max_new_tokens=8), num_cycles=2)
