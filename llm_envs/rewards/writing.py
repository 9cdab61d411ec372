"""Writing-collaboration rewards of MAGRPO (Liu et al., "LLM Collaboration with Multi-Agent Reinforcement
Learning", AAAI 2026): two roles write the two parts of one text and share one level-gated reward.

Reference: ``OpenMLRL/LLM_Collab_Writing``, files ``rewards/tldr_rewards.py`` (``tldr_combined_reward``)
and ``rewards/arxiv_rewards.py`` (``arxiv_combined_reward``); single-agent baseline ``train_grpo.py``;
per-component logging ``loggers/tldr_logger.py`` and ``loggers/arxiv_logger.py``. The stop words and
the 12 transition-word categories below are copied from the reward files verbatim.

Roles
-----
| task  | first completion (``first``)        | second completion (``second``)                      |
|-------|-------------------------------------|-----------------------------------------------------|
| TLDR  | concise summary of a Reddit post    | longer elaboration, richer vocabulary               |
| arXiv | background and motivation paragraph | method, contribution and implications paragraph     |

Levels
------
Each level is reached only if the previous one did not stop; a level that stops adds nothing and every
later component is 0.0. ``r = len(second) / len(first)`` in characters; ``u`` = unique words of
``second`` / unique words of ``first``.

| level | component      | TLDR                                   | arXiv                                  |
|-------|----------------|----------------------------------------|----------------------------------------|
| 1     | ``structure``  | 0.5 if both have 8-256 words           | 0.5 if both have 128-256 words         |
| 2     | ``length``     | 1 on r in [1.6, 3.2]; ramps over       | 1 on r in [1.3, 1.6]; ramps over       |
|       |                | [1.1, 1.6) and (3.2, 5.0]              | [0.8, 1.3) and (1.6, 2.0]              |
| 3     | ``diversity``  | 0.5 for u >= 2; ramp over [1.3, 2.0)   | 0.5 on u in [0.7, 1.3]; ramps over     |
|       |                |                                        | [0.5, 0.7) and (1.3, 1.7]              |
| 4     | ``transition`` | 0.4 T, categories found in ``second``  | 0.4 T, categories in ``first+second``  |
| 4     | ``jaccard``    | 0.6 min(J, 0.03) / 0.03                | 0.6 min(J, 0.23) / 0.23                |

Ramps are linear from 0 at the outer end to the level's full value at the inner end; outside the outer
ends (and below 1.3 for TLDR's ``u``) the level stops. Level 4 is reached whenever level 3 did not stop.

``T = 0.4 + 0.05 (k - 1)`` for ``k >= 1`` transition categories found, capped at 1 (0 if none). With the
reference's 12 categories the cap is never reached: the best ``T`` is 0.95, so the best reward is 2.98,
not the 3.0 the reference's docstrings announce. ``J`` is the Jaccard similarity of the two texts'
stop-word-filtered word sets (1.0 if both sets are empty). A ramp's outer end scores 0 but does not stop:
at ``r == 1.1`` or ``r == 5.0`` (TLDR) the length component is 0.0 and levels 3 and 4 are still scored.

Components are named after the reference's logged metrics (``structure_reward``, ``length_reward``,
``diversity_reward``, ``transition_reward``, ``jaccard_reward``); they always have the keys of
``WRITING_COMPONENTS`` and sum to the total.

Reference behaviour kept on purpose (each one changes the numbers)
------------------------------------------------------------------
- Words for level 1 are whitespace-separated tokens (``str.split``); words for levels 3 and 4 are the
  lower-cased matches of ``\\b\\w+\\b``.
- Level 3 counts unique words *with* stop words: the reference's docstrings say "excluding stopwords"
  but its code calls ``count_unique_words(text)`` with ``exclude_stopwords=False``.
- Transition words are matched as substrings of the lower-cased text, not as whole words: "as" is found
  in "has", "if" in "different", "so" in "also". Almost any English text hits a few categories.
- arXiv concatenates the two texts with no separator before looking for transitions.

Where the reference differs from the task brief or from itself
--------------------------------------------------------------
- Two stored versions of ``rewards/arxiv_rewards.py`` disagree on level 2. Commit ``38252a5`` (used
  here, as in our brief) rewards r in [1.3, 1.6] with ramps over [0.8, 1.3) and (1.6, 2.0]; its
  docstring still describes the other version. Commit ``45c74e5`` and ``loggers/arxiv_logger.py``
  reward r in [1.0, 1.3] with ramps over [0.8, 1.0) and (1.3, 1.5].
- The brief mentions a 13-category case for the transition cap: there are 12 categories, so the cap of
  ``transition_score`` is only reachable by calling it with a larger count.
- Single-agent adapters (``tldr_reward_func``, ``arxiv_reward_func``): the reference's
  ``split_response_into_paragraphs`` falls back to a "Paragraph 2:" label and then to a cut at one third
  of the text when the ``[PARAGRAPH_SPLIT]`` marker is missing. Here a missing marker scores 0.0: the
  format is part of the task, and an arbitrary cut rewards text that ignored it. Like the reference, the
  adapters strip both parts and a leading "Paragraph 1:" / "Paragraph 2:" label.

Example
-------
Nine words each side, 123 / 43 = 2.86 times the characters, 19 / 9 unique words, three transition
categories in the elaboration ("while": contrast, concession, time) and a Jaccard similarity of 1/18:

>>> total, parts = tldr_reward("A short summary of the post in eight words.",
...                            "A longer elaboration that adds context, details and more "
...                            "vocabulary, while however keeping the summary's core facts intact.")
>>> round(total, 4), {name: round(value, 4) for name, value in parts.items()}
(2.8, {'structure': 0.5, 'length': 1.0, 'diversity': 0.5, 'transition': 0.2, 'jaccard': 0.6})
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from llm_envs.rewards.trl import LogMetric, completion_texts, log_component_means

WRITING_COMPONENTS = ("structure", "length", "diversity", "transition", "jaccard")

PARAGRAPH_SPLIT = "[PARAGRAPH_SPLIT]"
"""Delimiter between the two parts in the single-agent baseline's output (reference ``train_grpo.py``)."""

