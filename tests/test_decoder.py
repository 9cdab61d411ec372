"""The fused decoder's scoring and training passes (agents/decoder.py) against the model's own forward
through PEFT: the same log-probs, values and gradients in float32, the policy and the reference in one
pass, long rows through the fused attention kernel, other architectures' biases, and the cases that
keep PEFT's forward (LoRA dropout in a gradient pass, full fine-tuning, backend="generate").
"""

from __future__ import annotations

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from numerics import assert_f32_close, assert_grads_close, assert_grads_near_exact, f32_bound
from tiny_models import testing_device, tiny_model

from agents import LoraSettings, MultiAgentPolicy
from agents import decoder as decoder_module
from agents import head as head_module
from llm_envs.tokenizers import load_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

AGENTS = ("helper", "main")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(None)


def perturbed(policy: MultiAgentPolicy, seed: int = 1) -> MultiAgentPolicy:
    """Non-zero adapters (B starts at 0) and value heads. Drawn on the CPU (as PEFT initialises the
    adapters, and the tiny models their weights): the same instance on every device."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for agent in policy.agents:
            for param in policy.parameters(agent):
                param.add_(0.3 * torch.randn(param.shape, dtype=param.dtype).to(param.device))
    return policy


RANK_4 = LoraSettings(rank=4)


def make_policy(tokenizer, *, value_head: bool = True, lora=RANK_4, model=None, **kwargs):
    model = tiny_model(tokenizer) if model is None else model
    return perturbed(MultiAgentPolicy(model, tokenizer, AGENTS, lora=lora, value_head=value_head, **kwargs))


def episode(tokenizer, n: int = 3, response: int = 7, seed: int = 0):
    """Left-padded prompts of different lengths and right-padded responses (one ends early)."""
    g = torch.Generator().manual_seed(seed)
    lengths = [5, 9, 3, 8, 6][:n]
    width = max(lengths)
    p_ids = torch.full((n, width), tokenizer.pad_token_id)
    p_mask = torch.zeros(n, width, dtype=torch.long)
    for i, length in enumerate(lengths):
        p_ids[i, width - length :] = torch.randint(5, 1000, (length,), generator=g)
        p_mask[i, width - length :] = 1
    r_ids = torch.randint(5, 1000, (n, response), generator=g)
    r_mask = torch.ones(n, response, dtype=torch.long)
    r_mask[1, response - 3 :] = 0
    r_ids[1, response - 3 :] = tokenizer.pad_token_id
    return tuple(t.to(testing_device()) for t in (p_ids, p_mask, r_ids, r_mask))


def peft_path(policy):
    """The same policy scoring through the model's own forward (the engine detached)."""
    engine = policy.engine

    class Switch:
        def __enter__(self):
            policy.engine = None
            return policy

        def __exit__(self, *exc):
            policy.engine = engine

    return Switch()


def loss_and_grads(policy, agent, batch):
    policy.train()
    for p in policy.parameters(agent):
        p.grad = None
    logprobs, values = policy.forward(agent, *batch, with_values=True)
    mask = batch[3].float()
    (-(logprobs * mask).sum() + ((values - 0.5) ** 2 * mask).sum()).backward()
    grads = [p.grad.clone() for p in policy.parameters(agent)]
    policy.eval()
    return logprobs.detach(), values.detach(), grads


def float64_twin(policy: MultiAgentPolicy, model) -> MultiAgentPolicy:
    """``policy``'s network in float64 on its device: ``model`` (a fresh copy of the same base) converted,
    every adapter and value head copied from ``policy``."""
    twin = MultiAgentPolicy(model.double(), policy.tokenizer, AGENTS, lora=RANK_4,
                            value_head=policy.value_heads is not None)
    with torch.no_grad():
        for agent in AGENTS:
            for mine, theirs in zip(twin.parameters(agent), policy.parameters(agent), strict=True):
                mine.data = theirs.detach().to(torch.float64, copy=True)
    return twin


