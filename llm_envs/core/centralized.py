"""The centralised wrapper: one agent writes every role of a parallel env in one response, as tagged
sections named after the roles; the wrapped task's joint reward scores the split. This is the
single-model baseline of multi-agent training (CoMLRL's centralised MAGRPO): the same task, the same
reward, one policy instead of a team. Docs: docs/centralized.md.

=====================  ==========================================================================
Agents                 one, ``central`` (:data:`AGENT`)
Observation space      as every env's (:mod:`llm_envs.core.base`): the token ids of the central prompt
Action space           ``Box(0, V-1, (max_new_tokens,), int64)``; ``max_new_tokens`` defaults to the sum
                       of the roles' (N roles x the wrapped env's); a ``str`` is accepted and tokenized
Prompt                 a header naming the roles, each role's own prompt of the turn (the task and its
                       instructions) under ``### Role: <name>``, then the format required
                       (``<brief>...</brief>`` per role, in role order), through the tokenizer's
                       chat template (``chat_template=False`` turns it off); ``max_prompt_tokens``
                       defaults to N x the wrapped task's plus :data:`FORMAT_TOKENS`
Reward                 the wrapped task's joint reward of the parsed sections (per-role rewards of the
                       wrapped task do not apply: the one agent gets the joint reward)
Infos                  the wrapped env's keys (``reward_<component>`` of every wrapped component) and
                       ``reward_sections_found``: the fraction of roles whose section the response held
                       (a format diagnostic; it does not add to the reward)
Termination            as the wrapped env: after ``num_turns`` turns (truncation after ``max_cycles``)
Transcript             ``render()``/``transcript()`` show the response, then each role's parsed
                       section (``--- section [<role>] ---``) and the wrapped task's feedback per role;
                       ``transcript_turns()``' ``responses`` hold the whole response under ``central``
                       and each role's parsed section under the role's name
=====================  ==========================================================================

Parse rules (:func:`split_sections`)
------------------------------------
1. A role's section opens with ``<role>`` and closes with ``</role>``; tag names match case-insensitively
   and may have spaces inside the brackets (``< brief >``, ``</ brief>``).
2. Sections are matched by name, in any order.
3. A role with no section gets an empty response (``""``); a response with no section at all gives
   every role an empty response.
4. A repeated tag: the role's first section counts; later ones are ignored.
5. An unclosed section runs to the next tag of any role (opening or closing) or, if there is none, to
   the end of the response (a response cut at ``max_new_tokens`` keeps its last section). So a
   section also ends where another role's tag starts inside it: ``<a>x<b>y</b></a>`` gives a="x", b="y".
6. Each section's text is stripped of leading and trailing whitespace; text outside sections is ignored.

Multi-turn: each turn the central prompt carries every role's prompt of that turn, which the wrapped
task builds from the role's own section of the previous turn and its feedback per role. With a
``transition``, the transition writes the one agent's next prompt from its whole response.

Build one with ``llm_envs.make(env_id, centralized=True)`` (so that ``make_vec`` and anything that
rebuilds envs from env kwargs gets it) or wrap an env you have with :func:`centralize`. Only the
parallel protocol can be centralised (a sequential env's later roles read the earlier roles' responses
of the same turn), and the roles must share one tokenizer.

Version history: v0 (initial).

>>> import llm_envs
>>> env = llm_envs.make("writing/xsum-v0", centralized=True)
>>> env.possible_agents, env.roles, env.max_new_tokens
(['central'], ('brief', 'detailed'), 512)
>>> obs, infos = env.reset(seed=0)
>>> _, rewards, *_, infos = env.step({"central": "<detailed>A longer summary.</detailed><brief>Short.</brief>"})
>>> env.history[-1].outputs["central"].text[:10], infos["central"]["reward_sections_found"]
('<detailed>', 1.0)
>>> split_sections("<brief> Short. </brief> chatter <detailed>Long", ("brief", "detailed"))
{'brief': 'Short.', 'detailed': 'Long'}
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from llm_envs.core.parallel import ParallelLLMEnv
from llm_envs.core.task import Context, Problem, Prompt, Response, Task, TurnRecord

AGENT = "central"
"""The one agent of a centralised env."""
SECTIONS_COMPONENT = "sections_found"
"""The component (info ``reward_sections_found``) holding the fraction of roles whose section was found."""
FORMAT_TOKENS = 256
"""Room for the header and the format lines in the default ``max_prompt_tokens``."""

PROMPT_HEADER = (
    "You write the responses of every role of a team ({names}) in one reply. Each role has its own "
    "instructions below; answer each role in that role's section, following that role's instructions."
)
ROLE_BLOCK = "### Role: {role}\n{prompt}"
FORMAT_BLOCK = (
    "Reply with exactly one section per role, in this order, each between its role's tags, and nothing "
    "outside the tags:\n{skeleton}"
)
SKELETON_LINE = "<{role}>\n...\n</{role}>"
TAG_OPEN = "<{role}>"
"""A role's opening tag: with ``prefill`` the env writes the first role's as the response's start."""


