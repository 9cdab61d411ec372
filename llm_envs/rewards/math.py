"""GSM8K-style exact-answer reward: 1 if the last number of a response equals the reference answer.

The reference is the number after ``####`` in a GSM8K solution (or the whole string when it has no
``####``). Numbers compare exactly as decimals after normalisation:

=========================  =====================================================================
response text              read as
=========================  =====================================================================
``1,234`` / ``$1,234``     1234 (thousands commas and a dollar sign are dropped)
``18.0`` / ``18.`` / 18    18 (a trailing ``.0`` or sentence-ending period does not matter)
``-5`` / ``$-5`` / ``-$5``  -5 (a minus sign counts unless it follows a word character: in
                           ``16-3`` the number is 3, a subtraction)
``0.5`` / ``.5``           0.5
``1,2,3``                  three numbers 1, 2, 3 (commas not in groups of three are separators)
no number at all           no answer: reward 0
=========================  =====================================================================

Before extraction the response is cut at the first ``Question:`` (``stop="Question:"``): under the
one-shot prompt a model that has answered often goes on to invent the next example, whose numbers are
not its answer (the usual few-shot evaluation stop sequence).

The reward functions follow TRL's convention (keyword arguments, a batch in, ``list[float]`` out); the
GSM8K dataset column ``answer`` is the reference:

    >>> gsm8k_reward(completions=["5 + 4 = 9.", "He has 10 toys."], answer=["... #### 9", "#### 9"])
    [1.0, 0.0]
    >>> gsm8k_components(completions=["No idea."], answer=["#### 9"])
    [{'correct': 0.0, 'has_number': 0.0}]
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from llm_envs.rewards.trl import LogMetric, log_component_means

ANSWER_MARKER = "####"
DEFAULT_STOP = "Question:"
COMPONENTS = ("correct", "has_number")

_NUMBER = re.compile(
    r"(?<![\w.])"  # not inside a word (x2, 16-3) nor after a decimal point
    r"(?P<sign>[-−])?\$?(?P<sign2>[-−])?"
    r"(?P<int>\d{1,3}(?:,\d{3})+(?![\d])|\d+)?"
    r"(?P<frac>\.\d+)?"
)


def find_numbers(text: str) -> list[Decimal]:
    """Every number in ``text``, in order, as exact decimals (see the module docstring's table).

    >>> find_numbers("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 eggs for $1,234.50.")
    [Decimal('16'), Decimal('3'), Decimal('4'), Decimal('16'), Decimal('3'), Decimal('4'), Decimal('9'), \
Decimal('9'), Decimal('1234.50')]
    """
    if not isinstance(text, str):
        raise TypeError(f"Expected a string, got {text!r}.")
    numbers = []
    for match in _NUMBER.finditer(text):
        integer, frac = match.group("int"), match.group("frac")
        if integer is None and frac is None:
            continue
        negative = bool(match.group("sign") or match.group("sign2"))
        digits = (integer or "0").replace(",", "") + (frac or "")
        numbers.append(-Decimal(digits) if negative else Decimal(digits))
    return numbers


def last_number(text: str, stop: str | None = DEFAULT_STOP) -> Decimal | None:
    """The last number of ``text`` cut at the first ``stop`` (``None``: no cut), or ``None``.

    >>> last_number("5 + 4 = 9.\\nQuestion: Tom has 3 apples"), last_number("no number")
    (Decimal('9'), None)
    """
    if stop:
        text = text.split(stop, 1)[0]
    numbers = find_numbers(text)
    return numbers[-1] if numbers else None


def reference_answer(answer: str) -> Decimal:
    """The reference number of a GSM8K solution: the number after ``####`` (the whole string if it
    has no ``####``).

    >>> reference_answer("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\\n#### 72")
    Decimal('72')
    """
    if not isinstance(answer, str):
        raise TypeError(f"A reference answer must be a string, got {answer!r}.")
    tail = answer.rsplit(ANSWER_MARKER, 1)[-1]
    numbers = find_numbers(tail)
    if len(numbers) != 1:
        raise ValueError(
            f"Reference answer {answer!r} must hold exactly one number after {ANSWER_MARKER!r}, "
            f"found {[str(n) for n in numbers]}."
        )
    return numbers[0]


def _completion_text(completion: Any) -> str:
    # TRL passes conversational completions as a list of messages; the answer is the last one.
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise TypeError(f"A completion must be a string or a list of chat messages, got {completion!r}.")


def gsm8k_components(
    *, completions: Sequence[Any], answer: Sequence[str], stop: str | None = DEFAULT_STOP, **kwargs: Any
) -> list[dict[str, float]]:
    """Per completion: ``correct`` (1.0 if its last number equals the reference) and ``has_number``
    (1.0 if it contains a number at all)."""
    if len(answer) != len(completions):
        raise ValueError(
            f"Got {len(completions)} completions but {len(answer)} reference answers; they must pair up."
        )
    out = []
    for completion, reference in zip(completions, answer, strict=True):
        target = reference_answer(reference)
        found = last_number(_completion_text(completion), stop=stop)
        correct = found is not None and found == target
        out.append({"correct": float(correct), "has_number": float(found is not None)})
    return out


def gsm8k_reward(
    *,
    completions: Sequence[Any],
    answer: Sequence[str],
    stop: str | None = DEFAULT_STOP,
    log_metric: LogMetric | None = None,
    **kwargs: Any,
) -> list[float]:
    """1.0 per completion whose last number (before ``stop``) equals the reference answer, else 0.0.
    With TRL's ``log_metric`` the batch means go to the trainer's logs as ``gsm8k/correct`` and
    ``gsm8k/has_number``."""
    components = gsm8k_components(completions=completions, answer=answer, stop=stop)
    log_component_means(log_metric, "gsm8k", components)
    return [c["correct"] for c in components]
