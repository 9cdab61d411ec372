"""Reward of the helper/main coding collaboration (MAGRPO's coding tasks), reference definition.

The ``helper`` role writes ``aux(...)``; the ``main`` role writes the problem's entry point and may
call ``aux``. Each role's function is taken from its text with ``ast`` (markdown fences removed,
stray top-level code dropped); the program is the problem's imports and helper definitions + aux +
main, run against the tests in :mod:`llm_envs.sandbox`.

=================  =======  ==============================================================
component          value    when
=================  =======  ==============================================================
``aux_defined``    +0.4     ``aux`` is defined and returns a value
``main_defined``   +0.6     the entry point is defined and returns a value (else: stop here)
``syntax``         +0.5     the combined program parses (else: stop here)
``tests``          0 .. 1   fraction of the test assertions that pass
``aux_call``       +0.5     >= 1 assertion passes, ``aux`` exists, and main calls ``aux``
``beyond_wrapper`` +1.0     as ``aux_call``, and main is more than ``return aux(...)``
``ignored_result`` -0.5     as ``aux_call``, and main calls ``aux`` as a bare statement
=================  =======  ==============================================================

Maximum 4.0. The components always sum to the total.

>>> from llm_envs.rewards.coding import score_collaboration
>>> score = score_collaboration(
...     aux="def aux(a, b):\\n    return a + b\\n",
...     main="def add3(a, b, c):\\n    s = aux(a, b)\\n    return s + c\\n",
...     prompt="def add3(a, b, c):\\n    '''Sum of three numbers.'''\\n",
...     test="def check(candidate):\\n    assert candidate(1, 2, 3) == 6\\n",
...     entry_point="add3",
... )
>>> score.total, score.components["beyond_wrapper"]
(4.0, 1.0)
"""

from __future__ import annotations

import ast
import functools
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llm_envs.rewards.trl import LogMetric, completion_texts, log_component_means, prompt_texts
from llm_envs.sandbox import DEFAULT_LIMITS, ExecutionResult, SandboxJob, SandboxLimits, parse_python, run_many

AUX_NAME = "aux"
MAX_REWARD = 4.0
AUX_DEFINED_REWARD = 0.4
MAIN_DEFINED_REWARD = 0.6
SYNTAX_REWARD = 0.5
TESTS_REWARD = 1.0
AUX_CALL_REWARD = 0.5
BEYOND_WRAPPER_REWARD = 1.0
IGNORED_RESULT_PENALTY = -0.5
COMPONENTS = ("aux_defined", "main_defined", "syntax", "tests", "aux_call", "beyond_wrapper", "ignored_result")