STRUCTURE_REWARD = 0.5
LENGTH_REWARD = 1.0
DIVERSITY_REWARD = 0.5
TRANSITION_WEIGHT = 0.4
JACCARD_WEIGHT = 0.6

TLDR_WORDS = (8, 256)
TLDR_LENGTH_RATIO = (1.1, 1.6, 3.2, 5.0)
"""(zero, full from, full to, zero): a trapezoid; outside [zero, zero] the level stops."""
TLDR_UNIQUE_RATIO = (1.3, 2.0, math.inf, math.inf)
TLDR_JACCARD_CAP = 0.03

ARXIV_WORDS = (128, 256)
ARXIV_LENGTH_RATIO = (0.8, 1.3, 1.6, 2.0)
ARXIV_UNIQUE_RATIO = (0.5, 0.7, 1.3, 1.7)
ARXIV_JACCARD_CAP = 0.23

# Copied verbatim from OpenMLRL/LLM_Collab_Writing, rewards/tldr_rewards.py (same list in
# rewards/arxiv_rewards.py). The loggers carry an older, slightly different list; the rewards' list is used.
# fmt: off
STOP_WORDS = frozenset({
    "a", "all", "also", "an", "and", "any", "are", "as", "at", "bad", "be", "been", "being",
    "both", "but", "by", "can", "could", "did", "do", "does", "each", "few", "first", "for",
    "from", "good", "great", "had", "has", "have", "he", "her", "here", "him", "his", "how",
    "i", "if", "in", "is", "it", "its", "just", "last", "left", "little", "long", "low", "many",
    "may", "me", "might", "more", "most", "much", "must", "my", "new", "no", "not", "now", "of",
    "old", "on", "only", "or", "other", "our", "own", "right", "same", "shall", "should", "so",
    "some", "such", "than", "that", "the", "their", "them", "then", "there", "these", "they",
    "this", "those", "to", "too", "us", "very", "was", "we", "were", "what", "when", "where",
    "which", "who", "why", "will", "with", "would", "you", "your",
})

