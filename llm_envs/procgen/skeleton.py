"""The tool/planner task skeleton every generated puzzle family extends: the ``tool`` role writes a program
(run by :mod:`llm_envs.procgen.tools`), the ``planner`` gives the answer, with prompts, feedback over
turns and the ``tool`` reward component."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from llm_envs.core.task import Context, Problem, Prompt, Response, Task
from llm_envs.procgen.splits import GeneratedSplit, Generator, generate_cached
from llm_envs.procgen.tools import TOOL_OUTPUT_CHARS, TOOL_TIMEOUT_S, ToolRun, run_tool_program

TOOL_REWARD = 0.5
"""The ``tool`` component: earned when the tool program's printed answer solves the instance."""
MAX_PROBLEMS_SHOWN = 5
"""Feedback lists at most this many problems of an answer."""

TOOL_PROMPT = """Write a short Python program that solves this puzzle and prints the answer.

{task}

{board}

When your program runs, these variables are already defined:
{inputs}

The program must print only the answer: {tool_answer}. Use the standard library only. It is stopped \
after {timeout:g} seconds, and only the first {chars} characters it prints are read.
Output ONLY the Python code, no explanations."""

PLANNER_PROMPT = """{task}

{board}
{tool_section}
{answer}"""

TOOL_SECTION = "\nYour teammate wrote a program for this puzzle. {run}\n"
PREVIOUS_ANSWER = {"tool": "\n\nYour previous program:\n", "planner": "\n\nYour previous answer:\n"}
FEEDBACK_HEADER = "\n\nFeedback on that attempt:\n"
REVISE = {"tool": "\nWrite the program again, fixed. Output ONLY the Python code.",
          "planner": "\nAnswer again, fixed."}


def listing(problems: Sequence[str]) -> str:
    """Problems joined by "; " (at most :data:`MAX_PROBLEMS_SHOWN`, then how many more), or "correct".

    >>> listing([]), listing(["a", "b", "c", "d", "e", "f", "g"])
    ('correct', 'a; b; c; d; e; and 2 more problems')
    """
    if not problems:
        return "correct"
    shown = list(problems[:MAX_PROBLEMS_SHOWN])
    more = len(problems) - len(shown)
    return "; ".join(shown + ([f"and {more} more problem{'s' if more > 1 else ''}"] if more else []))


