"""Class-level code completion (ClassEval): two agents write the empty methods of one Python class.

=====================  ==========================================================================
Id                     ``coding/classeval-v0``
Protocol               parallel (both agents write at once, as in the reference); with
                       ``protocol="sequential"`` coder_2 also sees coder_1's methods of the same turn
Agents                 ``coder_1`` (the reference's agent 0), ``coder_2`` (agent 1): each writes its
                       assigned methods, function definitions only
Observation / action   token ids (see :mod:`llm_envs.core.base`); max_new_tokens 512,
                       max_prompt_tokens 3072 (a ClassEval skeleton is up to ~1500 tokens)
Reward                 :mod:`llm_envs.rewards.classeval` (max 6.0), the same joint value to both
                       agents; components in infos as ``reward_<name>``
Episode                one turn by default; ``num_turns >= 2`` gives each agent its previous methods
                       and the test and syntax diagnostics (``feedback="diagnostics"``, default) or
                       nothing but them (``feedback="plain"``; the env's ``transition="plain"`` is the
                       reference's plain self-revision prompt)
=====================  ==========================================================================

Data: HF hub ``FudanSELab/ClassEval``, split ``test`` (100 classes; fields ``task_id``, ``skeleton``,
``test``, ``class_name``, ``solution_code``, ...). As in the reference, train = classes 0-65, eval =
classes 66-81 (classes 82-99 are in neither). ``data_path=`` reads a local copy in the same schema (a
``save_to_disk`` directory or a jsonl/json/parquet file); without it and without the hub the error says
how to make one.

The methods to write are those of the class with an empty body (a docstring, ``pass``, ``...`` or
``raise NotImplementedError``); the skeleton's ``__init__`` and other implemented methods stay. Who
writes which (task argument ``split``):

===============  =========================================================================
``reference``    methods whose only parameter is ``self`` to coder_1, the others to coder_2
                 (the reference's rule; one agent may get none)
``round_robin``  alternating in class order, coder_1 first
``by_name``      alphabetical order, the first half (rounded up) to coder_1
===============  =========================================================================

Prompt: the whole skeleton, the agent's own method list (and its teammate's), "function definitions
only". Reward (see :mod:`llm_envs.rewards.classeval`):

=============  ===========  ==========================================================================
component      value        when
=============  ===========  ==========================================================================
``valid``      0 .. 2       2 x share of the methods whose assigned agent wrote them and they parse
``tests``      0 .. 4       4 x share of the class's unittest test methods that pass on the merged class
``overlap``    -1 .. 0      -1 x share of the methods written by more than one agent
=============  ===========  ==========================================================================

0 in all when the merged class does not compile. The class and its tests run in
:mod:`llm_envs.sandbox` (the isolation of the HumanEval envs), in two processes: the tests in one that
holds no generated code, the class in the other, every use of the class crossing between them as plain
data (see :mod:`llm_envs.rewards.classeval`). Each test method is judged on its own with
``test_timeout_s`` (default 5 s), the whole class ``timeout_s`` (default 30 s); a test that hangs fails
and the step returns. The sandbox has the standard library only: the few
ClassEval classes that import third-party packages (numpy, PIL, ...) cannot pass there.
:meth:`ClassEvalTask.solve` splits the row's ``solution_code`` between the agents (the oracle).

Task arguments: ``data_path``, ``split`` (above), ``feedback`` (``"diagnostics"`` | ``"plain"``),
``timeout_s``, ``test_timeout_s``.

Version history: v0 (initial).
"""

from __future__ import annotations

import collections
import functools
import threading
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from llm_envs.core.registry import register
from llm_envs.core.task import Context, Problem, Prompt, Response, Task
from llm_envs.data import load_rows
from llm_envs.rewards.classeval import (
    COMPONENTS,
    MAX_REWARD,
    PASSED,
    SPLIT_RULES,
    ClassScore,
    assign_methods,
    extract_methods,
    methods_to_write,
    score_classes,
)
from llm_envs.sandbox import SandboxLimits

DATASET = "FudanSELab/ClassEval"
HUB_SPLIT = "test"
TRAIN = slice(0, 66)
EVAL = slice(66, 82)
ROLES = ("coder_1", "coder_2")
FEEDBACK_MODES = ("diagnostics", "plain")
TIMEOUT_S = 30.0
TEST_TIMEOUT_S = 5.0
MAX_FAILED_TESTS_SHOWN = 5
SCORE_CACHE_SIZE = 1024

PROMPT = """Complete this Python class together with a teammate. The class skeleton:

{skeleton}

You write these methods of {class_name}: {mine}.
{others}
Output ONLY the function definitions of your methods (each starting with "def", with self as its first \
parameter), no class line, no explanations, no other methods."""
NO_METHODS = """Complete this Python class together with a teammate. The class skeleton:

{skeleton}

Your teammate writes every method of {class_name} that is left to write ({others}). You have nothing to \
write: reply with nothing."""
OTHERS = "Your teammate writes the others ({others}); do not write them."
ALONE = "Your teammate has no methods to write in this class."
SEQUENTIAL_TEAMMATE = "\n\nYour teammate wrote these methods:\n"
PREVIOUS = "\n\nYour previous methods:\n"
FEEDBACK_HEADER = "\n\nDiagnostics of the merged class:\n"
REVISE = "\nWrite your methods again, fixed. Output ONLY the function definitions."


