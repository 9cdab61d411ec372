"""Attention over grouped KV heads on this machine: ``scaled_dot_product_attention(enable_gqa=True)``
against :func:`agents.attention.grouped_attention` (the query heads folded into the query length) and,
for a decode step, :func:`agents.attention.transposed_key_attention` (written out over keys kept
transposed: the engine's dynamic loop on the CPU), and the limit, the keys and values read once at this
machine's copy bandwidth. The engine's decode shapes of the embedded SmolLM2-135M (9 query heads, 3 KV
heads, head size 64; one query per row) with the cached lengths of a coding rollout, and a training
pass's full-sequence causal shape; bfloat16 and float32.

A decode row times a whole step: one call a layer over each of the model's 30 layers' own caches (cold
in the processor's caches, as in the engine), each cache wider than the keys so far (the engine's
caches have room for the response: their first columns are a strided view). The ways take turns a
round each after a warm-up round; each figure is the median of ``--repeats`` rounds, a call's share of
a step (a training row: of ``--calls`` calls). Then (``--no-generate`` skips it) the engine's whole
``generate_joint`` of coding prompts with its keys transposed and not (:func:`generate_rows`). Prints one
JSON object on its last line.

    python bench/attention.py [--threads 1] [--repeats 5] [--no-generate]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attention_training import in_turns

from agents.attention import grouped_attention, transposed_key_attention
from agents.models import machine_description


def timed(fn, calls: int, repeats: int) -> float:
    """Median milliseconds a call of ``fn`` over ``repeats`` timings of ``calls`` calls (one warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e3)
    return statistics.median(times)


def copy_gbps(repeats: int) -> float:
    """This machine's copy bandwidth (GB/s read + written), from a 256 MB tensor copied in place."""
    src, dst = torch.empty(2**26, dtype=torch.float32), torch.empty(2**26, dtype=torch.float32)
    ms = timed(lambda: dst.copy_(src), 3, repeats)
    return 2 * src.numel() * 4 / (ms / 1e3) / 1e9


HEADS, KV_HEADS, DIM, LAYERS = 9, 3, 64, 30
"""The embedded SmolLM2-135M's attention: query heads, KV heads, head size, layers."""


def limit_ms(k: torch.Tensor, gbps: float) -> float:
    """Milliseconds to read keys ``k`` and as many values once, at half the copy's traffic."""
    return 2 * k.numel() * k.element_size() / (gbps / 2 * 1e9) * 1e3


def decode_row(dtype: torch.dtype, n: int, length: int, gbps: float, repeats: int) -> dict:
    """A decode step of ``n`` rows over ``length`` cached keys, the three ways."""
    total = length + 256  # the cache's room for the response
    q = torch.randn(n, 1, HEADS, DIM, dtype=dtype).transpose(1, 2)  # as the decoder makes it
    keys = [torch.randn(n, KV_HEADS, total, DIM, dtype=dtype) for _ in range(LAYERS)]
    values = [torch.randn(n, KV_HEADS, total, DIM, dtype=dtype) for _ in range(LAYERS)]
    keys_t = [k.transpose(-1, -2).contiguous() for k in keys]
    mask = torch.rand(n, 1, 1, length) > 0.1
    mask[..., -1] = True
    ways = {
        "enable_gqa": lambda i: F.scaled_dot_product_attention(q, keys[i][:, :, :length], values[i][:, :, :length],
                                                               attn_mask=mask, enable_gqa=True),
        "grouped": lambda i: grouped_attention(q, keys[i][:, :, :length], values[i][:, :, :length], mask),
        "transposed": lambda i: transposed_key_attention(q, keys_t[i][..., :length], values[i][:, :, :length], mask),
    }
    medians = in_turns({way: {"ms": lambda fn=fn: [fn(i) for i in range(LAYERS)]} for way, fn in ways.items()},
                       repeats)
    ms = {way: medians[way]["ms"] / LAYERS for way in ways}
    reference = ways["enable_gqa"](0).float()
    limit = limit_ms(keys[0][:, :, :length], gbps)
    return {"pass": "decode", "dtype": str(dtype).removeprefix("torch."), "rows": n, "queries": 1, "keys": length,
            "layers": LAYERS, **{f"{way}_ms": round(value, 3) for way, value in ms.items()},
            "speedup": round(ms["enable_gqa"] / ms["grouped"], 2),
            "transposed_over_grouped": round(ms["grouped"] / ms["transposed"], 2), "limit_ms": round(limit, 3),
            "grouped_fraction_of_limit": round(limit / ms["grouped"], 3),
            "transposed_fraction_of_limit": round(limit / ms["transposed"], 3),
            "max_abs_difference": float((ways["grouped"](0).float() - reference).abs().max()),
            "transposed_max_abs_difference": float((ways["transposed"](0).float() - reference).abs().max())}