@functools.lru_cache(maxsize=64)
def _tag_pattern(roles: tuple[str, ...]) -> re.Pattern[str]:
    names = "|".join(re.escape(r) for r in sorted(roles, key=len, reverse=True))
    return re.compile(rf"<\s*(/?)\s*({names})\s*>", re.IGNORECASE)


def parse_sections(text: str, roles: Sequence[str]) -> tuple[dict[str, str], int]:
    """``(texts, found)``: each role's section by the parse rules of the module docstring, and how many
    roles had a section."""
    roles = tuple(roles)
    by_name = {r.lower(): r for r in roles}
    out = dict.fromkeys(roles, "")
    found: set[str] = set()
    tags = list(_tag_pattern(roles).finditer(text))
    for i, tag in enumerate(tags):
        role = by_name[tag.group(2).lower()]
        if tag.group(1) or role in found:  # a closing tag, or a repeated section: only a boundary
            continue
        found.add(role)
        end = tags[i + 1].start() if i + 1 < len(tags) else len(text)
        out[role] = text[tag.end() : end].strip()
    return out, len(found)


def split_sections(text: str, roles: Sequence[str]) -> dict[str, str]:
    """Each role's text from one centralised response (the parse rules of the module docstring): a
    role without a section gets ``""``.

    >>> split_sections("<b>2</b> <a>1</a> <a>ignored</a>", ["a", "b", "c"])
    {'a': '1', 'b': '2', 'c': ''}
    """
    return parse_sections(text, roles)[0]


def section_format(roles: Sequence[str]) -> str:
    """The skeleton of a well-formed response: one ``<role>...</role>`` block per role, in order."""
    return "\n".join(SKELETON_LINE.format(role=r) for r in roles)


def _as_text(prompt: Prompt) -> str:
    parts = [prompt] if isinstance(prompt, str) else prompt
    return "".join(p if isinstance(p, str) else p.text for p in parts)


