"""Attention over grouped KV heads on this machine: ``scaled_dot_product_attention(enable_gqa=True)``
against :func:`agents.attention.grouped_attention` (the query heads folded into the query length) and
the limit, the keys and values read once at this machine's copy bandwidth. The engine's decode shapes of
the embedded SmolLM2-135M (9 query heads, 3 KV heads, head size 64; one query per row) with the cached
lengths of a coding rollout, and a training pass's full-sequence causal shape; bfloat16 and float32.
Each figure is the median of ``--repeats`` timings of ``--calls`` calls. Prints one JSON object on its
last line.

    python bench/attention.py [--threads 1] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents.attention import grouped_attention
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    heads, kv_heads, dim = 9, 3, 64
    gbps = copy_gbps(args.repeats)
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        for name, n, q_len, length in (("decode", 16, 1, 300), ("decode", 16, 1, 600), ("decode", 32, 1, 600),
                                       ("training", 8, 640, 640)):
            q = torch.randn(n, heads, q_len, dim, dtype=dtype)
            k = torch.randn(n, kv_heads, length, dim, dtype=dtype)
            v = torch.randn(n, kv_heads, length, dim, dtype=dtype)
            if q_len == 1:
                mask = torch.rand(n, 1, 1, length) > 0.1
            else:
                mask = torch.ones(length, length, dtype=torch.bool).tril()[None, None].expand(n, 1, -1, -1)
            calls = args.calls if q_len == 1 else 2
            gqa = timed(lambda q=q, k=k, v=v, m=mask: F.scaled_dot_product_attention(q, k, v, attn_mask=m,
                                                                                       enable_gqa=True),
                        calls, args.repeats)
            ours = timed(lambda q=q, k=k, v=v, m=mask: grouped_attention(q, k, v, m), calls, args.repeats)
            difference = (grouped_attention(q, k, v, mask).float()
                          - F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).float())
            kv_bytes = 2 * k.numel() * k.element_size()
            limit = kv_bytes / (gbps / 2 * 1e9) * 1e3  # the cache read once, at half the copy's traffic
            rows.append({"pass": name, "dtype": str(dtype).removeprefix("torch."), "rows": n, "queries": q_len,
                         "keys": length, "enable_gqa_ms": round(gqa, 3), "grouped_ms": round(ours, 3),
                         "speedup": round(gqa / ours, 2), "limit_ms": round(limit, 3),
                         "grouped_fraction_of_limit": round(limit / ours, 3),
                         "max_abs_difference": float(difference.abs().max())})
            print(json.dumps(rows[-1]), flush=True)
    machine = machine_description("auto")
    machine["threads"] = args.threads
    print(json.dumps({"bench": "attention", "copy_gbps": round(gbps, 1), "rows": rows, "machine": machine}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