def training_row(dtype: torch.dtype, n: int, length: int, gbps: float, calls: int, repeats: int) -> dict:
    """A training pass's full-sequence causal attention (``grouped_attention`` is ``enable_gqa`` there)."""
    q = torch.randn(n, HEADS, length, DIM, dtype=dtype)
    k, v = (torch.randn(n, KV_HEADS, length, DIM, dtype=dtype) for _ in range(2))
    mask = torch.ones(length, length, dtype=torch.bool).tril()[None, None].expand(n, 1, -1, -1)
    gqa = timed(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True), calls, repeats)
    ours = timed(lambda: grouped_attention(q, k, v, mask), calls, repeats)
    difference = (grouped_attention(q, k, v, mask).float()
                  - F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).float())
    limit = limit_ms(k, gbps)
    return {"pass": "training", "dtype": str(dtype).removeprefix("torch."), "rows": n, "queries": length,
            "keys": length, "enable_gqa_ms": round(gqa, 3), "grouped_ms": round(ours, 3),
            "speedup": round(gqa / ours, 2), "limit_ms": round(limit, 3),
            "grouped_fraction_of_limit": round(limit / ours, 3), "max_abs_difference": float(difference.abs().max())}


def cpu_seconds(fn: Callable[[], object]) -> float:
    """Seconds of this process's CPU time a call of ``fn`` takes (fairer than the wall on a shared machine)."""
    c0 = time.process_time()
    fn()
    return time.process_time() - c0


def generate_rows(repeats: int, max_new_tokens: int) -> list[dict]:
    """The engine's whole ``generate_joint`` on the embedded model in the machine's default dtype, its
    keys transposed (``RolloutEngine.transposed_keys``, the default on the CPU) and not, in turns: 4
    prompts x 4 samples of ``coding/humaneval-v0`` (the main role's first prompts, ~330 tokens) and of
    2-turn length (the same prompts twice over), ``max_new_tokens`` each, temperature 0.7, seeded: both
    ways sample from the same numbers. CPU seconds (the process's own time), the median of ``repeats``."""
    import llm_envs
    from agents import LoraSettings, MultiAgentPolicy
    from agents.models import resolve_dtype
    from agents.rows import left_padded

    dtype = resolve_dtype(None, torch.device("cpu"))
    policy = MultiAgentPolicy.from_pretrained(["coder"], None, dtype=dtype, device="cpu",
                                              lora=LoraSettings(rank=8, alpha=16.0))
    env = llm_envs.make("coding/humaneval-v0")
    firsts = [env.reset(seed=i, options={"task_index": i})[0]["main"] for i in range(4)]
    texts = [torch.as_tensor(o["observation"])[torch.as_tensor(o["attention_mask"]).bool()] for o in firsts]
    pad = policy.tokenizer.pad_token_id
    engine = policy.engine
    rows = []
    @contextlib.contextmanager
    def keys(way: str) -> Iterator[None]:
        engine.transposed_keys = way == "transposed"
        try:
            yield
        finally:
            engine.transposed_keys = True

    for what, prompt_rows in (("coding", texts), ("coding-2turn", [torch.cat([t, t]) for t in texts])):
        prompts = {"coder": left_padded(prompt_rows, pad)}
        produced: dict[str, int] = {}

        def run(way: str, prompts: dict = prompts, produced: dict = produced) -> None:
            out = policy.generate_joint(prompts, 4, max_new_tokens=max_new_tokens, temperature=0.7,
                                        seeds=list(range(4)))["coder"]
            produced[way] = int(out.response_mask.sum())

        timed_ways = in_turns({way: {"s": functools.partial(run, way)} for way in ("transposed", "grouped")}, repeats,
                              around=keys, measure=cpu_seconds)
        medians = {way: figures["s"] for way, figures in timed_ways.items()}
        rows.append({"pass": "generate", "what": what, "dtype": str(dtype).removeprefix("torch."), "rows": 16,
                     "prompt_tokens": int(prompts["coder"][1].sum(1).max()), "max_new_tokens": max_new_tokens,
                     "tokens": produced, **{f"{way}_cpu_s": round(v, 2) for way, v in medians.items()},
                     "transposed_over_grouped": round(medians["grouped"] / medians["transposed"], 2)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2, help="calls a timing of the training row")
    parser.add_argument("--generate", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the engine's whole generate with its keys transposed and not")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="new tokens a row in the generate rows")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    gbps = copy_gbps(args.repeats)
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for n, q_len, length in ((16, 1, 48), (16, 1, 128), (16, 1, 300), (16, 1, 600), (32, 1, 600), (8, 640, 640)):
            rows.append(decode_row(dtype, n, length, gbps, args.repeats) if q_len == 1
                        else training_row(dtype, n, length, gbps, args.calls, args.repeats))
            print(json.dumps(rows[-1]), flush=True)
    if args.generate:
        rows += generate_rows(args.repeats, args.max_new_tokens)
    machine = machine_description("auto")
    machine["threads"] = args.threads
    print(json.dumps({"bench": "attention", "copy_gbps": round(gbps, 1), "rows": rows, "machine": machine}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
