"""Class-level code completion reward (``coding/classeval-v0``): two agents write the empty methods of a
ClassEval class; the merged class runs the class's unittest tests in :mod:`llm_envs.sandbox`.

The methods to write are those of the class whose body is empty: only a docstring, ``pass``, ``...`` or
``raise NotImplementedError``. Each is assigned to one agent. From each agent's text (markdown fences
removed, dedented) every ``def`` of a method to write is taken, at the top level or inside a ``class``;
stray code is never run. An agent's method is *valid* when it is there and parses. The merged class is
the skeleton with every valid method replacing its stub, taken from the agent it is assigned to. It is
compiled in this process (compiling runs nothing); then it runs in the sandbox, each test method
judged on its own with its own time limit.

=============  ===========  ==========================================================================
component      value        when
=============  ===========  ==========================================================================
``valid``      0 .. 2       2 x (methods whose assigned agent wrote them and they parse) / (methods)
``tests``      0 .. 4       4 x (unittest test methods that pass on the merged class) / (test methods)
``overlap``    -1 .. 0      -1 x (methods written by more than one agent) / (methods)
=============  ===========  ==========================================================================

All three are 0 when the merged class does not compile. Maximum 6.0.

The verdict never shares a process with generated code. Each class runs as a sandbox *driver/peer*
pair (``SandboxJob.peer``): the tests' process (the driver) holds the skeleton's module-level code, the
unittest tests and a proxy in place of each class of the skeleton (:data:`DRIVER_HARNESS`); the merged
class runs in the class's process (the peer) beside it, in the same scratch directory (a test that
writes a file for the class to read, or reads the class's file, works as in one process). Every use of
a class (building one, calling a method, reading, setting or deleting an attribute, the special
methods the skeleton's class defines) is a call into the class's process, and what comes back is plain
data, a reference to an object there (a proxy: equal only to itself, no truth value) or an opaque value
for an object of a type the program made (equal only to itself, no truth value). An exception crosses
as its type name and message and is raised again in the tests' process as that builtin type (or a new
exception class of that name). Lists, dicts and sets read from attributes are views: mutating one
mutates the attribute in the class's process, and views are refreshed after every call; a list, dict
or set passed to a method comes back as the method left it. So a class changes which tests pass only
through what its methods return: a patched ``unittest``, patched builtins, an always-equal object, an
early exit or a forged frame act in its own process only. No deny-list is needed (the one this reward
had refused honest ``eval`` and ``re.compile`` in 3 real classes).

>>> skeleton = "class Box:\\n    def get(self):\\n        '''The value.'''\\n"
>>> methods_to_write(skeleton, "Box")
[('get', True)]
"""

from __future__ import annotations

import ast
import functools
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llm_envs.rewards.classeval_harness import (  # the programs that run in the sandbox
    _DRIVER_ENTRY,
    _PEER_HARNESS,
    DRIVER_HARNESS,
    ENTRY_POINT,
    FORWARDED_DUNDERS,
    PASSED,
)
from llm_envs.rewards.coding import _line_block, strip_fences
from llm_envs.sandbox import AST_LOCK, ExecutionResult, SandboxJob, SandboxLimits, parse_python, run_many

VALID_REWARD = 2.0
TESTS_REWARD = 4.0
OVERLAP_PENALTY = -1.0
COMPONENTS = ("valid", "tests", "overlap")
MAX_REWARD = VALID_REWARD + TESTS_REWARD

def _is_stub(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    body = list(node.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(
        body[0].value.value, str
    ):
        body = body[1:]
    for stmt in body:
        if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)):
            continue
        if isinstance(stmt, ast.Raise) and stmt.exc is not None:
            exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
            if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
                continue
        return False
    return True


def _class_node(module: ast.Module, class_name: str) -> ast.ClassDef:
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return node
    raise ValueError(f"The skeleton defines no class {class_name!r}.")


def methods_to_write(skeleton: str, class_name: str) -> list[tuple[str, bool]]:
    """The class's methods with an empty body, in order, each with whether ``self`` is its only
    parameter (the reference gives those to agent 0)."""
    module = parse_python(skeleton)
    out = []
    for node in _class_node(module, class_name).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_stub(node):
            args = node.args
            names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
            self_only = names == ["self"] and args.vararg is None and args.kwarg is None
            out.append((node.name, self_only))
    return out


SPLIT_RULES = ("reference", "round_robin", "by_name")


def assign_methods(methods: Sequence[tuple[str, bool]], rule: str, num_agents: int = 2) -> tuple[int, ...]:
    """The agent (0 or 1) of each method: ``reference`` (methods whose only parameter is ``self`` to agent
    0, the rest to agent 1), ``round_robin`` (alternating in class order) or ``by_name`` (alphabetical
    order, the first half to agent 0).

    >>> m = [("get", True), ("add", False), ("clear", True), ("set", False)]
    >>> assign_methods(m, "reference"), assign_methods(m, "round_robin"), assign_methods(m, "by_name")
    ((0, 1, 0, 1), (0, 1, 0, 1), (1, 0, 0, 1))
    """
    if rule == "reference":
        return tuple(0 if self_only else 1 for _, self_only in methods)
    if rule == "round_robin":
        return tuple(i % num_agents for i in range(len(methods)))
    if rule == "by_name":
        order = sorted(range(len(methods)), key=lambda i: methods[i][0])
        half = (len(methods) + 1) // 2
        rank = {i: r for r, i in enumerate(order)}
        return tuple(0 if rank[i] < half else 1 for i in range(len(methods)))
    raise ValueError(f"split must be one of {SPLIT_RULES}, got {rule!r}.")