class CentralizedTask(Task):
    """A task whose one role (``agent``) writes every role of ``task`` as tagged sections; see the module
    docstring. The wrapped task is ``self.inner``; its roles are ``self.inner_roles``.

    Args:
        task: the wrapped task (it must run under the parallel protocol).
        agent: the name of the one role.
        prefill: the env writes the first role's opening tag (``<brief>``) at the start of every
            response, as the end of the prompt, and the response is read as that tag followed by what
            the model wrote (:meth:`response_prefix`). Off (the default) is the reference's format, in
            which the model writes every tag itself.
    """

    protocols: ClassVar[tuple[str, ...]] = ("parallel",)
    use_chat_template: ClassVar[bool] = True  # the central prompt is an instruction, whatever the roles'

    def __init__(self, task: Task, agent: str = AGENT, prefill: bool = False) -> None:
        if isinstance(task, CentralizedTask):
            raise ValueError("The task is centralised already; wrap the original task.")
        if not isinstance(task, Task):
            raise TypeError(f"task must be a llm_envs Task, got {type(task).__name__}.")
        if "parallel" not in task.protocols:
            raise ValueError(
                f"Task {type(task).__name__} runs under the protocols {list(task.protocols)}; centralising needs "
                "the parallel protocol."
            )
        roles = tuple(task.roles)
        if not roles:
            raise ValueError(f"Task {type(task).__name__} defines no roles.")
        if len({r.lower() for r in roles}) != len(roles):
            raise ValueError(f"Role names must differ in more than case to be section tags, got {list(roles)}.")
        if SECTIONS_COMPONENT in task.reward_components:
            raise ValueError(
                f"Task {type(task).__name__} has a reward component named {SECTIONS_COMPONENT!r}, the name the "
                "wrapper gives its own."
            )
        if not isinstance(agent, str) or not agent:
            raise ValueError(f"agent must be a non-empty string, got {agent!r}.")
        if not isinstance(prefill, bool):
            raise ValueError(f"prefill must be True or False, got {prefill!r}.")
        n = len(roles)
        self.prefill = prefill
        self.prefix = TAG_OPEN.format(role=roles[0]) if prefill else ""
        self.inner = task
        self.inner_roles = roles
        self.agent = agent
        self.roles = (agent,)  # type: ignore[misc]
        self.reward_components = (*task.reward_components, SECTIONS_COMPONENT)  # type: ignore[misc]
        self.default_max_new_tokens = n * task.default_max_new_tokens  # type: ignore[misc]
        self.default_max_prompt_tokens = n * task.default_max_prompt_tokens + FORMAT_TOKENS  # type: ignore[misc]
        self.max_reward = task.max_reward  # type: ignore[misc]
        self.min_reward = task.min_reward  # type: ignore[misc]
        self.max_turns = task.max_turns  # type: ignore[misc]
        inner_description = task.description or type(task).__name__
        self.description = f"One model writes every role ({', '.join(roles)}) of: {inner_description}"  # type: ignore[misc]

    def split(self, text: str) -> dict[str, str]:
        """Each wrapped role's text from one response of the agent (:func:`split_sections`; with
        ``prefill``, of the prefilled tag followed by ``text``)."""
        return split_sections(self.prefix + text, self.inner_roles)

    def response_prefix(self, role: str) -> str:
        """With ``prefill``, the first role's opening tag (``<brief>``): the model writes that role's text
        first; else ``""``."""
        return self.prefix

    def _inner_components(self, components: Mapping[str, float]) -> dict[str, float]:
        return {c: components[c] for c in self.inner.reward_components}

    def _inner_history(self, problem: Problem, history: Sequence[TurnRecord]) -> tuple[TurnRecord, ...]:
        """The finished turns as the wrapped task would have seen them: each role's own section as its
        response, the wrapped task's feedback per role (what :meth:`feedback` recorded)."""
        records = []
        for record in history:
            texts = self.split(record.outputs[self.agent].text)
            components = self._inner_components(record.components)
            records.append(TurnRecord(
                outputs={r: Response(ids=(), text=texts[r], agent=r) for r in self.inner_roles},
                reward=record.reward,
                components=components,
                agent_rewards=self.inner.agent_rewards(problem, texts, record.reward, components),
                feedback=dict(record.feedback),
            ))
        return tuple(records)

    def problems(self, split: str) -> Sequence[Problem]:
        return self.inner.problems(split)

    def prompt(self, role: str, problem: Problem, context: Context) -> Prompt:
        inner = Context(turn=context.turn, num_turns=context.num_turns,
                        history=self._inner_history(problem, context.history))
        blocks = [
            ROLE_BLOCK.format(role=r, prompt=_as_text(self.inner.prompt(r, problem, inner)).strip())
            for r in self.inner_roles
        ]
        return "\n\n".join([
            PROMPT_HEADER.format(names=", ".join(self.inner_roles)),
            *blocks,
            FORMAT_BLOCK.format(skeleton=section_format(self.inner_roles)),
        ])

    def reward(self, problem: Problem, outputs: Mapping[str, str]) -> tuple[float, dict[str, float]]:
        texts, found = parse_sections(self.prefix + outputs[self.agent], self.inner_roles)
        total, components = self.inner.reward(problem, texts)
        out = {c: float(components[c]) for c in self.inner.reward_components}
        out[SECTIONS_COMPONENT] = found / len(self.inner_roles)
        return float(total), out

    def prepare_rewards(self, turns: Sequence[tuple[Problem, Mapping[str, str]]]) -> None:
        self.inner.prepare_rewards([(problem, self.split(outputs[self.agent])) for problem, outputs in turns])

    def feedback(
        self, problem: Problem, outputs: Mapping[str, str], total: float, components: Mapping[str, float]
    ) -> dict[str, str]:
        """The wrapped task's feedback, per wrapped role (the next central prompt gives each role its own)."""
        texts = self.split(outputs[self.agent])
        return dict(self.inner.feedback(problem, texts, total, self._inner_components(components)))

    def render_turn(self, problem: Problem, outputs: Mapping[str, str]) -> str | None:
        return self.inner.render_turn(problem, self.split(outputs[self.agent]))


