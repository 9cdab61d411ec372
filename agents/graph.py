"""The rollout engine's decode step over static shapes, replayed as a CUDA graph.

On a GPU a decode step of a small model costs what launching its ops from Python costs (~25-30 ms for
SmolLM2's 30 layers, whatever the model's size: docs/agents.md), not what its arithmetic costs (~0.1 ms
of weight reads for 135M). A CUDA graph records the step's kernels once and replays them with one
launch. That needs a step whose shapes never change and which never waits for the GPU; this module's
step is :meth:`agents.engine.RolloutEngine`'s decode step rewritten that way:

- **static buffers**: the KV cache (rows x ``length`` columns), the last hidden state, the sampled
  token, positions, the key mask, each row's random key, the outputs, the step counter ``t`` and the
  prompt width are tensors allocated once per :class:`StaticKey`; a call copies its prompt's caches
  and values in, the step reads and writes them in place (the column it writes is ``width + t``, a
  tensor: one graph serves every prompt width that fits);
- **buckets**: rows are rounded up to a power of two (pad rows sit in the last agent's block, never
  live) and cache columns to a multiple of :data:`LENGTH_STEP`, so one graph serves a run's iterations;
- **each agent's LoRA over a fixed block layout**: the stacked factors are static buffers, refreshed
  from the adapters at every call (training changes them between calls);
- **no host synchronisation inside a step**: every row steps (a finished one on the pad id, as in the
  dynamic loop), EOS is checked on the device, sampling is :func:`agents.sampling.sampling_distribution`
  with ``static=True`` and the counter-based :func:`agents.sampling.race_draw` (random numbers from
  (key, step, token), no generator state); the host looks at ``live`` every :data:`CHECK_EVERY` steps.

**One memory pool an engine.** Every decoder of one engine captures into the engine's pool, on its capture
stream (:meth:`agents.engine.RolloutEngine._graph_memory`): a step's temporaries live in the pool, and a
later capture reuses the blocks an earlier one freed, so the pool holds the largest step's workspace,
not the sum of every kept graph's. Graphs that share a pool may not run concurrently, and a tensor one
leaves in the pool may be overwritten by another's replay; neither happens here. Nothing a step keeps is
allocated during capture: the KV cache, ``last``, the outputs and every other buffer a step reads or
writes are allocated in ``__init__``, outside the graph, and a replay's temporaries are written before
they are read within that replay, so no replay reads what another left behind. Replays are not
concurrent: the engine decodes one call at a time, and :meth:`run` replays one decoder on the current
stream and waits for it (``live``, the lengths) before it returns clones of the outputs, copies outside
the pool; the next call's replays, of the same decoder or another, start after that. The pool's memory
goes back to the allocator when the last graph captured into it goes: with the engine, or as its
decoders are dropped (the handle itself holds nothing).

The same step runs eagerly on any device (``decode="static"``): the tests check it equals the dynamic
loop on the CPU and that it compiles with ``torch.compile(fullgraph=True)`` (no graph break: nothing
that needs the host), before a GPU ever captures it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from agents.attention import grouped_attention
from agents.decode_step import additive_mask
from agents.sampling import choose

if TYPE_CHECKING:
    from agents.engine import RolloutEngine

LENGTH_STEP = 128
"""Cache columns (prompt width + new tokens) are rounded up to a multiple of this: attention over masked
columns costs little on a GPU, and prompts of a run's iterations then share one graph."""

CHECK_EVERY = 8
"""The graph path asks whether any row is still live every this many steps (a host synchronisation):
at most ``CHECK_EVERY - 1`` steps run after the last row finished."""

MAX_GRAPHS = 4
"""Static decoders kept per engine (least recently used dropped first): a run alternates between a few
shapes at most (training rollouts, evaluation)."""

MIN_ROWS = 8
"""The smallest row bucket."""


def row_bucket(n: int) -> int:
    """``n`` rows rounded up to a power of two, at least :data:`MIN_ROWS`."""
    return max(MIN_ROWS, 1 << max(0, n - 1).bit_length())


