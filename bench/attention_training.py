"""Attention of a scoring or training pass (whole rows: a left-padded prompt, then a right-padded
response) on this machine, three ways, against the limit:

- ``mask``: ``scaled_dot_product_attention`` with the (N, 1, S, S) mask of causal attention over each
  row's tokens, ``enable_gqa`` (the decoder's way for rows longer than its written-out bound);
- ``written``: ``softmax(q k^T / sqrt(d) + bias) v`` written out, softmax in float32, the KV heads
  repeated (the decoder's way for shorter rows);
- ``spans``: :func:`agents.attention.span_attention`, each row's span as plain causal attention
  (``is_causal``: no mask, the padding skipped).

The limit: the arithmetic of causal attention over the spans alone (``2 L^2 d`` a head and row forward,
twice that backward), at this machine's matmul rate in the dtype (a 1024-cube matmul, best of
``--repeats``). The shapes: the embedded SmolLM2-135M's heads (9 query heads over 3 KV heads of 64),
rows of IMDB's, a coding pass's and a 2-turn coding pass's lengths, each row's padding drawn (seeded):
up to an eighth of the row on the left, a quarter on the right. ``fwd`` is a pass without gradients (a
scoring pass); ``train`` a forward and a backward. The ways take turns, a round each (the first round a
warm-up), and each figure is the median of ``--repeats`` rounds.
``max_abs_difference``: the largest difference from ``mask`` at the spans' queries.

Then whole passes (``--no-pass`` skips them; ``--passes`` picks some): the embedded
SmolLM2-135M-Instruct with a rank-8 adapter and a value head, in the machine's default dtype
(``--pass-dtype``), scoring and training (forward and backward of ``-log-probs + value loss``) the rows
of :data:`PASSES` (left-padded prompts, right-padded responses: IMDB's, a coding pair's update, its
first and second turns, and shorter rows), the decoder's ways chosen three
ways in the same run (:data:`CHOICES`, kept in the JSON): as it chooses them (``now``), as it chose them
before a float32 training pass stopped writing attention out (``before``: written out up to 512
positions), and without span attention (``no_spans``), taking turns likewise. ``--no-kernels`` times the
whole passes alone. Prints one JSON object on its last line.

    python bench/attention_training.py [--threads 1] [--repeats 3] [--no-pass] [--no-kernels]
                                       [--passes medium coding] [--pass-dtype float32]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.attention import row_spans, span_attention
from agents.decoder import causal_allowed
from agents.models import machine_description

HEADS, KV_HEADS, DIM = 9, 3, 64
SHAPES = (("imdb", 32, 64), ("short", 32, 96), ("short", 16, 128), ("medium", 16, 192), ("medium", 16, 256),
          ("coding", 8, 512), ("coding", 8, 640), ("coding-2turn", 4, 1024))
"""(what, rows, positions a row)."""
PASSES = (("imdb", 16, (16, 32), (8, 24)), ("medium", 16, (64, 96), (48, 96)), ("coding", 8, (300, 334), (128, 256)),
          ("coding-2turn", 4, (640, 948), (128, 256)))
"""(what, rows, prompt tokens (fewest, most), response tokens (fewest, most)): the second turn's prompts of
a 2-turn coding run measured 350-948 tokens, 640 on average."""
DEFAULT_PASSES = ("medium", "coding", "coding-2turn")
CHOICES = {
    "now": {},
    "before": {"MATH_ATTENTION_MAX_LENGTH_FLOAT32": 512},
    "no_spans": {"SPAN_ATTENTION_MIN_LENGTH": 10**9, "SPAN_ATTENTION_MIN_LENGTH_NO_GRAD": 10**9},
}
"""The decoder's bounds (``agents.decoder``'s constants) each whole pass is timed under, by name."""


def timed(fn, repeats: int) -> float:
    """Median milliseconds of ``repeats`` calls of ``fn`` (one warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def matmul_tflops(dtype: torch.dtype, repeats: int) -> float:
    """This machine's matmul rate in ``dtype``: a (1024 x 1024) @ (1024 x 1024) product, best of ``repeats``."""
    a, b = torch.randn(1024, 1024, dtype=dtype), torch.randn(1024, 1024, dtype=dtype)
    a @ b
    best = min(timed(lambda: a @ b, 1) for _ in range(max(repeats, 3)))
    return 2 * 1024**3 / (best / 1e3) / 1e12


def wall_ms(fn: Callable[[], Any]) -> float:
    """Milliseconds of wall clock a call of ``fn`` takes."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def in_turns(timings: dict[str, dict[str, Any]], repeats: int,
             around: Callable[[str], contextlib.AbstractContextManager] | None = None,
             measure: Callable[[Callable[[], Any]], float] = wall_ms) -> dict[str, dict[str, float]]:
    """Median milliseconds of each call of ``timings`` (way -> {figure: fn}), the ways taking turns a round
    each, ``repeats`` rounds after one that warms up and is not counted (``around(way)``: a context each
    way's calls run in; ``measure(fn)``: what a call is worth, its wall milliseconds unless told). Timed one
    way after another, the first way measured paid for the process's first passes: 1.6x slower scoring
    passes at 192 positions than the same way measured later in one run.

    >>> calls = []
    >>> medians = in_turns({"a": {"x": lambda: calls.append("a")}, "b": {"x": lambda: calls.append("b")}}, 2)
    >>> calls  # the warm-up round, then the two counted
    ['a', 'b', 'a', 'b', 'a', 'b']
    >>> sorted(medians), list(medians["a"])
    (['a', 'b'], ['x'])
    """
    taken: dict[str, dict[str, list[float]]] = {way: {key: [] for key in fns} for way, fns in timings.items()}
    for round_ in range(repeats + 1):
        for way, fns in timings.items():
            with around(way) if around else contextlib.nullcontext():
                for key, fn in fns.items():
                    value = measure(fn)
                    if round_:
                        taken[way][key].append(value)
    return {way: {key: statistics.median(values) for key, values in times.items()} for way, times in taken.items()}


def fwd_and_train(fn, qkv: tuple[torch.Tensor, ...], grad: torch.Tensor) -> dict[str, Callable[[], None]]:
    """``fn(q, k, v)`` without gradients (``fwd``), and with its backward (``train``)."""

    def forward() -> None:
        with torch.no_grad():
            fn(*qkv)

    def train() -> None:
        fn(*qkv).backward(grad)
        for x in qkv:
            x.grad = None

    return {"fwd": forward, "train": train}


def whole_passes(repeats: int, names: tuple[str, ...] = DEFAULT_PASSES, dtype: str | None = None) -> list[dict]:
    """Milliseconds of the decoder's scoring and training passes over the rows of :data:`PASSES` named in
    ``names``, in ``dtype`` (None: the machine's default), under each of :data:`CHOICES`."""
    from agents import LoraSettings, MultiAgentPolicy
    from agents.models import resolve_dtype

    dtype = resolve_dtype(dtype, torch.device("cpu"))
    policy = MultiAgentPolicy.from_pretrained(["coder"], None, dtype=dtype, device="cpu", value_head=True,
                                              lora=LoraSettings(rank=8, alpha=16.0))
    policy.train()
    gen = torch.Generator().manual_seed(1)
    return [one_pass(policy, what, rows, prompts, responses, gen, repeats)
            for what, rows, prompts, responses in PASSES if what in names]


@contextlib.contextmanager
def bounds_set(module: Any, bounds: dict[str, int]) -> Iterator[None]:
    """``module``'s constants named in ``bounds`` set to their values, then put back."""
    kept = {key: getattr(module, key) for key in bounds}
    for key, value in bounds.items():
        setattr(module, key, value)
    try:
        yield
    finally:
        for key, value in kept.items():
            setattr(module, key, value)


def one_pass(policy, what: str, rows: int, prompts: tuple[int, int], responses: tuple[int, int],
             gen: torch.Generator, repeats: int) -> dict:
    from agents import decoder as decoder_module

    width, length = prompts[1], responses[1]
    prompt_ids = torch.randint(100, 40000, (rows, width), generator=gen)
    prompt_mask = (torch.arange(width) >= torch.randint(0, width - prompts[0] + 1, (rows, 1), generator=gen)).long()
    response_ids = torch.randint(100, 40000, (rows, length), generator=gen)
    response_mask = (torch.arange(length) < torch.randint(responses[0], length + 1, (rows, 1), generator=gen)).long()
    batch = (prompt_ids, prompt_mask, response_ids, response_mask)

    def score() -> None:
        with torch.no_grad():
            policy.forward("coder", *batch, with_values=True)

    def train() -> None:
        logprobs, values = policy.forward("coder", *batch, with_values=True)
        mask = response_mask.float()
        (-(logprobs * mask).sum() + ((values - 0.5) ** 2 * mask).sum()).backward()
        for param in policy.parameters("coder"):
            param.grad = None

    dtype = policy.model.get_base_model().dtype
    out: dict = {"what": what, "dtype": str(dtype).removeprefix("torch."), "rows": rows,
                 "positions": width + length, "tokens": int(prompt_mask.sum() + response_mask.sum())}
    medians = in_turns({name: {"score_ms": score, "train_ms": train} for name in CHOICES}, repeats,
                       around=lambda name: bounds_set(decoder_module, CHOICES[name]))
    for name, times in medians.items():
        out[name] = {key: round(value, 1) for key, value in times.items()}
    out["speedup"] = {other: {key: round(out[other][key] / out["now"][key], 2) for key in ("score_ms", "train_ms")}
                      for other in CHOICES if other != "now"}
    return out


def ways(mask: torch.Tensor, dtype: torch.dtype):
    """name -> fn(q, k, v) for the three ways of attending over rows of key mask ``mask`` (N, S)."""
    allowed = causal_allowed(mask)[:, None]
    bias = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    spans = row_spans(mask)
    groups = HEADS // KV_HEADS

    def masked(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)

    def written(q, k, v):
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q, k.transpose(-1, -2)) * DIM**-0.5 + bias
        return torch.matmul(scores.softmax(-1, dtype=torch.float32).to(q.dtype), v)

    def spanned(q, k, v):
        return span_attention(q, k, v, spans)

    return {"mask": masked, "written": written, "spans": spanned}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--pass", dest="whole_pass", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the decoder's whole passes under each of CHOICES")
    parser.add_argument("--kernels", action=argparse.BooleanOptionalAction, default=True,
                        help="time the three ways of attention alone (--no-kernels: the whole passes only)")
    parser.add_argument("--passes", nargs="+", choices=[p[0] for p in PASSES], default=list(DEFAULT_PASSES))
    parser.add_argument("--pass-dtype", choices=["bfloat16", "float32"], default=None,
                        help="the whole passes' dtype (default: the machine's)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    rows = []
    for dtype in (torch.bfloat16, torch.float32) if args.kernels else ():
        rate = matmul_tflops(dtype, args.repeats)
        for what, n, s in SHAPES:
            left = torch.randint(0, s // 8 + 1, (n,), generator=gen)
            right = torch.randint(0, s // 4 + 1, (n,), generator=gen)
            position = torch.arange(s)
            mask = ((position >= left[:, None]) & (position < s - right[:, None])).long()
            q = torch.randn(n, HEADS, s, DIM, generator=gen).to(dtype).requires_grad_()
            k = torch.randn(n, KV_HEADS, s, DIM, generator=gen).to(dtype).requires_grad_()
            v = torch.randn(n, KV_HEADS, s, DIM, generator=gen).to(dtype).requires_grad_()
            lengths = mask.sum(-1).double()
            forward_flops = float((2 * lengths**2 * DIM * HEADS).sum())
            limit = {"fwd": forward_flops / (rate * 1e12) * 1e3, "train": 3 * forward_flops / (rate * 1e12) * 1e3}
            keep = mask.bool()[:, None, :, None]
            grad = torch.randn(n, HEADS, s, DIM, generator=gen).to(dtype) * keep
            fns = ways(mask, dtype)
            with torch.no_grad():
                reference = fns["mask"](q, k, v).float() * keep
            row = {"what": what, "dtype": str(dtype).removeprefix("torch."), "rows": n, "positions": s,
                   "span_tokens": int(lengths.sum()), "matmul_tflops": round(rate, 3),
                   "limit_ms": {key: round(value, 3) for key, value in limit.items()}}
            medians = in_turns({name: fwd_and_train(fn, (q, k, v), grad) for name, fn in fns.items()}, args.repeats)
            for name, fn in fns.items():
                with torch.no_grad():
                    difference = float(((fn(q, k, v).float() * keep) - reference).abs().max())
                fwd, trained = medians[name]["fwd"], medians[name]["train"]
                row[name] = {"fwd_ms": round(fwd, 2), "train_ms": round(trained, 2),
                             "fwd_fraction_of_limit": round(limit["fwd"] / fwd, 3),
                             "train_fraction_of_limit": round(limit["train"] / trained, 3),
                             "max_abs_difference": difference}
            row["spans_speedup"] = {key: round(min(row["mask"][f"{key}_ms"], row["written"][f"{key}_ms"])
                                               / row["spans"][f"{key}_ms"], 2) for key in ("fwd", "train")}
            rows.append(row)
            print(json.dumps(row), flush=True)
    result: dict[str, Any] = {"bench": "attention_training", "rows": rows}
    if args.whole_pass:
        result["choices"] = CHOICES
        result["passes"] = whole_passes(args.repeats, tuple(args.passes), args.pass_dtype)
        print(json.dumps(result["passes"]), flush=True)
    machine = machine_description(args.pass_dtype if args.whole_pass and args.pass_dtype else "auto")
    machine["threads"] = args.threads
    print(json.dumps({**result, "machine": machine}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
