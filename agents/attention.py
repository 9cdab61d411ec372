"""Attention over grouped key/value heads (GQA: SmolLM2, Llama 3, Qwen2), as the decoder, the rollout
engine and its static step compute it.

``scaled_dot_product_attention(..., enable_gqa=True)`` with a mask and one query per row is slow in
bfloat16 on the CPU: a coding run spent 58% of its time in it (py-spy; the embedded SmolLM2-135M, 9
query heads over 3 KV heads), about 7x what the same arithmetic costs with each KV head's query heads
folded into the query length, which reads the keys and values in place. Folded, a decode step's
attention is bit-identical to ``enable_gqa`` in bfloat16 on an AMD EPYC Zen 5 (float32: rounding
apart), and as fast in float32 (``bench/attention.py``; its JSON in ``bench/measured/attention.json``).
Full sequences (prefill, training) keep ``enable_gqa``: there it costs what folding does.

Folded, SDPA's kernel is still slow for a few queries: a decode step over a cache of hundreds of keys took
a quarter of a one-turn coding iteration (py-spy). :func:`transposed_key_attention` writes a decode step
out over keys kept transposed (the engine's dynamic loop on the CPU keeps its key cache so), the
scores in the model's dtype as transformers' eager attention computes them (``bench/attention.py``).

Whole rows whose tokens are one span each (a left-padded prompt, then a right-padded response: every
scoring and training pass) need no mask at all: :func:`span_attention` runs each row's span as plain
causal attention (``is_causal``, the fused kernel that never materialises the scores), and skips the
padding's queries and keys (``bench/attention_training.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def grouped_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d) + mask) v`` for ``q`` (N, H, S, D) and ``k``, ``v`` (N, KV, L, D) with
    ``H`` a multiple of ``KV`` (query head ``h`` reads KV head ``h // (H // KV)``, as ``enable_gqa``);
    ``mask`` (N or 1, 1, S, L): True where a query may attend, or an additive bias in ``q``'s dtype (0 and
    -inf: what SDPA makes of a boolean mask, built once for all layers). Returns (N, H, S, D). One query per row
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


def transposed_key_attention(
    q: torch.Tensor, k_t: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """:func:`grouped_attention` of one query per row (a decode step) over keys kept transposed:
    ``k_t`` (N, KV, D, L), ``v`` (N, KV, L, D), ``mask`` as :func:`grouped_attention`'s, written out
    (``softmax(q k^T / sqrt(d) + mask) v``, the scores in ``q``'s dtype as transformers' eager attention
    computes them, the softmax in float32).
    Over a growing KV cache on the CPU this is faster than the folded SDPA, whose kernel is slow for a
    few queries: a decode step of 16 rows over 48-600 cached keys 1.35-1.87x in bfloat16 on bf16
    instructions, 1.1-1.3x in float32 (``bench/attention.py``, ``bench/measured/attention.json``); with
    bfloat16 emulated (AVX2 kernels) its products are 3-4.3x slower, and the engine keeps the SDPA there.
    Transposed, a cache's first ``L`` columns of keys are a plain matrix for the product, as its values'
    rows are.

    >>> q, k, v = torch.randn(2, 6, 1, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    >>> mask = torch.tensor([[True] * 5, [False, True, True, True, True]])[:, None, None]
    >>> expected = grouped_attention(q, k, v, mask)
    >>> torch.allclose(transposed_key_attention(q, k.transpose(-1, -2), v, mask), expected, atol=1e-6)
    True
    """
    n, heads, length, dim = q.shape
    kv_heads = k_t.shape[1]
    if length != 1 or heads % kv_heads:
        raise ValueError(f"one query per row and query heads a multiple of {kv_heads} key/value heads, "
                         f"got q of shape {tuple(q.shape)}")
    scores = torch.matmul((q * dim**-0.5).reshape(n, kv_heads, heads // kv_heads, dim), k_t)
    if mask is not None:  # a boolean mask, or the additive bias a step builds once for its layers
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    out = torch.matmul(scores.softmax(-1, dtype=torch.float32).to(q.dtype), v)
    return out.reshape(n, heads, 1, dim)


def row_spans(mask: torch.Tensor) -> list[tuple[int, int]] | None:
    """``(start, end)`` of each row's unmasked positions when they are one contiguous span in every row
    (an empty row: ``(0, 0)``), else None. ``mask`` (N, S). One read of three (N,) tensors by the host.

    >>> row_spans(torch.tensor([[0, 1, 1, 0], [1, 1, 1, 1], [0, 0, 0, 0]]))
    [(1, 3), (0, 4), (0, 0)]
    >>> row_spans(torch.tensor([[1, 0, 1]])) is None
    True
    """
    keep = mask.bool()
    s = keep.shape[-1]
    counts = keep.sum(-1)
    first = keep.int().argmax(-1)
    last = s - keep.flip(-1).int().argmax(-1)
    table = torch.stack([counts, first, last], 1).tolist()
    if any(c and e - b != c for c, b, e in table):
        return None
    return [(b, e) if c else (0, 0) for c, b, e in table]


def span_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, spans: list[tuple[int, int]]) -> torch.Tensor:
    """Causal attention of rows whose tokens are one span each (:func:`row_spans`): row i's queries in
    ``spans[i]`` attend to its keys from the span's start up to themselves; ``q`` (N, H, S, D), ``k``,
    ``v`` (N, KV, S, D) as :func:`grouped_attention`'s. Returns (N, H, S, D), zeros at the queries
    outside the spans (the padding: what is computed there is never read). Rows of one span go
    through one call.

    >>> q, k, v = torch.randn(2, 6, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    >>> mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 1, 1, 1]])
    >>> allowed = (torch.ones(5, 5, dtype=torch.bool).tril() & mask.bool()[:, None, :])[:, None]
    >>> expected = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
    >>> out = span_attention(q, k, v, row_spans(mask))
    >>> torch.allclose(out[0, :, 1:4], expected[0, :, 1:4], atol=1e-6), torch.allclose(out[1], expected[1], atol=1e-6)
    (True, True)
    """
    n, heads, s, _ = q.shape
    gqa = heads != k.shape[1]
    groups: dict[tuple[int, int], list[int]] = {}
    for i, span in enumerate(spans):
        groups.setdefault(span, []).append(i)
    if len(groups) == 1 and next(iter(groups)) == (0, s):  # every row whole: one call
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    pieces: list[torch.Tensor] = []
    order: list[int] = []
    for (start, end), rows in groups.items():
        if end > start:
            take = slice(rows[0], rows[0] + 1) if len(rows) == 1 else torch.tensor(rows, device=q.device)
            qs, ks, vs = (x[take][:, :, start:end] for x in (q, k, v))
            out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=gqa)
            pieces.append(F.pad(out, (0, 0, start, s - end)))
        else:
            pieces.append(q.new_zeros((len(rows), *q.shape[1:])))
        order.extend(rows)
    out = torch.cat(pieces)
    if order != list(range(n)):
        out = out.index_select(0, torch.tensor(order, device=q.device).argsort())
    return out
