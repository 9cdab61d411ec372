"""--compile-update: the policy-gradient update's micro-batches through one compiled graph
(baselines/rl/compiled_update.py): a real MAGRPO run whose every update is run both compiled and eager from
the same state, the bucket padding (eager: the loss and gradients do not change), the resolution of
``auto``, and the config's errors.

The compiled runs use the ``aot_eager`` backend: dynamo traces the micro-batch whole (``fullgraph``) and
AOTAutograd its backward, run by the eager kernels (no code generation, a few seconds a graph here);
``inductor`` is what a GPU run uses, and the slow test runs it once.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from numerics import BACKWARD_DEPTH, EPS32, TINY_K, assert_f32_close, assert_grads_close, f32_bound

from baselines.infra.metrics import read_metrics
from baselines.learners import magrpo
from baselines.learners.magrpo import Config
from baselines.rl import compiled_update
from baselines.rl.compiled_update import coarse_length, compile_wanted, compiled_slices, pad_rows, pad_to
from baselines.rl.policy_gradient import micro_batch_loss


def tiny_config(model_dir: str, tmp_path, **overrides) -> Config:
    from test_magrpo import tiny_config as magrpo_config

    return magrpo_config(model_dir, tmp_path, **overrides)


def close_to_eager(compiled: torch.Tensor, eager: torch.Tensor) -> None:
    """Gradients of the two paths, each within the backward chain's float32 bound of its own tensor's scale
    (tests/numerics.py); a gradient that is exactly zero in the eager update (LoRA's A while B is still 0)
    is exactly zero compiled too (the same products of zeros)."""
    bound = BACKWARD_DEPTH * TINY_K * EPS32 * float(eager.abs().max())
    assert float((compiled - eager).abs().max()) <= bound, (float((compiled - eager).abs().max()), bound)


# ----------------------------------------------------------------------------------------- a real run
def run_both_ways(config: Config, monkeypatch) -> tuple[dict, list[dict]]:
    """``magrpo.main(config)`` (compiled), with every agent update also run eagerly first from the same
    weights and optimizer state: the run goes on with the compiled update's weights, and each update's
    statistics, gradients (per epoch) and new weights of both ways are kept."""
    real = magrpo.update_agent
    eager_config = dataclasses.replace(config, compile_update="off")
    updates: list[dict] = []

    def both(policy, optimizer, agent, turns, advantages, cfg):
        params = policy.parameters(agent)
        start = [p.detach().clone() for p in params]
        state = copy.deepcopy(optimizer.state_dict())
        grads: list[list[torch.Tensor]] = []
        hook = optimizer.register_step_pre_hook(lambda *_: grads.append([p.grad.detach().clone() for p in params]))
        try:
            eager = real(policy, optimizer, agent, turns, advantages, eager_config)
            eager_weights = [p.detach().clone() for p in params]
            with torch.no_grad():
                for p, p0 in zip(params, start, strict=True):
                    p.copy_(p0)
            optimizer.load_state_dict(state)
            compiled = real(policy, optimizer, agent, turns, advantages, cfg)
        finally:
            hook.remove()
        epochs = len(grads) // 2
        updates.append(dict(agent=agent, eager=eager, compiled=compiled, eager_grads=grads[:epochs],
                            compiled_grads=grads[epochs:], eager_weights=eager_weights,
                            compiled_weights=[p.detach().clone() for p in params]))
        return compiled

    monkeypatch.setattr(magrpo, "update_agent", both)
    return magrpo.main(config), updates


def test_a_run_compiled_updates_as_the_eager_update(tiny_model_dir, tmp_path, monkeypatch, device):
    """Three MAGRPO iterations (two agents, two epochs: the second's clipped ratios, the KL term, two
    micro-batches a turn) with --compile-update on: every update's losses, gradients and new weights equal the
    eager update's from the same state, and the run's metrics report the compiles, a few graphs for all of
    the run's micro-batches."""
    lr = 1e-3
    config = tiny_config(tiny_model_dir, tmp_path, num_iterations=3, num_eval_problems=0, num_epochs=2,
                         kl_coef=0.1, kl_in="loss", micro_batch_size=2, learning_rate=lr, dtype="float32",
                         device=str(device), compile_update="on", compile_backend="aot_eager")
    result, updates = run_both_ways(config, monkeypatch)
    assert len(updates) == 3 * 2
    for update in updates:
        eager, compiled = update["eager"], update["compiled"]
        assert not set(compiled_update.CHARTS) & set(eager)  # the eager update reports no compiles
        for key in ("loss", "pg_loss", "kl"):
            # Each a weighted mean of log-probs (no cancellation: the rewards are >= 0 and the baseline is
            # none): within the forward chain's bound of its own size (tests/numerics.py).
            bound = f32_bound(torch.tensor(eager[key]))
            assert abs(compiled[key] - eager[key]) <= bound, (update["agent"], key, compiled[key], eager[key])
        assert compiled["clip_fraction"] == pytest.approx(eager["clip_fraction"], abs=1e-6)
        assert compiled["grad_norm"] == pytest.approx(eager["grad_norm"], rel=BACKWARD_DEPTH * TINY_K * EPS32)
        for epoch_compiled, epoch_eager in zip(update["compiled_grads"], update["eager_grads"], strict=True):
            assert any(float(g.abs().max()) > 0 for g in epoch_eager)
            for a, b in zip(epoch_compiled, epoch_eager, strict=True):
                close_to_eager(a, b)
        # Adam divides each gradient by its own size: an element whose gradient cancels to its rounding noise
        # steps by up to lr either way, at each epoch (tests/test_magrpo.py's micro-batch test measures it);
        # a wrong gradient moves most elements by O(lr).
        for a, b in zip(update["compiled_weights"], update["eager_weights"], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=2 * lr * config.num_epochs)
            assert float(((a - b).abs() > lr / 10).float().mean()) <= 0.1
    lines = read_metrics(config.run_dir() / "metrics.jsonl")
    assert [line["step"] for line in lines if "charts/update_compile_s" in line] == [1, 2, 3]
    assert lines[0]["charts/update_compile_s"] > 0  # the first iteration compiled
    shapes = [line["charts/update_compiled_shapes"] for line in lines if "charts/update_compiled_shapes" in line]
    assert shapes == sorted(shapes) and shapes[0] >= 4  # each agent's two epochs (ratios or none): two graphs
    # 3 iterations x 2 agents x 2 epochs x 2 micro-batches were compiled calls: the graphs are far fewer.
    assert shapes[-1] <= 12 < 24
    assert result["charts/update_compiled_shapes"] == shapes[-1]


@pytest.mark.slow
def test_inductor_compiles_the_update_and_matches_the_eager_one(tiny_model_dir, tmp_path, monkeypatch, device):
    """The product's backend (generated kernels) on one iteration: the same losses and gradients as eager."""
    config = tiny_config(tiny_model_dir, tmp_path, num_iterations=1, num_eval_problems=0, learning_rate=1e-3,
                         dtype="float32", device=str(device), compile_update="on", compile_backend="inductor")
    _, updates = run_both_ways(config, monkeypatch)
    for update in updates:
        eager, compiled = update["eager"], update["compiled"]
        assert abs(compiled["loss"] - eager["loss"]) <= f32_bound(torch.tensor(eager["loss"]))
        assert compiled["update_compile_s"] > 0
        for a, b in zip(update["compiled_grads"][0], update["eager_grads"][0], strict=True):
            close_to_eager(a, b)


# ----------------------------------------------------------------------------------------- the padding
@pytest.fixture(scope="module")
def scored(tiny_model_dir, device):
    """A policy with non-zero adapters (every gradient non-zero) and one agent's sampled rows: 2 prompts x 3
    samples, one prompt left-padded."""
    from agents import LoraSettings, MultiAgentPolicy

    policy = MultiAgentPolicy.from_pretrained(["brief", "detailed"], tiny_model_dir, lora=LoraSettings(rank=4),
                                              dtype="float32", device=str(device))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in policy.parameters("brief"):
            p.add_(0.1 * torch.randn(p.shape, generator=gen).to(p.device))
    prompts = torch.randint(10, 2000, (2, 7), generator=gen)
    prompt_mask = torch.ones_like(prompts)
    prompt_mask[1, :3] = 0
    joint = policy.generate_joint({a: (prompts, prompt_mask) for a in policy.agents}, 3, max_new_tokens=5,
                                  seeds=[1, 2])
    g = joint["brief"]
    rows = policy.checked_rows("brief", g.prompt_ids, g.prompt_mask, g.response_ids, g.response_mask)
    device_of = rows.response_ids.device
    advantages = torch.randn(6, generator=gen).to(device_of)
    with torch.no_grad():
        old = policy.logprobs_of("brief", rows) + 0.3 * torch.randn(6, g.response_ids.shape[1], generator=gen).to(
            device_of)
        reference = policy.ref_logprobs("brief", g.prompt_ids, g.prompt_mask, g.response_ids, g.response_mask)
    return policy, rows, advantages, old, reference


@pytest.mark.parametrize("aggregation", ["token-mean", "sequence-sum"])
@pytest.mark.parametrize("part", [slice(1, 6), slice(2, 4), slice(0, 1)])
def test_padding_changes_neither_the_loss_nor_the_gradients(scored, tiny_model_dir, tmp_path, aggregation, part):
    """Eager: a micro-batch padded as the compiled update pads it (rows with the first row's prompt and an
    empty response, prompt columns on the left, response columns on the right, the distinct prompts' count),
    and further, gives the unpadded micro-batch's loss, policy-gradient and KL terms, log-probs and
    gradients; with the ratios to old log-probs and the KL term, for both aggregations, on slices whose
    prompts repeat (1-6: 2 of one and 3 of the other), are distinct (2-4) or a single row."""
    policy, rows, advantages, old, reference = scored
    config = tiny_config(tiny_model_dir, tmp_path, kl_coef=0.1, kl_in="loss", loss_aggregation=aggregation)
    mask = rows.response_mask[part]
    n, p, t = len(mask), rows.prompt_ids.shape[1], mask.shape[1]
    counts = (float(mask.sum()) + 3.0, float(n) + 1.0)  # as if the turn had more rows in other micro-batches
    denominator = counts[0] if aggregation == "token-mean" else counts[1]
    params = policy.parameters("brief")

    def loss_and_grads(batch, adv, old_lp, ref, as_tensors):
        for q in params:
            q.grad = None
        den, tok = (torch.tensor(denominator, device=adv.device), torch.tensor(counts[0], device=adv.device)) \
            if as_tensors else (denominator, counts[0])
        out = micro_batch_loss(policy, "brief", batch, adv, config, old=old_lp, denominator=den, reference=ref,
                               kl_tokens=tok)
        out[0].backward()
        return out, [q.grad.clone() for q in params]

    plain, plain_grads = loss_and_grads(rows[part], advantages[part], old[part], reference[part], False)
    for n_rows, width, length in ((compiled_update._ceil_pow2(n), coarse_length(p), coarse_length(t)),
                                  (n + 5, p + 9, t + 7)):
        padded = pad_rows(rows[part], n_rows, width, length)
        assert padded.response_ids.shape == (n_rows, length) and padded.prompt_ids.shape == (n_rows, width)
        out, grads = loss_and_grads(padded, pad_to(advantages[part], n_rows), pad_to(old[part], n_rows, length),
                                    pad_to(reference[part], n_rows, length), True)
        for a, b in zip(out[:3], plain[:3], strict=True):
            assert_f32_close(a.detach(), b.detach())
        assert_f32_close(out[3][:n, :t].detach(), plain[3].detach())
        assert float(out[3][n:].detach().abs().max() if n_rows > n else 0) == 0  # pad rows score nothing
        assert_grads_close(grads, plain_grads)


def test_compiled_slices_cover_the_rows_within_the_budgets():
    """Every row once, in order; each pass a power of two of rows, within --micro-batch-size and, at the
    padded widths, within --micro-batch-tokens (a row wider than the budget: one row a pass)."""
    from types import SimpleNamespace as NS

    for n in range(1, 21):
        for size in (0, 1, 3, 8):
            for budget in (0, 40, 100, 2048):
                gen = NS(response_mask=torch.ones(n, 9), prompt_ids=torch.ones(n, 13))
                passes = compiled_slices(gen, NS(micro_batch_size=size, micro_batch_tokens=budget))
                assert [i for c, _ in passes for i in range(c.start, c.stop)] == list(range(n))
                width = coarse_length(13) + coarse_length(9)
                for c, rows in passes:
                    assert rows & (rows - 1) == 0 and c.stop - c.start <= rows
                    assert rows <= max(size or rows, 1) and rows * width <= max(budget or rows * width, width)
                if not size and not budget:
                    assert len(passes) == 1


# ----------------------------------------------------------------------------------------- the switch
def test_auto_compiles_on_cuda_only_and_off_never_compiles(scored, tiny_model_dir, tmp_path, monkeypatch, device):
    """``auto``: on for a CUDA device whose agent is scored by the fused decoder, off on the CPU; ``on``
    everywhere; ``off`` never. An update with ``off`` (and ``auto`` on the CPU) never calls torch.compile."""
    from baselines.infra.play import Turn
    from baselines.rl.compiled_update import AUTO_ENV
    from baselines.rl.policy_gradient import update_agent

    monkeypatch.delenv(AUTO_ENV, raising=False)  # (the suite sets it off: tests/conftest.py)
    assert compile_wanted("auto", "cpu") is False
    assert compile_wanted("auto", torch.device("cuda", 0)) is True
    assert compile_wanted("auto", "cuda", fused=False) is False
    monkeypatch.setenv(AUTO_ENV, "off")
    assert compile_wanted("auto", "cuda") is False and compile_wanted("on", "cpu") is True
    monkeypatch.setenv(AUTO_ENV, "on")
    assert compile_wanted("auto", "cpu") is True and compile_wanted("auto", "cpu", fused=False) is False
    monkeypatch.setenv(AUTO_ENV, "sometimes")
    with pytest.raises(ValueError, match="LLM_ENVS_COMPILE_UPDATE must be 'on', 'off' or unset, got 'sometimes'"):
        compile_wanted("auto", "cpu")
    monkeypatch.delenv(AUTO_ENV)
    assert compile_wanted("on", "cpu") is True and compile_wanted("off", "cuda") is False
    with pytest.raises(ValueError, match="got 'sometimes'"):
        compile_wanted("sometimes", "cpu")

    def refuse(*args, **kwargs):
        raise AssertionError("torch.compile was called")

    monkeypatch.setattr(torch, "compile", refuse)
    policy, rows, advantages, _, _ = scored
    joint = {a: policy.generate_joint({a: (rows.prompt_ids[:2], rows.prompt_mask[:2])}, 2, max_new_tokens=4,
                                      seeds=[3, 4])[a] for a in ("brief",)}
    turns = [Turn(prompts={}, responses=joint, rewards={}, infos={})]
    modes = ["off"] + (["auto"] if device.type == "cpu" else [])
    for mode in modes:
        config = tiny_config(tiny_model_dir, tmp_path, compile_update=mode)
        stats = update_agent(policy, torch.optim.SGD(policy.parameters("brief"), lr=1e-3), "brief", turns,
                             advantages[:4, None].cpu(), config)
        assert "update_compile_s" not in stats and math.isfinite(stats["loss"])


def test_on_refuses_a_policy_that_is_not_scored_by_the_fused_decoder(tiny_model_dir, tmp_path, device):
    from agents import LoraSettings, MultiAgentPolicy
    from baselines.infra.play import Turn
    from baselines.rl.policy_gradient import update_agent

    policy = MultiAgentPolicy.from_pretrained(["brief"], tiny_model_dir, lora=LoraSettings(rank=4), dtype="float32",
                                              device=str(device), backend="generate")
    prompts = torch.randint(10, 2000, (1, 5))
    joint = policy.generate_joint({"brief": (prompts, torch.ones_like(prompts))}, 2, max_new_tokens=3, seeds=[1])
    turns = [Turn(prompts={}, responses=joint, rewards={}, infos={})]
    config = tiny_config(tiny_model_dir, tmp_path, compile_update="on", compile_backend="aot_eager")
    with pytest.raises(ValueError, match="compile_update='on' compiles the fused decoder's passes"):
        update_agent(policy, torch.optim.SGD(policy.parameters("brief"), lr=1e-3), "brief", turns,
                     torch.ones(2, 1), config)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("compile_update", "sometimes", "compile_update must be 'auto', 'on' or 'off', got 'sometimes'"),
    ("compile_update", True, "compile_update must be 'auto', 'on' or 'off', got True"),
    ("compile_backend", "", "compile_backend must name a torch.compile backend, got ''"),
    ("compile_backend", None, "compile_backend must name a torch.compile backend, got None"),
])
def test_bad_settings_are_refused_quoting_the_value(field, value, message):
    with pytest.raises(ValueError) as err:
        Config(**{field: value})
    assert str(err.value) == message


def test_an_unknown_backend_is_refused_quoting_it():
    class Policy:  # any object that lives: the compiled loss is kept per policy
        pass

    with pytest.raises(ValueError, match=r"compile_backend must be one of torch's compile backends \(.*aot_eager.*"
                                         r"\), got 'nope'"):
        compiled_update.compiled_loss(Policy(), micro_batch_loss, "nope")
