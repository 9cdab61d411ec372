"""CORY: the role schedule, swaps by reference (each model keeps its optimizer state, value head and KL
controller while playing the other role), a smoke run on ``sentiment/imdb-cory-v0`` with a tiny model,
and the command line (train cory, eval of its checkpoint)."""

from __future__ import annotations

import json
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from test_magrpo import adapter_state

from baselines.infra.checkpoints import find_checkpoint
from baselines.infra.cli import main as cli
from baselines.infra.metrics import read_metrics
from baselines.infra.play import play_episodes
from baselines.learners import cory
from baselines.learners.cory import MODELS, Config, role_assignment
from baselines.learners.ppo import make_experience, ppo_update
from llm_envs.core.vector import SequentialVectorEnv

ROLES = ("pioneer", "observer")


@pytest.mark.parametrize(
    ("iteration", "swap_every", "pioneer"),
    [
        (0, 5, "model_0"),
        (4, 5, "model_0"),
        (5, 5, "model_1"),
        (9, 5, "model_1"),
        (10, 5, "model_0"),
        (1, 1, "model_1"),
        (2, 1, "model_0"),
        (123, 0, "model_0"),
    ],
)
def test_role_assignment(iteration, swap_every, pioneer):
    players = role_assignment(iteration, ROLES, swap_every)
    other = MODELS[1] if pioneer == MODELS[0] else MODELS[0]
    assert players == {"pioneer": pioneer, "observer": other}


def test_role_assignment_and_config_errors():
    with pytest.raises(ValueError, match=r"\['agent'\]"):
        role_assignment(0, ["agent"], 5)
    with pytest.raises(ValueError, match="-1"):
        Config(swap_every=-1)
    with pytest.raises(ValueError, match="'sentiment/imdb-v0'"):
        cory.main(Config(env="sentiment/imdb-v0"))


def test_swap_by_reference_keeps_each_models_optimizer_state(tiny_model_dir):
    from agents import LoraSettings, MultiAgentPolicy

    torch.manual_seed(0)
    policy = MultiAgentPolicy.from_pretrained(
        list(MODELS), tiny_model_dir, lora=LoraSettings(rank=4, alpha=8.0), value_head=True, mixed_batches=False
    )
    optimizers = {m: policy.optimizer(m, lr=1e-2) for m in MODELS}
    venv = SequentialVectorEnv("sentiment/imdb-cory-v0", 2, max_new_tokens=4, tokenizer=tiny_model_dir)
    config = Config(
        model=tiny_model_dir,
        batch_size=2,
        minibatch_size=2,
        num_ppo_epochs=1,
        min_new_tokens=4,
        max_new_tokens=4,
        swap_every=1,
    )

    def iterate(iteration: int) -> dict[str, str]:
        players = role_assignment(iteration, ROLES, config.swap_every)
        steps, returns, _ = play_episodes(
            policy,
            venv,
            seeds=iteration,
            options=[{"task_index": 0}] * 2,
            action_length=4,
            adapters=players,
            max_new_tokens=4,
        )
        gens = {role: gen for step in steps for role, gen in step.items()}
        for role, model in players.items():
            assert gens[role].agent == model  # the role's responses came from that model's adapter
            scores = torch.as_tensor(returns[role], dtype=torch.float32)
            ppo_update(
                policy,
                optimizers[model],
                model,
                make_experience(policy, model, gens[role], scores, 0.3, config),
                config,
            )
        return {role: gens[role].prompt_ids.shape[1] for role in ROLES}

    widths = iterate(0)
    assert widths["observer"] > widths["pioneer"]  # the observer's prompt holds the pioneer's answer
    held = {}
    for model, opt in optimizers.items():
        params = opt.param_groups[0]["params"]
        assert [id(p) for p in params] == [id(p) for p in policy.parameters(model)]  # its adapter + value head
        held[model] = {id(p): (opt.state[p]["exp_avg"], opt.state[p]["exp_avg"].clone()) for p in params}
    lora_a = {m: next(p for p in policy.parameters(m) if p.dim() == 2).detach().clone() for m in MODELS}

    iterate(1)  # the models swapped roles: model_1 is the pioneer now
    assert role_assignment(1, ROLES, 1) == {"pioneer": "model_1", "observer": "model_0"}
    for model, opt in optimizers.items():
        moved = 0
        for p in opt.param_groups[0]["params"]:
            tensor, before = held[model][id(p)]
            assert opt.state[p]["exp_avg"] is tensor  # the same state object, updated in place
            assert int(opt.state[p]["step"]) == 2  # two steps: nothing was reset at the swap
            assert p.grad is None  # gradients are not kept between updates
            moved += not torch.equal(tensor, before)
        assert moved > len(opt.param_groups[0]["params"]) // 2  # the second step moved the moments
        assert not torch.equal(next(p for p in policy.parameters(model) if p.dim() == 2), lora_a[model])


