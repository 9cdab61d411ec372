"""A hand-written forward for the Llama family (Llama 2/3, SmolLM2, TinyLlama, Mistral, Qwen2) with one
LoRA adapter per block of rows, shared by the rollout engine (:mod:`agents.engine`, decoding) and the
policy's scoring and training passes (:meth:`agents.policy.MultiAgentPolicy.forward` and friends).

Why not the model's own forward through PEFT: at RL sizes (a few rows of ~100 tokens, a 135M-1B model)
a forward costs what launching its ops costs more than what its arithmetic costs. PEFT adds five to
seven small ops and a float32 round trip per adapted linear layer, and transformers' attention picks a
kernel whose backward is slow on CPU for short sequences. Here:

- the frozen base's q/k/v and gate/up projections run as one matmul each (their weights are laid out
  contiguously once, with no copy kept: the model's own weights become views of the fused ones);
- each block's LoRA is applied with two float32 matmuls per fused projection
  (``(blocks, rows, in) @ (blocks, in, r)`` then ``@ (blocks, r, out)``, scale folded in; float32 as
  PEFT computes adapters). Built from the adapters' own parameters with differentiable ops, so
  gradients reach each agent's ``lora_A``/``lora_B`` exactly as through PEFT;
- RoPE is computed once per forward for all layers; full-sequence attention is written out
  (``softmax(q k^T / sqrt(d) + mask) v``, softmax in float32 as transformers' eager attention) for
  short sequences in a pass with gradients, whose backward that makes several times cheaper on CPU
  than the fused kernel in bfloat16, and uses ``scaled_dot_product_attention`` for long ones, where the
  (S, S) scores would cost memory; on the CPU, rows of one span each attend span by span
  (``SPAN_ATTENTION_MIN_LENGTH``), and neither a pass without gradients nor a float32 pass writes
  attention out.

The result equals the model's own forward (tests check log-probs and gradients against PEFT in
float32); in bfloat16 the two differ by rounding only. :func:`decoder_support` says which models and
adapters it covers (DoRA, LoRA on the LM head, q/k norms and sliding windows are not).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

from agents.attention import grouped_attention, row_spans, span_attention
from agents.lora_stacks import LoraStack, LoraStacking
from agents.memory import file_mapped_ranges

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
"""``config.model_type`` values the hand-written decoder covers."""

ACTIVATION_ELEMENTS = (14, 8)
"""Elements a decoder layer keeps for its backward per position, per unit of (hidden size, MLP
intermediate size): the normed inputs, projections' outputs, LoRA's intermediates and float32 casts,
the SiLU gate's inputs and outputs (calibrated on SmolLM2-135M; see :meth:`FusedDecoder.activation_bytes`)."""

MATH_ATTENTION_MAX_LENGTH = 512
"""Full-sequence passes up to this many positions write attention out (fast backward on CPU); longer
ones use ``scaled_dot_product_attention`` (memory linear in the length)."""

MATH_ATTENTION_MAX_LENGTH_NO_GRAD = 0
"""The same bound for a CPU pass without gradients (scoring, a reference's log-probs, values): none
writes attention out. The written-out attention is there for its cheap backward; its forward is the
slowest of the three ways at every length ``bench/attention_training.py`` measured (64-1024 positions,
bfloat16 and float32, on AVX-512 and on AVX2 kernels: ``bench/measured/attention_training*.json``), by
12-21x the masked kernel in bfloat16 on AVX2 kernels, where its products are emulated."""

MATH_ATTENTION_MAX_LENGTH_FLOAT32 = 0
"""The same bound for a CPU pass with gradients in float32 (the default dtype of CPUs without bf16
instructions): none writes attention out. The written-out attention's cheap backward is a bfloat16
matter: in float32 the masked kernel's forward and backward together were as fast or faster at every
length ``bench/attention_training.py`` measured (64-1024 positions, on AVX-512 and on AVX2 kernels:
``bench/measured/attention_training*.json``), and its memory is linear in the length. Whole training
passes of the embedded model in float32 were 1.06-1.10x faster with it, on both kernel sets
(``bench/measured/attention_passes_f32*.json``)."""