# Copied verbatim (order and duplicates included) from OpenMLRL/LLM_Collab_Writing,
# rewards/tldr_rewards.py and rewards/arxiv_rewards.py (`transition_words`).
TRANSITION_CATEGORIES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "elaboration": (
        "furthermore", "moreover", "additionally", "also", "besides", "in addition",
        "what is more", "not only", "as well as", "along with", "coupled with",
        "together with", "likewise", "similarly", "equally important", "by the same token",
        "in the same way", "correspondingly", "in like manner", "comparatively", "analogously",
    ),
    "examples": (
        "for example", "for instance", "specifically", "particularly", "namely", "such as",
        "including", "especially", "in particular", "to illustrate", "as an illustration",
        "case in point", "to demonstrate", "as evidence", "to exemplify", "notably",
        "markedly", "chiefly", "mainly", "primarily", "above all", "most importantly",
    ),
    "explanation": (
        "that is", "in other words", "to put it simply", "to clarify", "indeed", "in fact",
        "actually", "clearly", "obviously", "to put it another way", "to rephrase",
        "more precisely", "specifically speaking", "what this means is", "the point is",
        "essentially", "basically", "fundamentally", "at its core", "in essence", "simply put",
        "stated differently",
    ),
    "cause_effect": (
        "therefore", "thus", "consequently", "as a result", "hence", "accordingly",
        "for this reason", "due to this", "because of this", "so", "then", "thereby",
        "wherefore", "thence", "ergo", "as a consequence", "in consequence", "it follows that",
        "this leads to", "this results in", "this causes", "this brings about", "owing to",
        "on account of", "thanks to", "resulting from",
    ),
    "contrast": (
        "however", "nevertheless", "nonetheless", "on the other hand", "in contrast", "while",
        "whereas", "although", "even though", "despite this", "but", "yet", "still",
        "conversely", "on the contrary", "rather", "instead", "alternatively", "otherwise",
        "in opposition", "by contrast", "contrarily", "notwithstanding", "regardless",
        "all the same", "even so", "be that as it may", "in any case", "at any rate",
    ),
    "sequence": (
        "first", "second", "third", "next", "then", "after that", "finally", "lastly",
        "initially", "subsequently", "meanwhile", "to begin with", "to start with",
        "in the beginning", "at first", "at the outset", "primarily", "secondly", "thirdly",
        "following this", "afterward", "later", "later on", "in the meantime", "simultaneously",
        "concurrently", "at the same time", "in conclusion", "to conclude", "ultimately",
        "in the end", "to summarize", "in summary",
    ),
    "emphasis": (
        "indeed", "certainly", "surely", "undoubtedly", "without doubt", "definitely",
        "absolutely", "positively", "unquestionably", "indubitably", "of course", "naturally",
        "obviously", "clearly", "evidently", "manifestly", "undeniably", "admittedly",
        "granted", "to be sure", "in fact", "as a matter of fact", "notably", "significantly",
    ),
    "summary": (
        "in summary", "in conclusion", "to summarize", "to conclude", "in short", "in brief",
        "briefly", "to sum up", "on the whole", "overall", "all in all", "in essence",
        "essentially", "basically", "fundamentally", "in the final analysis", "after all",
        "ultimately", "in the end", "when all is said and done", "the bottom line is",
    ),
    "comparison": (
        "similarly", "likewise", "in the same way", "equally", "just as", "comparable to",
        "in comparison", "by the same token", "correspondingly", "in like manner",
        "along the same lines", "in similar fashion", "analogously", "by analogy",
        "just like", "much like", "as with",
    ),
    "concession": (
        "although", "though", "even though", "while", "whereas", "despite", "in spite of",
        "regardless of", "notwithstanding", "admittedly", "granted", "even if",
        "be that as it may", "nevertheless", "nonetheless", "however", "yet", "still",
        "all the same",
    ),
    "condition": (
        "if", "unless", "provided that", "assuming that", "supposing that", "in case",
        "in the event that", "on condition that", "given that", "as long as", "so long as",
        "only if", "even if", "whether or not", "should", "were", "had", "otherwise",
        "or else",
    ),
    "time": (
        "when", "while", "as", "after", "before", "until", "since", "during", "meanwhile",
        "simultaneously", "at the same time", "concurrently", "previously", "formerly",
        "earlier", "later", "afterward", "subsequently", "eventually", "finally", "recently",
        "lately", "nowadays", "currently", "presently", "immediately",
    ),
})
# fmt: on

