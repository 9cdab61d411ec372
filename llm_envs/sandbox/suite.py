"""The trusted code of a run, compiled in the caller: a HumanEval-style ``check(candidate)`` split
into statements judged one by one, the tests' globals, a driver's prelude; and the lock that every
conversion between source, ``ast`` objects and code takes."""

from __future__ import annotations

import ast
import functools
import marshal
import operator
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class _Statement:
    source: str
    code: Any  # compiled statement
    is_test: bool
    compare: tuple[Any, Any, Any, bool] | None = None  # (left code, right code, op, left_is_actual)


_COMPARE_OPS: dict[type, tuple[Callable[[Any, Any], Any], str]] = {
    ast.Eq: (operator.eq, "=="), ast.NotEq: (operator.ne, "!="), ast.Lt: (operator.lt, "<"),
    ast.LtE: (operator.le, "<="), ast.Gt: (operator.gt, ">"), ast.GtE: (operator.ge, ">="),
    ast.Is: (operator.is_, "is"), ast.IsNot: (operator.is_not, "is not"), ast.In: (lambda a, b: a in b, "in"),
    ast.NotIn: (lambda a, b: a not in b, "not in"),
}


def _mentions(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


def _is_test_statement(node: ast.stmt, param: str) -> bool:
    """A test is a statement holding an assertion on the candidate (``assert True, "..."`` lines and
    other set-up are run but not counted), the same set the reference counts, plus asserts in loops."""
    return any(isinstance(n, ast.Assert) and not isinstance(n.test, ast.Constant) for n in ast.walk(node)) and (
        _mentions(node, param) or any(isinstance(n, ast.Assert) and _mentions(n.test, param) for n in ast.walk(node))
    )


@dataclass(frozen=True)
class _Suite:
    preamble: tuple[Any, ...]
    param: str
    statements: tuple[_Statement, ...]


AST_LOCK = threading.RLock()
"""Held around every conversion between source, ``ast`` objects and code in this package. CPython 3.11
keeps the ``ast`` module's recursion-depth counter per interpreter, not per thread: two threads
converting at once (the envs score batches in a thread pool) can fail with ``SystemError: AST constructor
recursion depth mismatch`` (CPython gh-106905; seen in this suite's CI)."""


def parse_python(source: str) -> ast.Module:
    """``ast.parse(source)`` under :data:`AST_LOCK` (raises ``SyntaxError`` as ``ast.parse`` does)."""
    with AST_LOCK:
        return ast.parse(source)


@functools.lru_cache(maxsize=512)
def _parse_suite(tests: str) -> _Suite:
    with AST_LOCK:
        return _parse_suite_locked(tests)


def _parse_suite_locked(tests: str) -> _Suite:
    try:
        module = ast.parse(tests)
    except SyntaxError as err:
        raise ValueError(f"The test code does not parse (line {err.lineno}: {err.msg}): {tests[:200]!r}") from None
    checks = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks:
        raise ValueError(f"The test code defines no `check(candidate)` function: {tests[:200]!r}")
    check = checks[-1]
    if len(check.args.args) != 1:
        raise ValueError(f"`check` must take exactly one argument (the candidate), got {ast.unparse(check.args)!r}.")
    param = check.args.args[0].arg
    preamble = tuple(
        compile(ast.Module(body=[n], type_ignores=[]), "<tests>", "exec") for n in module.body if n is not check
    )
    statements = []
    for node in check.body:
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # docstring
        source = ast.get_source_segment(tests, node) or ast.unparse(node)
        code = compile(ast.Module(body=[node], type_ignores=[]), "<tests>", "exec")
        compare = None
        if isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare) and len(node.test.ops) == 1:
            op_type = type(node.test.ops[0])
            left, right = node.test.left, node.test.comparators[0]
            compare = (
                compile(ast.Expression(body=left), "<tests>", "eval"),
                compile(ast.Expression(body=right), "<tests>", "eval"),
                _COMPARE_OPS[op_type],
                _mentions(left, param) or not _mentions(right, param),
            )
        statements.append(_Statement(source, code, _is_test_statement(node, param), compare))
    return _Suite(preamble, param, tuple(statements))


def split_tests(tests: str) -> list[str]:
    """The test statements of a ``check(candidate)`` test (each one scored on its own).

    >>> split_tests("def check(candidate):\\n    assert True\\n    assert candidate(1) == 2\\n")
    ['assert candidate(1) == 2']
    """
    return [s.source for s in _parse_suite(tests).statements if s.is_test]


@functools.lru_cache(maxsize=512)
def _compile_globals(source: str) -> Any:
    return compile(source, "<test globals>", "exec")


@functools.lru_cache(maxsize=64)
def _compiled(prelude: str) -> str:
    """A prelude's code object, marshalled (hex) for the program's process: the caller and the worker run
    the same interpreter."""
    with AST_LOCK:
        try:
            code = compile(prelude, "<prelude>", "exec", dont_inherit=True)
        except SyntaxError as err:
            raise ValueError(f"The prelude does not compile (line {err.lineno}: {err.msg}).") from None
    return marshal.dumps(code).hex()