def exact_loss_and_grads(twin: MultiAgentPolicy, agent: str, batch):
    """:func:`loss_and_grads` computed in float64 throughout (the policy's own passes cast the log-probs
    and the value heads' inputs to float32): the model's forward through PEFT, log-softmax and value head
    in float64, the same loss."""
    p_ids, p_mask, r_ids, r_mask = batch
    ids, mask = torch.cat([p_ids, r_ids], 1), torch.cat([p_mask, r_mask], 1)
    group = twin.group(agent)
    group.set_agent(agent)
    params = twin.parameters(agent)
    for p in params:
        p.grad = None
    hidden = []
    hook = group.causal_lm.base_model.register_forward_hook(lambda _m, _a, out: hidden.append(out.last_hidden_state))
    try:
        logits = group.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                             use_cache=False).logits
    finally:
        hook.remove()
    assert logits.dtype == hidden[-1].dtype == torch.float64
    keep = slice(p_ids.shape[1] - 1, p_ids.shape[1] - 1 + r_ids.shape[1])  # the positions predicting the response
    logprobs = logits[:, keep, : len(twin.tokenizer)].log_softmax(-1).gather(-1, r_ids[..., None]).squeeze(-1)
    logprobs = logprobs.masked_fill(r_mask == 0, 0.0)
    values = twin.value_heads[agent](hidden[-1][:, keep]).squeeze(-1).masked_fill(r_mask == 0, 0.0)
    weight = r_mask.double()
    (-(logprobs * weight).sum() + ((values - 0.5) ** 2 * weight).sum()).backward()
    return logprobs.detach(), values.detach(), [p.grad.clone() for p in params]


def assert_both_near_exact(policy: MultiAgentPolicy, twin: MultiAgentPolicy, agent: str, batch) -> None:
    """The fused decoder and PEFT's forward, each against float64 (:func:`exact_loss_and_grads`).

    Compared with float64 (rounding ~1e-16 relative, 2^29 times finer than float32's) each float32 path
    carries its own rounding only, and the bounds of tests/numerics.py hold for one float32 chain against
    exact arithmetic: scores within FORWARD_DEPTH accumulations of TINY_K products of their largest
    magnitude, gradients within BACKWARD_DEPTH of the largest gradient entry (numerics.assert_grads_near_exact
    says why that scale). Comparing the two float32 paths directly adds their errors, and a failure would
    not say which path is wrong; this names it. (Measured on the CPU over 24 instances, the two paths are
    equally far from float64: the fused decoder up to 1.7e-4 of the largest gradient entry, PEFT 1.4e-4.)"""
    exact = exact_loss_and_grads(twin, agent, batch)
    fused = loss_and_grads(policy, agent, batch)
    with peft_path(policy):
        assert not policy._fused()
        peft = loss_and_grads(policy, agent, batch)
    for name, result in (("fused decoder", fused), ("PEFT", peft)):
        for i, what in enumerate(("log-probs", "values")):
            bound = f32_bound(exact[i])
            error = float((result[i].double() - exact[i]).abs().max())
            assert error <= bound, f"{agent}: {name}'s {what} are {error:.3g} from float64, bound {bound:.3g}"
        assert_grads_near_exact(result[2], exact[2], what=f"{agent}: {name}")
    # pads score 0
    assert (fused[0][batch[3] == 0] == 0).all() and (fused[1][batch[3] == 0] == 0).all()


def test_scores_and_gradients_equal_peft(tokenizer):
    """The fused decoder and PEFT each against the same network in float64 (:func:`assert_both_near_exact`)."""
    policy = make_policy(tokenizer)
    twin = float64_twin(policy, tiny_model(tokenizer))
    batch = episode(tokenizer)
    assert policy._fused()
    for agent in AGENTS:
        assert_both_near_exact(policy, twin, agent, batch)


def test_reference_and_one_pass_score_equal_separate_calls(tokenizer):
    policy = make_policy(tokenizer)
    batch = episode(tokenizer, n=4)
    for temperature in (1.0, 0.7):
        logprobs, values, ref = policy.score("main", *batch, with_values=True, with_reference=True,
                                             temperature=temperature)
        with peft_path(policy):
            expected_lp, expected_v = policy.forward("main", *batch, with_values=True, temperature=temperature)
            expected_ref = policy.ref_logprobs("main", *batch, temperature=temperature)
            separate = policy.score("main", *batch, with_values=True, with_reference=True, temperature=temperature)
        assert_f32_close(logprobs, expected_lp.detach())
        assert_f32_close(values, expected_v.detach())
        assert_f32_close(ref, expected_ref)
        for mine, theirs in zip((logprobs, values, ref), separate):
            assert_f32_close(mine, theirs)
        assert_f32_close(policy.ref_logprobs("main", *batch, temperature=temperature), ref)
        assert not torch.allclose(ref, logprobs)  # the adapter matters: the reference is not the policy
    only = policy.score("helper", *batch)
    assert only[1] is None and only[2] is None


