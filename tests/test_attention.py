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
