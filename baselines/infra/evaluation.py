"""Evaluation on the eval split: mean joint reward and components, returns over turns, and pass@k on
the envs whose reward says whether a sample solved its problem (coding tests, math answers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from baselines.infra import play
from baselines.infra.rng import seeded
from baselines.infra.samples import episode_records
from llm_envs.core.vector import make_vec

PASS_COMPONENTS = ("tests", "correct")
"""Reward components that mean "this sample solved the problem" (1.0): coding tests, math answers.
``correct_<role>`` components (CORY's GSM8K env) count per role."""


def evaluate(
    policy: Any,
    env_id: str,
    *,
    num_problems: int,
    num_samples: int = 1,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    greedy: bool = True,
    ks: Sequence[int] = (1,),
    seed: int = 0,
    split: str = "eval",
    first: int = 0,
    prefix: str = "eval",
    env_kwargs: Mapping[str, Any] | None = None,
    adapters: Mapping[str, str] | None = None,
    episodes: list[dict[str, Any]] | None = None,
    sampling: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """Roll the policy on ``num_problems`` problems of ``split`` from index ``first`` on
    (negative: counted from the split's end, ``-num_problems`` = its last ``num_problems``), ``num_samples`` episodes
    each, through the env (one batch of problems x samples; sequential envs role by role). Returns
    ``eval/total``, ``eval/<component>`` (means of the last turn's values), ``eval/return`` (sum over
    turns) and, when a component says whether a sample solved its problem (``tests`` on coding envs,
    ``correct`` on math envs), ``eval/pass@k`` for each k <= num_samples (``eval/pass@k_<role>`` for
    ``correct_<role>``). ``adapters`` maps env roles to the policy's adapters (default: same names).
    Torch's RNG is forked so that evaluating never changes what training samples next.

    ``episodes``: a list to extend with one transcript record per episode (prompts, responses,
    reward and components; :func:`baselines.infra.samples.episode_records`).

    ``sampling``: policy agent -> its own ``agents.Sampling`` (max new tokens, stop strings,
    temperature/top-p/top-k, greedy), replacing the keywords above for the agents it names (a team
    whose agents sample differently; :meth:`baselines.infra.config.LearnerConfig.eval_sampling`).

    ``prefix`` names the metrics (``val``: ``val/total``, ... for a validation slice of the train split)."""
    kwargs = dict(env_kwargs or {})
    kwargs["max_new_tokens"] = max_new_tokens
    # The env ends a response where the policy stopped generating it (every EOS id of the model).
    if "stop_token_ids" not in kwargs:
        kwargs["stop_token_ids"] = list(policy.eos_token_ids)
    venv = make_vec(env_id, num_problems * num_samples, **kwargs)
    total_problems = len(venv.envs[0].task.problems(split))
    if first < 0:
        first += total_problems
    if not (0 <= first < total_problems and 1 <= num_problems <= total_problems - first):
        raise ValueError(
            f"num_problems must be in [1, {total_problems - first}] for split {split!r} of {env_id} from problem "
            f"{first} on, got {num_problems!r}"
        )
    components = list(venv.envs[0].task.reward_components)
    options = [{"task_index": first + i, "split": split} for i in range(num_problems) for _ in range(num_samples)]
    was_training = policy.training
    policy.eval()
    with seeded(seed), torch.no_grad():
        _, returns, infos = play.play_episodes(
            policy,
            venv,
            seeds=seed,
            options=options,
            action_length=max_new_tokens,
            adapters=adapters,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            greedy=greedy,
            sampling=sampling,
        )
    policy.train(was_training)
    lead = venv.possible_agents[0]
    info = infos[lead]
    out = {"eval/total": float(np.mean(info["reward_total"])), "eval/return": float(returns[lead].mean())}
    for c in components:
        out[f"eval/{c}"] = float(np.mean(info[f"reward_{c}"]))
    out.update(pass_metrics(info, components, num_problems, num_samples, ks))
    if prefix != "eval":
        out = {f"{prefix}/{k.split('/', 1)[1]}": v for k, v in out.items()}
    if episodes is not None:
        seeds = [seed + i for i in range(len(options))]
        episodes.extend(episode_records(venv.envs, seeds=seeds, options=options, models=adapters))
    venv.close()
    return out


def pass_metrics(
    info: Mapping[str, Any], components: Sequence[str], num_problems: int, num_samples: int, ks: Sequence[int]
) -> dict[str, float]:
    """``eval/pass@k`` from stacked infos whose rows are problem-major (problem i's samples are rows
    ``i*num_samples ... (i+1)*num_samples - 1``): a sample passes when its ``tests``/``correct``
    component is 1 (``eval/pass@k_<role>`` for ``correct_<role>``). Unbiased estimator, mean over problems.

    >>> pass_metrics({"reward_correct": [1.0, 0.0, 0.0, 0.0]}, ["correct"], 2, 2, [1, 2])
    {'eval/pass@1': 0.25, 'eval/pass@2': 0.5}
    """
    from llm_envs.evaluation import mean_pass_at_k

    out: dict[str, float] = {}
    for c in components:
        base, _, role = c.partition("_")
        if base not in PASS_COMPONENTS:
            continue
        passed = (np.asarray(info[f"reward_{c}"]) >= 1.0).reshape(num_problems, num_samples)
        for k in ks:
            if k <= num_samples:
                out[f"eval/pass@{k}" + (f"_{role}" if role else "")] = float(mean_pass_at_k(passed.tolist(), k))
    return out


def eval_table(result: Mapping[str, Any]) -> list[str]:
    """Lines comparing ``eval_before/<name>`` and ``eval/<name>`` of a run's result (total first)."""
    before = {k.split("/", 1)[1]: v for k, v in result.items() if k.startswith("eval_before/")}
    after = {k.split("/", 1)[1]: v for k, v in result.items() if k.startswith("eval/")}
    if not (before and after):
        return []
    width = max(12, *(len(n) for n in after))
    lines = [f"{'eval':<{width}} {'before':>8} {'after':>8}"]
    for name in sorted(set(before) & set(after), key=lambda n: (n != "total", n)):
        lines.append(f"{name:<{width}} {before[name]:8.3f} {after[name]:8.3f}")
    return lines


def summary(result: Mapping[str, Any]) -> str:
    """Closing lines of a run: eval reward before and after per component, the last training reward and
    where the plot and the run are (what ``llm-envs train`` prints for MAGRPO, MAAC, MADPO and MARLHF).

    >>> print(summary({"eval_before/total": 0.1, "eval/total": 0.4, "reward/total": 0.35, "run_dir": "runs/a"}))
    eval           before    after
    total           0.100    0.400
    last training reward 0.350
    run:  runs/a
    """
    lines = eval_table(result)
    if "reward/total" in result:
        lines.append(f"last training reward {result['reward/total']:.3f}")
    if "plot" in result:
        lines.append(f"plot: {result['plot']}")
    lines.append(f"run:  {result.get('run_dir')}")
    return "\n".join(lines)
