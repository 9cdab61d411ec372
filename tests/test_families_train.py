"""The building and ClassEval envs under the learners: a two-iteration MAGRPO, PPO and MAAC (PPO with the
central critic) run on a tiny model each, with finite metrics and the envs' reward components logged.
(PettingZoo's checks and the token-step mode run on every id in test_env_contract.py / test_token_mode.py.)"""

from __future__ import annotations

import math

import pytest
from hub_fixtures import classeval_rows, write_jsonl

from baselines.infra.metrics import read_metrics
from baselines.learners import magrpo, ppo


@pytest.mark.parametrize(
    ("learner", "env", "component"),
    [
        ("magrpo", "building/letters-v0", "coverage"),
        ("ppo", "building/house-v0", "match"),
        ("maac", "coding/classeval-v0", "tests"),
    ],
)
def test_two_iterations_on_a_tiny_model(tiny_model_dir, tmp_path, learner, env, component):
    data_path = str(write_jsonl(tmp_path / "classeval.jsonl", classeval_rows())) if "classeval" in env else None
    common = dict(model=tiny_model_dir, env=env, data_path=data_path, num_iterations=2, max_new_tokens=6,
                  learning_rate=1e-2, lora_rank=4, lora_alpha=8.0, num_eval_problems=0, output_dir=str(tmp_path),
                  run_name="run", checkpoint_every=0, tensorboard=False, progress=False)
    if learner == "magrpo":
        config = magrpo.Config(**common, num_problems=1, num_generations=2, baseline="none", threads=None)
        result = magrpo.main(config)
    else:
        critic = {"critic": "central"} if learner == "maac" else {}
        config = ppo.Config(**common, batch_size=2, minibatch_size=2, num_ppo_epochs=1, min_new_tokens=3, **critic)
        result = ppo.main(config)
    rows = read_metrics(config.run_dir() / "metrics.jsonl")
    assert [r["step"] for r in rows if "charts/iteration" in r or "reward/total" in r][-1] == 2
    for row in rows:
        assert all(math.isfinite(v) for v in row.values()), row
    assert f"reward/{component}" in result
