"""ClassEval (``coding/classeval-v0``): a hand-checked reward table on a class of the fixture (perfect,
empty, partial, overlapping methods, a class that does not compile, hanging and hostile methods, a
dataset test that hangs), the method split rules, hub loading and its error, the oracle, feedback and
the sequential protocol. The fixture is in ClassEval's schema (tests/hub_fixtures.py)."""

from __future__ import annotations

import pytest
from hub_fixtures import (
    CLASSEVAL_TEMPLATES,
    COUNTER_SKELETON,
    COUNTER_SOLUTION,
    COUNTER_TEST,
    classeval_row,
    classeval_rows,
    write_jsonl,
)

import llm_envs
from llm_envs.rewards.classeval import assign_methods, extract_methods, methods_to_write, score_class, unittest_ids
from llm_envs.sandbox import SandboxLimits

LIMITS = SandboxLimits(timeout_s=20, test_timeout_s=1.0)
OWNERS = (0, 0, 1)  # get, reset -> coder_1 (self only); add -> coder_2
GET = "def get(self):\n    return self.value\n"
RESET = "def reset(self):\n    self.value = 0\n    return self.value\n"
ADD = "def add(self, n):\n    self.value += n\n    return self.value\n"
HANG = "def get(self):\n    while True:\n        pass\n"


@pytest.fixture(scope="module")
def data_path(tmp_path_factory) -> str:
    return str(write_jsonl(tmp_path_factory.mktemp("classeval") / "classeval.jsonl", classeval_rows()))


@pytest.mark.parametrize(
    "coder_1, coder_2, expected",
    [
        # valid, tests, overlap
        (GET + RESET, ADD, (2.0, 4.0, 0.0)),  # perfect: 6.0
        ("", "", (0.0, 0.0, 0.0)),  # empty: the stubs fail every test
        (GET + RESET, "", (4 / 3, 2.0, 0.0)),  # coder_2 wrote nothing: the add tests fail
        (GET + RESET + ADD, GET + RESET + ADD, (2.0, 4.0, -1.0)),  # every method written twice
        (GET + RESET + ADD, ADD, (2.0, 4.0, -1 / 3)),  # add written by both
        (GET + RESET, "def add(self, n):\n    return n\n", (2.0, 3.0, 0.0)),  # wrong add: 3 of 4 tests pass
        (GET + RESET, "def add(self, n)\n    return n\n", (4 / 3, 2.0, 0.0)),  # add does not parse
        (GET + RESET, "def add(self, n):\n    break\n", (0.0, 0.0, 0.0)),  # parses; the class does not compile
        ("```python\nclass Counter:\n    " + GET.replace("\n", "\n    ") + "\n    "
         + RESET.replace("\n", "\n    ") + "```", ADD, (2.0, 4.0, 0.0)),  # inside a class and fences
        (HANG + RESET, ADD, (2.0, 0.0, 0.0)),  # get hangs: 3 tests time out, the 4th is not run
        (GET + RESET, "def add(self, n):\n    import os\n    os._exit(0)\n", (2.0, 2.0, 0.0)),  # exit: no pass
        (GET + "def reset(self):\n    import unittest\n    return 0\n", ADD, (2.0, 0.0, 0.0)),  # denied name
        (GET + "def reset(self):\n    return globals()\n", ADD, (2.0, 0.0, 0.0)),  # denied name
    ],
)
def test_reward_table(coder_1, coder_2, expected):
    score = score_class([coder_1, coder_2], COUNTER_SKELETON, COUNTER_TEST, "Counter", OWNERS, LIMITS)
    assert tuple(score.components.values()) == pytest.approx(expected)
    assert score.total == pytest.approx(sum(expected))


