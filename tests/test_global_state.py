"""The global state (``env.state()``, ``env.state_space``; llm_envs/core/state.py): what it holds turn by turn
under both protocols and in token mode, whose tokenizer reads it on a team of two tokenizers, its fixed length
and left truncation, the flat format, PettingZoo's wrappers, and the errors. ``check_env``'s ``state`` check runs
on every registered id in tests/test_env_contract.py and on teams in tests/test_env_team_tokenizers.py."""

from __future__ import annotations

import numpy as np
import pytest
import tiny_models
from pettingzoo.utils.conversions import parallel_to_aec

import llm_envs
from llm_envs import MixedTokenizersError
from llm_envs.core.state import STATE_HEADER_TOKENS, STATE_ROLE_TOKENS, LatestResponse, context_text, joint_context
from llm_envs.tokenizers import load_tokenizer


def held(state) -> list[int]:
    return state["observation"][state["attention_mask"] == 1].tolist()


def contains(seq: list[int], sub: list[int]) -> bool:
    return any(seq[i : i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_parallel_state_turn_by_turn():
    env = llm_envs.make("coding/humaneval-v0", num_turns=2, max_new_tokens=16)
    with pytest.raises(RuntimeError, match=r"Call reset\(\) before state\(\)"):
        env.state()
    space = env.state_space
    assert env.state_length == env.max_prompt_tokens + 2 * (16 + STATE_ROLE_TOKENS) + STATE_HEADER_TOKENS
    assert space["observation"].shape == (env.state_length,) and space["observation"].high[0] == env.vocab_size - 1
    env.reset(seed=3)
    text = env.state_text()
    # The problem's prompt is HumanEval's own "prompt" field, not a role's instructions.
    assert text.startswith("Problem:\n" + env.problem["prompt"]) and "Create a helper" not in text
    assert text.endswith("Turns finished: 0 of 2.\n\nResponse of helper: none yet.\n\nResponse of main: none yet.")
    ids = np.array([30, 31, 32, 33], np.int64)  # ids whose decode -> encode round trip differs: kept verbatim
    env.step({"helper": ids, "main": "    return 1\n"})
    state = env.state()
    assert env.state_space is space and space.contains(state)
    assert contains(held(state), ids.tolist())
    assert "Response of helper (turn 1):\n" in env.state_text() and "Turns finished: 1 of 2." in env.state_text()
    env.step({"helper": "def f():\n    pass\n", "main": "    return 2\n"})
    text = env.state_text()
    assert text.endswith("Turns finished: 2 of 2.\n\nResponse of helper (turn 2):\ndef f():\n    pass\n\n\n"
                         "Response of main (turn 2):\n    return 2\n")
    assert env.agents == [] and env.state_space.contains(env.state())  # after the end: the last turn's responses


def test_sequential_token_mode_states_within_a_turn_and_at_its_end():
    kw = dict(max_new_tokens=3)
    tokens = llm_envs.make("sentiment/imdb-cory-v0", step_unit="token", **kw)
    whole = llm_envs.make("sentiment/imdb-cory-v0", **kw)
    tokens.reset(seed=1)
    whole.reset(seed=1)
    assert tokens.state_length == whole.state_length  # token mode's observations grow; the state does not
    np.testing.assert_array_equal(tokens.state()["observation"], whole.state()["observation"])
    tok = tokens.tokenizer
    tokens.step(30)
    assert tokens.state_text().endswith(f"Response of pioneer (turn 1, being written):\n{tok.decode([30])}\n\n"
                                        "Response of observer: none yet.")
    assert "action_mask" not in tokens.state()  # the state is not an agent's observation
    tokens.step(31)
    tokens.step(tokens.pad_token_id)  # the pioneer's response ends: [30, 31]
    whole.step(np.array([30, 31], np.int64))
    np.testing.assert_array_equal(tokens.state()["observation"], whole.state()["observation"])
    expected = f"Response of pioneer (turn 1):\n{tok.decode([30, 31])}\n\nResponse of observer: none yet."
    assert tokens.state_text().endswith(expected)
    for token in (40, 41, 42):
        tokens.step(token)
    whole.step(np.array([40, 41, 42], np.int64))
    np.testing.assert_array_equal(tokens.state()["observation"], whole.state()["observation"])
    assert tokens.state_text().endswith(f"Response of observer (turn 1):\n{tok.decode([40, 41, 42])}")


def test_a_team_of_two_tokenizers_reads_the_state_with_the_first_roles():
    default = load_tokenizer(None)
    raw = tiny_models.byte_bpe(400, ["The council met on Tuesday.", "A summary of the article in one sentence."])
    env = llm_envs.make("writing/xsum-v0", tokenizer={"brief": default, "detailed": raw}, max_new_tokens=16)
    other = llm_envs.make("writing/xsum-v0", tokenizer={"brief": raw, "detailed": default}, max_new_tokens=16)
    with pytest.raises(MixedTokenizersError):
        env.tokenizer  # noqa: B018
    assert env.state_tokenizer is default and other.state_tokenizer is raw
    assert env.state_space["observation"].high[0] == len(default) - 1
    assert other.state_space["observation"].high[0] == len(raw) - 1
    env.reset(seed=0)
    env.step({"brief": " The council met.", "detailed": " It met on Tuesday."})
    seq = held(env.state())
    assert max(seq) < len(default) and env.state()["observation"][0] == default.pad_token_id
    # The other role's response is its text encoded with the state's tokenizer; the first role's its own ids.
    assert contains(seq, default(" It met on Tuesday.", add_special_tokens=False)["input_ids"])
    assert contains(seq, list(env.history[-1].outputs["brief"].ids))
    other.reset(seed=0)
    other.step({"brief": " The council met.", "detailed": " It met on Tuesday."})
    assert max(held(other.state())) < len(raw) and other.state()["observation"][0] == raw.pad_token_id
    assert other.state_text().endswith("Response of detailed (turn 1):\n It met on Tuesday.")


def test_a_long_state_keeps_its_end():
    env = llm_envs.make("writing/xsum-v0", max_prompt_tokens=40, prompt_overflow="truncate_left", max_new_tokens=8)
    env.reset(seed=0)
    env.step({"brief": "Short.", "detailed": "A bit longer."})
    state = env.state()
    assert state["attention_mask"].all() and len(state["observation"]) == env.state_length == 40 + 2 * 72 + 64
    text = env.state_text()
    assert not text.startswith("Problem:") and text.endswith("Response of detailed (turn 1):\nA bit longer.")


def test_flat_state_is_the_dict_ids_then_mask():
    flat = llm_envs.make("writing/xsum-v0", obs_format="flat", step_unit="token", max_new_tokens=4)
    dict_env = llm_envs.make("writing/xsum-v0", step_unit="token", max_new_tokens=4)
    for env in (flat, dict_env):
        env.reset(seed=2)
        env.step({"brief": 30, "detailed": 40})
    S = flat.state_length
    assert flat.state_space.shape == (2 * S,) and flat.state_space.dtype == np.int64
    state = flat.state()
    parts = flat.split_flat_state(state)
    np.testing.assert_array_equal(parts["observation"], dict_env.state()["observation"])
    np.testing.assert_array_equal(parts["attention_mask"], dict_env.state()["attention_mask"])
    with pytest.raises(ValueError, match=f"has {2 * S} entries on its last axis, got shape \\(7,\\)"):
        flat.split_flat_state(np.zeros(7, np.int64))


def test_pettingzoo_wrappers_and_the_centralised_env_forward_the_state():
    parallel = llm_envs.make("writing/xsum-v0", max_new_tokens=8)
    aec = parallel_to_aec(parallel)
    assert aec.state_space is parallel.state_space
    aec.reset(seed=0)
    np.testing.assert_array_equal(aec.state()["observation"], parallel.state()["observation"])
    central = llm_envs.make("writing/xsum-v0", centralized=True, max_new_tokens=32)
    central.reset(seed=0)
    central.step({"central": "<brief>Short.</brief><detailed>Long.</detailed>"})
    response = "<brief>Short.</brief><detailed>Long.</detailed>"
    assert central.state_text().endswith(f"Response of central (turn 1):\n{response}")


def test_joint_context_is_plain_text_parts():
    from llm_envs.core.task import Response

    parts = joint_context("Q?", ["a", "b"], {"a": LatestResponse(Response((5,), "x"), 1, finished=False),
                                            "b": LatestResponse(Response((6,), "y"), 0)}, 1, 3)
    assert [p for p in parts if isinstance(p, Response)] == [Response((5,), "x"), Response((6,), "y")]
    assert context_text(parts) == ("Problem:\nQ?\n\nTurns finished: 1 of 3.\n\nResponse of a (turn 2, being written):"
                                   "\nx\n\nResponse of b (turn 1):\ny")


def test_a_vector_env_stacks_the_states():
    venv = llm_envs.make_vec("writing/xsum-v0", 2, max_new_tokens=8)
    flat = llm_envs.make_vec("writing/xsum-v0", 2, max_new_tokens=8, obs_format="flat")
    venv.reset(seed=[0, 1])
    flat.reset(seed=[0, 1])
    S = venv.envs[0].state_length
    states = venv.state()
    assert venv.state_space is venv.envs[0].state_space and states["observation"].shape == (2, S)
    np.testing.assert_array_equal(states["attention_mask"][1], venv.envs[1].state()["attention_mask"])
    assert flat.state().shape == (2, 2 * S)
    np.testing.assert_array_equal(flat.state()[:, :S], states["observation"])
