"""What the reward functions share to be called by TRL's ``GRPOTrainer`` (``reward_funcs=[...]``).

TRL (1.16) calls each reward function with keyword arguments only: ``prompts`` (the dataset's
``prompt`` column: str, or a conversation as a list of ``{"role", "content"}`` messages),
``completions`` (str, or a conversation holding the assistant's message), ``completion_ids``, every
other dataset column by its name (``prompt`` itself is never passed under that name), and
``trainer_state``, ``log_extra`` and ``log_metric``. A reward function returns one float per
completion (None skips one). ``log_metric(name, value)`` adds a scalar to the trainer's logs (averaged
over a logging step, next to ``reward`` and ``kl``): our functions report the mean of each reward
component there, as ``<reward>/<component>``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

LogMetric = Callable[[str, float], None]


def _content_text(content: Any, what: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and all(
        isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)
        for part in content
    ):
        return "".join(part["text"] for part in content)
    raise TypeError(f"{what} has content that is neither a str nor a list of text parts: {content!r:.120}")


def message_text(value: Any, index: int, *, what: str, role: str) -> str:
    """Text of one TRL prompt or completion: a str as it is, or the joined contents of a
    conversation's messages of ``role`` ("assistant" for completions, "user" for prompts)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, Sequence):
        raise TypeError(f"{what}[{index}] must be a str or a list of messages, got {type(value).__name__}: "
                        f"{value!r:.120}")
    texts = []
    for message in value:
        if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
            raise TypeError(f"{what}[{index}] holds a message without 'role' and 'content': {message!r:.120}")
        if message["role"] == role:
            texts.append(_content_text(message["content"], f"{what}[{index}]"))
    if not texts:
        raise ValueError(f"{what}[{index}] has no {role} message: {value!r:.120}")
    return "".join(texts)


def completion_texts(completions: Sequence[Any]) -> list[str]:
    """The text of each completion TRL passes (str, or a conversation: its assistant messages).

    >>> completion_texts(["plain", [{"role": "assistant", "content": "chat"}]])
    ['plain', 'chat']
    """
    if isinstance(completions, str) or not isinstance(completions, Sequence):
        raise TypeError(f"completions must be a list of completions, got {type(completions).__name__}: "
                        f"{completions!r:.120}")
    return [message_text(c, i, what="completions", role="assistant") for i, c in enumerate(completions)]


def prompt_texts(prompts: Sequence[Any]) -> list[str]:
    """The text of each prompt TRL passes (str, or a conversation: its user messages)."""
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise TypeError(f"prompts must be a list of prompts, got {type(prompts).__name__}: {prompts!r:.120}")
    return [message_text(p, i, what="prompts", role="user") for i, p in enumerate(prompts)]


def log_component_means(
    log_metric: LogMetric | None, prefix: str, components: Sequence[Mapping[str, float]]
) -> None:
    """``log_metric(f"{prefix}/{name}", mean)`` for each component of a batch (nothing without
    ``log_metric`` or without rows).

    >>> logged = {}
    >>> log_component_means(logged.__setitem__, "tldr", [{"length": 1.0}, {"length": 0.5}])
    >>> logged
    {'tldr/length': 0.75}
    """
    if log_metric is None or not components:
        return
    if not callable(log_metric):
        raise TypeError(f"log_metric must be callable (TRL passes its trainer's), got {log_metric!r}")
    for name in components[0]:
        log_metric(f"{prefix}/{name}", float(sum(c[name] for c in components) / len(components)))
