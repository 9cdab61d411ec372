"""Check an env, or a task of your own, against the env contract the way the suite checks its own ids.

``check_env(id_or_env, **make_kwargs)`` runs PettingZoo's official checks and then the rest of the
contract (docs/env-contract.md), and returns a :class:`CheckReport`; a property that does not hold
raises :class:`EnvCheckError` (an ``AssertionError``) naming the check, the agent and the problem, with
how to fix the usual causes. ``check_task(task, **env_kwargs)`` does the same for a ``Task`` object.
The suite's own contract tests (tests/test_env_contract.py) are these calls on every registered id.
Nothing here imports torch or pytest (the pytest helpers import it when called).

The checks, in the order they run (this table is made at import from each check's own description,
which ``describe_checks()`` and every report give too):

{checks}

A check that does not apply is skipped with its reason (a single-turn task has no truncation, an
env *object* cannot be rebuilt in token mode: pass its id, or the task to :func:`check_task`).
``checks=[...]`` runs some checks only and ``skip=[...]`` leaves some out; ``raise_errors=False``
returns the report with its failures instead of raising. Multi-turn checks play 2-3 turns where the
task allows (unless ``num_turns`` is given); the checks about whole responses build the env with
``step_unit="response"``.

>>> import llm_envs
>>> from llm_envs.testing import check_env
>>> report = check_env("writing/xsum-v0", checks=["spaces", "determinism", "text_vs_ids"])
>>> sorted(report.passed), report.skipped
(['determinism', 'spaces', 'text_vs_ids'], {})

In a test file, one line per env (each check is its own test; ``pytest --llm-envs-check ID`` does the
same from the command line, see :mod:`llm_envs.testing.pytest_plugin`)::

    import my_tasks  # registers "mine/echo-v0"
    from llm_envs.testing import env_test

    test_echo = env_test("mine/echo-v0")
"""

from __future__ import annotations

from typing import Any

from llm_envs.core.task import Task
from llm_envs.testing.checks import CHECKS, PETTINGZOO_CHECKS, Subject, checks_table, describe_checks, run_checks
from llm_envs.testing.episodes import assert_same, first_difference, play, prompt_ids, random_actions
from llm_envs.testing.report import CheckReport, EnvCheckError

if __doc__:  # the table of the checks, from their own descriptions (absent under python -OO)
    __doc__ = __doc__.replace("{checks}", checks_table())

__all__ = [
    "CHECKS",
    "PETTINGZOO_CHECKS",
    "CheckReport",
    "EnvCheckError",
    "assert_same",
    "check_env",
    "check_task",
    "describe_checks",
    "env_test",
    "first_difference",
    "play",
    "prompt_ids",
    "random_actions",
    "run_check",
]


def check_env(env_or_id: Any, *, checks: Any = None, skip: Any = (), raise_errors: bool = True,
              **make_kwargs: Any) -> CheckReport:
    """Check a registered id (built with ``llm_envs.make(id, **make_kwargs)``) or an env object against the
    env contract.

    Args:
        env_or_id: a registered id (``"mine/echo-v0"``), an env from ``llm_envs.make`` (or of a subclass
            of its classes), or a served env from ``llm_envs.remote.connect(url)``: an env is deep-copied (a
            remote env's copies are forks of its session on the server), never stepped itself; checks that need
            it rebuilt with other arguments (token mode, more turns, the other protocol) are skipped.
        checks: names of the checks to run (default: all of :data:`CHECKS`, in that order).
        skip: names of checks to leave out.
        raise_errors: raise the first failure's :class:`EnvCheckError` (its ``.report`` holds them all); with
            False, return the report and let the caller read ``report.failed``.
        **make_kwargs: arguments of ``llm_envs.make`` (``protocol=`` checks that protocol only;
            ``data_path=``, ``tokenizer=``, ``max_new_tokens=``, ...).

    Returns:
        A :class:`CheckReport`: what passed (and in how many seconds), what was skipped and why.
    """
    __tracebackhide__ = True
    return run_checks(Subject.of(env_or_id, make_kwargs), checks, skip, raise_errors)


def check_task(task: Task, *, checks: Any = None, skip: Any = (), raise_errors: bool = True,
               **env_kwargs: Any) -> CheckReport:
    """:func:`check_env` for a :class:`~llm_envs.Task` object, unregistered: its envs are the protocol classes
    (``ParallelLLMEnv(task, **env_kwargs)``, ``SequentialLLMEnv(...)``) for each protocol the task allows."""
    __tracebackhide__ = True
    return run_checks(Subject.of_task(task, env_kwargs), checks, skip, raise_errors)


def run_check(env_or_id: Any, check: str, **make_kwargs: Any) -> CheckReport:
    """One check inside a pytest test: a check that does not apply skips the test, a failure fails it with the
    check's message (no traceback into the checks)."""
    import pytest

    report = check_env(env_or_id, checks=[check], raise_errors=False, **make_kwargs)
    if report.failed:
        pytest.fail(str(report.failed[check]), pytrace=False)
    if check in report.skipped:
        pytest.skip(f"{check}: {report.skipped[check]}")
    return report


def env_test(*env_ids: str, checks: Any = None, **make_kwargs: Any) -> Any:
    """A pytest test function of every check (or ``checks``) on each of ``env_ids``, one test per (id,
    check): ``test_mine = env_test("mine/echo-v0")`` in a test file is the whole test."""
    import pytest

    names = list(CHECKS if checks is None else checks)

    @pytest.mark.parametrize("check", names)
    @pytest.mark.parametrize("env_id", env_ids)
    def test_env_contract(env_id: str, check: str) -> None:
        run_check(env_id, check, **make_kwargs)

    return test_env_contract