def test_a_dataset_test_that_hangs_fails_and_the_others_count():
    test = COUNTER_TEST.replace("    def test_add_negative(self):",
                                "    def test_forever(self):\n        while True:\n            pass\n\n"
                                "    def test_add_negative(self):")
    methods = extract_methods(COUNTER_SOLUTION, ["get", "reset", "add"])
    score = score_class([methods["get"] + methods["reset"], methods["add"]], COUNTER_SKELETON, test, "Counter",
                        OWNERS, LIMITS)
    assert score.components == {"valid": 2.0, "tests": pytest.approx(4.0 * 4 / 5), "overlap": 0.0}
    timed_out = [i for i, o in zip(score.test_ids, score.execution.outcomes) if o.status == "timeout"]
    assert timed_out == ["CounterTestAdd.test_forever"]


def test_methods_to_write_and_split_rules():
    row = classeval_row(0, *CLASSEVAL_TEMPLATES[1])
    methods = methods_to_write(row["skeleton"], "Stack")
    assert methods == [("push", False), ("pop", True), ("size", True), ("merge", False)]
    assert assign_methods(methods, "reference") == (1, 0, 0, 1)
    assert assign_methods(methods, "round_robin") == (0, 1, 0, 1)
    assert assign_methods(methods, "by_name") == (1, 0, 1, 0)  # merge, pop | push, size
    assert methods_to_write(COUNTER_SKELETON, "Counter") == [("get", True), ("reset", True), ("add", False)]
    assert unittest_ids(COUNTER_TEST) == ["CounterTestGet.test_get", "CounterTestGet.test_reset",
                                          "CounterTestAdd.test_add", "CounterTestAdd.test_add_negative"]
    with pytest.raises(ValueError, match="split must be one of"):
        llm_envs.make("coding/classeval-v0", split="random")


def test_hub_without_copy_fails_with_instructions():
    from llm_envs.data import DatasetUnavailableError

    env = llm_envs.make("coding/classeval-v0")
    with pytest.raises(DatasetUnavailableError, match="(?s)FudanSELab/ClassEval.*save_to_disk.*data_path"):
        env.reset(seed=0)


def test_fixture_splits_oracle_and_env_step(data_path):
    env = llm_envs.make("coding/classeval-v0", data_path=data_path, max_new_tokens=1024)
    task = env.task
    assert len(task.problems("train")) == 66 and len(task.problems("eval")) == 16
    assert task.problems("eval")[0]["task_id"] == "ClassEval_66"
    for index in (0, 1):  # a Counter and a Stack (with a static method)
        env.reset(options={"split": "eval", "task_index": index})
        _, rewards, _, _, infos = env.step(task.solve(env.problem))
        assert rewards == {"coder_1": 6.0, "coder_2": 6.0}
        assert infos["coder_1"]["reward_tests"] == 4.0
    prompt = env.text("coder_1")
    assert "You write these methods of Stack67: pop, size." in prompt and "class Stack67:" in prompt


def test_multi_turn_diagnostics_plain_feedback_and_sequential(data_path):
    env = llm_envs.make("coding/classeval-v0", data_path=data_path, num_turns=2, test_timeout_s=1.0)
    env.reset(options={"split": "eval", "task_index": 0})
    env.step({"coder_1": GET + "def reset(self)\n    pass\n", "coder_2": "def add(self, n):\n    return n\n"})
    prompt = env.text("coder_1")
    assert "Your previous methods:" in prompt and "Diagnostics of the merged class:" in prompt
    assert "- reset: written, but does NOT parse" in prompt and "- Tests: 2/4 passed" in prompt
    assert "CounterTestAdd.test_add: failed: AssertionError: 2 != 3" in env.text("coder_2")
    plain = llm_envs.make("coding/classeval-v0", data_path=data_path, num_turns=2, feedback="plain")
    plain.reset(options={"split": "eval", "task_index": 0})
    plain.step({"coder_1": GET, "coder_2": ""})
    assert "Your previous methods:" in plain.text("coder_1") and "Diagnostics" not in plain.text("coder_1")
    seq = llm_envs.make("coding/classeval-v0", data_path=data_path, protocol="sequential")
    seq.reset(options={"split": "eval", "task_index": 0})
    seq.step(GET)
    assert "Your teammate wrote these methods:" in seq.text("coder_2") and "return self.value" in seq.text("coder_2")
