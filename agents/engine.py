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
- a static KV cache (one allocation per call), RoPE computed once per step for all layers,
  ``scaled_dot_product_attention`` with grouped KV heads;
- a prompt shared by several rows (the G samples of one problem, or rows repeated by the caller) is
  prefilled once and its cache copied to those rows;
- rows that have emitted an EOS id leave the LM head and the sampler: only live rows pay for the
  vocabulary-sized work.

Sampling matches ``transformers``' ``generate`` with the same processors, in the same order:
repetition penalty, temperature, top-k, top-p (ties and the always-kept most likely token as there),
then a draw; greedy decoding takes the arg-max of the processed logits. The log-prob recorded for
each sampled token is ``log_softmax`` of the *raw* logits (divided by ``logprob_temperature``; 1 by
default), the quantity :meth:`agents.policy.MultiAgentPolicy.logprobs` recomputes. Logits are over
the tokenizer's ids only (``token_count``): an LM head with more rows than the tokenizer has tokens
(Qwen2.5) never samples those ids, and the log-probs are of that masked distribution, as scoring's.

Draws use one uniform number per row and step (inverse-CDF sampling): from torch's global generator,
or, when ``seeds`` are given, from one generator per row seeded from (seed, agent, sample), so a row's
random numbers do not depend on what else is in the batch (data-parallel ranks, PPO's per-episode seeds).
Its logits may, to float32 rounding: a matmul can round a row differently in batches of different
row counts (most pairs of sizes with AVX2's kernels, few with AVX-512's; docs/agents.md). A draw over a
flat distribution (no top-k, top-p 1, an untrained model's 49k near-equal tokens) can turn such a ~1e-6
difference into another token; over truncated distributions (the learners' defaults: top-k 50, top-p
0.9) the chance is about the rounding over the drawn token's probability.

Models of other architectures (GPT-2, OPT, Phi, Qwen3, Gemma, ...), or adapters the engine does not
implement (DoRA, rank-stabilised scaling is fine), use ``transformers``' ``generate`` instead
(:func:`engine_support` says why); ``MultiAgentPolicy(backend="generate")`` selects it always.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from agents.decoder import (
    SUPPORTED_MODEL_TYPES,
    Attend,
    Block,
    FusedDecoder,
    bucket_length,
    causal_allowed,
    decoder_support,
    pad_left,
)
from agents.graph import MAX_GRAPHS, StaticDecode, StaticKey, length_bucket, row_bucket

__all__ = [
    "SUPPORTED_MODEL_TYPES", "TOP_P_CANDIDATES", "Block", "RolloutEngine", "engine_support", "row_seed",
    "sampling_distribution",
]

engine_support = decoder_support
"""``None`` when the engine can decode ``model``, else why not (:func:`agents.decoder.decoder_support`)."""


def row_seed(seed: int, agent: str, sample: int) -> int:
    """The seed of one row's generator: the prompt row's seed, the agent's name and the sample number,
    mixed (``numpy.random.SeedSequence``) so that nearby seeds give unrelated streams and two agents
    answering the same prompt draw independently (whichever policy object holds them)."""
    return int(np.random.SeedSequence([int(seed), zlib.crc32(agent.encode()), int(sample)]).generate_state(1)[0])


DECODE_MODES = ("auto", "dynamic", "static", "graph")
"""How the engine decodes (:attr:`RolloutEngine.decode`): ``"auto"`` (the default: a CUDA graph of the
static step on CUDA where it applies, the dynamic loop elsewhere), ``"dynamic"``, ``"static"`` (the static
step run eagerly, on any device: what the graph replays) or ``"graph"`` (CUDA only)."""


class RolloutEngine(FusedDecoder):
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
        layers = self.causal_lm.model.layers
        pre_caches = [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                      for _ in layers]
        # Each block's adapter, stacked per projection in float32; the same stacks serve the sample rows.
        loras = [{k: self._lora(p, pre_blocks, torch.float32) for k, p in w.items()} for w in weights]
        positions = (pre_mask.cumsum(-1) - 1).clamp(min=0)
        cos, sin = self._rope(positions, dtype)
        prefill_mask = causal_allowed(pre_mask)
        hidden = self.causal_lm.model.embed_tokens(pre_ids)
        hidden = self._layers(
            hidden, cos, sin, _cached(pre_caches, 0, prefill_mask[:, None], self.num_heads != self.num_kv_heads),
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
            k, v = pre_caches[i]
            pre_caches[i] = None
            caches.append((k, v) if identity else (k[sample_source], v[sample_source]))
            del k, v
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
                token, logprob = self._choose(
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
                    token[sel], logprob[sel] = self._choose(
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
            cos, sin = self._rope(position[:, None], dtype)
            hidden = self.causal_lm.model.embed_tokens(step_ids)
            attend = _cached(
                caches, width + t, key_mask[:, None, None, : width + t + 1], self.num_heads != self.num_kv_heads
            )
            hidden = self._layers(hidden, cos, sin, attend, weights, loras, block_rows)
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
            static.capture()
        return static

    @staticmethod
    def _choose(
        logits: torch.Tensor,
        history: torch.Tensor,
        *,
        keys: torch.Tensor,
        step: int | torch.Tensor,
        temperature: float,
        top_p: float,
        top_k: int,
        repetition_penalty: float,
        greedy: bool,
        logprob_temperature: float,
        static: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(A, V) raw logits -> chosen tokens (A,) and their log-probs under the raw policy. ``keys`` (A, 2)
        and ``step`` name each row's random numbers (:func:`uniform_noise`); ``static``: shapes that do not
        depend on the values and no host synchronisation (:func:`sampling_distribution`), for a CUDA graph."""
        scaled = logits if logprob_temperature == 1.0 else logits / logprob_temperature
        logp = torch.log_softmax(scaled, dim=-1)
        scores = logits
        if repetition_penalty != 1.0:
            seen = scores.gather(1, history)
            seen = torch.where(seen < 0, seen * repetition_penalty, seen / repetition_penalty)
            scores = scores.scatter(1, history, seen)
        if greedy:
            token = scores.argmax(-1)
            return token, logp.gather(1, token[:, None]).squeeze(1)
        probs, indices = sampling_distribution(scores, temperature=temperature, top_k=top_k, top_p=top_p,
                                               static=static)
        token = race_draw(probs, indices, keys, step)
        return token, logp.gather(1, token[:, None]).squeeze(1)


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


def _cached(
    caches: list[tuple[torch.Tensor, torch.Tensor]], start: int, mask: torch.Tensor, gqa: bool
) -> Attend:
    """Attention that writes each layer's new keys and values at cache columns ``start ..`` and attends
    over the cache up to them."""

    def attend(index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k_cache, v_cache = caches[index]
        end = start + q.shape[2]
        k_cache[:, :, start:end] = k
        v_cache[:, :, start:end] = v
        return F.scaled_dot_product_attention(
            q, k_cache[:, :, :end], v_cache[:, :, :end], attn_mask=mask, enable_gqa=gqa
        )

    return attend


TOP_P_CANDIDATES = 1024
"""Top-p without top-k looks at the 1024 most likely tokens first; rows whose top-p set is larger (a
flat distribution) are handled over the whole vocabulary, so the result is exact either way."""

TOP_K_TIES = 16
"""The static path (CUDA graphs) keeps up to this many tokens tied with the k-th most likely beyond
top-k's k (transformers keeps every tied token; bf16 logits tie often): its shapes may not depend on the
values. More ties than this in one row is the one case where it and the dynamic path differ."""


def sampling_distribution(
    scores: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, static: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What a row draws from, as transformers' temperature, top-k and top-p warpers leave it:
    unnormalised probabilities (A, K) over candidate tokens ``indices`` (A, K), most likely first, or
    over the whole vocabulary (``indices`` None) when nothing truncates it. With ``static`` the shapes
    depend on the arguments only and nothing synchronises with the host (a CUDA graph can hold it):
    top-k keeps at most :data:`TOP_K_TIES` tied tokens beyond k, and top-p alone sorts the whole
    vocabulary. Either way a token's probability is the same, and tokens outside the set get 0."""
    if temperature != 1.0:
        scores = scores / temperature
    candidates = _candidates(scores, top_k, top_p, static)
    if candidates is None:
        return scores.softmax(-1), None
    values, indices, normalizer = candidates
    probs = (values - normalizer).exp()
    if top_p < 1.0:
        # Drop a token when the tokens more likely than it already hold top_p of the mass (the most
        # likely token always stays), as TopPLogitsWarper does.
        before = probs.cumsum(-1) - probs
        probs = probs.masked_fill(before >= top_p, 0.0)
    return probs, indices


def _candidates(
    scores: torch.Tensor, top_k: int, top_p: float, static: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The tokens that can be drawn, most likely first: (values, indices) of shape (A, K) and the log
    normaliser (A, 1) of the distribution top-p reads (over the top-k tokens when top-k applies, as
    transformers masks the rest first; else over the vocabulary). ``None`` when no truncation applies
    (top_k 0, top_p 1). Sorting K candidates instead of the vocabulary is the difference between
    ~0.1 ms and ~20 ms a step on CPU."""
    vocab = scores.shape[-1]
    if top_k > 0:
        k = min(top_k, vocab)
        if static:
            values, indices = torch.topk(scores, min(k + TOP_K_TIES, vocab), dim=-1)
            values = values.masked_fill(values < values[:, k - 1 : k], float("-inf"))
            return values, indices, values.logsumexp(-1, keepdim=True)
        values, indices = torch.topk(scores, k, dim=-1)
        # transformers keeps every token tied with the k-th (common with bf16 logits): widen the window
        # to the largest count of tokens at or above the k-th score, and drop what falls below it.
        kth = values[:, -1:]
        wide = int((scores >= kth).sum(-1).max())
        if wide > k:
            values, indices = torch.topk(scores, wide, dim=-1)
            values = values.masked_fill(values < kth, float("-inf"))
        return values, indices, values.logsumexp(-1, keepdim=True)
    if top_p >= 1.0:
        return None
    normalizer = scores.logsumexp(-1, keepdim=True)
    if static:
        values, indices = torch.sort(scores, dim=-1, descending=True)
        return values, indices, normalizer
    k = min(TOP_P_CANDIDATES, vocab)
    values, indices = torch.topk(scores, k, dim=-1)
    if k < vocab and bool(((values - normalizer).exp().sum(-1) < top_p).any()):
        values, indices = torch.sort(scores, dim=-1, descending=True)
    return values, indices, normalizer


# ---------------------------------------------------------------------------------------------- random numbers
# A row's random numbers are a function of (its key, the step, the token id): counter-based, like Philox,
# written as integer tensor ops so that they are the same on every device and kernel set, need no
# generator state (a CUDA graph replays them), and do not depend on which other rows share the batch.

_MASK32 = 0xFFFFFFFF
_SALT = 0x2545F491
"""The second word of a seeded row's key (the first is its seed)."""


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit integer hash (the "lowbias32" construction: xor-shifts and odd multipliers)
    of int64 values in [0, 2**32). Multipliers below 2**31 keep every product below 2**63: int64
    arithmetic never overflows, so the result is the same on every device."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & _MASK32
    return x ^ (x >> 16)


def row_keys(seeds: Sequence[int] | None, n: int, device: torch.device | str) -> torch.Tensor:
    """(n, 2) int64 keys of ``n`` sample rows: ``(seed, salt)`` for seeded rows (each seed below 2**32, as
    :func:`row_seed` makes them); unseeded, ``(row, r)`` with ``r`` drawn once from torch's global
    generator, so ``torch.manual_seed`` still fixes a run's draws."""
    if seeds is not None:
        first = torch.tensor([int(s) & _MASK32 for s in seeds], dtype=torch.long)
        second = torch.full((n,), _SALT, dtype=torch.long)
    else:
        first = torch.arange(n, dtype=torch.long)
        second = torch.randint(0, 2**32, (1,), dtype=torch.long).expand(n)
    return torch.stack([first, second], dim=1).to(device)


def uniform_noise(keys: torch.Tensor, step: int | torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(A, K) float32 uniform numbers in (0, 1), one per row and token id: a hash of the row's key
    ``keys`` (A, 2), ``step`` (an int or a 0-dim/(1,) int64 tensor) and ``tokens`` (A, K) or (K,)."""
    step = torch.as_tensor(step, dtype=torch.long, device=keys.device).reshape(-1)[:1]
    h = _mix32(keys[:, 1:2] ^ _mix32(step & _MASK32)[None, :])  # (A, 1)
    h = _mix32(keys[:, 0:1] ^ h)
    h = _mix32(_mix32(h ^ tokens) ^ keys[:, 1:2])  # (A, K)
    return ((h >> 8).to(torch.float32) + 0.5) * (2.0**-24)  # 24 random bits, exact in float32


def race_draw(
    probs: torch.Tensor, indices: torch.Tensor | None, keys: torch.Tensor, step: int | torch.Tensor
) -> torch.Tensor:
    """One token per row from unnormalised ``probs`` (A, K) over candidate tokens ``indices`` (A, K), by an
    exponential race: the token with the largest ``p / E``, ``E = -log(u)`` exponential with ``u`` from
    :func:`uniform_noise` of the *token id*. Token i wins with probability p_i / sum(p); the draw needs no
    sort or cumulative sum, and since each token's number is keyed by its id, the same probabilities give
    the same token whichever candidates (more, fewer, in any order) are listed: the static step's full sort
    and the dynamic loop's top-1024 draw alike.

    ``indices`` None (nothing truncates: the whole vocabulary) races every token on a GPU; on the CPU, where
    hashing every token costs ~40 ms a step for 32 rows of a 49k vocabulary (2-core EPYC), it draws by
    inverse CDF with one number a row (``uniform_noise`` of token id 2**32 - 1) instead. So an untruncated
    seeded row draws differently on the CPU and on a GPU, and the inverse CDF is the draw that rounding can
    move (a cumulative sum over the vocabulary: docs/agents.md); truncated sampling (top-k or top-p, the
    learners' defaults) races on every device."""
    if indices is None and probs.device.type == "cpu":
        u = uniform_noise(keys, step, torch.full((1,), _MASK32, dtype=torch.long, device=probs.device))  # (A, 1)
        cdf = probs.cumsum(-1)
        index = torch.searchsorted(cdf, u * cdf[:, -1:]).squeeze(1)
        return index.clamp(max=probs.shape[-1] - 1)
    tokens = torch.arange(probs.shape[-1], device=probs.device) if indices is None else indices
    race = probs / -torch.log(uniform_noise(keys, step, tokens))
    index = race.argmax(-1, keepdim=True)
    return index.squeeze(1) if indices is None else indices.gather(1, index).squeeze(1)
