"""Class-level code completion reward (``coding/classeval-v0``): two agents write the empty methods of a
ClassEval class; the merged class runs the class's unittest tests in :mod:`llm_envs.sandbox`.

The methods to write are those of the class whose body is empty: only a docstring, ``pass``, ``...`` or
``raise NotImplementedError``. Each is assigned to one agent. From each agent's text (markdown fences
removed, dedented) every ``def`` of a method to write is taken, at the top level or inside a ``class``;
stray code is never run. An agent's method is *valid* when it is there and parses. The merged class is
the skeleton with every valid method replacing its stub, taken from the agent it is assigned to. It is
compiled in this process (compiling runs nothing); then the class and its tests run in the sandbox,
one program per class, each test method judged on its own with its own time limit.

=============  ===========  ==========================================================================
component      value        when
=============  ===========  ==========================================================================
``valid``      0 .. 2       2 x (methods whose assigned agent wrote them and they parse) / (methods)
``tests``      0 .. 4       4 x (unittest test methods that pass on the merged class) / (test methods)
``overlap``    -1 .. 0      -1 x (methods written by more than one agent) / (methods)
=============  ===========  ==========================================================================

All three are 0 when the merged class does not compile. Maximum 6.0.

The tests run beside the class in its sandboxed process (they build and inspect its objects), so a
class could in principle tamper with the unittest machinery there. A static guard refuses such code
before anything runs: a method that imports ``unittest``, ``sys``, ``gc``, ``inspect``, ``importlib``,
``builtins``, ``ctypes`` or ``__main__``, or names ``globals``, ``eval``, ``exec``, ``compile``,
``__import__``, frames or code objects, gets no test run (``tests`` 0; the diagnostics say which
name). A guard, not a proof; the sandbox's process isolation holds regardless.

>>> skeleton = "class Box:\\n    def get(self):\\n        '''The value.'''\\n"
>>> methods_to_write(skeleton, "Box")
[('get', True)]
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llm_envs.rewards.coding import _line_block, strip_fences
from llm_envs.sandbox import AST_LOCK, ExecutionResult, SandboxJob, SandboxLimits, parse_python, run_many

VALID_REWARD = 2.0
TESTS_REWARD = 4.0
OVERLAP_PENALTY = -1.0
COMPONENTS = ("valid", "tests", "overlap")
MAX_REWARD = VALID_REWARD + TESTS_REWARD
ENTRY_POINT = "_classeval_run"
PASSED = "passed"
DENIED_MODULES = frozenset({"unittest", "sys", "gc", "inspect", "importlib", "builtins", "ctypes", "__main__"})
DENIED_NAMES = frozenset({
    "globals", "eval", "exec", "compile", "__import__", "__builtins__", "_getframe", "f_back", "f_globals",
    "f_locals", "f_builtins", "tb_frame", "gi_frame", "cr_frame", "__globals__", "__code__", "__closure__",
    "__subclasses__", "modules", "settrace", "setprofile", ENTRY_POINT,
})
MESSAGE_CHARS = 200

# Runs one test method of the tests' classes by its "Class.method" id, in the sandboxed program.
_HARNESS = f'''

import unittest as _ce_unittest


def {ENTRY_POINT}(_test_id):
    _class_name, _method = _test_id.split(".")
    _case = globals()[_class_name](_method)
    _result = _ce_unittest.TestResult()
    _case.run(_result)
    for _kind, _found in (("failed", _result.failures), ("error", _result.errors)):
        if _found:
            _lines = [_l for _l in _found[0][1].strip().splitlines() if _l.strip()]
            return _kind + ": " + (_lines[-1].strip() if _lines else "")[:{MESSAGE_CHARS}]
    if _result.skipped:
        return "skipped"
    return "{PASSED}"
'''


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


def denied_name(source: str) -> str | None:
    """The first name of :data:`DENIED_MODULES` / :data:`DENIED_NAMES` that ``source`` uses, else None."""
    try:
        module = parse_python(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    with AST_LOCK:
        for node in ast.walk(module):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in DENIED_MODULES:
                        return alias.name
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in DENIED_MODULES:
                return node.module
            elif isinstance(node, ast.Name) and node.id in DENIED_NAMES | DENIED_MODULES:
                return node.id
            elif isinstance(node, ast.Attribute) and node.attr in DENIED_NAMES:
                return node.attr
    return None


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
    denied: str | None = None
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
    denied = None
    if compile_error is None:
        for source in chosen.values():
            denied = denied_name(source)
            if denied is not None:
                break
    return ClassScore(components, methods, tuple(owners), written, tuple(valid), tuple(invalid), overlap, program,
                      compile_error, denied)


def _job(score: ClassScore, tests: str, limits: SandboxLimits) -> SandboxJob | None:
    if score.compile_error is not None or score.denied is not None:
        return None
    ids = unittest_ids(tests)
    if not ids:
        return None
    return SandboxJob(score.program + "\n\n" + tests + _HARNESS, check_source(ids), ENTRY_POINT, limits=limits)


def _finish(score: ClassScore, tests: str, result: ExecutionResult | None) -> ClassScore:
    if result is None:
        return score
    components = dict(score.components)
    components["tests"] = TESTS_REWARD * result.fraction
    return ClassScore(components, score.methods, score.owners, score.written, score.valid, score.invalid,
                      score.overlap, score.program, score.compile_error, score.denied, result,
                      tuple(unittest_ids(tests)))


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
    jobs = [_job(score, test, limits) for score, test in zip(statics, tests, strict=True)]
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
