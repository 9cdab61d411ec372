"""Milliseconds per decode step of the rollout engine (dynamic loop, static step, CUDA graph), against a
bare transformers KV-cache loop, per-agent ``generate`` (what a two-model MAGRPO pays) and the floor:
the model's weights read once at the device's measured bandwidth.

The work: 2 agents (each its own LoRA adapter, rank 8), chat prompts, G=4 samples a prompt, ``--rows``
sample rows in all, temperature 0.7 / top-p 0.9 / top-k 50, ``--max-new-tokens`` new tokens.
``--shape`` builds a random-weight model of SmolLM2's shapes (its rows never meet EOS, so every row
decodes to the end); without it, the embedded default model (its rows stop at EOS: ms/step then counts
steps that ran).

- ``ms_per_step``: steady decode, ``(t(T) - t(S)) / (T - S)`` from calls of T and S new tokens, S = 8 or
  T // 2 when T < 16 (the prefill and per-call set-up cancel out), median of ``--repeats``;
- ``call_ms_per_step``: a whole call of T tokens over T;
- ``first_call_s``: the first call of a shape (a graph's capture, a compile, allocations included).

Prints one JSON object on its last line (device, GPU or CPU model and ISA flags, dtype, shape, rows).

    python bench/decode_step.py [--device cuda] [--shape 135m] [--rows 32 256] [--max-new-tokens 48]
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from generate import QUESTIONS

from agents import LoraSettings, MultiAgentPolicy, load_model
from agents.models import SHAPES, device_description, machine_description, resolve_device, resolve_dtype, shaped_model
from llm_envs.tokenizers import load_tokenizer

AGENTS = ("helper", "main")
SAMPLES = 4
SAMPLING = dict(temperature=0.7, top_p=0.9, top_k=50)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def clock(fn, device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def bandwidth_gb_s(device: torch.device) -> float:
    """Bytes a copy moves (read + write) per second, best of a few: 1 GiB on a GPU, 256 MiB on a CPU."""
    size = (1 << 30) if device.type == "cuda" else (256 << 20)
    src = torch.empty(size // 4, dtype=torch.float32, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    best = min(clock(lambda: dst.copy_(src), device) for _ in range(5))
    return 2 * size / best / 1e9


def prompts(tokenizer, n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in (QUESTIONS * (n // len(QUESTIONS) + 1))[:n]
    ]
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    return enc.input_ids.to(device), enc.attention_mask.to(device)


def bare_loop_ms(model, ids: torch.Tensor, mask: torch.Tensor, steps: int) -> float:
    """ms per step of a plain transformers KV-cache loop (forward + arg-max) over ``model``."""
    from transformers import DynamicCache

    device = ids.device
    with torch.no_grad():
        cache = DynamicCache()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        attention = mask
        sync(device)
        start = time.perf_counter()
        for _ in range(steps):
            attention = torch.cat([attention, torch.ones_like(token)], dim=1)
            positions = positions[:, -1:] + 1
            out = model(input_ids=token, attention_mask=attention, position_ids=positions, past_key_values=cache,
                        use_cache=True)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
        sync(device)
        return 1000 * (time.perf_counter() - start) / steps


def profile_step(policy, device: torch.device, steps: int = 5) -> dict[str, object]:
    """Kernels one eager static step launches, and their summed device time (ms): what a replayed graph
    of the step costs at least (graph replay removes the launches, not the kernels)."""
    from torch.profiler import ProfilerActivity, profile

    (static,) = [s for s in policy.engine._static.values() if not s.key.compiled][:1] or [None]
    if static is None:
        return {"error": "no static decoder was built (run a static or graph mode first)"}
    activity = ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU
    static.t.zero_()
    with torch.no_grad():
        static.step()
        sync(device)
        with profile(activities=[activity]) as prof:
            for _ in range(steps):
                static.step()
            sync(device)
    events = [e for e in prof.events() if e.device_type == (torch.autograd.DeviceType.CUDA if device.type == "cuda"
                                                            else torch.autograd.DeviceType.CPU)]
    kernels = [e for e in events if device.type != "cuda" or e.device_type == torch.autograd.DeviceType.CUDA]
    total_us = sum(e.device_time if device.type == "cuda" else e.cpu_time for e in kernels)
    by_name: dict[str, float] = {}
    for e in kernels:
        by_name[e.name] = by_name.get(e.name, 0.0) + (e.device_time if device.type == "cuda" else e.cpu_time)
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:8]
    return {
        "kernels_per_step": round(len(kernels) / steps, 1),
        "kernel_ms_per_step": round(total_us / 1000 / steps, 3),
        "top": [(name[:60], round(us / 1000 / steps, 3)) for name, us in top],
    }


def short_length(length: int) -> int:
    """The shorter call's new tokens S: 8, or ``length // 2`` when ``length`` < 16 (S < T always).

    >>> short_length(48), short_length(16), short_length(8), short_length(2)
    (8, 8, 4, 1)
    """
    return min(8, length // 2)


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (tests/test_docs_commands.py parses the docs' command lines with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:<i> (default: a GPU when present)")
    parser.add_argument("--dtype", default=None, help="float32 / bfloat16 (default: bfloat16 on a GPU, else auto)")
    parser.add_argument("--shape", default=None, choices=sorted(SHAPES), help="random weights of SmolLM2's shape")
    parser.add_argument("--rows", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--modes", nargs="+", default=None, help="engine decode modes: dynamic, static, graph, "
                        "a mode+compile (default: dynamic, and graph on CUDA)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true",
                        help="kernels a static step launches and their summed device time (torch.profiler)")
    parser.add_argument("--no-baselines", action="store_true", help="skip the bare loop and per-agent generate")
    return parser


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    if args.max_new_tokens < 2:
        parser.error(f"--max-new-tokens must be >= 2 (ms per step compares calls of two lengths), "
                     f"got {args.max_new_tokens}")
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    modes = args.modes or (["dynamic", "graph"] if device.type == "cuda" else ["dynamic", "static"])
    tokenizer = load_tokenizer(None)

    def base():
        if args.shape:
            return shaped_model(args.shape, dtype=dtype, device=device)
        return load_model(None, dtype=dtype, device=device)

    model = base()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bandwidth = bandwidth_gb_s(device)
    floor_ms = 1000 * weight_bytes / (bandwidth * 1e9)
    policy = MultiAgentPolicy(model, tokenizer, AGENTS, lora=LoraSettings(rank=8))
    with torch.no_grad():  # non-zero adapters: the LoRA work is real
        for agent in AGENTS:
            for param in policy.parameters(agent):
                param.normal_(0.0, 0.01)
    length = args.max_new_tokens
    short = short_length(length)
    table = []
    for rows in args.rows:
        per_agent = max(1, rows // (len(AGENTS) * SAMPLES))
        ids, mask = prompts(tokenizer, per_agent, device)
        joint = {a: (ids, mask) for a in AGENTS}
        entry: dict[str, object] = {"rows": per_agent * SAMPLES * len(AGENTS), "prompt_tokens": int(mask.sum(1).max())}

        def call(tokens: int, joint=joint) -> None:
            policy.generate_joint(joint, SAMPLES, max_new_tokens=tokens, **SAMPLING)

        for mode in modes:
            policy.engine.decode = mode.removesuffix("+compile")
            policy.engine.compile_step = mode.endswith("+compile")
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            first = clock(lambda: call(length), device)
            longs, shorts = [], []
            for _ in range(args.repeats):
                longs.append(clock(lambda: call(length), device))
                shorts.append(clock(lambda: call(short), device))
            step_ms = 1000 * (statistics.median(longs) - statistics.median(shorts)) / (length - short)
            entry[mode] = {
                "ms_per_step": round(step_ms, 2),
                "call_ms_per_step": round(1000 * statistics.median(longs) / length, 2),
                "first_call_s": round(first, 2),
                "fallback": policy.engine.last_fallback,
            }
            if device.type == "cuda":
                entry[mode]["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        policy.engine.decode, policy.engine.compile_step = "auto", False
        if args.profile:
            entry["profile"] = profile_step(policy, device)
        fastest = min(entry[m]["ms_per_step"] for m in modes)
        entry["floor_ms"] = round(floor_ms, 3)
        entry["fraction_of_floor"] = round(floor_ms / fastest, 3)
        if not args.no_baselines:
            all_ids = ids.repeat(len(AGENTS), 1).repeat_interleave(SAMPLES, 0)
            all_mask = mask.repeat(len(AGENTS), 1).repeat_interleave(SAMPLES, 0)
            raw = policy.model.get_base_model()
            entry["bare_loop_ms"] = round(min(bare_loop_ms(raw, all_ids, all_mask, length) for _ in range(2)), 2)
            rows_ids, rows_mask = ids.repeat_interleave(SAMPLES, 0), mask.repeat_interleave(SAMPLES, 0)

            def per_agent_generate(raw=raw, rows_ids=rows_ids, rows_mask=rows_mask) -> None:
                with torch.no_grad():
                    for _ in AGENTS:
                        raw.generate(input_ids=rows_ids, attention_mask=rows_mask, do_sample=True,
                                     max_new_tokens=length, min_new_tokens=length,
                                     pad_token_id=tokenizer.pad_token_id, **SAMPLING)

            with policy.model.disable_adapter():
                per_agent_generate()
                seconds = statistics.median(clock(per_agent_generate, device) for _ in range(2))
            tokens = len(AGENTS) * len(rows_ids) * length
            entry["per_agent_generate_tok_s"] = round(tokens / seconds, 1)
            best_mode = min(modes, key=lambda m: entry[m]["call_ms_per_step"])
            ours_tok_s = entry["rows"] * 1000 / entry[best_mode]["call_ms_per_step"]
            entry["engine_tok_s"] = round(ours_tok_s, 1)
            entry["speedup_vs_per_agent_generate"] = round(ours_tok_s / (tokens / seconds), 2)
        table.append(entry)
        print(json.dumps(entry), flush=True)
    result = {
        "bench": "decode_step",
        "device": str(device),
        "shape": args.shape or "default (SmolLM2-135M-Instruct)",
        "dtype": str(dtype).replace("torch.", ""),
        "weights_mb": round(weight_bytes / 1e6, 1),
        "bandwidth_gb_s": round(bandwidth, 1),
        "max_new_tokens": length,
        "sampling": SAMPLING,
        "table": table,
        "machine": {**machine_description(dtype), **device_description(device)},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
