"""The examples in bench/'s docstrings run (pytest collects doctests from the packages only: bench/ is a
folder of scripts that import their siblings by name, and of the results package ``bench/resultskit/``,
so its modules are loaded here by name with bench/ on the path)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
WITH_EXAMPLES = sorted(p for p in [*BENCH.glob("*.py"), *BENCH.glob("resultskit/*.py")]
                       if ">>> " in p.read_text(encoding="utf-8"))


def _module_name(path: Path) -> str:
    """``figures`` for bench/figures.py, ``resultskit.stats`` for bench/resultskit/stats.py."""
    return ".".join(path.relative_to(BENCH).with_suffix("").parts)


def test_some_bench_modules_have_examples() -> None:
    assert {_module_name(p) for p in WITH_EXAMPLES} >= {"resultskit.comparisons", "resultskit.stats",
                                                        "resultskit.values", "resultskit.summary"}


@pytest.mark.parametrize("path", WITH_EXAMPLES, ids=_module_name)
def test_bench_examples_run(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))  # the siblings a bench module imports by name, and the package
    module = importlib.import_module(_module_name(path))  # as bench/results.py imports it: one copy per process
    assert Path(module.__file__).resolve() == path
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0, f"{path.name}: {result.failed} of {result.attempted} failed"
