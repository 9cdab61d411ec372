"""A vector env of coding envs hands the programs of a whole step to the sandbox at once."""

from __future__ import annotations

import collections

import llm_envs.rewards.coding as coding_rewards
import llm_envs.tasks.coding as coding_task
from llm_envs.core.vector import VectorEnv

WRONG = "def {name}(*args):\n    return None\n"


def test_a_vector_env_runs_the_programs_of_a_step_in_one_batch(monkeypatch):
    batches = []
    real_run_many = coding_rewards.run_many

    def spy(jobs):
        batches.append(len(jobs))
        return real_run_many(jobs)

    monkeypatch.setattr(coding_rewards, "run_many", spy)
    monkeypatch.setattr(coding_task, "_scores", collections.OrderedDict())  # nothing scored yet
    venv = VectorEnv("coding/humaneval-v0", num_envs=6, max_new_tokens=1024)
    venv.reset(seed=0, options=[{"task_index": i} for i in (0, 0, 1, 1, 2, 2)])
    problems = [env.problem for env in venv.envs]
    mains = [p["prompt"] + p["canonical_solution"] if i % 2 == 0 else WRONG.format(name=p["entry_point"])
             for i, p in enumerate(problems)]
    _, rewards, terms, _, infos = venv.step({"helper": [""] * 6, "main": mains})
    assert batches == [6]  # one call for the whole step; each env's reward then came from the cache
    # Canonical: main defined 0.6 + syntax 0.5 + all tests 1.0; wrong: 0.6 + 0.5 + no test.
    assert rewards["main"].round(6).tolist() == [2.1, 1.1] * 3
    assert infos["main"]["reward_tests"].tolist() == [1.0, 0.0] * 3 and terms["main"].all()


def test_scoring_one_by_one_gives_what_the_batch_gave(monkeypatch):
    monkeypatch.setattr(coding_task, "_scores", collections.OrderedDict())
    task = coding_task.CodingTask()
    problems = [task.problems("eval")[i] for i in (3, 4)]
    turns = [(p, {"helper": "", "main": p["prompt"] + p["canonical_solution"]}) for p in problems]
    task.prepare_rewards(turns)
    batched = [task.reward(p, outputs) for p, outputs in turns]
    monkeypatch.setattr(coding_task, "_scores", collections.OrderedDict())
    assert [task.reward(p, outputs) for p, outputs in turns] == batched
    assert [round(total, 6) for total, _ in batched] == [2.1, 2.1]
