"""MAAC (baselines/learners/maac.py): the critic's input, the value loss, and a smoke run that trains the actors
and the critic."""

from __future__ import annotations

import math

import pytest
import torch

from baselines.learners import maac
from baselines.learners.maac import Config, critic_inputs, returns_and_advantages, value_loss, whiten
from baselines.rl.policy_gradient import sequence_kl


def contains(row: list[int], part: list[int]) -> bool:
    return any(row[i : i + len(part)] == part for i in range(len(row) - len(part) + 1))


def test_critic_input_holds_every_agents_prompt_and_response():
    pad = 0
    prompts = {
        "a": (torch.tensor([[0, 0, 11, 12], [0, 13, 14, 15]]), torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])),
        "b": (torch.tensor([[21, 22], [23, 24]]), torch.tensor([[1, 1], [1, 1]])),
    }
    responses = {
        "a": (torch.tensor([[31, 0], [32, 33]]), torch.tensor([[1, 0], [1, 1]])),
        "b": (torch.tensor([[41, 42, 0], [43, 0, 0]]), torch.tensor([[1, 1, 0], [1, 0, 0]])),
    }
    ids, mask = critic_inputs(prompts, responses, ["a", "b"], pad)
    # Row 0: a's prompt, a's response, b's prompt, b's response; pads of every part dropped, left-padded.
    assert ids[0][mask[0].bool()].tolist() == [11, 12, 31, 21, 22, 41, 42]
    assert ids[1].tolist() == [13, 14, 15, 32, 33, 23, 24, 43] and mask[1].all()
    for row in range(2):
        kept = ids[row][mask[row].bool()].tolist()
        for agent in ("a", "b"):
            r_ids, r_mask = responses[agent]
            assert contains(kept, r_ids[row][r_mask[row].bool()].tolist())


def test_value_loss_and_whiten_by_hand():
    returns, old = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0])
    # V = [2, 0.1]: unclipped squares 1, 0.01; clipped V = [0.5, 0.1]: squares 0.25, 0.01; max -> 1, 0.01.
    assert value_loss(torch.tensor([2.0, 0.1]), old, returns, 0.5).item() == pytest.approx(0.5 * (1 + 0.01) / 2)
    # Clipping keeps the larger loss: V = -1 for R = 1 -> (V - R)^2 = 4 either way.
    assert value_loss(torch.tensor([-1.0]), torch.tensor([0.0]), torch.tensor([1.0]), 0.5).item() == pytest.approx(2.0)
    w = whiten(torch.tensor([[1.0, 3.0]]))
    assert w.mean().item() == pytest.approx(0.0) and w.std().item() == pytest.approx(1.0)


def test_team_kl_penalty_comes_off_the_critics_targets_and_the_advantages():
    """Two episodes of two turns, gamma 0.9, kl_coef 0.5; the team's KL is the sum of both agents' response
    KLs (each k3 summed over its tokens)."""
    config = Config(gamma=0.9, kl_coef=0.5, whiten_advantages=False)
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    old_values = torch.tensor([[0.1, 0.0], [0.2, 0.5]])
    # Agent a's turn-0 response of episode 0: one token with d = log ref - log pi = 1 -> e - 2; the rest of
    # a's responses sample what the reference would. Agent b's turn-1 response of episode 0: KL 2.
    kl_a = torch.zeros(2, 2)
    kl_a[0, 0] = sequence_kl(torch.tensor([[-2.0, 0.0]]), torch.tensor([[-1.0, 0.0]]), torch.tensor([[1, 0]]))[0]
    kl_b = torch.tensor([[0.0, 2.0], [0.0, 0.0]])
    team = kl_a + kl_b
    returns, adv = returns_and_advantages(rewards, old_values, config, team)
    # Penalised rewards: episode 0 [1 - 0.5 (e - 2), -1], episode 1 [0, 1].
    r00 = 1.0 - 0.5 * (math.e - 2.0)
    expected = torch.tensor([[r00 + 0.9 * -1.0, -1.0], [0.9, 1.0]])
    torch.testing.assert_close(returns, expected)
    torch.testing.assert_close(adv, expected - old_values)
    # Without the KL (kl_in="loss", or a coefficient of 0): the task's returns.
    plain, _ = returns_and_advantages(rewards, old_values, config)
    torch.testing.assert_close(plain, torch.tensor([[1.0, 0.0], [0.9, 1.0]]))
    # Whitened advantages: mean 0, std 1 over the batch.
    _, white = returns_and_advantages(rewards, old_values, Config(gamma=0.9, kl_coef=0.5), team)
    assert white.mean().item() == pytest.approx(0.0, abs=1e-6) and white.std().item() == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("field", "value"),
    [("clip_value", -1.0), ("num_epochs", 0), ("loss_aggregation", "max"), ("checkpoint_every", -1),
     ("seed_per_problem", "yes"), ("kl_coef", -1.0), ("kl_in", "advantage")],
)
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        Config(**{field: value})


