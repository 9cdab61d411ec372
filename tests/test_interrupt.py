"""Ctrl-C then ``--resume`` is the same run: for MAGRPO, MAAC, PPO and CORY, a ``KeyboardInterrupt`` raised at
several points of an iteration (before any update, between two agents' updates, during an evaluation)
leaves a checkpoint of the last iteration boundary, and the resumed run ends with exactly the adapters,
value heads, optimizer states, KL coefficients and metrics of a run that was never interrupted.
"""

from __future__ import annotations

import dataclasses
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

import baselines.evaluation
import baselines.play
from baselines import cory, maac, magrpo, ppo
from baselines.checkpoints import find_checkpoint
from baselines.metrics import read_metrics

# Wall-clock metrics differ between any two runs.
TIMING = (
    "charts/s_per_iteration", "charts/rollout_fraction", "charts/samples_per_s", "charts/responses_per_s",
    "charts/expert_s",
)


def magrpo_config(model_dir: str, tmp_path, name: str, **overrides) -> magrpo.Config:
    from test_magrpo import tiny_config

    settings = dict(num_iterations=3, max_new_tokens=12, baseline="mean", num_epochs=2, eval_every=1, run_name=name)
    return tiny_config(model_dir, tmp_path, **{**settings, **overrides})


def ppo_settings(model_dir: str, tmp_path, name: str) -> dict:
    from test_ppo import tiny_ppo

    settings = dataclasses.asdict(tiny_ppo(model_dir, tmp_path, num_iterations=3, eval_every=1, run_name=name))
    settings.pop("env")  # each learner below names its own
    return settings


def maac_config(model_dir: str, tmp_path, name: str) -> maac.Config:
    from test_maac import tiny_maac

    return tiny_maac(model_dir, tmp_path, num_iterations=3, num_problems=2, eval_every=1, run_name=name)


LEARNERS = {
    # learner: (module, config builder, the function that updates one agent)
    "magrpo": (magrpo, magrpo_config, "update_agent"),
    "maac": (maac, maac_config, "update_agent"),
    "ppo": (
        ppo,
        lambda d, t, n: ppo.Config(**ppo_settings(d, t, n), env="sentiment/imdb-cory-v0"),
        "ppo_update",
    ),
    "cory": (cory, lambda d, t, n: cory.Config(**ppo_settings(d, t, n), swap_every=1), "ppo_update"),
}
# (what raises, on which call), all in iteration 2 with 2 agents and eval_every=1: its rollout is
# MAGRPO's 2nd rollout, and PPO's 4th play_episodes (evaluations play episodes too: before, after 1);
# its second agent's update is the 4th update; its evaluation the 3rd (after "before" and iteration 1).
# MAAC plays MAGRPO's rollout and updates its actors with MAGRPO's update_agent (baselines/policy_gradient.py).
POINTS = {
    "before-update": ("rollout", {"magrpo": 2, "maac": 2, "ppo": 4, "cory": 4}),
    "between-agents": ("update", {"magrpo": 4, "maac": 4, "ppo": 4, "cory": 4}),
    "during-eval": ("evaluate", {"magrpo": 3, "maac": 3, "ppo": 3, "cory": 3}),
}


def run_state(run_dir) -> dict:
    """Everything a run ends with: adapters and value heads, optimizer states, trainer record
    (step, KL coefficients, eval before), metrics without wall-clock times."""
    from safetensors.torch import load_file

    directory = find_checkpoint(run_dir)
    tensors = {p.name: load_file(str(p)) for p in sorted((directory / "policy").glob("*.safetensors"))}
    trainer = json.loads((directory / "trainer.json").read_text())
    metrics = [{k: v for k, v in row.items() if k not in TIMING} for row in read_metrics(run_dir / "metrics.jsonl")]
    optimizers = torch.load(directory / "optimizers.pt", weights_only=True)
    return {"tensors": tensors, "optimizers": optimizers, "trainer": trainer, "metrics": metrics}


def patch_to_interrupt(monkeypatch, module, update_name: str, what: str, call: int) -> None:
    """Make the ``call``-th call of ``what`` raise KeyboardInterrupt (as Ctrl-C would there)."""
    if what == "rollout":
        owner, name = (module, "rollout") if module in (magrpo, maac) else (baselines.play, "play_episodes")
    elif what == "update":
        owner, name = (module if module in (magrpo, maac) else ppo), update_name
    else:
        owner, name = baselines.evaluation, "evaluate"
    real, calls = getattr(owner, name), []

    def interrupting(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, interrupting)


@pytest.mark.parametrize("point", list(POINTS))
@pytest.mark.parametrize("learner", list(LEARNERS))
def test_interrupt_then_resume_equals_uninterrupted_run(tiny_model_dir, tmp_path, monkeypatch, learner, point):
    module, make_config, update_name = LEARNERS[learner]
    straight = make_config(tiny_model_dir, tmp_path, "straight")
    module.main(straight)
    expected = run_state(straight.run_dir())

    config = make_config(tiny_model_dir, tmp_path, "interrupted")
    with monkeypatch.context() as patch:
        what, calls = POINTS[point]
        patch_to_interrupt(patch, module, update_name, what, calls[learner])
        with pytest.raises(KeyboardInterrupt):
            module.main(config)
    # The checkpoint holds the last finished iteration (1), not the half-done second one.
    saved = json.loads((find_checkpoint(config.run_dir()) / "trainer.json").read_text())
    assert saved["step"] == 1
    module.main(dataclasses.replace(config, resume=True))
    got = run_state(config.run_dir())

    assert got["trainer"]["step"] == expected["trainer"]["step"] == 3
    assert got["trainer"]["extra"] == expected["trainer"]["extra"]  # KL coefficients, eval before
    assert got["metrics"] == expected["metrics"]
    assert sorted(got["tensors"]) == sorted(expected["tensors"])
    for name, tensors in expected["tensors"].items():
        for key, tensor in tensors.items():
            assert torch.equal(got["tensors"][name][key], tensor), (name, key)
    for agent, state in expected["optimizers"].items():
        mine = got["optimizers"][agent]
        assert mine["param_groups"] == state["param_groups"]
        for index, values in state["state"].items():
            for key, value in values.items():
                assert torch.equal(mine["state"][index][key], value), (agent, index, key)


def test_interrupt_keeps_a_clean_periodic_checkpoint(tiny_model_dir, tmp_path, monkeypatch):
    """A clean checkpoint of the boundary is never rewritten with half-updated weights."""
    config = magrpo_config(tiny_model_dir, tmp_path, "periodic", checkpoint_every=1, num_eval_problems=0)
    calls = []
    real = magrpo.update_agent

    def interrupting(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:  # iteration 2, second agent: the first agent's update is done
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(magrpo, "update_agent", interrupting)
    with pytest.raises(KeyboardInterrupt):
        magrpo.main(config)
    directory = find_checkpoint(config.run_dir())
    assert directory.name == "step_000001"
    monkeypatch.setattr(magrpo, "update_agent", real)
    one = magrpo_config(tiny_model_dir, tmp_path, "one", num_iterations=1, num_eval_problems=0)
    magrpo.main(one)
    for name, tensors in run_state(one.run_dir())["tensors"].items():
        mine = run_state(config.run_dir())["tensors"][name]
        for key, tensor in tensors.items():
            assert torch.equal(mine[key], tensor), (name, key)
