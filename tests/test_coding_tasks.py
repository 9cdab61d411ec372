"""Coding tasks: data and splits, prompts, rewards through the env, multi-turn feedback, hub fixtures."""

from __future__ import annotations

import concurrent.futures
import pickle

import pytest
from hub_fixtures import AREA_PROMPT, AREA_TEST, coophumaneval_rows, mbpp_rows, write_jsonl
from pettingzoo.test import api_test, parallel_api_test
from pettingzoo.utils.conversions import parallel_to_aec

import llm_envs
from llm_envs.core.task import Context, Response, TurnRecord
from llm_envs.data import DatasetUnavailableError
from llm_envs.tasks.coding import CodingTask, _humaneval_rows, mbpp_to_humaneval


@pytest.fixture(scope="module")
def humaneval_env():
    return llm_envs.make("coding/humaneval-v0")


def test_humaneval_splits_follow_the_reference():
    task = CodingTask()
    rows = _humaneval_rows()
    assert len(rows) == 164
    assert [p["task_id"] for p in task.problems("eval")] == [f"HumanEval/{i}" for i in range(32)]
    assert [p["task_id"] for p in task.problems("train")] == [f"HumanEval/{i}" for i in range(33, 163)]


def test_all_164_canonical_solutions_get_full_test_credit_through_the_task_reward():
    task = CodingTask()

    def run(row):
        return task.reward(row, {"helper": "", "main": row["prompt"] + row["canonical_solution"]})

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, _humaneval_rows()))
    failing = [row["task_id"] for row, (_, comp) in zip(_humaneval_rows(), results) if comp["tests"] != 1.0]
    assert failing == []
    # Without a helper the collaboration bonuses are out of reach: 0.6 + 0.5 + 1.0.
    assert {round(total, 6) for total, _ in results} == {2.1}


def test_prompts_tell_each_role_what_the_other_provides():
    task = CodingTask()
    problem = task.problems("eval")[0]
    helper = task.prompt("helper", problem, Context())
    main = task.prompt("main", problem, Context())
    assert problem["prompt"] in helper[0] and "helper function named 'aux'" in helper[0]
    assert "You have access to a helper function: aux(...)" in main[0]
    assert "Do NOT redefine the aux() function" in main[0]
    assert "def has_close_elements(numbers: List[float], threshold: float):" in main[0]
    aux = Response((1, 2), "def aux(a, b):\n    return abs(a - b)\n")
    sequential = task.prompt("main", problem, Context(visible={"helper": aux}))
    assert sequential[-1] is aux
    with pytest.raises(ValueError, match="Unknown role 'critic'"):
        task.prompt("critic", problem, Context())


def _feedback(task, problem, helper, main):
    outputs = {"helper": helper, "main": main}
    total, components = task.reward(problem, outputs)
    return task.feedback(problem, outputs, total, components)


def test_feedback_reports_failures_syntax_timeouts_and_aux_use():
    task = CodingTask(test_timeout_s=0.5, timeout_s=4.0)
    problem = {"task_id": "t/0", "prompt": AREA_PROMPT, "test": AREA_TEST, "entry_point": "area"}
    wrong = _feedback(task, problem, "def aux(r):\n    return r\n", "def area(r):\n    aux(r)\n    return 1.0\n")
    assert "- Tests: 0/2 passed" in wrong["main"]
    assert "Failed: assert candidate(0) == 0 -> expected 0, got 1.0" in wrong["main"]
    assert "called but its result is ignored (line 2" in wrong["main"]
    assert "Revise your aux(...)" in wrong["helper"] and "Revise your area(...)" in wrong["main"]
    assert "Aux usage" not in wrong["helper"]
    broken = _feedback(task, problem, "", "def area(r):\n    return (r\n")
    assert "Syntax: ERROR in the combined program at line" in broken["main"]
    assert "Aux definition: MISSING" in broken["helper"]
    slow = _feedback(task, problem, "", "def area(r):\n    while True:\n        pass\n    return 1\n")
    assert "Timeout: assert abs(candidate(1) - math.pi) < 1e-9 -> no result within 0.5 s" in slow["main"]
    assert "does NOT call aux" in slow["main"]


