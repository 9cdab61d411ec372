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
from numerics import assert_f32_close, assert_grads_close

from agents.rows import strip_left
from baselines.infra.checkpoints import CheckpointError, find_checkpoint
from baselines.infra.metrics import read_metrics
from baselines.learners import magrpo
from baselines.learners.magrpo import Config
from baselines.rl.policy_gradient import (
    discounted_returns,
    group_advantages,
    kl_penalized,
    kl_to_reference,
    policy_gradient_loss,
    sequence_kl,
)
from baselines.rl.tensors import masked_mean

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
    kept_ids, kept_mask = strip_left(ids, mask)
    assert kept_ids.tolist() == [[pad, 5, pad, 6], [7, 8, 9, 10]] and kept_mask.tolist() == [[0, 1, 1, 1], [1, 1, 1, 1]]
    with pytest.raises(ValueError, match="empty"):
        strip_left(ids, np.zeros_like(mask))


def test_sequence_kl_by_hand():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -1.0, 0.0]])
    ref = torch.tensor([[-1.0, -1.0, -9.0], [-1.0, -0.5, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]])
    # d = log ref - log pi, k3 = exp(d) - d - 1 per token, summed over the unmasked tokens:
    # row 0: d = 0 -> 0, d = 1 -> e - 2 (the pad's d = -6 would add 5.0025); row 1: d = -0.5 -> e^-0.5 - 0.5,
    # d = 0.5 -> e^0.5 - 1.5.
    expected = [math.e - 2.0, math.exp(-0.5) - 0.5 + math.exp(0.5) - 1.5]
    torch.testing.assert_close(sequence_kl(logprobs, ref, mask), torch.tensor(expected))
    assert expected[1] == pytest.approx(0.2552519, abs=1e-7)
    # Equal log-probs: no KL, whatever the tokens.
    torch.testing.assert_close(sequence_kl(logprobs, logprobs, mask), torch.zeros(2))
    with pytest.raises(ValueError, match=r"equal \(N, T\)"):
        sequence_kl(logprobs, ref[:, :2], mask)


def test_reward_penalty_comes_off_each_agents_reward_before_the_group_baseline():
    """One problem, G = 2, two turns, gamma 0.5, kl_coef 0.5: both agents get the same joint rewards, each
    pays for its own responses' KL, so their advantages differ."""
    config = Config(num_problems=1, num_generations=2, baseline="mean", gamma=0.5, kl_coef=0.5, kl_in="reward",
                    num_turns=2)
    joint = torch.tensor([[1.0, 2.0], [0.0, 2.0]])  # (N = G = 2, turns)
    kl_a = torch.tensor([[2.0, 0.0], [0.0, 4.0]])  # agent a's response KL per turn
    kl_b = torch.zeros(2, 2)  # agent b sampled what the reference would
    penalized = kl_penalized(joint, kl_a, config.kl_coef)
    torch.testing.assert_close(penalized, torch.tensor([[0.0, 2.0], [0.0, 0.0]]))
    # Returns: row 0: R_1 = 2, R_0 = 0 + 0.5 * 2 = 1; row 1: 0, 0. Turn groups: [1, 0] -> [0.5, -0.5];
    # [2, 0] -> [1, -1].
    returns = discounted_returns(penalized, config.gamma)
    torch.testing.assert_close(returns, torch.tensor([[1.0, 2.0], [0.0, 0.0]]))
    adv_a = magrpo.grouped_advantages(returns, 1, config)
    torch.testing.assert_close(adv_a, torch.tensor([[0.5, 1.0], [-0.5, -1.0]]))
    # Agent b: returns [[2, 2], [1, 2]] -> turn 0 [0.5, -0.5], turn 1 [0, 0].
    adv_b = magrpo.grouped_advantages(discounted_returns(kl_penalized(joint, kl_b, 0.5), 0.5), 1, config)
    torch.testing.assert_close(adv_b, torch.tensor([[0.5, 0.0], [-0.5, 0.0]]))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("kl_in", "returns", "kl_in must be 'reward' or 'loss', got 'returns'"),
        ("kl_coef", -0.1, "kl_coef must be >= 0, got -0.1"),
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


