"""Milliseconds per decode step on the embedded SmolLM2-135M (40-token chat prompts, KV cache, 48 steps):
the bare loop (model forward with the cache and arg-max, no ``generate`` machinery), timed over its steps
alone and over the whole call (its prefill included), plain ``model.generate`` (greedy) and the rollout
engine (two LoRA adapters, half the rows each, sampling at temperature 0.7 / top-p 0.9 / top-k 50), both
whole calls, each in float32 and bfloat16, for 4, 8, 16 and 32 rows. A whole call's figure is its time
over its steps: the engine's and ``generate``'s include their prefill, so the engine's like for like is
the bare loop's whole call (``engine_over_bare``; ``engine_over_bare_steps`` against its steps alone).
The paths of a row count take turns, a run each (the first round a warm-up, not counted; each run
seeded alike), and each figure is the median of ``--repeats`` rounds: timed one path after another, the
first paid for the process's first passes. Prints one JSON object on its last line.

    python bench/decode_table.py [--rows 4 8 16 32] [--repeats 3] [--dtypes float32 bfloat16]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from attention_training import in_turns
from generate import QUESTIONS, bare_loop_ms

from agents import LoraSettings, MultiAgentPolicy, load_model
from agents.models import SHAPES, device_description, machine_description, resolve_device, shaped_model
from llm_envs.tokenizers import load_tokenizer

STEPS = 48


def chat_prompts(tokenizer, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in (QUESTIONS * (n // len(QUESTIONS) + 1))[:n]
    ]
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    return enc.input_ids, enc.attention_mask


def seeded(fn: Callable[[], float]) -> float:
    """What ``fn`` returns (its ms a step), with torch's global generator seeded alike for every call."""
    torch.manual_seed(0)
    return fn()


def generate_ms(model, tokenizer, ids: torch.Tensor, mask: torch.Tensor) -> float:
    start = time.perf_counter()
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=STEPS,
                         min_new_tokens=STEPS, pad_token_id=tokenizer.pad_token_id)
    return 1000 * (time.perf_counter() - start) / (out.shape[1] - ids.shape[1])  # shape: waits for the device


def engine_ms(policy, prompts) -> float:
    start = time.perf_counter()
    gens = policy.generate_joint(prompts, 1, max_new_tokens=STEPS, temperature=0.7, top_p=0.9, top_k=50)
    steps = max(g.response_ids.shape[1] for g in gens.values())  # trimmed to the longest row: waits for the device
    return 1000 * (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:<i> (default: a GPU when present)")
    parser.add_argument("--shape", default=None, choices=sorted(SHAPES),
                        help="random weights of one of SmolLM2's shapes instead of the embedded model")
    args = parser.parse_args()
    device = resolve_device(args.device)

    def base(dtype: str):
        if args.shape:
            return shaped_model(args.shape, dtype=dtype, device=device)
        return load_model(None, dtype=dtype, device=device)

    tokenizer = load_tokenizer(None)
    table: dict[str, dict[int, float]] = {}
    for dtype in args.dtypes:
        model = base(dtype)
        policy = MultiAgentPolicy(base(dtype), tokenizer, ["helper", "main"], lora=LoraSettings())
        for rows in args.rows:
            ids, mask = (t.to(device) for t in chat_prompts(tokenizer, rows))

            half = max(rows // 2, 1)
            prompts = {"helper": (ids[:half], mask[:half]), "main": (ids[half:], mask[half:])}
            runs = (
                ("bare loop", functools.partial(bare_loop_ms, model, ids, mask, STEPS)),
                ("bare loop, prefill included",
                 functools.partial(bare_loop_ms, model, ids, mask, STEPS, whole_call=True)),
                ("model.generate", functools.partial(generate_ms, model, tokenizer, ids, mask)),
                ("engine, 2 adapters", functools.partial(engine_ms, policy, prompts)),
            )
            medians = in_turns({name: {"ms": fn} for name, fn in runs}, args.repeats, measure=seeded)
            for name, ms in medians.items():
                table.setdefault(f"{dtype} {name}", {})[rows] = round(ms["ms"], 1)
            print(json.dumps({dtype: {k: v for k, v in table.items() if k.startswith(dtype)}}), file=sys.stderr)
    ratios = {name: {dtype: {rows: round(ms / table[f"{dtype} {bare}"][rows], 3)
                             for rows, ms in table[f"{dtype} engine, 2 adapters"].items()}
                     for dtype in args.dtypes}
              for name, bare in (("engine_over_bare", "bare loop, prefill included"),
                                 ("engine_over_bare_steps", "bare loop"))}
    print(json.dumps({"ms_per_step": table, **ratios, "prompt_tokens": int(chat_prompts(tokenizer, 8)[1].sum(1).max()),
                      "steps": STEPS, "threads": torch.get_num_threads(), "device": str(device),
                      "shape": args.shape or "default (SmolLM2-135M-Instruct)",
                      "machine": {**machine_description(" and ".join(args.dtypes) + " (one table each)"),
                                  **device_description(device)}}))


if __name__ == "__main__":
    main()