def tiny_maac(model_dir: str, tmp_path, **overrides) -> Config:
    """MAAC on the tiny test model (tests/conftest.py), 2 iterations of 1 problem x 2 episodes."""
    settings = dict(model=model_dir, max_source_words=20, num_iterations=2, num_problems=1, num_generations=2,
                    max_new_tokens=16, temperature=1.0, top_p=1.0, top_k=0, learning_rate=1e-2,
                    critic_learning_rate=1e-2, lora_rank=4, lora_alpha=8.0, num_eval_problems=1,
                    checkpoint_every=0, output_dir=str(tmp_path), run_name="run", tensorboard=False,
                    progress=False)
    return Config(**{**settings, **overrides})


@pytest.mark.slow
def test_smoke_changes_actors_and_critic(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    from baselines.infra.checkpoints import find_checkpoint
    from baselines.infra.metrics import read_metrics

    config = tiny_maac(tiny_model_dir, tmp_path)
    result = maac.main(config)
    numbers = {k: v for k, v in result.items() if isinstance(v, float)}
    assert all(math.isfinite(v) for v in numbers.values()), numbers
    for key in ("losses/value_loss", "losses/pg_loss", "charts/critic_value", "eval/total", "eval_before/total"):
        assert key in result, key
    policy_dir = find_checkpoint(config.run_dir()) / "policy"
    for name in ("brief", "detailed", "critic"):
        adapter = load_file(str(policy_dir / f"{name}.adapter.safetensors"))
        assert sum(float(v.abs().sum()) for k, v in adapter.items() if "lora_B" in k) > 0, name
    # The critic's adapter gets gradients only from the value loss: a non-zero lora_B means the critic trained.
    assert "critic.value_head.safetensors" in {f.name for f in policy_dir.iterdir()}
    rows = [r for r in read_metrics(config.run_dir() / "metrics.jsonl") if "losses/value_loss" in r]
    assert len(rows) == 2


@pytest.mark.parametrize(("kl_in", "kl_coef"), [("reward", 0.1), ("loss", 0.1), ("reward", 0.0)])
def test_kl_in_reward_and_loss_train_the_actors(tiny_model_dir, tmp_path, monkeypatch, kl_in, kl_coef):
    from test_magrpo import adapter_state

    from agents import MultiAgentPolicy

    calls = []
    real = MultiAgentPolicy.ref_logprobs

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(MultiAgentPolicy, "ref_logprobs", counting)
    config = tiny_maac(tiny_model_dir, tmp_path, num_iterations=1, num_eval_problems=0, kl_in=kl_in,
                       kl_coef=kl_coef)
    result = maac.main(config)
    numbers = {k: v for k, v in result.items() if isinstance(v, float)}
    assert all(math.isfinite(v) for v in numbers.values()), numbers
    # A coefficient of 0 (the default) never runs the reference.
    assert bool(calls) == (kl_coef > 0)
    for agent in ("brief", "detailed"):
        assert (f"agent_{agent}/kl" in result) == (kl_coef > 0)
        if kl_coef > 0:
            # The first iteration samples from the reference itself: the reward form's KL is ~0 up to
            # rounding; the loss form's averages MAAC's two epochs, the second after a step (measured 5e-4).
            assert 0.0 <= result[f"agent_{agent}/kl"] < (1e-4 if kl_in == "reward" else 1e-2)
    assert ("losses/kl" in result) == (kl_coef > 0)
    for name, state in adapter_state(config.run_dir()).items():
        assert sum(float(v.abs().sum()) for k, v in state.items() if "lora_B" in k) > 0, name
