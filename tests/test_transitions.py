"""Pluggable turn transitions (llm_envs/transitions.py): registered names, import paths, callables;
their prompts reach the agents; broken ones fail with an error naming them."""

from __future__ import annotations

import pytest
from test_tree import TABLE, expand, scripted_env

import llm_envs
from llm_envs.transitions import plain, resolve

CALLS: list[dict] = []


def shout(prompt, agent_completions, prompt_history_per_agent, response_history_per_agent):
    """A user transition: records its arguments, tells each agent what the other said."""
    CALLS.append(dict(prompt=prompt, agent_completions=agent_completions,
                      prompt_history_per_agent=prompt_history_per_agent,
                      response_history_per_agent=response_history_per_agent))
    first, second = agent_completions
    return [f"PARTNER SAID {second}. Try again.", f"PARTNER SAID {first}. Try again."]


def returns_one(prompt, agent_completions, prompt_history_per_agent, response_history_per_agent):
    return ["only one"]


def returns_dict(prompt, agent_completions, prompt_history_per_agent, response_history_per_agent):
    return {"x": "a", "y": "b"}


def raises(prompt, agent_completions, prompt_history_per_agent, response_history_per_agent):
    raise KeyError("no feedback for this problem")


@pytest.fixture(scope="module")
def tokenizer():
    from llm_envs.tokenizers import load_tokenizer

    return load_tokenizer(None)


def test_transition_prompts_reach_the_agents(tokenizer):
    CALLS.clear()
    policy, levels = expand(tokenizer, TABLE, num_turns=2, transition="test_transitions:shout")
    # Two turn-0 joint actions -> two transition calls, each with the branch's own history.
    assert len(CALLS) == 2
    call = CALLS[1]
    assert call["agent_completions"] == ["x001", "y001"]
    assert call["response_history_per_agent"] == [["x001"], ["y001"]]
    assert call["prompt_history_per_agent"] == [["Say word 0 about one."], ["Say word 1 about one."]]
    assert call["prompt"] == "Say word 0 about one."  # no "prompt" field: the first agent's first prompt
    # The policy's second (level 1) call sees the transition's text in every row, per branch.
    assert [("PARTNER SAID y000" in p, "PARTNER SAID y001" in p) for p in policy.prompts[1]["x"]] == [
        (True, False), (False, True)]
    assert "PARTNER SAID x001" in policy.prompts[1]["y"][1]
    assert all("Feedback" not in p for p in policy.prompts[1]["x"])  # the task's feedback is replaced
    # Infos carry the transition's cost.
    assert all("transition_s" in info and info["transition_s"] >= 0 for info in levels[0].nodes[0].infos)


def test_callable_and_registered_transitions(tokenizer):
    env = scripted_env(tokenizer, TABLE, 2, transition=shout)
    env.reset(seed=0)
    env.step({"x": "hello", "y": "there"})
    assert env.text("x").count("PARTNER SAID there") == 1
    assert env.history[-1].next_prompts == {
        "x": "PARTNER SAID there. Try again.", "y": "PARTNER SAID hello. Try again."}
    env = scripted_env(tokenizer, TABLE, 2, transition="plain")
    env.reset(seed=0, options={"task_index": 0})  # problem "one" (the scripted task has two)
    env.step({"x": "hello", "y": "there"})
    assert "Say word 0 about one.\n\nYour previous answer:\nhello\n\nRevise" in env.text("x")
    # level-feedback is the task's own feedback: the same prompts as no transition at all.
    texts = []
    for transition in (None, "level-feedback"):
        env = scripted_env(tokenizer, TABLE, 2, transition=transition)
        env.reset(seed=0)
        env.step({"x": "hello", "y": "there"})
        texts.append(env.text("x"))
    assert texts[0] == texts[1] and "Feedback" in texts[0]
    assert plain(prompt="", agent_completions=["a", "b"], prompt_history_per_agent=[["P"], ["Q"]],
                 response_history_per_agent=[["a"], ["b"]])[1].startswith("Q\n\nYour previous answer:\nb")


