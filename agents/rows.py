"""Rows of token ids as the policy takes them: conversion and checks (left-padded prompts,
right-padded responses, ids within the vocabulary), padding, the rows a batch repeats, and responses
as an env's fixed-length actions (:func:`pad_actions`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

ArrayLike = torch.Tensor | np.ndarray
ArrayT = TypeVar("ArrayT", torch.Tensor, np.ndarray)


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



def strip_left(ids: ArrayT, mask: ArrayT, *, empty_ok: bool = False) -> tuple[ArrayT, ArrayT]:
    """Drop the leading columns that are padding in every row (envs left-pad to a fixed length): (N, L)
    -> (N, P), P the longest prompt; numpy arrays or tensors, returned as they came.

    The boundary comes from the mask, never from pad ids (SmolLM2's pad is its end-of-turn token, which
    also occurs inside chat prompts). A mask without a token raises ``ValueError``, or with ``empty_ok``
    gives the rows back unchanged (for a caller whose own checks name the row).

    >>> strip_left(np.array([[0, 0, 5, 6], [0, 7, 8, 9]]), np.array([[0, 0, 1, 1], [0, 1, 1, 1]]))[0]
    array([[0, 5, 6],
           [7, 8, 9]])
    """
    if ids.shape != mask.shape or len(ids.shape) != 2:
        raise ValueError(
            f"ids and mask must be (N, L) arrays of one shape, got shapes {tuple(ids.shape)} and {tuple(mask.shape)}"
        )
    held = (mask != 0).any(0)  # (L,) columns where some row has a token
    held = held.cpu().numpy() if isinstance(held, torch.Tensor) else np.asarray(held)
    if not held.any():
        if empty_ok:
            return ids, mask
        raise ValueError("every row of the attention mask is empty: there is no prompt to keep")
    start = int(held.argmax())
    return ids[:, start:], mask[:, start:]


def left_pad(rows: torch.Tensor, width: int, value: int) -> torch.Tensor:
    """(N, W) rows -> (N, ``width``), ``value`` in the new leading columns."""
    if rows.shape[1] == width:
        return rows
    return torch.cat([rows.new_full((len(rows), width - rows.shape[1]), value), rows], dim=1)


def left_padded(rows: Sequence[Sequence[int] | torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D rows of ids (tensors or lists) as (N, L) long ids and mask on the CPU, left-padded with
    ``pad_id`` to the longest.

    >>> [t.tolist() for t in left_padded([torch.tensor([5, 6]), [7]], 0)]
    [[[5, 6], [0, 7]], [[1, 1], [0, 1]]]
    """
    if not rows:
        return torch.zeros((0, 0), dtype=torch.long), torch.zeros((0, 0), dtype=torch.long)
    width = max(len(r) for r in rows)
    ids = torch.cat([left_pad(torch.as_tensor(r).to("cpu", torch.long)[None], width, pad_id) for r in rows])
    mask = torch.cat([left_pad(torch.ones(1, len(r), dtype=torch.long), width, 0) for r in rows])
    return ids, mask


def right_padded(rows: Sequence[Sequence[int] | torch.Tensor], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """1-D rows of ids as (N, L) long ids and mask on the CPU, right-padded with ``pad_id`` to the longest.

    >>> [t.tolist() for t in right_padded([[5, 6], [7]], 0)]
    [[[5, 6], [7, 0]], [[1, 1], [1, 0]]]
    """
    width = max((len(r) for r in rows), default=0)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids, mask


def right_pad(rows: torch.Tensor, width: int, value: float) -> torch.Tensor:
    if rows.shape[1] == width:
        return rows
    return torch.cat([rows, rows.new_full((len(rows), width - rows.shape[1]), value)], dim=1)



def to_device(tensor: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``tensor`` on ``device`` without the host waiting for it: a copy from the CPU to a GPU goes through
    pinned memory (``non_blocking``; from pageable memory torch's copy waits for the GPU's queued work)."""
    device = torch.device(device)
    if device.type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def _first_and_index(keys: list[int], device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """:func:`distinct_rows` of rows whose equal rows have equal ``keys`` (read on the host)."""
    first_of: dict[int, int] = {}
    for row, key in enumerate(keys):
        first_of.setdefault(key, row)
    if len(keys) < 2 or len(first_of) == len(keys):
        return None, None
    order = {key: i for i, key in enumerate(first_of)}  # distinct rows in order of appearance
    first = torch.tensor(list(first_of.values()))
    index = torch.tensor([order[key] for key in keys])
    return to_device(first, device), to_device(index, device)


def distinct_rows(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """``(first, index)`` for rows that repeat: ``first`` (U,) the first row of each distinct (ids, mask)
    row in order of appearance and ``index`` (N,) each row's position in ``first``; ``(None, None)``
    when every row is distinct.

    >>> distinct_rows(torch.tensor([[1, 2], [3, 4], [1, 2]]), torch.ones(3, 2, dtype=torch.long))
    (tensor([0, 1]), tensor([0, 1, 0]))
    """
    if len(ids) < 2:
        return None, None
    return _first_and_index(row_numbers(ids, mask), ids.device)


def row_numbers(ids: torch.Tensor, mask: torch.Tensor) -> list[int]:
    """A number per row, equal for rows with equal ids and mask (one read of the device)."""
    if not len(ids):
        return []
    _, inverse = torch.unique(torch.cat([ids, mask.to(ids.dtype)], dim=1), dim=0, return_inverse=True)
    return inverse.tolist()


@dataclass(frozen=True)
class CheckedRows:
    """One agent's prompt and response rows, checked (:func:`check_rows`) and placed on its device once, with
    the rows' repeated prompts found once (``prompt_keys``, on the host): an update scores slices of them
    (``rows[c]``) in its micro-batches without the host waiting for the device, which each check and each
    search for repeats does. Made by the policy's ``checked_rows``; scored by its ``logprobs_of``."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    prompt_keys: tuple[int, ...] | None = None
    """Equal numbers for rows with equal prompts (ids and mask); ``None``: repeats are not looked for."""

    def __len__(self) -> int:
        return len(self.response_ids)

    def __getitem__(self, rows: slice) -> CheckedRows:
        if not isinstance(rows, slice):
            raise TypeError(f"CheckedRows are sliced by row ranges, got {type(rows).__name__}")
        return CheckedRows(self.prompt_ids[rows], self.prompt_mask[rows], self.response_ids[rows],
                           self.response_mask[rows], None if self.prompt_keys is None else self.prompt_keys[rows])

    def distinct_prompts(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """:func:`distinct_rows` of the prompts, from ``prompt_keys`` (``(None, None)`` without them)."""
        if self.prompt_keys is None:
            return None, None
        return _first_and_index(list(self.prompt_keys), self.prompt_ids.device)


def pad_actions(response_ids: torch.Tensor, length: int, pad_id: int) -> np.ndarray:
    """(N, T) responses (T <= length) -> (N, length) int64 env actions, padded with the pad id: what an env
    takes as an agent's action.

    >>> pad_actions(torch.tensor([[5, 6], [7, 8]]), 4, 0)
    array([[5, 6, 0, 0],
           [7, 8, 0, 0]])
    """
    if response_ids.shape[1] > length:
        raise ValueError(f"responses have {response_ids.shape[1]} tokens, more than the env's action length {length}")
    out = np.full((response_ids.shape[0], length), pad_id, dtype=np.int64)
    out[:, : response_ids.shape[1]] = response_ids.cpu().numpy()
    return out
