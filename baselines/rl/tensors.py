"""Tensor helpers the learners share: masked means, prompt padding, env actions from responses.

>>> masked_mean(torch.tensor([[1.0, 2.0, 9.0]]), torch.tensor([[1, 1, 0]]))
tensor(1.5000)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1: over everything (``dim=None``) or along ``dim``.
    Rows with no unmasked entry give 0 (not NaN).

    >>> masked_mean(torch.tensor([[1.0, 2.0, 9.0]]), torch.tensor([[1, 1, 0]]))
    tensor(1.5000)
    """
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def strip_left_padding(ids: np.ndarray | torch.Tensor, mask: np.ndarray | torch.Tensor) -> tuple[Any, Any]:
    """Drop leading columns that are padding in every row: (N, L) -> (N, P), P = longest prompt.

    The boundary comes from the mask, never from pad ids (SmolLM2's pad is its end-of-turn token,
    which also occurs inside chat prompts)."""
    if ids.shape != mask.shape or len(ids.shape) != 2:
        raise ValueError(f"ids and mask must be equal (N, L) arrays, got {tuple(ids.shape)} and {tuple(mask.shape)}")
    longest = int(mask.sum(1).max()) if mask.shape[0] else 0
    if longest == 0:
        raise ValueError("every row of the attention mask is empty: there is no prompt to keep")
    start = ids.shape[1] - longest
    return ids[:, start:], mask[:, start:]


def pad_actions(response_ids: torch.Tensor, length: int, pad_id: int) -> np.ndarray:
    """(N, T) responses (T <= length) -> (N, length) int64 env actions, padded with the pad id."""
    if response_ids.shape[1] > length:
        raise ValueError(f"responses have {response_ids.shape[1]} tokens, more than the env's action length {length}")
    out = np.full((response_ids.shape[0], length), pad_id, dtype=np.int64)
    out[:, : response_ids.shape[1]] = response_ids.cpu().numpy()
    return out