def grouped(tokenizer, groups: int = 3, samples: int = 3, response: int = 7):
    """MAGRPO's layout: each of ``groups`` prompts (different lengths) repeated for ``samples`` rows,
    interleaved with a repeat out of order, every response its own (one ends early, one is all pads)."""
    p_ids, p_mask, _, _ = episode(tokenizer, n=groups)
    order = (torch.tensor([0, 1, 2, 0, 0, 2, 1, 2, 1][: groups * samples]) % groups).to(p_ids.device)
    g = torch.Generator().manual_seed(3)
    n = len(order)
    r_ids = torch.randint(5, 1000, (n, response), generator=g)
    r_mask = torch.ones(n, response, dtype=torch.long)
    r_mask[1, response - 3 :] = 0
    r_mask[4, 1:] = 0
    r_ids[r_mask == 0] = tokenizer.pad_token_id
    return p_ids[order], p_mask[order], r_ids.to(p_ids.device), r_mask.to(p_ids.device)


@pytest.mark.parametrize("checkpoint", [True, False])
def test_shared_prompts_give_the_whole_rows_scores_and_gradients(tokenizer, checkpoint, monkeypatch):
    policy = make_policy(tokenizer, gradient_checkpointing=checkpoint, activation_budget_mb=0)  # 0: recompute
    batch = grouped(tokenizer)
    passes = []
    real = policy.engine.hidden_states_shared

    def spy(*args, **kwargs):
        passes.append(len(args[0]))  # the prompt rows computed
        return real(*args, **kwargs)

    monkeypatch.setattr(policy.engine, "hidden_states_shared", spy)
    for agent in AGENTS:
        shared = loss_and_grads(policy, agent, batch)
        policy.share_prompts = False
        whole = loss_and_grads(policy, agent, batch)
        policy.share_prompts = True
        for a, b in zip(shared[:2], whole[:2]):
            assert_f32_close(a, b)
        assert_grads_close(shared[2], whole[2])
        assert (shared[0][batch[3] == 0] == 0).all()
    assert passes == [3, 3]  # 3 distinct prompts for 9 rows
    # The one-pass score (policy and reference row blocks) and a temperature, shared too.
    with torch.no_grad():
        shared = policy.score("main", *batch, with_values=True, with_reference=True, temperature=0.7)
        policy.share_prompts = False
        whole = policy.score("main", *batch, with_values=True, with_reference=True, temperature=0.7)
        policy.share_prompts = True
    assert passes[-1] == 6  # the 3 prompts once per row block
    for a, b in zip(shared, whole):
        assert_f32_close(a, b)


def test_shared_prompts_through_the_fused_attention_kernel(tokenizer, monkeypatch):
    policy = make_policy(tokenizer)
    batch = grouped(tokenizer)
    policy.share_prompts = False
    monkeypatch.setattr(decoder_module, "MATH_ATTENTION_MAX_LENGTH_FLOAT32", 512)  # whole rows written out
    whole = loss_and_grads(policy, "helper", batch)
    policy.share_prompts = True
    monkeypatch.setattr(decoder_module, "MATH_ATTENTION_MAX_LENGTH", 4)
    monkeypatch.setattr(decoder_module, "MATH_ATTENTION_MAX_LENGTH_FLOAT32", 4)
    shared = loss_and_grads(policy, "helper", batch)
    for a, b in zip(shared[:2], whole[:2]):
        assert_f32_close(a, b)
    assert_grads_close(shared[2], whole[2])


def testdistinct_rows():
    from agents.rows import distinct_rows

    ids = torch.tensor([[0, 7], [5, 6], [0, 7], [5, 6]])
    mask = torch.tensor([[0, 1], [1, 1], [0, 1], [1, 1]])
    first, index = distinct_rows(ids, mask)
    assert first.tolist() == [0, 1] and index.tolist() == [0, 1, 0, 1]
    other_mask = mask.clone()
    other_mask[2, 0] = 1  # the same ids under another mask are another prompt
    first, index = distinct_rows(ids, other_mask)
    assert first.tolist() == [0, 1, 2] and index.tolist() == [0, 1, 2, 1]
    assert distinct_rows(ids[:2], mask[:2]) == (None, None)
    assert distinct_rows(ids[:1], mask[:1]) == (None, None)


