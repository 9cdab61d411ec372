"""The task abstraction: data + roles + prompts + reward (+ feedback for multi-turn episodes).

A task knows nothing about tokens, agents' turn order or PettingZoo: the protocols in
``llm_envs.core.parallel`` / ``llm_envs.core.sequential`` decide who sees what and turn the task's
text into token ids. A task must be cheap to pickle: keep datasets out of instance state (load them
through a module-level cached function, as the built-in tasks do).

Defining a task in a few lines::

    >>> from llm_envs.core.task import TemplateTask
    >>> task = TemplateTask(
    ...     roles=("writer", "critic"),
    ...     problems=[{"topic": "tides"}, {"topic": "volcanoes"}],
    ...     prompts={"writer": "Write one sentence about {topic}.",
    ...              "critic": "Name one fact about {topic} a writer might miss."},
    ...     reward=lambda problem, outputs: float(problem["topic"] in outputs["writer"]),
    ... )
    >>> task.reward(task.problems("train")[0], {"writer": "The tides rise.", "critic": "Moon."})
    (1.0, {'reward': 1.0})
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Union

SPLITS = ("train", "eval")
PROTOCOLS = ("parallel", "sequential")

Problem = Mapping[str, Any]


@dataclass(frozen=True)
class Response:
    """One agent's response of one turn: its token ids as generated (up to the first EOS/pad,
    excluded) and their decoded text."""

    ids: tuple[int, ...]
    text: str
    agent: str | None = field(default=None, compare=False, repr=False)
    """The env agent that wrote it (the env sets it). An agent whose tokenizer differs from the
    writer's reads the response as its ``text``, re-encoded with its own tokenizer."""


PromptPart = Union[str, Response]  # noqa: UP007 (a runtime alias; `|` needs 3.10 objects)
"""A prompt is a string, or a list of strings and :class:`Response` objects. A ``Response`` part is
spliced into the prompt as its original token ids (not re-tokenized), so that, for example, CORY's
observer sees the pioneer's tokens exactly as generated, when the reading agent has the writer's
tokenizer. With a tokenizer per agent (``make(id, tokenizer={agent: tok})``) text is the interface:
an agent with another tokenizer reads the part's text encoded with its own (as does any agent of a
mixed team for a ``Response`` with no ``agent``)."""
Prompt = Union[str, Sequence[PromptPart]]  # noqa: UP007


@dataclass(frozen=True)
class TurnRecord:
    """What happened in one finished turn."""

    outputs: Mapping[str, Response]
    reward: float
    components: Mapping[str, float]
    agent_rewards: Mapping[str, float]
    feedback: Mapping[str, str]
    next_prompts: Mapping[str, str] = field(default_factory=dict)
    """With a ``transition`` (llm_envs.transitions): each role's next prompt, from the transition."""
    transition_s: float = 0.0
    """Seconds the transition took to write the next prompts (0 without one)."""


@dataclass(frozen=True)
class Context:
    """What a role may see when its prompt is built.

    ``visible`` holds the outputs of the roles that acted before it in the current turn (sequential
    protocol only; empty under the parallel protocol). ``history`` holds the finished turns.
    """

    turn: int = 0
    num_turns: int = 1
    history: tuple[TurnRecord, ...] = ()
    visible: Mapping[str, Response] = field(default_factory=dict)

    def previous(self, role: str) -> Response | None:
        """The role's own response of the previous turn (``None`` on the first turn)."""
        return self.history[-1].outputs.get(role) if self.history else None

    def feedback(self, role: str) -> str | None:
        """Feedback for the role on the previous turn (``None`` on the first turn)."""
        return self.history[-1].feedback.get(role) if self.history else None


