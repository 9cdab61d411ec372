"""pytest plugin: ``pytest --llm-envs-check ID`` runs :func:`llm_envs.testing.check_env` on an id, one test
per check (a check that does not apply is skipped with its reason; a failure prints the check's message).

The package registers it through its ``pytest11`` entry point, so installing llm-envs is enough; where
plugins are not auto-loaded, add ``-p llm_envs.testing.pytest_plugin`` (or
``pytest_plugins = ["llm_envs.testing.pytest_plugin"]`` in a top-level conftest.py).

``ID`` may be ``module:env_id``: the module is imported first (from the folder pytest runs in, as with
``python -m pytest``), so that it registers the id::

    pytest --llm-envs-check my_tasks:mine/echo-v0
    pytest --llm-envs-check writing/xsum-v0 --llm-envs-check mine/echo-v0 -k "determinism or spaces"

In a test file, :func:`llm_envs.testing.env_test` does the same: ``test_echo = env_test("mine/echo-v0")``.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

import pytest

OPTION = "--llm-envs-check"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("llm-envs")
    group.addoption(OPTION, action="append", default=[], metavar="[MODULE:]ENV_ID",
                    help="check a registered llm_envs id against the env contract, one test per check "
                         "(MODULE is imported first to register it); repeatable")


def parse_spec(spec: str, invocation_dir: str | os.PathLike[str] | None = None) -> str:
    """The env id of ``[module:]env_id``, after importing the module.

    The module is imported as ``python -m pytest`` would find it: with ``invocation_dir`` (the folder pytest
    was started in) first on ``sys.path``, so that ``pytest --llm-envs-check my_tasks:...`` works in the
    folder that holds ``my_tasks.py`` (the ``pytest`` command, unlike ``python -m``, does not put it there).
    """
    module, sep, env_id = spec.rpartition(":")
    if sep:
        if invocation_dir is not None and str(invocation_dir) not in sys.path:
            sys.path.insert(0, str(invocation_dir))
            importlib.invalidate_caches()
        try:
            importlib.import_module(module)
        except ImportError as err:
            raise pytest.UsageError(f"{OPTION} {spec}: cannot import {module!r} ({err}).") from err
    import llm_envs

    if env_id not in llm_envs.list_envs():
        raise pytest.UsageError(
            f"{OPTION} {spec}: {env_id!r} is not registered. Name the module that registers it "
            f"({OPTION} my_tasks:{env_id}) or register it in conftest.py."
        )
    return env_id


class EnvCheckItem(pytest.Item):
    """One check of one id."""

    def __init__(self, *, env_id: str, check: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.env_id, self.check = env_id, check

    def runtest(self) -> None:
        from llm_envs.testing import run_check

        run_check(self.env_id, self.check)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"llm-envs check {self.env_id} {self.check}"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    specs = config.getoption("llm_envs_check")
    if not specs:
        return
    from llm_envs.testing import CHECKS

    for spec in specs:
        env_id = parse_spec(spec, config.invocation_params.dir)
        items.extend(EnvCheckItem.from_parent(session, name=f"llm-envs-check[{env_id}::{check}]", env_id=env_id,
                                              check=check) for check in CHECKS)
