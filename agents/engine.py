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


class RolloutEngine(FusedDecoder):
    """Batched multi-adapter decoding for one Llama-family causal LM (possibly wrapped by PEFT).

    Built once per policy; :meth:`generate` is called with rows grouped by agent. The forward itself
    (fused weights, stacked LoRA, layers) is :class:`agents.decoder.FusedDecoder`'s.
    """

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
        total = width + max_new_tokens
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

        generators = None
        if seeds is not None:
            if len(seeds) != n:
                raise ValueError(f"got {len(seeds)} seeds for {n} sample rows")
            generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]

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
                    generators=None if generators is None else [generators[i] for i in active.tolist()],
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
                        generators=None if generators is None else [generators[i] for i in rows.tolist()],
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
        response = out_ids[:, :steps]
        logprobs = out_logprobs[:, :steps]
        is_eos = torch.isin(response, eos)
        after_eos = (is_eos.long().cumsum(-1) - is_eos.long()) > 0
        if limits is not None:
            after_eos |= torch.arange(steps, device=device)[None, :] >= limits[:, None]
        response = response.masked_fill(after_eos, pad_token_id)
        return response, (~after_eos).long(), logprobs.masked_fill(after_eos, 0.0)

    @staticmethod
    def _choose(
        logits: torch.Tensor,
        history: torch.Tensor,
        *,
        generators: list[torch.Generator] | None,
        temperature: float,
        top_p: float,
        top_k: int,
        repetition_penalty: float,
        greedy: bool,
        logprob_temperature: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(A, V) raw logits -> chosen tokens (A,) and their log-probs under the raw policy."""
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
        probs, indices = sampling_distribution(scores, temperature=temperature, top_k=top_k, top_p=top_p)
        index = _draw(probs, generators)
        token = index if indices is None else indices.gather(1, index[:, None]).squeeze(1)
        return token, logp.gather(1, token[:, None]).squeeze(1)


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


def sampling_distribution(
    scores: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What a row draws from, as transformers' temperature, top-k and top-p warpers leave it:
    unnormalised probabilities (A, K) over candidate tokens ``indices`` (A, K), most likely first, or
    over the whole vocabulary (``indices`` None) when nothing truncates it."""
    if temperature != 1.0:
        scores = scores / temperature
    candidates = _candidates(scores, top_k, top_p)
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
    scores: torch.Tensor, top_k: int, top_p: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The tokens that can be drawn, most likely first: (values, indices) of shape (A, K) and the log
    normaliser (A, 1) of the distribution top-p reads (over the top-k tokens when top-k applies, as
    transformers masks the rest first; else over the vocabulary). ``None`` when no truncation applies
    (top_k 0, top_p 1). Sorting K candidates instead of the vocabulary is the difference between
    ~0.1 ms and ~20 ms a step on CPU."""
    vocab = scores.shape[-1]
    if top_k > 0:
        k = min(top_k, vocab)
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
    k = min(TOP_P_CANDIDATES, vocab)
    normalizer = scores.logsumexp(-1, keepdim=True)
    values, indices = torch.topk(scores, k, dim=-1)
    if k < vocab and bool(((values - normalizer).exp().sum(-1) < top_p).any()):
        values, indices = torch.sort(scores, dim=-1, descending=True)
    return values, indices, normalizer


def _draw(probs: torch.Tensor, generators: list[torch.Generator] | None) -> torch.Tensor:
    """One index per row from unnormalised ``probs`` (A, K) by inverse CDF, with one uniform number
    per row from torch's global generator or from the row's own."""
    if generators is None:
        u = 1.0 - torch.rand(len(probs), device=probs.device)
    else:
        u = torch.cat([1.0 - torch.rand(1, generator=gen, device=probs.device) for gen in generators])
    cdf = probs.cumsum(-1)
    index = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1)).squeeze(1)
    return index.clamp(max=probs.shape[-1] - 1)
