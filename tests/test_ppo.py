"""PPO: GAE, per-token rewards, whitening, the clipped losses and the KL controllers against hand-computed
values; smoke runs on a tiny model (single-agent ``sentiment/imdb-v0``, two agents on the sequential
``sentiment/imdb-cory-v0``); exact resume; the command line (train ppo, eval pass@k on GSM8K)."""

from __future__ import annotations

import json
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
from test_magrpo import adapter_state

from baselines.infra.checkpoints import find_checkpoint
from baselines.infra.cli import main as cli
from baselines.infra.metrics import read_metrics
from baselines.learners import ppo
from baselines.learners.ppo import Config, clipped_policy_loss, clipped_value_loss
from baselines.rl.experience import gae, token_rewards, whiten
from baselines.rl.kl_control import AdaptiveKLController, FixedKLController
from llm_envs.core.vector import SequentialVectorEnv


# ----------------------------------------------------------------------------------------- math
def test_gae_hand_computed():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [1.0, 2.0, 0.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7, 5.0], [1.0, 1.0, 9.0, 9.0]])  # 5.0 and 9.0 sit on pads
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    # Row 0, gamma 1, lambda 0.5: the value after the last real token is 0 (the pad's 5.0 must not leak).
    #   t2: 1 + 0 - 0.7 = 0.3; t1: 0 + 0.7 - 0.6 + 0.5 * 0.3 = 0.25; t0: 0.6 - 0.5 + 0.5 * 0.25 = 0.225.
    adv, ret = gae(rewards[:1], values[:1], mask[:1], gamma=1.0, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([[0.225, 0.25, 0.3, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[0.725, 0.85, 1.0, 0.0]]))
    # Row 1, gamma 0.9, lambda 0.95: t1: 2 + 0 - 1 = 1; t0: 1 + 0.9 * 1 - 1 + 0.9 * 0.95 * 1 = 1.755.
    adv, ret = gae(rewards[1:], values[1:], mask[1:], gamma=0.9, lam=0.95)
    torch.testing.assert_close(adv, torch.tensor([[1.755, 1.0, 0.0, 0.0]]))
    torch.testing.assert_close(ret, torch.tensor([[2.755, 2.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match=r"\(N, T\)"):
        gae(rewards, values[:, :2], mask, 1.0, 0.95)


def test_token_rewards_kl_penalty_and_score_on_last_token():
    logprobs = torch.tensor([[-1.0, -1.0, 0.0], [-0.5, 0.0, 0.0]])
    ref = torch.tensor([[-2.0, -1.5, 0.0], [-1.0, 0.0, -7.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    rewards, kl = token_rewards(torch.tensor([2.0, -1.0]), logprobs, ref, mask, kl_coef=0.1)
    # kl = [[1, 0.5, 0], [0.5, 0, 0]] (the -7 on a pad is masked); -0.1 kl, score on the last real token.
    torch.testing.assert_close(kl, torch.tensor([[1.0, 0.5, 0.0], [0.5, 0.0, 0.0]]))
    torch.testing.assert_close(rewards, torch.tensor([[-0.1, 1.95, 0.0], [-1.05, 0.0, 0.0]]))
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        token_rewards(torch.zeros(2), logprobs, ref, torch.tensor([[1, 0, 0], [0, 0, 0]]), 0.1)


def test_whiten():
    # mean 2, unbiased variance ((-1)^2 + 1^2) / 1 = 2 over the two real entries; the pad becomes 0.
    out = whiten(torch.tensor([[1.0, 3.0, 7.0]]), torch.tensor([[1, 1, 0]]))
    s = 1 / math.sqrt(2.0)
    torch.testing.assert_close(out, torch.tensor([[-s, s, 0.0]]), atol=1e-6, rtol=1e-5)
    kept = whiten(torch.tensor([[1.0, 3.0, 7.0]]), torch.tensor([[1, 1, 0]]), shift_mean=False)
    torch.testing.assert_close(kept, torch.tensor([[2 - s, 2 + s, 0.0]]), atol=1e-6, rtol=1e-5)


def test_clipped_policy_loss_hand_computed():
    logprobs = torch.log(torch.tensor([[1.5, 0.5, 1.1, 0.5, 4.0]])).requires_grad_(True)
    old = torch.zeros(1, 5)
    adv = torch.tensor([[1.0, -1.0, 2.0, 1.0, 3.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    loss, frac = clipped_policy_loss(logprobs, old, adv, mask, clip_eps=0.2)
    # Per token max(-A rho, -A clip(rho)): rho 1.5, A 1 -> max(-1.5, -1.2) = -1.2 (clipped);
    # rho 0.5, A -1 -> max(0.5, 0.8) = 0.8 (clipped); rho 1.1, A 2 -> -2.2 (inside the range);
    # rho 0.5, A 1 -> max(-0.5, -0.8) = -0.5 (the pessimistic unclipped term); the pad is ignored.
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 2.2 - 0.5) / 4)
    assert frac.item() == pytest.approx(0.5)
    loss.backward()
    # Clipped tokens get no gradient; d/dlogp of -A rho is -A rho.
    expected = torch.tensor([[0.0, 0.0, -2.0 * 1.1, -1.0 * 0.5, 0.0]]) / 4
    torch.testing.assert_close(logprobs.grad, expected)


def test_clipped_value_loss_hand_computed():
    values = torch.tensor([[1.0, 0.1, 3.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.5, 0.0]])
    returns = torch.tensor([[0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss, frac = clipped_value_loss(values, old, returns, mask, clip_value=0.2)
    # Token 0: (1 - 0)^2 = 1 vs clip(1, 0.3, 0.7) = 0.7 -> 0.49: max 1.
    # Token 1: (0.1)^2 = 0.01 vs clip(0.1, 0.3, 0.7) = 0.3 -> 0.09: max 0.09 (the clipped term).
    assert loss.item() == pytest.approx(0.5 * (1.0 + 0.09) / 2)
    assert frac.item() == pytest.approx(0.5)
    loss.backward()
    # Token 1's loss is the clipped one, flat in V: no gradient; token 0: 0.5 * 2 * (1 - 0) / 2.
    torch.testing.assert_close(values.grad, torch.tensor([[0.5, 0.0, 0.0]]))


@pytest.mark.parametrize(
    ("kl", "n_steps", "expected"),
    [
        (12.0, 256, 0.3 * (1 + 0.2 * 256 / 10000)),  # error 1.0 clipped to 0.2
        (3.0, 256, 0.3 * (1 - 0.2 * 256 / 10000)),  # error -0.5 clipped to -0.2
        (6.6, 1000, 0.3 * (1 + 0.1 * 1000 / 10000)),  # error 0.1 inside the clip
        (6.0, 256, 0.3),  # on target: unchanged
    ],
)
def test_adaptive_kl_controller(kl, n_steps, expected):
    ctl = AdaptiveKLController(0.3, target=6.0, horizon=10000)
    ctl.update(kl, n_steps)
    assert ctl.value == pytest.approx(expected, rel=1e-12)


def test_kl_controllers_compound_and_fixed():
    ctl = AdaptiveKLController(0.3, target=6.0, horizon=10000)
    for _ in range(3):
        ctl.update(100.0, 1000)
    assert ctl.value == pytest.approx(0.3 * 1.02**3)
    fixed = FixedKLController(0.05)
    fixed.update(100.0, 1000)
    assert fixed.value == 0.05
    with pytest.raises(FloatingPointError, match="nan"):
        ctl.update(float("nan"), 1)
    with pytest.raises(ValueError, match="-1"):
        AdaptiveKLController(-1, target=6.0, horizon=10)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("minibatch_size", 3, "batch_size=16"),
        ("min_new_tokens", 20, "20"),
        ("lam", 1.5, "1.5"),
        ("clip_value", 0.0, "0.0"),
        ("num_ppo_epochs", 0, "got 0"),
        ("kl_target", -1.0, "-1.0"),
        ("vf_coef", float("nan"), "nan"),
        ("kl_in", "value", "kl_in must be 'reward' or 'loss', got 'value'"),
        ("kl_in", "loss", "kl_in='loss' with adaptive_kl=True"),  # the loss term's weight is fixed
    ],
)
def test_config_rejects_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        Config(**{field: value})


class FixedPolicy:
    """``forward`` returns fixed log-probs and values (one turn, every row)."""

    def __init__(self, logprobs: torch.Tensor, values: torch.Tensor) -> None:
        self.out = (logprobs, values)

    def forward(self, model, prompt_ids, prompt_mask, response_ids, response_mask, with_values, temperature):
        return self.out


@pytest.mark.parametrize("kl_in", ["reward", "loss"])
def test_kl_loss_term_by_hand(kl_in):
    """One response of two tokens (and a pad). The policy has not moved (ratio 1) and the values equal the
    returns, so the clipped losses are -mean(A) = 0 and 0; log ref - log pi = 0 and 1 on the two tokens:
    k3 = 0 and e - 2, token mean (e - 2) / 2, weighted by init_kl_coef 0.3 in the loss form only."""
    from agents.generation import Generation
    from baselines.rl.experience import Experience

    logprobs, ref = torch.tensor([[-1.0, -2.0, 0.0]]), torch.tensor([[-1.0, -1.0, -5.0]])
    values, mask = torch.tensor([[0.5, 0.2, 0.0]]), torch.tensor([[1, 1, 0]])
    gen = Generation("agent", 1, torch.ones(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.long),
                     torch.ones(1, 3, dtype=torch.long), mask, logprobs)
    exp = Experience([gen], mask, logprobs, values, torch.tensor([[1.0, -1.0, 0.0]]), values, logprobs - ref,
                     torch.ones(1, 1), ref_logprobs=ref)
    config = Config(kl_in=kl_in, adaptive_kl=False, init_kl_coef=0.3)
    out = ppo._minibatch_loss(FixedPolicy(logprobs, values), "agent", exp, torch.arange(1), config, None)
    assert out["policy_loss"].item() == pytest.approx(0.0) and out["value_loss"].item() == pytest.approx(0.0)
    if kl_in == "loss":
        assert out["kl_loss"].item() == pytest.approx((math.e - 2.0) / 2)
        assert out["loss"].item() == pytest.approx(0.3 * (math.e - 2.0) / 2)
    else:
        assert "kl_loss" not in out and out["loss"].item() == pytest.approx(0.0)


def test_sequential_vector_env_contract():
    venv = SequentialVectorEnv("sentiment/imdb-cory-v0", 2, max_new_tokens=4)
    obs, _ = venv.reset(seed=0, options=[{"task_index": 0}, {"task_index": 1}])
    assert venv.agents == ["pioneer"] and list(obs) == ["pioneer"]
    pad = venv.envs[0].pad_token_id
    with pytest.raises(KeyError, match="'pioneer'"):
        venv.step({"observer": np.full((2, 4), pad)})
    obs, rewards, *_ = venv.step({"pioneer": np.full((2, 4), pad)})
    assert venv.agents == ["observer"] and rewards["pioneer"].tolist() == [0.0, 0.0]
    _, rewards, terms, _, infos = venv.step({"observer": np.full((2, 4), pad)})
    assert venv.agents == [] and terms["observer"].all()
    np.testing.assert_allclose(rewards["pioneer"], infos["pioneer"]["reward_total"])


# ----------------------------------------------------------------------------------------- runs
def tiny_ppo(model_dir: str, tmp_path, **overrides) -> Config:
    settings = dict(
        model=model_dir,
        num_iterations=2,
        batch_size=4,
        minibatch_size=2,
        num_ppo_epochs=2,
        min_new_tokens=3,
        max_new_tokens=6,
        learning_rate=1e-2,
        lora_rank=4,
        lora_alpha=8.0,
        num_eval_problems=2,
        output_dir=str(tmp_path),
        run_name="run",
        checkpoint_every=0,
        tensorboard=False,
        progress=False,
    )
    settings.update(overrides)
    return Config(**settings)


def value_heads(run_dir) -> dict[str, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    policy_dir = find_checkpoint(run_dir) / "policy"
    return {p.name.split(".")[0]: load_file(str(p)) for p in sorted(policy_dir.glob("*.value_head.safetensors"))}


@pytest.mark.parametrize(
    ("env", "agents"), [("sentiment/imdb-v0", ["agent"]), ("sentiment/imdb-cory-v0", ["pioneer", "observer"])]
)
def test_smoke_weights_change_and_metrics_finite(tiny_model_dir, tmp_path, env, agents):
    config = tiny_ppo(tiny_model_dir, tmp_path, env=env)
    result = ppo.main(config)
    run_dir = config.run_dir()
    rows = read_metrics(run_dir / "metrics.jsonl")
    train_rows = [r for r in rows if "charts/iteration" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    for row in rows:
        assert all(math.isfinite(v) for v in row.values()), row
    for agent in agents:
        for key in ("policy_loss", "value_loss", "kl", "kl_coef", "task_reward", "combined", "approx_kl"):
            assert f"agent_{agent}/{key}" in train_rows[-1]
        # The first iteration samples from the reference itself: KL 0 up to float error.
        assert abs(train_rows[0][f"agent_{agent}/kl"]) < 1e-3
    assert 3 <= train_rows[0]["charts/response_length"] <= 6
    adapters, heads = adapter_state(run_dir), value_heads(run_dir)
    assert sorted(adapters) == sorted(agents) == sorted(heads)
    for agent in agents:
        # LoRA B starts at 0: any non-zero entry means the adapter was trained; value heads moved too.
        assert any(t.abs().sum() > 0 for k, t in adapters[agent].items() if "lora_B" in k)
    assert "eval/total" in result and "eval_before/total" in result


def test_kl_in_loss_trains_without_the_reward_penalty(tiny_model_dir, tmp_path, monkeypatch):
    penalties = []
    real = ppo.make_experience

    def recording(policy, model, turns, scores, kl_coef, *args, **kwargs):
        penalties.append(kl_coef)
        return real(policy, model, turns, scores, kl_coef, *args, **kwargs)

    monkeypatch.setattr(ppo, "make_experience", recording)
    config = tiny_ppo(tiny_model_dir, tmp_path, kl_in="loss", adaptive_kl=False, init_kl_coef=0.3,
                      num_eval_problems=0)
    ppo.main(config)
    assert penalties == [0.0, 0.0]  # no KL in the rewards: it is a term of the loss
    rows = [r for r in read_metrics(config.run_dir() / "metrics.jsonl") if "charts/iteration" in r]
    for row in rows:
        assert all(math.isfinite(v) for v in row.values()), row
        # The loss is the mean over minibatches of policy + vf_coef * value + init_kl_coef * kl_loss.
        expected = (row["agent_agent/policy_loss"] + config.vf_coef * row["agent_agent/value_loss"]
                    + 0.3 * row["agent_agent/kl_loss"])
        assert row["agent_agent/loss"] == pytest.approx(expected, rel=1e-5, abs=1e-7)
        assert row["agent_agent/kl_coef"] == 0.3 and "losses/kl_loss" in row and "agent_agent/kl" in row
    assert rows[1]["agent_agent/kl_loss"] > 0  # the second iteration's policy has moved from the reference
    assert any(t.abs().sum() > 0 for k, t in adapter_state(config.run_dir())["agent"].items() if "lora_B" in k)


def test_resume_matches_uninterrupted_run(tiny_model_dir, tmp_path):
    straight = tiny_ppo(tiny_model_dir, tmp_path, run_name="straight", num_eval_problems=0)
    ppo.main(straight)
    first = tiny_ppo(tiny_model_dir, tmp_path, run_name="resumed", num_iterations=1, num_eval_problems=0)
    ppo.main(first)
    ppo.main(tiny_ppo(tiny_model_dir, tmp_path, run_name="resumed", num_iterations=2, num_eval_problems=0, resume=True))
    a, b = adapter_state(straight.run_dir()), adapter_state(first.run_dir())
    for key in a["agent"]:
        torch.testing.assert_close(a["agent"][key], b["agent"][key])
    for key, tensor in value_heads(straight.run_dir())["agent"].items():
        torch.testing.assert_close(tensor, value_heads(first.run_dir())["agent"][key])
    kl_a = json.loads((find_checkpoint(straight.run_dir()) / "trainer.json").read_text())["extra"]["kl_coef"]
    kl_b = json.loads((find_checkpoint(first.run_dir()) / "trainer.json").read_text())["extra"]["kl_coef"]
    assert kl_a == kl_b and kl_a["agent"] != 0.3  # the adaptive coefficient moved and was restored


def test_cli_train_ppo_help_and_bad_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli(["train", "ppo", "--help"])
    assert exit_info.value.code == 0
    assert "--init-kl-coef" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        cli(["train", "ppo", "--minibatch-size", "5"])
    assert exit_info.value.code == 2
    assert cli(["train", "ppo", "--preset", "demo"]) == 2
    assert "no presets" in capsys.readouterr().err


def test_cli_eval_gsm8k_pass_at_k(tiny_model_dir, capsys):
    assert cli(["eval", "--env", "math/gsm8k-v0", "--model", tiny_model_dir, "--num-problems", "2",
                "--num-samples", "5", "--max-new-tokens", "8"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["env"] == "math/gsm8k-v0" and result["greedy"] is False
    assert 0.0 <= result["eval/pass@1"] <= result["eval/pass@5"] <= 1.0
    assert result["eval/pass@1"] == pytest.approx(result["eval/correct"])  # pass@1 = mean correctness