_FENCE = re.compile(r"```[ \t]*[\w+-]*[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def strip_fences(text: str) -> str:
    """The code inside markdown fences (all blocks joined), or the text itself when it has none.

    >>> strip_fences("Here:\\n```python\\ndef f():\\n    return 1\\n```\\nDone.")
    'def f():\\n    return 1\\n'
    """
    blocks = _FENCE.findall(text)
    return "\n".join(blocks) if blocks else text


def _line_block(code: str, name: str) -> str:
    """Fallback when the text does not parse: the lines of ``def name(`` up to its dedent."""
    lines = code.splitlines()
    pattern = re.compile(rf"^(\s*)(async\s+)?def\s+{re.escape(name)}\s*\(")
    for i, line in enumerate(lines):
        match = pattern.match(line)
        if not match:
            continue
        indent = len(match.group(1))
        start = i
        while start > 0 and lines[start - 1].strip().startswith("@"):
            start -= 1
        end = i + 1
        while end < len(lines):
            current = lines[end]
            if current.strip() and len(current) - len(current.lstrip()) <= indent:
                break
            end += 1
        return textwrap.dedent("\n".join(lines[start:end])).rstrip() + "\n"
    return ""


def extract_function(text: str, name: str) -> str:
    """Source of the top-level function ``name`` (with its decorators) in a model's output, or "".

    The last definition wins, as it would at run time. Text that does not parse as a whole falls back
    to the indented block starting at ``def name(``, so that a function with a syntax error is still
    found (and then fails the syntax level).
    """
    code = strip_fences(text)
    try:
        module = parse_python(code)
    except SyntaxError:
        return _line_block(code, name)
    found = ""
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            first = node.decorator_list[0] if node.decorator_list else node
            lines = code.splitlines()[first.lineno - 1 : node.end_lineno]
            found = textwrap.dedent("\n".join(lines)).rstrip() + "\n"
    return found


def _function_node(source: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    try:
        module = parse_python(source)
    except SyntaxError:
        return None
    for node in module.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return node
    return None


def _own_nodes(function: ast.AST):
    """Nodes of a function's body, not descending into nested functions, lambdas or classes."""
    stack = list(ast.iter_child_nodes(function))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def returns_value(source: str) -> bool:
    """Whether the function has a ``return <value>`` (the reference's "returns something")."""
    node = _function_node(source)
    if node is None:  # does not parse: the reference's textual check
        return re.search(r"^\s*return\s+\S", source, re.MULTILINE) is not None
    return any(isinstance(n, ast.Return) and n.value is not None for n in _own_nodes(node))


def _is_aux_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == AUX_NAME


def calls_aux(source: str) -> bool:
    node = _function_node(source)
    return node is not None and any(_is_aux_call(n) for n in ast.walk(node))


def _body_without_docstring(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.stmt]:
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(
        body[0].value.value, str
    ):
        body = body[1:]
    return [s for s in body if not isinstance(s, ast.Pass)]


def is_thin_wrapper(source: str) -> bool:
    """Whether main only forwards to aux: ``return <expr with aux(...)>`` alone, or ``v = aux(...)``
    followed by ``return v`` (the reference's two wrapper patterns), or an empty body."""
    node = _function_node(source)
    if node is None:
        return False
    body = _body_without_docstring(node)
    if not body:
        return True
    if len(body) == 1:
        only = body[0]
        return isinstance(only, ast.Return) and only.value is not None and any(
            _is_aux_call(n) for n in ast.walk(only.value)
        )
    if len(body) == 2:
        first, second = body
        return (
            isinstance(first, ast.Assign)
            and len(first.targets) == 1
            and isinstance(first.targets[0], ast.Name)
            and _is_aux_call(first.value)
            and isinstance(second, ast.Return)
            and isinstance(second.value, ast.Name)
            and second.value.id == first.targets[0].id
        )
    return False


def ignored_aux_calls(source: str) -> list[int]:
    """Line numbers (within main) of ``aux(...)`` calls used as bare statements (result thrown away)."""
    node = _function_node(source)
    if node is None:
        return []
    return sorted(n.lineno for n in ast.walk(node) if isinstance(n, ast.Expr) and _is_aux_call(n.value))


@functools.lru_cache(maxsize=1024)
def prompt_context(prompt: str, entry_point: str) -> tuple[str, str]:
    """``(imports, helpers)`` of a problem's prompt: its import lines and the functions it defines
    besides the entry point (HumanEval/32's ``poly``, /38's ``encode_cyclic``, ...). Both go into the
    program; the helpers are also run, as trusted dataset code, next to the tests that call them."""
    try:
        module = parse_python(prompt)
    except SyntaxError:
        imports = [line.strip() for line in prompt.splitlines()
                   if re.match(r"^\s*(from\s+[\w.]+\s+import\s+.+|import\s+[\w., ]+)$", line)]
        return "\n".join(dict.fromkeys(imports)), ""
    imports, helpers = [], []
    for node in module.body:
        segment = ast.get_source_segment(prompt, node) or ""
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(segment)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name != entry_point:
            first = node.decorator_list[0] if node.decorator_list else node
            helpers.append("\n".join(prompt.splitlines()[first.lineno - 1 : node.end_lineno]))
    return "\n".join(dict.fromkeys(imports)), "\n\n\n".join(helpers)


def combine_program(imports: str, helpers: str, aux: str, main: str) -> str:
    """The program the sandbox runs: imports, the prompt's helpers, aux, then main."""
    return "\n\n\n".join(part.strip("\n") for part in (imports, helpers, aux, main) if part.strip()) + "\n"


@dataclass(frozen=True)
class CodeScore:
    """Reward of one (aux, main) pair with everything the feedback needs."""

    total: float
    components: dict[str, float]
    aux_source: str
    main_source: str
    program: str
    syntax_error: str | None
    """``"line N, column C: message"`` of the combined program, when it does not parse."""
    execution: ExecutionResult | None
    """Sandbox result (None when the levels stopped before running tests)."""
    aux_called: bool
    thin_wrapper: bool
    ignored_aux_lines: tuple[int, ...]


def _static_part(aux: str, main: str, prompt: str, entry_point: str) -> tuple[dict[str, float], str, str, str,
                                                                            str | None, str]:
    components = dict.fromkeys(COMPONENTS, 0.0)
    aux_source = extract_function(aux, AUX_NAME)
    main_source = extract_function(main, entry_point)
    if aux_source and returns_value(aux_source):
        components["aux_defined"] = AUX_DEFINED_REWARD
    imports, helpers = prompt_context(prompt, entry_point)
    program = combine_program(imports, helpers, aux_source, main_source)
    syntax_error = None
    try:
        parse_python(program)
    except SyntaxError as err:
        syntax_error = f"line {err.lineno}, column {err.offset}: {err.msg}"
    return components, aux_source, main_source, program, syntax_error, combine_program(imports, helpers, "", "")


def _finish(components: dict[str, float], aux_source: str, main_source: str, program: str,
            syntax_error: str | None, execution: ExecutionResult | None) -> CodeScore:
    aux_called = bool(main_source) and calls_aux(main_source)
    wrapper = bool(main_source) and is_thin_wrapper(main_source)
    ignored = tuple(ignored_aux_calls(main_source)) if main_source else ()
    if execution is not None:
        components["tests"] = TESTS_REWARD * execution.fraction
        if execution.passed > 0 and aux_source and aux_called:
            components["aux_call"] = AUX_CALL_REWARD
            if not wrapper:
                components["beyond_wrapper"] = BEYOND_WRAPPER_REWARD
            if ignored:
                components["ignored_result"] = IGNORED_RESULT_PENALTY
    total = float(sum(components.values()))
    return CodeScore(total, components, aux_source, main_source, program, syntax_error, execution,
                     aux_called, wrapper, ignored)


def score_collaborations(
    aux: Sequence[str],
    main: Sequence[str],
    prompt: Sequence[str],
    test: Sequence[str],
    entry_point: Sequence[str],
    limits: SandboxLimits = DEFAULT_LIMITS,
) -> list[CodeScore]:
    """Score a batch of (aux, main) pairs; the programs run concurrently in the sandbox."""
    columns = {"aux": aux, "main": main, "prompt": prompt, "test": test, "entry_point": entry_point}
    lengths = {name: len(values) for name, values in columns.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"All inputs must have the same length, got {lengths}.")
    for name, values in columns.items():
        for i, value in enumerate(values):
            if not isinstance(value, str):
                raise TypeError(f"{name}[{i}] must be a str, got {type(value).__name__}: {value!r:.80}")
    partial, jobs = [], []
    for a, m, p, t, e in zip(aux, main, prompt, test, entry_point):
        components, aux_source, main_source, program, syntax_error, test_globals = _static_part(a, m, p, e)
        defined = bool(main_source) and returns_value(main_source)
        if defined:
            components["main_defined"] = MAIN_DEFINED_REWARD
            if syntax_error is None:
                components["syntax"] = SYNTAX_REWARD
        runs = defined and syntax_error is None
        partial.append((components, aux_source, main_source, program, syntax_error, runs))
        if runs:
            jobs.append(SandboxJob(program, t, e, test_globals=test_globals, limits=limits))
    results = iter(run_many(jobs))
    return [
        _finish(components, aux_source, main_source, program, syntax_error, next(results) if runs else None)
        for components, aux_source, main_source, program, syntax_error, runs in partial
    ]


def score_collaboration(
    aux: str, main: str, prompt: str, test: str, entry_point: str, limits: SandboxLimits = DEFAULT_LIMITS
) -> CodeScore:
    """Score one (aux, main) pair; see the module docstring for the table."""
    return score_collaborations([aux], [main], [prompt], [test], [entry_point], limits)[0]


def collaboration_reward(
    *,
    aux_completions: Sequence[str],
    main_completions: Sequence[str],
    prompt: Sequence[str],
    test: Sequence[str],
    entry_point: Sequence[str],
    limits: SandboxLimits = DEFAULT_LIMITS,
    **unused_columns: object,
) -> list[float]:
    """Batch reward of (aux, main) pairs written by two models: keyword columns in, one float per pair
    out. TRL's ``GRPOTrainer`` trains one model and never passes these names (it passes ``prompts``
    and ``completions``): give it :func:`coding_reward_func`.

    >>> collaboration_reward(aux_completions=["def aux(x):\\n    return x\\n"],
    ...                      main_completions=["no code"], prompt=["def f(x):\\n    pass\\n"],
    ...                      test=["def check(candidate):\\n    assert candidate(1) == 1\\n"],
    ...                      entry_point=["f"])
    [0.4]
    """
    scores = score_collaborations(aux_completions, main_completions, prompt, test, entry_point, limits)
    return [s.total for s in scores]


def coding_reward_func(
    completions: Sequence[Any],
    *,
    test: Sequence[str] | None = None,
    entry_point: Sequence[str] | None = None,
    code_prompt: Sequence[str] | None = None,
    prompts: Sequence[Any] | None = None,
    limits: SandboxLimits = DEFAULT_LIMITS,
    log_metric: LogMetric | None = None,
    **unused_columns: Any,
) -> list[float]:
    """TRL ``reward_funcs`` entry for one model writing both functions: each completion is scored as
    if it were both the helper's and main's text (``aux`` and the entry point are taken from it by
    name, so a completion without ``aux`` gets the levels that do not need it: the reference's
    single-agent baseline).

    Dataset columns, named as a HumanEval-style dataset carries them: ``test`` (``def
    check(candidate): ...``) and ``entry_point``. The problem's code (its imports, and the helper
    functions some problems define, such as HumanEval/32's ``poly``) comes from ``code_prompt`` when the
    dataset has that column, else from the prompts TRL passes (``prompts``: the ``prompt`` column,
    which TRL reserves), which works when the prompt is the problem's code itself. When the prompt
    wraps it in instructions (:func:`llm_envs.tasks.coding.single_agent_prompt`), carry the code as
    ``code_prompt``. Completions are str or conversations. With TRL's ``log_metric`` the batch means of
    the components go to the trainer's logs as ``coding/<component>``.

    >>> coding_reward_func(completions=["def f(x):\\n    return x\\n"], prompts=["def f(x):\\n    pass\\n"],
    ...                    test=["def check(candidate):\\n    assert candidate(1) == 1\\n"], entry_point=["f"])
    [2.1]
    """
    texts = completion_texts(completions)
    if test is None or entry_point is None:
        raise ValueError(
            "coding_reward_func needs the dataset columns 'test' and 'entry_point' (as in HumanEval); got "
            f"columns {sorted(unused_columns)}"
        )
    if code_prompt is not None:
        problems = list(code_prompt)
    elif prompts is not None:
        problems = prompt_texts(prompts)
    else:
        raise ValueError("coding_reward_func needs the problem's code: a 'code_prompt' column, or TRL's prompts")
    scores = score_collaborations(texts, texts, problems, list(test), list(entry_point), limits)
    log_component_means(log_metric, "coding", [s.components for s in scores])
    return [s.total for s in scores]