def test_long_rows_use_the_fused_attention_kernel(tokenizer, monkeypatch, count_calls):
    """A training pass writes attention out up to ``MATH_ATTENTION_MAX_LENGTH`` positions and takes the
    fused kernel past it (here 4): the same log-probs, values and gradients. On the CPU a float32 pass
    takes the kernel at every length (``MATH_ATTENTION_MAX_LENGTH_FLOAT32``); the tiny model is float32."""
    policy = make_policy(tokenizer)
    batch = episode(tokenizer, response=9)
    kernel = count_calls(decoder_module.F, "scaled_dot_product_attention")
    default = loss_and_grads(policy, "helper", batch)
    assert bool(kernel) == (batch[0].device.type == "cpu")
    monkeypatch.setattr(decoder_module, "MATH_ATTENTION_MAX_LENGTH_FLOAT32", 512)
    kernel.clear()
    short = loss_and_grads(policy, "helper", batch)
    assert not kernel  # written out, on every device
    monkeypatch.setattr(decoder_module, "MATH_ATTENTION_MAX_LENGTH", 4)
    monkeypatch.setattr(decoder_module, "MATH_ATTENTION_MAX_LENGTH_FLOAT32", 4)
    long = loss_and_grads(policy, "helper", batch)
    assert kernel
    for other in (long, default):
        for a, b in zip(short[:2], other[:2]):
            assert_f32_close(a, b)
        assert_grads_close(other[2], short[2])


@pytest.mark.parametrize("shared", [False, True])
def test_rows_of_one_span_attend_span_by_span(tokenizer, monkeypatch, count_calls, shared):
    """Past ``SPAN_ATTENTION_MIN_LENGTH`` (here 0) a CPU pass attends span by span: the same log-probs,
    values and gradients as the written-out attention over the mask, on left-padded prompts and
    right-padded responses (the shared-prompt pass: its prompts). On a GPU the rows keep the mask."""
    policy = make_policy(tokenizer)
    batch = grouped(tokenizer) if shared else episode(tokenizer, response=9)
    policy.share_prompts = shared
    monkeypatch.setattr(decoder_module, "MATH_ATTENTION_MAX_LENGTH_FLOAT32", 512)
    masked = loss_and_grads(policy, "helper", batch)
    monkeypatch.setattr(decoder_module, "SPAN_ATTENTION_MIN_LENGTH", 0)
    calls = count_calls(decoder_module, "span_attention")
    spanned = loss_and_grads(policy, "helper", batch)
    assert bool(calls) == (batch[0].device.type == "cpu")
    for a, b in zip(spanned[:2], masked[:2]):
        assert_f32_close(a, b)
    assert_grads_close(spanned[2], masked[2])


@pytest.mark.parametrize("shared", [False, True])
def test_a_pass_without_gradients_never_writes_attention_out_on_the_cpu(tokenizer, monkeypatch, count_calls, shared):
    """A scoring pass (no gradients) on the CPU takes the masked kernel where a training pass writes
    attention out (a bfloat16 pass's way, here forced in float32), and goes span by span past
    ``SPAN_ATTENTION_MIN_LENGTH_NO_GRAD`` (here 0), which a training pass of these rows would not
    (``SPAN_ATTENTION_MIN_LENGTH``): every way the same log-probs and values as the training pass. On a
    GPU the scoring pass keeps the training pass's way."""
    policy = make_policy(tokenizer)
    batch = grouped(tokenizer) if shared else episode(tokenizer, response=9)
    policy.share_prompts = shared
    monkeypatch.setattr(decoder_module, "MATH_ATTENTION_MAX_LENGTH_FLOAT32", 512)
    trained = loss_and_grads(policy, "helper", batch)
    cpu = batch[0].device.type == "cpu"

    def scored() -> tuple[torch.Tensor, torch.Tensor]:
        policy.train()
        with torch.no_grad():
            out = policy.forward("helper", *batch, with_values=True)
        policy.eval()
        return out

    spans = count_calls(decoder_module, "span_attention")
    kernel = count_calls(decoder_module.F, "scaled_dot_product_attention")
    for a, b in zip(scored(), trained[:2]):
        assert_f32_close(a, b)
    assert not spans and bool(kernel) == cpu
    monkeypatch.setattr(decoder_module, "SPAN_ATTENTION_MIN_LENGTH_NO_GRAD", 0)
    for a, b in zip(scored(), trained[:2]):
        assert_f32_close(a, b)
    assert bool(spans) == cpu
    spans.clear()
    loss_and_grads(policy, "helper", batch)  # the training pass of the same rows: not span by span
    assert not spans


def test_qwen2_biases_and_grouped_heads(tokenizer):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         use_sliding_window=False, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.5)
    twin_model = copy.deepcopy(model)
    policy = make_policy(tokenizer, model=model.to(testing_device()).eval())
    assert policy.backend == "engine" and policy._fused()
    twin = float64_twin(policy, twin_model.to(testing_device()).eval())
    assert_both_near_exact(policy, twin, "main", episode(tokenizer))


