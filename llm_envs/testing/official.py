"""The checks that run PettingZoo's own tests (``parallel_api_test``, ``api_test``, the seed, render and
``max_cycles`` tests) on the subject's envs, their random agents seeded."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from llm_envs.core.task import PROTOCOLS
from llm_envs.testing.episodes import (
    error_text,
)
from llm_envs.testing.report import CheckSkipped, EnvCheckError
from llm_envs.testing.subject import (
    MAX_CYCLES_TURNS,
    MAX_TOKEN_CYCLES,
    OFFICIAL_CYCLES,
    OFFICIAL_TURNS,
    Subject,
    _check,
)


def _official_kwargs(subject: Subject, protocol: str) -> tuple[dict[str, Any], int]:
    """(overrides, num_cycles) for PettingZoo's checks."""
    overrides = subject.turns(OFFICIAL_TURNS)
    env = subject.env(protocol, **overrides)
    cycles = min(3 * env.max_new_tokens, MAX_TOKEN_CYCLES) if env.step_unit == "token" else OFFICIAL_CYCLES
    return overrides, cycles


def _aec_factory(subject: Subject, protocol: str, overrides: Mapping[str, Any]) -> Callable[..., Any]:
    from pettingzoo.utils.conversions import parallel_to_aec

    def build(**k: Any) -> Any:
        env = subject.env(protocol, **overrides, **k)
        return parallel_to_aec(env) if protocol == "parallel" else env

    return build


def _official(check: str, name: str, run: Callable[[], Any]) -> None:
    try:
        run()
    except (CheckSkipped, EnvCheckError):
        raise
    except Exception as err:
        raise EnvCheckError(check, f"PettingZoo's {name} failed: {error_text(err)}") from err


PETTINGZOO_HINT = (
    "PettingZoo's own test failed; its message says which part. With an llm_envs task this is mostly the task "
    "raising (the chained error shows where), or an env subclass that changes the spaces, the agents or what "
    "step/reset return."
)


def seeded_spaces(env: Any) -> Any:
    """``env`` with each agent's action space seeded (0, 1, ...): PettingZoo's random agent and
    render_test draw from them, and unseeded they draw another episode every run. Under a flat
    observation the agent cannot see the action mask, so an unseeded draw of a stop token now and then
    makes the next unmasked draw an action the env refuses (a clear error): a check that passes or fails
    by chance. Seeded, it is the same run every time."""
    for i, agent in enumerate(env.possible_agents):
        env.action_space(agent).seed(i)
    return env


@_check("pettingzoo_parallel", "PettingZoo's parallel_api_test", PETTINGZOO_HINT)
def check_pettingzoo_parallel(subject: Subject) -> list[str] | None:
    from pettingzoo.test import parallel_api_test

    if "parallel" not in subject.protocols:
        if "parallel" in subject.task.protocols:  # an env object of a task that runs both
            raise CheckSkipped("the env given runs the sequential protocol: check its id (or an env of "
                               "protocol='parallel') for the parallel one")
        raise CheckSkipped("the task runs under the sequential protocol only")
    overrides, cycles = _official_kwargs(subject, "parallel")
    _official("pettingzoo_parallel", "parallel_api_test",
              lambda: parallel_api_test(seeded_spaces(subject.env("parallel", **overrides)), num_cycles=cycles))
    return None


@_check("pettingzoo_aec", "PettingZoo's api_test: the sequential env and parallel_to_aec of the parallel one",
        PETTINGZOO_HINT)
def check_pettingzoo_aec(subject: Subject) -> list[str] | None:
    from pettingzoo.test import api_test

    for protocol in subject.protocols:
        overrides, cycles = _official_kwargs(subject, protocol)
        env = seeded_spaces(_aec_factory(subject, protocol, overrides)())
        _official("pettingzoo_aec", f"api_test ({protocol})",
                  lambda env=env, cycles=cycles: api_test(env, num_cycles=cycles))
    return _other_protocol_note(subject)


def _other_protocol_note(subject: Subject) -> list[str] | None:
    missing = [p for p in PROTOCOLS if p not in subject.protocols]
    return [f"the {p} protocol: the task (or the env given) does not run it" for p in missing] or None


@_check("pettingzoo_seed", "PettingZoo's parallel_seed_test and seed_test", PETTINGZOO_HINT
        + " A seed test failing alone: see the determinism check's hint.")
def check_pettingzoo_seed(subject: Subject) -> list[str] | None:
    from pettingzoo.test import parallel_seed_test, seed_test

    for protocol in subject.protocols:
        overrides, cycles = _official_kwargs(subject, protocol)
        if protocol == "parallel":
            _official("pettingzoo_seed", "parallel_seed_test",
                      lambda o=overrides: parallel_seed_test(lambda **k: subject.env("parallel", **o, **k)))
        build = _aec_factory(subject, protocol, overrides)
        _official("pettingzoo_seed", f"seed_test ({protocol})", lambda b=build, c=cycles: seed_test(b, num_cycles=c))
    return _other_protocol_note(subject)


@_check("pettingzoo_render", "PettingZoo's render_test ('ansi' and 'human')", PETTINGZOO_HINT)
def check_pettingzoo_render(subject: Subject) -> list[str] | None:
    from pettingzoo.test import render_test

    for protocol in subject.protocols:
        overrides, _ = _official_kwargs(subject, protocol)
        build = _aec_factory(subject, protocol, overrides)
        _official("pettingzoo_render", f"render_test ({protocol})",
                  lambda b=build: render_test(lambda **k: seeded_spaces(b(**k))))
    return _other_protocol_note(subject)


@_check("pettingzoo_max_cycles", "PettingZoo's max_cycles_test (truncation after max_cycles turns)", PETTINGZOO_HINT)
def check_pettingzoo_max_cycles(subject: Subject) -> list[str] | None:
    import types

    from pettingzoo.test import max_cycles_test

    if "parallel" not in subject.protocols:
        raise CheckSkipped("max_cycles_test needs the parallel protocol (the truncation check covers the sequential)")
    limit = subject.task.max_turns
    if limit is not None and limit < MAX_CYCLES_TURNS:
        raise CheckSkipped(f"max_cycles_test needs {MAX_CYCLES_TURNS} turns per episode; the task allows {limit}")
    aec_protocol = "sequential" if "sequential" in subject.protocols else "parallel"
    turns_kw = {"num_turns": MAX_CYCLES_TURNS}
    subject.env("parallel", **turns_kw, max_cycles=MAX_CYCLES_TURNS)  # an env object skips here
    mod = types.SimpleNamespace(
        env=lambda max_cycles: _aec_factory(subject, aec_protocol, {**turns_kw, "max_cycles": max_cycles})(),
        parallel_env=lambda max_cycles: subject.env("parallel", **turns_kw, max_cycles=max_cycles),
    )
    _official("pettingzoo_max_cycles", "max_cycles_test", lambda: max_cycles_test(mod))
    return None
