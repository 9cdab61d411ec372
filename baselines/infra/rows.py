"""Responses as the env's actions: the model's (N, T) response ids as the env's fixed-length int64 actions.
(Prompts lose their shared left padding with :func:`agents.rows.strip_left`.)

>>> pad_actions(torch.tensor([[5, 6], [7, 8]]), 4, 0)
array([[5, 6, 0, 0],
       [7, 8, 0, 0]])
"""

from __future__ import annotations

import numpy as np
import torch


def pad_actions(response_ids: torch.Tensor, length: int, pad_id: int) -> np.ndarray:
    """(N, T) responses (T <= length) -> (N, length) int64 env actions, padded with the pad id."""
    if response_ids.shape[1] > length:
        raise ValueError(f"responses have {response_ids.shape[1]} tokens, more than the env's action length {length}")
    out = np.full((response_ids.shape[0], length), pad_id, dtype=np.int64)
    out[:, : response_ids.shape[1]] = response_ids.cpu().numpy()
    return out