def test_lora_stacks_are_kept_where_launches_dominate_and_built_every_pass_on_the_cpu(tokenizer, monkeypatch):
    """By default the stacks are kept off the CPU (a GPU pass pays for its launches) and built in every
    pass, then freed, on the CPU (where their ops cost little and kept stacks cost memory); the
    instance's ``keep_lora_stacks`` overrides the rule either way."""
    from agents.decoder import Block, FusedDecoder

    policy = make_policy(tokenizer)
    engine = policy.engine
    assert engine.keep_lora_stacks is None  # the default: the device decides
    assert engine._keeps_stacks(torch.device("cpu")) is False
    assert engine._keeps_stacks(torch.device("cuda", 0)) is True
    p_ids, p_mask, r_ids, r_mask = episode(tokenizer)
    ids, mask = torch.cat([p_ids, r_ids], 1), torch.cat([p_mask, r_mask], 1)
    blocks = [Block("helper", 2), Block("main", 1)]
    keep = torch.arange(p_ids.shape[1] - 1, ids.shape[1] - 1, device=ids.device)
    builds = []

    def counted(proj, pairs, dtype):
        builds.append(proj)
        return FusedDecoder._stack_lora(proj, pairs, dtype)

    monkeypatch.setattr(engine, "_stack_lora", counted)
    projections = 4 * len(engine.causal_lm.model.layers)  # qkv, o, gate_up, down of each layer
    for keep_stacks, passes_building in ((None, 2 if ids.device.type == "cpu" else 1), (False, 2), (True, 1)):
        engine.keep_lora_stacks = keep_stacks
        engine.__dict__.pop("_lora_cache", None)
        builds.clear()
        for _ in range(2):
            engine.hidden_states(ids, mask, blocks, keep).square().sum().backward()
        assert len(builds) == passes_building * projections, (keep_stacks, len(builds))
        assert len(engine.__dict__.get("_lora_cache", {})) == (projections if passes_building == 1 else 0)


def test_lora_stacks_are_kept_until_an_adapter_changes_and_pass_gradients_exactly(tokenizer, monkeypatch):
    """Where kept (forced here, so that the test means the same on the CPU and on CUDA), the stacked
    LoRA factors are built once per adapter layout, not every pass, and rebuilt when an adapter changes
    (an optimizer step, in place; a replaced weight); gradients through the kept stacks equal, bit for
    bit, those of stacking with differentiable ops in every pass (what the CPU does by default). Blocks
    helper, main, helper: one adapter in two blocks sums its two parts."""
    from agents.decoder import Block, FusedDecoder

    policy = make_policy(tokenizer)
    engine = policy.engine
    engine.keep_lora_stacks = True
    p_ids, p_mask, r_ids, r_mask = episode(tokenizer)
    ids, mask = torch.cat([p_ids, r_ids], 1), torch.cat([p_mask, r_mask], 1)
    blocks = [Block("helper", 1), Block("main", 1), Block("helper", 1)]
    keep = torch.arange(p_ids.shape[1] - 1, ids.shape[1] - 1, device=ids.device)
    params = [p for agent in AGENTS for p in policy.parameters(agent, value_head=False)]
    builds = []

    def counted(proj, pairs, dtype):
        builds.append(proj)
        return FusedDecoder._stack_lora(proj, pairs, dtype)

    def grads() -> list[torch.Tensor]:
        for p in params:
            p.grad = None
        engine.hidden_states(ids, mask, blocks, keep).square().sum().backward()
        return [p.grad.clone() for p in params]

    monkeypatch.setattr(engine, "_stack_lora", counted)
    engine.__dict__.pop("_lora_cache", None)
    cached = grads()
    projections = len(builds)
    assert projections == 4 * len(engine.causal_lm.model.layers)  # qkv, o, gate_up, down of each layer
    assert all(torch.equal(a, b) for a, b in zip(grads(), cached)) and len(builds) == projections  # kept

    def every_pass(proj, blocks, dtype):  # the stacks built with differentiable ops in every pass
        pairs = [[engine._adapter(m, b.adapter) for m in proj.modules] for b in blocks]
        return FusedDecoder._stack_lora(proj, pairs, dtype)[0]

    with monkeypatch.context() as patch:
        patch.setattr(engine, "_lora", every_pass)
        rebuilt = grads()
    assert all(g.abs().max() > 0 for g in cached)
    for a, b in zip(cached, rebuilt, strict=True):
        assert torch.equal(a, b)

    torch.optim.SGD(policy.parameters("main", value_head=False), lr=0.1).step()  # in place: the versions move
    with torch.no_grad():
        after_step = engine.hidden_states(ids, mask, blocks, keep)
    assert len(builds) == 2 * projections
    with monkeypatch.context() as patch:
        patch.setattr(engine, "_lora", every_pass)
        with torch.no_grad():
            torch.testing.assert_close(engine.hidden_states(ids, mask, blocks, keep), after_step, rtol=0, atol=0)
    lora_a = engine.causal_lm.model.layers[0].mlp.down_proj.lora_A["helper"]
    lora_a.weight = torch.nn.Parameter(lora_a.weight.detach() + 1.0)  # replaced: another tensor
    with torch.no_grad():
        engine.hidden_states(ids, mask, blocks, keep)
    assert len(builds) == 2 * projections + 1  # that projection's stacks only