def extract_methods(text: str, names: Sequence[str]) -> dict[str, str]:
    """The ``def`` of each of ``names`` in a response (top level or inside a class; the last one wins),
    dedented; a name the response does not define is absent. Text that does not parse as a whole falls
    back to the indented block of ``def name(`` (found, then judged by :func:`parses`).

    >>> extract_methods("    def get(self):\\n        return 1\\n", ["get", "put"])
    {'get': 'def get(self):\\n    return 1\\n'}
    """
    code = textwrap.dedent(strip_fences(text).expandtabs(4))
    wanted = set(names)
    found: dict[str, str] = {}
    try:
        module = parse_python(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        for name in names:
            block = _line_block(code, name)
            if block:
                found[name] = block
        return found
    lines = code.splitlines()
    nodes = [n for n in module.body]
    nodes += [m for n in module.body if isinstance(n, ast.ClassDef) for m in n.body]
    for node in nodes:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in wanted:
            found[node.name] = textwrap.dedent("\n".join(lines[node.lineno - 1 : node.end_lineno])).rstrip() + "\n"
    return found


def parses(source: str, name: str) -> bool:
    """Whether ``source`` parses as exactly one definition of ``name``."""
    try:
        module = parse_python(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return len(module.body) == 1 and isinstance(module.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) and (
        module.body[0].name == name
    )


def merge_class(skeleton: str, class_name: str, methods: Mapping[str, str]) -> str:
    """The skeleton with each stub named in ``methods`` replaced by that source (re-indented to the
    class body; the stub's decorators kept)."""
    module = parse_python(skeleton)
    lines = skeleton.splitlines()
    replacements = []
    for node in _class_node(module, class_name).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in methods:
            indent = lines[node.lineno - 1][: node.col_offset]
            source = methods[node.name]
            if node.decorator_list:  # the stub's decorators stay; the agent's are dropped
                kept = source.splitlines()
                while kept and kept[0].lstrip().startswith("@"):
                    kept.pop(0)
                source = "\n".join(kept)
            body = textwrap.indent(source.rstrip("\n"), indent, lambda line: True)
            replacements.append((node.lineno - 1, node.end_lineno, body.splitlines()))
    for start, end, body in sorted(replacements, reverse=True):
        lines[start:end] = body
    return "\n".join(lines) + "\n"


def _proxy_line(node: ast.ClassDef) -> str:
    methods, dunders = [], []
    for item in node.body:
        if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        decorators = {ast.unparse(d) for d in item.decorator_list}
        if item.name in FORWARDED_DUNDERS:
            dunders.append(item.name)
        elif not (item.name.startswith("__") and item.name.endswith("__")) and decorators <= {"staticmethod",
                                                                                                "classmethod"}:
            methods.append(item.name)
    return f"{node.name} = _ce_proxy_class({node.name!r}, {tuple(methods)!r}, {tuple(dunders)!r})"


@functools.lru_cache(maxsize=256)
def driver_program(skeleton: str, tests: str) -> str:
    """The tests' side of a class's run, after :data:`DRIVER_HARNESS` (the job's prelude): the skeleton's
    module-level code (its imports, which the tests use too) with each class replaced by a proxy to the
    class's process, then the tests and the entry point. It holds no generated code: only the
    skeleton's module level and the tests, dataset text."""
    parts = []
    with AST_LOCK:
        for node in parse_python(skeleton).body:
            if isinstance(node, ast.ClassDef):
                parts.append(_proxy_line(node))
            else:
                parts.append(ast.get_source_segment(skeleton, node) or ast.unparse(node))
    return "\n".join(parts) + "\n\n" + tests + _DRIVER_ENTRY


def peer_program(program: str, skeleton: str) -> str:
    """The class's side: the merged class and a harness serving its objects by reference."""
    names = tuple(node.name for node in parse_python(skeleton).body if isinstance(node, ast.ClassDef))
    return program + _PEER_HARNESS % {"names": names}


def unittest_ids(tests: str) -> list[str]:
    """``Class.method`` of every test method of the unittest classes in ``tests``, in source order.

    >>> unittest_ids("import unittest\\nclass T(unittest.TestCase):\\n    def test_a(self):\\n        pass\\n")
    ['T.test_a']
    """
    module = parse_python(tests)
    out = []
    for node in module.body:
        if not isinstance(node, ast.ClassDef):
            continue
        bases = [b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "") for b in node.bases]
        if "TestCase" not in bases:
            continue
        out += [f"{node.name}.{m.name}" for m in node.body
                if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name.startswith("test")]
    return out


def check_source(ids: Sequence[str]) -> str:
    """The sandbox's ``check(candidate)``: one assertion per test method."""
    return "def check(candidate):\n" + "".join(f"    assert candidate({i!r}) == {PASSED!r}\n" for i in ids)


@dataclass(frozen=True)
class ClassScore:
    """The full result of one joint attempt at one class."""

    components: dict[str, float]
    methods: tuple[str, ...]
    owners: tuple[int, ...]
    written: tuple[tuple[str, ...], ...]
    """Per agent: the methods to write that its text defines."""
    valid: tuple[str, ...]
    """Methods written by their assigned agent that parse."""
    invalid: tuple[str, ...]
    """Methods their assigned agent wrote that do not parse."""
    overlap: tuple[str, ...]
    program: str
    compile_error: str | None = None
    execution: ExecutionResult | None = None
    test_ids: tuple[str, ...] = ()

    @property
    def total(self) -> float:
        return sum(self.components.values())


def _static(texts: Sequence[str], skeleton: str, class_name: str, owners: Sequence[int]) -> ClassScore:
    methods = tuple(name for name, _ in methods_to_write(skeleton, class_name))
    if len(owners) != len(methods):
        raise ValueError(f"{len(owners)} owners for {len(methods)} methods to write of {class_name!r}.")
    extracted = [extract_methods(text, methods) for text in texts]
    written = tuple(tuple(m for m in methods if m in found) for found in extracted)
    valid, invalid, chosen = [], [], {}
    for name, owner in zip(methods, owners, strict=True):
        source = extracted[owner].get(name)
        if source is None:
            continue
        if parses(source, name):
            valid.append(name)
            chosen[name] = source
        else:
            invalid.append(name)
    overlap = tuple(m for m in methods if sum(m in found for found in extracted) > 1)
    program = merge_class(skeleton, class_name, chosen)
    n = max(1, len(methods))
    components = {"valid": VALID_REWARD * len(valid) / n, "tests": 0.0, "overlap": OVERLAP_PENALTY * len(overlap) / n}
    compile_error = None
    try:
        with AST_LOCK:
            compile(program, "<class>", "exec", dont_inherit=True)
    except SyntaxError as err:
        compile_error = f"line {err.lineno}: {err.msg}"
    except (ValueError, RecursionError, MemoryError, OverflowError) as err:
        compile_error = f"{type(err).__name__}: {str(err)[:200]}"
    if compile_error is not None:
        components = dict.fromkeys(COMPONENTS, 0.0)
    return ClassScore(components, methods, tuple(owners), written, tuple(valid), tuple(invalid), overlap, program,
                      compile_error)


def _job(score: ClassScore, skeleton: str, tests: str, limits: SandboxLimits) -> SandboxJob | None:
    if score.compile_error is not None:
        return None
    ids = unittest_ids(tests)
    if not ids:
        return None
    return SandboxJob(driver_program(skeleton, tests), check_source(ids), ENTRY_POINT, limits=limits,
                      peer=peer_program(score.program, skeleton), prelude=DRIVER_HARNESS)


def _finish(score: ClassScore, tests: str, result: ExecutionResult | None) -> ClassScore:
    if result is None:
        return score
    components = dict(score.components)
    components["tests"] = TESTS_REWARD * result.fraction
    return ClassScore(components, score.methods, score.owners, score.written, score.valid, score.invalid,
                      score.overlap, score.program, score.compile_error, result, tuple(unittest_ids(tests)))


def score_classes(
    texts: Sequence[Sequence[str]],
    skeletons: Sequence[str],
    tests: Sequence[str],
    class_names: Sequence[str],
    owners: Sequence[Sequence[int]],
    limits: SandboxLimits,
) -> list[ClassScore]:
    """Score many joint attempts (``texts[i]``: one text per agent), their programs running concurrently
    in the sandbox."""
    statics = [_static(t, s, c, o) for t, s, c, o in zip(texts, skeletons, class_names, owners, strict=True)]
    jobs = [_job(score, skeleton, test, limits)
            for score, skeleton, test in zip(statics, skeletons, tests, strict=True)]
    todo = [job for job in jobs if job is not None]
    results = iter(run_many(todo))
    return [_finish(score, test, next(results) if job is not None else None)
            for score, test, job in zip(statics, tests, jobs, strict=True)]


def score_class(
    texts: Sequence[str], skeleton: str, tests: str, class_name: str, owners: Sequence[int], limits: SandboxLimits
) -> ClassScore:
    """Score one joint attempt (see the module docstring)."""
    return score_classes([texts], [skeleton], [tests], [class_name], [owners], limits)[0]


def classeval_reward(
    *,
    completions: Sequence[Sequence[str]],
    skeleton: Sequence[str],
    test: Sequence[str],
    class_name: Sequence[str],
    owners: Sequence[Sequence[int]],
    limits: SandboxLimits | None = None,
    **kwargs: object,
) -> list[float]:
    """The total per joint completion (``completions[i]``: one text per agent), TRL-style columns."""
    scores = score_classes(completions, skeleton, test, class_name, owners, limits or SandboxLimits())
    return [s.total for s in scores]
