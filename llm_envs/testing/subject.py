"""What every check of :mod:`llm_envs.testing` builds on: the settings the checks play with, the
registry of checks (:func:`_check`: a check's name, what must hold and the hint of its usual causes,
written once beside the check), and the :class:`Subject` the checks build their envs from."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import io
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from llm_envs.core.base import LLMEnvCore
from llm_envs.core.parallel import ParallelLLMEnv
from llm_envs.core.sequential import SequentialLLMEnv
from llm_envs.core.task import PROTOCOLS, SPLITS, Task
from llm_envs.testing.report import CheckSkipped, EnvCheckError

SEED = 11
"""Seed of the episodes the checks play (a second seed, where one is needed, is ``SEED + 1``)."""
TURNS = 3
"""Turns per episode in the multi-turn checks, where the task allows that many and ``num_turns`` is not given."""
OFFICIAL_TURNS = 2
"""Turns per episode in PettingZoo's checks (where the task allows two and ``num_turns`` is not given)."""
OFFICIAL_CYCLES = 4
"""``num_cycles`` of PettingZoo's checks in response mode; in token mode 3 x ``max_new_tokens`` (every turn
resolves within them), at most :data:`MAX_TOKEN_CYCLES`."""
MAX_TOKEN_CYCLES = 48
MAX_CYCLES_TURNS = 6
"""``num_turns`` of PettingZoo's ``max_cycles_test`` (it truncates at 4)."""
PROBLEMS_PER_SPLIT = 4
"""Problems per split whose first observations the spaces and reward checks build: the first ones (a generated eval
split builds its instances in order, so a late index costs every earlier one; the seeded episodes of the other checks
draw problems from anywhere in the train split)."""
TOKEN_MODE_TOKENS = 5
"""``max_new_tokens`` of the token-mode check (responses of every length from 0 to it)."""
VECTOR_ENVS = 2
MAX_PICKLE_BYTES = 1_000_000
"""A pickled env larger than this holds something it should load lazily (a dataset, a model, a pool)."""
SAMPLE_TEXTS = ("The answer is 42, because six times seven is 42.", "A short reply.", "First, list the facts.")
"""Text actions of the text-vs-token-ids check (cut to fit ``max_new_tokens``)."""
QUIET_WARNINGS = (
    # PettingZoo's api_test on the contract's spaces and names (docs/env-contract.md says why they are so).
    "Observation space for each agent probably should be",
    "Observation is not a NumPy array",
    "We recommend agents to be named in the format",
    "Agents have different observation space sizes",
    # Its state_test on the Dict state (docs/env-contract.md, "Global state").
    "State space for each environment probably should be",
    "State is not NumPy array",
    # Its checks reset with options of their own; the env warns that it ignores them.
    "Ignoring unknown reset options",
)
PETTINGZOO_CHECKS = ("pettingzoo_parallel", "pettingzoo_aec", "pettingzoo_seed", "pettingzoo_render")
"""PettingZoo's official checks that apply to every env (``pettingzoo_max_cycles`` needs a multi-turn id)."""


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Subject], list[str] | None]
    what: str
    hint: str


_CHECKS: dict[str, Check] = {}


def _check(name: str, what: str, hint: str) -> Callable:
    def register(fn: Callable[[Subject], list[str] | None]) -> Callable[[Subject], list[str] | None]:
        _CHECKS[name] = Check(name, fn, what, hint)
        return fn

    return register


def _each_protocol(fn: Callable[[Subject, str], None]) -> Callable[[Subject], None]:
    """A check run once under each protocol the subject has."""

    @functools.wraps(fn)
    def run(subject: Subject) -> None:
        for protocol in subject.protocols:
            fn(subject, protocol)

    return run