SPAN_ATTENTION_MIN_LENGTH = 256
"""Rows longer than this whose tokens are one span each (a left-padded prompt, then a right-padded
response) attend span by span on the CPU in a pass with gradients (:func:`agents.attention.span_attention`:
plain causal attention, no mask, the padding skipped). ``bench/attention_training.py`` (what it measured
on an AMD EPYC Zen 5 is in ``bench/measured/attention_training.json``): forward and backward, from 512
positions on faster than both the masked kernel and the written-out attention in bfloat16 and float32
(training 1.18-2.07x, forward 1.39-2.13x the better of the two); at 256 faster than the written-out
attention (training 1.18x bfloat16, 2.5x float32) and even with the masked kernel (0.96-1.13x); below
it the written-out attention's backward is the cheapest in bfloat16. On a GPU the rows keep one launch
each way (per-row calls would add launches to a launch-bound step)."""

SPAN_ATTENTION_MIN_LENGTH_NO_GRAD = 64
"""The same bound for a pass without gradients (scoring, a reference's log-probs, values, the rollout
engine's prefill): there only the forward counts. Span by span against the masked kernel, forward
(``bench/measured/attention_training.json``): in bfloat16 even at 96 positions and faster from 128 on
(1.17x at 128, 1.31x at 256, 1.39-1.72x at 512-1024); in float32 faster at 128 and from 256 on, slower
at 96 and 192 (the masked kernel 1.14x and 1.43x), so the bound follows the default dtype of CPUs with
bf16 instructions. At 64 the masked kernel is faster by 8-22%."""


def decoder_support(model: Any) -> str | None:
    """``None`` when the decoder can run ``model`` (a causal LM, possibly wrapped by PEFT), else the
    reason it cannot (then the policy uses the model's own ``forward``/``generate``)."""
    causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = causal_lm.config
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_MODEL_TYPES:
        return f"model_type {kind!r} is not one of {SUPPORTED_MODEL_TYPES}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} (the engine implements SiLU-gated MLPs)"
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True) is not False:
        if kind == "mistral" or getattr(config, "use_sliding_window", False):
            return "sliding-window attention"
    layers = getattr(getattr(causal_lm, "model", None), "layers", None)
    if layers is None or not hasattr(causal_lm, "lm_head"):
        return "the model has no model.layers / lm_head layout"
    attn = layers[0].self_attn
    if hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
        return "q/k normalisation (Qwen3-style attention)"
    for module in causal_lm.modules():
        magnitude = getattr(module, "lora_magnitude_vector", None)
        if magnitude is not None and len(magnitude):
            return "DoRA adapters"
    if hasattr(causal_lm.lm_head, "base_layer"):
        return "a LoRA adapter on the LM head"
    return None


@dataclass
class Block:
    """Consecutive rows of one agent: ``adapter`` is the PEFT adapter name, or ``None`` for the base."""

    adapter: str | None
    rows: int


@dataclass
class _Projection:
    """One fused frozen projection and the modules it stands for (to find their LoRA weights)."""

    weight: torch.Tensor  # (out_total, in)
    bias: torch.Tensor | None
    modules: list[Any]
    sizes: list[int]


