"""The two programs of a ClassEval run that reach the sandbox beside the generated class (see
:mod:`llm_envs.rewards.classeval`): the class's process (the *peer*) gets :data:`_PEER_HARNESS` after the
merged class, and answers the tests' calls on its objects; the tests' process (the *driver*) runs
:data:`DRIVER_HARNESS` (its proxies, views and opaque values) and, after the skeleton's module-level
code and the tests, :data:`_DRIVER_ENTRY`, which runs one test method and returns its verdict. They are
program text, compiled and run only in the sandbox.
"""

from __future__ import annotations

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
