"""Rows of the env's arrays as the model reads and writes them: prompts without their shared left
padding, responses as the env's fixed-length actions.

>>> import numpy as np
>>> strip_left_padding(np.array([[0, 0, 5, 6], [0, 7, 8, 9]]), np.array([[0, 0, 1, 1], [0, 1, 1, 1]]))[0]
array([[0, 5, 6],
       [7, 8, 9]])
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


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
