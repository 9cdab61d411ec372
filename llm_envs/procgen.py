"""What the procedurally generated task families share: seeded instances, the two splits, the tool
agent's sandboxed program, and the tool/planner task skeleton.

Families: :mod:`llm_envs.tasks.planning` (``planning/plan-path-v0``) and :mod:`llm_envs.tasks.puzzle`
(``puzzle/sudoku4-v0``, ``puzzle/sudoku9-v0``, ``puzzle/sokoban-v0``). Docs: ``docs/procgen.md``.

Instances and splits
--------------------
An instance is a pure function of its family, its generator parameters (the difficulty) and an
integer *instance seed*: ``random.Random("<family>/<params>/<seed>")`` drives the generator, which
draws only with ``random()`` (the one method whose sequence Python guarantees across versions), so
every machine and Python version generates the same instances.

Small families (a 6 x 6 Sokoban room with one box, a 4 x 4 Sudoku) give the same instance for
different seeds, so the splits are separated by instance, not only by seed. An instance is in the
*eval class* when the BLAKE2b hash of its content is 0 modulo :data:`EVAL_CLASS` (1 in 4):

=========  =====================================  ==============================================
split      ``task_index`` i                       instance
=========  =====================================  ==============================================
``eval``   0 .. 999 (:data:`EVAL_SIZE`)           the i-th distinct eval-class instance of seeds
                                                  0, 1, 2, ... (below 2**32)
``train``  0 .. 2**62 - 1 (:data:`TRAIN_SIZE`)    seed ``2**32 + i``; if that instance is in the
                                                  eval class, seed ``2**32 + i + 2**62``, and so on
=========  =====================================  ==============================================

So eval instances are distinct, no train instance is ever an eval instance, and both are the same on
every machine. ``reset(seed=s)`` draws the task index from the env's seeded generator, so the same
seed gives the same instance; ``options={"task_index": i, "split": "eval"}`` pins one. The train split
is generated on demand and never runs out of indices (a family with few distinct instances repeats
them, as sampling would).

The tool agent
--------------
The ``tool`` role writes a short Python program that prints its answer. The program runs in
:mod:`llm_envs.sandbox` (its own process, time and memory limits, scrubbed environment), never in the
env's process. The puzzle's data are predefined variables of the program (each family documents
them). What it prints is kept as printable ASCII (other characters become ``?``) and cut to
:data:`TOOL_OUTPUT_CHARS` characters; that is what the planner is shown and what the ``tool``
reward component scores. A program that fails to parse, raises, exits with a non-zero status, runs
past its time limit or is killed scores 0 on that component; nothing it does reaches the env's
process.

>>> run = run_tool_program("print(sum(range(n)))", {"n": 4})
>>> run.status, run.output
('ok', '6')
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from llm_envs.core.task import Context, Problem, Prompt, Response, Task
from llm_envs.rewards.coding import strip_fences
from llm_envs.sandbox import SandboxLimits, run_tests

MAX_ATTEMPTS = 1000
"""Random tries a generator makes for an instance that meets its level before it gives up."""
EVAL_SIZE = 1000
"""Instances of the eval split."""
EVAL_CLASS = 4
"""An instance is in the eval class when the hash of its content is 0 modulo this."""
TRAIN_SEED_OFFSET = 2**32
"""Eval instances come from seeds below this; train index i starts at seed TRAIN_SEED_OFFSET + i."""
TRAIN_SIZE = 2**62
"""Indices of the train split (generated on demand)."""
MAX_TRAIN_DRAWS = 64
"""Seeds tried for one train index before giving up (each is in the eval class with probability 1/4)."""
EVAL_SEEDS_PER_INSTANCE = 64
"""The eval split gives up when fewer than one seed in this many yields a new eval instance."""
LEVELS = ("easy", "medium", "hard")

TOOL_OUTPUT_CHARS = 400
"""The tool program's printed output is cut to this many characters."""
TOOL_TIMEOUT_S = 5.0
"""Default wall-clock limit of one tool program (task argument ``tool_timeout_s``)."""
TOOL_MEMORY_MB = 256
TOOL_REWARD = 0.5
"""The ``tool`` component: earned when the tool program's printed answer solves the instance."""
TOOL_MESSAGE_CHARS = 160
"""Error messages of tool programs are cut to this many characters."""
MAX_PROBLEMS_SHOWN = 5
"""Feedback lists at most this many problems of an answer."""
TOOL_STATUSES = ("ok", "no_program", "syntax_error", "error", "timeout", "crashed", "sandbox_error")

