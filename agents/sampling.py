"""The draw: which token each row of a decode step samples, and its log-prob.

Sampling matches ``transformers``' ``generate`` with the same processors, in the same order:
repetition penalty, temperature, top-k, top-p (ties and the always-kept most likely token as there),
then a draw; greedy decoding takes the arg-max of the processed logits. The log-prob recorded for
each sampled token is ``log_softmax`` of the *raw* logits (divided by ``logprob_temperature``; 1 by
default), the quantity :meth:`agents.policy.MultiAgentPolicy.logprobs` recomputes. Logits are over
the tokenizer's ids only (``token_count``): an LM head with more rows than the tokenizer has tokens
(Qwen2.5) never samples those ids, and the log-probs are of that masked distribution, as scoring's.

A row's random numbers are a function of (its key, the step, the token id) (:func:`uniform_noise`):
seeded rows are keyed by (seed, agent, sample) (:func:`row_seed`), so a row's draw does not depend on
what else is in the batch (data-parallel ranks, PPO's per-episode seeds).
Its logits may, to float32 rounding: a matmul can round a row differently in batches of different
row counts (most pairs of sizes with AVX2's kernels, few with AVX-512's; docs/agents.md). A draw over a
flat distribution (no top-k, top-p 1, an untrained model's 49k near-equal tokens) can turn such a ~1e-6
difference into another token; over truncated distributions (the learners' defaults: top-k 50, top-p
0.9) the chance is about the rounding over the drawn token's probability.

:func:`choose` is one decode step's draw (the engine's dynamic loop and :mod:`agents.graph`'s static step
both call it); :func:`sampling_distribution` the processors; :func:`race_draw` the draw over them, from the
counter-based random numbers of :func:`uniform_noise` keyed by :func:`row_keys` (a seeded row's key from
:func:`row_seed`).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
import torch

__all__ = [
    "TOP_K_TIES", "TOP_P_CANDIDATES", "choose", "race_draw", "row_keys", "row_seed", "sampling_distribution",
    "uniform_noise",
]


def row_seed(seed: int, agent: str, sample: int) -> int:
    """The seed of one row's generator: the prompt row's seed, the agent's name and the sample number,
    mixed (``numpy.random.SeedSequence``) so that nearby seeds give unrelated streams and two agents
    answering the same prompt draw independently (whichever policy object holds them)."""
    return int(np.random.SeedSequence([int(seed), zlib.crc32(agent.encode()), int(sample)]).generate_state(1)[0])


def choose(
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


TOP_P_CANDIDATES = 1024
"""Top-p without top-k looks at the 1024 most likely tokens first; rows whose top-p set is larger (a
flat distribution) are handled over the whole vocabulary, so the result is exact either way."""

TOP_K_TIES = 16
"""Top-k's window holds this many tokens beyond k (transformers keeps every token tied with the k-th; bf16
logits tie often): the static path (CUDA graphs), whose shapes may not depend on the values, keeps at
most these; the dynamic path reads the whole vocabulary for a row with more. More ties than this in one
row is the one case where the two differ."""


def sampling_distribution(
    scores: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, static: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What a row draws from, as transformers' temperature, top-k and top-p warpers leave it:
    unnormalised probabilities (A, K) over candidate tokens ``indices`` (A, K), most likely first, or
    over the whole vocabulary (``indices`` None) when nothing truncates it. With ``static`` the shapes
    depend on the arguments only and nothing synchronises with the host (a CUDA graph can hold it):
    top-k keeps at most :data:`TOP_K_TIES` tied tokens beyond k, and top-p alone sorts the whole
    vocabulary. Either way a token's probability is the same, and tokens outside the set get 0."""
    if top_k > 0:
        candidates = _top_k(scores, min(top_k, scores.shape[-1]), temperature, static)
    else:
        if temperature != 1.0:
            scores = scores / temperature
        candidates = _top_p_window(scores, top_p, static)
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


def _top_k(
    scores: torch.Tensor, k: int, temperature: float, static: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k's candidates, most likely first: (values, indices) (A, K), the values divided by the
    temperature, those below the k-th -inf, and their log normaliser (A, 1) (top-p reads the distribution
    over them, as transformers masks the rest first). Sorting K candidates instead of the vocabulary is
    the difference between ~0.1 ms and ~20 ms a step on CPU.

    The window is the raw scores' top ``k + TOP_K_TIES``, and only its values are divided: a correctly
    rounded division by a positive number never reverses an order, so the window holds the divided
    scores' top tokens, and the k-th divided score is the k-th of the divided vocabulary. The tokens
    transformers keeps (every one tied with the k-th after the division: bf16 logits tie often) are then
    in the window unless its last one ties too; the dynamic path (``static`` False) then reads the whole
    divided vocabulary, the static one keeps the window (:data:`TOP_K_TIES`)."""
    vocab = scores.shape[-1]
    window = min(k + TOP_K_TIES, vocab)
    values, indices = torch.topk(scores, window, dim=-1)
    if temperature != 1.0:
        values = values / temperature
    kth = values[:, k - 1 : k]
    if not static and window < vocab and bool((values[:, -1:] >= kth).any()):
        scaled = scores / temperature if temperature != 1.0 else scores
        values, indices = torch.topk(scaled, int((scaled >= kth).sum(-1).max()), dim=-1)
    values = values.masked_fill(values < kth, float("-inf"))
    return values, indices, values.logsumexp(-1, keepdim=True)


def _top_p_window(
    scores: torch.Tensor, top_p: float, static: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """Top-p's candidates (no top-k), most likely first: (values, indices) (A, K) of the (divided) scores
    and the log normaliser (A, 1) of the vocabulary; ``None`` when top-p is 1 (nothing truncates). The
    dynamic path looks at the :data:`TOP_P_CANDIDATES` most likely tokens and sorts the vocabulary only
    for rows whose top-p set is larger; the static one sorts it (fixed shapes)."""
    vocab = scores.shape[-1]
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