# ------------------------------------------------------------------------------------ the subject
class Subject:
    """What is checked, and how to build fresh envs of it: from an id (``make``), a task (the protocol
    classes) or an env object (deep copies of it, taken before the checks touch it)."""

    def __init__(self, name: str, protocols: Sequence[str], build: Callable[..., Any], *,
                 task: Task, user_kwargs: Mapping[str, Any], template: Any = None) -> None:
        self.name = name
        self.protocols = tuple(protocols)
        self._build = build
        self.task = task
        self.user_kwargs = dict(user_kwargs)
        self.template = template

    @classmethod
    def of(cls, env_or_id: Any, make_kwargs: Mapping[str, Any]) -> Subject:
        if isinstance(env_or_id, str):
            from llm_envs.core.registry import make

            kwargs = dict(make_kwargs)
            chosen = kwargs.pop("protocol", None)
            probe = make(env_or_id, protocol=chosen, **kwargs)  # unknown ids and kwargs fail here, clearly
            protocols = [chosen] if chosen else [p for p in PROTOCOLS if p in probe.task.protocols]
            def build(protocol: str, **o: Any) -> Any:
                return make(env_or_id, protocol=protocol, **{**kwargs, **o})

            return cls(env_or_id, protocols, build,
                       task=probe.task, user_kwargs=kwargs)
        if isinstance(env_or_id, Task):
            raise TypeError("check_env takes an env id or an env; for a Task object call check_task(task).")
        from llm_envs.remote import RemoteEnv

        if not isinstance(env_or_id, (LLMEnvCore, RemoteEnv)):
            raise TypeError(
                f"check_env takes a registered env id, an llm_envs env (llm_envs.make(...)) or a remote env "
                f"(llm_envs.remote.connect(url)), got {type(env_or_id).__name__}; register a task with "
                "llm_envs.register(...) to check it by id."
            )
        if make_kwargs:
            raise TypeError(f"make kwargs {sorted(make_kwargs)} apply to an env id only, not to an env object.")
        # An env object is only ever copied (a remote env's copy is a fork of its session on the server).
        template = copy.deepcopy(env_or_id)
        name = f"{type(env_or_id).__name__}({env_or_id.env_id}"
        name += f" at {env_or_id.url})" if isinstance(env_or_id, RemoteEnv) else ")"
        return cls(name, [env_or_id.protocol], None, task=env_or_id.task, user_kwargs={}, template=template)

    @classmethod
    def of_task(cls, task: Task, make_kwargs: Mapping[str, Any]) -> Subject:
        if not isinstance(task, Task):
            raise TypeError(f"check_task takes an llm_envs Task, got {type(task).__name__}.")
        kwargs = dict(make_kwargs)
        chosen = kwargs.pop("protocol", None)
        classes = {"parallel": ParallelLLMEnv, "sequential": SequentialLLMEnv}
        protocols = [chosen] if chosen else [p for p in PROTOCOLS if p in task.protocols]
        for p in protocols:
            if p not in classes:
                raise ValueError(f"protocol must be one of {PROTOCOLS}, got {p!r}.")
        classes[protocols[0]](task, **kwargs)  # bad kwargs fail here, clearly
        return cls(type(task).__name__, protocols, lambda protocol, **o: classes[protocol](task, **{**kwargs, **o}),
                   task=task, user_kwargs=kwargs)

    def env(self, protocol: str, **overrides: Any) -> Any:
        """A fresh env of ``protocol`` with ``overrides`` (make kwargs). An env object can only be copied:
        an override that differs from its own value skips the check."""
        if self.template is None:
            return self._build(protocol, **overrides)
        env = copy.deepcopy(self.template)
        for key, value in overrides.items():
            if key == "render_mode":
                env.render_mode = value
            elif getattr(env, key, None) != value:
                raise CheckSkipped(
                    f"needs the env rebuilt with {key}={value!r}: check it by id or with check_task(task)")
        return env

    def turns(self, wanted: int) -> dict[str, int]:
        """``num_turns`` for a multi-turn check: ``wanted`` or the task's maximum, unless the user chose it."""
        if self.template is not None or "num_turns" in self.user_kwargs:
            return {}
        limit = self.task.max_turns
        return {"num_turns": wanted if limit is None else min(wanted, limit)}

    def vector(self, protocol: str, num_envs: int, **overrides: Any) -> Any:
        from llm_envs.core.vector import SequentialVectorEnv, VectorEnv

        cls = VectorEnv if protocol == "parallel" else SequentialVectorEnv
        return cls(lambda: self.env(protocol, **overrides), num_envs)



def _sample_problems(env: Any) -> list[tuple[str, int]]:
    """(split, task_index) pairs: the first :data:`PROBLEMS_PER_SPLIT` problems of each split."""
    out = []
    for split in SPLITS:
        n = len(env.task.problems(split))
        if n == 0:
            raise EnvCheckError("spaces", f"problems({split!r}) is empty: reset(options={{'split': {split!r}}}) has "
                                "nothing to pick", hint="give the task problems in both splits ('train' and 'eval').")
        out += [(split, i) for i in range(min(n, PROBLEMS_PER_SPLIT))]
    return out


@contextlib.contextmanager
def _quiet() -> Any:
    """PettingZoo's warnings about the contract's own spaces and names off; 'human' renders captured."""
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        for text in QUIET_WARNINGS:
            warnings.filterwarnings("ignore", message=f".*{text}")
        yield