# --------------------------------------------------------------------------------------------- data
REQUIRED_FIELDS = ("task_id", "skeleton", "test", "class_name")


@functools.lru_cache(maxsize=16)
def _problems(split: str, data_path: str | None, rule: str) -> tuple[dict[str, Any], ...]:
    rows = load_rows(DATASET, HUB_SPLIT, data_path=data_path)
    chosen = rows[TRAIN] if split == "train" else rows[EVAL]
    out = []
    for row in chosen:
        missing = [f for f in REQUIRED_FIELDS if not isinstance(row.get(f), str)]
        if missing:
            raise ValueError(f"Rows of {DATASET} need string fields {list(REQUIRED_FIELDS)}; missing or not a "
                             f"string: {missing} in a row with fields {sorted(row)}.")
        methods = methods_to_write(row["skeleton"], row["class_name"])
        solution = row.get("solution_code")
        out.append({
            "task_id": row["task_id"], "class_name": row["class_name"], "skeleton": row["skeleton"],
            "test": row["test"], "solution_code": solution if isinstance(solution, str) else "",
            "methods": tuple(name for name, _ in methods), "owners": assign_methods(methods, rule),
        })
    return tuple(out)


# --------------------------------------------------------------------------------------------- scores
_ScoreKey = tuple[tuple[str, ...], str, str, str, tuple[int, ...], SandboxLimits]
_scores: collections.OrderedDict[_ScoreKey, ClassScore] = collections.OrderedDict()
_scores_lock = threading.Lock()


def _score_many(keys: Sequence[_ScoreKey]) -> list[ClassScore]:
    """The scores of ``keys`` (cached; the missing ones run concurrently in the sandbox)."""
    with _scores_lock:
        todo = [k for k in dict.fromkeys(keys) if k not in _scores]
    by_limits: dict[SandboxLimits, list[_ScoreKey]] = {}
    for key in todo:
        by_limits.setdefault(key[5], []).append(key)
    for limits, group in by_limits.items():
        scores = score_classes([k[0] for k in group], [k[1] for k in group], [k[2] for k in group],
                               [k[3] for k in group], [k[4] for k in group], limits)
        with _scores_lock:
            for key, score in zip(group, scores, strict=True):
                _scores[key] = score
    with _scores_lock:
        out = []
        for key in keys:
            _scores.move_to_end(key)
            out.append(_scores[key])
        while len(_scores) > SCORE_CACHE_SIZE:
            _scores.popitem(last=False)
        return out


def diagnostics(score: ClassScore, role_index: int, roles: Sequence[str] = ROLES) -> list[str]:
    """The test and syntax diagnostics of a joint attempt, from one agent's point of view."""
    mine = [m for m, o in zip(score.methods, score.owners, strict=True) if o == role_index]
    lines = []
    for name in mine:
        if name in score.valid:
            lines.append(f"- {name}: written, parses")
        elif name in score.invalid:
            lines.append(f"- {name}: written, but does NOT parse")
        else:
            lines.append(f"- {name}: MISSING (not in your reply)")
    others = [m for m in score.written[role_index] if m not in mine]
    if others:
        lines.append(f"- You also wrote {', '.join(others)}, which your teammate writes: only the assigned "
                     "agent's version is used")
    if score.overlap:
        lines.append(f"- Written by both agents: {', '.join(score.overlap)}")
    if score.compile_error is not None:
        lines.append(f"- The merged class does NOT compile ({score.compile_error}): score 0")
        return lines
    lines.append("- The merged class compiles")
    execution = score.execution
    if execution is None or not execution.outcomes:
        lines.append("- Tests: none found")
        return lines
    lines.append(f"- Tests: {execution.passed}/{execution.total} passed")
    failed = [(i, o) for i, o in zip(score.test_ids, execution.outcomes, strict=False) if o.status != "passed"]
    for test_id, outcome in failed[:MAX_FAILED_TESTS_SHOWN]:
        message = outcome.message
        prefix = f"expected {PASSED!r}, got "
        if message.startswith(prefix):  # the harness's verdict: "failed: ...", "error: ...", "skipped"
            lines.append(f"  {test_id}: {message[len(prefix):].strip(chr(34) + chr(39))}")
        else:
            lines.append(f"  {test_id}: {outcome.status}: {message}")
    if len(failed) > MAX_FAILED_TESTS_SHOWN:
        lines.append(f"  ... and {len(failed) - MAX_FAILED_TESTS_SHOWN} more")
    return lines


