"""Rows of token ids as the policy takes them: conversion and checks (left-padded prompts,
right-padded responses, ids within the vocabulary), padding, and the rows a batch repeats."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

ArrayLike = torch.Tensor | np.ndarray


def check_rows(
    ids: ArrayLike, mask: ArrayLike, what: str, device: torch.device, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``ids`` and ``mask`` as (B, L) long tensors on ``device``, checked: a prompt is left-padded and
    non-empty (``what="prompt"``), a response right-padded, ids in ``[0, vocab_size)``."""
    ids_t = to_tensor(ids, f"{what}_ids").to(device, torch.long)
    mask_t = to_tensor(mask, f"{what}_mask").to(device, torch.long)
    if ids_t.dim() != 2:
        raise ValueError(f"{what}_ids must be 2-D (batch, length), got shape {tuple(ids_t.shape)}")
    if mask_t.shape != ids_t.shape:
        raise ValueError(
            f"{what}_mask shape {tuple(mask_t.shape)} differs from {what}_ids shape {tuple(ids_t.shape)}"
        )
    if mask_t.numel() and mask_t.shape[1] and not _suspect(ids_t, mask_t, what, vocab_size):
        return ids_t, mask_t  # one wait for the device; the checks below find what is wrong, and say it
    if mask_t.numel():
        if ((mask_t != 0) & (mask_t != 1)).any():
            raise ValueError(f"{what}_mask must hold only 0 and 1, got values {mask_t.unique().tolist()}")
        if ids_t.min() < 0 or ids_t.max() >= vocab_size:
            raise ValueError(
                f"{what}_ids must lie in [0, {vocab_size - 1}], got min {ids_t.min().item()} "
                f"and max {ids_t.max().item()}"
            )
    steps = mask_t.diff(dim=1) if mask_t.shape[1] > 1 else mask_t[:, :0]
    if what == "prompt":
        bad = (steps < 0).any(-1) | (mask_t[:, -1] == 0 if mask_t.shape[1] else torch.ones_like(mask_t[:, 0]))
        if mask_t.shape[1] == 0 or bad.any():
            row = int(bad.nonzero()[0, 0]) if mask_t.shape[1] else 0
            raise ValueError(
                f"prompt row {row} is not a non-empty left-padded prompt (mask must be 0s then 1s and end "
                f"with 1), got mask {mask_t[row].tolist() if len(mask_t) else []}"
            )
    elif (steps > 0).any():
        row = int((steps > 0).any(-1).nonzero()[0, 0])
        raise ValueError(
            f"response row {row} is not right-padded (mask must be 1s then 0s), got {mask_t[row].tolist()}"
        )
    return ids_t, mask_t


def _suspect(ids: torch.Tensor, mask: torch.Tensor, what: str, vocab_size: int) -> bool:
    """Whether any of :func:`check_rows`' checks can fail, as one reduction read once: on a GPU each
    check read on its own would wait for the device (four times a call, in every micro-batch)."""
    steps = mask.diff(dim=1)
    layout = (steps < 0).any() | (mask[:, -1] == 0).any() if what == "prompt" else (steps > 0).any()
    return bool(((mask != 0) & (mask != 1)).any() | (ids < 0).any() | (ids >= vocab_size).any() | layout)


def to_tensor(value: Any, what: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        tensor = value
    else:
        try:
            tensor = torch.as_tensor(np.asarray(value))
        except (TypeError, ValueError, RuntimeError) as err:
            raise TypeError(f"{what} must be an integer array, got {type(value).__name__}: {err}") from err
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise TypeError(f"{what} must hold integers, got dtype {tensor.dtype}")
    return tensor



def strip_left(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop the leading columns that are padding in every row (envs left-pad to a fixed length)."""
    if ids.numel() == 0 or not mask.any():
        return ids, mask
    start = int((mask != 0).any(0).nonzero()[0, 0])
    return ids[:, start:], mask[:, start:]



def left_pad(rows: torch.Tensor, width: int, value: int) -> torch.Tensor:
    if rows.shape[1] == width:
        return rows
    return torch.cat([rows.new_full((len(rows), width - rows.shape[1]), value), rows], dim=1)



def right_pad(rows: torch.Tensor, width: int, value: float) -> torch.Tensor:
    if rows.shape[1] == width:
        return rows
    return torch.cat([rows, rows.new_full((len(rows), width - rows.shape[1]), value)], dim=1)



def distinct_rows(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(first, index)`` for rows that repeat: ``first`` (U,) the first row of each distinct (ids, mask)
    row in order of appearance and ``index`` (N,) each row's position in ``first``; ``(None, None)``
    when every row is distinct.

    >>> distinct_rows(torch.tensor([[1, 2], [3, 4], [1, 2]]), torch.ones(3, 2, dtype=torch.long))
    (tensor([0, 1]), tensor([0, 1, 0]))
    """
    if len(ids) < 2:
        return None, None
    _, inverse = torch.unique(torch.cat([ids, mask.to(ids.dtype)], dim=1), dim=0, return_inverse=True)
    if int(inverse.max()) + 1 == len(ids):
        return None, None
    first_of: dict[int, int] = {}
    for row, key in enumerate(inverse.tolist()):
        first_of.setdefault(key, row)
    order = {key: i for i, key in enumerate(first_of)}  # distinct rows in order of appearance
    first = torch.tensor(list(first_of.values()), device=ids.device)
    index = torch.tensor([order[key] for key in inverse.tolist()], device=ids.device)
    return first, index