def test_lora_dropout_gradient_passes_keep_peft(tokenizer):
    policy = make_policy(tokenizer, lora=LoraSettings(rank=4, dropout=0.1))
    batch = episode(tokenizer)
    policy.train()
    assert not policy._fused()  # PEFT draws dropout per adapted module
    with torch.no_grad():
        assert policy._fused()  # passes without gradients run without dropout
        fused = policy.score("main", *batch)[0]
    with peft_path(policy), torch.no_grad():
        assert_f32_close(fused, policy.score("main", *batch)[0])
    policy.eval()
    assert policy._fused()


def test_full_fine_tuning_and_generate_backend_keep_the_models_forward(tokenizer):
    full = MultiAgentPolicy(tiny_model(tokenizer), tokenizer, ("main",), lora=None)
    assert full.engine is not None and not full._fused()
    batch = episode(tokenizer)
    logprobs = full.logprobs("main", *batch)
    logprobs.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in full.parameters("main"))
    slow = make_policy(tokenizer, backend="generate")
    assert slow.engine is None and not slow._fused()


def test_bf16_scoring_is_close_to_peft_and_finite(tokenizer, count_calls):
    """In bfloat16 a training pass of short rows writes attention out (its backward the cheapest there),
    on the CPU as on a GPU, where a float32 pass on the CPU takes the masked kernel."""
    policy = make_policy(tokenizer, model=tiny_model(tokenizer).to(torch.bfloat16))
    batch = episode(tokenizer)
    kernel = count_calls(decoder_module.F, "scaled_dot_product_attention")
    fused = loss_and_grads(policy, "main", batch)
    assert not kernel
    with peft_path(policy):
        reference = loss_and_grads(policy, "main", batch)
    mask = batch[3].bool()
    assert all(torch.isfinite(t).all() for t in (fused[0], fused[1], *fused[2]))
    assert (fused[0][mask] - reference[0][mask]).abs().mean() < 0.05
    assert all(p.dtype == torch.float32 for p in policy.parameters("main"))


def test_blocks_must_cover_the_batch(tokenizer):
    policy = make_policy(tokenizer)
    ids = torch.randint(5, 100, (3, 6))
    with pytest.raises(ValueError, match="blocks cover 2 rows, the batch has 3"):
        policy.engine.hidden_states(ids, torch.ones_like(ids), [decoder_module.Block("main", 2)], torch.arange(6))


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_chunked_head_logprobs_and_gradient_equal_log_softmax(monkeypatch, temperature):
    torch.manual_seed(0)
    hidden = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, dtype=torch.float64)
    ids = torch.randint(0, 50, (3, 5))
    monkeypatch.setattr(head_module, "HEAD_CHUNK_ELEMENTS", 50 * 4)  # <= 4 rows a chunk: 4, 4, 4 and 3 of 15
    got = head_module.chosen_logprobs(hidden, weight, ids, temperature)
    expected = torch.log_softmax(hidden @ weight.t() / temperature, -1).gather(-1, ids[..., None]).squeeze(-1)
    torch.testing.assert_close(got, expected.float())
    upstream = torch.randn(3, 5, dtype=torch.float32)
    (grad,) = torch.autograd.grad((got * upstream).sum(), hidden)
    (expected_grad,) = torch.autograd.grad((expected * upstream).sum(), hidden)
    torch.testing.assert_close(grad, expected_grad, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="frozen LM head"):
        head_module.chosen_logprobs(hidden, weight.clone().requires_grad_(True), ids)


