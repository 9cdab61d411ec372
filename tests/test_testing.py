"""llm_envs.testing: the quickstart's task passes every check in one call; deliberately broken tasks and envs
each fail the check of the property they break, with a message naming it (and the agent and problem where
known); the report lists what was skipped and why; the pytest plugin and ``env_test``; no torch."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import llm_envs
from llm_envs.core.base import LLMEnvCore
from llm_envs.core.parallel import ParallelLLMEnv
from llm_envs.testing import CHECKS, CheckReport, EnvCheckError, check_env, check_task, describe_checks

PROBLEMS = [{"topic": "tides"}, {"topic": "volcanoes"}, {"topic": "glaciers"}]
PROMPTS = {"writer": "Write one sentence about {topic}.", "critic": "Name one fact about {topic} a writer might miss."}


def mentions_topic(problem, outputs) -> float:
    """The quickstart's reward, at module level so that envs of the task pickle."""
    return float(problem["topic"] in outputs["writer"])


def echo_task(reward=mentions_topic, problems=PROBLEMS) -> llm_envs.TemplateTask:
    return llm_envs.TemplateTask(roles=("writer", "critic"), problems=problems, prompts=PROMPTS, reward=reward)


@pytest.fixture
def echo_id() -> str:
    """The quickstart's task, registered when a test asks for it (not at import: the contract tests
    parametrize over the registry as collected)."""
    llm_envs.register("mine/echo-v0", echo_task, description="Mention the topic.")  # again: the same definition
    return "mine/echo-v0"


def test_the_quickstart_task_passes_every_check_in_one_call(echo_id):
    report = check_env(echo_id)
    assert isinstance(report, CheckReport) and report.ok
    assert list(report.passed) == list(CHECKS) and report.skipped == {}
    assert report.notes["reward_bounds"] == [
        "bounds: the task declares neither max_reward nor min_reward (finite floats checked)"]
    assert str(report).splitlines()[0] == f"check_env('mine/echo-v0'): {len(CHECKS)} passed, 0 skipped, 0 failed"
    assert set(describe_checks()) == set(CHECKS)


def test_the_report_says_what_was_skipped_and_why(echo_id):
    report = check_env("sentiment/imdb-cory-v0", checks=["pettingzoo_parallel", "pettingzoo_aec", "truncation"])
    assert report.skipped == {"pettingzoo_parallel": "the task runs under the sequential protocol only",
                              "truncation": "truncation needs 2 turns per episode; the task allows 1"}
    assert report.notes["pettingzoo_aec"] == ["the parallel protocol: the task (or the env given) does not run it"]
    table = str(report)
    assert "SKIP  truncation" in table and "PASS  pettingzoo_aec" in table
    # An env object is copied, never rebuilt: checks that need other arguments say so.
    env = llm_envs.make(echo_id)
    report = check_env(env, checks=["token_mode", "spaces"])
    assert list(report.passed) == ["spaces"]
    assert report.skipped["token_mode"].startswith("needs the env rebuilt with max_new_tokens=5: check it by id")
    assert not env._started  # the checks ran on copies


def test_bad_arguments_fail_clearly(echo_id):
    with pytest.raises(ValueError, match=r"Unknown check\(s\) \['speed'\]; the checks are \['pettingzoo_parallel'"):
        check_env(echo_id, checks=["speed"])
    with pytest.raises(KeyError, match="Unknown env id 'mine/echo-v9'"):
        check_env("mine/echo-v9")
    with pytest.raises(TypeError, match="for a Task object call check_task"):
        check_env(echo_task())
    with pytest.raises(TypeError, match=r"make kwargs \['num_turns'\] apply to an env id only"):
        check_env(llm_envs.make(echo_id), num_turns=2)


# ----------------------------------------------------------------------------------- broken tasks
def noisy_reward(problem, outputs) -> float:
    return float(np.random.default_rng().random())  # not seeded: a new draw every call


def first_word_reward(problem, outputs) -> float:
    return float(outputs["writer"].split()[0] == problem["topic"])  # IndexError on an empty response


class BoundedTask(llm_envs.TemplateTask):
    max_reward = 1.0


def too_high_reward(problem, outputs) -> float:
    return 2.0


class RotatingTask(llm_envs.TemplateTask):
    """problems() in another order on every call."""

    calls = 0

    def problems(self, split):
        RotatingTask.calls += 1
        items = list(super().problems(split))
        k = RotatingTask.calls % len(items)
        return items[k:] + items[:k]