_TOOL_FILENAME = "<tool program>"
_TOOL_ENTRY = "tool_finished"
_TOOL_TESTS = "def check(candidate):\n    assert candidate() is True\n"
# The program runs the tool's source with exec() so that its printed output is flushed whatever it
# does, its own line numbers are reported, and `exit(0)` counts as a normal end.
_TOOL_WRAPPER = """\
import sys
_tool_globals = {{"__name__": "__main__", "__builtins__": __builtins__}}
_tool_globals.update({inputs})
try:
    exec(compile({source!r}, {filename!r}, "exec"), _tool_globals)
except SystemExit as _exit:
    if _exit.code not in (None, 0):
        raise RuntimeError("the program exited with status " + repr(_exit.code)[:80]) from None
except BaseException as _error:
    _line, _tb = None, _error.__traceback__
    while _tb is not None:
        if _tb.tb_frame.f_code.co_filename == {filename!r}:
            _line = _tb.tb_lineno
        _tb = _tb.tb_next
    _where = "" if _line is None else " at line " + str(_line)
    raise RuntimeError(type(_error).__name__ + _where + ": " + str(_error)[:300]) from None
finally:
    sys.stdout.flush()


def {entry}():
    return True
"""
_WRAPPED_ERROR = re.compile(r"^RuntimeError(?: \(line \d+\))?: (.*)$", re.DOTALL)


