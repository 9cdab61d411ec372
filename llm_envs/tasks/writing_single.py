"""Single-agent writing (the MAGRPO paper's single-model baseline): one role writes both parts of the
text in one response; the response is split in two and scored by the two-role writing reward.

=====================  ==========================================================================
Ids                    ``writing/xsum-single-v0`` (``split="reference"``),
                       ``writing/xsum-single-strict-v0`` (``split="strict"``)
Protocol               parallel (one role; the sequential protocol is the same episode)
Agents                 ``writer``: writes the concise part, ``[PARAGRAPH_SPLIT]``, then the longer part
Observation / action   token ids (see :mod:`llm_envs.core.base`); max_new_tokens 512 by default
                       (the two roles of ``writing/xsum-v0`` have 256 each)
Reward                 :func:`llm_envs.rewards.single_writer.single_writer_reward` (max 3.0): the
                       ``writing/xsum-v0`` reward of the two parts; components in infos as
                       ``reward_<name>``: the five writing components plus ``delimiter`` (1.0 when the
                       response holds ``[PARAGRAPH_SPLIT]``) and ``marker`` (1.0 when the reference
                       policy cut at a "Paragraph 2:" label), which do not add to the total
Episode                one turn by default; ``num_turns > 1`` adds feedback on the previous attempt
=====================  ==========================================================================

Arguments
---------
- ``split``: ``"reference"`` (the reference's ``train_grpo.py``: the delimiter, else a "Paragraph 2:"
  label, else a cut at one third of the characters) or ``"strict"`` (the delimiter only: a response
  without it scores 0.0). See :mod:`llm_envs.rewards.single_writer`.
- ``source``, ``data_path``, ``max_source_words``: as for :class:`llm_envs.tasks.writing.WritingTask`
  (same problems, same splits). ``source="arxiv"`` uses the arXiv prompt and reward.

The prompt is the reference's single-agent prompt (as :func:`llm_envs.tasks.writing.single_agent_prompt`),
through the tokenizer's chat template by default. The embedded SmolLM2-135M-Instruct rarely writes the
delimiter, which is why the split policy matters: under ``strict`` almost every untrained response
scores 0.0 (docs/results.md measures both).

Version history: v0 (initial).

>>> import llm_envs
>>> env = llm_envs.make("writing/xsum-single-strict-v0")
>>> obs, infos = env.reset(seed=0)
>>> _, rewards, _, _, infos = env.step({"writer": "A summary without the delimiter."})
>>> rewards["writer"], infos["writer"]["reward_delimiter"]
(0.0, 0.0)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import ClassVar

from llm_envs.core.registry import register
from llm_envs.core.task import Context, Problem, Prompt, Response, Task
from llm_envs.rewards.single_writer import SINGLE_WRITER_COMPONENTS, check_split_policy, single_writer_reward
from llm_envs.rewards.writing import PARAGRAPH_SPLIT
from llm_envs.tasks.writing import RETRY_FEEDBACK, RETRY_PREVIOUS, SINGLE_AGENT_PROMPTS, WritingTask

ROLE = "writer"
DEFAULT_MAX_NEW_TOKENS = 512


class SingleWriterTask(Task):
    """One role writes both parts of a writing task (see the module docstring).

    Args:
        split: ``"reference"`` or ``"strict"``: how a response is cut into the two parts.
        source: ``"xsum"`` (offline), ``"tldr"`` or ``"arxiv"`` (HF hub or ``data_path``).
        data_path: local copy of the hub dataset (ignored for ``xsum``).
        max_source_words: documents are cut to this many words (marked with ``[...]``).
    """

    roles: ClassVar[tuple[str, ...]] = (ROLE,)
    reward_components: ClassVar[tuple[str, ...]] = SINGLE_WRITER_COMPONENTS
    default_max_new_tokens: ClassVar[int] = DEFAULT_MAX_NEW_TOKENS
    default_max_prompt_tokens: ClassVar[int] = 2048
    max_reward: ClassVar[float] = 3.0

    def __init__(
        self,
        split: str = "reference",
        source: str = "xsum",
        data_path: str | None = None,
        max_source_words: int | None = None,
    ) -> None:
        self.split = check_split_policy(split)
        # The two-role task holds the data, its splits and the argument checks.
        words = {} if max_source_words is None else {"max_source_words": max_source_words}
        self._pair = WritingTask(source=source, data_path=data_path, **words)
        self.source = source
        self.variant = "arxiv" if source == "arxiv" else "tldr"
        self.description = f"One writer produces both parts of the {source} text (split={split})."  # type: ignore[misc]

    def problems(self, split: str) -> Sequence[Problem]:
        return self._pair.problems(split)

    def prompt(self, role: str, problem: Problem, context: Context) -> Prompt:
        # The template itself, not single_agent_prompt(): that refuses an empty source, and one XSum eval
        # document is empty (the two-role env prompts with it too).
        template = SINGLE_AGENT_PROMPTS[self.variant]
        parts: list[str | Response] = [template.format(source=problem["source"].strip(), split=PARAGRAPH_SPLIT)]
        previous = context.previous(role)
        if previous is not None:
            parts += [RETRY_PREVIOUS, previous, RETRY_FEEDBACK.format(feedback=context.feedback(role))]
        return parts

    def reward(self, problem: Problem, outputs: Mapping[str, str]) -> tuple[float, dict[str, float]]:
        return single_writer_reward(outputs[ROLE], split=self.split, variant=self.variant)

    def feedback(
        self, problem: Problem, outputs: Mapping[str, str], total: float, components: Mapping[str, float]
    ) -> dict[str, str]:
        scored = ", ".join(f"{k} {components[k]:.2f}" for k in SINGLE_WRITER_COMPONENTS[:5])
        delimiter = "held" if components["delimiter"] else "did not hold"
        text = (
            f"Score {total:.2f} of {self.max_reward:.1f} ({scored}). Your answer {delimiter} the delimiter "
            f"[PARAGRAPH_SPLIT] between the two paragraphs."
        )
        return {ROLE: text}


register(
    "writing/xsum-single-v0",
    SingleWriterTask,
    protocol="parallel",
    description="One writer produces both XSum summaries in one response (single-agent baseline; "
    "split='reference': delimiter, else 'Paragraph 2:', else one third).",
    source="xsum",
    split="reference",
)
register(
    "writing/xsum-single-strict-v0",
    SingleWriterTask,
    protocol="parallel",
    description="One writer produces both XSum summaries in one response; no [PARAGRAPH_SPLIT], no reward.",
    source="xsum",
    split="strict",
)
