"""Iteration cost of a team of two base models (issue #28): no overhead for being a team, and the
shared base stays the faster team. Prints one JSON object on its last line.

(a) ``team_two_bases``: one MAGRPO iteration (rollout through the env, then each agent's update) of
    a team whose agents sit on two different bases: A, the embedded SmolLM2-135M-Instruct
    (``agents.models.load_model(None)``), and B, a model of the same config with other random weights
    (``from_config``, seeded; A's tokenizer and generation config). Against it, each base's
    single-agent iteration, run one after the other in the same script: the same env, prompts and
    seeds, the agent's own rows generated and updated, the other role answered with one EOS token
    and no model (so a single iteration does the env's work once more, never less).
    ``ratio = team / (single_a + single_b)``; target <= 1.05.
(b) ``team_shared_base``: two LoRA agents on one copy of A (their rows decode together) against
    ``team_two_copies``: the same two agents on two copies of A (two groups, one after the other).
    ``ratio = shared / two_copies``; the shared base must be the faster (< 1).
(c) ``--learner maac`` (issue #52), instead of (a) and (b): MAAC iterations (``maac.main``: rollout,
    the critic's old values, each actor's update, the critic's update) of a team of two tokenizers:
    ``brief`` on A, ``detailed`` on a model of A's config over a byte-level BPE of ``--vocab`` 8192 ids
    trained here on the env's train sources (random weights). The critic sits on A and reads
    ``detailed``'s prompts and responses as text in A's tokens: ``reencode_fraction`` is the share of
    an iteration spent decoding and re-encoding them (``charts/critic_reencode_fraction``, timed inside
    the loop), a median over the timed iterations; target <= 0.05.

Settings (the same for every variant): writing/xsum-v0, sources cut to ``--max-source-words`` 40,
``--problems`` 1 x G=``--generations`` 4 rows per agent, ``--max-new-tokens`` 16, temperature 0.7,
top-p 0.9, MAGRPO's defaults otherwise (LoRA rank, learning rate, epochs, micro-batches); sampling seeded
per problem group (``distributed.group_seed``) so that every variant samples the same responses from
the same weights. Each variant starts from fresh adapters on copies of the same weights; variants run
interleaved, iteration by iteration, so that drift in the machine's load hits them alike. Figures are
medians over ``--iterations`` 3 timed iterations after ``--warmup`` 1 untimed one.

    python bench/team.py [--iterations 3] [--warmup 1] [--max-new-tokens 16] [--problems 1] [--threads N]
    python bench/team.py --learner maac [--vocab 8192] [...]
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from agents import Generation, LoraSettings, MultiAgentPolicy
from agents.models import load_model, machine_description
from baselines.infra.play import rollout, team_env_kwargs
from baselines.learners.magrpo import Config
from baselines.rl.policy_gradient import discounted_returns, group_advantages, update_agent
from llm_envs.core.vector import VectorEnv
from llm_envs.tokenizers import load_tokenizer

AGENTS = ("brief", "detailed")


class Solo:
    """One agent of the env played by ``policy``; the other roles answer one EOS token, without a model."""

    def __init__(self, policy: MultiAgentPolicy, agent: str) -> None:
        self.policy, self.agent = policy, agent

    def pad_token_id_of(self, agent: str) -> int:
        return self.policy.pad_token_id_of(self.agent)

    def generate_joint(self, prompts: Mapping[str, Any], num_samples: int = 1, **kwargs: Any) -> dict[str, Any]:
        out = self.policy.generate_joint({self.agent: prompts[self.agent]}, num_samples, **kwargs)
        eos = self.policy.eos_token_ids_of(self.agent)[0]
        for other, (ids, mask) in prompts.items():
            if other != self.agent:
                n = len(ids) * num_samples
                out[other] = Generation(other, num_samples, ids, mask, torch.full((n, 1), eos),
                                        torch.ones(n, 1, dtype=torch.long), torch.zeros(n, 1))
        return out


def iteration(policy: Any, trained: Mapping[str, MultiAgentPolicy], optimizers: Mapping[str, Any], venv: Any,
              config: Config, it: int) -> float:
    """Seconds of one MAGRPO iteration: rollout, then each trained agent's update."""
    n = config.num_problems * config.num_generations
    options = [{"task_index": p} for p in range(config.num_problems) for _ in range(config.num_generations)]
    start = time.perf_counter()
    turns = rollout(policy, venv, [it * n + i for i in range(n)], options, config,
                    groups=list(range(config.num_problems)), iteration=it)
    for agent, owner in trained.items():
        returns = discounted_returns(torch.tensor(turns[0].rewards[agent], dtype=torch.float32)[:, None], 1.0)
        advantages = group_advantages(returns[:, 0].view(config.num_problems, -1)).reshape(-1, 1)
        update_agent(owner, optimizers[agent], agent, turns, advantages, config)
    return time.perf_counter() - start


