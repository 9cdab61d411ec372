"""The layout holds: every module imports; no import cycle among the modules of ``baselines`` (imports
inside functions count too: a cycle is a cycle whenever it closes); every import runs down the stack
``baselines.learners`` -> ``baselines.rl`` -> ``baselines.infra`` -> ``agents`` -> ``llm_envs`` (a learner
imports no other learner but the one it is a variant of);
``llm_envs`` imports torch only inside functions that need it."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("llm_envs", "agents", "baselines")


def modules(package: str) -> dict[str, Path]:
    """Dotted name -> file of every module of ``package`` (``pkg`` for ``pkg/__init__.py``)."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


ALL = {name: path for package in PACKAGES for name, path in modules(package).items()}


def is_main_block(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":``"""
    test = getattr(node, "test", None)
    return (isinstance(node, ast.If) and isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == "__name__" and len(test.comparators) == 1
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == "__main__")


def imported(name: str, path: Path, *, top_level_only: bool = False) -> set[str]:
    """The modules of our packages (or any absolute module when it is not ours: ``torch``) that the
    module ``name`` imports, anywhere in its code or at its top level only. A script's entry block
    (``if __name__ == "__main__":``) is left out: it never runs when the module is imported (a learner's
    hands its command line to baselines.infra.cli, which imports the learners)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    tree.body = [node for node in tree.body if not is_main_block(node)]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.add(candidate if candidate in ALL else base)
    return found


def ours(names: set[str]) -> set[str]:
    """Import targets mapped to our modules (``baselines.learners.ppo.Config`` is not a module: its module is)."""
    out = set()
    for target in names:
        parts = target.split(".")
        while parts and ".".join(parts) not in ALL:
            parts.pop()
        if parts:
            out.add(".".join(parts))
    return out


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph`` (module -> modules it imports), one per strongly connected group
    of two or more modules (or a module importing itself), each as a path that closes on its start.

    >>> find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    [['a', 'b', 'c', 'a']]
    >>> find_cycles({"a": {"b"}, "b": set()})
    []
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph.get(node, ()):
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    cycles = []
    for group in groups:  # one concrete path through the group, for the message
        members, path = set(group), [group[0]]
        while True:
            nxt = min(m for m in graph[path[-1]] if m in members)
            if nxt in path:
                cycles.append(path[path.index(nxt) :] + [nxt])
                break
            path.append(nxt)
    return sorted(cycles)


@pytest.mark.parametrize("name", sorted(ALL))
def test_every_module_imports(name):
    importlib.import_module(name)


def test_no_import_cycle_in_baselines():
    graph = {
        name: {m for m in ours(imported(name, path)) if m.startswith("baselines") and m != name}
        for name, path in modules("baselines").items()
    }
    # the parser sees imports
    assert graph["baselines.infra.evaluation"] >= {"baselines.infra.play", "baselines.infra.rng"}
    assert find_cycles(graph) == [], "import cycles in baselines: " + "; ".join(
        " -> ".join(c) for c in find_cycles(graph)
    )


# The floors of the house, top to bottom: a module imports its own floor and the floors below it, never one
# above. A learner imports no other learner (each is one algorithm), except a variant of the one it extends.
FLOORS = ("baselines.learners", "baselines.rl", "baselines.infra", "agents", "llm_envs")
VARIANTS = {("baselines.learners.cory", "baselines.learners.ppo"): "CORY is PPO with a pioneer and an observer"}
# Imports allowed to break the stack, each with the reason it is still there and the work that removes it (none
# since 0.2.0). The test fails when a listed one is gone too, so the list only shrinks.
NOT_YET: dict[tuple[str, str], str] = {}


def floor(module: str) -> int | None:
    """The floor of ``module`` (0 the top), or None for a module on no floor (``baselines`` itself)."""
    return next((i for i, f in enumerate(FLOORS) if module == f or module.startswith(f + ".")), None)


def stack_breaks(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """Every (importer, imported) pair of ``graph`` (module -> the modules it imports) that imports upward,
    or from one learner to another that it is not a variant of.

    >>> sorted(stack_breaks({"agents.engine": {"llm_envs.core", "baselines.rl.tree"},
    ...                      "baselines.learners.cory": {"baselines.learners.ppo", "baselines.infra.cli"},
    ...                      "baselines.learners.maac": {"baselines.learners.magrpo"}, "baselines": {"agents"}}))
    [('agents.engine', 'baselines.rl.tree'), ('baselines.learners.maac', 'baselines.learners.magrpo')]
    """
    breaks = set()
    for name, targets in graph.items():
        for target in targets:
            mine, theirs = floor(name), floor(target)
            if mine is None or theirs is None or target == name:
                continue
            sideways = mine == theirs == 0 and (name, target) not in VARIANTS
            if theirs < mine or sideways:
                breaks.add((name, target))
    return breaks


def test_every_import_runs_down_the_stack():
    """learners -> rl -> infra -> agents -> llm_envs: each floor imports only its own and those below; a
    learner imports no other learner but the one it is a variant of. Running a learner by its name
    (``llm-envs train``, MARLHF's RL stage: ``importlib``) is a dispatch, not an import of the stack."""
    breaks = stack_breaks({name: ours(imported(name, path)) for name, path in ALL.items()})
    new = sorted(breaks - NOT_YET.keys())
    assert not new, "imports that break the stack (learners -> rl -> infra -> agents -> llm_envs): " + "; ".join(
        f"{a} imports {b}" for a, b in new
    )
    gone = sorted(NOT_YET.keys() - breaks)
    assert not gone, "no longer imported upward, remove from NOT_YET: " + "; ".join(f"{a} -> {b}" for a, b in gone)


def test_llm_envs_imports_torch_only_inside_functions():
    at_import = {
        name: sorted(m for m in imported(name, path, top_level_only=True) if m.split(".")[0] == "torch")
        for name, path in modules("llm_envs").items()
    }
    assert {k: v for k, v in at_import.items() if v} == {}


# The modules of ``baselines`` moved into ``learners/``, ``rl/`` and ``infra/`` in 0.2.0, and their old paths
# (``baselines.<name>``, shims for one release) are gone: baselines/ holds its three folders and nothing else.
def test_baselines_holds_only_its_folders():
    top = sorted(path.name for path in (ROOT / "baselines").iterdir() if path.name != "__pycache__")
    assert top == ["__init__.py", "infra", "learners", "rl"]


def test_the_version_is_read_from_one_place():
    """pyproject.toml's version is the one ``llm_envs.__version__`` gives, and CHANGELOG.md has its entry."""
    import re

    import llm_envs

    project = (ROOT / "pyproject.toml").read_text(encoding="utf-8").split("[project]", 1)[1]
    version = re.search(r'^version = "([^"]+)"$', project, re.M).group(1)
    assert llm_envs.__version__ == version
    assert f"## [{version}]" in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


MAX_MODULE_LINES = 650
"""The layout's bound on a module's length: a module that grows past it is split by what its parts do."""


def test_no_module_exceeds_the_line_bound():
    """Every module of ``llm_envs``, ``agents``, ``baselines`` and ``bench`` has at most
    :data:`MAX_MODULE_LINES` lines."""
    paths = [path for folder in (*PACKAGES, "bench") for path in sorted((ROOT / folder).rglob("*.py"))]
    assert len(paths) > 50 and any(path.parent.name == "bench" for path in paths)
    long = {str(path.relative_to(ROOT)): n for path in paths
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"