class LockedTask(llm_envs.TemplateTask):
    def __init__(self) -> None:
        super().__init__(("writer", "critic"), PROBLEMS, PROMPTS, mentions_topic)
        self.lock = threading.Lock()


class BatchOrderTask(llm_envs.TemplateTask):
    """prepare_rewards scores a batch, but reward() hands the scores out last first."""

    def prepare_rewards(self, turns):
        self.scores = [float(len(outputs["writer"])) for _, outputs in turns]

    def reward(self, problem, outputs):
        if getattr(self, "scores", None):
            value = self.scores.pop()
            return value, {"reward": value}
        return super().reward(problem, outputs)


def writer_length(problem, outputs) -> float:
    return float(len(outputs["writer"]))


class LongObservation(ParallelLLMEnv):
    def _observation(self, role):
        obs = super()._observation(role)
        return {**obs, "observation": np.append(obs["observation"], 0)}


class LateInfoKey(ParallelLLMEnv):
    def _info(self, role, record, response, response_tokens=None):
        info = super()._info(role, record, response, response_tokens)
        return {**info, "late": 1} if record is not None else info


class StringInfo(ParallelLLMEnv):
    def _info(self, role, record, response, response_tokens=None):
        return {**super()._info(role, record, response, response_tokens), "note": "ok"}


class NewSpaces(ParallelLLMEnv):
    def observation_space(self, agent):
        import copy

        return copy.deepcopy(super().observation_space(agent))


class ClippedIds(ParallelLLMEnv):
    def parse_action(self, agent, action):
        if isinstance(action, np.ndarray) and action.dtype.kind == "i":
            action = np.clip(action, 0, self.vocab_size_of(agent) - 1)
        return super().parse_action(agent, action)


class KeepsJunk(ParallelLLMEnv):
    def parse_action(self, agent, action):
        if isinstance(action, np.ndarray):
            return self._make_response(agent, action.tolist())  # does not cut at the first EOS
        return super().parse_action(agent, action)


class ShoutedRender(ParallelLLMEnv):
    def render(self):
        text = super().render()
        return text.upper() if isinstance(text, str) else text


class NoResponses(ParallelLLMEnv):
    """A state that never shows a response."""

    def _latest_response(self, role):
        return None


class NewStateSpace(ParallelLLMEnv):
    @property
    def state_space(self):
        import copy

        return copy.deepcopy(super().state_space)


class StateBeforeReset(ParallelLLMEnv):
    def state(self):
        if not self._started:
            return {"observation": np.zeros(self.state_length, np.int64),
                    "attention_mask": np.zeros(self.state_length, np.int8)}
        return super().state()


class IdsOnlyState(ParallelLLMEnv):
    def state(self):
        return {"observation": super().state()["observation"]}


def env(cls, **kwargs):
    return cls(echo_task(), env_id="mine/echo-v0", **kwargs)