@pytest.mark.parametrize(
    ("transition", "error", "message"),
    [
        ("test_transitions:returns_one", TypeError, r"returns_one must return a list of 2 str.*\['only one'\]"),
        ("test_transitions:returns_dict", TypeError, "returns_dict must return a list of 2 str.*dict"),
        ("test_transitions:raises", RuntimeError, "test_transitions:raises raised KeyError.*no feedback"),
    ],
)
def test_broken_transition_is_a_clear_error(tokenizer, transition, error, message):
    env = scripted_env(tokenizer, TABLE, 2, transition=transition)
    env.reset(seed=0)
    with pytest.raises(error, match=message):
        env.step({"x": "hello", "y": "there"})
    # The parallel env is left as it was: the same step can be retried after fixing nothing else.
    assert env.history == () and env.agents == ["x", "y"]


@pytest.mark.parametrize(
    ("spec", "error", "message"),
    [
        ("nonsense", ValueError, "Unknown transition 'nonsense'"),
        ("expert", ValueError, "ExpertTransition"),
        ("no_such_module_xyz:f", ValueError, "cannot import module 'no_such_module_xyz'"),
        ("test_transitions:missing", ValueError, "has no callable 'missing'"),
        (42, TypeError, "got int: 42"),
    ],
)
def test_bad_transition_specs(spec, error, message):
    with pytest.raises(error, match=message):
        resolve(spec)


def test_registered_env_takes_a_transition():
    env = llm_envs.make("writing/xsum-v0", num_turns=2, transition="plain", max_source_words=20)
    _, infos = env.reset(seed=0)
    assert infos["brief"]["transition_s"] == 0.0
    _, _, _, _, infos = env.step({a: "A short answer." for a in env.agents})
    assert "Your previous answer:\nA short answer." in env.text("detailed")
    assert set(infos["brief"]) == set(env.info_keys)


def test_expert_transition_writes_the_next_prompts(tiny_model_dir, tokenizer):
    import copy

    from agents import ExpertTransition

    expert = ExpertTransition(tiny_model_dir, max_new_tokens=5)
    assert copy.deepcopy(expert) is expert  # env copies share the model
    rows = expert.expert_prompts("Add numbers.", ["x-answer", "y-answer"])
    # The expert reads every agent's response; each row asks about one agent.
    assert all("x-answer" in r and "y-answer" in r for r in rows)
    assert "agent 1." in rows[0] and "agent 2." in rows[1]
    env = scripted_env(tokenizer, TABLE, 2, transition=expert)
    env.reset(seed=0)
    _, _, _, _, infos = env.step({"x": "hello", "y": "there"})
    assert expert.stats["calls"] == 1 and 0 < expert.stats["generated_tokens"] <= 2 * 5
    assert infos["x"]["transition_s"] > 0
    text = env.text("x")
    assert "Your previous answer:\nhello" in text and "An expert reviewer suggests these edits:" in text
    with pytest.raises(ValueError, match="tokenizer="):
        ExpertTransition(expert.model)


def test_magrpo_config_passes_the_transition():
    from baselines.learners.magrpo import Config

    assert Config(num_turns=2, transition="plain").env_kwargs()["transition"] == "plain"
    assert "transition" not in Config(num_turns=2, transition="expert").env_kwargs()  # built by main
    with pytest.raises(ValueError, match="expert_max_new_tokens"):
        Config(expert_max_new_tokens=0)


def test_sequential_protocol_appends_earlier_responses():
    env = llm_envs.make("writing/xsum-v0", protocol="sequential", num_turns=2, transition="test_transitions:shout",
                        max_source_words=20)
    env.reset(seed=0)
    env.step("first brief")
    env.step("first detailed")
    assert "PARTNER SAID first detailed" in env.text("brief") and "Response of" not in env.text("brief")
    env.step("second brief")
    # The later role sees the transition's prompt, then the earlier role's response of this turn.
    assert "PARTNER SAID first brief. Try again.\n\nResponse of brief:\nsecond brief" in env.text("detailed")
    assert CALLS[-1]["prompt_history_per_agent"][1][0].endswith("first brief")  # what detailed acted on
