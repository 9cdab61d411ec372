"""The centralised critic: a value head with its own LoRA adapter (``CRITIC``) on the shared frozen base,
reading every agent's prompt and response. MAAC's critic (baselines/learners/maac.py), and PPO's and CORY's
with ``--critic central`` (baselines/rl/experience.py, baselines/learners/ppo.py). The adapter's name and
the base it sits on (``with_critic``) are :mod:`baselines.infra.config`'s, where the command line reads them.

=====================  =====================================================================
``critic_inputs``      MAAC's view of a joint turn: every agent's prompt then response, in env order
``CriticReader``       the same view in the critic's own tokens, for a team of several tokenizers
``check_context``      refuse a joint turn longer than the critic's model has positions
``critic_values``      (N,) the critic's estimate after reading such a view
``central_context``    PPO/CORY: the other roles' prompts and responses, then the scored role's prompt
``CentralView``        that context in the critic's tokens, with a foreign role's response aligned to its tokens
``central_view``       build one for a role of a turn (``CriticReader``'s team of tokenizers)
``central_values``     (N, T) the central critic's value before each of the role's response tokens
``central_forward``    an actor's log-probs with the central critic's values of the same tokens
``value_loss``         PPO's clipped value loss
``row_chunks``         row slices of a batch within a token budget
=====================  =====================================================================
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agents.rows import left_padded, right_padded
from baselines.infra.config import CRITIC


def critic_inputs(
    turn_prompts: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    turn_responses: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    agents: Sequence[str],
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The critic's view of one turn: for each row, every agent's prompt tokens then its response tokens
    (masks decide what is a token), agents in env order, left-padded -> (N, L) ids, mask.

    >>> p = {"a": (torch.tensor([[0, 5]]), torch.tensor([[0, 1]])), "b": (torch.tensor([[7]]), torch.tensor([[1]]))}
    >>> r = {"a": (torch.tensor([[6, 0]]), torch.tensor([[1, 0]])), "b": (torch.tensor([[8]]), torch.tensor([[1]]))}
    >>> critic_inputs(p, r, ["a", "b"], pad_id=0)[0].tolist()
    [[5, 6, 7, 8]]
    """
    n = len(next(iter(turn_prompts.values()))[0])
    # Prompts come from the envs (CPU), responses from the policy (its device): assembled on the CPU, each
    # tensor moved once (the policy moves the result to its device).
    pieces = {a: [(ids.cpu(), mask.cpu()) for ids, mask in (turn_prompts[a], turn_responses[a])] for a in agents}
    rows = []
    for i in range(n):
        parts = []
        for a in agents:
            for ids, mask in pieces[a]:
                parts.append(ids[i][mask[i].bool()])
        rows.append(torch.cat(parts))
    width = max(len(r) for r in rows)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = r
        mask[i, width - len(r):] = 1
    return ids, mask