def test_multi_turn_env_puts_previous_code_and_feedback_in_the_next_prompt():
    env = llm_envs.make("coding/humaneval-v0", num_turns=2)
    env.reset(seed=0, options={"split": "eval", "task_index": 0})
    main = "def has_close_elements(numbers, threshold):\n    return False\n"
    _, rewards, terminations, _, infos = env.step({"helper": "def aux(x):\n    return x\n", "main": main})
    assert not any(terminations.values())
    assert rewards["main"] == pytest.approx(0.4 + 0.6 + 0.5 + 3 / 7)
    assert infos["main"]["reward_tests"] == pytest.approx(3 / 7)
    text = env.text("main")
    assert "Your previous has_close_elements(...):\ndef has_close_elements" in text
    assert "expected True, got False" in text and "does NOT call aux" in text
    assert "Your previous aux(...):\ndef aux(x)" in env.text("helper")


def test_env_reward_equals_the_task_reward_and_string_actions_work(humaneval_env):
    env = humaneval_env
    env.reset(seed=1, options={"split": "eval", "task_index": 2})
    problem = CodingTask().problems("eval")[2]
    helper = "def aux(number):\n    return int(number)\n"
    main = "def truncate_number(number: float) -> float:\n    whole = aux(number)\n    return number - whole\n"
    _, rewards, terminations, _, infos = env.step({"helper": helper, "main": main})
    total, components = CodingTask().reward(problem, {"helper": helper, "main": main})
    assert rewards == {"helper": pytest.approx(total), "main": pytest.approx(total)}
    assert total == pytest.approx(4.0) and all(terminations.values())
    assert infos["helper"]["reward_beyond_wrapper"] == 1.0


def test_pettingzoo_official_checks_on_the_coding_envs(tmp_path):
    kwargs = {"coding/humaneval-v0": {},
              "coding/coophumaneval-v0": {"data_path": write_jsonl(tmp_path / "che.jsonl", coophumaneval_rows())},
              "coding/mbpp-v0": {"data_path": write_jsonl(tmp_path / "mbpp.jsonl", mbpp_rows())}}
    for env_id, kw in kwargs.items():
        parallel_api_test(llm_envs.make(env_id, max_new_tokens=8, **kw), num_cycles=2)
        api_test(parallel_to_aec(llm_envs.make(env_id, max_new_tokens=8, **kw)), num_cycles=2)
    api_test(llm_envs.make("coding/humaneval-v0", protocol="sequential", max_new_tokens=8), num_cycles=2)


def test_coophumaneval_loads_a_local_copy_with_the_reference_split(tmp_path):
    path = write_jsonl(tmp_path / "che.jsonl", coophumaneval_rows())
    task = CodingTask(source="coophumaneval", data_path=path)
    assert [p["task_id"] for p in task.problems("eval")] == [f"CoopHumanEval/{i}" for i in range(16)]
    assert len(task.problems("train")) == 4
    problem = task.problems("train")[0]
    main = "def area16(r):\n    s = aux(r)\n    return math.pi * s\n"
    assert task.reward(problem, {"helper": "def aux(r):\n    return r * r\n", "main": main})[0] == pytest.approx(4.0)
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"task_id": "x", "prompt": "p"}])
    with pytest.raises(ValueError, match=r"missing or not a string: \['test', 'entry_point'\]"):
        CodingTask(source="coophumaneval", data_path=bad).problems("eval")


def test_mbpp_is_converted_to_humaneval_form(tmp_path):
    converted = mbpp_to_humaneval(mbpp_rows()[3], 3)
    assert converted["entry_point"] == "add_3"  # the function the tests call, not the first def
    assert converted["prompt"].startswith("def add_3(n: int):\n    '''Write a function to add 3")
    assert converted["test"] == (
        "import math\n\n\ndef check(candidate):\n    assert candidate(1) == 4\n    assert candidate(0) == 3\n"
    )
    path = write_jsonl(tmp_path / "mbpp.jsonl", mbpp_rows())
    task = CodingTask(source="mbpp", data_path=path)
    assert len(task.problems("eval")) == 32 and len(task.problems("train")) == 8
    problem = task.problems("eval")[5]
    assert task.reward(problem, {"helper": "", "main": "def add_5(n):\n    return n + 5\n"})[1]["tests"] == 1.0
    with pytest.raises(ValueError, match="needs a non-empty list of strings 'test_list'"):
        mbpp_to_humaneval({"prompt": "p", "code": "def f(): pass", "test_list": []}, 7)


