"""The floor of a fused scoring/training pass on this machine: the base's matmuls alone.

SmolLM2-135M's four projections of each of its 30 layers (fused q/k/v 576 -> 960, o 576 -> 576, fused
gate/up 576 -> 3072, down 1536 -> 576), each layer with its own weights so that nothing stays in cache
between layers, as in a real pass: the forward's ``x @ W.T`` and the backward's ``grad @ W`` (the
input gradient; a frozen base has no weight gradient) for several row counts, in the model's dtype.
A pass over that many packed positions cannot take less than these (docs/agents.md compares).
Medians of ``--repeats`` runs; prints one JSON object on its last line.

    python bench/gemm_floor.py [--rows 64 256 344 512 768] [--dtype auto] [--repeats 9]

``--dtype auto`` (the default) is the dtype the learners pick here (``agents.models.resolve_dtype``:
bfloat16 where the CPU multiplies it natively, float32 elsewhere), so the floor is this machine's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from agents.models import machine_description, resolve_dtype

LAYERS = 30
SHAPES = ((576, 960), (576, 576), (576, 3072), (1536, 576))  # (in, out) of each projection


def timed(fn, repeats: int) -> float:
    fn()  # warm: oneDNN builds its primitives on first use
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 256, 344, 512, 768])
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    dtype = resolve_dtype(None if args.dtype == "auto" else args.dtype, torch.device("cpu"))
    args.dtype = str(dtype).removeprefix("torch.")
    weights = [[torch.randn(o, i, dtype=dtype) for i, o in SHAPES] for _ in range(LAYERS)]
    result: dict[str, object] = {"dtype": args.dtype, "threads": torch.get_num_threads(), "layers": LAYERS,
                                 "machine": machine_description(dtype)}
    for rows in args.rows:
        xs = [torch.randn(rows, i, dtype=dtype) for i, _ in SHAPES]
        grads = [torch.randn(rows, o, dtype=dtype) for _, o in SHAPES]

        def forward(xs=xs) -> None:
            for layer in weights:
                for x, w in zip(xs, layer):
                    torch.nn.functional.linear(x, w)

        def backward(grads=grads) -> None:
            for layer in weights:
                for g, w in zip(grads, layer):
                    g @ w

        flops = 2 * rows * sum(i * o for i, o in SHAPES) * LAYERS
        t_fwd, t_bwd = timed(forward, args.repeats), timed(backward, args.repeats)
        result[str(rows)] = {"forward_ms": round(t_fwd * 1e3, 1), "backward_ms": round(t_bwd * 1e3, 1),
                             "forward_tflops": round(flops / t_fwd / 1e12, 2),
                             "backward_tflops": round(flops / t_bwd / 1e12, 2)}
        print(f"{rows} rows: forward {t_fwd * 1e3:.1f} ms, backward {t_bwd * 1e3:.1f} ms", flush=True)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