# attend(layer index, q (N, h, S, hd), k (N, kvh, S, hd), v (N, kvh, S, hd)) -> (N, h, S, hd)
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def bucket_length(n: int) -> int:
    """``n`` rounded up to a coarse grid: to a multiple of 1/32nd of the largest power of two <= ``n``,
    and at least of 8 (so at most ~6% more positions, and 32 shapes an octave). Row lengths change with every
    batch; each new shape costs a oneDNN primitive and leaves allocator fragments behind, and on a MAGRPO
    run the resting RSS crept up by ~20 MB an iteration until shapes were bucketed (docs/agents.md)."""
    step = max(8, 1 << max(0, n.bit_length() - 6))
    return -(-n // step) * step


def causal_allowed(mask: torch.Tensor) -> torch.Tensor:
    """(N, S, S) bool: which keys each query position may attend to in rows with key mask ``mask`` (N, S):
    itself and the earlier unmasked positions. A pad query attends to itself only, so no softmax row is
    empty."""
    s = mask.shape[-1]
    eye = torch.eye(s, dtype=torch.bool, device=mask.device)
    return (torch.ones_like(eye).tril() & mask.bool()[:, None, :]) | eye


def pad_left(ids: torch.Tensor, mask: torch.Tensor, width: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad (N, S) rows to ``width`` columns (masked pads: positions and results do not change)."""
    extra = width - ids.shape[1]
    if extra <= 0:
        return ids, mask
    return F.pad(ids, (extra, 0), value=pad_id), F.pad(mask, (extra, 0), value=0)


def _base(module: Any) -> Any:
    return module.base_layer if hasattr(module, "base_layer") else module


class FusedDecoder(LoraStacking):
    """The forward of one Llama-family causal LM (possibly wrapped by PEFT) with per-row-block adapters.

    The base model's weights are fused in place the first time (q/k/v and gate/up become views of one
    tensor each), and again if they were replaced (``model.to(...)``); with ``trainable_base`` (full
    fine-tuning) the fused weights are copies made per call instead, so training never sees views.
    """

    def __init__(self, model: Any, *, trainable_base: bool = False) -> None:
        reason = decoder_support(model)
        if reason is not None:
            raise ValueError(f"the fused decoder cannot run this model: {reason}")
        self.model = model
        self.causal_lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.trainable_base = trainable_base
        config = self.causal_lm.config
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(getattr(config, "num_key_value_heads", None) or self.num_heads)
        hidden = int(config.hidden_size)
        self.head_dim = int(getattr(config, "head_dim", None) or hidden // self.num_heads)
        self.eps = float(config.rms_norm_eps)
        self._fused: list[dict[str, _Projection]] | None = None
        self._fused_at: tuple[int, ...] = ()

    # ------------------------------------------------------------------ weights
    def _fuse(self, modules: list[Any]) -> _Projection:
        bases = [_base(m) for m in modules]
        weights = [b.weight for b in bases]
        biases = [b.bias for b in bases]
        sizes = [int(w.shape[0]) for w in weights]
        with torch.no_grad():
            if len(weights) == 1:
                weight = weights[0].detach()
            else:
                weight = torch.cat([w.detach() for w in weights])
            if len(weights) > 1 and not self.trainable_base:
                start = 0
                for b, size in zip(bases, sizes):
                    b.weight.data = weight[start : start + size]  # a view: no second copy of the base
                    start += size
            bias = None
            if any(x is not None for x in biases):
                bias = torch.cat(
                    [x.detach() if x is not None else w.new_zeros(w.shape[0]) for x, w in zip(biases, weights)]
                )
        return _Projection(weight, bias, modules, sizes)

    def _weights(self) -> list[dict[str, _Projection]]:
        layers = self.causal_lm.model.layers
        fused = self._fused
        if fused is not None and not self.trainable_base:
            # Traced by torch.compile, the pointers cannot be compared: a compiled caller runs a pass (or
            # this) eagerly first, and the weights do not change within its call.
            if torch.compiler.is_compiling() or self._fused_at == self._weight_pointers():
                return fused
        fused = []
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            fused.append(
                {
                    "qkv": self._fuse([attn.q_proj, attn.k_proj, attn.v_proj]),
                    "o": self._fuse([attn.o_proj]),
                    "gate_up": self._fuse([mlp.gate_proj, mlp.up_proj]),
                    "down": self._fuse([mlp.down_proj]),
                }
            )
        if not self.trainable_base:
            self._own_weights()
            for projections in fused:  # the unfused projections now read the owned copies
                for proj in projections.values():
                    if len(proj.modules) == 1:
                        proj.weight = _base(proj.modules[0]).weight.detach()
            self._fused = fused
            self._fused_at = self._weight_pointers()
            self.__dict__.pop("_lora_cache", None)  # stacks of the replaced projections
        return fused

    def _weight_pointers(self) -> tuple[int, ...]:
        """Where every projection's base weight of every layer lives: the fused weights are current
        while these are unchanged (a weight replaced anywhere, ``model.to(...)`` or a loaded layer,
        changes one; an in-place update reaches the fused weights through the views)."""
        return tuple(_base(m).weight.data_ptr() for layer in self.causal_lm.model.layers
                     for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                               layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj))

    def _own_weights(self) -> None:
        """Give the weights that were not fused their own memory too. A model loaded from safetensors
        reads its weights from a mapping of the file; once the fused weights are copies, the mapping
        would keep the originals of q/k/v and gate/up resident beside them (140 MB of a 135M model in
        bf16). Copying the rest lets the mapping go: the base then costs its size once."""
        mapped = file_mapped_ranges()  # None: not known here, so every weight is copied
        with torch.no_grad():
            for tensor in [*self.causal_lm.parameters(), *self.causal_lm.buffers()]:
                if not tensor.is_cpu or tensor.requires_grad or tensor.untyped_storage().nbytes() > tensor.nbytes:
                    continue  # device memory, an adapter, or a view of a fused weight: already owned
                pointer = tensor.data_ptr()
                if mapped is not None and not any(lo <= pointer < hi for lo, hi in mapped):
                    continue  # in memory of its own (agents.models.read_weights_into): a copy would only cost time
                tensor.data = tensor.data.clone()

    # ------------------------------------------------------------------ pieces of the forward
    def _project(self, x: torch.Tensor, proj: _Projection, lora: LoraStack | None, blocks: list[int]) -> torch.Tensor:
        """(N, S, in) -> (N, S, out): the frozen projection plus each row block's LoRA."""
        out = F.linear(x, proj.weight, proj.bias)
        if lora is None:
            return out
        a_stack, b_stack = lora
        n, s = x.shape[0], x.shape[1]
        x = x.to(a_stack.dtype)  # adapters run in float32, as PEFT runs them (and CPU bmm is fast there)
        if len(blocks) == 1:
            delta = (x @ a_stack[0]) @ b_stack[0]
        elif len(set(blocks)) == 1:
            xs = x.reshape(len(blocks), blocks[0] * s, x.shape[-1])
            delta = torch.bmm(torch.bmm(xs, a_stack), b_stack).view(n, s, -1)
        else:
            parts, start = [], 0
            for i, rows in enumerate(blocks):
                xs = x[start : start + rows].reshape(rows * s, x.shape[-1])
                parts.append((xs @ a_stack[i]) @ b_stack[i])
                start += rows
            delta = torch.cat(parts).view(n, s, -1)
        return out + delta.to(out.dtype)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            # As transformers' LlamaRMSNorm (exactly, so fp32 greedy decoding matches generate).
            return weight * F.rms_norm(x, (x.shape[-1],), eps=self.eps)
        # One fused op in half precision (it accumulates in float32).
        return F.rms_norm(x, (x.shape[-1],), weight=weight, eps=self.eps)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (N, S, 1, hd) for ``positions`` (N, S), from the model's own rotary module."""
        rotary = self.causal_lm.model.rotary_emb
        probe = torch.empty(0, dtype=dtype, device=positions.device)
        cos, sin = rotary(probe, positions)
        return cos.to(dtype).unsqueeze(2), sin.to(dtype).unsqueeze(2)

    def _qkv(
        self, layer: Any, w: dict[str, _Projection], lora: dict[str, LoraStack | None], hidden: torch.Tensor,
        cos: torch.Tensor, sin: torch.Tensor, blocks: list[int],
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A layer's attention inputs for ``hidden`` (N, S, H): q (N, h, S, hd), k and v (N, kvh, S, hd),
        RoPE applied to q and k at once (``rotate_half`` as in transformers)."""
        n, s, _ = hidden.shape
        h, kvh, hd = self.num_heads, self.num_kv_heads, self.head_dim
        half = hd // 2
        x = self._norm(hidden, layer.input_layernorm.weight)
        qkv = self._project(x, w["qkv"], lora["qkv"], blocks).view(n, s, h + 2 * kvh, hd)
        qk, v = qkv[:, :, : h + kvh], qkv[:, :, h + kvh :]
        rotated = torch.cat((-qk[..., half:], qk[..., :half]), dim=-1)
        qk = qk * cos + rotated * sin
        return qk[:, :, :h].transpose(1, 2), qk[:, :, h:].transpose(1, 2), v.transpose(1, 2)

    def _mlp(self, layer: Any, w: dict[str, _Projection], lora: dict[str, LoraStack | None], hidden: torch.Tensor,
             attn: torch.Tensor, blocks: list[int]) -> torch.Tensor:
        """The rest of a layer: the attention's output ``attn`` (N, h, S, hd) through o_proj into the
        residual stream, then the gated MLP."""
        n, s, _ = hidden.shape
        attn = attn.transpose(1, 2).reshape(n, s, self.num_heads * self.head_dim)
        hidden = hidden + self._project(attn, w["o"], lora["o"], blocks)
        x = self._norm(hidden, layer.post_attention_layernorm.weight)
        gate, up = self._project(x, w["gate_up"], lora["gate_up"], blocks).chunk(2, dim=-1)
        return hidden + self._project(F.silu(gate) * up, w["down"], lora["down"], blocks)

    # ------------------------------------------------------------------ full-sequence forward
    def hidden_states(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        blocks: Sequence[Block],
        keep: torch.Tensor,
        *,
        checkpoint: bool = False,
        keep_mb: float = 0.0,
    ) -> torch.Tensor:
        """The final (normed) hidden states at positions ``keep`` of each row: (N, K, H).

        Args:
            ids, mask: (N, S) token ids and attention mask (any padding: positions follow the mask);
                rows grouped by adapter as ``blocks`` says.
            keep: (K,) positions whose hidden states are wanted (the LM head and value heads read them).
            checkpoint: activation checkpointing per layer in gradient passes: a layer's activations
                (~40 KB a token for SmolLM2-135M in bf16) are recomputed in the backward instead of kept,
                for one more forward's time.
            keep_mb: with ``checkpoint``, as many layers as fit in this many megabytes of activations
                (:meth:`activation_bytes`) keep them; only the others are recomputed.

        Differentiable in the adapters (and in a trainable base) under torch's grad mode.
        """
        if sum(b.rows for b in blocks) != len(ids):
            raise ValueError(f"blocks cover {sum(b.rows for b in blocks)} rows, the batch has {len(ids)}")
        if self.trainable_base:
            raise ValueError("hidden_states needs a frozen base (the fused weights are not the model's)")
        weights = self._weights()
        dtype = self.causal_lm.get_input_embeddings().weight.dtype
        n, s = ids.shape
        # Packed: only the positions that matter (unmasked ones and the kept ones) go through the
        # projections and the element-wise work, as one flat (T, 1, H) batch; attention alone sees rows.
        # Rows of RL batches are padded to their longest prompt and response (a third to a half of PPO's
        # positions on IMDB), so packing saves that share of every matmul of the pass.
        wanted = mask.bool().clone()
        wanted[:, keep] = True
        flat_wanted = wanted.reshape(-1)
        total = int(flat_wanted.sum())
        # Bucket the packed length too (see bucket_length), with pad positions that are discarded.
        extra = min(bucket_length(total), n * s) - total
        if extra > 0:
            flat_wanted[(~flat_wanted).nonzero().squeeze(1)[:extra]] = True
        sel = flat_wanted.nonzero().squeeze(1)  # (T,) flat positions, row by row
        per_row = flat_wanted.view(n, s).sum(1)  # the bucket's extra positions included
        rows: list[int] = []
        start = 0
        for block in blocks:
            rows.append(int(per_row[start : start + block.rows].sum()))
            start += block.rows
        # Over whole rows the adapters compute in the base's precision, as under autocast (their weights,
        # gradients and optimizer state stay float32): in bfloat16 these matmuls are ~2x faster on CPU.
        flat_blocks = [Block(b.adapter, t) for b, t in zip(blocks, rows)]
        loras = [{k: self._lora(p, flat_blocks, dtype) for k, p in w.items()} for w in weights]
        positions = (mask.cumsum(-1) - 1).clamp(min=0).reshape(-1)[sel]
        cos, sin = self.rope(positions[:, None], dtype)  # (T, 1, 1, hd)
        attend = self._attention(causal_allowed(mask)[:, None], dtype, s, self._spans(mask))
        h, hd = self.num_heads, self.head_dim

        def to_rows(x: torch.Tensor) -> torch.Tensor:
            """(T, heads, 1, hd) packed -> (N, heads, S, hd) rows, zeros at the positions left out."""
            full = x.new_zeros(n * s, x.shape[1], hd).index_copy(0, sel, x[:, :, 0])
            return full.view(n, s, x.shape[1], hd).transpose(1, 2)

        def run(i: int, layer: Any, w: dict[str, _Projection], lora: dict[str, LoraStack | None],
                hidden: torch.Tensor) -> torch.Tensor:
            q, k, v = self._qkv(layer, w, lora, hidden, cos, sin, rows)  # (T, heads, 1, hd)
            attn = attend(i, to_rows(q), to_rows(k), to_rows(v))  # (N, h, S, hd)
            attn = attn.transpose(1, 2).reshape(n * s, h, hd).index_select(0, sel)
            return self._mlp(layer, w, lora, hidden, attn[:, :, None], rows)

        hidden = self.causal_lm.model.embed_tokens(ids.reshape(-1)[sel])[:, None]  # (T, 1, H)
        hidden = self._stack(run, hidden, weights, loras, checkpoint, keep_mb)
        # The packed index of each (row, kept position): every kept position was packed.
        where = torch.full((n * s,), -1, dtype=torch.long, device=ids.device)
        where[sel] = torch.arange(len(sel), device=ids.device)
        return self.causal_lm.model.norm(hidden[:, 0][where.view(n, s)[:, keep]])

    def hidden_states_shared(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        prompt_blocks: Sequence[Block],
        index: torch.Tensor,
        ids: torch.Tensor,
        mask: torch.Tensor,
        blocks: Sequence[Block],
        *,
        checkpoint: bool = False,
        keep_mb: float = 0.0,
    ) -> torch.Tensor:
        """:meth:`hidden_states` of rows that share prompts, each prompt computed once: (N, R, H), the final
        hidden states at the last prompt position and the response positions ``0 .. R-2`` of each row
        (those that predict its response tokens ``0 .. R-1``).

        Equal to :meth:`hidden_states` over the rows ``[prompt_ids[index], ids]`` with ``keep`` those
        positions (tested), for ``U * P + N * R`` positions instead of ``N * (P + R)``: the G samples of
        one problem read one prompt's keys and values. Gradients reach the adapters through the prompt's
        positions too (summed over the rows that read them), as in the unshared pass.

        Args:
            prompt_ids, prompt_mask: (U, P) the distinct prompts, left-padded; in blocks ``prompt_blocks``.
            index: (N,) the prompt row of each response row (a row of block ``b`` reads a prompt of
                prompt block ``b``: the same adapter).
            ids, mask: (N, R) the responses, right-padded; rows grouped by adapter as ``blocks`` says.
        """
        if len(prompt_blocks) != len(blocks) or any(
            p.adapter != b.adapter for p, b in zip(prompt_blocks, blocks)
        ):
            raise ValueError("prompt blocks and row blocks must name the same adapters in the same order")
        if sum(b.rows for b in blocks) != len(ids) or sum(b.rows for b in prompt_blocks) != len(prompt_ids):
            raise ValueError("blocks must cover the rows and prompt blocks the prompts")
        if self.trainable_base:
            raise ValueError("hidden_states_shared needs a frozen base (the fused weights are not the model's)")
        weights = self._weights()
        dtype = self.causal_lm.get_input_embeddings().weight.dtype
        u, width = prompt_ids.shape
        n, length = ids.shape
        split = u * width
        # Every projection runs once over all positions, prompts' then responses' (U * P + N * R, 1, H):
        # at these sizes a matmul costs what reading its weight costs, so two smaller ones would cost
        # twice. Only attention sees the rows.
        flat: list[Block] = []
        for block in [*(Block(b.adapter, b.rows * width) for b in prompt_blocks),
                      *(Block(b.adapter, b.rows * length) for b in blocks)]:
            if flat and flat[-1].adapter == block.adapter:
                flat[-1] = Block(block.adapter, flat[-1].rows + block.rows)
            else:
                flat.append(block)
        loras = [{k: self._lora(p, flat, dtype) for k, p in w.items()} for w in weights]
        rows = [b.rows for b in flat]
        # Positions follow the masks, the responses' continuing from their prompt's length.
        positions = torch.cat([
            (prompt_mask.cumsum(-1) - 1).clamp(min=0).reshape(-1),
            (prompt_mask.sum(-1)[index, None] + mask.cumsum(-1) - 1).clamp(min=0).reshape(-1),
        ])
        cos, sin = self.rope(positions[:, None], dtype)
        # As in hidden_states (pad queries attend to themselves): a prompt sees its own earlier tokens; a
        # response position its prompt's tokens, then its own earlier tokens.
        allowed_p = causal_allowed(prompt_mask)
        allowed_r = torch.cat([prompt_mask.bool()[index, None, :].expand(-1, length, -1), causal_allowed(mask)], dim=-1)
        attend_p = self._attention(allowed_p[:, None], dtype, width, self._spans(prompt_mask))
        attend_r = self._attention(allowed_r[:, None], dtype, width + length)
        h, hd = self.num_heads, self.head_dim

        def rows_of(x: torch.Tensor, count: int, size: int) -> torch.Tensor:
            """(T, heads, 1, hd) positions -> (count, heads, size, hd) rows."""
            return x.reshape(count, size, x.shape[1], hd).transpose(1, 2)

        def run(i: int, layer: Any, w: dict[str, _Projection], lora: dict[str, LoraStack | None],
                hidden: torch.Tensor) -> torch.Tensor:
            q, k, v = self._qkv(layer, w, lora, hidden, cos, sin, rows)  # (T, heads, 1, hd)
            k_p, v_p = rows_of(k[:split], u, width), rows_of(v[:split], u, width)
            attn_p = attend_p(i, rows_of(q[:split], u, width), k_p, v_p)
            k_r = torch.cat([k_p.index_select(0, index), rows_of(k[split:], n, length)], dim=2)
            v_r = torch.cat([v_p.index_select(0, index), rows_of(v[split:], n, length)], dim=2)
            attn_r = attend_r(i, rows_of(q[split:], n, length), k_r, v_r)
            attn = torch.cat([attn_p.transpose(1, 2).reshape(split, h, 1, hd),
                              attn_r.transpose(1, 2).reshape(n * length, h, 1, hd)])
            return self._mlp(layer, w, lora, hidden, attn, rows)

        embed = self.causal_lm.model.embed_tokens
        hidden = embed(torch.cat([prompt_ids.reshape(-1), ids.reshape(-1)]))[:, None]  # (T, 1, H)
        hidden = self._stack(run, hidden, weights, loras, checkpoint, keep_mb)
        hidden_p = hidden[:split].view(u, width, -1)
        hidden_r = hidden[split:].view(n, length, -1)
        last = hidden_p[:, -1:].index_select(0, index)  # the last prompt position predicts response token 0
        return self.causal_lm.model.norm(torch.cat([last, hidden_r[:, :-1]], dim=1))

    def activation_bytes(self, tokens: int) -> int:
        """Estimated bytes one decoder layer keeps for its backward over ``tokens`` positions of a gradient
        pass: :data:`ACTIVATION_ELEMENTS` per position, in the base's precision. Measured on SmolLM2-135M
        in bfloat16 (RSS after a forward, 400 and 800 positions): 1161-1228 KiB a position over its 30
        layers, which the estimate gives as 1192 KiB."""
        config = self.causal_lm.config
        dtype = self.causal_lm.get_input_embeddings().weight.dtype
        per = ACTIVATION_ELEMENTS[0] * int(config.hidden_size) + ACTIVATION_ELEMENTS[1] * int(config.intermediate_size)
        return int(tokens) * per * torch.finfo(dtype).bits // 8

    def _stack(
        self, run: Callable[..., torch.Tensor], hidden: torch.Tensor, weights: list[dict[str, _Projection]],
        loras: list[dict[str, LoraStack | None]], checkpoint: bool, keep_mb: float,
    ) -> torch.Tensor:
        """``run`` every decoder layer in turn on the packed ``hidden`` (T, 1, H). Under grad mode with
        ``checkpoint``, a layer keeps only its input and is recomputed in the backward (exactly: no
        dropout here), except the first layers whose activations fit in ``keep_mb`` megabytes."""
        layers = self.causal_lm.model.layers
        kept = len(layers)
        if checkpoint and torch.is_grad_enabled():
            per_layer = max(1, self.activation_bytes(hidden.shape[0]))
            kept = min(len(layers), int(keep_mb * 2**20 // per_layer))
        for i, (layer, w, lora) in enumerate(zip(layers, weights, loras)):
            if i >= kept:
                hidden = torch.utils.checkpoint.checkpoint(run, i, layer, w, lora, hidden, use_reentrant=False)
            else:
                hidden = run(i, layer, w, lora, hidden)
        return hidden

    @staticmethod
    def _spans(mask: torch.Tensor) -> list[tuple[int, int]] | None:
        """Each row's span of tokens where span attention would serve rows of ``mask`` (N, S): CPU rows
        longer than ``SPAN_ATTENTION_MIN_LENGTH`` (``SPAN_ATTENTION_MIN_LENGTH_NO_GRAD`` in a pass
        without gradients), each one span, outside ``torch.compile``; else None."""
        bound = SPAN_ATTENTION_MIN_LENGTH if torch.is_grad_enabled() else SPAN_ATTENTION_MIN_LENGTH_NO_GRAD
        if mask.device.type != "cpu" or mask.shape[-1] <= bound or torch.compiler.is_compiling():
            return None  # (a compiled pass keeps the mask: the spans are read by the host)
        return row_spans(mask)

    def _attention(self, allowed: torch.Tensor, dtype: torch.dtype, length: int,
                   spans: list[tuple[int, int]] | None = None) -> Attend:
        """Causal attention over whole rows: ``allowed`` (N, 1, S, S) says which keys each query sees;
        ``spans`` (:meth:`_spans`): the rows' spans of tokens, attended span by span (the queries
        outside them, padding whose results are never read, get zeros instead of their own value).
        Otherwise the masked kernel for rows longer than ``MATH_ATTENTION_MAX_LENGTH`` (on the CPU:
        ``MATH_ATTENTION_MAX_LENGTH_NO_GRAD`` in a pass without gradients,
        ``MATH_ATTENTION_MAX_LENGTH_FLOAT32`` in a float32 pass with them), else the written-out
        attention."""
        groups = self.num_heads // self.num_kv_heads
        if spans is not None:

            def spanned(_index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                return span_attention(q, k, v, spans)

            return spanned
        bound = MATH_ATTENTION_MAX_LENGTH
        if allowed.device.type == "cpu":
            if not torch.is_grad_enabled():
                bound = MATH_ATTENTION_MAX_LENGTH_NO_GRAD
            elif dtype == torch.float32:
                bound = MATH_ATTENTION_MAX_LENGTH_FLOAT32
        if length > bound:

            def fused(_index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
                return grouped_attention(q, k, v, allowed)

            return fused
        bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
            ~allowed, torch.finfo(dtype).min
        )
        scale = self.head_dim**-0.5

        def written_out(_index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            if groups != 1:
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            scores = torch.matmul(q, k.transpose(-1, -2)) * scale + bias
            return torch.matmul(scores.softmax(-1, dtype=torch.float32).to(q.dtype), v)

        return written_out