def test_hub_sources_without_hub_fail_with_instructions():
    for source in ("coophumaneval", "mbpp"):
        with pytest.raises(DatasetUnavailableError, match="data_path="):
            CodingTask(source=source).problems("train")


def test_bad_arguments_and_cheap_pickling():
    with pytest.raises(ValueError, match="source must be one of .* got 'apps'"):
        CodingTask(source="apps")
    with pytest.raises(ValueError, match="data_path must be None, got 'x.jsonl'"):
        CodingTask(data_path="x.jsonl")
    with pytest.raises(ValueError, match="test_timeout_s must be a positive finite number, got 0"):
        CodingTask(test_timeout_s=0)
    task = CodingTask()
    task.problems("train")
    assert len(pickle.dumps(task)) < 600
    with pytest.raises(ValueError, match=r"missing \['main'\]"):
        task.reward(task.problems("eval")[0], {"helper": ""})


def test_turn_record_feedback_round_trip_through_context():
    task = CodingTask()
    problem = task.problems("eval")[0]
    previous = Response((5,), "def aux(x):\n    return x\n")
    record = TurnRecord(outputs={"helper": previous, "main": Response((6,), "x")}, reward=0.4, components={},
                        agent_rewards={}, feedback={"helper": "FEEDBACK-H", "main": "FEEDBACK-M"})
    parts = task.prompt("helper", problem, Context(turn=1, num_turns=2, history=(record,)))
    assert parts[1] == "\n\nYour previous aux(...):\n" and parts[2] is previous
    assert parts[3].endswith("FEEDBACK-H")


# --------------------------------------------------------------------------- one coder (single-agent baseline)
def test_single_coder_reads_the_reference_single_agent_prompt_and_scores_like_trl():
    from llm_envs.rewards.coding import coding_reward_func
    from llm_envs.tasks.coding_single import SingleCoderTask

    task = SingleCoderTask()
    assert [p["task_id"] for p in task.problems("eval")] == [f"HumanEval/{i}" for i in range(32)]
    problem = task.problems("eval")[2]
    (prompt,) = task.prompt("coder", problem, Context())
    assert "Implement ONLY the 'truncate_number' function" in prompt and "aux" not in prompt
    with pytest.raises(ValueError, match="Unknown role 'main'"):
        task.prompt("main", problem, Context())
    cases = {
        # entry point alone, right: 0.6 + 0.5 + 1.0 (the aux levels need a helper)
        "def truncate_number(number: float) -> float:\n    return number % 1.0\n": (2.1, 1.0),
        # aux written too, and used beyond a wrapper: every level, as the pair's best
        "def aux(n):\n    return int(n)\n\ndef truncate_number(number):\n    w = aux(number)\n    return number - w\n":
            (4.0, 1.0),
        # defined, parses, every assertion fails
        "def truncate_number(number):\n    return -1\n": (1.1, 0.0),
        "no code at all": (0.0, 0.0),
    }
    for text, (total, tests) in cases.items():
        got, components = task.reward(problem, {"coder": text})
        assert (round(got, 6), components["tests"]) == (total, tests), text
        assert got == pytest.approx(coding_reward_func(completions=[text], code_prompt=[problem["prompt"]],
                                                       test=[problem["test"]], entry_point=[problem["entry_point"]])[0])


def test_single_coder_env_turns_and_feedback_without_the_aux_line():
    env = llm_envs.make("coding/humaneval-single-v0", num_turns=2)
    env.reset(seed=0, options={"split": "eval", "task_index": 0})
    _, rewards, terminations, _, infos = env.step({"coder": "def has_close_elements(numbers, threshold):\n"
                                                            "    return False\n"})
    assert rewards["coder"] == pytest.approx(0.6 + 0.5 + 3 / 7) and not terminations["coder"]
    text = env.text("coder")
    assert "Your previous has_close_elements(...):" in text and "- Tests: 3/7 passed" in text
    assert "Aux definition" not in text and "Revise your has_close_elements(...)" in text
    parallel_api_test(llm_envs.make("coding/humaneval-single-v0", max_new_tokens=8), num_cycles=2)


def test_sequential_id_lets_main_read_the_helpers_aux():
    env = llm_envs.make("coding/humaneval-sequential-v0")
    env.reset(seed=0, options={"split": "eval", "task_index": 2})
    assert env.agent_selection == "helper"
    env.step("def aux(n):\n    return int(n)\n")
    assert "The helper function written for you (do not redefine it):\ndef aux(n)" in env.text("main")
