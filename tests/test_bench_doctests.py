"""The examples in bench/'s docstrings run (pytest collects doctests from the packages only: bench/ is a
folder of scripts that import their siblings by name, so its modules are loaded here by path)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
WITH_EXAMPLES = sorted(p for p in BENCH.glob("*.py") if ">>> " in p.read_text(encoding="utf-8"))


def test_some_bench_modules_have_examples() -> None:
    assert {p.name for p in WITH_EXAMPLES} >= {"results_comparisons.py", "results_stats.py", "results_values.py"}


@pytest.mark.parametrize("path", WITH_EXAMPLES, ids=lambda p: p.name)
def test_bench_examples_run(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCH))  # the siblings a bench module imports by name
    module = importlib.import_module(path.stem)  # as bench/results.py's siblings import it: one copy per process
    assert Path(module.__file__).resolve() == path
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0, f"{path.name}: {result.failed} of {result.attempted} failed"