# ------------------------------------------------------------------------------------- seeding
def instance_random(family: str, params: tuple[Any, ...], seed: int) -> random.Random:
    """The generator of one instance. Generators draw only with ``random()`` (see :func:`below`)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"An instance seed must be an int >= 0, got {seed!r}.")
    return random.Random(f"{family}/{params!r}/{seed}")


def below(rng: random.Random, n: int) -> int:
    """An int in ``[0, n)`` from one ``random()`` draw (stable across Python versions, unlike
    ``randrange``)."""
    return int(rng.random() * n)


def shuffled(rng: random.Random, items: Sequence[Any]) -> list[Any]:
    """A Fisher-Yates shuffle of ``items`` drawn with :func:`below`."""
    out = list(items)
    for i in range(len(out) - 1, 0, -1):
        j = below(rng, i + 1)
        out[i], out[j] = out[j], out[i]
    return out


def split_size(split: str) -> int:
    if split == "eval":
        return EVAL_SIZE
    if split == "train":
        return TRAIN_SIZE
    raise ValueError(f"Unknown split {split!r}; expected 'train' or 'eval'.")


def instance_key(problem: Problem, fields: Sequence[str]) -> tuple[Any, ...]:
    """The content of an instance that identifies it (its seed excluded)."""
    return tuple(problem[f] for f in fields)


def in_eval_class(key: tuple[Any, ...]) -> bool:
    """Whether an instance with this content belongs to the eval split's class (1 in :data:`EVAL_CLASS`).

    >>> [i for i in range(20) if in_eval_class((i,))]
    [8]
    """
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % EVAL_CLASS == 0


Generator = Callable[..., dict]
"""``generator(seed, *params) -> instance``, a module-level function."""


@functools.lru_cache(maxsize=16384)
def generate_cached(generator: Generator, params: tuple[Any, ...], seed: int) -> dict:
    """``generator(seed, *params)``, cached per process (instances are immutable by convention)."""
    return generator(seed, *params)


class _EvalInstances:
    """The eval split of one generator and parameters, generated in seed order as far as asked."""

    def __init__(self, generator: Generator, params: tuple[Any, ...], fields: tuple[str, ...]) -> None:
        self.generator, self.params, self.fields = generator, params, fields
        self.instances: list[dict] = []
        self.keys: set[tuple[Any, ...]] = set()
        self.next_seed = 0

    def get(self, index: int) -> dict:
        while len(self.instances) <= index:
            if self.next_seed >= EVAL_SEEDS_PER_INSTANCE * (len(self.instances) + 1) + 1000:
                raise ValueError(
                    f"Only {len(self.instances)} distinct eval instances among seeds 0-{self.next_seed - 1} of "
                    f"{self.generator.__name__} with parameters {self.params}: these parameters give too few distinct "
                    f"instances for an eval split of {EVAL_SIZE}. Choose a larger or harder level."
                )
            problem = self.generator(self.next_seed, *self.params)
            self.next_seed += 1
            key = instance_key(problem, self.fields)
            if key not in self.keys and in_eval_class(key):
                self.keys.add(key)
                self.instances.append(problem)
        return self.instances[index]


@functools.lru_cache(maxsize=64)
def _eval_instances(generator: Generator, params: tuple[Any, ...], fields: tuple[str, ...]) -> _EvalInstances:
    return _EvalInstances(generator, params, fields)


class GeneratedSplit(Sequence[Problem]):
    """The instances of one split of a generator with fixed parameters, made on demand (see the module
    docstring for which instance each index is)."""

    def __init__(self, generator: Generator, params: tuple[Any, ...], fields: Sequence[str], split: str) -> None:
        split_size(split)
        self.generator, self.params, self.fields, self.split = generator, tuple(params), tuple(fields), split

    def __len__(self) -> int:
        return split_size(self.split)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        size = len(self)
        if isinstance(index, int) and not isinstance(index, bool) and index < 0:
            index += size
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < size:
            raise IndexError(f"task_index must be an int in [0, {size - 1}] for split {self.split!r}, got {index!r}.")
        if self.split == "eval":
            return _eval_instances(self.generator, self.params, self.fields).get(index)
        for k in range(MAX_TRAIN_DRAWS):
            problem = generate_cached(self.generator, self.params, TRAIN_SEED_OFFSET + index + k * TRAIN_SIZE)
            if not in_eval_class(instance_key(problem, self.fields)):
                return problem
        raise RuntimeError(f"Train index {index}: all {MAX_TRAIN_DRAWS} instances drawn for it are eval instances "
                           f"({self.generator.__name__}, parameters {self.params}).")

    def __iter__(self) -> Iterator[Problem]:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return f"GeneratedSplit({self.generator.__name__}, {self.params}, {self.split!r})"


# ------------------------------------------------------------------------------------- levels
def resolve_level(difficulty: str, presets: Mapping[str, Mapping[str, Any]], overrides: Mapping[str, Any]) -> dict:
    """The generator parameters of ``difficulty`` with the explicit ``overrides`` that are not None."""
    if difficulty not in presets:
        raise ValueError(f"difficulty must be one of {list(presets)}, got {difficulty!r}.")
    params = dict(presets[difficulty])
    params.update({k: v for k, v in overrides.items() if v is not None})
    return params


def check_int(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an int in [{low}, {high}], got {value!r}.")
    return value


def check_fraction(name: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError(f"{name} must be a number in [{low}, {high}], got {value!r}.")
    return float(value)


def labeled_grid(rows: Sequence[str]) -> str:
    """A grid of characters with its column numbers on top and row numbers on the left.

    >>> print(labeled_grid(["S.", "#G"]))
       0 1
    0  S .
    1  # G
    """
    width = len(str(max(len(rows), len(rows[0])) - 1))
    header = " " * (width + 2) + " ".join(str(c).rjust(width) for c in range(len(rows[0])))
    lines = [header]
    for r, row in enumerate(rows):
        lines.append(str(r).rjust(width) + "  " + " ".join(ch.rjust(width) for ch in row))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- tool programs
@dataclass(frozen=True)
class ToolRun:
    """What one tool program did."""

    status: str
    """One of :data:`TOOL_STATUSES`: ``ok`` (ran to the end), ``no_program`` (no code in the response),
    ``syntax_error``, ``error`` (raised, or exited with a non-zero status), ``timeout``, ``crashed``
    (killed: memory, processes, output size), ``sandbox_error`` (the sandbox itself failed)."""
    output: str
    """The printed output: printable ASCII, cut to :data:`TOOL_OUTPUT_CHARS` characters."""
    truncated: bool
    """Whether the output was longer than the limit."""
    message: str = ""
    """Why the program did not run to the end, in words ("" when it did)."""

    def __post_init__(self) -> None:
        if self.status not in TOOL_STATUSES:
            raise ValueError(f"status must be one of {TOOL_STATUSES}, got {self.status!r}.")
        # The message reaches prompts: printable, one line, bounded (it may quote the program).
        message = " ".join(printable(self.message).split())
        if len(message) > TOOL_MESSAGE_CHARS:
            message = message[: TOOL_MESSAGE_CHARS - 3] + "..."
        object.__setattr__(self, "message", message)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def describe(self) -> str:
        """The run in words, for prompts and feedback."""
        head = {
            "ok": "The program ran",
            "no_program": "No program was found",
            "syntax_error": "The program does not parse",
            "error": "The program failed",
            "timeout": "The program was stopped",
            "crashed": "The program was killed",
            "sandbox_error": "The program could not be run",
        }[self.status]
        text = head + (f" ({self.message})" if self.message else "") + "."
        if self.status in ("no_program", "syntax_error"):
            return text
        if not self.output:
            return text + " It printed nothing."
        cut = f" (cut at {TOOL_OUTPUT_CHARS} characters)" if self.truncated else ""
        return text + f" It printed{cut}:\n{self.output}"


def printable(text: str) -> str:
    """``text`` as printable ASCII: tabs become spaces, other non-printable characters ``?``.

    >>> printable("a\\tb\\u00e9\\n")
    'a b?\\n'
    """
    return "".join(ch if " " <= ch <= "~" or ch == "\n" else (" " if ch == "\t" else "?") for ch in text)


def tool_source(text: str) -> str:
    """The program in a tool response: the code inside markdown fences, or the whole text."""
    return strip_fences(text).strip("\n")


def _inputs_literal(inputs: Mapping[str, Any]) -> str:
    for name, value in inputs.items():
        if not name.isidentifier():
            raise ValueError(f"Tool input names must be identifiers, got {name!r}.")
        _check_plain(name, value)
    return "{" + ", ".join(f"{name!r}: {value!r}" for name, value in inputs.items()) + "}"


def _check_plain(name: str, value: Any) -> None:
    if isinstance(value, (list, tuple)):
        for v in value:
            _check_plain(name, v)
    elif not isinstance(value, (int, str)) or isinstance(value, bool):
        raise TypeError(f"Tool input {name!r} must be built from ints, strings, lists and tuples, got {value!r:.80}")


def run_tool_program(text: str, inputs: Mapping[str, Any], *, timeout_s: float = TOOL_TIMEOUT_S) -> ToolRun:
    """Run the program in a tool response (markdown fences removed) in the sandbox, with ``inputs``
    (ints, strings, lists and tuples) defined as variables; never raises for anything the program
    does. Results are cached per (program, inputs, timeout) in this process."""
    if not isinstance(text, str):
        raise TypeError(f"A tool response must be a string, got {type(text).__name__}: {text!r:.80}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < math.inf:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}.")
    return _run_tool(tool_source(text), _inputs_literal(inputs), float(timeout_s))


@functools.lru_cache(maxsize=2048)
def _run_tool(source: str, inputs: str, timeout_s: float) -> ToolRun:
    if not source.strip():
        return ToolRun("no_program", "", False, "the response holds no code")
    try:
        # Parsing in this process is safe: it runs nothing. The sandbox gets only programs that parse.
        compile(source, _TOOL_FILENAME, "exec", dont_inherit=True)
    except SyntaxError as err:
        return ToolRun("syntax_error", "", False, f"line {err.lineno}: {err.msg}")
    except (ValueError, RecursionError, MemoryError, OverflowError) as err:
        return ToolRun("syntax_error", "", False, f"{type(err).__name__}: {str(err)[:200]}")
    program = _TOOL_WRAPPER.format(inputs=inputs, source=source, filename=_TOOL_FILENAME, entry=_TOOL_ENTRY)
    limits = SandboxLimits(
        timeout_s=timeout_s,
        test_timeout_s=timeout_s,
        cpu_time_s=max(1, math.ceil(timeout_s)),
        memory_mb=TOOL_MEMORY_MB,
        max_output_bytes=4 * TOOL_OUTPUT_CHARS,
        max_timeouts=1,
        max_restarts=0,
    )
    result = run_tests(program, _TOOL_TESTS, _TOOL_ENTRY, limits=limits)
    shown = printable(result.stdout).rstrip()
    output, truncated = shown[:TOOL_OUTPUT_CHARS].rstrip(), len(shown) > TOOL_OUTPUT_CHARS
    if result.reason == "ok" and result.all_passed:
        return ToolRun("ok", output, truncated)
    if result.reason == "load_error" and result.load_error is not None:
        match = _WRAPPED_ERROR.match(result.load_error)
        return ToolRun("error", output, truncated, match.group(1) if match else result.load_error)
    if result.reason == "sandbox_error":
        return ToolRun("sandbox_error", output, truncated, result.load_error or "")
    if result.reason == "timeout":
        return ToolRun("timeout", output, truncated, f"no end within {timeout_s:g} s")
    messages = [o.message for o in result.outcomes if o.message]
    return ToolRun("crashed", output, truncated, messages[0] if messages else result.reason)


# ---------------------------------------------------------------------------------- the task skeleton
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
