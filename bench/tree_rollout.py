"""Tree rollouts cost no more per response than linear ones: responses generated per second through the
rollout engine, MAGRPO's tree rollout (baselines/rl/tree.py) against linear rollouts of the same number of
responses.

Shape: 2 agents (writing/xsum-v0, sources cut to 12 words), 2 turns, the embedded SmolLM2-135M-Instruct
through ``MultiAgentPolicy`` with the default backend, ``--max-new-tokens`` (32) at temperature 0.7 /
top-p 0.9, no update.

- ``tree``: 1 problem, G=4, aligned: 4 + 16 = 20 responses per agent (one ``generate_joint`` per level:
  4 rows per agent, then 16).
- ``linear``: 1 problem, G=10 episodes x 2 turns = 20 responses per agent (10 rows per agent per turn).

Both are timed end to end (env resets, copies and steps included), alternating, ``--repeats`` times
each after one warm-up of each; the figures are medians. Prints one JSON object on its last line.

    python bench/tree_rollout.py [--repeats 5] [--max-new-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from agents import LoraSettings, MultiAgentPolicy
from agents.models import machine_description
from baselines.infra.play import rollout
from baselines.learners import magrpo
from baselines.rl import tree
from llm_envs.core.vector import VectorEnv

ENV = "writing/xsum-v0"
TREE_G, LINEAR_G, TURNS = 4, 10, 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:<i> (default: a GPU when present)")
    args = parser.parse_args()
    torch.manual_seed(0)
    env_kwargs = dict(num_turns=TURNS, max_source_words=12, max_new_tokens=args.max_new_tokens)
    policy = MultiAgentPolicy.from_pretrained(["brief", "detailed"], lora=LoraSettings(rank=8, alpha=16.0),
                                              device=args.device)
    env_kwargs["stop_token_ids"] = list(policy.eos_token_ids)
    linear_envs = VectorEnv(ENV, LINEAR_G, **env_kwargs)
    template = VectorEnv(ENV, 1, **env_kwargs).envs[0]
    sampling = dict(max_new_tokens=args.max_new_tokens, temperature=0.7, top_p=0.9, top_k=50)
    config = magrpo.Config(num_turns=TURNS, num_generations=LINEAR_G, max_new_tokens=args.max_new_tokens,
                           temperature=0.7, top_p=0.9, top_k=50)

    def run_tree(i: int) -> int:
        levels = tree.rollout_tree(policy, template, [i], [{"task_index": i}], num_generations=TREE_G,
                                   sampling=sampling)
        return tree.count_responses(levels)

    def run_linear(i: int) -> int:
        turns = rollout(policy, linear_envs, [i] * LINEAR_G, [{"task_index": i}] * LINEAR_G, config)
        return sum(int(t.responses[a].response_ids.shape[0]) for t in turns for a in t.responses)

    paths = {"tree": run_tree, "linear": run_linear}
    samples: dict[str, list[float]] = {name: [] for name in paths}
    responses: dict[str, int] = {}
    with torch.no_grad():
        for fn in paths.values():
            fn(0)  # warm-up
        for r in range(args.repeats):
            for name, fn in paths.items():
                start = time.perf_counter()
                responses[name] = fn(r + 1)
                samples[name].append(responses[name] / (time.perf_counter() - start))
    assert responses["tree"] == responses["linear"], responses
    result = {
        "bench": "tree_rollout",
        "responses_per_rollout": responses["tree"],
        "max_new_tokens": args.max_new_tokens,
        "repeats": args.repeats,
        "tree_responses_per_s": round(statistics.median(samples["tree"]), 2),
        "linear_responses_per_s": round(statistics.median(samples["linear"]), 2),
        "backend": policy.backend,
        "machine": machine_description(policy.model.get_base_model().dtype),
    }
    result["ratio_tree_vs_linear"] = round(result["tree_responses_per_s"] / result["linear_responses_per_s"], 3)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
