"""Hand-checked cases for the single-agent writing reward (llm_envs.rewards.single_writer) under both
split policies, and its envs (writing/xsum-single-v0, writing/xsum-single-strict-v0).

The two parts are consonant-only filler words (as in test_rewards_writing.py: no transition phrase and
no stop word matches them), so every component can be worked out by hand:

FIRST  = 8 two-letter words, 23 characters, 8 unique words.
SECOND = 14 two-letter words and one three-letter word, 45 characters, 15 unique words, none in FIRST.

structure 0.5 (8 and 15 words are in 8-256); r = 45 / 23 = 1.957 is in [1.6, 3.2]: length 1.0;
u = 15 / 8 = 1.875 is on the ramp [1.3, 2.0): diversity 0.5 * (1.875 - 1.3) / 0.7 = 0.410714;
no transition: 0.0; Jaccard 0 / 23 = 0: 0.0. Total 1.910714.

``FIRST + " " + SECOND`` is 69 characters: 69 // 3 = 23, so the reference's one-third cut falls exactly
between the two parts.
"""

from __future__ import annotations

import pytest

import llm_envs
from llm_envs.rewards.single_writer import (
    SINGLE_WRITER_COMPONENTS,
    SPLIT_POLICIES,
    single_writer_reward,
    single_writer_rewards,
    split_two_parts,
)

FIRST = "bc df gh jk lm np qr st"
SECOND = "bd bf bg bh bj bk bl bm bn bp bq br bs bt bvw"
DIVERSITY = 0.5 * (15 / 8 - 1.3) / 0.7
SCORED = {"structure": 0.5, "length": 1.0, "diversity": DIVERSITY, "transition": 0.0, "jaccard": 0.0}
TOTAL = 1.5 + DIVERSITY
ZERO = dict.fromkeys(SINGLE_WRITER_COMPONENTS, 0.0)


def test_parts_are_what_the_docstring_says() -> None:
    assert len(FIRST) == 23 and len(FIRST.split()) == 8
    assert len(SECOND) == 45 and len(set(SECOND.split())) == 15
    assert len(FIRST + " " + SECOND) // 3 == 23
    assert round(TOTAL, 6) == 1.910714


# (text, policy, expected total, expected components, how the text was cut)
CASES = [
    (f"Paragraph 1: {FIRST} [PARAGRAPH_SPLIT] Paragraph 2: {SECOND}", "reference", TOTAL,
     {**SCORED, "delimiter": 1.0, "marker": 0.0}, "delimiter"),
    (f"Paragraph 1: {FIRST} [PARAGRAPH_SPLIT] Paragraph 2: {SECOND}", "strict", TOTAL,
     {**SCORED, "delimiter": 1.0, "marker": 0.0}, "delimiter"),
    (f"  {FIRST}\n[PARAGRAPH_SPLIT]\n{SECOND}\n", "strict", TOTAL, {**SCORED, "delimiter": 1.0, "marker": 0.0},
     "delimiter"),
    # The label fallback: found anywhere, any case; the label itself is dropped.
    (f"Paragraph 1: {FIRST}\nparagraph 2: {SECOND}", "reference", TOTAL, {**SCORED, "delimiter": 0.0, "marker": 1.0},
     "marker"),
    (f"Paragraph 1: {FIRST}\nparagraph 2: {SECOND}", "strict", 0.0, ZERO, None),
    # Neither delimiter nor label: the reference cuts at one third of the characters.
    (f"{FIRST} {SECOND}", "reference", TOTAL, {**SCORED, "delimiter": 0.0, "marker": 0.0}, "fraction"),
    (f"{FIRST} {SECOND}", "strict", 0.0, ZERO, None),
    # The delimiter wins over a label that comes after it; the second part keeps that label text.
    (f"{FIRST} [PARAGRAPH_SPLIT] {SECOND}", "reference", TOTAL, {**SCORED, "delimiter": 1.0, "marker": 0.0},
     "delimiter"),
    # One third of a tiny text: both parts below 8 words, level 1 stops.
    ("abcdefghi", "reference", 0.0, ZERO, "fraction"),
    ("", "reference", 0.0, ZERO, "fraction"),
]


@pytest.mark.parametrize(("text", "policy", "total", "components", "how"), CASES)
def test_single_writer_reward(text: str, policy: str, total: float, components: dict, how: str | None) -> None:
    got_total, got = single_writer_reward(text, split=policy)
    assert got_total == pytest.approx(total, abs=1e-9)
    assert list(got) == list(SINGLE_WRITER_COMPONENTS)
    assert got == pytest.approx(components, abs=1e-9)
    # The writing components sum to the total; the two indicators stay outside it.
    assert sum(got[c] for c in SINGLE_WRITER_COMPONENTS[:5]) == pytest.approx(got_total, abs=1e-9)
    parts = split_two_parts(text, policy)
    assert (parts and parts[2]) == how


