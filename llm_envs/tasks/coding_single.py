"""Single-agent coding (the MAGRPO paper's single-model baseline): one role writes the whole solution of
a HumanEval-form problem; the program runs against the problem's tests like the two-agent task's.

=====================  ==========================================================================
Ids                    ``coding/humaneval-single-v0`` (offline)
Protocol               parallel (one role; the sequential protocol is the same episode)
Agents                 ``coder``: writes the problem's entry-point function (the reference's
                       single-agent prompt, ``LLM_Collab_Code_Generation/train_grpo.py``)
Observation / action   token ids (see :mod:`llm_envs.core.base`); max_new_tokens 256, max_prompt_tokens 2048
Reward                 the two-agent reward (:mod:`llm_envs.rewards.coding`) of the response read as both
                       the helper's and main's text, as :func:`llm_envs.rewards.coding.coding_reward_func`
                       scores one model for TRL: ``aux`` and the entry point are each taken from it by name,
                       so a response without ``aux`` gets the levels that do not need it
                       (``main_defined`` 0.6 + ``syntax`` 0.5 + ``tests`` 0..1: at most 2.1);
                       components in infos as ``reward_<name>``
Episode                one turn by default; ``num_turns >= 2`` gives the coder its previous function and
                       the diagnostics of that attempt (those of ``coding/humaneval-v0``)
=====================  ==========================================================================

Compare it with the pair on what both are scored by in the same way: ``tests`` (the fraction of the
test assertions that pass) and pass@1 (every assertion passes); the total's aux levels exist only for
the pair. Data, splits and task arguments (``source``, ``data_path``, ``timeout_s``,
``test_timeout_s``) are :class:`llm_envs.tasks.coding.CodingTask`'s.

Version history: v0 (initial).

>>> import llm_envs
>>> env = llm_envs.make("coding/humaneval-single-v0")
>>> obs, infos = env.reset(seed=0, options={"split": "eval", "task_index": 0})
>>> _, rewards, _, _, infos = env.step({"coder": "def has_close_elements(numbers, threshold):\\n    return []\\n"})
>>> rewards["coder"], infos["coder"]["reward_tests"]
(1.1, 0.0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from llm_envs.core.registry import register
from llm_envs.core.task import Context, Problem, Prompt, Response, Task
from llm_envs.rewards.coding import COMPONENTS, MAX_REWARD, CodeScore
from llm_envs.tasks.coding import (
    FEEDBACK_HEADER,
    PREVIOUS_ATTEMPT,
    REVISE,
    CodingTask,
    diagnostics,
    single_agent_prompt,
)

ROLE = "coder"


class SingleCoderTask(Task):
    """One role writes the entry point of a coding problem (see the module docstring).

    Args:
        source, data_path, timeout_s, test_timeout_s: as for :class:`llm_envs.tasks.coding.CodingTask`.
    """

    roles: ClassVar[tuple[str, ...]] = (ROLE,)
    reward_components: ClassVar[tuple[str, ...]] = COMPONENTS
    default_max_new_tokens: ClassVar[int] = CodingTask.default_max_new_tokens
    default_max_prompt_tokens: ClassVar[int] = CodingTask.default_max_prompt_tokens
    max_reward: ClassVar[float] = MAX_REWARD
    description = "Single-agent code generation: one coder writes the entry point."

    def __init__(
        self,
        source: str = "humaneval",
        data_path: str | None = None,
        timeout_s: float = 10.0,
        test_timeout_s: float = 3.0,
    ) -> None:
        # The two-agent task holds the data, its splits, the argument checks and the scoring.
        self._pair = CodingTask(source=source, data_path=data_path, timeout_s=timeout_s,
                                test_timeout_s=test_timeout_s)
        self.source = source

    def problems(self, split: str) -> Sequence[Problem]:
        return self._pair.problems(split)

    def prompt(self, role: str, problem: Problem, context: Context) -> Prompt:
        if role != ROLE:
            raise ValueError(f"Unknown role {role!r}; expected one of {self.roles}.")
        entry_point = problem["entry_point"]
        parts: list[str | Response] = [single_agent_prompt(problem["prompt"], entry_point, helper=False)]
        previous = context.previous(role)
        if previous is not None:
            parts += [PREVIOUS_ATTEMPT["main"].format(entry_point=entry_point), previous,
                      FEEDBACK_HEADER + (context.feedback(role) or "")]
        return parts

    def _as_pair(self, outputs: Mapping[str, str]) -> dict[str, str]:
        text = outputs.get(ROLE)
        if not isinstance(text, str):
            raise ValueError(f"outputs need a string for the role {ROLE!r}; got {sorted(outputs)}.")
        return {"helper": text, "main": text}

    def score(self, problem: Problem, outputs: Mapping[str, str]) -> CodeScore:
        """The full :class:`~llm_envs.rewards.coding.CodeScore` of an attempt (cached)."""
        return self._pair.score(problem, self._as_pair(outputs))

    def prepare_rewards(self, turns: Sequence[tuple[Problem, Mapping[str, str]]]) -> None:
        """Score a vector env's attempts with all their programs running concurrently."""
        self._pair.prepare_rewards([(problem, self._as_pair(outputs)) for problem, outputs in turns])

    def reward(self, problem: Problem, outputs: Mapping[str, str]) -> tuple[float, dict[str, float]]:
        score = self.score(problem, outputs)
        return score.total, dict(score.components)

    def feedback(
        self, problem: Problem, outputs: Mapping[str, str], total: float, components: Mapping[str, float]
    ) -> dict[str, str]:
        entry_point = problem["entry_point"]
        lines = diagnostics(self.score(problem, outputs), entry_point, aux=False)
        lines += [f"- Score: {total:.2f} of {self.max_reward:.1f}", "", REVISE["main"].format(entry_point=entry_point)]
        return {ROLE: "\n".join(lines)}


register(
    "coding/humaneval-single-v0",
    SingleCoderTask,
    protocol="parallel",
    source="humaneval",
    description="One coder writes the entry point of the 164 HumanEval problems (the MAGRPO paper's "
    "single-model baseline; offline; splits of coding/humaneval-v0).",
)