@pytest.mark.parametrize("kl_in", ["loss", "reward"])
def test_resume_matches_uninterrupted_run(tiny_model_dir, tmp_path, kl_in):
    kl = dict(num_epochs=2, kl_coef=0.1, kl_in=kl_in)
    straight = tiny_config(tiny_model_dir, tmp_path, run_name="straight", **kl)
    magrpo.main(straight)
    first = tiny_config(tiny_model_dir, tmp_path, run_name="split", num_iterations=1, **kl)
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


@pytest.mark.parametrize("kl_in", ["reward", "loss"])
def test_kl_in_reward_and_loss_train_and_log_the_kl(tiny_model_dir, tmp_path, varied_writing_reward, kl_in):
    config = tiny_config(tiny_model_dir, tmp_path, num_eval_problems=0, kl_coef=0.1, kl_in=kl_in)
    result = magrpo.main(config)
    numbers = {k: v for k, v in result.items() if isinstance(v, float)}
    assert all(math.isfinite(v) for v in numbers.values()), numbers
    rows = [r for r in read_metrics(config.run_dir() / "metrics.jsonl") if "losses/kl" in r]
    assert len(rows) == 2
    for agent in ("brief", "detailed"):
        # reward: k3 summed over a response; loss: its mean over tokens. The first iteration samples from
        # the reference itself (LoRA B = 0): ~0 up to rounding (measured: < 5e-7); after one update the
        # policy has moved (measured: 6e-5 to 1e-3).
        assert 0.0 <= rows[0][f"agent_{agent}/kl"] < 1e-5
        assert rows[1][f"agent_{agent}/kl"] > 2e-5
    for agent, state in adapter_state(config.run_dir()).items():
        assert sum(float(v.abs().sum()) for k, v in state.items() if "lora_B" in k) > 0, agent


def test_kl_in_reward_with_coefficient_zero_is_the_run_without_kl(tiny_model_dir, tmp_path, monkeypatch):
    """kl_coef 0 never calls the reference, in either form, and both compute the same update."""
    from agents import MultiAgentPolicy

    def no_reference(*args, **kwargs):
        raise AssertionError("the reference forward ran with kl_coef=0")

    monkeypatch.setattr(MultiAgentPolicy, "ref_logprobs", no_reference)
    common = dict(num_iterations=1, num_eval_problems=0, kl_coef=0.0)
    runs = {}
    for kl_in in ("loss", "reward"):
        config = tiny_config(tiny_model_dir, tmp_path, run_name=kl_in, kl_in=kl_in, **common)
        result = magrpo.main(config)
        assert "losses/kl" not in result
        runs[kl_in] = adapter_state(config.run_dir())
    for agent in runs["loss"]:
        for key, value in runs["loss"][agent].items():
            assert torch.equal(runs["reward"][agent][key], value), (agent, key)


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
    # The two sums of gradients differ in their last bits (float32 accumulation in other orders; on CUDA a
    # matmul's kernel, so its rounding, depends on its row count too). Adam divides each gradient by its own
    # size: an element whose summed gradient cancels to about its rounding noise gets a step of any sign, up
    # to ~lr, from either run, at each of the epochs. Measured: 1-11 of 128-256 elements of a matrix apart,
    # by 8e-5 to 1.6e-3 at lr 1e-3 (2-core EPYC, an H100; which elements cancel moves with the samples). A
    # wrong micro-batch weighting turns the update's direction, which moves most elements by O(lr), and the
    # logged losses below: at most a tenth of a matrix's elements apart by more than lr/10 (measured: up to
    # 3%, in the keys' adapters, whose gradients are the smallest), by at most 2 lr an epoch, is rounding.
    lr, epochs = common["learning_rate"], common["num_epochs"]
    changed = 0
    for agent in a:
        for key in a[agent]:
            torch.testing.assert_close(a[agent][key], b[agent][key], rtol=1e-4, atol=2 * lr * epochs)
            apart = ((a[agent][key] - b[agent][key]).abs() > lr / 10).float().mean()
            assert float(apart) <= 0.1, (agent, key, float(apart))
            changed += int(a[agent][key].abs().sum() > 0)
    assert changed > 0
    for key in ("agent_brief/pg_loss", "agent_brief/kl", "agent_detailed/loss", "agent_detailed/clip_fraction"):
        assert result_micro[key] == pytest.approx(result_full[key], rel=1e-4, abs=1e-6), key


