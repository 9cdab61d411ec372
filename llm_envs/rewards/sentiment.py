"""Positive-sentiment rewards: VADER (offline, the default) or a Hugging Face sentiment classifier.

CORY's IMDB task (Ma et al., NeurIPS 2024) rewards a response ``a`` to a query ``q`` with the positive
sentiment of ``q + a``. Two scorers are available, chosen by the ``scorer`` argument:

===================  =========================================================  ==================
``scorer``           score of one text                                          range
===================  =========================================================  ==================
``"vader"``          VADER's compound score (``vaderSentiment``, no download)    [-1, 1]
any other string     raw positive-class logit of the HF sequence classifier      unbounded
                     at that path or hub id (the paper: distilbert-imdb)
===================  =========================================================  ==================

**Which logit is "positive".** From the classifier's ``config.id2label``: the one label whose name
contains ``"pos"`` (case-insensitive: ``POSITIVE``, ``pos``, ``LABEL_POS``); else, for a two-label
model, index 1 (the SST-2/IMDB convention 0 = negative, 1 = positive, which is what ``LABEL_0`` /
``LABEL_1`` models use); else an error. ``positive_label=`` (a label name or an index) overrides the
rule.

Classifiers are loaded lazily on first use and kept in a process-wide cache keyed by (path, device):
a :class:`ClassifierScorer` pickles as its arguments, and importing this module imports no torch.

The reward functions follow TRL's convention (keyword arguments, a batch in, ``list[float]`` out) so
they serve as ``reward_funcs`` directly; the dataset column ``query`` (if present) is prepended to each
completion, as the paper scores ``query + response``.

    >>> sentiment_reward(completions=[" a wonderful, moving film."], query=["This was"])
    [0.5719]
    >>> sentiment_components(completions=[" a wonderful, moving film."], query=["This was"])
    [{'compound': 0.5719, 'pos': 0.425, 'neu': 0.575, 'neg': 0.0}]
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from llm_envs.rewards.trl import LogMetric, log_component_means

VADER = "vader"
"""Name of the offline VADER scorer (the default)."""
DEFAULT_BATCH_SIZE = 32
DEFAULT_MAX_LENGTH = 512
"""Classifier inputs are truncated to this many tokens (distilbert's limit)."""

_LOCK = threading.Lock()
_VADER: list[Any] = []
_CLASSIFIERS: dict[tuple[str, str], tuple[Any, Any]] = {}


def _vader() -> Any:
    with _LOCK:
        if not _VADER:
            from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

            _VADER.append(SentimentIntensityAnalyzer())
        return _VADER[0]


class VaderScorer:
    """VADER compound score in [-1, 1]; components: compound, pos, neu, neg."""

    name = VADER
    component_names = ("compound", "pos", "neu", "neg")

    def components(self, texts: Sequence[str]) -> list[dict[str, float]]:
        analyzer = _vader()
        out = []
        for text in texts:
            scores = analyzer.polarity_scores(text)
            out.append({name: float(scores[name]) for name in self.component_names})
        return out

    def __call__(self, texts: Sequence[str]) -> list[float]:
        return [c["compound"] for c in self.components(texts)]

    def __repr__(self) -> str:
        return "VaderScorer()"


def positive_label_index(id2label: dict[int, str], positive_label: str | int | None = None) -> int:
    """Index of the positive class of a sentiment classifier (the rule in the module docstring).

    >>> positive_label_index({0: "NEGATIVE", 1: "POSITIVE"})
    1
    >>> positive_label_index({0: "LABEL_0", 1: "LABEL_1"})
    1
    """
    labels = {int(i): str(name) for i, name in id2label.items()}
    if isinstance(positive_label, bool) or not isinstance(positive_label, (str, int, type(None))):
        raise TypeError(f"positive_label must be a label name, an index or None, got {positive_label!r}.")
    if isinstance(positive_label, int):
        if positive_label not in labels:
            raise ValueError(f"positive_label={positive_label!r} is not a class index of {labels}.")
        return positive_label
    if isinstance(positive_label, str):
        matches = [i for i, name in labels.items() if name.lower() == positive_label.lower()]
        if not matches:
            raise ValueError(f"positive_label={positive_label!r} is not a label of {labels}.")
        return matches[0]
    matches = [i for i, name in labels.items() if "pos" in name.lower()]
    if len(matches) == 1:
        return matches[0]
    if not matches and sorted(labels) == [0, 1]:
        return 1
    raise ValueError(
        f"Cannot tell which class of the classifier is positive from its labels {labels}: pass "
        "positive_label=<label name or index>."
    )


def _load_classifier(path: str, device: str) -> tuple[Any, Any]:
    key = (path, device)
    with _LOCK:
        if key not in _CLASSIFIERS:
            from transformers import AutoModelForSequenceClassification, AutoTokenizer

            try:
                tokenizer = AutoTokenizer.from_pretrained(path)
                model = AutoModelForSequenceClassification.from_pretrained(path)
            except OSError as err:
                from llm_envs.tokenizers import hub_load_error

                raise hub_load_error(
                    "the sentiment classifier", path, err, "Pass scorer='vader' for the offline scorer, or the "
                    "local path of a saved sequence-classification model."
                ) from err
            model.to(device).eval()
            _CLASSIFIERS[key] = (tokenizer, model)
        return _CLASSIFIERS[key]


class ClassifierScorer:
    """Raw positive-class logit of a Hugging Face sequence classifier, batched.

    The model is loaded on first call and shared by every scorer with the same (path, device);
    instances pickle as their arguments.
    """

    component_names = ("positive_logit", "positive_prob")

    def __init__(
        self,
        path: str,
        *,
        positive_label: str | int | None = None,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_length: int = DEFAULT_MAX_LENGTH,
        device: str = "cpu",
    ) -> None:
        if not isinstance(path, str) or not path:
            raise ValueError(f"The classifier path must be a non-empty string, got {path!r}.")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
        if not isinstance(max_length, int) or max_length < 1:
            raise ValueError(f"max_length must be a positive int, got {max_length!r}.")
        self.name = self.path = path
        self.positive_label = positive_label
        self.batch_size = batch_size
        self.max_length = max_length
        self.device = device

    def components(self, texts: Sequence[str]) -> list[dict[str, float]]:
        import torch

        tokenizer, model = _load_classifier(self.path, self.device)
        index = positive_label_index(model.config.id2label, self.positive_label)
        out: list[dict[str, float]] = []
        texts = list(texts)
        for start in range(0, len(texts), self.batch_size):
            batch = texts[start : start + self.batch_size]
            enc = tokenizer(
                batch, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
            )
            enc = {k: v.to(self.device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
            with torch.inference_mode():
                logits = model(**enc).logits.float()  # (B, num_labels)
            probs = logits.softmax(-1)
            for logit, prob in zip(logits[:, index].tolist(), probs[:, index].tolist(), strict=True):
                out.append({"positive_logit": float(logit), "positive_prob": float(prob)})
        return out

    def __call__(self, texts: Sequence[str]) -> list[float]:
        return [c["positive_logit"] for c in self.components(texts)]

    def __repr__(self) -> str:
        return f"ClassifierScorer({self.path!r}, positive_label={self.positive_label!r})"


Scorer = VaderScorer | ClassifierScorer
ScorerSpec = str | VaderScorer | ClassifierScorer


def get_scorer(scorer: ScorerSpec = VADER) -> Scorer:
    """``"vader"``, a classifier path / hub id, or a scorer object (returned as it is)."""
    if isinstance(scorer, (VaderScorer, ClassifierScorer)):
        return scorer
    if not isinstance(scorer, str) or not scorer:
        raise ValueError(
            "scorer must be 'vader', the path of a HF sentiment classifier or a scorer object, "
            f"got {scorer!r}."
        )
    return VaderScorer() if scorer == VADER else ClassifierScorer(scorer)


def _completion_text(completion: Any) -> str:
    # TRL passes conversational completions as a list of messages; the answer is the last one.
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise TypeError(f"A completion must be a string or a list of chat messages, got {completion!r}.")


def _texts(completions: Sequence[Any], query: Sequence[str] | None) -> list[str]:
    texts = [_completion_text(c) for c in completions]
    if query is None:
        return texts
    if len(query) != len(texts):
        raise ValueError(f"Got {len(texts)} completions but {len(query)} queries; they must pair up.")
    return [q + t for q, t in zip(query, texts, strict=True)]


def sentiment_components(
    *,
    completions: Sequence[Any],
    query: Sequence[str] | None = None,
    scorer: ScorerSpec = VADER,
    **kwargs: Any,
) -> list[dict[str, float]]:
    """Per text, the scorer's components (VADER: compound, pos, neu, neg; classifier: positive_logit,
    positive_prob) of ``query + completion``."""
    return get_scorer(scorer).components(_texts(completions, query))


def sentiment_reward(
    *,
    completions: Sequence[Any],
    query: Sequence[str] | None = None,
    scorer: ScorerSpec = VADER,
    log_metric: LogMetric | None = None,
    **kwargs: Any,
) -> list[float]:
    """Positive sentiment of ``query + completion`` per completion (VADER compound score by default,
    a classifier's positive-class logit with ``scorer=<path>``). With TRL's ``log_metric`` the batch
    means of the scorer's components go to the trainer's logs as ``sentiment/<component>``."""
    texts = _texts(completions, query)
    scores = get_scorer(scorer)(texts)
    if log_metric is not None:
        log_component_means(log_metric, "sentiment", get_scorer(scorer).components(texts))
    return scores


