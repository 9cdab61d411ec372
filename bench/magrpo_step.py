"""Time MAGRPO iterations: 2 agents, 8 problems x G=4, 48 new tokens, temperature 0.7, top-p 0.9, chat
template, embedded SmolLM2-135M-Instruct. Prints JSON: s_per_iteration (and its rollout and update parts),
samples_per_s, peak_rss_mb, peak_gpu_gib on CUDA, and the compiled update's seconds when it reports them.

    python bench/magrpo_step.py [--iterations 2] [--max-source-words 60] [--device cuda] [--shape 1.7b]
    python bench/magrpo_step.py --problems 1      # one prompt of 4 samples an iteration (issue #48's run)

One warm-up iteration is run first and not timed. Generation is one batched call per agent over all
problems and samples; log-probs are one batched forward per agent.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np
import torch

from agents import LoraSettings, MultiAgentPolicy
from agents.models import SHAPES, device_description, machine_description, resolve_device, shaped_model
from baselines.infra.play import rollout
from baselines.infra.rng import seed_everything
from baselines.learners.magrpo import Config
from baselines.rl.policy_gradient import discounted_returns, group_advantages, update_agent
from llm_envs.core.vector import VectorEnv


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--max-source-words", type=int, default=60)
    parser.add_argument("--problems", type=int, default=8, help="problems an iteration (G=4 samples each)")
    parser.add_argument("--micro-batch-tokens", type=int, default=Config.micro_batch_tokens,
                        help="the update's token budget per forward/backward (MAGRPO's --micro-batch-tokens)")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:<i> (default: a GPU when present)")
    parser.add_argument("--shape", default=None, choices=sorted(SHAPES),
                        help="random weights of one of SmolLM2's shapes instead of the embedded model")
    args = parser.parse_args()
    device = resolve_device(args.device)
    config = Config(num_problems=args.problems, num_generations=4, max_new_tokens=48, temperature=0.7, top_p=0.9,
                    max_source_words=args.max_source_words, progress=False, tensorboard=False,
                    micro_batch_tokens=args.micro_batch_tokens)
    rng = seed_everything(0)
    n = config.num_problems * config.num_generations
    venv = VectorEnv(config.env, n, max_new_tokens=config.max_new_tokens, **config.env_kwargs())
    agents = list(venv.possible_agents)
    lora = LoraSettings(rank=config.lora_rank)
    if args.shape:
        from llm_envs.tokenizers import load_tokenizer

        policy = MultiAgentPolicy(shaped_model(args.shape, device=device), load_tokenizer(None), agents, lora=lora,
                                  mixed_batches=False)
    else:
        policy = MultiAgentPolicy.from_pretrained(agents, lora=lora, mixed_batches=False, device=device)
    optimizers = {a: policy.optimizer(a, lr=config.learning_rate) for a in agents}
    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    times, rollout_times, first = [], [], None
    # Each iteration's compiled-update counters (``update_compile_s``, ``update_compiled_shapes``: what
    # baselines/rl/compiled_update.py adds to update_agent's stats, summed over agents as its charts are), if any.
    compiling: list[dict[str, float]] = []
    for it in range(args.iterations + 1):
        t0 = time.perf_counter()
        problems = rng.choice(len(venv.envs[0].task.problems("train")), size=config.num_problems, replace=False)
        options = [{"task_index": int(p)} for p in problems for _ in range(config.num_generations)]
        turns = rollout(policy, venv, [it * n + i for i in range(n)], options, config)
        synchronize()
        t1 = time.perf_counter()
        compiling.append({})
        for agent in agents:
            returns = discounted_returns(torch.tensor(turns[0].rewards[agent], dtype=torch.float32)[:, None], 1.0)
            adv = group_advantages(returns[:, 0].view(config.num_problems, -1)).reshape(-1, 1)
            stats = update_agent(policy, optimizers[agent], agent, turns, adv, config) or {}
            for key, value in stats.items():
                if key.startswith("update_compile"):
                    compiling[-1][key] = compiling[-1].get(key, 0.0) + float(value)
        synchronize()
        if it > 0:
            times.append(time.perf_counter() - t0)
            rollout_times.append(t1 - t0)
        else:
            first = time.perf_counter() - t0
    s_per_it = float(np.mean(times))
    rollout_s = float(np.mean(rollout_times))
    compile_keys = sorted({key for stats in compiling for key in stats})
    print(json.dumps({
        "bench": "magrpo_step",
        "s_per_iteration": round(s_per_it, 3),
        "rollout_s": round(rollout_s, 3), "update_s": round(s_per_it - rollout_s, 3),
        "first_iteration_s": round(first or 0.0, 2),
        "samples_per_s": round(n / s_per_it, 3),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "agents": len(agents), "problems": config.num_problems, "G": config.num_generations,
        "max_new_tokens": config.max_new_tokens, "micro_batch_tokens": config.micro_batch_tokens,
        "threads": torch.get_num_threads(),
        "device": str(device), "shape": args.shape or "default (SmolLM2-135M-Instruct)",
        "peak_gpu_gib": round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None,
        # The compiled update's counters: the untimed first iteration's, and the mean of the timed ones.
        "update_compile": {key: {"first": compiling[0].get(key),
                                 "mean_after": round(float(np.mean([s.get(key, 0.0) for s in compiling[1:]])), 4)
                                 if compiling[1:] else None}
                           for key in compile_keys},
        "machine": {**machine_description(policy.model.get_base_model().dtype), **device_description(device)},
    }))


if __name__ == "__main__":
    main()