class Task:
    """Base class of all tasks. Subclasses set the class attributes and implement
    :meth:`problems`, :meth:`prompt` and :meth:`reward`; :meth:`feedback` and
    :meth:`agent_rewards` have sensible defaults.
    """

    roles: ClassVar[tuple[str, ...]] = ()
    """Role names, in acting order for the sequential protocol; they are the env's agent ids."""
    reward_components: ClassVar[tuple[str, ...]] = ()
    """Names of the reward's components (fixed: they become info keys)."""
    protocols: ClassVar[tuple[str, ...]] = PROTOCOLS
    """Protocols under which the task makes sense."""
    use_chat_template: ClassVar[bool] = True
    """Default for the env's ``chat_template`` argument (continuation tasks set False)."""
    default_max_new_tokens: ClassVar[int] = 256
    default_max_prompt_tokens: ClassVar[int] = 1024
    max_reward: ClassVar[float] = math.inf
    """Highest joint reward of a turn (inf: not declared); ``llm_envs.testing.check_env`` holds rewards to it."""
    min_reward: ClassVar[float] = -math.inf
    """Lowest joint reward of a turn (-inf: not declared)."""
    max_turns: ClassVar[int | None] = None
    """Most turns an episode may have (None: any); ``make`` rejects a larger ``num_turns``."""
    description: ClassVar[str] = ""

    def problems(self, split: str) -> Sequence[Problem]:
        """The problems of a split (``"train"`` or ``"eval"``), in a fixed order."""
        raise NotImplementedError

    def prompt(self, role: str, problem: Problem, context: Context) -> Prompt:
        """The prompt text for ``role`` (without chat template: the env applies it)."""
        raise NotImplementedError

    def reward(self, problem: Problem, outputs: Mapping[str, str]) -> tuple[float, dict[str, float]]:
        """Joint reward of the roles' texts: ``(total, {component: value})`` with the keys of
        :attr:`reward_components`."""
        raise NotImplementedError

    def prepare_rewards(self, turns: Sequence[tuple[Problem, Mapping[str, str]]]) -> None:
        """Optional: compute the rewards of many finished turns at once, before :meth:`reward` is asked
        for each of them. A vector env calls it with every env's ``(problem, outputs)`` of a step. The
        default does nothing; a task whose reward is slow but batches well (the coding tasks run all
        the programs concurrently in the sandbox) computes and caches them here."""

    def agent_rewards(
        self, problem: Problem, outputs: Mapping[str, str], total: float, components: Mapping[str, float]
    ) -> dict[str, float]:
        """Reward per role; by default every role gets the joint reward."""
        return dict.fromkeys(self.roles, float(total))

    def feedback(
        self, problem: Problem, outputs: Mapping[str, str], total: float, components: Mapping[str, float]
    ) -> dict[str, str]:
        """Feedback per role for its next turn; by default the reward and its components."""
        parts = ", ".join(f"{name} {value:.2f}" for name, value in components.items())
        text = f"Your team's previous attempt scored {total:.2f} ({parts}). Improve on it."
        return dict.fromkeys(self.roles, text)

    def render_turn(self, problem: Problem, outputs: Mapping[str, str]) -> str | None:
        """Text drawn after a finished turn in the ``ansi`` render, for example the board with the
        roles' answers applied; None (the default) draws nothing."""
        return None

    def response_prefix(self, role: str) -> str:
        """Text the env writes at the start of ``role``'s response, as the end of its prompt (after the
        chat template's assistant header): the model continues it, and the task reads its response as
        this prefix followed by what the model wrote. ``""`` (the default): none."""
        return ""

    def check_split(self, split: str) -> str:
        if split not in SPLITS:
            raise ValueError(f"Unknown split {split!r}; expected one of {SPLITS}.")
        return split


