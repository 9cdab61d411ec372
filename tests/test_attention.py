"""agents/attention.py: a decode step's grouped-query attention equals ``enable_gqa`` (every dtype, mask,
row count and layout the engine gives it); full sequences go through ``enable_gqa`` itself."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from agents.attention import grouped_attention


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (4, 1), (6, 6)])
def test_a_decode_step_equals_enable_gqa(dtype, heads, kv_heads) -> None:
    torch.manual_seed(0)
    n, length, dim = 5, 37, 16
    # q as the decoder makes it: (N, 1, H, D) transposed, not contiguous.
    q = torch.randn(n, 1, heads, dim, dtype=dtype).transpose(1, 2)
    k, v = torch.randn(n, kv_heads, length, dim, dtype=dtype), torch.randn(n, kv_heads, length, dim, dtype=dtype)
    mask = torch.rand(n, 1, 1, length) > 0.3
    mask[:, :, :, -1] = True  # every row sees its own new key
    got = grouped_attention(q, k, v, mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=heads != kv_heads)
    assert got.shape == (n, heads, 1, dim) and got.dtype == dtype
    # float32: a softmax over 37 keys of O(1) scores, summed in another order: a few ulps of 1e-7.
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6 if dtype == torch.float32 else 1e-2)


def test_full_sequences_use_enable_gqa_exactly() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 6, 7, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()[None, None]
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=causal, enable_gqa=True)
    assert torch.equal(grouped_attention(q, k, v, causal), expected)


def test_heads_that_do_not_share_kv_heads_evenly_are_refused() -> None:
    with pytest.raises(ValueError, match="5 query heads do not share 2 key/value heads evenly"):
        grouped_attention(torch.randn(1, 5, 1, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4))


def spans_and_reference(dtype, heads, kv_heads, seed=0):
    """Rows as a scoring pass lays them out (left-padded prompt, right-padded response; one row whole,
    one empty, two of one span), with q, k, v needing gradients, and the masked kernel's causal
    attention over each row's tokens."""
    from agents.attention import row_spans

    torch.manual_seed(seed)
    n, s, dim = 5, 41, 16
    mask = torch.zeros(n, s, dtype=torch.long)
    for row, (start, end) in enumerate([(3, 30), (0, 41), (0, 0), (3, 30), (10, 41)]):
        mask[row, start:end] = 1
    q = torch.randn(n, s, heads, dim, dtype=dtype).transpose(1, 2).requires_grad_()  # not contiguous, as the decoder's
    k = torch.randn(n, kv_heads, s, dim, dtype=dtype).requires_grad_()
    v = torch.randn(n, kv_heads, s, dim, dtype=dtype).requires_grad_()
    allowed = (torch.ones(s, s, dtype=torch.bool).tril() & mask.bool()[:, None, :]) | torch.eye(s, dtype=torch.bool)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None], enable_gqa=heads != kv_heads)
    return mask, row_spans(mask), (q, k, v), expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (6, 6)])
def test_span_attention_equals_the_masked_kernel_at_every_token_and_in_its_gradients(dtype, heads, kv_heads) -> None:
    from agents.attention import span_attention

    mask, spans, (q, k, v), expected = spans_and_reference(dtype, heads, kv_heads)
    assert spans == [(3, 30), (0, 41), (0, 0), (3, 30), (10, 41)]
    got = span_attention(q, k, v, spans)
    keep = mask.bool()[:, None, :, None]
    assert got.shape == expected.shape and got.dtype == dtype
    assert bool((got * ~keep == 0).all())  # the padding's queries: zeros
    # Each output is a softmax-weighted mean of at most 41 values of |v| < 5, summed in another order
    # (the fused kernel works in blocks): float32 rounding of 41 terms, ~41 * 6e-8 * 5 = 1.2e-5 at worst.
    # bfloat16: both round the result to 8 bits of mantissa (4e-3 of |out| < 3).
    atol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got * keep, expected * keep, rtol=0, atol=atol)
    weights = torch.randn(got.shape, generator=torch.Generator().manual_seed(1)).to(dtype) * keep
    ours = torch.autograd.grad((got * weights).float().sum(), (q, k, v))
    theirs = torch.autograd.grad((expected * weights).float().sum(), (q, k, v))
    for a, b in zip(ours, theirs):  # a gradient sums ~41 products per element, heads summed for k and v
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4 if dtype == torch.float32 else 1e-1)


def test_row_spans_refuse_rows_with_holes() -> None:
    from agents.attention import row_spans

    assert row_spans(torch.tensor([[0, 1, 1], [1, 1, 0]])) == [(1, 3), (0, 2)]
    assert row_spans(torch.tensor([[1, 1, 1], [1, 0, 1]])) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "kv_heads"), [(9, 3), (4, 1), (6, 6)])
def test_a_decode_step_over_transposed_keys_equals_enable_gqa(dtype, heads, kv_heads) -> None:
    """The engine's CPU decode step: keys kept transposed in a cache wider than the keys so far (its first
    columns a strided view), values likewise; the same attention as ``enable_gqa`` over the same keys."""
    from agents.attention import transposed_key_attention

    torch.manual_seed(0)
    n, length, total, dim = 5, 37, 50, 16
    q = torch.randn(n, 1, heads, dim, dtype=dtype).transpose(1, 2)
    k_cache = torch.randn(n, kv_heads, dim, total, dtype=dtype)
    v_cache = torch.randn(n, kv_heads, total, dim, dtype=dtype)
    k_t, v = k_cache[:, :, :, :length], v_cache[:, :, :length]
    mask = torch.rand(n, 1, 1, length) > 0.3
    mask[:, :, :, -1] = True
    got = transposed_key_attention(q, k_t, v, mask)
    assert got.shape == (n, heads, 1, dim) and got.dtype == dtype
    exact = F.scaled_dot_product_attention(q.double(), k_t.transpose(-1, -2).double(), v.double(), attn_mask=mask,
                                           enable_gqa=heads != kv_heads)
    sdpa = F.scaled_dot_product_attention(q, k_t.transpose(-1, -2), v, attn_mask=mask, enable_gqa=heads != kv_heads)
    error, sdpa_error = (got.double() - exact).abs().max(), (sdpa.double() - exact).abs().max()
    # float32: a few ulps of 1e-7, as the folded SDPA. bfloat16: the scores are rounded to bfloat16 before the
    # softmax (as transformers' eager attention does), 2^-9 of |q.k|/sqrt(d) <= ~4 here, so each weight moves
    # by <= ~1.6% and the output (|v| <= ~4) by <= ~0.06 in the worst case; then the weights' and the
    # output's own rounding, 2^-9 each.
    assert error <= (1e-6 if dtype == torch.float32 else 6e-2), (float(error), float(sdpa_error))


def test_transposed_key_attention_takes_one_query_a_row() -> None:
    from agents.attention import transposed_key_attention

    with pytest.raises(ValueError, match="one query per row"):
        transposed_key_attention(torch.randn(1, 4, 2, 8), torch.randn(1, 2, 8, 3), torch.randn(1, 2, 3, 8))