_WORD = re.compile(r"\b\w+\b")
_LABEL_1 = re.compile(r"^Paragraph 1:\s*", re.IGNORECASE)
_LABEL_2 = re.compile(r"^Paragraph 2:\s*", re.IGNORECASE)


# ---------------------------------------------------------------------------------------------------------
# Text statistics
# ---------------------------------------------------------------------------------------------------------


def _require_str(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}: {value!r:.120}")
    return value


def count_words(text: str) -> int:
    """Whitespace-separated tokens, the reference's level-1 "token" count.

    >>> count_words("  two\\twords\\n")
    2
    """
    return len(_require_str("text", text).split())


def word_set(text: str, *, exclude_stop_words: bool = False) -> frozenset[str]:
    """Distinct lower-cased ``\\b\\w+\\b`` words of ``text``, optionally without ``STOP_WORDS``.

    >>> sorted(word_set("The cat, the CAT and a dog."))
    ['a', 'and', 'cat', 'dog', 'the']
    >>> sorted(word_set("The cat, the CAT and a dog.", exclude_stop_words=True))
    ['cat', 'dog']
    """
    words = _WORD.findall(_require_str("text", text).lower())
    if exclude_stop_words:
        return frozenset(w for w in words if w not in STOP_WORDS)
    return frozenset(words)


def count_unique_words(text: str) -> int:
    """Distinct words including stop words: what the reference's level 3 compares.

    >>> count_unique_words("The cat, the CAT and a dog.")
    5
    """
    return len(word_set(text))


def jaccard_similarity(first: str, second: str) -> float:
    """Jaccard similarity of the stop-word-filtered word sets; 1.0 when both sets are empty.

    >>> jaccard_similarity("red apples and green pears", "green apples")
    0.5
    """
    a = word_set(first, exclude_stop_words=True)
    b = word_set(second, exclude_stop_words=True)
    if not a and not b:
        return 1.0
    return len(a & b) / len(a | b)


def transition_categories(text: str) -> frozenset[str]:
    """Categories of ``TRANSITION_CATEGORIES`` with a phrase occurring anywhere in the lower-cased text
    (substring match, as in the reference: "has" contains the "time" phrase "as").

    >>> sorted(transition_categories("Nevertheless, xyz."))
    ['concession', 'contrast']
    """
    lowered = _require_str("text", text).lower()
    return frozenset(
        category
        for category, phrases in TRANSITION_CATEGORIES.items()
        if any(phrase in lowered for phrase in phrases)
    )


def transition_score(num_categories: int) -> float:
    """``T`` in [0, 1]: 0 without transitions, 0.4 for one category, +0.05 per further category, capped.

    >>> transition_score(0), transition_score(1), transition_score(3)
    (0.0, 0.4, 0.5)
    """
    if isinstance(num_categories, bool) or not isinstance(num_categories, int) or num_categories < 0:
        raise ValueError(f"num_categories must be a non-negative int, got {num_categories!r}")
    if num_categories == 0:
        return 0.0
    return min(0.4 + min((num_categories - 1) * 0.05, 0.6), 1.0)


def _trapezoid(x: float, band: tuple[float, float, float, float]) -> float | None:
    """1 on [full_from, full_to], linear ramps down to 0 at ``zero_low`` and ``zero_high``; None outside
    [zero_low, zero_high], meaning the level stops. Lower ends are inclusive like the reference's ``<=``."""
    zero_low, full_from, full_to, zero_high = band
    if full_from <= x <= full_to:
        return 1.0
    if zero_low <= x < full_from:
        return (x - zero_low) / (full_from - zero_low)
    if full_to < x <= zero_high:
        return 1.0 - (x - full_to) / (zero_high - full_to)
    return None