# --------------------------------------------------------------------------------------------- task
class ClassEvalTask(Task):
    """Two agents complete one ClassEval class (see the module docstring).

    Args:
        data_path: a local copy of ``FudanSELab/ClassEval`` (default: the hub).
        split: who writes which method: ``"reference"``, ``"round_robin"`` or ``"by_name"``.
        feedback: ``"diagnostics"`` or ``"plain"`` (multi-turn).
        timeout_s: the whole class's wall-clock budget in the sandbox.
        test_timeout_s: one test method's.
    """

    roles: ClassVar[tuple[str, ...]] = ROLES
    reward_components: ClassVar[tuple[str, ...]] = COMPONENTS
    max_reward: ClassVar[float] = MAX_REWARD
    default_max_new_tokens: ClassVar[int] = 512
    default_max_prompt_tokens: ClassVar[int] = 3072
    description: ClassVar[str] = (
        "Two coders write the empty methods of a ClassEval class; the merged class runs its unittest tests in "
        "the sandbox (HF hub FudanSELab/ClassEval, or data_path)."
    )

    def __init__(self, data_path: str | None = None, split: str = "reference", feedback: str = "diagnostics",
                 timeout_s: float = TIMEOUT_S, test_timeout_s: float = TEST_TIMEOUT_S) -> None:
        if split not in SPLIT_RULES:
            raise ValueError(f"split must be one of {SPLIT_RULES}, got {split!r}.")
        if feedback not in FEEDBACK_MODES:
            raise ValueError(f"feedback must be one of {FEEDBACK_MODES}, got {feedback!r}.")
        self.data_path = None if data_path is None else str(data_path)
        self.split = split
        self.feedback_mode = feedback
        self.limits = SandboxLimits(timeout_s=timeout_s, test_timeout_s=test_timeout_s,
                                    cpu_time_s=max(1, int(timeout_s) + 1))

    def problems(self, split: str) -> Sequence[Problem]:
        return _problems(self.check_split(split), self.data_path, self.split)

    def assigned(self, problem: Problem, role: str) -> list[str]:
        index = self.roles.index(role)
        return [m for m, o in zip(problem["methods"], problem["owners"], strict=True) if o == index]

    def prompt(self, role: str, problem: Problem, context: Context) -> Prompt:
        if role not in self.roles:
            raise KeyError(f"Unknown role {role!r}; this task's roles are {self.roles}.")
        mine = self.assigned(problem, role)
        others = [m for m in problem["methods"] if m not in mine]
        if mine:
            text = PROMPT.format(skeleton=problem["skeleton"].strip("\n"), class_name=problem["class_name"],
                                 mine=", ".join(mine),
                                 others=OTHERS.format(others=", ".join(others)) if others else ALONE)
        else:
            text = NO_METHODS.format(skeleton=problem["skeleton"].strip("\n"), class_name=problem["class_name"],
                                     others=", ".join(others))
        parts: list[str | Response] = [text]
        if role == "coder_2" and "coder_1" in context.visible:
            parts += [SEQUENTIAL_TEAMMATE, context.visible["coder_1"]]
        previous = context.previous(role)
        if previous is not None:
            feedback = context.feedback(role) or ""
            parts += [PREVIOUS, previous, (FEEDBACK_HEADER + feedback) if feedback else "", REVISE]
        return parts

    def _key(self, problem: Problem, outputs: Mapping[str, str]) -> _ScoreKey:
        missing = [r for r in self.roles if not isinstance(outputs.get(r), str)]
        if missing:
            raise ValueError(f"outputs need a string for each role {self.roles}; missing {missing}.")
        return (tuple(outputs[r] for r in self.roles), problem["skeleton"], problem["test"], problem["class_name"],
                tuple(problem["owners"]), self.limits)

    def score(self, problem: Problem, outputs: Mapping[str, str]) -> ClassScore:
        """The full :class:`~llm_envs.rewards.classeval.ClassScore` of a joint attempt (cached)."""
        return _score_many([self._key(problem, outputs)])[0]

    def prepare_rewards(self, turns: Sequence[tuple[Problem, Mapping[str, str]]]) -> None:
        _score_many([self._key(problem, outputs) for problem, outputs in turns])

    def reward(self, problem: Problem, outputs: Mapping[str, str]) -> tuple[float, dict[str, float]]:
        score = self.score(problem, outputs)
        return score.total, dict(score.components)

    def feedback(
        self, problem: Problem, outputs: Mapping[str, str], total: float, components: Mapping[str, float]
    ) -> dict[str, str]:
        if self.feedback_mode == "plain":
            return dict.fromkeys(self.roles, "")
        score = self.score(problem, outputs)
        line = f"- Score: {total:.2f} of {self.max_reward:.1f}"
        return {role: "\n".join([*diagnostics(score, i, self.roles), line]) for i, role in enumerate(self.roles)}

    def solve(self, problem: Problem) -> dict[str, str]:
        """The row's ``solution_code`` split between the agents (each gets its assigned methods)."""
        if not problem["solution_code"]:
            raise ValueError(f"Class {problem['task_id']!r} has no solution_code to solve it with.")
        found = extract_methods(problem["solution_code"], problem["methods"])
        return {role: "\n".join(found.get(m, "") for m in self.assigned(problem, role)) for role in self.roles}


register("coding/classeval-v0", ClassEvalTask, protocol="parallel", description=ClassEvalTask.description)
