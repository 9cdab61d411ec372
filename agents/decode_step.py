"""The layers of the rollout engine's forward without gradients: its prefill, its dynamic decode loop and
the static step of :mod:`agents.graph` (a mixin of :class:`agents.engine.RolloutEngine`).

The same network as :class:`agents.decoder.FusedDecoder`'s passes, in fewer ops a layer. At the engine's
sizes a decode step costs what launching its ops costs (a GPU's step is replayed as a CUDA graph of a
thousand kernels; on the CPU each op costs its dispatch), so what the step computes once it does not
compute per layer, and a layer runs fewer, larger ops:

- **RoPE tables once a step** (:meth:`DecodeLayers.rotary`), for the fused q/k/v heads at once: ``x cos +
  swap(x) sin`` with ``swap`` exchanging the two halves of a head and rotate-half's sign folded into the
  sine, the value heads given cosine 1 and sine 0 (exactly their own value). A layer rotates its q/k/v in
  four ops (the halves swapped, two products, a sum) and its keys and values come out side by side;
- **keys and values as one tensor** ``kv`` (2, N, kvh, S, hd): the static step's cache holds both in one
  tensor a layer and writes a step's keys and values with one ``index_copy_``;
- **each block's LoRA added by the B product itself**: where the adapters compute in the base's dtype
  (float32 on the CPU, the static step on a GPU) the second product is ``baddbmm`` onto the base's output
  (rows of equal blocks) or ``addmm`` of every block's ``x A`` at once, masked to each row's own block,
  against the B factors stacked (blocks of unequal rows), instead of a product, a concatenation and a
  sum; with float32 adapters over a bfloat16 base, the float32 delta is added in place into the base's
  output (one op for the cast and the sum, rounded once, as PEFT adds it).

The attention mask is the callers' to build once a step (:mod:`agents.engine`, :mod:`agents.graph`): an
additive bias read by every layer. The training passes keep :class:`~agents.decoder.FusedDecoder`'s
``_qkv``/``_mlp``/``_project`` (their numbers do not change); the tests check that the engine's tokens
and log-probs equal transformers' ``generate``, the static step's the dynamic loop's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from agents.decoder import _Projection
    from agents.lora_stacks import LoraStack

# attend(layer index, q (N, h, S, hd), kv (2, N, kvh, S, hd): keys then values) -> (N, h, S, hd)
DecodeAttend = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class Rotary:
    """RoPE of one step for the fused q/k/v heads: ``cos`` and ``sin`` (N, S, h + 2 kvh, hd), ``sin`` with
    rotate-half's sign folded in (its first half negated), the value heads' cosine 1 and sine 0."""

    cos: torch.Tensor
    sin: torch.Tensor


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where ``allowed`` (bool), -inf elsewhere, in ``dtype``: attention's mask as the bias every layer of a
    step adds to its scores (what SDPA makes of a boolean mask at each call)."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


class DecodeLayers:
    """The decode-only layers of :class:`agents.engine.RolloutEngine` (a mixin over
    :class:`agents.decoder.FusedDecoder`, whose weights, stacks and norms they use)."""

    causal_lm: Any
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope: Callable[[torch.Tensor, torch.dtype], tuple[torch.Tensor, torch.Tensor]]
    _norm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

    def rotary(self, positions: torch.Tensor, dtype: torch.dtype) -> Rotary:
        """The :class:`Rotary` tables of ``positions`` (N, S): built once a step, read by every layer."""
        cos, sin = self.rope(positions, dtype)  # (N, S, 1, hd)
        h, kvh, half = self.num_heads, self.num_kv_heads, self.head_dim // 2
        shape = (*cos.shape[:2], h + kvh, cos.shape[-1])
        value_cos = cos.new_ones((*cos.shape[:2], kvh, cos.shape[-1]))
        folded = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        return Rotary(torch.cat((cos.expand(shape), value_cos), dim=2),
                      torch.cat((folded.expand(shape), torch.zeros_like(value_cos)), dim=2))

    def decode_layers(
        self,
        hidden: torch.Tensor,
        rotary: Rotary,
        attend: DecodeAttend,
        weights: list[dict[str, _Projection]],
        loras: list[dict[str, LoraStack | None]],
        blocks: list[int],
    ) -> torch.Tensor:
        """Run every decoder layer on ``hidden`` (N, S, H) of the engine's prefill and decode steps (no
        gradients); ``attend`` does the attention proper, with the KV cache."""
        n, s, _ = hidden.shape
        h, kvh, hd = self.num_heads, self.num_kv_heads, self.head_dim
        half = hd // 2
        mix = _BlockMasks(blocks, s, hidden.device)
        for index, (layer, w, lora) in enumerate(zip(self.causal_lm.model.layers, weights, loras)):
            x = self._norm(hidden, layer.input_layernorm.weight)
            qkv = self._decode_project(x, w["qkv"], lora["qkv"], mix).view(n, s, h + 2 * kvh, hd)
            qkv = qkv * rotary.cos + torch.cat((qkv[..., half:], qkv[..., :half]), dim=-1) * rotary.sin
            kv = qkv[:, :, h:].view(n, s, 2, kvh, hd).permute(2, 0, 3, 1, 4)  # (2, N, kvh, S, hd)
            attn = attend(index, qkv[:, :, :h].transpose(1, 2), kv)
            attn = attn.transpose(1, 2).reshape(n, s, h * hd)
            hidden = hidden + self._decode_project(attn, w["o"], lora["o"], mix)
            x = self._norm(hidden, layer.post_attention_layernorm.weight)
            gate, up = self._decode_project(x, w["gate_up"], lora["gate_up"], mix).chunk(2, dim=-1)
            hidden = hidden + self._decode_project(F.silu(gate) * up, w["down"], lora["down"], mix)
        return hidden

    @staticmethod
    def _decode_project(x: torch.Tensor, proj: _Projection, lora: LoraStack | None, mix: _BlockMasks) -> torch.Tensor:
        """(N, S, in) -> (N, S, out): the frozen projection plus each row block's LoRA (the stacks of
        :meth:`agents.lora_stacks.LoraStacking._lora`: A (blocks, in, R), B (blocks, R, out))."""
        out = F.linear(x, proj.weight, proj.bias)
        if lora is None:
            return out
        a_stack, b_stack = lora
        count, width, rank = a_stack.shape
        flat = out.view(-1, out.shape[-1])
        x = x.reshape(-1, width)
        if a_stack.dtype != out.dtype:  # float32 adapters over a half-precision base (the CPU's bfloat16)
            x = x.to(a_stack.dtype)
            if mix.equal:
                delta = torch.bmm(torch.bmm(x.view(count, -1, width), a_stack), b_stack)
            else:
                delta = (x @ a_stack.permute(1, 0, 2).reshape(width, -1)).mul_(mix.keep(rank, x.dtype))
                delta = delta @ b_stack.reshape(count * rank, -1)
            return out.add_(delta.view(out.shape))  # computed in float32, rounded once into the base's dtype
        # In place on the base's fresh output: an out-of-place baddbmm/addmm would copy it first.
        if mix.equal:
            xa = torch.bmm(x.view(count, -1, width), a_stack)
            flat.view(count, -1, flat.shape[-1]).baddbmm_(xa, b_stack)
            return out
        # Unequal blocks: every block's x A at once (the ranks are small: the other blocks' cost little),
        # each row's masked to its own block's (an exact zero elsewhere), then the B factors stacked.
        xa = (x @ a_stack.permute(1, 0, 2).reshape(width, -1)).mul_(mix.keep(rank, x.dtype))
        flat.addmm_(xa, b_stack.reshape(count * rank, -1))
        return out


class _BlockMasks:
    """Which row block each (row, position) of a step belongs to, and per LoRA rank the (T, blocks * R)
    0/1 masks that keep each row's own block's ``x A``: built once a step (a few per distinct rank), read
    by every layer. ``equal``: the blocks have equal rows (batched products serve them, no mask)."""

    def __init__(self, blocks: list[int], positions: int, device: torch.device) -> None:
        self.blocks, self.positions, self.device = blocks, positions, device
        self.equal = len(set(blocks)) == 1
        self._masks: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def keep(self, rank: int, dtype: torch.dtype) -> torch.Tensor:
        mask = self._masks.get((rank, dtype))
        if mask is None:
            count = len(self.blocks)
            # Filled, not copied from the host: a CUDA graph's capture may not copy from host memory.
            owner = torch.cat([torch.full((rows * self.positions,), i, device=self.device)
                               for i, rows in enumerate(self.blocks)])
            column = torch.arange(count, device=self.device).repeat_interleave(rank)
            mask = self._masks[(rank, dtype)] = (owner[:, None] == column[None, :]).to(dtype)
        return mask
