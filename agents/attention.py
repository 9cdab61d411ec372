"""Attention over grouped key/value heads (GQA: SmolLM2, Llama 3, Qwen2), as the decoder, the rollout
engine and its static step compute it.

``scaled_dot_product_attention(..., enable_gqa=True)`` with a mask and one query per row is slow in
bfloat16 on the CPU: a coding run spent 58% of its time in it (py-spy; the embedded SmolLM2-135M, 9
query heads over 3 KV heads), about 7x what the same arithmetic costs with each KV head's query heads
folded into the query length, which reads the keys and values in place. Folded, a decode step's
attention is bit-identical to ``enable_gqa`` in bfloat16 on an AMD EPYC Zen 5 (float32: rounding
apart), and as fast in float32 (``bench/attention.py``; its JSON in ``bench/measured/attention.json``).
Full sequences (prefill, training) keep ``enable_gqa``: there it costs what folding does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def grouped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d) + mask) v`` for ``q`` (N, H, S, D) and ``k``, ``v`` (N, KV, L, D) with
    ``H`` a multiple of ``KV`` (query head ``h`` reads KV head ``h // (H // KV)``, as ``enable_gqa``);
    ``mask`` (N or 1, 1, S, L): True where a query may attend. Returns (N, H, S, D). One query per row
    (a decode step): its ``H // KV`` heads of each KV head are folded into the query length.

    >>> q, k, v = torch.randn(2, 6, 1, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    >>> mask = torch.tensor([[True] * 5, [False, True, True, True, True]])[:, None, None]
    >>> expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    >>> torch.allclose(grouped_attention(q, k, v, mask), expected, atol=1e-6)
    True
    """
    n, heads, length, dim = q.shape
    kv_heads = k.shape[1]
    if heads == kv_heads or length != 1:
        # Full sequences (prefill, training): enable_gqa costs what folding does (the repeated keys are a
        # small part of an (S, S) pass), and folding would repeat the (S, L) mask.
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=heads != kv_heads)
    if heads % kv_heads:
        raise ValueError(f"{heads} query heads do not share {kv_heads} key/value heads evenly")
    out = F.scaled_dot_product_attention(q.reshape(n, kv_heads, heads // kv_heads, dim), k, v, attn_mask=mask)
    return out.reshape(n, heads, 1, dim)