def test_update_micro_batches_do_not_read_the_device_and_update_as_before(tiny_model_dir, tmp_path, monkeypatch,
                                                                          device):
    """The update checks each turn's rows, finds their repeated prompts and copies the advantages once; its
    micro-batches then score slices of those (policy.logprobs_of) without waiting for the device, and the
    update equals (bit for bit on the CPU) scoring every micro-batch with policy.logprobs (checks and search
    repeated).
    Under --device cuda the micro-batches' passes run with CUDA's synchronisation check set to raise."""
    from agents import LoraSettings, MultiAgentPolicy
    from agents import policy as policy_module
    from agents import scoring as scoring_module
    from baselines.infra.play import Turn
    from baselines.rl.policy_gradient import update_agent

    agents = ["brief", "detailed"]
    config = tiny_config(tiny_model_dir, tmp_path, micro_batch_size=3, num_epochs=2, kl_coef=0.1, kl_in="loss")
    policy = MultiAgentPolicy.from_pretrained(agents, tiny_model_dir, lora=LoraSettings(rank=4), dtype="float32",
                                              device=str(device))
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, 2000, (2, 6), generator=gen)
    prompt_mask = torch.ones_like(prompts)
    prompt_mask[1, :2] = 0
    joint = policy.generate_joint({a: (prompts, prompt_mask) for a in agents}, 4, max_new_tokens=6, seeds=[1, 2])
    turns = [Turn(prompts={}, responses=joint, rewards={}, infos={})]
    advantages = torch.randn(8, 1, generator=gen)  # 2 problems x 4 samples: micro-batches of 3 rows straddle them
    start = {a: [p.detach().clone() for p in policy.parameters(a)] for a in agents}

    def update() -> list[torch.Tensor]:
        torch.manual_seed(0)
        with torch.no_grad():
            for p, p0 in zip(policy.parameters("brief"), start["brief"], strict=True):
                p.copy_(p0)
        # SGD: a step in proportion to the gradient (Adam would turn a gradient's last bits into steps of ~lr)
        update_agent(policy, torch.optim.SGD(policy.parameters("brief"), lr=1e-2), "brief", turns, advantages, config)
        return [p.detach().clone() for p in policy.parameters("brief")]

    calls = {"check_rows": 0, "row_numbers": 0, "distinct_rows": 0}  # each reads the device

    def counting(name, real):
        def spy(*args):
            calls[name] += 1
            return real(*args)

        return spy

    for module, name in ((policy_module, "check_rows"), (scoring_module, "row_numbers"),
                         (scoring_module, "distinct_rows")):
        monkeypatch.setattr(module, name, counting(name, getattr(module, name)))
    real_of = policy.logprobs_of

    def quiet(*args, **kwargs):  # on CUDA: any synchronisation in a micro-batch's pass raises
        if device.type != "cuda":
            return real_of(*args, **kwargs)
        torch.cuda.set_sync_debug_mode("error")
        try:
            return real_of(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode(0)

    monkeypatch.setattr(policy, "logprobs_of", quiet)
    new = update()
    # One turn: its prompts and responses checked once and its prompts numbered once for 3 micro-batches x 2
    # epochs; the rest is the reference's pass (kl_in="loss"), once an update through policy.ref_logprobs.
    assert calls == {"check_rows": 2 + 2 * 3, "row_numbers": 1, "distinct_rows": 3}, calls
    monkeypatch.setattr(policy, "logprobs_of", lambda agent, r, temperature: policy.logprobs(
        agent, r.prompt_ids, r.prompt_mask, r.response_ids, r.response_mask, temperature=temperature))
    old = update()
    assert any(not torch.equal(a, b) for a, b in zip(new, start["brief"]))  # it trained
    for a, b in zip(new, old, strict=True):
        if device.type == "cpu":
            assert torch.equal(a, b)
        else:  # CUDA's index_add (the backward of gathering a shared prompt's rows) sums in any order
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_update_loss_and_backward_compile_whole_and_equal_the_eager_update(tiny_model_dir, tmp_path, device):
    """The update's micro-batch (baselines.rl.policy_gradient.micro_batch_loss: the fused forward, the clipped
    policy-gradient loss and the KL term) compiles with ``fullgraph=True`` (no graph break: nothing read back
    to the host, as a captured GPU graph needs) through AOTAutograd (the backward traced too), as
    --compile-update runs it (baselines/rl/compiled_update.py), and gives the eager update's losses, gradients
    and weights after an optimizer step. tests/test_compiled_update.py runs it inside a learner."""
    from agents import LoraSettings, MultiAgentPolicy
    from baselines.rl.compiled_update import compiled_loss
    from baselines.rl.policy_gradient import micro_batch_loss

    config = tiny_config(tiny_model_dir, tmp_path, kl_coef=0.1, kl_in="loss", clip_eps=0.2)
    policy = MultiAgentPolicy.from_pretrained(["brief", "detailed"], tiny_model_dir, lora=LoraSettings(rank=4),
                                              dtype="float32", device=str(device))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # non-zero adapters (B starts at 0): every gradient is non-zero
        for p in policy.parameters("brief"):
            p.add_(0.1 * torch.randn(p.shape, generator=gen).to(p.device))
    prompts = torch.randint(10, 2000, (2, 6), generator=gen)
    joint = policy.generate_joint({a: (prompts, torch.ones_like(prompts)) for a in policy.agents}, 3,
                                  max_new_tokens=5, seeds=[1, 2])
    g = joint["brief"]
    rows = policy.checked_rows("brief", g.prompt_ids, g.prompt_mask, g.response_ids, g.response_mask)
    advantages = torch.randn(6, generator=gen).to(rows.response_ids.device)
    with torch.no_grad():
        old = policy.logprobs_of("brief", rows) + 0.3 * torch.randn(6, g.response_ids.shape[1], generator=gen).to(
            advantages.device)
        reference = policy.ref_logprobs("brief", g.prompt_ids, g.prompt_mask, g.response_ids, g.response_mask)
    start = [p.detach().clone() for p in policy.parameters("brief")]

    def update(compiled: bool) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
        with torch.no_grad():
            for p, p0 in zip(policy.parameters("brief"), start, strict=True):
                p.copy_(p0)
                p.grad = None
        # SGD: a step in proportion to the gradient (Adam turns a cancelling gradient's last bits into ~lr)
        optimizer = torch.optim.SGD(policy.parameters("brief"), lr=1e-2)
        # One micro-batch (a compile costs ~5 s here) of rows 1-5: prompts shared by 2 and 3 rows, ratios to the
        # old log-probs clipped, the KL term, both as sums over a turn's token count.
        args = (policy, "brief", rows[1:6], advantages[1:6], config)
        kwargs = dict(old=old[1:6], reference=reference[1:6], kl_tokens=13.0, denominator=13.0)
        if compiled:  # the loss and its backward
            loss, pg, kl, _ = compiled_loss(policy, micro_batch_loss, "aot_eager").run("brief", 1, *args, **kwargs)
        else:
            loss, pg, kl, _ = micro_batch_loss(*args, **kwargs)
            loss.backward()
        losses = [loss.detach(), pg.detach(), kl.detach()]
        grads = [p.grad.clone() for p in policy.parameters("brief")]
        optimizer.step()
        return losses, grads, [p.detach().clone() for p in policy.parameters("brief")]

    eager = update(compiled=False)
    compiled = update(compiled=True)
    # The same ATen ops in the same order (AOTAutograd's eager backend): equal up to its re-association of a
    # few element-wise ops; float32 rounding of this tiny model's sums, as tests/numerics.py bounds it.
    for a, b in zip(compiled[0], eager[0], strict=True):
        assert_f32_close(a, b)
    assert_grads_close(compiled[1], eager[1])
    for a, b, p0 in zip(compiled[2], eager[2], start, strict=True):
        assert not torch.equal(b, p0)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


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
    # A budget of 0: with the default ("auto") both runs would keep every layer and compare nothing.
    common = dict(num_iterations=1, num_eval_problems=0, learning_rate=1e-3, activation_budget_mb=0)
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
    from baselines.infra.evaluation import pass_metrics

    got = pass_metrics({"reward_tests": values, "reward_syntax": [1.0] * len(values)}, ["syntax", "tests"],
                       n_problems, n_samples, ks)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value)