BROKEN = {
    "unseeded reward": (lambda: check_task(echo_task(noisy_reward), checks=["determinism"]),
                        r"determinism failed \(agent 'writer', problem train\[\d\] .*\): rewards differ between two "
                        r"episodes with seed 11 and the same actions.*\nHow to fix: .*global randomness"),
    "prompt longer than max_prompt_tokens": (
        lambda: check_task(echo_task(problems=[{"topic": "tides"}, {"topic": "waves " * 80}]), max_prompt_tokens=64,
                           checks=["spaces"]),
        r"spaces failed \(problem train\[1\] \{'topic': 'waves waves.*the prompt does not fit the observation: The "
        r"prompt of agent 'writer' .* has \d+ tokens but max_prompt_tokens=64"),
    "observation longer than its space": (
        lambda: check_env(env(LongObservation, max_prompt_tokens=64), checks=["spaces"]),
        r"spaces failed \(agent 'writer', problem train\[0\].*\): the observation is not in "
        r"observation_space\(agent\): "
        r"observation\['observation'\] has shape \(65,\), the space \(64,\)"),
    "infos keys change after reset": (
        lambda: check_env(env(LateInfoKey), checks=["infos"]),
        r"infos failed \(agent 'writer', .*turn 1\): infos keys changed between reset and step 1: added \['late'\], "
        r"removed \[\]"),
    "a string in the infos": (lambda: check_env(env(StringInfo), checks=["infos"]),
                              r"infos failed .*infos\['note'\] is 'ok' \(str\) at step 0: numbers only"),
    "spaces rebuilt on every call": (lambda: check_env(env(NewSpaces), checks=["spaces"]),
                                     r"spaces failed .*returns a new object on each call"),
    "reward raises on an empty response": (
        lambda: check_task(echo_task(first_word_reward), checks=["bad_actions"]),
        r"bad_actions failed \(problem train\[\d\].*\): a turn of empty strings raised IndexError: list index out of "
        r"range \(raised at .*test_testing.py:\d+ in first_word_reward\)"),
    "out-of-range ids accepted": (lambda: check_env(env(ClippedIds), checks=["bad_actions"]),
                                  r"bad_actions failed \(agent 'writer'.*\): token id 49152 "
                                  r"\(out of range \[0, 49151\]\) "
                                  r"was accepted; expected a ValueError"),
    "reward above the declared max_reward": (
        lambda: check_task(BoundedTask(("writer", "critic"), PROBLEMS, PROMPTS, too_high_reward),
                           checks=["reward_bounds"]),
        r"reward_bounds failed \(problem train\[0\].*turn 0\): the joint reward is 2.0, outside the declared "
        r"\[min_reward=-inf, max_reward=1.0\]"),
    "problems in another order on every call": (
        lambda: check_task(RotatingTask(("writer", "critic"), PROBLEMS, PROMPTS, mentions_topic), checks=["options"]),
        r"options failed \(agent 'writer', .*\): resets with task_index=2 of split 'train' and different seeds gave "
        r"different observations"),
    "a lock in the task": (lambda: check_task(LockedTask(), checks=["copy"]),
                           r"copy failed .*the env does not pickle or deep-copy: TypeError: "
                           r"cannot pickle '_thread.lock'"),
    "a lambda reward": (lambda: check_task(echo_task(lambda problem, outputs: 1.0), checks=["copy"]),
                        r"copy failed .*Can't pickle.*lambda.*\n"
                        r"How to fix: pickle stores a function by its import path"),
    "batch rewards handed out of order": (
        lambda: check_task(BatchOrderTask(("writer", "critic"), PROBLEMS, PROMPTS, writer_length), checks=["vector"]),
        r"vector failed \(agent '(writer|critic)', .*\): row 0's reward is [\d.]+, a single env's [\d.]+ \(step 0\)"),
    "str and id actions differ": (lambda: check_env(env(KeepsJunk), checks=["text_vs_ids"]),
                                  r"text_vs_ids failed \(agent 'writer', .*\): the text action 'The answer is 42, .*' "
                                  r"became the response .*, its ids the response"),
    "render is not the transcript": (lambda: check_env(env(ShoutedRender), checks=["render"]),
                                     r"render failed .*render\(\) in 'ansi' mode is not env.transcript\(\)"),
    "a state without the responses": (
        lambda: check_env(env(NoResponses), checks=["state"]),
        r"state failed \(problem train\[\d\].*turn 1\): after turn 1 the state does not hold the response of "
        r"'writer'"),
    "state_space rebuilt on every access": (lambda: check_env(env(NewStateSpace), checks=["state"]),
                                            r"state failed: state_space is a new object on each access"),
    "a state before reset": (lambda: check_env(env(StateBeforeReset), checks=["state"]),
                             r"state failed: state\(\) before reset\(\) returned a state; it must raise a "
                             r"RuntimeError"),
    "a state without its mask": (lambda: check_env(env(IdsOnlyState), checks=["state"]),
                                 r"state failed .*state\(\) is not in state_space: state has keys \['observation'\], "
                                 r"the space \['attention_mask', 'observation'\]"),
    "a prompt that raises": (
        lambda: check_task(llm_envs.TemplateTask(("writer",), PROBLEMS, {"writer": "About {subject}."}, mentions_topic),
                           checks=["pettingzoo_parallel"]),
        r"pettingzoo_parallel failed: PettingZoo's parallel_api_test failed: KeyError: .*uses the field 'subject'"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_task_fails_the_check_of_its_property(case):
    run, message = BROKEN[case]
    with pytest.raises(EnvCheckError, match=message) as caught:
        run()
    err = caught.value
    assert err.check in CHECKS and err.report is not None and list(err.report.failed) == [err.check]
    assert str(err).startswith(f"check_env('{err.subject}'): {err.check} failed") and "How to fix: " in str(err)


def test_token_mode_and_truncation_fail_when_the_env_breaks_them(monkeypatch, echo_id):
    step_token = ParallelLLMEnv._step_token

    def leaky(self, actions):  # a token step that pays a reward before the turn resolves
        obs, rewards, *rest = step_token(self, actions)
        return (obs, {a: 0.5 for a in rewards}, *rest)

    monkeypatch.setattr(ParallelLLMEnv, "_step_token", leaky)
    with pytest.raises(EnvCheckError, match=r"token_mode failed .*a step within the turn \(token 0\) returned rewards "
                                            r"\{'writer': 0.5, 'critic': 0.5\}"):
        check_env(echo_id, checks=["token_mode"], protocol="parallel")
    monkeypatch.setattr(LLMEnvCore, "_episode_over", lambda self: (self._turn >= self.num_turns, False))
    with pytest.raises(EnvCheckError, match=r"truncation failed .*with num_turns=3 and max_cycles=2 the episode "
                                            r"lasted 3 turns"):
        check_env(echo_id, checks=["truncation"])


def test_every_failure_is_collected_without_raising():
    report = check_task(echo_task(noisy_reward), raise_errors=False)
    assert not report.ok and "determinism" in report.failed and "spaces" in report.passed
    assert set(report.passed) | set(report.failed) | set(report.skipped) == set(CHECKS)
    assert "FAIL  determinism" in str(report)


# ------------------------------------------------------------------------------------ pytest, torch
MY_TASKS = '''
import numpy as np
import llm_envs


def mentions_topic(problem, outputs):
    return float(problem["topic"] in outputs["writer"])


def noisy(problem, outputs):
    return float(np.random.default_rng().random())


def task(reward):
    return lambda: llm_envs.TemplateTask(roles=("writer", "critic"), problems=[{"topic": "tides"}, {"topic": "sand"}],
                                         prompts={"writer": "About {topic}.", "critic": "Critique {topic}."},
                                         reward=reward)


llm_envs.register("mine/echo-v0", task(mentions_topic))
llm_envs.register("mine/noisy-v0", task(noisy))
'''


def test_pytest_plugin_and_env_test_one_line_per_env(tmp_path):
    (tmp_path / "my_tasks.py").write_text(MY_TASKS)
    (tmp_path / "test_mine.py").write_text(textwrap.dedent("""
        import sys

        import my_tasks  # noqa: F401
        from llm_envs.testing import env_test

        test_echo = env_test("mine/echo-v0", checks=["spaces", "determinism", "pettingzoo_parallel"])


        def test_zz_no_torch():
            assert "torch" not in sys.modules
        """))
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "llm_envs.testing.pytest_plugin", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), "-q", "--llm-envs-check", "my_tasks:mine/noisy-v0",
         "-k", "echo or no_torch or determinism or truncation or spaces", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "1 failed, 6 passed" in text, text
    assert "FAILED ::llm-envs-check[mine/noisy-v0::determinism]" in text, text
    assert "check_env('mine/noisy-v0'): determinism failed (agent 'writer'" in text, text
    assert "Traceback" not in text and "During handling" not in text, text
    unknown = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "llm_envs.testing.pytest_plugin", "--rootdir", str(tmp_path),
         "--llm-envs-check", "mine/unknown-v0", str(tmp_path / "test_mine.py")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert unknown.returncode == 4 and "'mine/unknown-v0' is not registered" in unknown.stderr, unknown.stderr


def test_the_pytest_command_imports_the_module_from_the_folder_it_runs_in(tmp_path):
    """docs/testing.md: ``pytest --llm-envs-check my_tasks:mine/echo-v0`` in the folder that holds my_tasks.py
    (the ``pytest`` command, unlike ``python -m pytest``, does not put the current folder on sys.path)."""
    from pathlib import Path

    (tmp_path / "my_tasks.py").write_text(MY_TASKS)
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}  # PYTHONPATH: this checkout, not tmp_path
    assert str(tmp_path) not in env.get("PYTHONPATH", "")
    out = subprocess.run(
        [str(Path(sys.executable).parent / "pytest"), "-p", "llm_envs.testing.pytest_plugin", "-p", "no:cacheprovider",
         "-q", "--llm-envs-check", "my_tasks:mine/echo-v0", "-k", "pettingzoo_parallel"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0 and "1 passed" in out.stdout, out.stdout + out.stderr


def test_the_official_checks_draw_the_same_random_actions_every_run():
    """PettingZoo's random agent samples from the env's action spaces: seeded, its episode is the same on
    every run, so a flat observation (no visible action mask) cannot make the check pass or fail by chance."""
    import llm_envs
    from llm_envs.testing.checks import seeded_spaces

    draws = []
    for _ in range(2):
        env = seeded_spaces(llm_envs.make("writing/xsum-v0", step_unit="token", max_new_tokens=4))
        draws.append([int(env.action_space(a).sample()) for a in env.possible_agents for _ in range(5)])
    assert draws[0] == draws[1] and len(set(draws[0])) > 1