# ---------------------------------------------------------------------------------------------------------
# Rewards for one pair
# ---------------------------------------------------------------------------------------------------------


def _level_reward(
    first: str,
    second: str,
    *,
    words: tuple[int, int],
    length_band: tuple[float, float, float, float],
    unique_band: tuple[float, float, float, float],
    transitions_in_both: bool,
    jaccard_cap: float,
) -> tuple[float, dict[str, float]]:
    _require_str("first", first)
    _require_str("second", second)
    parts = dict.fromkeys(WRITING_COMPONENTS, 0.0)

    def done() -> tuple[float, dict[str, float]]:
        return sum(parts.values()), parts

    low, high = words
    if not (low <= count_words(first) <= high and low <= count_words(second) <= high):
        return done()
    parts["structure"] = STRUCTURE_REWARD

    # len(first) > 0 here: level 1 asked for at least 8 non-space tokens.
    length = _trapezoid(len(second) / len(first), length_band)
    if length is None:
        return done()
    parts["length"] = LENGTH_REWARD * length

    unique_first = count_unique_words(first)
    if unique_first == 0:  # eight tokens of punctuation: no ratio, the reference stops
        return done()
    diversity = _trapezoid(count_unique_words(second) / unique_first, unique_band)
    if diversity is None:
        return done()
    parts["diversity"] = DIVERSITY_REWARD * diversity

    found = transition_categories(first + second if transitions_in_both else second)
    parts["transition"] = TRANSITION_WEIGHT * transition_score(len(found))
    parts["jaccard"] = JACCARD_WEIGHT * min(jaccard_similarity(first, second), jaccard_cap) / jaccard_cap
    return done()


def tldr_reward(first: str, second: str) -> tuple[float, dict[str, float]]:
    """TLDR reward of one pair: ``first`` is the concise summary, ``second`` the elaboration.

    Returns the total (0 to 2.98) and its components, keyed by ``WRITING_COMPONENTS``.

    >>> tldr_reward("one two three four five six seven", "eight nine ten")  # 7 words: stops at level 1
    (0.0, {'structure': 0.0, 'length': 0.0, 'diversity': 0.0, 'transition': 0.0, 'jaccard': 0.0})
    """
    return _level_reward(
        first,
        second,
        words=TLDR_WORDS,
        length_band=TLDR_LENGTH_RATIO,
        unique_band=TLDR_UNIQUE_RATIO,
        transitions_in_both=False,
        jaccard_cap=TLDR_JACCARD_CAP,
    )


def arxiv_reward(first: str, second: str) -> tuple[float, dict[str, float]]:
    """arXiv abstract-expansion reward of one pair: ``first`` is the background/motivation paragraph,
    ``second`` the method/implications paragraph.

    Returns the total (0 to 2.98) and its components, keyed by ``WRITING_COMPONENTS``.

    >>> total, parts = arxiv_reward("word " * 130, "word " * 130)  # r = 1.0, u = 1.0
    >>> round(total, 4), round(parts["length"], 4)
    (2.0, 0.4)
    """
    return _level_reward(
        first,
        second,
        words=ARXIV_WORDS,
        length_band=ARXIV_LENGTH_RATIO,
        unique_band=ARXIV_UNIQUE_RATIO,
        transitions_in_both=True,
        jaccard_cap=ARXIV_JACCARD_CAP,
    )


# ---------------------------------------------------------------------------------------------------------
# Batched rewards (two agents)
# ---------------------------------------------------------------------------------------------------------


def _check_batch(completions_first: Sequence[str], completions_second: Sequence[str]) -> None:
    for name, batch in (("completions_first", completions_first), ("completions_second", completions_second)):
        if isinstance(batch, str) or not isinstance(batch, Sequence):
            raise TypeError(f"{name} must be a sequence of str, got {type(batch).__name__}: {batch!r:.120}")
    if len(completions_first) != len(completions_second):
        raise ValueError(
            "completions_first and completions_second must pair up one to one, got "
            f"{len(completions_first)} and {len(completions_second)} completions"
        )


