"""The checks behind :func:`llm_envs.testing.check_env`: one function per property of the env contract
(docs/env-contract.md), each raising :class:`EnvCheckError` with the property's name, the agent and
the problem where it failed and how to fix the usual causes. No torch, no pytest at import.

==============  ====================================================================================
subject         the settings, the registry of checks (name, what must hold, hint) and the subject
official        PettingZoo's own tests
contract        spaces, state, infos, determinism, options, text vs ids, bad actions, reward bounds
token_mode      one token a step ends every turn as whole responses do
copies          render, copy, vector, truncation
checks          (here) their order, :func:`describe_checks` and :func:`run_checks`
==============  ====================================================================================
"""

from __future__ import annotations

import time
from collections.abc import Iterable

# isort: off
# Imported in the order check_env runs the checks: each module registers its own.
import llm_envs.testing.official
import llm_envs.testing.contract
import llm_envs.testing.token_mode
import llm_envs.testing.copies  # noqa: F401
# isort: on
from llm_envs.testing.episodes import error_text
from llm_envs.testing.official import seeded_spaces
from llm_envs.testing.report import CheckReport, CheckSkipped, EnvCheckError
from llm_envs.testing.subject import _CHECKS, PETTINGZOO_CHECKS, Subject, _quiet

__all__ = [
    "CHECKS", "PETTINGZOO_CHECKS", "Subject", "checks_table", "describe_checks", "run_checks", "seeded_spaces",
]

CHECKS: tuple[str, ...] = tuple(_CHECKS)
"""Every check's name, in the order :func:`check_env` runs them."""


def describe_checks() -> dict[str, str]:
    """{check: what it checks}."""
    return {name: check.what for name, check in _CHECKS.items()}


def checks_table(width: int = 104) -> str:
    """The checks and what each must hold as a reStructuredText table: the table of
    :mod:`llm_envs.testing`'s docstring, made from the checks' own descriptions.

    >>> print(checks_table().splitlines()[3])
    pettingzoo_parallel    PettingZoo's parallel_api_test
    """
    import textwrap

    first = max(len("check"), *(len(name) for name in _CHECKS)) + 2
    rule = "=" * (first - 2) + "  " + "=" * (width - first)
    rows = [rule, f"{'check':<{first}}what must hold", rule]
    for name, what in describe_checks().items():
        lines = textwrap.wrap(what, width - first) or [""]
        rows += [f"{name if i == 0 else '':<{first}}{line}" for i, line in enumerate(lines)]
    return "\n".join([*rows, rule])


# ---------------------------------------------------------------------------------------- entry points
def _selected(checks: Iterable[str] | None, skip: Iterable[str]) -> list[str]:
    chosen = list(CHECKS if checks is None else ([checks] if isinstance(checks, str) else checks))
    skip = [skip] if isinstance(skip, str) else list(skip)
    unknown = [c for c in [*chosen, *skip] if c not in _CHECKS]
    if unknown:
        raise ValueError(f"Unknown check(s) {unknown}; the checks are {list(CHECKS)}.")
    return [c for c in chosen if c not in skip]


def run_checks(subject: Subject, checks: Iterable[str] | None = None, skip: Iterable[str] = (),
               raise_errors: bool = True) -> CheckReport:
    """Run the checks on ``subject``; see :func:`check_env`."""
    __tracebackhide__ = True
    selected = _selected(checks, skip)
    report = CheckReport(subject.name, what={name: _CHECKS[name].what for name in selected})
    for name in selected:
        start = time.perf_counter()
        try:
            with _quiet():
                notes = _CHECKS[name].run(subject)
        except CheckSkipped as why:
            report.skipped[name] = str(why)
        except EnvCheckError as err:
            report.failed[name] = err
        except Exception as err:
            wrapped = EnvCheckError(name, f"{error_text(err)}")
            wrapped.__cause__ = err
            report.failed[name] = wrapped
        else:
            report.passed[name] = time.perf_counter() - start
            if notes:
                report.notes[name] = list(notes)
    for name, err in report.failed.items():
        err.subject, err.report = subject.name, report
        if err.hint is None:
            err.hint = _CHECKS[name].hint
    if report.failed and raise_errors:
        raise next(iter(report.failed.values()))
    return report