def test_eval_pass_at_k_per_role_on_cory_components():
    from baselines.infra.evaluation import pass_metrics

    info = {"reward_correct_pioneer": [1, 0], "reward_correct_observer": [1, 1]}
    assert pass_metrics(info, ["correct_pioneer", "correct_observer"], 1, 2, [1]) == {
        "eval/pass@1_pioneer": 0.5, "eval/pass@1_observer": 1.0}


def test_checkpoint_of_an_older_version_resumes_when_new_settings_are_at_their_defaults(tiny_model_dir, tmp_path):
    """A checkpoint written before a setting existed (no ``kl_in`` in its config) resumes while the run
    keeps that setting at its default (what the old code computed), and is refused otherwise."""
    config = tiny_config(tiny_model_dir, tmp_path, num_iterations=1, num_eval_problems=0)
    magrpo.main(config)
    trainer_path = find_checkpoint(config.run_dir()) / "trainer.json"
    trainer = json.loads(trainer_path.read_text())
    del trainer["config"]["kl_in"]
    trainer_path.write_text(json.dumps(trainer))
    resume = dataclasses.replace(config, num_iterations=2, resume=True)
    with pytest.raises(CheckpointError, match=r"kl_in: checkpoint '<missing>', now 'reward'"):
        magrpo.main(dataclasses.replace(resume, kl_in="reward"))
    assert magrpo.main(resume)["charts/iteration"] == 2


