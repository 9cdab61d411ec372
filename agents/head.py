"""The LM head's log-probs of chosen tokens, chunk by chunk: what scoring and the update read of the
vocabulary, never holding a whole (tokens, vocabulary) float32 tensor (:func:`chosen_logprobs`)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["HEAD_CHUNK_ELEMENTS", "chosen_logprobs"]

HEAD_CHUNK_ELEMENTS = 6 << 20
"""Logits computed at once by :func:`chosen_logprobs`: rows of (vocabulary) logits per chunk, at most
24 MiB of float32 (128 rows of a 49k vocabulary), below glibc's largest mmap threshold (32 MiB, see
:mod:`agents.memory`) so that a chunk's buffer is reused rather than mapped afresh. Chunks are of equal
size: each reads the whole LM head (56 MB in bf16 for SmolLM2), so a small remainder chunk would cost
as much as a full one."""


def _head_chunk_rows(n: int, vocabulary: int) -> int:
    """Rows per chunk: as few chunks as :data:`HEAD_CHUNK_ELEMENTS` allows, all of the same size."""
    most = max(1, HEAD_CHUNK_ELEMENTS // vocabulary)
    chunks = max(1, -(-n // most))
    return max(1, -(-n // chunks))


def chosen_logprobs(
    hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """``log_softmax(hidden @ weight.T / temperature)[..., ids]`` in float32, never holding more than
    :data:`HEAD_CHUNK_ELEMENTS` logits: the LM head and the log-softmax run chunk by chunk, and the
    backward recomputes each chunk's softmax instead of keeping the (tokens, vocabulary) float32
    log-probs (~600 KB a token for a 49k vocabulary, more than all of a checkpointed layer stack).

    Args:
        hidden: (..., H) final hidden states; weight: (V, H) frozen LM head; ids: (...) token ids.
    Returns (...) float32 log-probs; differentiable in ``hidden``.
    """
    if weight.requires_grad:
        raise ValueError("chosen_logprobs needs a frozen LM head (it returns no gradient for it)")
    shape = ids.shape
    out = _ChosenLogprobs.apply(hidden.reshape(-1, hidden.shape[-1]), weight, ids.reshape(-1), float(temperature))
    return out.view(shape)


class _ChosenLogprobs(torch.autograd.Function):
    @staticmethod
    def _logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
        logits = (hidden @ weight.t()).float()  # rounded to the model's precision first, as lm_head(...)
        return logits if temperature == 1.0 else logits / temperature

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, temperature: float):
        rows = _head_chunk_rows(len(ids), weight.shape[0])
        out = torch.empty(len(ids), dtype=torch.float32, device=hidden.device)
        normalizer = torch.empty_like(out)
        for i in range(0, len(ids), rows):
            logits = _ChosenLogprobs._logits(hidden[i : i + rows], weight, temperature)
            normalizer[i : i + rows] = logits.logsumexp(-1)
            out[i : i + rows] = logits.gather(1, ids[i : i + rows, None]).squeeze(1) - normalizer[i : i + rows]
        ctx.save_for_backward(hidden, weight, ids, normalizer)
        ctx.temperature, ctx.rows = temperature, rows
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor):
        hidden, weight, ids, normalizer = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        grad_hidden = torch.empty_like(hidden)
        for i in range(0, len(ids), ctx.rows):
            part = slice(i, i + ctx.rows)
            logits = _ChosenLogprobs._logits(hidden[part], weight, ctx.temperature)
            g = grad[part, None]
            # d logp(id) / d logits = onehot(id) - softmax, times the incoming gradient and 1/temperature.
            grad_logits = logits.sub_(normalizer[part, None]).exp_().mul_(-g)  # in place: no second buffer
            grad_logits.scatter_add_(1, ids[part, None], g)
            if ctx.temperature != 1.0:
                grad_logits.div_(ctx.temperature)
            grad_hidden[part] = grad_logits.to(weight.dtype) @ weight
        return grad_hidden, None, None, None
