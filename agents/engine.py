"""The rollout engine: every agent's rows in one decode loop, each row with its own LoRA adapter.

At RL batch sizes a decode step costs what reading the weights and launching its ops cost, not what
its rows cost (docs/agents.md has the measurements): 8 rows cost what 4 cost. So the engine decodes
the rows of *all* agents together, through one forward per step of the hand-written decoder for the
Llama family (Llama 2/3, SmolLM2, TinyLlama, Mistral, Qwen2) in :mod:`agents.decoder`, which needs
few, large ops (the policy's scoring and training passes use the same decoder over whole rows):

- the frozen base's q/k/v and gate/up projections run as one matmul each (their weights are laid
  out contiguously once, with no copy kept: the model's own weights become views of the fused ones);
- each agent's LoRA is applied to its block of rows with two batched float32 matmuls per fused
  projection (``(blocks, rows, in) @ (blocks, in, r)`` then ``@ (blocks, r, out)``, scale folded in;
  float32 as PEFT computes adapters, and on CPU a bf16 ``bmm`` of these shapes is ~20x slower); rows are
  grouped by agent, so a batch of two agents costs two extra small matmuls per projection, not a
  Python loop over adapters per layer as PEFT's mixed batches do;
- a decode step's layers are :mod:`agents.decode_step`'s: RoPE's tables and the attention mask (an
  additive bias) built once a step for every layer, a layer's keys and values one tensor, each block's
  LoRA added onto the base's output by its second product;
- a static KV cache (one allocation per call), ``scaled_dot_product_attention`` with grouped KV heads
  read in place (:mod:`agents.attention`: on the CPU ``enable_gqa`` copies the whole cache every step);
- a prompt shared by several rows (the G samples of one problem, or rows repeated by the caller) is
  prefilled once and its cache copied to those rows;
- rows that have emitted an EOS id leave the LM head and the sampler: only live rows pay for the
  vocabulary-sized work.

Sampling (transformers' processors, then a counter-based draw) is :mod:`agents.sampling`'s.

Models of other architectures (GPT-2, OPT, Phi, Qwen3, Gemma, ...), or adapters the engine does not
implement (DoRA, rank-stabilised scaling is fine), use ``transformers``' ``generate`` instead
(:func:`engine_support` says why); ``MultiAgentPolicy(backend="generate")`` selects it always.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from agents.attention import grouped_attention, span_attention, transposed_key_attention
from agents.decode_step import DecodeAttend, DecodeLayers, additive_mask
from agents.decoder import (
    SUPPORTED_MODEL_TYPES,
    Block,
    FusedDecoder,
    bucket_length,
    causal_allowed,
    decoder_support,
    pad_left,
)
from agents.graph import MAX_GRAPHS, StaticDecode, StaticKey, length_bucket, row_bucket
from agents.models import cpu_has_native_bf16
from agents.sampling import choose, row_keys

__all__ = ["DECODE_MODES", "SUPPORTED_MODEL_TYPES", "Block", "RolloutEngine", "engine_support"]

engine_support = decoder_support
"""``None`` when the engine can decode ``model``, else why not (:func:`agents.decoder.decoder_support`)."""


DECODE_MODES = ("auto", "dynamic", "static", "graph")
"""How the engine decodes (:attr:`RolloutEngine.decode`): ``"auto"`` (the default: a CUDA graph of the
static step on CUDA where it applies, the dynamic loop elsewhere), ``"dynamic"``, ``"static"`` (the static
step run eagerly, on any device: what the graph replays) or ``"graph"`` (CUDA only)."""


class RolloutEngine(DecodeLayers, FusedDecoder):
    """Batched multi-adapter decoding for one Llama-family causal LM (possibly wrapped by PEFT).

    Built once per policy; :meth:`generate` is called with rows grouped by agent. The forward itself
    (fused weights, stacked LoRA, layers) is :class:`agents.decoder.FusedDecoder`'s. ``decode`` picks
    the decode loop (:data:`DECODE_MODES`; the ``LLM_ENVS_DECODE`` environment variable sets the default).
    Per-agent sampling settings and repetition penalties decode in the dynamic loop.
    """

    decode: str = os.environ.get("LLM_ENVS_DECODE", "auto")
    compile_step: bool = os.environ.get("LLM_ENVS_COMPILE_DECODE", "") == "1"
    """Compile the static step with ``torch.compile`` (inductor) before capturing it: fewer, fused kernels
    a step, for a compile of tens of seconds at a shape's first call (``LLM_ENVS_COMPILE_DECODE=1``)."""
    transposed_keys: bool = True
    """The dynamic loop on the CPU keeps its key cache transposed and writes a decode step's attention out
    (:func:`agents.attention.transposed_key_attention`) in float32, and in bfloat16 where the CPU has bf16
    instructions; False: the folded SDPA over SDPA's layout."""
    last_fallback: str | None = None
    """Why the last call with ``decode`` other than ``"dynamic"`` decoded in the dynamic loop, or ``None``."""

    # ------------------------------------------------------------------ generation
    @torch.no_grad()
    def generate(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        blocks: Sequence[Block],
        *,
        num_samples: int,
        max_new_tokens: int,
        eos_token_ids: Sequence[int],
        pad_token_id: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        repetition_penalty: float = 1.0,
        greedy: bool = False,
        logprob_temperature: float = 1.0,
        seeds: Sequence[int] | None = None,
        block_settings: Sequence[Mapping[str, Any]] | None = None,
        token_count: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample ``num_samples`` responses for each prompt row.

        Args:
            ids, mask: (B, P) left-padded prompts, grouped by agent as ``blocks`` says (each block's
                ``rows`` counts prompts, before ``num_samples``).
            seeds: one per *sample row* (B * num_samples, prompt-major), or ``None`` for torch's global
                generator.
            block_settings: per block, its own sampling settings (the keywords above from
                ``max_new_tokens`` to ``logprob_temperature``), overriding them: the agents of a team
                sample differently in one decode loop (a greedy agent beside a sampling one); a block's
                rows stop at its own ``max_new_tokens``. Blocks with equal settings sample together.
            token_count: the tokenizer's size when the LM head has more rows than it has tokens: only ids
                below it are sampled, and log-probs are of the distribution over them (what scoring
                recomputes); ``None``: every row of the head.

        Returns (B*G, T) response ids (pad after the first EOS), masks (1 up to and including the
        EOS) and raw log-probs (0 on pads), rows prompt-major within each block as the blocks go.
        """
        device = ids.device
        dtype = self.causal_lm.get_input_embeddings().weight.dtype
        defaults = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
                        repetition_penalty=repetition_penalty, greedy=greedy, logprob_temperature=logprob_temperature)
        kinds: list[dict[str, Any]] | None = None
        if block_settings is not None:
            if len(block_settings) != len(blocks):
                raise ValueError(f"got {len(block_settings)} block settings for {len(blocks)} blocks")
            per_block = [{**defaults, **dict(b)} for b in block_settings]
            distinct = {tuple(sorted(b.items())): b for b in per_block}
            if len(distinct) == 1:  # one team-wide setting: the plain path
                defaults = per_block[0]
            else:
                kinds = list(distinct.values())
                key_of = [list(distinct).index(tuple(sorted(b.items()))) for b in per_block]
        max_new_tokens = defaults["max_new_tokens"] if kinds is None else max(k["max_new_tokens"] for k in kinds)
        repetition_penalty = defaults["repetition_penalty"]
        penalised = repetition_penalty != 1.0 if kinds is None else any(k["repetition_penalty"] != 1.0 for k in kinds)
        weights = self._weights()
        history = ids  # for the repetition penalty, as generate's input_ids (before the bucket's pads)
        ids, mask = pad_left(ids, mask, bucket_length(ids.shape[1]), pad_token_id)
        g = num_samples
        n = len(ids) * g
        eos = torch.tensor(sorted(set(int(t) for t in eos_token_ids)), device=device)
        row_kind = limits = None
        if kinds is not None:
            sizes = torch.tensor([b.rows * g for b in blocks], device=device)
            row_kind = torch.repeat_interleave(torch.tensor(key_of, device=device), sizes)  # (N,)
            limits = torch.tensor([kinds[k]["max_new_tokens"] for k in key_of], device=device).repeat_interleave(sizes)

        # Prefill each distinct prompt row once; rows repeated by the caller share it too.
        row_blocks = [blk.rows * g for blk in blocks]
        key = torch.cat([ids * mask, mask], dim=1)
        block_of_row = torch.repeat_interleave(
            torch.arange(len(blocks), device=device), torch.tensor([b.rows for b in blocks], device=device)
        )
        key = torch.cat([block_of_row[:, None], key], dim=1)
        unique, inverse = torch.unique(key, dim=0, return_inverse=True)
        # torch.unique sorts: keep first-occurrence order so prefill blocks stay grouped by agent.
        first = torch.full((len(unique),), len(ids), device=device, dtype=torch.long)
        first.scatter_reduce_(0, inverse, torch.arange(len(ids), device=device), reduce="amin")
        order = torch.argsort(first)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(len(order), device=device)
        source = first[order]  # prompt row of each prefill row, in order
        prefill_of_row = rank[inverse]  # (B,) which prefill row serves each prompt row
        pre_ids, pre_mask = ids[source], mask[source]
        pre_counts = torch.bincount(block_of_row[source], minlength=len(blocks)).tolist()
        pre_blocks = [Block(b.adapter, c) for b, c in zip(blocks, pre_counts) if c > 0]

        width = ids.shape[1]
        mode = self._decode_mode(device, static_ok=kinds is None and not penalised)
        # The dynamic loop decodes into the prefill's caches; the static step copies their prompt columns
        # into its own buffers, so for it they need no room for new tokens.
        total = width + max_new_tokens if mode == "dynamic" else width
        shape = (len(pre_ids), self.num_kv_heads, total, self.head_dim)
        # The dynamic loop on the CPU keeps keys transposed (transposed_key_attention: 1.35-1.87x faster
        # decode attention in bfloat16, 1.1-1.3x in float32); not for bfloat16 without bf16 instructions,
        # where its products are emulated (3-4.3x slower on AVX2 kernels), nor in the static step's buffers
        # or on other devices (SDPA's layout).
        keys_transposed = (self.transposed_keys and mode == "dynamic" and device.type == "cpu"
                           and (dtype == torch.float32 or (dtype == torch.bfloat16 and cpu_has_native_bf16())))
        key_shape = (*shape[:2], shape[3], shape[2]) if keys_transposed else shape
        layers = self.causal_lm.model.layers
        # Keys and values in one tensor a layer (one write a step), unless the keys are transposed.
        pre_caches: list[Any] = [
            (torch.zeros(key_shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            if keys_transposed else torch.zeros((2, *shape), dtype=dtype, device=device) for _ in layers]
        # Each block's adapter, stacked per projection in float32; the same stacks serve the sample rows.
        loras = [{k: self._lora(p, pre_blocks, torch.float32) for k, p in w.items()} for w in weights]
        positions = (pre_mask.cumsum(-1) - 1).clamp(min=0)
        spans = self._spans(pre_mask)
        prefill_mask = None if spans is not None else additive_mask(causal_allowed(pre_mask)[:, None], dtype)
        hidden = self.causal_lm.model.embed_tokens(pre_ids)
        hidden = self.decode_layers(
            hidden, self.rotary(positions, dtype), _cached(pre_caches, 0, prefill_mask, spans, keys_transposed),
            weights, loras, [b.rows for b in pre_blocks],
        )
        last = self.causal_lm.model.norm(hidden[:, -1:])  # (Bu, 1, H)

        # Every sample row gets its prompt's cache.
        sample_source = prefill_of_row.repeat_interleave(g)  # (N,)
        if seeds is not None and len(seeds) != n:
            raise ValueError(f"got {len(seeds)} seeds for {n} sample rows")
        keys = row_keys(seeds, n, device)  # (N, 2): each row's random numbers are a function of (key, step, token)
        if mode != "dynamic":
            static = self._static_decoder(
                mode, n, width + max_new_tokens, [r for r, c in zip(row_blocks, pre_counts) if c > 0], loras,
                weights, defaults, eos, pad_token_id, token_count, dtype, device,
            )
            static.load(pre_caches, sample_source, width, last[:, -1], mask.repeat_interleave(g, 0).bool(),
                        positions[:, -1][sample_source], keys, loras)
            del pre_caches
            response, logprobs, steps = static.run(n, max_new_tokens)
            return _finished(response, logprobs, eos, pad_token_id)
        # One layer at a time, each prefill cache freed once copied: the two sets of caches never coexist
        # (an evaluation's prefill rows are its sample rows, and their caches were its largest tensors).
        # Where every row is its own prefill row (one sample per distinct prompt), nothing is copied.
        identity = torch.equal(sample_source, torch.arange(len(pre_ids), device=device))  # False if sizes differ
        caches = []
        for i in range(len(pre_caches)):
            cache = pre_caches[i]
            pre_caches[i] = None
            if not identity:
                cache = ((cache[0][sample_source], cache[1][sample_source]) if keys_transposed
                         else cache[:, sample_source])
            caches.append(cache)
            del cache
        del pre_caches
        block_rows = [r for r, c in zip(row_blocks, pre_counts) if c > 0]
        last = last[sample_source]
        history = history.repeat_interleave(g, 0)
        key_mask = torch.zeros(n, total, dtype=torch.bool, device=device)
        key_mask[:, :width] = mask.repeat_interleave(g, 0).bool()
        position = positions[:, -1][sample_source]  # (N,) position of each row's last token

        out_ids = torch.full((n, max_new_tokens), pad_token_id, dtype=torch.long, device=device)
        out_logprobs = torch.zeros(n, max_new_tokens, dtype=torch.float32, device=device)
        live = torch.ones(n, dtype=torch.bool, device=device)
        lm_head = self.causal_lm.lm_head
        head_weight, head_bias = lm_head.weight, lm_head.bias
        if token_count is not None and token_count < head_weight.shape[0]:
            # Rows beyond the tokenizer are ids the envs refuse: leave them out of the head, which is
            # masking their logits to -inf in every processor and log-softmax below.
            head_weight = head_weight[:token_count]
            head_bias = None if head_bias is None else head_bias[:token_count]
        steps = 0
        for t in range(max_new_tokens):
            active = live.nonzero().squeeze(1)
            logits = F.linear(last[active, -1], head_weight, head_bias).float()  # (A, V)
            if kinds is None:
                settings = {k: v for k, v in defaults.items() if k != "max_new_tokens"}
                token, logprob = choose(
                    logits,
                    history[active] if penalised else history[:0],
                    keys=keys[active],
                    step=t,
                    **settings,
                )
            else:  # each kind of row with its own settings
                assert row_kind is not None
                token = torch.empty(len(active), dtype=torch.long, device=device)
                logprob = torch.empty(len(active), dtype=torch.float32, device=device)
                kind_now = row_kind[active]
                for k, kind in enumerate(kinds):
                    sel = (kind_now == k).nonzero().squeeze(1)
                    if not len(sel):
                        continue
                    rows = active[sel]
                    settings = {key: v for key, v in kind.items() if key != "max_new_tokens"}
                    token[sel], logprob[sel] = choose(
                        logits[sel],
                        history[rows] if kind["repetition_penalty"] != 1.0 else history[:0],
                        keys=keys[rows],
                        step=t,
                        **settings,
                    )
            out_ids[active, t] = token
            out_logprobs[active, t] = logprob
            live[active] = ~torch.isin(token, eos)
            if limits is not None:
                live &= limits > t + 1  # a block's rows stop at its own max_new_tokens
            steps = t + 1
            if t + 1 == max_new_tokens or not bool(live.any()):
                break
            # Finished rows keep stepping (the row blocks stay whole) on the pad id; their output is unused.
            step_ids = out_ids[:, t : t + 1]
            if penalised:
                history = torch.cat([history, step_ids], dim=1)
            position = position + 1
            key_mask[:, width + t] = True
            hidden = self.causal_lm.model.embed_tokens(step_ids)
            bias = additive_mask(key_mask[:, None, None, : width + t + 1], dtype)  # once a step, read by every layer
            attend = _cached(caches, width + t, bias, None, keys_transposed)
            hidden = self.decode_layers(hidden, self.rotary(position[:, None], dtype), attend, weights, loras,
                                        block_rows)
            last = self.causal_lm.model.norm(hidden)
        return _finished(out_ids[:, :steps], out_logprobs[:, :steps], eos, pad_token_id, limits)

    # ------------------------------------------------------------------ the static step (CUDA graphs)
    def _decode_mode(self, device: torch.device, *, static_ok: bool) -> str:
        """How this call decodes: ``"dynamic"`` (the loop above), ``"static"`` (agents.graph's step,
        eagerly) or ``"graph"`` (that step replayed as a CUDA graph). ``self.decode`` picks; ``"auto"``
        is the graph on CUDA where the static step applies, else the dynamic loop."""
        wanted = self.decode
        if wanted not in DECODE_MODES:
            raise ValueError(f"decode must be one of {DECODE_MODES}, got {wanted!r}")
        reason = None
        if not static_ok:
            reason = "per-agent sampling settings or a repetition penalty"
        elif self.trainable_base:
            reason = "full fine-tuning (the fused weights are copies made per call)"
        elif any(t in str(getattr(self.causal_lm.model.rotary_emb, "rope_type", "")) for t in ("dynamic", "longrope")):
            reason = "a RoPE whose frequencies depend on the length"
        self.last_fallback = reason if wanted != "dynamic" else None
        if wanted == "auto":
            return "graph" if device.type == "cuda" and reason is None else "dynamic"
        if wanted in ("static", "graph") and reason is not None:
            return "dynamic"  # the static step does not cover this call (``last_fallback`` says why)
        if wanted == "graph" and device.type != "cuda":
            raise ValueError(f"decode='graph' needs a CUDA device, the model is on {device}")
        return wanted

    def _static_decoder(
        self, mode: str, n: int, columns: int, block_rows: list[int], loras: list[dict[str, Any]],
        weights: list[dict[str, Any]], settings: Mapping[str, Any], eos: torch.Tensor, pad_token_id: int,
        token_count: int | None, dtype: torch.dtype, device: torch.device,
    ) -> StaticDecode:
        """The static decoder (buffers, and its CUDA graph in ``"graph"`` mode) for this call's shapes,
        built on first use and kept (:data:`agents.graph.MAX_GRAPHS` of them, least recently used out)."""
        rows = row_bucket(n)
        block_rows = [*block_rows[:-1], block_rows[-1] + rows - n]  # pad rows join the last block, never live
        head = self.causal_lm.lm_head
        head_weight, head_bias = head.weight, head.bias
        if token_count is not None and token_count < head_weight.shape[0]:
            head_weight = head_weight[:token_count]
            head_bias = None if head_bias is None else head_bias[:token_count]
        chosen = {k: v for k, v in settings.items() if k != "max_new_tokens"}
        key = StaticKey(
            rows=rows, length=length_bucket(columns), block_rows=tuple(block_rows),
            lora_shapes=tuple(tuple(None if v is None else (*v[0].shape, *v[1].shape) for v in layer.values())
                              for layer in loras),
            settings=tuple(sorted(chosen.items())), eos=tuple(eos.tolist()), pad_token_id=int(pad_token_id),
            token_count=int(head_weight.shape[0]), dtype=dtype, device=str(device),
            weights=id(weights) ^ head_weight.data_ptr(), compiled=bool(self.compile_step),
        )
        cache = self.__dict__.setdefault("_static", {})
        static = cache.pop(key, None)
        if static is None:
            while len(cache) >= MAX_GRAPHS:
                cache.pop(next(iter(cache)))
            static = StaticDecode(self, key, weights, loras, (head_weight, head_bias), chosen)
        cache[key] = static  # most recently used last
        if mode == "graph" and static.graph is None:
            static.capture(*self._graph_memory(device))
        return static

    def _graph_memory(self, device: torch.device) -> tuple[Any, torch.cuda.Stream]:
        """The memory pool and the capture stream that every static decoder of this engine on ``device``
        captures into (made at the first capture): one pool an engine, so the kept graphs share one
        workspace (why that is safe: :mod:`agents.graph`). The pool's memory goes when its last graph goes."""
        pools = self.__dict__.setdefault("_graph_pools", {})
        if str(device) not in pools:
            with torch.cuda.device(device):
                pools[str(device)] = (torch.cuda.graph_pool_handle(), torch.cuda.Stream(device=device))
        return pools[str(device)]


def _finished(
    response: torch.Tensor, logprobs: torch.Tensor, eos: torch.Tensor, pad_token_id: int,
    limits: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(N, T) sampled ids and log-probs -> ids with pads after each row's first EOS (and past its
    ``limits``), the response mask (1 up to and including the EOS), log-probs 0 on pads."""
    is_eos = torch.isin(response, eos)
    after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
    if limits is not None:
        after_eos |= torch.arange(response.shape[1], device=response.device)[None, :] >= limits[:, None]
    response = response.masked_fill(after_eos, pad_token_id)
    return response, (~after_eos).long(), logprobs.masked_fill(after_eos, 0.0)


def _cached(caches: list[Any], start: int, mask: torch.Tensor | None,
            spans: list[tuple[int, int]] | None = None, keys_transposed: bool = False) -> DecodeAttend:
    """Attention that writes each layer's new keys and values at cache columns ``start ..`` and attends
    over the cache up to them (``mask``: the additive bias of :func:`agents.decode_step.additive_mask`).
    A prefill (``start`` 0) attends over its own new keys and values, with ``spans``
    (:meth:`FusedDecoder._spans` of its rows) span by span, without the mask (the pad queries' results,
    never read, are zeros). A layer's cache is one (2, N, KV, L, D) tensor, keys then values, written at
    once; with ``keys_transposed`` a pair of key cache (N, KV, D, L) and value cache (N, KV, L, D), and a
    decode step attends through :func:`agents.attention.transposed_key_attention` (the dynamic loop on the
    CPU)."""

    def attend(index: int, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        cache = caches[index]
        end = start + q.shape[2]
        if keys_transposed:
            k_cache, v_cache = cache
            k_cache[:, :, :, start:end] = kv[0].transpose(-1, -2)
            v_cache[:, :, start:end] = kv[1]
        else:
            cache[:, :, :, start:end] = kv
            k_cache, v_cache = cache[0], cache[1]
        if start == 0:
            k, v = kv[0], kv[1]
            return span_attention(q, k, v, spans) if spans is not None else grouped_attention(q, k, v, mask)
        if keys_transposed:
            return transposed_key_attention(q, k_cache[:, :, :, :end], v_cache[:, :, :end], mask)
        return grouped_attention(q, k_cache[:, :, :end], v_cache[:, :, :end], mask)

    return attend
