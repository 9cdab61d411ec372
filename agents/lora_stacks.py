"""Each row block's LoRA factors of one fused projection, stacked for batched matmuls, and kept.

:class:`agents.decoder.FusedDecoder` (and the rollout engine, its subclass) applies every block's adapter
with two batched matmuls per fused projection: A (n_blocks, in, R) and B (n_blocks, R, out), the scaling
folded into B and the fused modules' ranks side by side (B block-diagonal). This module builds those
stacks from the adapters' own parameters and, where launches dominate (off the CPU:
:attr:`LoraStacking.keep_lora_stacks`), keeps them per adapter layout until an adapter changes and hands
each adapter its part of the stacks' gradients (:class:`StackedLora`), so gradients are those of
building the stacks with differentiable ops every pass. On the CPU the stacks are built with
differentiable ops in every pass and freed with it: the ~30 ops a layer cost a CPU pass of hundreds of
positions next to nothing, and the kept stacks (every adapter layout the run met, all layers, float32
on a float32 base) raised a MAGRPO run's peak for no speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from agents.decoder import Block, _Projection

LoraStack = tuple[torch.Tensor, torch.Tensor]
"""A (n_blocks, in, R) and B (n_blocks, R, out) of one fused projection."""

Layout = list[tuple[int, int, int, int, int, int, float]]
"""Where each adapter sits in a stack: (block, index of A in the parameters, rank offset, rank, output
offset, output size, scaling) per (block, module) pair."""


class LoraStacking:
    """The LoRA-stacking methods of :class:`agents.decoder.FusedDecoder` (a mixin: the stacks it keeps live
    in the decoder's ``_lora_cache``, dropped when the fused weights are rebuilt)."""

    keep_lora_stacks: bool | None = None
    """Keep the stacks between passes (``True``), build them in every pass (``False``), or ``None``
    (default): keep them where launches dominate a pass, i.e. on any device but the CPU (a CUDA decode
    step runs its ~30 stacking ops a layer for a few rows), and build them on the CPU, where memory is the
    scarcer resource. Set on an instance to override."""

    def _keeps_stacks(self, device: torch.device) -> bool:
        """Whether :meth:`_lora` keeps the stacks of projections on ``device`` (:attr:`keep_lora_stacks`)."""
        keep = self.keep_lora_stacks
        return device.type != "cpu" if keep is None else bool(keep)

    @staticmethod
    def _adapter(module: Any, adapter: str | None) -> tuple[torch.Tensor, torch.Tensor, float] | None:
        """(A (r, in), B (out, r), scaling) of ``adapter`` on ``module``, or ``None``."""
        lora_a = getattr(module, "lora_A", None)
        if adapter is None or lora_a is None or adapter not in lora_a:
            return None
        return module.lora_A[adapter].weight, module.lora_B[adapter].weight, float(module.scaling[adapter])

    def _lora(self, proj: _Projection, blocks: Sequence[Block], dtype: torch.dtype) -> LoraStack | None:
        """Stacked LoRA factors of ``proj`` for each block: A (n_blocks, in, R) and B (n_blocks, R, out)
        with the scaling folded into B and the modules' ranks side by side (B block-diagonal). ``None``
        when no block has an adapter on this projection.

        Where :meth:`_keeps_stacks` says so (off the CPU by default), built once per adapter layout and
        kept until an adapter changes (in place: its version counter, as ``optimizer.step()`` and
        ``load_state_dict`` bump it; or replaced: its storage), not rebuilt by every pass (about 30 of a
        layer's ops). Under grad mode the kept stacks come through :class:`StackedLora`, whose backward
        hands each adapter parameter its slice of the stacks' gradients: the gradients are those of
        building the stacks with differentiable ops, which is what every pass does elsewhere."""
        pairs = [[self._adapter(module, block.adapter) for module in proj.modules] for block in blocks]
        params = [t for row in pairs for pair in row if pair is not None for t in pair[:2]]
        if not params:
            return None
        # Inside a compiled graph the stacking ops cost no launches; on the CPU they cost little, and the
        # kept stacks memory.
        if torch.compiler.is_compiling() or not self._keeps_stacks(proj.weight.device):
            return self._stack_lora(proj, pairs, dtype)[0]
        key = (id(proj), tuple(b.adapter for b in blocks), dtype)
        stamp = (tuple((p.data_ptr(), p._version) for p in params),
                 tuple(pair[2] for row in pairs for pair in row if pair is not None))
        cache = self.__dict__.setdefault("_lora_cache", {})
        hit = cache.get(key)
        # The entry holds its parameters and projection: they cannot be freed and their ids reused meanwhile.
        if hit is None or hit[0] != stamp or hit[1] is not proj or any(a is not b for a, b in zip(hit[2], params)):
            with torch.no_grad():
                stacks, layout = self._stack_lora(proj, pairs, dtype)
            hit = cache[key] = (stamp, proj, params, stacks, layout)
        stacks, layout = hit[3], hit[4]
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            a_stack, b_stack = StackedLora.apply(layout, stacks[0], stacks[1], *params)
            return a_stack, b_stack
        return stacks

    @staticmethod
    def _stack_lora(
        proj: _Projection, pairs: list[list[tuple[torch.Tensor, torch.Tensor, float] | None]], dtype: torch.dtype
    ) -> tuple[LoraStack, Layout]:
        """The stacks of :meth:`_lora` and where each adapter sits in them: (block, index of A in the
        parameters, rank offset, rank, output offset, output size, scaling) per (block, module) pair."""
        rank_of = [max([0, *(int(row[j][0].shape[0]) for row in pairs if row[j] is not None)])
                   for j in range(len(proj.modules))]
        n_in = proj.weight.shape[1]
        device = proj.weight.device
        a_rows, b_rows, layout = [], [], []
        index = 0
        for block, row in enumerate(pairs):
            a_parts, b_parts = [], []
            r_offset = out_offset = 0
            for j, pair in enumerate(row):
                rank, size = rank_of[j], proj.sizes[j]
                if pair is None:
                    a_parts.append(torch.zeros(n_in, rank, dtype=dtype, device=device))
                    b_parts.append(torch.zeros(rank, size, dtype=dtype, device=device))
                else:
                    a, b = pair[0].t().to(dtype), (pair[1] * pair[2]).t().to(dtype)  # (in, r), (r, out)
                    layout.append((block, index, r_offset, int(a.shape[1]), out_offset, size, pair[2]))
                    index += 2
                    if a.shape[1] < rank:  # adapters of different ranks side by side: pad with zeros
                        a = F.pad(a, (0, rank - a.shape[1]))
                        b = F.pad(b, (0, 0, 0, rank - b.shape[0]))
                    a_parts.append(a)
                    b_parts.append(b)
                r_offset += rank
                out_offset += size
            a_rows.append(torch.cat(a_parts, dim=1) if len(a_parts) > 1 else a_parts[0])
            b_rows.append(torch.block_diag(*b_parts) if len(b_parts) > 1 else b_parts[0])
        return (torch.stack(a_rows), torch.stack(b_rows)), layout



class StackedLora(torch.autograd.Function):
    """The cached stacks of :meth:`FusedDecoder._lora` as a differentiable function of the adapters'
    parameters: forward returns them as they are (built without gradients), backward gives each LoRA A
    its block of the A stack's gradient and each B its block of the B stack's, times the scaling (and
    summed where one adapter serves several blocks): what the stacking ops' own backward gives."""

    @staticmethod
    def forward(ctx: Any, layout: Layout, a_stack: torch.Tensor,
                b_stack: torch.Tensor, *params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctx.layout = layout
        ctx.dtypes = [p.dtype for p in params]
        return a_stack.view_as(a_stack), b_stack.view_as(b_stack)

    @staticmethod
    def backward(ctx: Any, grad_a: torch.Tensor | None, grad_b: torch.Tensor | None):
        grads: list[torch.Tensor | None] = [None] * len(ctx.dtypes)
        for block, index, r_start, rank, out_start, size, scaling in ctx.layout:
            parts = []
            if grad_a is not None:
                parts.append((index, grad_a[block, :, r_start : r_start + rank].t().to(ctx.dtypes[index])))
            if grad_b is not None:
                part = grad_b[block, r_start : r_start + rank, out_start : out_start + size].t()
                parts.append((index + 1, part.to(ctx.dtypes[index + 1]) * scaling))
            for i, grad in parts:
                grads[i] = grad if grads[i] is None else grads[i] + grad
        return None, None, None, *grads

