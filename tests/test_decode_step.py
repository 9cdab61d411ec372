"""The rollout engine's decode layers (agents/decode_step.py: RoPE's tables and the mask once a step, keys and
values as one tensor, each block's LoRA added by its B product) against the unfused layers the training
passes run (agents/decoder.py's ``_qkv``/``_mlp``/``_project``): the same hidden states, keys and values, in
float32 to the rounding bound of the computation, for rows of one block, of equal blocks and of unequal ones.

Runs on ``--device`` (the CPU by default; ``make test-gpu`` runs it on CUDA).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
import torch.nn.functional as F
from numerics import assert_f32_close
from tiny_models import tiny_model

from agents import LoraSettings, MultiAgentPolicy
from agents.attention import grouped_attention
from agents.decode_step import additive_mask
from agents.decoder import Block, causal_allowed
from llm_envs.tokenizers import load_tokenizer

AGENTS = ("helper", "main")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(None)


def make_engine(tokenizer, dtype=torch.float32):
    model = tiny_model(tokenizer, seed=0).to(dtype)
    policy = MultiAgentPolicy(model, tokenizer, AGENTS, lora=LoraSettings(rank=4))
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # distinct, non-zero adapters: a row given another block's adapter shows
        for agent in policy.agents:
            for param in policy.parameters(agent):
                param.add_((0.5 * torch.randn(param.shape, generator=gen)).to(param.device))
    return policy.engine


@pytest.mark.parametrize("rows", [[5], [3, 3], [2, 5]], ids=["one-block", "equal-blocks", "unequal-blocks"])
@pytest.mark.parametrize("length", [1, 6], ids=["decode-step", "prefill"])
def test_decode_layers_equal_the_unfused_layers(tokenizer, device, rows, length):
    engine = make_engine(tokenizer)
    blocks = [Block(agent, r) for agent, r in zip(AGENTS, rows)]
    weights = engine._weights()
    loras = [{k: engine._lora(p, blocks, torch.float32) for k, p in w.items()} for w in weights]
    n, hidden_size = sum(rows), int(engine.causal_lm.config.hidden_size)
    gen = torch.Generator().manual_seed(2)
    hidden = torch.randn(n, length, hidden_size, generator=gen).to(device)
    positions = (torch.randint(0, 40, (n, 1), generator=gen) + torch.arange(length)).to(device)
    mask = torch.ones(n, length, dtype=torch.bool, device=device)
    mask[0, : length - 1] = False  # a row with masked keys (left padding)
    allowed = causal_allowed(mask)[:, None]

    with torch.no_grad():
        cos, sin = engine.rope(positions, torch.float32)
        expected, expected_kv = hidden, []
        for layer, w, lora in zip(engine.causal_lm.model.layers, weights, loras):
            q, k, v = engine._qkv(layer, w, lora, expected, cos, sin, rows)
            expected_kv.append(torch.stack([k, v]))
            expected = engine._mlp(layer, w, lora, expected, grouped_attention(q, k, v, allowed), rows)

        ours_kv = []

        def attend(_index: int, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            ours_kv.append(kv.clone())
            return grouped_attention(q, kv[0], kv[1], additive_mask(allowed, torch.float32))

        ours = engine.decode_layers(hidden, engine.rotary(positions, torch.float32), attend, weights, loras, rows)
    assert_f32_close(ours, expected)
    assert len(ours_kv) == len(expected_kv)
    for mine, theirs in zip(ours_kv, expected_kv):
        assert_f32_close(mine, theirs)
    # Each block's own adapter ran: with the blocks' adapters swapped, the rows move.
    if len(rows) == 2:
        swapped = [Block(b.adapter, r) for b, r in zip(reversed(blocks), rows)]
        other = [{k: engine._lora(p, swapped, torch.float32) for k, p in w.items()} for w in weights]
        with torch.no_grad():
            moved = engine.decode_layers(hidden, engine.rotary(positions, torch.float32), attend, weights, other, rows)
        assert (moved - ours).abs().amax(dim=(1, 2)).min() > 1e-3


@pytest.mark.parametrize("rows", [[3, 3], [2, 5]], ids=["equal-blocks", "unequal-blocks"])
def test_float32_adapters_over_a_bfloat16_base_are_added_rounding_once(tokenizer, rows):
    """With a bfloat16 base (the CPU's, adapters in float32 as PEFT runs them) the float32 delta is added into
    the base's output in place: the sum computed in float32 and rounded to bfloat16 once, as PEFT adds it."""
    engine = make_engine(tokenizer, torch.bfloat16)
    blocks = [Block(agent, r) for agent, r in zip(AGENTS, rows)]
    proj = engine._weights()[0]["qkv"]
    a_stack, b_stack = engine._lora(proj, blocks, torch.float32)
    x = torch.randn(sum(rows), 1, proj.weight.shape[1], generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    from agents.decode_step import DecodeLayers, _BlockMasks

    with torch.no_grad():
        ours = DecodeLayers._decode_project(x, proj, (a_stack, b_stack), _BlockMasks(rows, 1, x.device))
        base = F.linear(x, proj.weight, proj.bias).double()
        delta, start = [], 0
        for i, r in enumerate(rows):  # each block's delta in float64
            delta.append(x[start : start + r].double() @ a_stack[i].double() @ b_stack[i].double())
            start += r
        exact = base + torch.cat(delta)
    assert ours.dtype == torch.bfloat16
    # Rounded once: within half a bfloat16 step of the exact sum, plus the float32 delta's own rounding.
    step = 2.0 ** (torch.floor(torch.log2(exact.abs().clamp(min=1e-30))) - 7)
    assert bool(((ours.double() - exact).abs() <= 0.5 * step + 1e-5 * exact.abs().max()).all())