class CriticReader:
    """The critic's view of a joint turn (:func:`critic_inputs`) in the critic's own tokens, for a team
    whose agents speak several tokenizers (docs/maac.md "Teams").

    An agent whose tokenizer is the critic's (the same fingerprint: the same text gives the same ids)
    is read as its own ids, unchanged: with one tokenizer the critic's inputs are exactly
    :func:`critic_inputs`'. Any other agent is read as text: its prompt and its response, each row's
    tokens (masked in) decoded by the agent's tokenizer with its special tokens dropped (the control
    tokens of its chat template, BOS, EOS: their strings mean nothing in another vocabulary), then each
    encoded by the critic's tokenizer without special tokens. The prompt and the response are encoded
    apart, as the agent's own ids are (the response was sampled after the prompt's last token), and
    a prompt the batch's rows repeat (G samples of a problem) is encoded once.

    ``seconds``: the time spent re-encoding so far (decode and encode of the foreign agents only).

    Args:
        policy: what gives each agent's and the critic's tokenizer and pad id (``tokenizer_of``,
            ``pad_token_id_of``).
        agents: the env's agents, in env order (the order the critic reads them in).
        critic: the critic's adapter name in ``policy``.
    """

    def __init__(self, policy: Any, agents: Sequence[str], critic: str = CRITIC) -> None:
        from agents.team import tokenizer_fingerprint

        self.agents = list(agents)
        self.tokenizer = policy.tokenizer_of(critic)
        self.pad_id = int(policy.pad_token_id_of(critic))
        prints: dict[int, str] = {}  # id(tokenizer) -> fingerprint: a fingerprint hashes a whole vocabulary

        def fingerprint(tok: Any) -> str:
            if id(tok) not in prints:
                prints[id(tok)] = tokenizer_fingerprint(tok)
            return prints[id(tok)]

        own = fingerprint(self.tokenizer)
        self.foreign: dict[str, Any] = {
            a: policy.tokenizer_of(a) for a in self.agents if fingerprint(policy.tokenizer_of(a)) != own
        }
        """Agent -> its tokenizer, for the agents the critic reads as text (empty: one tokenizer)."""
        self.seconds = 0.0
        self._pieces: dict[tuple[str, tuple[int, ...]], torch.Tensor] = {}

    def piece(self, agent: str, ids: torch.Tensor) -> torch.Tensor:
        """One piece of ``agent``'s tokens (1-D ids, no padding: a prompt or a response) as the critic
        reads it: unchanged when ``agent`` speaks the critic's tokenizer, else its text in the critic's
        tokens (as :meth:`encode`; a piece seen before is not encoded again)."""
        if agent not in self.foreign:
            return ids
        key = (agent, tuple(ids.tolist()))
        if key not in self._pieces:
            start = time.perf_counter()
            text = self.foreign[agent].decode(list(key[1]), skip_special_tokens=True,
                                              clean_up_tokenization_spaces=False)
            self._pieces[key] = torch.tensor(self.encoded(agent, [text])[0], dtype=torch.long)
            self.seconds += time.perf_counter() - start
        return self._pieces[key]

    def __call__(
        self,
        turn_prompts: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
        turn_responses: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, L) ids, mask of the critic's view of one turn (``critic_inputs``' arguments)."""
        prompts, responses = dict(turn_prompts), dict(turn_responses)
        for agent in self.foreign:
            prompts[agent] = self.encode(agent, *prompts[agent])
            responses[agent] = self.encode(agent, *responses[agent])
        return critic_inputs(prompts, responses, self.agents, self.pad_id)

    def text(self, agent: str, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
        """Each row's text as ``agent`` wrote or read it: its tokens decoded by its own tokenizer,
        special tokens dropped."""
        mask = mask.cpu().bool()
        rows = [row[keep].tolist() for row, keep in zip(ids.cpu(), mask)]
        return self.foreign[agent].batch_decode(rows, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def encode(self, agent: str, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``agent``'s (N, T) ids, mask as the critic's: the rows' text (:meth:`text`) encoded by the
        critic's tokenizer -> (N, T') ids, mask, left-padded. Raises ``ValueError`` naming the agent
        when the critic's tokenizer reads some of the text as its unknown token."""
        start = time.perf_counter()
        rows = self.encoded(agent, self.text(agent, ids, mask))
        out, keep = left_padded(rows, self.pad_id)
        self.seconds += time.perf_counter() - start
        return out, keep

    def encoded(self, agent: str, texts: Sequence[str]) -> list[list[int]]:
        """Each of ``agent``'s texts in the critic's tokens (no special tokens; a text the rows repeat is
        encoded once), refused as :meth:`check_known` says."""
        distinct = list(dict.fromkeys(texts))
        encoded = dict(zip(distinct, self.tokenizer(distinct, add_special_tokens=False)["input_ids"]))
        self.check_known(agent, distinct, encoded)
        return [encoded[t] for t in texts]

    def align(
        self, agent: str, response_ids: torch.Tensor, response_mask: torch.Tensor
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        """``agent``'s (N, T) response as the critic reads it, and where each of its tokens' values comes
        from: ((N, T') ids, mask of each row's text in the critic's tokens then a probe (the pad id,
        masked in), right-padded), (N, T) positions in them.

        A value is the estimate of the state before a token. The state before ``agent``'s token j is the
        text its tokens 0..j-1 decode to (a prefix of the row's text: :func:`token_starts`); the critic
        has a state before each of its tokens and one after the whole text (the probe's), and token j
        takes the critic's state of the longest prefix it holds: the critic token that starts where
        token j starts, else the last one that starts before (:func:`critic_position`). Where the two
        tokenizers cut the text alike, that is the same
        state; elsewhere it is the state a few characters earlier (at most one critic token). The EOS
        and any control token decode to no text and take the state of the text before them.

        The critic's tokens are placed in the text it reads back (its decode of them): where its
        vocabulary drops a character of the text (a control byte a byte-level BPE has no token for),
        offsets in the text map to offsets in what it reads over the characters the two share
        (:func:`offset_map`), so no token takes a state that holds text after it."""
        start = time.perf_counter()
        mask = response_mask.cpu().bool()
        rows = [row[keep].tolist() for row, keep in zip(response_ids.cpu(), mask)]
        texts = self.text(agent, response_ids, response_mask)
        encoded = self.encoded(agent, texts)
        theirs = token_starts(self.foreign[agent], rows, texts)
        seen = self.tokenizer.batch_decode(encoded, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        ours = token_starts(self.tokenizer, encoded, seen)  # ours[i][-1]: after the text, the probe's state
        positions = torch.zeros(mask.shape, dtype=torch.long)
        for i, keep in enumerate(mask):
            where = keep.nonzero().flatten()
            to_seen = offset_map(texts[i], seen[i])
            picked = [critic_position(ours[i], to_seen(at)) for at in theirs[i][: len(where)]]
            positions[i, where] = torch.tensor(picked, dtype=torch.long)
        probe = int(self.pad_id)
        response = right_padded([row + [probe] for row in encoded], self.pad_id)
        self.seconds += time.perf_counter() - start
        return response, positions

    def check_known(self, agent: str, texts: Sequence[str], encoded: Mapping[str, list[int]]) -> None:
        """Refuse text the critic's tokenizer cannot encode: a tokenizer without byte fallback (a
        WordPiece, a BPE over a fixed alphabet) maps characters outside its vocabulary to its unknown
        token, and the critic would read every such character as the same token."""
        unk = getattr(self.tokenizer, "unk_token_id", None)
        if unk is None:
            return
        for text in texts:
            if unk in encoded[text] and self.tokenizer.unk_token not in text:
                chars: Any = "some characters"
                if getattr(self.tokenizer, "is_fast", False):  # only fast tokenizers map tokens to characters
                    pieces = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
                    chars = sorted({text[s:e] for i, (s, e) in zip(pieces["input_ids"], pieces["offset_mapping"])
                                    if i == unk})
                name = getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__
                raise ValueError(
                    f"the critic's tokenizer ({name}) cannot encode agent {agent!r}'s text: it reads "
                    f"{chars} as its unknown token {self.tokenizer.unk_token!r} (text {text[:80]!r}), so the "
                    f"critic would not see what {agent!r} wrote; give the critic a model whose tokenizer "
                    f"encodes any text (a byte-level BPE, or {agent!r}'s own base: --critic-model MODEL)"
                )


def check_context(policy: Any, inputs: Sequence[tuple[torch.Tensor, torch.Tensor]], adapter: str = CRITIC) -> None:
    """Refuse critic inputs longer than the critic's model has positions (its ``max_position_embeddings``,
    one taken by :func:`critic_values`' probe): a model of learned positions (GPT-2) fails with an
    index error there, a rotary one reads positions it was never trained on. A team of tokenizers makes
    it likelier: text re-encoded by a tokenizer of few merges takes more tokens."""
    width = max((int(ids.shape[1]) for ids, _ in inputs), default=0)
    check_positions(policy, width + 1, f"joint turns of up to {width} tokens (every agent's prompt and "
                    "response, in its own tokens) plus one probe", adapter)


def check_positions(policy: Any, width: int, what: str, adapter: str = CRITIC) -> None:
    """Refuse a pass of ``width`` positions through ``adapter``'s model when it has fewer
    (``max_position_embeddings``); ``what``: what the critic reads, for the message."""
    config = getattr(policy.group(adapter).causal_lm, "config", None)
    limit = getattr(config, "max_position_embeddings", None)
    if isinstance(limit, int) and width > limit:
        name = getattr(config, "_name_or_path", "") or getattr(config, "model_type", "?")
        raise ValueError(
            f"the critic reads {what}, but its model ({name}) has {limit} positions; shorten the prompts "
            f"(--max-source-words) or responses (--max-new-tokens), or give the critic a model of a longer "
            f"context (--critic-model)"
        )


def critic_values(policy: Any, ids: torch.Tensor, mask: torch.Tensor, adapter: str = CRITIC) -> torch.Tensor:
    """(N,) the estimate of ``adapter``'s value head after reading the whole joint turn: the value of the
    state before a one-token probe response (the pad id, masked in), i.e. after the last input token.
    MAAC's critic, and MARLHF's reward model (``adapter="reward_model"``)."""
    probe = torch.full((len(ids), 1), policy.pad_token_id_of(adapter), dtype=torch.long)
    return policy.values(adapter, ids, mask, probe, torch.ones_like(probe))[:, 0]


def central_context(
    gens: Mapping[str, Any], roles: Sequence[str], role: str, pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The centralised critic's context for ``role``'s response, as PPO and CORY use it (``--critic
    central``): per row, every other role's prompt and response (roles in env order), then ``role``'s
    own prompt -> (N, L) ids, mask, left-padded (:func:`critic_inputs`). The critic reads ``role``'s
    response tokens after it, so its value before each of them has seen every agent's prompt and
    response (the later tokens of ``role``'s own response excepted, as a token-level value must).
    ``gens``: role -> ``agents.Generation`` of one batch (rows aligned across roles)."""
    others = [r for r in roles if r != role]
    n = len(gens[role].prompt_ids)
    empty = torch.zeros((n, 0), dtype=torch.long)
    prompts = {r: (gens[r].prompt_ids, gens[r].prompt_mask) for r in [*others, role]}
    responses = {r: (gens[r].response_ids, gens[r].response_mask) for r in others}
    responses[role] = (empty, empty)
    return critic_inputs(prompts, responses, [*others, role], pad_id)


@dataclass(frozen=True)
class CentralView:
    """The central critic's reading of one role's turn (PPO's and CORY's ``--critic central``).

    ``ids``, ``mask``: (N, L) the context (:func:`central_context`) in the critic's tokens. The critic
    then reads the role's response. ``response`` and ``positions`` are None when the role's player
    speaks the critic's tokenizer: the critic reads the response's own ids, one value per token. Else
    ``response`` is (N, T') ids, mask of the response's text in the critic's tokens then a probe, and
    ``positions`` (N, T) the position of ``response`` whose value each of the role's response tokens
    takes (:meth:`CriticReader.align`)."""

    ids: torch.Tensor
    mask: torch.Tensor
    response: tuple[torch.Tensor, torch.Tensor] | None = None
    positions: torch.Tensor | None = None

    def rows(self, rows: Any) -> CentralView:
        """The view of some rows (an index or a slice)."""
        response = None if self.response is None else (self.response[0][rows], self.response[1][rows])
        return CentralView(self.ids[rows], self.mask[rows], response,
                           None if self.positions is None else self.positions[rows])

    def width(self, response_width: int) -> int:
        """The positions one pass of the critic takes (the context, then the response it reads)."""
        return int(self.ids.shape[1]) + (response_width if self.response is None else int(self.response[0].shape[1]))


Context = CentralView | tuple[torch.Tensor, torch.Tensor]
"""A central critic's context: a :class:`CentralView`, or the (ids, mask) of :func:`central_context`
(one tokenizer)."""


def central_view(
    gens: Mapping[str, Any], roles: Sequence[str], role: str, players: Mapping[str, str], read: CriticReader
) -> CentralView:
    """:func:`central_context` for a team of tokenizers: each role's prompt and response read as
    ``read`` reads its player (``players``: role -> the model playing it; ``read``'s agents are the
    models), and ``role``'s response aligned to the critic's tokens when its player speaks another
    tokenizer (:meth:`CriticReader.align`). With one tokenizer, the same ids and mask as
    :func:`central_context` and no alignment."""
    others = [r for r in roles if r != role]
    n = len(gens[role].prompt_ids)
    empty = torch.zeros((n, 0), dtype=torch.long)
    prompts: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    responses: dict[str, tuple[torch.Tensor, torch.Tensor]] = {role: (empty, empty)}

    def as_read(r: str, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return read.encode(players[r], ids, mask) if players[r] in read.foreign else (ids, mask)

    for r in [*others, role]:
        prompts[r] = as_read(r, gens[r].prompt_ids, gens[r].prompt_mask)
        if r != role:
            responses[r] = as_read(r, gens[r].response_ids, gens[r].response_mask)
    ids, mask = critic_inputs(prompts, responses, [*others, role], read.pad_id)
    if players[role] not in read.foreign:
        return CentralView(ids, mask)
    response, positions = read.align(players[role], gens[role].response_ids, gens[role].response_mask)
    return CentralView(ids, mask, response, positions)


def context_rows(context: Context, rows: Any) -> Context:
    """Some rows of a central critic's context (a view's :meth:`CentralView.rows`, or both tensors')."""
    if isinstance(context, CentralView):
        return context.rows(rows)
    return context[0][rows], context[1][rows]


def central_values(
    policy: Any, context: Context, response_ids: torch.Tensor, response_mask: torch.Tensor
) -> torch.Tensor:
    """(N, T) the central critic's value of the state before each response token: the critic reads the
    context, then the response (its own ids, or, for a foreign role, its text in the critic's tokens,
    each token taking the value at its aligned position). Differentiable; 0 on pads."""
    if not isinstance(context, CentralView):
        context = CentralView(*context)
    if context.response is None or context.positions is None:
        return policy.values(CRITIC, context.ids, context.mask, response_ids, response_mask)
    values = policy.values(CRITIC, context.ids, context.mask, *context.response)  # (N, T')
    picked = values.gather(1, context.positions.to(values.device))
    return picked * response_mask.to(values.device).to(picked.dtype)


def central_forward(
    policy: Any,
    model: str,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_ids: torch.Tensor,
    response_mask: torch.Tensor,
    context: Context,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``policy.forward(model, ..., with_values=True)`` with the values of the central critic instead
    of ``model``'s own head: (N, T) log-probs of ``model``'s response under its adapter and (N, T) values
    of the critic adapter reading ``context`` (:func:`central_context`, :func:`central_view`) then the same
    response (:func:`central_values`)."""
    logprobs = policy.logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, temperature=temperature)
    return logprobs, central_values(policy, context, response_ids, response_mask)


def value_loss(
    values: torch.Tensor, old: torch.Tensor, returns: torch.Tensor, clip: float, denominator: float | None = None
) -> torch.Tensor:
    """PPO's value loss: (N,) -> scalar, 0.5 * max((V - R)^2, (clip(V, old +- clip) - R)^2) averaged
    (``denominator``: summed and divided by it instead, e.g. the rows of every process and part).

    >>> float(value_loss(torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([0.0]), 0.5))
    2.0
    """
    loss = (values - returns) ** 2
    if clip > 0:
        clipped = old + (values - old).clamp(-clip, clip)
        loss = torch.maximum(loss, (clipped - returns) ** 2)
    if denominator is not None:
        return 0.5 * loss.sum() / max(float(denominator), 1.0)
    return 0.5 * loss.mean()


def token_starts(tokenizer: Any, rows: Sequence[Sequence[int]], texts: Sequence[str]) -> list[list[int]]:
    """Where each row's tokens start in its text, and where the text ends: row i's ``len(rows[i]) + 1``
    offsets, offset j the length of the text its first j tokens decode to (special tokens dropped, as
    ``texts`` were). Offsets never decrease. A token that ends inside a character (a byte-level BPE
    splits a character's bytes over tokens) adds text only with the token that completes it.

    A fast tokenizer streams each row once (``tokenizers``' ``DecodeStream``, which writes what each
    token adds to the text decoded so far: the spaces a tokenizer writes only between tokens, a
    character its bytes complete); a row whose stream does not add up to its text, and any row of a
    slow tokenizer, decode every prefix instead (quadratic in the row's length: 64 rows of 256 tokens
    took 0.8-1.2 s against 0.01-0.02 s streamed on an AMD EPYC). The two agree but for a split
    character's leading space: the stream adds it with the character, the prefixes before it.

    >>> from llm_envs.tokenizers import load_tokenizer
    >>> tok = load_tokenizer(None)
    >>> ids = tok("Hello world", add_special_tokens=False).input_ids
    >>> token_starts(tok, [ids], ["Hello world"])
    [[0, 5, 11]]
    """
    out = [streamed_starts(tokenizer, row, text) for row, text in zip(rows, texts)]
    slow = [i for i, starts in enumerate(out) if starts is None]
    cuts = [rows[i][:j] for i in slow for j in range(len(rows[i]) + 1)]
    decoded = iter(tokenizer.batch_decode(cuts, skip_special_tokens=True, clean_up_tokenization_spaces=False)
                   if cuts else [])
    for i in slow:
        starts, at = [], 0
        for _ in range(len(rows[i]) + 1):
            prefix = next(decoded)
            at = max(at, len(prefix) if texts[i].startswith(prefix) and not prefix.endswith("\ufffd")
                     else shared_prefix(prefix.rstrip("\ufffd"), texts[i]))
            starts.append(at)
        out[i] = starts
    return [starts for starts in out if starts is not None]


def streamed_starts(tokenizer: Any, row: Sequence[int], text: str) -> list[int] | None:
    """:func:`token_starts` of one row by streaming it through a fast tokenizer's decoder; None when the
    tokenizer is slow, or the stream's text is not ``text``."""
    backend = getattr(tokenizer, "_tokenizer", None)
    try:
        from tokenizers.decoders import DecodeStream
    except ImportError:  # tokenizers before 0.21
        return None
    if backend is None:
        return None
    stream = DecodeStream(skip_special_tokens=True)
    starts, at, pieces = [0], 0, []
    try:
        for token in row:
            piece = stream.step(backend, int(token))
            if piece:
                pieces.append(piece)
                at += len(piece)
            starts.append(at)
    except Exception:  # an id the stream cannot decode: the prefixes' way
        return None
    return starts if "".join(pieces) == text else None


def critic_position(starts: Sequence[int], at: int) -> int:
    """The critic's position whose state holds the text before offset ``at`` and nothing after it:
    ``starts`` (non-decreasing) where each critic token starts, then the text's end. The first token
    that starts at ``at``, else the last that starts before it. Of tokens that start at one offset, the
    later ones follow a token that ended inside a character (a byte of it, read before the character
    is complete): their states hold a byte of text after ``at``.

    >>> critic_position([0, 3, 3, 4], 3), critic_position([0, 3, 3, 4], 2), critic_position([0, 3, 3, 4], 4)
    (1, 0, 3)
    """
    index = bisect.bisect_left(starts, at)
    return index if index < len(starts) and starts[index] == at else index - 1


def offset_map(text: str, seen: str) -> Any:
    """Offset in ``text`` -> offset in ``seen``, a version of it with characters dropped or changed (what
    a tokenizer reads back of ``text``): over the blocks of characters the two share (``difflib``), an
    offset inside or after a block maps to the same place in ``seen``'s copy of it, never past it.
    Monotone; the identity when the two are equal.

    >>> to_seen = offset_map("ab\x14cd", "abcd")
    >>> [to_seen(a) for a in range(6)]
    [0, 1, 2, 2, 3, 4]
    """
    if text == seen:
        return lambda at: at
    from difflib import SequenceMatcher

    blocks = SequenceMatcher(None, text, seen, autojunk=False).get_matching_blocks()

    def to_seen(at: int) -> int:
        out = 0
        for i, j, size in blocks:
            if i > at:
                break
            out = j + min(at - i, size)
        return out

    return to_seen


def shared_prefix(a: str, b: str) -> int:
    """The length of the longest common prefix of two strings."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def row_chunks(ids: torch.Tensor, token_budget: int) -> list[slice]:
    """Slices of at most ``token_budget // width`` rows of an (N, width) batch (at least one row per
    slice; 0: one slice of every row).

    >>> row_chunks(torch.zeros(5, 4), 8)
    [slice(0, 2, None), slice(2, 4, None), slice(4, 6, None)]
    """
    n = len(ids)
    size = max(1, token_budget // max(ids.shape[1], 1)) if token_budget else max(n, 1)
    return [slice(i, i + size) for i in range(0, n, size)]