def test_split_points() -> None:
    assert split_two_parts(f"{FIRST} {SECOND}", "reference") == (FIRST, SECOND, "fraction")
    assert split_two_parts(f"Paragraph 1: {FIRST}\nPARAGRAPH 2: {SECOND}", "reference") == (FIRST, SECOND, "marker")
    assert split_two_parts("a [PARAGRAPH_SPLIT] b [PARAGRAPH_SPLIT] c", "strict") == ("a", "b [PARAGRAPH_SPLIT] c",
                                                                                      "delimiter")
    assert split_two_parts("a", "reference") == ("a", "", "fraction")  # len // 3 == 0: cut after 1 character


def test_batch_and_bad_input() -> None:
    assert single_writer_rewards([f"{FIRST} {SECOND}", "x"], split="reference") == pytest.approx([TOTAL, 0.0])
    assert single_writer_rewards([f"{FIRST} {SECOND}"], split="strict") == [0.0]
    with pytest.raises(ValueError, match=r"split must be one of \['reference', 'strict'\], got 'loose'"):
        single_writer_reward("text", split="loose")
    with pytest.raises(ValueError, match="variant must be one of"):
        single_writer_reward("text", variant="poem")
    with pytest.raises(TypeError, match="text must be a str, got int"):
        split_two_parts(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="completions must be a sequence of str"):
        single_writer_rewards("one string")


@pytest.mark.parametrize(
    ("env_id", "policy"), [("writing/xsum-single-v0", "reference"), ("writing/xsum-single-strict-v0", "strict")]
)
def test_single_writer_envs(env_id: str, policy: str) -> None:
    env = llm_envs.make(env_id)
    assert env.possible_agents == ["writer"] and env.task.split == policy
    assert env.max_new_tokens == 512  # both parts in one response: the pair's 2 x 256
    _, infos = env.reset(seed=0)
    assert infos["writer"]["reward_delimiter"] == 0.0 and infos["writer"]["reward_marker"] == 0.0
    assert "[PARAGRAPH_SPLIT]" in env.text("writer")  # the reference's single-agent prompt asks for it
    # The same problems as the two-role env.
    pair = llm_envs.make("writing/xsum-v0")
    pair.reset(seed=0)
    assert env.problem == pair.problem
    for text, paid in ((f"{FIRST} [PARAGRAPH_SPLIT] {SECOND}", True), (f"{FIRST} {SECOND}", policy == "reference")):
        env.reset(seed=0)
        _, rewards, terms, _, infos = env.step({"writer": text})
        assert rewards["writer"] == pytest.approx(TOTAL if paid else 0.0)
        assert infos["writer"]["reward_delimiter"] == float("[PARAGRAPH_SPLIT]" in text)
        assert infos["writer"]["reward_diversity"] == pytest.approx(DIVERSITY if paid else 0.0)
        assert terms["writer"]


def test_single_writer_feedback_and_arguments() -> None:
    env = llm_envs.make("writing/xsum-single-strict-v0", num_turns=2, max_source_words=40)
    env.reset(seed=1)
    env.step({"writer": f"{FIRST} {SECOND}"})
    prompt = env.text("writer")
    assert "Your previous answer:" in prompt
    assert "did not hold the delimiter [PARAGRAPH_SPLIT]" in prompt
    assert "Score 0.00 of 3.0" in prompt
    with pytest.raises(ValueError, match=r"split must be one of \['reference', 'strict'\], got 'loose'"):
        llm_envs.make("writing/xsum-single-v0", split="loose")
    with pytest.raises(ValueError, match="source must be 'xsum', 'tldr' or 'arxiv', got 'news'"):
        llm_envs.make("writing/xsum-single-v0", source="news")
    assert set(SPLIT_POLICIES) == {"reference", "strict"}


def test_single_writer_empty_source() -> None:
    # XSum's eval document 15 is empty: the pair's env prompts with it, so must the single writer's.
    env = llm_envs.make("writing/xsum-single-v0")
    assert env.task.problems("eval")[15]["source"] == ""
    env.reset(seed=0, options={"split": "eval", "task_index": 15})
    assert "[PARAGRAPH_SPLIT]" in env.text("writer")
    _, rewards, *_ = env.step({"writer": f"{FIRST} {SECOND}"})
    assert rewards["writer"] == pytest.approx(TOTAL)


def test_sequential_writing_id() -> None:
    env = llm_envs.make("writing/xsum-sequential-v0")
    env.reset(seed=0)
    assert env.agent_selection == "brief"
    env.step("A brief text written first.")
    assert "A brief text written first." in env.text("detailed")  # the second role reads the first
