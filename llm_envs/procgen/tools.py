"""The tool agent's program, run in the sandbox.

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
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llm_envs.rewards.coding import strip_fences
from llm_envs.sandbox import SandboxLimits, run_tests

TOOL_OUTPUT_CHARS = 400
"""The tool program's printed output is cut to this many characters."""
TOOL_TIMEOUT_S = 5.0
"""Default wall-clock limit of one tool program (task argument ``tool_timeout_s``)."""
TOOL_MEMORY_MB = 256
TOOL_MESSAGE_CHARS = 160
"""Error messages of tool programs are cut to this many characters."""
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
