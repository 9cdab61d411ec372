"""bench/resultskit/, docs/results.md's machinery, is a package whose modules stack: the graph of the
imports among its modules (read from their source with ``ast``, module-level and deferred imports alike)
has no cycle, and nothing outside it but ``bench/results.py`` (the command line) and ``bench/figures.py``
reaches into it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "bench" / "resultskit"
OLD_NAME = re.compile(r"\bresults_(comparisons|page|provenance|reading|records|resume|significance|stats|values)\b")


def imports_of(path: Path) -> set[str]:
    """The package's modules that ``path`` imports, anywhere in it (``from .x import``, ``from . import x``,
    ``import resultskit.x``, ``from resultskit.x import``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level == 1:
                found |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
            elif node.level == 0 and node.module and node.module.split(".")[0] == "resultskit":
                parts = node.module.split(".")
                found |= {parts[1]} if len(parts) > 1 else {a.name for a in node.names}
            elif node.level > 1:
                raise AssertionError(f"{path.name}: an import from above the package ({ast.unparse(node)})")
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.startswith("resultskit.")}
    return found - {path.stem}


def graph() -> dict[str, set[str]]:
    modules = {p.stem: p for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    edges = {name: imports_of(path) for name, path in modules.items()}
    unknown = {(a, b) for a, bs in edges.items() for b in bs if b not in modules}
    assert not unknown, f"imports of modules the package does not have: {sorted(unknown)}"
    return edges


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``edges`` (its modules in order, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := walk(node)):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_the_results_modules_stack_without_a_circle() -> None:
    edges = graph()
    assert {"comparisons", "records", "page", "reading", "significance", "stats", "values", "cli"} <= set(edges)
    assert cycle(edges) is None, f"the results package imports in a circle: {' -> '.join(cycle(edges))}"
    # The bottom layers import nothing of the package but the settings; the command line sits on top.
    assert edges["stats"] == set() and edges["comparisons"] == set() and edges["resume"] == set()
    assert not any("cli" in bs for bs in edges.values())


def test_no_module_outside_names_the_old_flat_modules() -> None:
    """bench/'s flat ``results_*.py`` modules are gone: nothing imports or names them any more."""
    named = []
    for path in [*ROOT.glob("bench/**/*.py"), *ROOT.glob("tests/*.py"), *ROOT.glob("docs/*.md"), ROOT / "Makefile"]:
        if path.is_file() and path.name != Path(__file__).name:
            named += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in OLD_NAME.finditer(path.read_text("utf-8"))]
    assert named == []
    assert not list((ROOT / "bench").glob("results_*.py"))
