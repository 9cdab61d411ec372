"""The env registry: ids name a task, a data source and a protocol (``coding/humaneval-v0``).

Ids are versioned and behaviour never changes under an existing id: a change gets a new version.
Every registered id is also registered in PettingZoo's own registry (PettingZoo >= 1.27), as an AEC
env (the sequential protocol, or ``parallel_to_aec`` of the parallel one) and, where the task runs
under the parallel protocol, as a parallel env.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llm_envs.core.base import ENV_KWARGS
from llm_envs.core.task import PROTOCOLS, Task

_ID = re.compile(r"^[a-z0-9_]+/[a-z0-9_.]+(?:-[a-z0-9_.]+)*-v\d+$")


@dataclass(frozen=True)
class EnvSpec:
    """A registered env: how to build its task, its default protocol and default kwargs."""

    id: str
    task: Callable[..., Task]
    protocol: str
    description: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def task_params(self) -> set[str] | None:
        """Names the task constructor accepts (None: it takes ``**kwargs``)."""
        params = inspect.signature(self.task).parameters.values()
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return None
        return {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


_REGISTRY: dict[str, EnvSpec] = {}


def register(
    env_id: str,
    task: Callable[..., Task],
    *,
    protocol: str = "parallel",
    description: str = "",
    replace: bool = False,
    **kwargs: Any,
) -> EnvSpec:
    """Register ``env_id``: ``task(**task_kwargs)`` builds the task; ``kwargs`` are default arguments
    for the env (see :data:`~llm_envs.core.base.ENV_KWARGS`) or the task constructor.

    Re-registering an id with a different definition raises: ids never change behaviour. While you
    develop a task of your own (a fixed reward, a re-run notebook cell: a new ``lambda`` is a different
    definition), ``replace=True`` redefines your id in this interpreter; the built-in ids cannot be
    replaced (register a new id or version instead).
    """
    if not _ID.match(env_id):
        raise ValueError(
            f"Env id {env_id!r} must look like 'family/name-v<N>' (lower case, versioned), e.g. 'writing/xsum-v0'."
        )
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}.")
    spec = EnvSpec(id=env_id, task=task, protocol=protocol, description=description, kwargs=dict(kwargs))
    _check_kwargs(spec, kwargs)
    old = _REGISTRY.get(env_id)
    if old is not None and (old.task, old.protocol, old.kwargs) != (task, protocol, spec.kwargs):
        if _is_builtin(old):
            raise ValueError(f"Env id {env_id!r} is built in and cannot be redefined: register your task under an "
                             "id of your own.")
        if not replace:
            raise ValueError(
                f"Env id {env_id!r} is already registered with a different definition. Ids never change "
                "behaviour: give the new definition a new id or version, or pass replace=True to redefine an id "
                "of your own in this interpreter (a fixed task, a re-run notebook cell)."
            )
    _REGISTRY[env_id] = spec
    _register_with_pettingzoo(spec)
    return spec


def _is_builtin(spec: EnvSpec) -> bool:
    """Whether ``spec`` is one of the ids that ``llm_envs.tasks`` registers."""
    return getattr(spec.task, "__module__", "").startswith("llm_envs.tasks.")


def _check_kwargs(spec: EnvSpec, kwargs: dict[str, Any]) -> None:
    allowed = spec.task_params()
    if allowed is None:
        return
    unknown = sorted(k for k in kwargs if k not in ENV_KWARGS and k not in allowed and k != "protocol")
    if unknown:
        raise TypeError(
            f"Unknown argument(s) {unknown} for env {spec.id!r}. Env arguments: {sorted(ENV_KWARGS)}; "
            f"task arguments: {sorted(allowed)}."
        )


def _builtin() -> None:
    import llm_envs.tasks  # noqa: F401  (registers the built-in ids)


def spec(env_id: str) -> EnvSpec:
    """The :class:`EnvSpec` of a registered id (clear error with suggestions for unknown ids)."""
    _builtin()
    if env_id not in _REGISTRY:
        import difflib

        close = difflib.get_close_matches(str(env_id), list(_REGISTRY), n=3)
        hint = f" Did you mean {close}?" if close else ""
        raise KeyError(f"Unknown env id {env_id!r}.{hint} Registered ids: {list_envs()}.")
    return _REGISTRY[env_id]


def list_envs() -> list[str]:
    """All registered env ids, sorted."""
    _builtin()
    return sorted(_REGISTRY)


def describe_envs() -> dict[str, str]:
    """Registered ids with their one-line descriptions."""
    _builtin()
    return {k: _REGISTRY[k].description for k in sorted(_REGISTRY)}


def make(env_id: str, *, protocol: str | None = None, **kwargs: Any) -> Any:
    """Build a registered env.

    Args:
        env_id: a registered id (see :func:`list_envs`).
        protocol: ``"parallel"`` (a ``pettingzoo.ParallelEnv``) or ``"sequential"`` (a
            ``pettingzoo.AECEnv``); default: the id's registered protocol.
        **kwargs: env arguments (``tokenizer``: one, or a mapping ``{agent: tokenizer}``;
            ``max_prompt_tokens``, ``max_new_tokens``, ``num_turns``, ``max_cycles``, ``render_mode``,
            ``chat_template``, ``prompt_overflow``, ``step_unit``, ``obs_format``, ``stop_token_ids``,
            ``transition``) and task arguments (``data_path``, ...), overriding the id's defaults.
            ``centralized=True`` gives the centralised env of a parallel id: one agent writes every role
            as tagged sections (:mod:`llm_envs.core.centralized`; ``max_new_tokens`` and
            ``max_prompt_tokens`` are then the one agent's); with ``prefill=True`` as well, the env
            writes the first role's opening tag at the start of the response (the model continues it).

    >>> import llm_envs
    >>> env = llm_envs.make("writing/xsum-v0")
    >>> env.possible_agents
    ['brief', 'detailed']
    """
    s = spec(env_id)
    merged = {**s.kwargs, **kwargs}
    _check_kwargs(s, kwargs)
    env_kwargs = {k: v for k, v in merged.items() if k in ENV_KWARGS}
    task_kwargs = {k: v for k, v in merged.items() if k not in ENV_KWARGS}
    centralized = env_kwargs.pop("centralized", False)
    if not isinstance(centralized, bool):
        raise ValueError(f"centralized must be True or False, got {centralized!r}.")
    prefill = env_kwargs.pop("prefill", False)
    if not isinstance(prefill, bool):
        raise ValueError(f"prefill must be True or False, got {prefill!r}.")
    if prefill and not centralized:
        raise ValueError("prefill=True writes the first role's opening tag of a centralised response: it needs "
                         "centralized=True.")
    task = s.task(**task_kwargs)
    chosen = s.protocol if protocol is None else protocol
    if chosen not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {PROTOCOLS}, got {chosen!r}.")
    if chosen not in task.protocols:
        raise ValueError(f"Env {env_id!r} supports the protocols {list(task.protocols)}, not {chosen!r}.")
    num_turns = env_kwargs.get("num_turns", 1)
    if task.max_turns is not None and isinstance(num_turns, int) and num_turns > task.max_turns:
        raise ValueError(
            f"Env {env_id!r} allows at most {task.max_turns} turn(s) per episode, got num_turns={num_turns}."
        )
    if centralized:
        if chosen != "parallel":
            raise ValueError(
                f"centralized=True needs a parallel env, and {env_id!r} runs the {chosen} protocol (later roles read "
                "earlier roles' responses of the same turn); use a parallel id (llm-envs list)."
            )
        from llm_envs.core.centralized import CentralizedEnv

        return CentralizedEnv(task, env_id=env_id, prefill=prefill, **env_kwargs)
    if chosen == "parallel":
        from llm_envs.core.parallel import ParallelLLMEnv

        return ParallelLLMEnv(task, env_id=env_id, **env_kwargs)
    from llm_envs.core.sequential import SequentialLLMEnv

    return SequentialLLMEnv(task, env_id=env_id, **env_kwargs)


def make_aec(env_id: str, **kwargs: Any) -> Any:
    """An AEC env for any id: the sequential env, or ``parallel_to_aec`` of a parallel-only id."""
    env = make(env_id, **kwargs)
    if spec(env_id).protocol == "parallel" and "protocol" not in kwargs:
        from pettingzoo.utils.conversions import parallel_to_aec

        return parallel_to_aec(env)
    return env


def _register_with_pettingzoo(s: EnvSpec) -> None:
    try:
        from pettingzoo import register as pz_register
    except ImportError:  # PettingZoo < 1.27 has no registry
        return
    import functools
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # re-imports re-register the same entry points
        if s.protocol == "parallel":
            pz_register("parallel", s.id, entry_point=functools.partial(make, s.id))
            pz_register("aec", s.id, entry_point=functools.partial(make_aec, s.id))
        else:
            pz_register("aec", s.id, entry_point=functools.partial(make, s.id))
