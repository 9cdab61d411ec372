"""The single-agent writing baseline's reward: one completion holds both parts of the text; it is split
in two and scored by the two-role reward (:func:`llm_envs.rewards.writing.tldr_reward` /
``arxiv_reward``).

Reference: ``OpenMLRL/LLM_Collab_Writing``, ``train_grpo.py`` (``split_response_into_paragraphs``), the
paper's single-model baseline. How the completion is split is a policy, ``split``:

=============  ==========================================================================================
``split``      where the completion (stripped) is cut
=============  ==========================================================================================
``reference``  at the first ``[PARAGRAPH_SPLIT]``; without it, around the first "Paragraph 2:" label
               (any case; the label itself is dropped); without that either, at one third of the
               characters (``len(text) // 3``, at least 1), which may cut a word in two. The
               reference's choice: a completion that ignores the format still earns a reward.
``strict``     at the first ``[PARAGRAPH_SPLIT]`` only; a completion without it scores 0.0 (as
               :func:`llm_envs.rewards.writing.tldr_reward_func` does).
=============  ==========================================================================================

After the cut both parts are stripped and a leading "Paragraph 1:" (first part) / "Paragraph 2:"
(second part) label is removed, as in the reference.

Components: the five writing components (``structure``, ``length``, ``diversity``, ``transition``,
``jaccard``), which sum to the total, plus two indicators that do **not** add to it: ``delimiter``
(1.0 when the completion holds ``[PARAGRAPH_SPLIT]``: the format adherence) and ``marker`` (1.0 when
the ``reference`` policy fell back to the "Paragraph 2:" label; always 0.0 under ``strict``). A cut at
one third is ``delimiter == marker == 0`` under ``reference``.

>>> split_two_parts("Paragraph 1: Short. [PARAGRAPH_SPLIT] Paragraph 2: Longer.", "strict")
('Short.', 'Longer.', 'delimiter')
>>> split_two_parts("Paragraph 1: Short. Paragraph 2: Longer.", "reference")
('Short.', 'Longer.', 'marker')
>>> split_two_parts("abcdefghi", "reference")
('abc', 'defghi', 'fraction')
>>> split_two_parts("abcdefghi", "strict") is None
True
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from llm_envs.rewards.writing import PARAGRAPH_SPLIT, WRITING_COMPONENTS, arxiv_reward, tldr_reward

SPLIT_POLICIES = ("reference", "strict")
"""Values of ``split``: see the module docstring."""
SINGLE_WRITER_COMPONENTS = (*WRITING_COMPONENTS, "delimiter", "marker")
"""Reward components of the single-agent reward (the last two are indicators outside the total)."""
FRACTION = 3
"""Without a delimiter or label, the ``reference`` policy cuts at ``len(text) // FRACTION``."""
VARIANTS = {"tldr": tldr_reward, "arxiv": arxiv_reward}

_MARKER = re.compile(r"Paragraph 2:\s*", re.IGNORECASE)
_LABEL_1 = re.compile(r"^Paragraph 1:\s*", re.IGNORECASE)
_LABEL_2 = re.compile(r"^Paragraph 2:\s*", re.IGNORECASE)


def check_split_policy(split: str) -> str:
    """``split`` itself if it is a known policy, else a ValueError naming the value."""
    if split not in SPLIT_POLICIES:
        raise ValueError(f"split must be one of {list(SPLIT_POLICIES)}, got {split!r}")
    return split


def split_two_parts(text: str, split: str = "reference") -> tuple[str, str, str] | None:
    """Cut one completion into ``(first, second, how)`` under the ``split`` policy; ``how`` is
    ``"delimiter"``, ``"marker"`` or ``"fraction"``. None when ``split="strict"`` finds no delimiter."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}: {text!r:.120}")
    check_split_policy(split)
    body = text.strip()
    first, found, second = body.partition(PARAGRAPH_SPLIT)
    how = "delimiter"
    if not found:
        if split == "strict":
            return None
        match = _MARKER.search(body)
        if match is not None:
            first, second, how = body[: match.start()], body[match.end() :], "marker"
        else:
            cut = len(body) // FRACTION or 1
            first, second, how = body[:cut], body[cut:], "fraction"
    return _LABEL_1.sub("", first.strip()), _LABEL_2.sub("", second.strip()), how


def single_writer_reward(text: str, split: str = "reference", variant: str = "tldr") -> tuple[float, dict[str, float]]:
    """Reward of one single-agent completion: split it (``split`` policy), score the two parts with the
    ``variant``'s two-role reward (``"tldr"``, also XSum's, or ``"arxiv"``). Returns the total and the
    components of ``SINGLE_WRITER_COMPONENTS``.

    >>> total, parts = single_writer_reward("no delimiter here at all", split="strict")
    >>> total, parts["delimiter"], parts["marker"]
    (0.0, 0.0, 0.0)
    """
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {variant!r}")
    parts = split_two_parts(text, split)
    components = dict.fromkeys(SINGLE_WRITER_COMPONENTS, 0.0)
    if parts is None:
        return 0.0, components
    first, second, how = parts
    total, found = VARIANTS[variant](first, second)
    components.update(found)
    components["delimiter"] = float(how == "delimiter")
    components["marker"] = float(how == "marker")
    return total, components


def single_writer_rewards(completions: Sequence[str], split: str = "reference", variant: str = "tldr") -> list[float]:
    """Totals of a batch of single-agent completions (see :func:`single_writer_reward`).

    >>> single_writer_rewards(["too short [PARAGRAPH_SPLIT] also short"], split="strict")
    [0.0]
    """
    if isinstance(completions, str) or not isinstance(completions, Sequence):
        raise TypeError(f"completions must be a sequence of str, got {type(completions).__name__}")
    return [single_writer_reward(text, split, variant)[0] for text in completions]
