"""Activation checkpointing that follows a memory budget (agents/decoder.py ``FusedDecoder._stack``,
agents/memory.py ``auto_activation_budget_mb``): a gradient pass recomputes in its backward only the
layers whose activations do not fit in ``activation_budget_mb``, ``"auto"`` reads that budget from the
free memory of the pass's device, and every budget gives the same log-probs, values and gradients.

Why equal bit for bit on the CPU: a recomputed layer replays the same ops on the same inputs in the
same order (no dropout, the same shapes and threads), so its activations are the same numbers, and the
backward runs the same graph whichever layers kept theirs. On CUDA some backward kernels (index_add,
embedding's backward) accumulate with atomics in an order that varies from run to run, with or without
checkpointing, so there the gradients agree to float32 rounding (tests/numerics.py) instead.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from numerics import assert_grads_close
from tiny_models import tiny_model

from agents import LoraSettings, MultiAgentPolicy, memory
from agents import decoder as decoder_module
from llm_envs.tokenizers import load_tokenizer

AGENTS = ("helper", "main")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(None)


def make_policy(tokenizer, **kwargs) -> MultiAgentPolicy:
    """Two agents with non-zero adapters (B starts at 0) and value heads, on the testing device."""
    policy = MultiAgentPolicy(tiny_model(tokenizer), tokenizer, AGENTS, lora=LoraSettings(rank=4),
                              value_head=True, **kwargs)
    torch.manual_seed(1)
    with torch.no_grad():
        for agent in AGENTS:
            for param in policy.parameters(agent):
                param.add_(0.3 * torch.randn(param.shape, dtype=param.dtype).to(param.device))
    return policy


def batch(tokenizer, device, shared: bool):
    """Left-padded prompts and right-padded responses (one ends early); with ``shared``, two problems of
    two samples each (the fused forward then computes each prompt once), else four distinct prompts."""
    g = torch.Generator().manual_seed(0)
    lengths = [5, 5, 8, 8] if shared else [5, 9, 3, 8]
    width, n, response = max(lengths), len(lengths), 7
    p_ids = torch.full((n, width), tokenizer.pad_token_id)
    p_mask = torch.zeros(n, width, dtype=torch.long)
    for i, length in enumerate(lengths):
        if shared and i % 2:
            p_ids[i], p_mask[i] = p_ids[i - 1], p_mask[i - 1]
            continue
        p_ids[i, width - length:] = torch.randint(5, 1000, (length,), generator=g)
        p_mask[i, width - length:] = 1
    r_ids = torch.randint(5, 1000, (n, response), generator=g)
    r_mask = torch.ones(n, response, dtype=torch.long)
    r_mask[1, response - 3:] = 0
    r_ids[1, response - 3:] = tokenizer.pad_token_id
    return tuple(t.to(device) for t in (p_ids, p_mask, r_ids, r_mask))


def loss_and_grads(policy, agent, rows):
    policy.train()
    for p in policy.parameters(agent):
        p.grad = None
    logprobs, values = policy.forward(agent, *rows, with_values=True)
    mask = rows[3].float()
    (-(logprobs * mask).sum() + ((values - 0.5) ** 2 * mask).sum()).backward()
    grads = [p.grad.clone() for p in policy.parameters(agent)]
    policy.eval()
    return logprobs.detach(), values.detach(), grads


def assert_same_update(result, reference, device) -> None:
    """Equal bit for bit on the CPU; on CUDA the gradients to float32 rounding (the module docstring)."""
    for a, b in zip(result[:2], reference[:2]):
        assert torch.equal(a, b)
    if device.type == "cpu":
        assert all(torch.equal(a, b) for a, b in zip(result[2], reference[2], strict=True))
    else:
        assert_grads_close(result[2], reference[2])


@pytest.mark.parametrize("shared", [False, True], ids=["whole-rows", "shared-prompts"])
def test_each_budget_recomputes_the_layers_that_do_not_fit_and_gives_the_same_update(
    tokenizer, device, monkeypatch, count_calls, shared
):
    policy = make_policy(tokenizer, activation_budget_mb=0)
    rows = batch(tokenizer, device, shared)
    layers = len(policy.engine.causal_lm.model.layers)
    assert layers == 2
    estimates = []
    real_estimate = decoder_module.FusedDecoder.activation_bytes

    def recording(self, tokens):
        estimates.append(real_estimate(self, tokens))
        return estimates[-1]

    monkeypatch.setattr(decoder_module.FusedDecoder, "activation_bytes", recording)
    checkpoints = count_calls(decoder_module.torch.utils.checkpoint, "checkpoint")
    full_recompute = loss_and_grads(policy, "main", rows)
    assert len(checkpoints) == layers and len(estimates) == 1  # one gradient pass, every layer recomputed
    per_layer_mb = estimates[0] / 2**20
    assert per_layer_mb > 0
    cases = {  # budget -> layers recomputed
        0.5 * per_layer_mb: 2,  # not even one layer fits
        1.5 * per_layer_mb: 1,  # the first layer keeps its activations, the second is recomputed
        2.0 * per_layer_mb: 0,  # both fit exactly
        1e6: 0,
    }
    for budget, recomputed in cases.items():
        policy.activation_budget_mb = budget
        checkpoints.clear()
        result = loss_and_grads(policy, "main", rows)
        assert len(checkpoints) == recomputed, (budget, per_layer_mb, len(checkpoints))
        assert_same_update(result, full_recompute, device)
    policy.activation_budget_mb = 0.0
    policy.gradient_checkpointing = False  # keeps everything, whatever the budget
    checkpoints.clear()
    assert_same_update(loss_and_grads(policy, "main", rows), full_recompute, device)
    assert not checkpoints
    assert all(g.abs().max() > 0 for g in full_recompute[2])  # the comparisons compare something


def test_auto_follows_the_free_memory_of_the_pass_device(tokenizer, device, monkeypatch, count_calls):
    policy = make_policy(tokenizer)
    assert policy.activation_budget_mb == "auto"  # the default
    rows = batch(tokenizer, device, shared=False)
    read = []

    def free(dev):
        read.append(torch.device(dev))
        return free.bytes

    monkeypatch.setattr(memory, "free_memory_bytes", free)
    checkpoints = count_calls(decoder_module.torch.utils.checkpoint, "checkpoint")
    free.bytes = 64 * 2**30  # plenty: every layer keeps its activations
    kept = loss_and_grads(policy, "main", rows)
    assert not checkpoints and read == [policy.group("main").device]
    free.bytes = 1024  # next to nothing: every layer is recomputed
    recomputed = loss_and_grads(policy, "main", rows)
    assert len(checkpoints) == 2 and len(read) == 2  # read again at each gradient pass
    assert_same_update(recomputed, kept, device)
    free.bytes = None  # not known: the least memory
    checkpoints.clear()
    loss_and_grads(policy, "main", rows)
    assert len(checkpoints) == 2
    read.clear()
    with torch.no_grad():  # passes without gradients keep nothing for a backward: no budget read
        policy.score("main", *rows, with_values=True)
    assert not read


def test_auto_budget_is_a_share_of_the_free_memory(monkeypatch):
    monkeypatch.setattr(memory, "free_memory_bytes", lambda device: 8 * 2**30)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert memory.auto_activation_budget_mb("cpu") == memory.AUTO_BUDGET_FRACTION * 8 * 1024
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # four processes of a data-parallel run read the same RAM
    assert memory.auto_activation_budget_mb("cpu") == memory.AUTO_BUDGET_FRACTION * 2 * 1024
    monkeypatch.setattr(memory, "free_memory_bytes", lambda device: None)
    assert memory.auto_activation_budget_mb("cpu") == 0.0


def test_free_memory_is_read_on_this_machine(device):
    host = memory.host_available_bytes()
    assert host is not None and 0 < host
    free = memory.free_memory_bytes(device)
    assert free is not None and free > 0
    if device.type == "cpu":
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        assert free <= total
    else:
        assert free <= torch.cuda.get_device_properties(device).total_memory
    assert memory.auto_activation_budget_mb(device) > 0
    assert memory.free_memory_bytes("meta") is None  # a device whose free memory is unknown


def test_cgroup_limit_caps_the_host_memory(monkeypatch, tmp_path):
    """In a container /proc/meminfo is the host's; the cgroup's limit less its usage (its inactive page
    cache counted as free) is what the process may still take."""
    root = tmp_path / "cgroup"
    root.mkdir()
    (root / "memory.max").write_text(str(3 * 2**30) + "\n")
    (root / "memory.current").write_text(str(2 * 2**30) + "\n")
    (root / "memory.stat").write_text(f"anon 1000\ninactive_file {2**29}\nactive_file 5\n")
    real_path = memory.Path

    def path(name, *rest):
        name = str(name)
        if name == "/proc/self/cgroup":
            cgroup = tmp_path / "self_cgroup"
            cgroup.write_text("0::/\n")
            return cgroup
        if name.startswith("/sys/fs/cgroup"):
            return real_path(str(root) + name[len("/sys/fs/cgroup"):], *rest)
        return real_path(name, *rest)

    monkeypatch.setattr(memory, "Path", path)
    assert memory._cgroup_available_bytes() == 2**30 + 2**29
    assert memory.host_available_bytes() <= 2**30 + 2**29
    (root / "memory.max").write_text("max\n")  # no limit: the host's MemAvailable alone
    assert memory._cgroup_available_bytes() is None


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan"), True, "512", "Auto", None])
def test_bad_budgets_are_refused_quoting_the_value(tokenizer, bad):
    with pytest.raises(ValueError, match="activation_budget_mb must be 'auto' or a number") as err:
        make_policy(tokenizer, activation_budget_mb=bad)
    assert repr(bad) in str(err.value)
