"""Ctrl-C then ``--resume`` is the same run: for MAGRPO, MAAC, PPO and CORY, a ``KeyboardInterrupt`` raised at
several points of an iteration (before any update, between two agents' updates, during an evaluation)
leaves a checkpoint of the last iteration boundary, and the resumed run ends with exactly the adapters,
value heads, optimizer states, KL coefficients and metrics of a run that was never interrupted.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

import baselines.infra.evaluation
import baselines.infra.play
import baselines.infra.run
from baselines.infra.checkpoints import find_checkpoint
from baselines.infra.metrics import read_metrics
from baselines.learners import cory, maac, magrpo, ppo

# Wall-clock metrics differ between any two runs.
TIMING = (
    "charts/s_per_iteration", "charts/rollout_fraction", "charts/samples_per_s", "charts/responses_per_s",
    "charts/expert_s", "charts/critic_reencode_fraction",
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
# MAAC plays MAGRPO's rollout and updates its actors with MAGRPO's update_agent (baselines/rl/policy_gradient.py).
POINTS = {
    "before-update": ("rollout", {"magrpo": 2, "maac": 2, "ppo": 4, "cory": 4}),
    "between-agents": ("update", {"magrpo": 4, "maac": 4, "ppo": 4, "cory": 4}),
    "during-eval": ("evaluate", {"magrpo": 3, "maac": 3, "ppo": 3, "cory": 3}),
    # Right after iteration 2's first optimizer step: that agent's live weights and AdamW state have
    # moved on, so the checkpoint must come from the copy taken just before the step.
    "after-a-step": ("step", {"magrpo": 1, "maac": 1, "ppo": 1, "cory": 1}),
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


def assert_same_run(got: dict, expected: dict) -> None:
    """Two :func:`run_state` results are the same run: step, learner state (KL coefficients, eval
    before), metrics, and bit-identical tensors and optimizer states."""
    assert got["trainer"]["step"] == expected["trainer"]["step"]
    assert got["trainer"]["extra"] == expected["trainer"]["extra"]  # KL coefficients, eval before
    assert got["metrics"] == expected["metrics"]
    assert sorted(got["tensors"]) == sorted(expected["tensors"])
    for name, tensors in expected["tensors"].items():
        for key, tensor in tensors.items():
            assert torch.equal(got["tensors"][name][key], tensor), (name, key)
    assert sorted(got["optimizers"]) == sorted(expected["optimizers"])
    for agent, state in expected["optimizers"].items():
        mine = got["optimizers"][agent]
        assert mine["param_groups"] == state["param_groups"]
        for index, values in state["state"].items():
            for key, value in values.items():
                assert torch.equal(mine["state"][index][key], value), (agent, index, key)


def patch_to_interrupt(monkeypatch, module, update_name: str, what: str, call: int) -> None:
    """Make the ``call``-th call of ``what`` raise KeyboardInterrupt (as Ctrl-C would there); for
    ``"step"``, the ``call``-th optimizer step of iteration 2 raises after it has run."""
    if what == "step":
        real_end, real_step, ended, steps = baselines.infra.run.Run.end_iteration, torch.optim.AdamW.step, [], []

        def end_iteration(self, *args, **kwargs):
            ended.append(1)
            return real_end(self, *args, **kwargs)

        def step(self, *args, **kwargs):
            out = real_step(self, *args, **kwargs)
            if len(ended) == 1:
                steps.append(1)
                if len(steps) == call:
                    raise KeyboardInterrupt
            return out

        monkeypatch.setattr(baselines.infra.run.Run, "end_iteration", end_iteration)
        monkeypatch.setattr(torch.optim.AdamW, "step", step)
        return
    if what == "rollout":
        owner, name = (module, "rollout") if module in (magrpo, maac) else (baselines.infra.play, "play_episodes")
    elif what == "update":
        owner, name = (module if module in (magrpo, maac) else ppo), update_name
    else:
        owner, name = baselines.infra.evaluation, "evaluate"
    real, calls = getattr(owner, name), []

    def interrupting(*args, **kwargs):
        calls.append(1)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, interrupting)


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tmp_path_factory):
    """``uninterrupted(learner)``: the :func:`run_state` of the learner's run that nothing interrupts, run
    once per learner and shared by its interruption points (same seed, same run; the run's directory
    plays no part in what it computes)."""
    states: dict[str, dict] = {}

    def state(learner: str) -> dict:
        if learner not in states:
            module, make_config, _ = LEARNERS[learner]
            straight = make_config(tiny_model_dir, tmp_path_factory.mktemp(f"straight-{learner}"), "straight")
            module.main(straight)
            states[learner] = run_state(straight.run_dir())
        return states[learner]

    return state


@pytest.mark.parametrize("point", list(POINTS))
@pytest.mark.parametrize("learner", list(LEARNERS))
def test_interrupt_then_resume_equals_uninterrupted_run(tiny_model_dir, tmp_path, monkeypatch, uninterrupted, learner,
                                                        point):
    module, make_config, update_name = LEARNERS[learner]
    expected = uninterrupted(learner)

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
    assert_same_run(got, expected)


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


def test_boundary_state_is_copied_only_when_an_optimizer_steps(tmp_path):
    """The boundary holds no copy of an agent until its optimizer is about to step; then exactly that
    agent's adapter and AdamW state are copied, and the resolved state is the boundary's."""
    from test_agents import make_policy

    from baselines.infra.checkpoints import BoundaryState
    from llm_envs.tokenizers import load_tokenizer

    policy = make_policy(load_tokenizer())
    optimizers = {agent: policy.optimizer(agent, lr=0.1) for agent in policy.agents}
    first, second = policy.agents[:2]
    for agent in policy.agents:  # a first step each, so the boundary has AdamW moments to keep
        sum(p.sum() for p in policy.parameters(agent)).backward()
        optimizers[agent].step()
        optimizers[agent].zero_grad()
    before = policy.state()
    moments = {a: copy.deepcopy(o.state_dict()) for a, o in optimizers.items()}
    state = BoundaryState(step=3, policy=policy, optimizers=optimizers, rng=np.random.default_rng(0))
    for agent, optimizer in optimizers.items():
        optimizer.register_step_pre_hook(lambda *_, agent=agent: state.freeze(agent))
    assert state.frozen == ()

    sum((p * p).sum() for p in policy.parameters(first)).backward()
    optimizers[first].step()
    assert state.frozen == (first,)
    live = policy.state(agents=[first])
    name = f"{first}.adapter.safetensors"
    assert any(not torch.equal(live[name][k], before[name][k]) for k in before[name])  # it did move

    resolved = state.resolve()
    assert resolved.step == 3 and sorted(resolved.policy) == sorted(before)
    for file, tensors in before.items():
        for key, tensor in tensors.items():
            assert torch.equal(resolved.policy[file][key], tensor), (file, key)
    for agent in (first, second):
        for index, values in moments[agent]["state"].items():
            for key, value in values.items():
                assert torch.equal(resolved.optimizers[agent]["state"][index][key], value), (agent, index, key)
    with pytest.raises(KeyError, match="nobody"):
        policy.state(agents=["nobody"])
