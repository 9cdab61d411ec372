"""The old paths of the modules that moved into ``learners/``, ``rl/`` and ``infra/``: each is a shim of
two lines that keeps imports (and ``python -m baselines.<name>``) working for one release."""

from __future__ import annotations

import importlib
import runpy
import warnings
from collections.abc import Callable
from typing import Any


def moved(name: str, new: str) -> Callable[[str], Any]:
    """For the shim module ``name``: warn that it moved to ``new`` (or, run as ``__main__``, run ``new``
    as the script instead), and return the module ``__getattr__`` that reads every name from ``new``."""
    if name == "__main__":
        runpy.run_module(new, run_name="__main__", alter_sys=True)
    else:
        warnings.warn(f"{name} moved to {new}; import it from there (this path goes in the next release).",
                      DeprecationWarning, stacklevel=3)

    def __getattr__(attribute: str) -> Any:
        return getattr(importlib.import_module(new), attribute)

    return __getattr__