def tldr_rewards(completions_first: Sequence[str], completions_second: Sequence[str]) -> list[float]:
    """TLDR rewards of a batch of (summary, elaboration) pairs, one float per pair.

    >>> tldr_rewards(["too short"], ["also too short"])
    [0.0]
    """
    _check_batch(completions_first, completions_second)
    return [tldr_reward(a, b)[0] for a, b in zip(completions_first, completions_second, strict=True)]


def arxiv_rewards(completions_first: Sequence[str], completions_second: Sequence[str]) -> list[float]:
    """arXiv rewards of a batch of (background, method) pairs, one float per pair.

    >>> arxiv_rewards(["too short"], ["also too short"])
    [0.0]
    """
    _check_batch(completions_first, completions_second)
    return [arxiv_reward(a, b)[0] for a, b in zip(completions_first, completions_second, strict=True)]


# ---------------------------------------------------------------------------------------------------------
# TRL adapters (one model writes both parts, split by PARAGRAPH_SPLIT)
# ---------------------------------------------------------------------------------------------------------


def split_paragraphs(text: str) -> tuple[str, str] | None:
    """Split a single-agent output at the first ``PARAGRAPH_SPLIT``; None if the marker is missing.

    Both parts are stripped, and a leading "Paragraph 1:" / "Paragraph 2:" label (any case) is removed,
    since the reference's prompt asks for that format.

    >>> split_paragraphs("Paragraph 1: Short. [PARAGRAPH_SPLIT] Paragraph 2: Longer text.")
    ('Short.', 'Longer text.')
    >>> split_paragraphs("no marker") is None
    True
    """
    first, marker, second = _require_str("text", text).strip().partition(PARAGRAPH_SPLIT)
    if not marker:
        return None
    return _LABEL_1.sub("", first.strip()), _LABEL_2.sub("", second.strip())


def _single_agent(
    completions: Sequence[Any],
    reward: Callable[[str, str], tuple[float, dict[str, float]]],
    prefix: str,
    log_metric: LogMetric | None,
) -> list[float]:
    scores, components = [], []
    for text in completion_texts(completions):
        parts = split_paragraphs(text)
        if parts is None:
            total, found = 0.0, dict.fromkeys(WRITING_COMPONENTS, 0.0)
        else:
            total, found = reward(*parts)
        scores.append(total)
        components.append({**found, "has_split": float(parts is not None)})
    log_component_means(log_metric, prefix, components)
    return scores


def tldr_reward_func(completions: Sequence[Any], log_metric: LogMetric | None = None, **kwargs: Any) -> list[float]:
    """TRL ``reward_funcs`` entry for the single-agent TLDR baseline: each completion holds both parts
    separated by ``PARAGRAPH_SPLIT`` and is scored by ``tldr_reward`` (0.0 without the marker). The
    prompt that asks for this format is :func:`llm_envs.tasks.writing.single_agent_prompt`.

    ``completions`` are str or conversations ({"role", "content"} messages); TRL's other keyword
    arguments (``prompts``, ``completion_ids``, dataset columns, ...) are accepted and ignored. With
    TRL's ``log_metric``, the batch means of the components go to the trainer's logs as
    ``tldr/<component>``, and the share of completions that hold the marker as ``tldr/has_split``.

    >>> tldr_reward_func(completions=["a summary with no split marker"], prompts=["post"])
    [0.0]
    """
    return _single_agent(completions, tldr_reward, "tldr", log_metric)


def arxiv_reward_func(completions: Sequence[Any], log_metric: LogMetric | None = None, **kwargs: Any) -> list[float]:
    """TRL ``reward_funcs`` entry for the single-agent arXiv baseline (see ``tldr_reward_func``;
    components logged as ``arxiv/<component>``).

    >>> arxiv_reward_func(completions=[[{"role": "assistant", "content": "Short. [PARAGRAPH_SPLIT] Text."}]])
    [0.0]
    """
    return _single_agent(completions, arxiv_reward, "arxiv", log_metric)