def _one_tokenizer(tokenizer: Any, roles: Sequence[str], agent: str) -> Any:
    """The one tokenizer of a centralised env from a ``tokenizer=`` value: a mapping (keyed by the wrapped
    roles or by the agent) must give every key the same tokenizer."""
    if not isinstance(tokenizer, Mapping):
        return tokenizer
    from llm_envs.tokenizers import load_tokenizer

    keys = sorted(tokenizer)
    if keys not in (sorted(roles), [agent]):
        raise ValueError(
            f"tokenizer as a mapping must name the roles {list(roles)} (or the one agent {agent!r}), got {keys}."
        )
    values = list(tokenizer.values())
    loaded = [load_tokenizer(v) for v in values]
    first = loaded[0]
    for key, tok in zip(tokenizer, loaded):
        same = tok is first or (
            tok.get_vocab() == first.get_vocab()
            and (tok.pad_token_id, tok.eos_token_id) == (first.pad_token_id, first.eos_token_id)
        )
        if not same:
            raise ValueError(
                f"A centralised env has one model and one tokenizer, but the tokenizer mapping gives role {key!r} "
                f"another tokenizer than role {next(iter(tokenizer))!r}: pass one tokenizer."
            )
    return values[0]


def _merged_stop_ids(stop_token_ids: Any, roles: Sequence[str], agent: str) -> Any:
    """A mapping of stop ids (keyed by the wrapped roles or the agent) merged into one list."""
    if not isinstance(stop_token_ids, Mapping):
        return stop_token_ids
    unknown = [k for k in stop_token_ids if k not in roles and k != agent]
    if unknown:
        raise ValueError(f"stop_token_ids as a mapping must name the roles {list(roles)} or {agent!r}, got {unknown}.")
    return sorted({int(t) for ids in stop_token_ids.values() for t in (ids or ())})


class CentralizedEnv(ParallelLLMEnv):
    """A parallel env with one agent that writes every role of ``task`` in one response (see the module
    docstring). Build it with ``llm_envs.make(env_id, centralized=True)`` or :func:`centralize`.

    Args:
        task: the wrapped task (or a :class:`CentralizedTask`).
        agent: the one agent's name (default ``"central"``).
        prefill: the env writes the first role's opening tag at the start of each response
            (:class:`CentralizedTask`); off: the reference's format.
        **kwargs: the env arguments of :class:`~llm_envs.core.base.LLMEnvCore`; ``max_new_tokens`` and
            ``max_prompt_tokens`` are the one agent's (defaults: see the module docstring); ``tokenizer``
            and ``stop_token_ids`` may be mappings keyed by the wrapped roles if every role has the same
            tokenizer (a centralised env has one).
    """

    def __init__(self, task: Task, *, agent: str = AGENT, prefill: bool = False, **kwargs: Any) -> None:
        central = task if isinstance(task, CentralizedTask) else CentralizedTask(task, agent=agent, prefill=prefill)
        roles = central.inner_roles
        if "tokenizer" in kwargs:
            kwargs["tokenizer"] = _one_tokenizer(kwargs["tokenizer"], roles, central.agent)
        if "stop_token_ids" in kwargs:
            kwargs["stop_token_ids"] = _merged_stop_ids(kwargs["stop_token_ids"], roles, central.agent)
        super().__init__(central, **kwargs)
        self.metadata["name"] = f"{self.env_id} (centralized)"

    @property
    def agent(self) -> str:
        """The one agent's name."""
        return self.task.agent

    @property
    def roles(self) -> tuple[str, ...]:
        """The wrapped roles, in order (the section tags)."""
        return self.task.inner_roles

    def split(self, text: str) -> dict[str, str]:
        """Each wrapped role's text from one response (:func:`split_sections`)."""
        return self.task.split(text)

    def _resolve_turn(self, outputs: Mapping[str, Response]) -> TurnRecord:
        record = super()._resolve_turn(outputs)
        # The parsed sections go into the transcript right after the response they come from.
        sections = [("section", role, text) for role, text in self.split(outputs[self.agent].text).items()]
        at = max(i for i, entry in enumerate(self._transcript) if entry[0] == "response") + 1
        self._transcript[at:at] = sections
        return record

    def transcript_turns(self) -> list[dict[str, Any]]:
        """As every env's, with each role's parsed section added to a finished turn's ``responses``
        (next to the whole response under the agent's name)."""
        turns = super().transcript_turns()
        for turn in turns:
            if turn["reward"] is not None:
                turn["responses"].update(self.split(turn["responses"][self.agent]))
        return turns