def test_smoke_run_swaps_roles_and_keeps_state(tiny_model_dir, tmp_path, monkeypatch):
    import baselines.infra.evaluation

    real_evaluate, seen = baselines.infra.evaluation.evaluate, []

    def recording_evaluate(*args, **kwargs):
        seen.append(dict(kwargs["adapters"]))
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(baselines.infra.evaluation, "evaluate", recording_evaluate)
    config = Config(
        model=tiny_model_dir,
        num_iterations=2,
        batch_size=4,
        minibatch_size=2,
        num_ppo_epochs=2,
        min_new_tokens=3,
        max_new_tokens=6,
        learning_rate=1e-2,
        lora_rank=4,
        lora_alpha=8.0,
        swap_every=1,
        num_eval_problems=2,
        output_dir=str(tmp_path),
        run_name="cory",
        checkpoint_every=0,
        tensorboard=False,
        progress=False,
    )
    result = cory.main(config)
    rows = [r for r in read_metrics(config.run_dir() / "metrics.jsonl") if "charts/iteration" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert all(math.isfinite(v) for v in row.values()), row
    # Logged per model: the role played (0 pioneer, 1 observer) flips at the swap.
    assert [r["agent_model_0/role"] for r in rows] == [0.0, 1.0]
    assert [r["agent_model_1/role"] for r in rows] == [1.0, 0.0]
    for model in MODELS:
        for key in ("task_reward", "env_reward", "kl", "combined", "kl_coef"):
            assert f"agent_{model}/{key}" in rows[-1]
        row = rows[-1]
        eta = config.eta
        assert row[f"agent_{model}/combined"] == pytest.approx(
            row[f"agent_{model}/task_reward"] - eta * row[f"agent_{model}/kl"]
        )
        # The collective reward: both models receive pioneer + observer sentiment.
        assert row[f"agent_{model}/env_reward"] == pytest.approx(row["reward/total"])
    checkpoint = find_checkpoint(config.run_dir())
    states = torch.load(checkpoint / "optimizers.pt", weights_only=True)
    assert sorted(states) == list(MODELS)
    for model in MODELS:
        # 2 iterations x 2 epochs x 2 minibatches: one optimizer per model for the whole run.
        assert {int(s["step"]) for s in states[model]["state"].values()} == {8}
        assert any(t.abs().sum() > 0 for k, t in adapter_state(config.run_dir())[model].items() if "lora_B" in k)
    extra = json.loads((checkpoint / "trainer.json").read_text())["extra"]
    assert sorted(extra["kl_coef"]) == list(MODELS)
    assert "eval/sentiment_observer" in result and "eval_before/total" in result
    # Evaluations use the roles of the last trained iteration: before training iteration 0's, after it
    # iteration 1's (swapped).
    assert seen == [{"pioneer": "model_0", "observer": "model_1"}, {"pioneer": "model_1", "observer": "model_0"}]


def test_kl_in_loss_trains_both_models(tiny_model_dir, tmp_path):
    """--kl-in loss: each model's PPO loss carries the k3 KL term (fixed weight), its rewards no penalty."""
    config = Config(model=tiny_model_dir, num_iterations=2, batch_size=4, minibatch_size=4, num_ppo_epochs=1,
                    min_new_tokens=3, max_new_tokens=6, learning_rate=1e-2, lora_rank=4, lora_alpha=8.0, swap_every=1,
                    kl_in="loss", adaptive_kl=False, init_kl_coef=0.3, num_eval_problems=0,
                    output_dir=str(tmp_path), run_name="cory-kl-loss", checkpoint_every=0, tensorboard=False,
                    progress=False)
    cory.main(config)
    rows = [r for r in read_metrics(config.run_dir() / "metrics.jsonl") if "charts/iteration" in r]
    assert [r["agent_model_0/role"] for r in rows] == [0.0, 1.0]
    for row in rows:
        assert all(math.isfinite(v) for v in row.values()), row
        for model in MODELS:
            assert row[f"agent_{model}/kl_loss"] >= 0 and row[f"agent_{model}/kl_coef"] == 0.3
    for model in MODELS:
        assert rows[1][f"agent_{model}/kl_loss"] > 0  # moved from the reference by the first update
        assert any(t.abs().sum() > 0 for k, t in adapter_state(config.run_dir())[model].items() if "lora_B" in k)


def test_cli_train_cory_then_eval(tiny_model_dir, tmp_path, capsys):
    args = [
        "train",
        "cory",
        "--model",
        tiny_model_dir,
        "--num-iterations",
        "1",
        "--batch-size",
        "2",
        "--minibatch-size",
        "2",
        "--num-ppo-epochs",
        "1",
        "--max-new-tokens",
        "4",
        "--min-new-tokens",
        "4",
        "--num-eval-problems",
        "0",
        "--output-dir",
        str(tmp_path),
        "--run-name",
        "cli",
        "--no-tensorboard",
        "--no-progress",
    ]
    assert cli(args) == 0
    assert "model_0: task reward" in capsys.readouterr().out
    assert cli(["eval", "--checkpoint", str(tmp_path / "cli"), "--num-problems", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["env"] == "sentiment/imdb-cory-v0" and "eval/sentiment_pioneer" in result
    # The checkpoint records the roles the models played last, which eval loads (infra knows no CORY).
    trainer_path = find_checkpoint(tmp_path / "cli") / "trainer.json"
    trainer = json.loads(trainer_path.read_text())
    assert trainer["extra"]["adapters"] == {"pioneer": "model_0", "observer": "model_1"}
    assert trainer["extra"]["models"] == list(MODELS)
    # A checkpoint of an older version, without them, is refused by name.
    del trainer["extra"]["adapters"], trainer["extra"]["models"]
    trainer_path.write_text(json.dumps(trainer))
    assert cli(["eval", "--checkpoint", str(tmp_path / "cli"), "--num-problems", "2"]) == 2
    assert "llm-envs < 0.2.0" in capsys.readouterr().err