def test_head_chunks_are_as_few_as_fit_and_of_equal_size():
    vocabulary = 49152  # SmolLM2: at most 128 rows of float32 logits a chunk
    assert head_module.HEAD_CHUNK_ELEMENTS // vocabulary == 128
    assert head_module.HEAD_CHUNK_ELEMENTS * 4 < 32 * 2**20  # below glibc's largest mmap threshold
    sizes = {n: head_module._head_chunk_rows(n, vocabulary) for n in (1, 91, 128, 129, 192, 1000)}
    assert sizes == {1: 1, 91: 91, 128: 128, 129: 65, 192: 96, 1000: 125}  # 1000: 8 chunks, not 7 + 104


def test_checkpointing_changes_memory_not_results(tokenizer):
    policy = make_policy(tokenizer, activation_budget_mb=0)  # every layer recomputed ("auto" keeps a tiny model's)
    batch = episode(tokenizer)
    assert policy.gradient_checkpointing  # the default
    with_checkpoints = loss_and_grads(policy, "main", batch)
    policy.gradient_checkpointing = False
    without = loss_and_grads(policy, "main", batch)
    torch.testing.assert_close(with_checkpoints[0], without[0], atol=0, rtol=0)
    for a, b in zip(with_checkpoints[2], without[2]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    # A checkpointed pass keeps only each layer's input, not its activations.
    ids = torch.cat(batch[:3:2], dim=1)
    mask = torch.cat([batch[1], batch[3]], dim=1)
    saved = {}
    for checkpoint in (False, True):
        sizes = []

        def pack(tensor, sizes=sizes):
            sizes.append(tensor.numel() * tensor.element_size())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            policy.engine.hidden_states(ids, mask, [decoder_module.Block("main", len(ids))],
                                        torch.arange(ids.shape[1]), checkpoint=checkpoint)
        saved[checkpoint] = sum(sizes)
    assert saved[True] * 3 < saved[False]


def test_the_base_owns_its_weights_once_fused(tokenizer, tmp_path):
    """Loaded from safetensors, the weights start as a mapping of the file; once the engine has fused
    q/k/v and gate/up, no weight points into the file any more (so it costs its size once)."""
    tiny_model(tokenizer).save_pretrained(tmp_path)
    from agents.models import load_model

    model = load_model(tmp_path, dtype=torch.float32)
    policy = MultiAgentPolicy(model, tokenizer, AGENTS, lora=LoraSettings(rank=4))
    policy.generate_joint({"main": (torch.tensor([[5, 6, 7]]), torch.ones(1, 3, dtype=torch.long))}, 1,
                          max_new_tokens=2)
    maps = open("/proc/self/maps").read() if os.path.exists("/proc/self/maps") else ""
    weights = policy.engine.causal_lm.state_dict()
    pointers = {t.untyped_storage().data_ptr() for t in weights.values()}
    assert len(pointers) < len(weights)  # q/k/v and gate/up share fused storages
    mapped = [line for line in maps.splitlines() if str(tmp_path) in line]
    assert not mapped, mapped


def test_local_weights_are_read_into_memory_of_their_own(tokenizer, tmp_path):
    """A local safetensors checkpoint is read tensor by tensor (no file mapping), so copying the weights
    later never holds the mapped pages beside the copies; the values are the checkpoint's."""
    from agents.memory import file_mapped_ranges
    from agents.models import load_model, read_weights_into

    reference = tiny_model(tokenizer)
    reference.save_pretrained(tmp_path)
    model = load_model(tmp_path, dtype=torch.float32)
    mapped = file_mapped_ranges()
    assert mapped is not None or os.uname().sysname != "Linux"
    expected = reference.state_dict()
    for key, tensor in model.state_dict().items():
        torch.testing.assert_close(tensor, expected[key], atol=0, rtol=0)
        assert tensor.data_ptr() % 64 == 0, key  # torch's own alignment: kernels slow down without it
        if mapped is not None:
            assert not any(lo <= tensor.data_ptr() < hi for lo, hi in mapped), key
    if os.path.exists("/proc/self/maps"):
        assert str(tmp_path) not in open("/proc/self/maps").read()
    # A checkpoint that is not exactly the model's (one layer more here) is left to from_pretrained's path.
    from transformers import AutoModelForCausalLM

    config = reference.config.to_dict()
    config["num_hidden_layers"] += 1
    other = AutoModelForCausalLM.from_config(type(reference.config).from_dict(config))
    before = {k: v.clone() for k, v in other.state_dict().items()}
    assert read_weights_into(other, tmp_path) == 0
    for key, tensor in other.state_dict().items():
        torch.testing.assert_close(tensor, before[key], atol=0, rtol=0)
    assert read_weights_into(model, tmp_path / "missing") == 0


def test_bucketed_lengths_bound_the_shapes_and_keep_results(tokenizer):
    lengths = {n: decoder_module.bucket_length(n) for n in (1, 16, 17, 140, 255, 256, 257, 300, 600, 4097)}
    assert lengths == {1: 8, 16: 16, 17: 24, 140: 144, 255: 256, 256: 256, 257: 264, 300: 304, 600: 608,
                       4097: 4224}
    assert all(n <= b < n + max(8, n / 32) for n, b in lengths.items())
    assert len({decoder_module.bucket_length(n) for n in range(60, 200)}) == 18  # 64, 72, ..., 200
    policy = make_policy(tokenizer)
    p_ids, p_mask, r_ids, r_mask = episode(tokenizer)
    padded = decoder_module.pad_left(p_ids, p_mask, p_ids.shape[1] + 21, tokenizer.pad_token_id)
    assert padded[0].shape[1] == p_ids.shape[1] + 21 and padded[1][:, :21].sum() == 0
    assert_f32_close(policy.score("main", *padded, r_ids, r_mask)[0],
                     policy.score("main", p_ids, p_mask, r_ids, r_mask)[0])


def test_packed_pass_projects_only_the_unmasked_and_kept_positions(tokenizer, monkeypatch):
    """Pads cost nothing: the projections see the positions that are unmasked or kept (rounded up to a
    bucket), however wide the padding, and the scores equal an unpadded batch's."""
    policy = make_policy(tokenizer)
    policy.share_prompts = False
    p_ids, p_mask, r_ids, r_mask = episode(tokenizer)
    qkv = policy.engine._weights()[0]["qkv"].weight
    rows = []
    real_linear = decoder_module.F.linear

    def counting(x, weight, bias=None):
        if weight is qkv:
            rows.append(x.shape[0])
        return real_linear(x, weight, bias)

    monkeypatch.setattr(decoder_module.F, "linear", counting)
    wide = decoder_module.pad_left(p_ids, p_mask, p_ids.shape[1] + 40, tokenizer.pad_token_id)
    scores = policy.score("main", *wide, r_ids, r_mask)[0]
    # Unmasked positions, plus the kept positions that are pads (row 1's response ended 3 tokens early;
    # positions P-1 .. P+R-2 are kept, so two of its pads are), rounded up to a bucket.
    assert rows == [decoder_module.bucket_length(int(p_mask.sum() + r_mask.sum()) + 2)]
    assert rows[0] < wide[0].numel() // 2  # far fewer than the padded batch's positions
    monkeypatch.setattr(decoder_module.F, "linear", real_linear)
    assert_f32_close(scores, policy.score("main", p_ids, p_mask, r_ids, r_mask)[0])


def test_activation_budget_keeps_the_layers_that_fit(tokenizer, monkeypatch):
    policy = make_policy(tokenizer)
    batch = episode(tokenizer)
    layers = len(policy.engine.causal_lm.model.layers)
    assert layers == 2
    config = policy.engine.causal_lm.config
    # The estimate: 14 hidden-sized and 8 intermediate-sized elements a position, in the base's precision.
    assert policy.engine.activation_bytes(10) == 10 * (14 * config.hidden_size + 8 * config.intermediate_size) * 4
    monkeypatch.setattr(type(policy.engine), "activation_bytes", lambda self, tokens: 2**20)  # 1 MB a layer
    calls = []
    real = decoder_module.torch.utils.checkpoint.checkpoint

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(decoder_module.torch.utils.checkpoint, "checkpoint", counting)
    results = {}
    for budget, recomputed in ((0.0, 2), (1.5, 1), (100.0, 0)):
        policy.activation_budget_mb = budget
        calls.clear()
        results[budget] = loss_and_grads(policy, "main", batch)
        assert len(calls) == recomputed, (budget, calls)
    for budget in (1.5, 100.0):  # recomputing a layer changes the memory, not the results
        torch.testing.assert_close(results[budget][0], results[0.0][0], atol=0, rtol=0)
        for a, b in zip(results[budget][2], results[0.0][2]):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    for bad in (-1, float("inf"), True, "512"):
        with pytest.raises(ValueError, match="activation_budget_mb"):
            make_policy(tokenizer, activation_budget_mb=bad)
