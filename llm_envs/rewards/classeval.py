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

from llm_envs.rewards.coding import _line_block, strip_fences
from llm_envs.sandbox import AST_LOCK, ExecutionResult, SandboxJob, SandboxLimits, parse_python, run_many

VALID_REWARD = 2.0
TESTS_REWARD = 4.0
OVERLAP_PENALTY = -1.0
COMPONENTS = ("valid", "tests", "overlap")
MAX_REWARD = VALID_REWARD + TESTS_REWARD
ENTRY_POINT = "_classeval_run"
PASSED = "passed"
MESSAGE_CHARS = 200
FORWARDED_DUNDERS = frozenset({
    "__len__", "__getitem__", "__setitem__", "__delitem__", "__contains__", "__iter__", "__next__", "__str__",
    "__repr__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__", "__bool__", "__call__",
    "__add__", "__sub__", "__mul__", "__truediv__", "__floordiv__", "__mod__", "__pow__", "__neg__", "__abs__",
    "__int__", "__float__", "__index__", "__enter__", "__exit__",
})
"""Special methods a class's proxy forwards to its process, when the skeleton's class defines them
(``__iter__`` returns the items the class's process iterates, as a list)."""

# Appended to the merged class, in its sandboxed process: serves the class's objects by reference. This
# process is untrusted; what it answers is checked by the caller to be plain data or references.
_PEER_HARNESS = """

import builtins as _ce_builtins
import importlib as _ce_importlib

_ce_classes = {_n: globals()[_n] for _n in %(names)r if isinstance(globals().get(_n), type)}
_ce_types = {_c: _n for _n, _c in _ce_classes.items()}
_ce_objects = {}
_ce_refs = {}


def __sandbox_handle__(value):
    cls = type(value)
    name = _ce_types.get(cls)
    if name is None:
        if cls is type and getattr(_ce_builtins, value.__name__, None) is value:
            return "n", "builtins", value.__name__
        if getattr(cls, "__module__", None) == __name__:
            return None  # a type the program made: opaque
        name = "~" + cls.__name__
    ref = _ce_refs.get(id(value))
    if ref is None:
        ref = _ce_refs[id(value)] = len(_ce_objects)
        _ce_objects[ref] = value
    return "h", ref, name


def __sandbox_object__(tag, rest):
    if tag == "h":
        return _ce_objects[rest[0]]
    if tag == "n":
        found = _ce_importlib.import_module(rest[0])
        for part in rest[1].split("."):
            found = getattr(found, part)
        return found
    if tag == "p":
        import pickle

        return pickle.loads(bytes.fromhex(rest[0]))
    raise TypeError("an object of the class's process that is not plain data cannot be passed back to it")


def _ce_walk(target, path):
    found = _ce_classes[target] if type(target) is str else target
    for kind, step in path:
        found = getattr(found, step) if kind == "a" else found[step]
    return found


def _ce_new(name, args, kwargs):
    return _ce_classes[name](*args, **kwargs)


def _ce_call(target, name, args, kwargs):
    found = _ce_walk(target, ())
    return (found if name is None else getattr(found, name))(*args, **kwargs)


def _ce_call_back(target, name, args, kwargs):
    return _ce_call(target, name, args, kwargs), args, kwargs


def _ce_get(target, name):
    return getattr(_ce_walk(target, ()), name)


def _ce_set(target, name, value):
    setattr(_ce_walk(target, ()), name, value)


def _ce_del(target, name):
    delattr(_ce_walk(target, ()), name)


def _ce_list(target):
    return list(_ce_walk(target, ()))


def _ce_fetch(items):
    out = []
    for target, path in items:
        try:
            out.append(("ok", _ce_walk(target, path)))
        except Exception:
            out.append(("gone",))
    return out


def _ce_mutate(target, path, method, args, kwargs):
    return getattr(_ce_walk(target, path), method)(*args, **kwargs)

"""

