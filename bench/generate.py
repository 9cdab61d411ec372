"""Rollout speed of agents.MultiAgentPolicy on the embedded default model, against plain ``generate``
and against the hardware's limit, all measured in one run.

The work: 2 agents x 4 chat prompts x 4 samples x 48 new tokens, temperature 0.7, top-p 0.9, top-k 50.

- ``baseline``: plain fp32 ``model.generate`` (no adapters), run once per agent on the same rows:
  what a two-model MAGRPO (the reference) pays per rollout.
- ``ours``: ``policy.generate_joint`` with the defaults (the rollout engine, agents/engine.py: both
  agents' rows in one decode loop, each with its LoRA adapter; the base in the default dtype).
- ``ours_fp32`` / ``ours_bf16``: the engine with the base in each precision.
- ``generate_backend``: the policy through transformers' ``generate`` (``backend="generate"``, fp32,
  one call per agent): what the learners did before the engine.
- ``limit_ms_per_step``: a bare decode loop (KV cache, arg-max, no adapters, no sampling) with the
  same 32 rows over the base in float32 and in bfloat16, the faster of the two: the cost of a decode
  step on this machine without any machinery (bf16 on CPUs that multiply it natively; float32 on
  AVX2-only CPUs, where bf16 is emulated and ~3x slower). ``limit_dtype`` says which.

Tokens per second count the response tokens each path produced (up to and including EOS), best of
``--repeats`` runs. ``ratio`` = ours / baseline; ``fraction_of_limit`` = limit ms/step / ours ms/step.
Prints one JSON object on its last line.

    python bench/generate.py [--prompts 4] [--samples 4] [--max-new-tokens 48] [--repeats 3] [--device cuda]
                             [--shape 135m|360m|1.7b]

``--device`` runs every path there (default: a GPU when present); ``--shape`` replaces the embedded model by
random weights of one of SmolLM2's shapes (agents.models.shaped_model), for machines without the weights.
On a GPU the float32 paths run in float32 too, and the engine's default decodes through its CUDA graph.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agents import LoraSettings, MultiAgentPolicy, load_model
from agents.models import SHAPES, device_description, machine_description, resolve_device, shaped_model
from llm_envs.tokenizers import load_tokenizer

QUESTIONS = [
    "Write a short poem about the sea.",
    "Explain what a prime number is.",
    "Give me three tips for writing clean Python code.",
    "Summarise the plot of Romeo and Juliet in two sentences.",
    "What is the difference between a list and a tuple?",
    "Describe a sunset to someone who has never seen one.",
    "Why is the sky blue?",
    "Suggest a name for a friendly robot.",
]
SAMPLING = dict(temperature=0.7, top_p=0.9, top_k=50)
AGENTS = ("helper", "main")


def prompts(tokenizer, n: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in (QUESTIONS * (n // len(QUESTIONS) + 1))[:n]
    ]
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    return enc.input_ids.to(device), enc.attention_mask.to(device)


def timed(fn, repeats: int) -> dict[str, float]:
    """Runs ``fn`` (returns (tokens, decode steps)) ``repeats`` times after one warm-up (on a GPU, each
    run ends when the device has finished: ``fn`` reads its counts from device tensors)."""
    fn()
    runs = []
    for seed in range(repeats):
        torch.manual_seed(seed)
        start = time.perf_counter()
        tokens, steps = fn()
        runs.append((time.perf_counter() - start, tokens, steps))
    best = max(runs, key=lambda r: r[1] / r[0])
    return {
        "tokens_per_s": round(best[1] / best[0], 1),
        "median_tokens_per_s": round(statistics.median(r[1] / r[0] for r in runs), 1),
        "ms_per_step": round(1000 * best[0] / max(best[2], 1), 1),
    }


def bare_loop_ms(model, ids: torch.Tensor, mask: torch.Tensor, steps: int, *, whole_call: bool = False) -> float:
    """ms per decode step of a plain KV-cache loop (forward + arg-max) over ``model``: the floor. With
    ``whole_call`` the prefill is timed too (as the engine's and ``generate``'s whole calls are), still
    over ``steps``."""
    from transformers import DynamicCache

    called = time.perf_counter()
    with torch.no_grad():
        cache = DynamicCache()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        attention = mask
        if ids.is_cuda:
            torch.cuda.synchronize(ids.device)
        start = called if whole_call else time.perf_counter()
        for _ in range(steps):
            attention = torch.cat([attention, torch.ones_like(token)], dim=1)
            positions = positions[:, -1:] + 1
            out = model(
                input_ids=token, attention_mask=attention, position_ids=positions, past_key_values=cache, use_cache=True
            )
            token = out.logits[:, -1].argmax(-1, keepdim=True)
        if ids.is_cuda:
            torch.cuda.synchronize(ids.device)
        return 1000 * (time.perf_counter() - start) / steps


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (tests/test_docs_commands.py parses the docs' command lines with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:<i> (default: a GPU when present)")
    parser.add_argument("--shape", default=None, choices=sorted(SHAPES),
                        help="random weights of one of SmolLM2's shapes instead of the embedded model")
    return parser


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    device = resolve_device(args.device)

    def model(dtype):
        if args.shape:
            return shaped_model(args.shape, dtype=dtype, device=device)
        return load_model(None, dtype=dtype, device=device)

    tokenizer = load_tokenizer(None)
    ids, mask = prompts(tokenizer, args.prompts, device)
    joint = {agent: (ids, mask) for agent in AGENTS}
    length = args.max_new_tokens

    def joint_run(policy):
        def run():
            gens = policy.generate_joint(joint, args.samples, max_new_tokens=length, **SAMPLING)
            tokens = sum(int(g.response_mask.sum()) for g in gens.values())
            return tokens, max(g.response_ids.shape[1] for g in gens.values())

        return run

    results: dict[str, object] = {
        "model": f"random weights of SmolLM2's {args.shape} shape" if args.shape
        else "SmolLM2-135M-Instruct (embedded default)",
        "device": str(device),
        "threads": torch.get_num_threads(),
        "agents": len(AGENTS),
        "prompts": args.prompts,
        "samples": args.samples,
        "rows": len(AGENTS) * args.prompts * args.samples,
        "prompt_tokens": int(mask.sum(1).max()),
        "max_new_tokens": length,
        "sampling": SAMPLING,
    }

    raw = model("float32")
    configured = raw.generation_config.eos_token_id
    configured = [configured] if isinstance(configured, int) else list(configured or [])
    eos = torch.tensor(sorted({tokenizer.eos_token_id, *configured}), device=device)
    rows, rows_mask = ids.repeat_interleave(args.samples, 0), mask.repeat_interleave(args.samples, 0)

    def baseline():
        tokens = steps = 0
        for _ in AGENTS:
            out = raw.generate(input_ids=rows, attention_mask=rows_mask, do_sample=True, max_new_tokens=length,
                               pad_token_id=tokenizer.pad_token_id, **SAMPLING)
            response = out[:, rows.shape[1]:]
            is_eos = torch.isin(response, eos).long()
            tokens += int(((is_eos.cumsum(-1) - is_eos) == 0).sum())
            steps += response.shape[1]
        return tokens, steps

    results["baseline"] = timed(baseline, args.repeats)

    paths = {
        "ours": dict(),
        "ours_fp32": dict(dtype="float32"),
        "ours_bf16": dict(dtype="bfloat16"),
        "generate_backend": dict(dtype="float32", backend="generate", mixed_batches=False),
    }
    for name, kwargs in paths.items():
        dtype = kwargs.pop("dtype", None)
        policy = MultiAgentPolicy(model(dtype), tokenizer, AGENTS, lora=LoraSettings(), **kwargs)
        results[name] = {**timed(joint_run(policy), args.repeats), "backend": policy.backend,
                         "dtype": str(policy.model.get_base_model().dtype).replace("torch.", "")}
    all_ids = ids.repeat(len(AGENTS), 1).repeat_interleave(args.samples, 0)
    all_mask = mask.repeat(len(AGENTS), 1).repeat_interleave(args.samples, 0)
    loops = {dtype: min(bare_loop_ms(model(dtype), all_ids, all_mask, length) for _ in range(2))
             for dtype in ("float32", "bfloat16")}
    limit_dtype = min(loops, key=loops.get)
    limit = loops[limit_dtype]
    results["bare_loop_ms_per_step"] = {k: round(v, 1) for k, v in loops.items()}
    results["limit_ms_per_step"] = round(limit, 1)
    results["limit_dtype"] = limit_dtype
    ours = results["ours"]
    results["ratio"] = round(ours["tokens_per_s"] / results["baseline"]["tokens_per_s"], 2)
    results["ratio_median"] = round(ours["median_tokens_per_s"] / results["baseline"]["median_tokens_per_s"], 2)
    results["ratio_vs_generate_backend"] = round(ours["tokens_per_s"] / results["generate_backend"]["tokens_per_s"], 2)
    results["fraction_of_limit"] = round(limit / ours["ms_per_step"], 2)
    results["machine"] = {**machine_description(ours["dtype"]), **device_description(device)}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