def centralize(env: Any, *, max_new_tokens: int | None = None, max_prompt_tokens: int | None = None,
               agent: str = AGENT, prefill: bool = False) -> CentralizedEnv:
    """A centralised copy of the parallel env ``env``: one agent writes every role as tagged sections
    (see the module docstring). It keeps ``env``'s id, tokenizer, stop ids, turns, render mode, step
    unit, observation format, prompt overflow and transition; ``env`` itself is not changed.

    Args:
        env: a parallel llm_envs env (``llm_envs.make(id)`` of a parallel id) whose agents share one
            tokenizer.
        max_new_tokens: the one agent's action length; default: the sum of the roles' (N x ``env``'s).
        max_prompt_tokens: the longest central prompt; default: N x ``env``'s + :data:`FORMAT_TOKENS`.
        agent: the one agent's name.
        prefill: the env writes the first role's opening tag at the start of each response (the model
            continues it); off (the default): the model writes every tag, the reference's format.

    >>> import llm_envs
    >>> env = llm_envs.centralize(llm_envs.make("coding/humaneval-v0", max_new_tokens=64))
    >>> env.possible_agents, env.max_new_tokens
    (['central'], 128)
    """
    from llm_envs.core.sequential import SequentialLLMEnv

    if isinstance(env, CentralizedEnv):
        raise ValueError(f"Env {env.env_id} is centralised already.")
    if isinstance(env, SequentialLLMEnv):
        raise ValueError(
            f"Env {env.env_id} runs the sequential protocol (later roles read earlier roles' responses of the same "
            "turn); only a parallel env can be centralised: make it with protocol='parallel' if its task allows."
        )
    if not isinstance(env, ParallelLLMEnv):
        raise TypeError(f"centralize() takes a parallel llm_envs env, got {type(env).__name__}.")
    handle = env._tok
    if handle is None:
        raise ValueError(
            f"Env {env.env_id}'s agents have different tokenizers; a centralised env has one model and one tokenizer."
        )
    n = len(env.possible_agents)
    stops = sorted({int(t) for a in env.possible_agents for t in env.stop_token_ids_of(a)})
    wrapped = CentralizedEnv(
        env.task,
        agent=agent,
        prefill=prefill,
        env_id=env.env_id,
        tokenizer=handle.spec if handle.spec is not None else handle.tokenizer,
        max_new_tokens=n * env.max_new_tokens if max_new_tokens is None else max_new_tokens,
        max_prompt_tokens=n * env.max_prompt_tokens + FORMAT_TOKENS if max_prompt_tokens is None else max_prompt_tokens,
        num_turns=env.num_turns,
        max_cycles=env.max_cycles,
        render_mode=env.render_mode,
        prompt_overflow=env.prompt_overflow,
        step_unit=env.step_unit,
        obs_format=env.obs_format,
        stop_token_ids=stops,
        transition=env.transition,
    )
    wrapped.transition_name = env.transition_name
    return wrapped
