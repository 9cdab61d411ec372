"""Turn transitions: what each agent sees on the next turn of a multi-turn episode.

By default an env builds every prompt with its task (``Task.prompt`` with the task's ``feedback`` of
the previous turn). The env's ``transition=`` argument replaces the prompts of later turns with a
function's, so that MARL code outside this project gets the reference's transitions too:

=====================  ==================================================================
``None``               the task's own prompts and feedback (default)
``"level-feedback"``   the same, by name: on the coding tasks this is the reference's level feedback
                       (static checks and test results of the joint attempt)
``"plain"``            self-revision: the agent's first prompt, its own last answer, "revise it"
``"module:function"``  any importable function with the signature below
a callable object      used as is, e.g. ``agents.ExpertTransition`` (a second model that writes
                       edit suggestions; an env never loads a model, so it is passed in built)
=====================  ==================================================================

A transition is called once per env after every turn but the last, with keyword arguments only::

    transition(
        prompt: str,                                  # the problem statement (below)
        agent_completions: list[str],                 # this turn's responses, agents in env order
        prompt_history_per_agent: list[list[str]],    # each agent's prompts so far, this turn's last
        response_history_per_agent: list[list[str]],  # each agent's responses so far, this turn's last
    ) -> list[str]                                    # the next prompt of each agent, in env order

``prompt`` is the problem's ``"prompt"`` field when it has a text one (HumanEval-style coding
problems, the reference's convention), else the first agent's first prompt. Prompts are task text,
before the chat template (the env applies it). Under the sequential protocol a later agent's next
prompt is followed by the earlier agents' responses of that turn. A transition that raises, returns
something other than a list/tuple of one ``str`` per agent, is an error naming it; the env then stays
as it was before the step (parallel protocol).

>>> import llm_envs
>>> env = llm_envs.make("writing/xsum-v0", num_turns=2, transition="plain", max_source_words=20)
>>> _ = env.reset(seed=0)
>>> _ = env.step({a: "A short answer." for a in env.agents})
>>> "Revise your previous answer" in env.text("brief")
True
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

TASK_FEEDBACK = "level-feedback"
"""The registered name of the task's own prompts and feedback (the default)."""

PLAIN_TEMPLATE = "{first}\n\nYour previous answer:\n{last}\n\nRevise your previous answer and give an improved one."

Transition = Callable[..., Any]


def plain(
    prompt: str,
    agent_completions: list[str],
    prompt_history_per_agent: list[list[str]],
    response_history_per_agent: list[list[str]],
) -> list[str]:
    """Self-revision: each agent's first prompt, its own last answer, and a request to revise it.

    >>> plain(prompt="p", agent_completions=["a"], prompt_history_per_agent=[["Q?"]],
    ...       response_history_per_agent=[["a"]])[0].splitlines()[:3]
    ['Q?', '', 'Your previous answer:']
    """
    return [
        PLAIN_TEMPLATE.format(first=prompts[0], last=responses[-1])
        for prompts, responses in zip(prompt_history_per_agent, response_history_per_agent)
    ]


TRANSITIONS: dict[str, Transition | None] = {TASK_FEEDBACK: None, "plain": plain}
"""Registered transition names; ``None`` means the task's own prompts and feedback."""


def resolve(spec: Any) -> tuple[str, Transition | None]:
    """``(name, callable or None)`` of a ``transition=`` value; a clear error for anything else."""
    if spec is None:
        return TASK_FEEDBACK, None
    if isinstance(spec, str):
        if spec in TRANSITIONS:
            return spec, TRANSITIONS[spec]
        if spec == "expert":
            raise ValueError(
                "transition='expert' needs a model, and an env never loads one: pass "
                "transition=agents.ExpertTransition(...) (the learners' --transition expert builds it)."
            )
        if ":" not in spec:
            raise ValueError(
                f"Unknown transition {spec!r}: use one of {sorted(TRANSITIONS)}, an import path "
                "'module:function', or a callable."
            )
        module_name, _, attr = spec.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise ValueError(f"transition {spec!r}: cannot import module {module_name!r} ({err}).") from err
        func = getattr(module, attr, None)
        if func is None or not callable(func):
            raise ValueError(f"transition {spec!r}: module {module_name!r} has no callable {attr!r}.")
        return spec, func
    if callable(spec):
        return getattr(spec, "__qualname__", type(spec).__name__), spec
    raise TypeError(
        f"transition must be None, a registered name {sorted(TRANSITIONS)}, 'module:function' or a callable, "
        f"got {type(spec).__name__}: {spec!r}."
    )


def problem_statement(problem: Mapping[str, Any], first_prompt: str) -> str:
    """The ``prompt`` argument of a transition (see the module docstring)."""
    text = problem.get("prompt")
    return text if isinstance(text, str) else first_prompt


def check_result(name: str, result: Any, agents: list[str]) -> list[str]:
    """The transition's next prompts, or a TypeError naming the transition and what it returned."""
    if (
        not isinstance(result, (list, tuple))
        or len(result) != len(agents)
        or not all(isinstance(p, str) for p in result)
    ):
        shown = repr(result)
        shown = shown if len(shown) <= 120 else shown[:117] + "..."
        raise TypeError(
            f"transition {name} must return a list of {len(agents)} str (one next prompt per agent, in the order "
            f"{agents}), got {type(result).__name__}: {shown}"
        )
    return list(result)