class CollectiveReward:
    """Mixin for tasks whose roles are scored one by one and rewarded together, as in CORY: the total
    is the sum of the per-role scores :meth:`role_scores`, the components are
    ``<component_prefix>_<role>``, and with ``individual_rewards`` each agent gets its own score.
    Put it before the :class:`Task` base: ``class MyTask(CollectiveReward, MyBaseTask)``.
    """

    component_prefix: ClassVar[str] = "score"
    individual_rewards: bool = False
    roles: ClassVar[tuple[str, ...]]

    def set_individual_rewards(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise ValueError(f"individual_rewards must be True or False, got {value!r}.")
        self.individual_rewards = value

    def role_scores(self, problem: Problem, outputs: Mapping[str, str]) -> dict[str, float]:
        """The score of each role's own output."""
        raise NotImplementedError

    def reward(self, problem: Problem, outputs: Mapping[str, str]) -> tuple[float, dict[str, float]]:
        scores = self.role_scores(problem, outputs)
        components = {f"{self.component_prefix}_{role}": float(scores[role]) for role in self.roles}
        return sum(components.values()), components

    def agent_rewards(
        self, problem: Problem, outputs: Mapping[str, str], total: float, components: Mapping[str, float]
    ) -> dict[str, float]:
        if self.individual_rewards:
            return {role: float(components[f"{self.component_prefix}_{role}"]) for role in self.roles}
        return dict.fromkeys(self.roles, float(total))


def check_single_turn(task: object, context: Context) -> None:
    """Refuse an episode of more than one turn for a single-turn task."""
    if context.num_turns != 1:
        raise ValueError(
            f"{type(task).__name__} is a single-turn task, got num_turns={context.num_turns}: make "
            "the env with num_turns=1."
        )


NO_RESPONSE = Response(ids=(), text="")
"""What a role has said before it acted (an AEC env may be observed at any time): nothing."""


class PioneerObserver(CollectiveReward):
    """Mixin for CORY's pair of roles on a single-turn task: the ``pioneer`` reads the single-agent
    task's ``pioneer_prompt(problem)``, then the ``observer`` reads its own prompt with the pioneer's response
    spliced in as token ids (:meth:`observer_prompt` gives the text around it), under the sequential
    protocol; the roles are scored one by one and rewarded together (:class:`CollectiveReward`). Put it
    before the single-agent task it extends: ``class MyCoryTask(PioneerObserver, MyTask)``.
    """

    roles: ClassVar[tuple[str, ...]] = ("pioneer", "observer")
    protocols: ClassVar[tuple[str, ...]] = ("sequential",)

    def observer_prompt(self, problem: Problem) -> tuple[str, str]:
        """The observer's prompt as the text before and the text after the pioneer's response."""
        raise NotImplementedError

    def prompt(self, role: str, problem: Problem, context: Context) -> Prompt:
        check_single_turn(self, context)
        if role == "pioneer":
            return self.pioneer_prompt(problem)
        if role != "observer":
            raise KeyError(f"Unknown role {role!r}; this task's roles are {self.roles}.")
        before, after = self.observer_prompt(problem)
        return [before, context.visible.get("pioneer", NO_RESPONSE), after]


def format_prompt(template: str, problem: Problem, context: Context) -> str:
    """Fill ``template`` with the problem's fields and the visible responses' texts (by role name)."""
    values = dict(problem)
    values.update({role: response.text for role, response in context.visible.items()})
    try:
        return template.format(**values)
    except KeyError as err:
        raise KeyError(
            f"Prompt template {template!r} uses the field {err.args[0]!r}, which is neither a problem field "
            f"({sorted(problem)}) nor a visible role ({sorted(context.visible)})."
        ) from None


class TemplateTask(Task):
    """A task from plain values: problems, one ``str.format`` template per role and a reward function
    ``reward(problem, outputs) -> float | (float, dict)``. The same problems serve both splits unless
    ``eval_problems`` is given. On later turns the role's previous answer and the feedback are appended.
    """

    def __init__(
        self,
        roles: Sequence[str],
        problems: Sequence[Problem],
        prompts: Mapping[str, str],
        reward: Callable[[Problem, Mapping[str, str]], Any],
        eval_problems: Sequence[Problem] | None = None,
        reward_components: Sequence[str] = ("reward",),
        chat_template: bool = True,
    ) -> None:
        if not roles or len(set(roles)) != len(roles):
            raise ValueError(f"roles must be non-empty and unique, got {list(roles)!r}.")
        missing = [r for r in roles if r not in prompts]
        if missing:
            raise ValueError(f"No prompt template for roles {missing}; got templates for {sorted(prompts)}.")
        if not problems:
            raise ValueError("problems must be a non-empty sequence.")
        self.roles = tuple(roles)  # type: ignore[misc]
        self.reward_components = tuple(reward_components)  # type: ignore[misc]
        self.use_chat_template = chat_template  # type: ignore[misc]
        self._problems = {"train": list(problems), "eval": list(eval_problems or problems)}
        self._prompts = dict(prompts)
        self._reward = reward

    def problems(self, split: str) -> Sequence[Problem]:
        return self._problems[self.check_split(split)]

    def prompt(self, role: str, problem: Problem, context: Context) -> Prompt:
        text = format_prompt(self._prompts[role], problem, context)
        previous = context.previous(role)
        if previous is not None:
            text += f"\n\nYour previous answer:\n{previous.text}\n\nFeedback:\n{context.feedback(role)}"
        return text

    def reward(self, problem: Problem, outputs: Mapping[str, str]) -> tuple[float, dict[str, float]]:
        value = self._reward(problem, outputs)
        if isinstance(value, tuple):
            total, components = value
            return float(total), {k: float(components[k]) for k in self.reward_components}
        return float(value), {self.reward_components[0]: float(value)}