# The tests' side: a program holding the skeleton's module-level code, the tests and proxies of the
# skeleton's classes, and no generated code. It runs sandboxed (the tests are dataset code that writes
# files) beside the class's process, sharing its scratch directory; every use of a class crosses to
# that process through __sandbox_relay__ and comes back as plain data, a reference to an object there
# (a proxy here: equal only to itself, no truth value) or an opaque value (an object of a type the
# program made: equal only to itself, no truth value). Lists, dicts and sets read from attributes are
# views: mutating one mutates the attribute in the class's process, and every view is refreshed from
# it after each call, as aliases of the attribute would be.
DRIVER_HARNESS = """
import builtins as _ce_builtins
import sys as _ce_sys
import unittest as _ce_unittest


class _CEOpaque:
    __slots__ = ("type_name", "text")

    def __init__(self, type_name, text):
        self.type_name, self.text = type_name, text

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    __hash__ = object.__hash__

    def __bool__(self):
        raise TypeError(f"a {self.type_name} object of the class's process has no truth value here")

    def __repr__(self):
        return f"<{self.type_name} object: {self.text}>"


_ce_exceptions = {_n: _c for _n, _c in vars(_ce_builtins).items() if isinstance(_c, type) and issubclass(_c, Exception)}
_ce_made_exceptions = {}
_ce_proxies = {}
_ce_proxy_types = set()
_ce_instances = {}
_ce_roots = {}
_CE_CHANGING = frozenset({"_ce_new", "_ce_call", "_ce_call_back", "_ce_set", "_ce_del", "_ce_mutate"})


def _ce_raise(type_name, message):
    cls = _ce_exceptions.get(type_name)
    try:
        error = cls(message) if cls is not None else None
    except Exception:
        error = None
    if error is None:
        cls = _ce_made_exceptions.setdefault(type_name, type(type_name, (Exception,), {}))
        error = cls(message)
    raise error


def _ce_relay(name, *args):
    reply = __sandbox_relay__(name, args, {})
    if name in _CE_CHANGING and _ce_roots:
        _ce_refresh()
    if reply[0] == "ok":
        return reply[1]
    _ce_raise(reply[1], reply[2])


def _ce_resolve(module, qualname):
    found = _ce_sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return found


def __sandbox_handle__(value):
    if type(value) in _ce_proxy_types:
        return "h", object.__getattribute__(value, "_ce_ref"), type(value).__name__
    if type(value) is _CEMethod:  # a method read from a class, passed to it: the class's own function
        return __sandbox_handle__(_ce_relay("_ce_get", value.target, value.name))
    module = getattr(value, "__module__", None) or getattr(getattr(value, "__self__", None), "__module__", None)
    qualname = getattr(value, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and callable(value):
        found = _ce_resolve(module, qualname)
        if found is value or (found is not None and found == value):
            return "n", module, qualname
    import pickle

    try:  # the tests' own objects (an XML element, say) go to the class's process as a copy
        return "p", pickle.dumps(value).hex()
    except Exception:
        return None


def __sandbox_object__(tag, rest):
    if tag == "o":
        return _CEOpaque(str(rest[0]), str(rest[1]))
    if tag == "n":  # only a builtin type (a class may keep `int` as a converter); anything else is opaque
        found = getattr(_ce_builtins, rest[1], None) if rest[0] == "builtins" else None
        if isinstance(found, type) and not issubclass(found, BaseException):
            return found
        return _CEOpaque(str(rest[1]), "")
    ref, name = rest if tag == "h" and len(rest) == 2 else (None, None)
    if type(ref) is not int or type(name) is not str:
        raise TypeError(f"the class's process sent a malformed reference {tag!r}")
    found = _ce_instances.get(ref)
    if found is None:
        cls = _ce_proxies.get(name) or _ce_proxy_class(name, (), ("__call__", "__len__", "__getitem__",
                                                                 "__contains__", "__iter__", "__str__"))
        found = _ce_instances[ref] = object.__new__(cls)
        object.__setattr__(found, "_ce_ref", ref)
    return found


class _CEMethod:
    __slots__ = ("target", "name")

    def __init__(self, target, name):
        self.target, self.name = target, name

    def __call__(self, *args, **kwargs):
        if any(type(v) in (list, dict, set, bytearray) for v in (*args, *kwargs.values())):
            value, new_args, new_kwargs = _ce_relay("_ce_call_back", self.target, self.name, args, kwargs)
            for old, new in (*zip(args, new_args), *((kwargs[k], new_kwargs.get(k)) for k in kwargs)):
                if type(old) in (list, bytearray) and type(new) is type(old):
                    old[:] = new
                elif type(old) in (dict, set) and type(new) is type(old):
                    old.clear()
                    old.update(new)
            return value
        return _ce_relay("_ce_call", self.target, self.name, args, kwargs)

    def __repr__(self):
        return f"<method {self.name} of the class's process>"


def _ce_key(target):
    return target if type(target) is str else ("ref", object.__getattribute__(target, "_ce_ref"))


def _ce_attribute(target, name):
    value = _ce_relay("_ce_get", target, name)
    if type(value) not in (list, dict, set):
        return value
    key = (_ce_key(target), name)
    view = _ce_roots.get(key)
    if view is None or type(view).__base__ is not type(value):
        view = _ce_roots[key] = _ce_view(target, (("a", name),), value)
    else:
        _ce_merge(view, value)
    return view


def _ce_merge_item(old, new, target, path):
    if type(new) not in (list, dict, set):
        return new
    if type(old) in _CE_VIEWS and type(old).__base__ is type(new):
        _ce_merge(old, new)
        return old
    return _ce_view(target, path, new)


def _ce_merge(view, value):
    target, path = view._ce_target, view._ce_path
    if isinstance(view, list):
        old = list.copy(view)
        items = [_ce_merge_item(old[i] if i < len(old) else None, v, target, path + (("i", i),))
                 for i, v in enumerate(value)]
        list.clear(view)
        list.extend(view, items)
    elif isinstance(view, dict):
        old = dict.copy(view)
        items = {k: _ce_merge_item(old.get(k), v, target, path + (("i", k),)) for k, v in value.items()}
        dict.clear(view)
        dict.update(view, items)
    else:
        set.clear(view)
        set.update(view, value)


def _ce_view(target, path, value):
    view = _CE_VIEWS_BY_TYPE[type(value)]()
    view._ce_target, view._ce_path = target, path
    _ce_merge(view, value)
    return view


def _ce_refresh():
    roots = list(_ce_roots.items())
    found = __sandbox_relay__("_ce_fetch", ([(v._ce_target, v._ce_path) for _, v in roots],), {})
    if found[0] != "ok" or type(found[1]) is not list or len(found[1]) != len(roots):
        for _, view in roots:
            view._ce_path = None
        _ce_roots.clear()
        return
    for (key, view), item in zip(roots, found[1]):
        if type(item) is tuple and len(item) == 2 and type(item[1]) is type(view).__base__:
            _ce_merge(view, item[1])
        else:  # no longer that container: the view keeps its last contents, as a plain container
            del _ce_roots[key]
            view._ce_path = None


def _ce_mutator(base, method):
    def mutate(self, *args, **kwargs):
        if getattr(self, "_ce_path", None) is None:
            return getattr(base, method)(self, *args, **kwargs)
        result = _ce_relay("_ce_mutate", self._ce_target, self._ce_path, method, args, kwargs)
        if (_ce_key(self._ce_target), self._ce_path[0][1]) not in _ce_roots:  # not refreshed with the roots
            found = _ce_relay("_ce_fetch", [(self._ce_target, self._ce_path)])
            if found and found[0][0] == "ok" and type(found[0][1]) is base:
                _ce_merge(self, found[0][1])
        return self if method.startswith("__i") else result
    return mutate


def _ce_view_class(base, methods):
    namespace = {m: _ce_mutator(base, m) for m in methods}
    namespace["__reduce_ex__"] = lambda self, protocol: (base, (base(self),))
    return type("_CE" + base.__name__.capitalize(), (base,), namespace)


_CE_VIEWS_BY_TYPE = {
    list: _ce_view_class(list, ("append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse",
                                "__setitem__", "__delitem__", "__iadd__", "__imul__")),
    dict: _ce_view_class(dict, ("__setitem__", "__delitem__", "pop", "popitem", "clear", "update", "setdefault",
                                "__ior__")),
    set: _ce_view_class(set, ("add", "discard", "remove", "pop", "clear", "update", "difference_update",
                              "intersection_update", "symmetric_difference_update", "__ior__", "__iand__",
                              "__isub__", "__ixor__")),
}
_CE_VIEWS = frozenset(_CE_VIEWS_BY_TYPE.values())


class _CEMeta(type):
    def __call__(cls, *args, **kwargs):
        return _ce_relay("_ce_new", cls.__name__, args, kwargs)

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if name in cls._ce_methods:
            return _CEMethod(cls.__name__, name)
        return _ce_attribute(cls.__name__, name)

    def __setattr__(cls, name, value):
        _ce_relay("_ce_set", cls.__name__, name, value)

    def __delattr__(cls, name):
        _ce_relay("_ce_del", cls.__name__, name)


class _CEObject(metaclass=_CEMeta):
    __slots__ = ("_ce_ref",)
    _ce_methods = frozenset()

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        if name in type(self)._ce_methods:
            return _CEMethod(self, name)
        return _ce_attribute(self, name)

    def __setattr__(self, name, value):
        _ce_relay("_ce_set", self, name, value)

    def __delattr__(self, name):
        _ce_relay("_ce_del", self, name)

    def __repr__(self):
        return f"<{type(self).__name__.lstrip('~')} object of the class's process>"

    def __bool__(self):
        raise TypeError(f"a {type(self).__name__.lstrip('~')} object of the class's process has no truth value "
                        "here (its class defines neither __bool__ nor __len__)")


def _ce_forward(name):
    if name == "__iter__":
        return lambda self: iter(_ce_relay("_ce_list", self))
    if name == "__call__":
        return lambda self, *args, **kwargs: _CEMethod(self, None)(*args, **kwargs)
    if name == "__exit__":
        return lambda self, kind, error, tb: _ce_relay(
            "_ce_call", self, name, (None, None, None) if kind is None else (kind.__name__, str(error), None), {})
    return lambda self, *args: _ce_relay("_ce_call", self, name, args, {})


def _ce_proxy_class(name, methods, dunders):
    namespace = {"__slots__": (), "_ce_methods": frozenset(methods)}
    for dunder in dunders:
        namespace[dunder] = _ce_forward(dunder)
    if "__eq__" in dunders and "__hash__" not in dunders:
        namespace["__hash__"] = None
    if "__bool__" not in dunders and "__len__" in dunders:
        namespace["__bool__"] = lambda self: len(self) != 0
    cls = _ce_proxies[name] = type.__new__(_CEMeta, name, (_CEObject,), namespace)
    _ce_proxy_types.add(cls)
    return cls
"""

_DRIVER_ENTRY = f"""


def {ENTRY_POINT}(_test_id):
    _class_name, _method = _test_id.split(".")
    _case = globals()[_class_name](_method)
    _result = _ce_unittest.TestResult()
    _case.run(_result)
    _ce_roots.clear()
    _ce_instances.clear()
    for _kind, _found in (("failed", _result.failures), ("error", _result.errors)):
        if _found:
            _lines = [_l for _l in _found[0][1].strip().splitlines() if _l.strip()]
            return _kind + ": " + (_lines[-1].strip() if _lines else "")[:{MESSAGE_CHARS}]
    if _result.skipped or _result.expectedFailures or _result.testsRun != 1:
        return "skipped"
    return "{PASSED}"
"""


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
