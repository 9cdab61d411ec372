"""MAGRPO: the math against hand-computed values, a smoke run, exact resume, Ctrl-C, bad checkpoints.

Training runs use a tiny Llama (built in process over the real default tokenizer, as in
tests/test_agents.py) saved to a session directory, on ``writing/xsum-v0`` with short sources.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
import tyro

from baselines import magrpo
from baselines.checkpoints import CheckpointError, find_checkpoint
from baselines.magrpo import Config
from baselines.metrics import read_metrics
from baselines.policy_gradient import discounted_returns, group_advantages, kl_to_reference, policy_gradient_loss
from baselines.tensors import masked_mean, strip_left_padding

# ----------------------------------------------------------------------------------------- math
R = torch.tensor([[1.0, 2.0, 3.0, 6.0], [5.0, 5.0, 5.0, 5.0]])


@pytest.mark.parametrize(
    ("baseline", "expected_row0"),
    [
        ("mean", [-2.0, -1.0, 0.0, 3.0]),
        ("rloo", [1 - 11 / 3, 2 - 10 / 3, 3 - 9 / 3, 6 - 6 / 3]),
        ("max", [-5.0, -4.0, -3.0, 0.0]),
        ("none", [1.0, 2.0, 3.0, 6.0]),
    ],
)
def test_group_advantages_baselines(baseline, expected_row0):
    adv = group_advantages(R, baseline)
    assert adv.shape == (2, 4)
    torch.testing.assert_close(adv[0], torch.tensor(expected_row0))
    expected_row1 = [5.0] * 4 if baseline == "none" else [0.0] * 4
    torch.testing.assert_close(adv[1], torch.tensor(expected_row1))


def test_group_advantages_std_normalisation():
    adv = group_advantages(R, "mean", normalize_std=True)
    std = math.sqrt(14 / 3)  # deviations 2, 1, 0, 3 -> squares 4+1+0+9, unbiased over 3
    torch.testing.assert_close(adv[0], torch.tensor([-2.0, -1.0, 0.0, 3.0]) / std)
    # A group of equal returns: std 0 is clamped at 1e-6, the advantage is 0, never NaN.
    torch.testing.assert_close(adv[1], torch.zeros(4))


def test_group_advantages_bad_input():
    with pytest.raises(ValueError, match="'median'"):
        group_advantages(R, "median")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"\(B, G\)"):
        group_advantages(R[0])


def test_discounted_returns():
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 0.0, 0.0]])
    # R2 = 2, R1 = 0 + 0.5 * 2 = 1, R0 = 1 + 0.5 * 1 = 1.5
    torch.testing.assert_close(discounted_returns(rewards, 0.5), torch.tensor([[1.5, 1.0, 2.0], [0.0, 0.0, 0.0]]))
    torch.testing.assert_close(discounted_returns(rewards, 0.0), rewards)


LOGPROBS = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])
ADV = torch.tensor([2.0, -1.0])


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [
        # -A * logp on unmasked tokens: row 0: 2, 4; row 1: -4. Three tokens: (2 + 4 - 4) / 3.
        ("token-mean", 2.0 / 3.0),
        # per response: 6 and -4, mean over two responses.
        ("sequence-sum", 1.0),
    ],
)
def test_policy_gradient_loss_masks(aggregation, expected):
    logprobs = LOGPROBS.clone().requires_grad_(True)
    loss = policy_gradient_loss(logprobs, ADV, MASK, aggregation)
    assert loss.item() == pytest.approx(expected)
    loss.backward()
    # Pads get no gradient; the last real token of each row (the EOS in an env response) does.
    assert torch.all(logprobs.grad[MASK == 0] == 0)
    assert logprobs.grad[0, 1] != 0 and logprobs.grad[1, 0] != 0


def test_policy_gradient_loss_clipped_ratio():
    old = LOGPROBS - math.log(2.0)  # ratio 2 everywhere
    loss = policy_gradient_loss(LOGPROBS, ADV, MASK, "token-mean", old_logprobs=old, clip_eps=0.2)
    # A = 2 > 0: min(2 * 2, 1.2 * 2) = 2.4 -> -2.4 per token (two tokens); A = -1: min(-2, -1.2) = -2 -> +2.
    assert loss.item() == pytest.approx((-2.4 * 2 + 2.0) / 3)
    # At ratio 1 the surrogate's value is -A per token (row sums -4 and 1) and its gradient is the
    # plain policy gradient's.
    plain, surrogate = LOGPROBS.clone().requires_grad_(True), LOGPROBS.clone().requires_grad_(True)
    policy_gradient_loss(plain, ADV, MASK, "sequence-sum").backward()
    same = policy_gradient_loss(surrogate, ADV, MASK, "sequence-sum", old_logprobs=LOGPROBS.clone())
    assert same.item() == pytest.approx((-4.0 + 1.0) / 2)
    same.backward()
    torch.testing.assert_close(surrogate.grad, plain.grad)


def test_masked_mean_kl_and_strip():
    assert masked_mean(torch.tensor([[1.0, 2.0, 9.0]]), torch.tensor([[1, 1, 0]])).item() == pytest.approx(1.5)
    rows = masked_mean(torch.tensor([[1.0, 3.0], [7.0, 7.0]]), torch.tensor([[1, 1], [0, 0]]), dim=1)
    torch.testing.assert_close(rows, torch.tensor([2.0, 0.0]))
    kl = kl_to_reference(torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -1.0]))
    assert kl[0].item() == 0.0 and kl[1].item() == pytest.approx(math.exp(1.0) - 1.0 - 1.0)
    pad = 2  # the pad id also occurs as a real token inside the prompt: only the mask decides
    ids = np.array([[pad, pad, pad, 5, pad, 6], [pad, pad, 7, 8, 9, 10]])
    mask = np.array([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    kept_ids, kept_mask = strip_left_padding(ids, mask)
    assert kept_ids.tolist() == [[pad, 5, pad, 6], [7, 8, 9, 10]] and kept_mask.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]
    with pytest.raises(ValueError, match="empty"):
        strip_left_padding(ids, np.zeros_like(mask))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_generations", 1, "num_generations=1"),
        ("baseline", "median", "'median'"),
        ("top_p", 1.5, "1.5"),
        ("clip_eps", 0.0, "0.0"),
        ("num_problems", 0, "got 0"),
        ("loss_aggregation", "sum", "'sum'"),
    ],
)
def test_config_rejects_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        Config(**{field: value})


# ----------------------------------------------------------------------------------------- runs
def tiny_config(model_dir: str, tmp_path, **overrides) -> Config:
    settings = dict(
        model=model_dir,
        max_source_words=20,
        num_iterations=2,
        num_problems=2,
        num_generations=2,
        max_new_tokens=24,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=1e-2,
        lora_rank=4,
        lora_alpha=8.0,
        baseline="none",
        num_eval_problems=1,
        output_dir=str(tmp_path),
        run_name="run",
        checkpoint_every=0,
        tensorboard=False,
        progress=False,
        threads=None,
    )
    settings.update(overrides)
    return Config(**settings)


def adapter_state(run_dir) -> dict[str, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    policy_dir = find_checkpoint(run_dir) / "policy"
    return {
        f.name.split(".")[0]: load_file(str(f)) for f in sorted(policy_dir.glob("*.adapter.safetensors"))
    }


def test_smoke_two_iterations(tiny_model_dir, tmp_path, varied_writing_reward):
    config = tiny_config(tiny_model_dir, tmp_path, tensorboard=True)
    result = magrpo.main(config)
    run_dir = config.run_dir()
    numbers = {k: v for k, v in result.items() if isinstance(v, float)}
    assert all(math.isfinite(v) for v in numbers.values()), numbers
    for key in ("reward/total", "reward/structure", "losses/pg_loss", "charts/s_per_iteration", "eval/total",
                "eval_before/total", "agent_brief/loss", "agent_detailed/grad_norm"):
        assert key in result, key
    # LoRA B starts at zero: non-zero B weights in each agent's saved adapter means it was trained.
    states = adapter_state(run_dir)
    assert sorted(states) == ["brief", "detailed"]
    for agent, state in states.items():
        b_norm = sum(float(v.abs().sum()) for k, v in state.items() if "lora_B" in k)
        assert b_norm > 0, f"adapter of {agent} did not change"
    assert states["brief"].keys() == states["detailed"].keys()
    assert any(not torch.equal(states["brief"][k], states["detailed"][k]) for k in states["brief"])
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows if "reward/total" in r] == [1, 2]
    prefixes = ("charts/", "losses/", "reward/", "eval/", "agent_")
    assert all(k.startswith(prefixes) for r in rows for k in r if k != "step")
    assert list((run_dir / "tb").glob("events.*")) and (run_dir / "learning_curves.png").is_file()


def test_resume_matches_uninterrupted_run(tiny_model_dir, tmp_path):
    straight = tiny_config(tiny_model_dir, tmp_path, run_name="straight", num_epochs=2, kl_coef=0.1)
    magrpo.main(straight)
    first = tiny_config(tiny_model_dir, tmp_path, run_name="split", num_epochs=2, kl_coef=0.1, num_iterations=1)
    magrpo.main(first)
    magrpo.main(dataclasses.replace(first, num_iterations=2, resume=True))
    a, b = adapter_state(straight.run_dir()), adapter_state(first.run_dir())
    for agent in a:
        for key in a[agent]:
            torch.testing.assert_close(a[agent][key], b[agent][key], rtol=0, atol=0)

    def training_rows(run_dir):
        return [{k: v for k, v in r.items() if k.startswith(("reward/", "losses/", "agent_"))} | {"step": r["step"]}
                for r in read_metrics(run_dir / "metrics.jsonl") if "reward/total" in r]

    assert training_rows(straight.run_dir()) == training_rows(first.run_dir())
    # Both end with the same final evaluation (the split run also evaluated at its pause, step 1).
    last = [read_metrics(c.run_dir() / "metrics.jsonl")[-1] for c in (straight, first)]
    assert last[0] == last[1] and "eval/total" in last[0]


@pytest.mark.parametrize("aggregation", ["token-mean", "sequence-sum"])
def test_micro_batches_give_the_full_batch_update(tiny_model_dir, tmp_path, aggregation):
    """Gradient accumulation over micro-batches of 1 row equals one full-batch step (float rounding aside),
    KL and a second (clipped) epoch included; the logged losses agree too."""
    common = dict(num_epochs=2, kl_coef=0.1, num_iterations=1, loss_aggregation=aggregation, num_eval_problems=0,
                  learning_rate=1e-3)
    full = tiny_config(tiny_model_dir, tmp_path, run_name=f"full-{aggregation}", **common)
    micro = tiny_config(tiny_model_dir, tmp_path, run_name=f"micro-{aggregation}", micro_batch_size=1, **common)
    result_full, result_micro = magrpo.main(full), magrpo.main(micro)
    a, b = adapter_state(full.run_dir()), adapter_state(micro.run_dir())
    changed = 0
    for agent in a:
        for key in a[agent]:
            torch.testing.assert_close(a[agent][key], b[agent][key], rtol=1e-4, atol=1e-6)
            changed += int(a[agent][key].abs().sum() > 0)
    assert changed > 0
    for key in ("agent_brief/pg_loss", "agent_brief/kl", "agent_detailed/loss", "agent_detailed/clip_fraction"):
        assert result_micro[key] == pytest.approx(result_full[key], rel=1e-4, abs=1e-6), key


def test_no_gradient_checkpointing_reaches_the_fused_forward_and_gives_the_same_update(
    tiny_model_dir, tmp_path, monkeypatch
):
    from agents import decoder

    seen = []

    def spying(name):
        real = getattr(decoder.FusedDecoder, name)

        def spy(self, *args, checkpoint=False, **kwargs):
            if torch.is_grad_enabled():
                seen.append((name, checkpoint))
            return real(self, *args, checkpoint=checkpoint, **kwargs)

        monkeypatch.setattr(decoder.FusedDecoder, name, spy)

    spying("hidden_states")
    spying("hidden_states_shared")  # the G samples of a problem share its prompt
    common = dict(num_iterations=1, num_eval_problems=0, learning_rate=1e-3)
    states = {}
    for flag in (True, False):
        seen.clear()
        config = tiny_config(tiny_model_dir, tmp_path, run_name=f"ckpt-{flag}", gradient_checkpointing=flag, **common)
        magrpo.main(config)
        assert seen and {c for _, c in seen} == {flag}, seen  # every gradient pass went through the fused forward
        assert ("hidden_states_shared", flag) in seen
        states[flag] = adapter_state(config.run_dir())
    for agent in states[True]:
        for key, value in states[True][agent].items():
            torch.testing.assert_close(states[False][agent][key], value, rtol=1e-5, atol=1e-7)


def test_no_share_prompts_computes_every_row_whole(tiny_model_dir, tmp_path, monkeypatch):
    from agents import decoder

    calls = []
    real = decoder.FusedDecoder.hidden_states_shared

    def spy(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(decoder.FusedDecoder, "hidden_states_shared", spy)
    config = tiny_config(tiny_model_dir, tmp_path, num_iterations=1, num_eval_problems=0, share_prompts=False)
    assert tyro.cli(Config, args=["--no-share-prompts"]).share_prompts is False
    magrpo.main(config)
    assert not calls
    magrpo.main(dataclasses.replace(config, share_prompts=True, run_name="shared"))
    assert calls


def test_keyboard_interrupt_saves_checkpoint(tiny_model_dir, tmp_path, monkeypatch):
    calls = {"n": 0}
    real = magrpo.update_agent

    def interrupt_on_second_iteration(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # two agents per iteration: the first agent of iteration 2
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(magrpo, "update_agent", interrupt_on_second_iteration)
    config = tiny_config(tiny_model_dir, tmp_path, num_iterations=3, num_eval_problems=0)
    with pytest.raises(KeyboardInterrupt):
        magrpo.main(config)
    trainer = json.loads((find_checkpoint(config.run_dir()) / "trainer.json").read_text())
    assert trainer["step"] == 1 and trainer["learner"] == "magrpo"
    # Without --resume the run directory is protected; with it, training continues to the end.
    with pytest.raises(FileExistsError, match="--resume"):
        magrpo.main(config)
    monkeypatch.setattr(magrpo, "update_agent", real)
    result = magrpo.main(dataclasses.replace(config, resume=True))
    assert result["charts/iteration"] == 3
    fresh = magrpo.main(dataclasses.replace(config, num_iterations=1, overwrite=True))
    assert fresh["charts/iteration"] == 1
    assert [r["step"] for r in read_metrics(config.run_dir() / "metrics.jsonl")] == [1]


def test_bad_checkpoints_give_clear_errors(tiny_model_dir, tmp_path):
    config = tiny_config(tiny_model_dir, tmp_path, num_iterations=1, num_eval_problems=0)
    with pytest.raises(CheckpointError, match="no checkpoint found"):
        magrpo.main(dataclasses.replace(config, resume=True))
    magrpo.main(config)
    resume = dataclasses.replace(config, num_iterations=2, resume=True)
    with pytest.raises(CheckpointError, match=r"different config \(learning_rate: checkpoint 0.01, now 0.5\)"):
        magrpo.main(dataclasses.replace(resume, learning_rate=0.5))
    directory = find_checkpoint(config.run_dir())
    optimizers = directory / "optimizers.pt"
    saved = optimizers.read_bytes()
    optimizers.write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="corrupt checkpoint file .*optimizers.pt"):
        magrpo.main(resume)
    optimizers.write_bytes(saved)
    (directory / "trainer.json").write_text("{ truncated")
    with pytest.raises(CheckpointError, match="corrupt checkpoint file .*trainer.json"):
        magrpo.main(resume)


@pytest.mark.parametrize(
    "values, n_problems, n_samples, ks, expected",
    [
        # problem 0: 1 of 3 pass -> pass@1 1/3, pass@2 1 - C(2,2)/C(3,2) = 2/3, pass@3 1;
        # problem 1: 0 of 3 -> 0. Means: 1/6, 1/3, 1/2.
        ([1, 0, 0, 0, 0, 0], 2, 3, [1, 2, 3], {"eval/pass@1": 1 / 6, "eval/pass@2": 1 / 3, "eval/pass@3": 0.5}),
        # problem 0: 2 of 2; problem 1: 1 of 2 -> pass@1 (1 + 0.5)/2, pass@2 (1 + 1)/2; k=5 > n is left out.
        ([1, 1, 0, 1], 2, 2, [1, 2, 5], {"eval/pass@1": 0.75, "eval/pass@2": 1.0}),
        # a partial pass (0.5 of the tests) is not a pass
        ([0.5, 1.0], 1, 2, [1], {"eval/pass@1": 0.5}),
    ],
)
def test_eval_pass_at_k_against_hand_computed_cases(values, n_problems, n_samples, ks, expected):
    from baselines.evaluation import pass_metrics

    got = pass_metrics({"reward_tests": values, "reward_syntax": [1.0] * len(values)}, ["syntax", "tests"],
                       n_problems, n_samples, ks)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value)


def test_eval_pass_at_k_per_role_on_cory_components():
    from baselines.evaluation import pass_metrics

    info = {"reward_correct_pioneer": [1, 0], "reward_correct_observer": [1, 1]}
    assert pass_metrics(info, ["correct_pioneer", "correct_observer"], 1, 2, [1]) == {
        "eval/pass@1_pioneer": 0.5, "eval/pass@1_observer": 1.0}