def test_validation_problems_are_held_out_of_training_and_scored_at_the_end(tiny_model_dir, tmp_path, monkeypatch):
    from llm_envs.tasks.writing import WritingTask

    # XSum's train split cut to its first 6 articles (900 in all, each scored once per validation):
    # holding out 5 leaves article 0 alone for training.
    real = WritingTask.problems
    monkeypatch.setattr(WritingTask, "problems", lambda self, split: real(self, split)[:6] if split == "train"
                        else real(self, split))
    config = tiny_config(tiny_model_dir, tmp_path, num_iterations=2, num_validation_problems=5, samples_every=1)
    result = magrpo.main(config)
    records = [json.loads(line) for line in (config.run_dir() / "samples.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    assert train and {r["task_index"] for r in train} == {0}
    assert all(r["split"] == "eval" for r in records if r["kind"] == "eval")  # transcripts: the eval split only
    assert math.isfinite(result["val/total"]) and "eval/total" in result and "val/structure" in result
    last = read_metrics(config.run_dir() / "metrics.jsonl")[-1]
    assert last["val/total"] == result["val/total"] and "eval/total" in last
    with pytest.raises(ValueError, match="must leave training problems"):
        magrpo.main(tiny_config(tiny_model_dir, tmp_path, run_name="all", num_validation_problems=6))


def test_metrics_file_is_strict_json_with_nan_as_null(tmp_path):
    from baselines.infra.metrics import MetricLogger

    logger = MetricLogger(tmp_path, tensorboard=False)
    logger.log(1, {"losses/a": float("nan"), "pref/b": float("inf"), "eval/total": 0.5})
    logger.close()
    line = (tmp_path / "metrics.jsonl").read_text().splitlines()[0]
    assert json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in {line}")) == {
        "step": 1, "losses/a": None, "pref/b": None, "eval/total": 0.5}
    row = read_metrics(tmp_path / "metrics.jsonl")[0]
    assert math.isnan(row["losses/a"]) and math.isnan(row["pref/b"]) and row["eval/total"] == 0.5