class ToolPlannerTask(Task):
    """Base of the generated families: roles ``tool`` (writes a program, run in the sandbox) and
    ``planner`` (answers, seeing the program's output under the sequential protocol). The joint reward
    is the planner's answer's components plus ``tool`` (:data:`TOOL_REWARD` when the program's printed
    answer solves the instance).

    Subclasses set ``generator`` (a staticmethod), ``key_fields``, ``answer_components``,
    ``reward_components`` (``answer_components`` + ``("tool",)``), ``max_reward``, the prompt texts
    ``task_text`` / ``answer_text`` / ``tool_answer_text`` / ``inputs_text``, ``reference_program``, and
    implement :meth:`params`, :meth:`board`, :meth:`tool_inputs`,
    :meth:`score_answer`, :meth:`solves`, :meth:`diagnose`, :meth:`render_answer`, :meth:`solve`.
    """

    roles: ClassVar[tuple[str, ...]] = ("tool", "planner")
    answer_components: ClassVar[tuple[str, ...]] = ()
    default_max_new_tokens: ClassVar[int] = 384  # a BFS program for Sokoban is about 300 tokens
    default_max_prompt_tokens: ClassVar[int] = 3072
    task_text: ClassVar[str] = ""
    """What the puzzle is, with the board's legend (both roles)."""
    answer_text: ClassVar[str] = ""
    """How the planner must answer."""
    tool_answer_text: ClassVar[str] = ""
    """What the tool program must print."""
    inputs_text: ClassVar[str] = ""
    """The program's predefined variables, one per line."""
    reference_program: ClassVar[str] = ""
    """A tool program that solves every instance (an oracle tool agent for tests and baselines)."""

    def __init__(self, tool_timeout_s: float = TOOL_TIMEOUT_S) -> None:
        if isinstance(tool_timeout_s, bool) or not isinstance(tool_timeout_s, (int, float)) or not (
            0 < tool_timeout_s <= 60
        ):
            raise ValueError(f"tool_timeout_s must be a number of seconds in (0, 60], got {tool_timeout_s!r}.")
        self.tool_timeout_s = float(tool_timeout_s)

    generator: ClassVar[Generator]
    """The family's generator, ``generator(seed, *self.params()) -> instance`` (a staticmethod)."""
    key_fields: ClassVar[tuple[str, ...]] = ()
    """The instance fields that identify it (two seeds giving equal fields give the same instance)."""

    # -- subclass interface
    def params(self) -> tuple[Any, ...]:
        """The generator's parameters at this task's difficulty."""
        raise NotImplementedError

    def board(self, problem: Problem) -> str:
        """The board as text, as both roles see it."""
        raise NotImplementedError

    def tool_inputs(self, problem: Problem) -> dict[str, Any]:
        """The tool program's predefined variables."""
        raise NotImplementedError

    def score_answer(self, problem: Problem, text: str) -> dict[str, float]:
        """The planner components of an answer text (keys :attr:`answer_components`)."""
        raise NotImplementedError

    def solves(self, problem: Problem, text: str) -> bool:
        """Whether the answer in ``text`` solves the instance."""
        raise NotImplementedError

    def diagnose(self, problem: Problem, text: str) -> list[str]:
        """What is wrong with the answer in ``text``, in words (empty when it is the best answer)."""
        raise NotImplementedError

    def render_answer(self, problem: Problem, text: str) -> str:
        """The board with the answer in ``text`` applied."""
        raise NotImplementedError

    def solve(self, problem: Problem) -> str:
        """The reference solver's answer (an optimal one), as the planner would write it."""
        raise NotImplementedError

    def answer_prompt(self, problem: Problem) -> str:
        """How the planner must answer (default :attr:`answer_text`)."""
        return self.answer_text

    def tool_answer_prompt(self, problem: Problem) -> str:
        """What the tool program must print (default :attr:`tool_answer_text`)."""
        return self.tool_answer_text

    # -- the Task interface
    def generate(self, seed: int) -> Problem:
        """The instance of instance seed ``seed`` at this task's difficulty (cached)."""
        return generate_cached(type(self).generator, self.params(), seed)

    def problems(self, split: str) -> Sequence[Problem]:
        return GeneratedSplit(type(self).generator, self.params(), self.key_fields, self.check_split(split))

    def run_tool(self, problem: Problem, text: str) -> ToolRun:
        """Run the tool response's program on this instance (cached)."""
        return run_tool_program(text, self.tool_inputs(problem), timeout_s=self.tool_timeout_s)

    def prompt(self, role: str, problem: Problem, context: Context) -> Prompt:
        task = self.task_text
        if role == "tool":
            parts: list[str | Response] = [TOOL_PROMPT.format(
                task=task, board=self.board(problem), inputs=self.inputs_text,
                tool_answer=self.tool_answer_prompt(problem), timeout=self.tool_timeout_s, chars=TOOL_OUTPUT_CHARS)]
        elif role == "planner":
            section = ""
            if "tool" in context.visible:
                run = self.run_tool(problem, context.visible["tool"].text)
                section = TOOL_SECTION.format(run=run.describe())
            parts = [PLANNER_PROMPT.format(task=task, board=self.board(problem), tool_section=section,
                                           answer=self.answer_prompt(problem))]
        else:
            raise KeyError(f"Unknown role {role!r}; this task's roles are {self.roles}.")
        previous = context.previous(role)
        if previous is not None:
            parts += [PREVIOUS_ANSWER[role], previous, FEEDBACK_HEADER + (context.feedback(role) or ""), REVISE[role]]
        return parts

    def _check_outputs(self, outputs: Mapping[str, str]) -> None:
        missing = [r for r in self.roles if not isinstance(outputs.get(r), str)]
        if missing:
            raise ValueError(f"outputs need a string for each role {self.roles}; missing {missing}.")

    def reward(self, problem: Problem, outputs: Mapping[str, str]) -> tuple[float, dict[str, float]]:
        self._check_outputs(outputs)
        components = self.score_answer(problem, outputs["planner"])
        run = self.run_tool(problem, outputs["tool"])
        components["tool"] = TOOL_REWARD if run.ok and self.solves(problem, run.output) else 0.0
        return sum(components.values()), components

    def feedback(
        self, problem: Problem, outputs: Mapping[str, str], total: float, components: Mapping[str, float]
    ) -> dict[str, str]:
        self._check_outputs(outputs)
        score = f"Team score: {total:.2f} of {self.max_reward:.2f}."
        planner = self.diagnose(problem, outputs["planner"])
        run = self.run_tool(problem, outputs["tool"])
        tool = [run.describe()]
        if run.ok:
            tool.append("Its answer: " + listing(self.diagnose(problem, run.output)) + ".")
        return {
            "tool": "\n".join([*tool, score]),
            "planner": "\n".join([
                "Your answer: " + listing(planner) + ".",
                "Your teammate's program: " + run.describe(),
                score,
            ]),
        }

    def render_turn(self, problem: Problem, outputs: Mapping[str, str]) -> str | None:
        self._check_outputs(outputs)
        run = self.run_tool(problem, outputs["tool"])
        tool = self.render_answer(problem, run.output) if run.ok else run.describe()
        return (f"planner's answer applied:\n{self.render_answer(problem, outputs['planner'])}\n"
                f"tool program's answer applied:\n{tool}")