def other_tokenizer_model(base: Any, vocab_size: int, texts: list[str], path: Path) -> str:
    """A directory holding a model of ``base``'s config (random weights, ``base``'s dtype) over a
    byte-level BPE of ``vocab_size`` ids trained on ``texts``: a base of another tokenizer family."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from tiny_models import byte_bpe  # the tests' BPE trainer (tests/tiny_models.py)

    tokenizer = byte_bpe(vocab_size, texts)
    tokenizer.save_pretrained(path)
    config = copy.deepcopy(base.config)
    config.vocab_size, config.pad_token_id = len(tokenizer), tokenizer.pad_token_id
    config.bos_token_id = config.eos_token_id = tokenizer.eos_token_id
    config.tie_word_embeddings = True
    config.save_pretrained(path)
    reloaded = AutoTokenizer.from_pretrained(path)  # as the learner loads it
    config.vocab_size = len(reloaded)
    torch.manual_seed(1)
    AutoModelForCausalLM.from_config(config).to(base.dtype).save_pretrained(path)
    return str(path)


def maac_row(args: argparse.Namespace) -> dict[str, Any]:
    """(c): MAAC iterations of a team of two tokenizers, and the share of each spent re-encoding."""
    import llm_envs
    from baselines.infra.metrics import read_metrics
    from baselines.learners import maac

    base = load_model(None, device=args.device)
    sources = [p["source"] for p in llm_envs.make("writing/xsum-v0").task.problems("train")]
    total = args.warmup + args.iterations
    with tempfile.TemporaryDirectory() as tmp:
        other = other_tokenizer_model(base, args.vocab, sources, Path(tmp) / "other")
        config = maac.Config(
            agent_models=(f"detailed={other}",), num_iterations=total, num_problems=args.problems,
            num_generations=args.generations, max_new_tokens=args.max_new_tokens,
            max_source_words=args.max_source_words, temperature=0.7, top_p=0.9, num_eval_problems=0,
            checkpoint_every=0, output_dir=tmp, run_name="maac", tensorboard=False, progress=False,
            threads=args.threads, device=args.device,
        )
        maac.main(config)
        rows = [r for r in read_metrics(Path(tmp) / "maac" / "metrics.jsonl") if "losses/value_loss" in r][args.warmup:]
    seconds = [r["charts/s_per_iteration"] for r in rows]
    fractions = [r["charts/critic_reencode_fraction"] for r in rows]
    return {
        "learner": "maac", "s_per_iteration": round(statistics.median(seconds), 3),
        "reencode_s": round(statistics.median(f * t for f, t in zip(fractions, seconds)), 5),
        "reencode_fraction": round(statistics.median(fractions), 5), "target": 0.05,
        "iterations": args.iterations, "warmup": args.warmup, "problems": args.problems, "G": args.generations,
        "max_new_tokens": args.max_new_tokens, "max_source_words": args.max_source_words,
        "models": ["SmolLM2-135M-Instruct", f"same config, random, byte-level BPE of {args.vocab} ids"],
        "machine": machine_description(base.dtype),
    }


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (tests/test_docs_commands.py parses the docs' command lines with it)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--problems", type=int, default=1)
    parser.add_argument("--generations", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--max-source-words", type=int, default=40)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's; on a machine shared with other jobs, fewer threads "
                             "than cores avoids the spinning of oversubscribed OpenMP threads)")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:<i> (default: a GPU when present)")
    parser.add_argument("--learner", choices=("magrpo", "maac"), default="magrpo",
                        help="magrpo: (a) and (b); maac: (c), a MAAC team of two tokenizers")
    parser.add_argument("--vocab", type=int, default=8192, help="(c): ids of the second tokenizer")
    return parser


def main() -> None:
    parser = build_parser()
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.learner == "maac":
        print(json.dumps(maac_row(args)))
        return
    config = Config(num_problems=args.problems, num_generations=args.generations, max_new_tokens=args.max_new_tokens,
                    temperature=0.7, top_p=0.9, max_source_words=args.max_source_words, progress=False,
                    tensorboard=False)
    torch.manual_seed(0)
    tokenizer = load_tokenizer(None)
    base_a = load_model(None, device=args.device)
    dtype = base_a.get_input_embeddings().weight.dtype
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    base_b = AutoModelForCausalLM.from_config(base_a.config).to(dtype=dtype, device=base_a.device).eval()
    base_b.generation_config = copy.deepcopy(base_a.generation_config)
    lora = LoraSettings(rank=config.lora_rank)

    def policy(models: Mapping[str, Any]) -> MultiAgentPolicy:  # fresh adapters on copies of the weights
        copies: dict[int, Any] = {}
        for m in models.values():
            if id(m) not in copies:
                copies[id(m)] = copy.deepcopy(m)
        own = {a: copies[id(m)] for a, m in models.items()}
        return MultiAgentPolicy(own, tokenizer, list(models), lora=lora, mixed_batches=False)

    team = policy({"brief": base_a, "detailed": base_b})
    single_a, single_b = policy({"brief": base_a}), policy({"detailed": base_b})
    shared = policy({"brief": base_a, "detailed": base_a})
    two_copies = MultiAgentPolicy({"brief": copy.deepcopy(base_a), "detailed": copy.deepcopy(base_a)}, tokenizer,
                                  list(AGENTS), lora=lora, mixed_batches=False)
    assert len(team.groups) == 2 and len(shared.groups) == 1 and len(two_copies.groups) == 2
    n = config.num_problems * config.num_generations
    venv = VectorEnv(config.env, n, max_new_tokens=config.max_new_tokens,
                     **team_env_kwargs(config.env_kwargs(), team, list(AGENTS)))

    def variant(player: Any, owners: Mapping[str, MultiAgentPolicy]) -> Callable[[int], float]:
        optimizers = {a: p.optimizer(a, lr=config.learning_rate) for a, p in owners.items()}
        return lambda it: iteration(player, owners, optimizers, venv, config, it)

    variants = {
        "team_two_bases": variant(team, {a: team for a in AGENTS}),
        "single_a": variant(Solo(single_a, "brief"), {"brief": single_a}),
        "single_b": variant(Solo(single_b, "detailed"), {"detailed": single_b}),
        "team_shared_base": variant(shared, {a: shared for a in AGENTS}),
        "team_two_copies": variant(two_copies, {a: two_copies for a in AGENTS}),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for it in range(args.warmup + args.iterations):
        for name, run in variants.items():
            seconds = run(it)
            if it >= args.warmup:
                times[name].append(seconds)
    s = {name: round(statistics.median(t), 3) for name, t in times.items()}
    print(json.dumps({
        "s_per_iteration": s,
        "team_vs_singles": round(s["team_two_bases"] / (s["single_a"] + s["single_b"]), 3),
        "shared_vs_two_copies": round(s["team_shared_base"] / s["team_two_copies"], 3),
        "iterations": args.iterations, "warmup": args.warmup, "problems": config.num_problems,
        "G": config.num_generations, "max_new_tokens": config.max_new_tokens,
        "max_source_words": config.max_source_words, "models": ["SmolLM2-135M-Instruct", "same config, random"],
        "machine": machine_description(dtype),
    }))


if __name__ == "__main__":
    main()