def length_bucket(n: int) -> int:
    """``n`` cache columns rounded up to a multiple of :data:`LENGTH_STEP`."""
    return -(-n // LENGTH_STEP) * LENGTH_STEP


@dataclass(frozen=True)
class StaticKey:
    """What a static decoder's buffers and graph depend on: two calls with equal keys share them."""

    rows: int
    length: int
    block_rows: tuple[int, ...]
    lora_shapes: tuple[Any, ...]
    settings: tuple[tuple[str, Any], ...]
    eos: tuple[int, ...]
    pad_token_id: int
    token_count: int
    dtype: torch.dtype
    device: str
    weights: int
    compiled: bool = False


class StaticDecode:
    """Static buffers and the step of one :class:`StaticKey`; :meth:`capture` records the step as a CUDA
    graph, :meth:`run` steps (replaying the graph, or eagerly) and returns the outputs."""

    def __init__(
        self,
        engine: RolloutEngine,
        key: StaticKey,
        weights: list[dict[str, Any]],
        loras: list[dict[str, tuple[torch.Tensor, torch.Tensor] | None]],
        head: tuple[torch.Tensor, torch.Tensor | None],
        settings: dict[str, Any],
    ) -> None:
        self.engine, self.key, self.weights, self.settings = engine, key, weights, settings
        self.head_weight, self.head_bias = head
        n, length, device, dtype = key.rows, key.length, torch.device(key.device), key.dtype
        # One tensor a layer, keys then values: a step writes both with one index_copy_.
        shape = (2, n, engine.num_kv_heads, length, engine.head_dim)
        self.caches = [torch.zeros(shape, dtype=dtype, device=device) for _ in engine.causal_lm.model.layers]
        # The adapters' factors in the base's precision on a GPU (bf16 matmuls; float32 ones without TF32
        # took 60-75% of an H100's step), in float32 on the CPU as the dynamic loop (bf16 bmm is slow there).
        lora_dtype = dtype if device.type == "cuda" else torch.float32
        # Buffers of their own (copies): the engine's stacks are kept between calls and must not change here.
        self.loras = [{k: None if v is None else (v[0].to(lora_dtype, copy=True), v[1].to(lora_dtype, copy=True))
                       for k, v in layer.items()} for layer in loras]
        hidden = int(engine.causal_lm.config.hidden_size)
        self.last = torch.zeros(n, hidden, dtype=dtype, device=device)
        self.position = torch.zeros(n, dtype=torch.long, device=device)
        self.key_mask = torch.zeros(n, length, dtype=torch.bool, device=device)
        self.keys = torch.zeros(n, 2, dtype=torch.long, device=device)
        self.live = torch.zeros(n, dtype=torch.bool, device=device)
        self.lengths = torch.zeros(n, dtype=torch.long, device=device)
        self.out_ids = torch.full((n, length), key.pad_token_id, dtype=torch.long, device=device)
        self.out_logprobs = torch.zeros(n, length, dtype=torch.float32, device=device)
        self.t = torch.zeros(1, dtype=torch.long, device=device)
        self.width = torch.zeros(1, dtype=torch.long, device=device)
        self.eos = torch.tensor(key.eos, dtype=torch.long, device=device)
        self.no_history = torch.zeros(n, 0, dtype=torch.long, device=device)
        self.graph: torch.cuda.CUDAGraph | None = None
        # Compiled (inductor: the element-wise ops of norms, RoPE, casts, SiLU and sampling fused into few
        # kernels), the step launches fewer kernels; a graph then replays those. The compile happens at the
        # first call (tens of seconds for a 30-layer model). The unbound function, called with the decoder:
        # a bound method kept here (``self.step``) would make a reference cycle, and a decoder dropped from
        # the engine's cache would keep its KV cache and its graph's memory pool until a full collection.
        self._compiled_step = torch.compile(StaticDecode.step, fullgraph=True, dynamic=False) if key.compiled else None

    @property
    def device(self) -> torch.device:
        return self.last.device

    def run_step(self) -> None:
        """One :meth:`step`, compiled when the key says so."""
        if self._compiled_step is not None:
            self._compiled_step(self)
        else:
            self.step()

    # ------------------------------------------------------------------ the step
    def step(self) -> None:
        """Sample token ``t`` of every row from ``last``, record it, and run it through the layers into
        ``last``; advance ``t``. Tensor ops only, in place on the buffers: no host synchronisation."""
        engine, key = self.engine, self.key
        logits = F.linear(self.last, self.head_weight, self.head_bias).float()  # (N, V)
        token, logprob = choose(logits, self.no_history, keys=self.keys, step=self.t, static=True, **self.settings)
        live = self.live
        token = torch.where(live, token, key.pad_token_id)
        logprob = logprob.masked_fill(~live, 0.0)
        self.out_ids.index_copy_(1, self.t, token[:, None])
        self.out_logprobs.index_copy_(1, self.t, logprob[:, None])
        self.lengths.add_(live.long())
        self.live.copy_(live & ~(token[:, None] == self.eos[None, :]).any(-1))
        column = self.width + self.t  # (1,): where this token's keys and values go
        self.key_mask.index_fill_(1, column, True)
        self.position.add_(1)
        # RoPE's tables and the mask's bias once a step, read by every layer.
        rotary = engine.rotary(self.position[:, None], key.dtype)
        caches, bias = self.caches, additive_mask(self.key_mask[:, None, None, :], key.dtype)

        def attend(index: int, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            cache = caches[index]
            cache.index_copy_(3, column, kv)  # this step's keys and values, one write
            return grouped_attention(q, cache[0], cache[1], bias)

        hidden = engine.causal_lm.model.embed_tokens(token[:, None])
        hidden = engine.decode_layers(hidden, rotary, attend, self.weights, self.loras, list(key.block_rows))
        self.last.copy_(engine.causal_lm.model.norm(hidden)[:, 0])
        self.t.add_(1)

    # ------------------------------------------------------------------ filling, capturing, running
    def load(
        self,
        caches: list[torch.Tensor | None],
        source: torch.Tensor,
        width: int,
        last: torch.Tensor,
        key_mask: torch.Tensor,
        position: torch.Tensor,
        keys: torch.Tensor,
        loras: list[dict[str, tuple[torch.Tensor, torch.Tensor] | None]],
    ) -> None:
        """Copy one call's state in: the prefill ``caches`` (2, Bu, KV, >= width, D) a layer, keys then
        values (freed layer by layer as copied) of the prompt
        rows ``source`` (N,) of each sample row, its ``width`` prompt columns, the prefill's ``last``
        hidden states (Bu, H), the key mask (N, >= width), positions (N,), keys (N, 2), the adapters."""
        n = len(source)
        with torch.no_grad():
            for i, static in enumerate(self.caches):
                cache = caches[i]
                caches[i] = None
                static[:, :n, :, :width] = cache[:, source, :, :width]
                del cache
            self.last.zero_()
            self.last[:n] = last[source]
            self.key_mask.zero_()
            self.key_mask[:n, :width] = key_mask[:, :width]
            self.key_mask[n:, 0] = True  # pad rows see one key: no empty softmax
            self.position.zero_()
            self.position[:n] = position
            self.keys.zero_()
            self.keys[:n] = keys
            self.live.zero_()
            self.live[:n] = True
            self.lengths.zero_()
            self.out_ids.fill_(self.key.pad_token_id)
            self.out_logprobs.zero_()
            self.t.zero_()
            self.width.fill_(width)
            for static, fresh in zip(self.loras, loras):
                for name, pair in static.items():
                    if pair is not None:
                        pair[0].copy_(fresh[name][0])
                        pair[1].copy_(fresh[name][1])

    def _blank(self) -> None:
        """A state the step can run on harmlessly (warm-up and capture): step 0 of zero-width prompts."""
        self.t.zero_()
        self.width.zero_()
        self.key_mask.zero_()
        self.key_mask[:, 0] = True

    def capture(self, pool: Any = None, stream: torch.cuda.Stream | None = None) -> None:
        """Record :meth:`step` as a CUDA graph into the memory pool ``pool`` on ``stream`` (the engine's, shared
        by its decoders: :meth:`agents.engine.RolloutEngine._graph_memory`; a pool's free blocks serve the
        captures made on the stream they were captured on), after warm-up steps on that side stream, as
        capture needs. With the decoder's device current: capture records on the current device's streams,
        so a decoder on ``cuda:1`` captured while ``cuda:0`` is current would record an empty graph."""
        with torch.cuda.device(self.device):
            stream = stream if stream is not None else torch.cuda.Stream(device=self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream), torch.no_grad():
                for _ in range(2):
                    self._blank()
                    self.run_step()
            torch.cuda.current_stream(self.device).wait_stream(stream)
            self._blank()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream), torch.no_grad():
                self.run_step()
        self.graph = graph

    def run(self, n: int, max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Step until every row finished or ``max_new_tokens`` steps; the first ``n`` rows' ids (N, T)
        and log-probs (N, T) (pad / 0 after each row's end) and T, the longest row's length."""
        check = CHECK_EVERY if self.graph is not None else 1
        # A graph replays on the current device's stream: the decoder's own device made current.
        guard = torch.cuda.device(self.device) if self.graph is not None else contextlib.nullcontext()
        with torch.no_grad(), guard:
            for t in range(max_new_tokens):
                if self.graph is not None:
                    self.graph.replay()
                else:
                    self.run_step()
                if t + 1 < max_new_tokens and (t + 1) % check == 0 and not bool(self.live.any()):
                    break
            steps = int(self.lengths.max())
            return self.out_ids[:n, :steps].clone(), self.out_logprobs[:n, :steps].clone(), steps
