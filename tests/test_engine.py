"""The rollout engine (agents/engine.py) against transformers' ``generate``: the same greedy tokens, the
same sampling distribution, log-probs that recompute, each row with its own adapter, per-row seeds
independent of the batch, EOS handling, the bf16 path, and the fallback for other architectures.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from tiny_models import tiny_model

from agents import LoraSettings, MultiAgentPolicy
from agents.engine import engine_support
from agents.sampling import TOP_P_CANDIDATES, sampling_distribution
from llm_envs.tokenizers import load_tokenizer

AGENTS = ("helper", "main")


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(None)


def make_policy(tokenizer, *, seed: int = 0, dtype=torch.float32, extra_eos=range(1000, 2500), **kwargs):
    model = tiny_model(tokenizer, seed=seed, extra_eos=extra_eos).to(dtype)
    policy = MultiAgentPolicy(model, tokenizer, AGENTS, lora=kwargs.pop("lora", LoraSettings(rank=4)), **kwargs)
    torch.manual_seed(seed + 1)
    with torch.no_grad():  # distinct, non-zero adapters, so that an agent's rows show whose adapter ran
        for agent in policy.agents:
            for param in policy.parameters(agent):
                param.add_(0.5 * torch.randn_like(param))
    return policy


def batch(tokenizer, n: int, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [tokenizer.encode("word " * (1 + (i * 3) % 7) + f"question {i + offset}?") for i in range(n)]
    width = max(map(len, rows))
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def with_backend(policy, backend: str):
    """The same policy object decoding through ``backend`` ("engine" or "generate")."""
    engine = policy.engine

    class Switch:
        def __enter__(self):
            policy.engine = engine if backend == "engine" else None
            return policy

        def __exit__(self, *exc):
            policy.engine = engine

    return Switch()


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_greedy_tokens_equal_generate(tokenizer, penalty):
    policy = make_policy(tokenizer)
    assert policy.backend == "engine" and policy.backend_reason is None
    ids, mask = batch(tokenizer, 5)
    prompts = {"helper": (ids, mask), "main": (ids[:3], mask[:3])}  # agents with different row counts
    settings = dict(max_new_tokens=16, greedy=True, repetition_penalty=penalty)
    with with_backend(policy, "engine"):
        ours = policy.generate_joint(prompts, 2, **settings)
    with with_backend(policy, "generate"):
        theirs = policy.generate_joint(prompts, 2, **settings)
    for agent in AGENTS:
        assert torch.equal(ours[agent].response_ids, theirs[agent].response_ids), agent
        assert torch.equal(ours[agent].response_mask, theirs[agent].response_mask)
        torch.testing.assert_close(ours[agent].logprobs, theirs[agent].logprobs, atol=1e-5, rtol=0)
        assert torch.equal(ours[agent].prompt_ids, theirs[agent].prompt_ids)


def test_full_fine_tuning_greedy_equals_generate(tokenizer):
    model = tiny_model(tokenizer, seed=3, extra_eos=range(1000, 2500))
    policy = MultiAgentPolicy(model, tokenizer, ["agent"], lora=None)
    ids, mask = batch(tokenizer, 3)
    with with_backend(policy, "engine"):
        ours = policy.generate("agent", ids, mask, 2, max_new_tokens=12, greedy=True)
    with with_backend(policy, "generate"):
        theirs = policy.generate("agent", ids, mask, 2, max_new_tokens=12, greedy=True)
    assert torch.equal(ours.response_ids, theirs.response_ids)
    # Training the base (full fine-tuning) is seen by the next generation: no stale fused copy.
    with torch.no_grad():
        for param in policy.parameters("agent"):
            param.add_(0.2 * torch.randn_like(param))
    with with_backend(policy, "engine"):
        ours = policy.generate("agent", ids, mask, 1, max_new_tokens=12, greedy=True)
    with with_backend(policy, "generate"):
        theirs = policy.generate("agent", ids, mask, 1, max_new_tokens=12, greedy=True)
    assert torch.equal(ours.response_ids, theirs.response_ids)


@pytest.mark.parametrize(
    "sampling",
    [
        dict(temperature=1.0, top_p=1.0, top_k=0),
        dict(temperature=0.7, top_p=0.9, top_k=50),
        dict(temperature=1.3, top_p=0.6, top_k=0),
        dict(temperature=1.0, top_p=1.0, top_k=5, repetition_penalty=1.1),
    ],
)
def test_sampled_logprobs_recompute(tokenizer, sampling):
    policy = make_policy(tokenizer)
    ids, mask = batch(tokenizer, 4)
    torch.manual_seed(0)
    gens = policy.generate_joint({a: (ids, mask) for a in AGENTS}, 3, max_new_tokens=12, **sampling)
    for agent, gen in gens.items():
        assert gen.response_ids.shape == gen.logprobs.shape == (12, gen.response_ids.shape[1])
        again = policy.logprobs(agent, gen.prompt_ids, gen.prompt_mask, gen.response_ids, gen.response_mask)
        torch.testing.assert_close(again, gen.logprobs, atol=1e-4, rtol=1e-4)


def test_each_row_gets_its_own_adapter(tokenizer):
    policy = make_policy(tokenizer)
    ids, mask = batch(tokenizer, 3)
    prompts = {a: (ids, mask) for a in AGENTS}
    seeds = [5, 6, 7]
    before = policy.generate_joint(prompts, 2, max_new_tokens=10, seeds=seeds)
    with torch.no_grad():
        for param in policy.parameters("main"):
            param.add_(torch.randn_like(param))
    after = policy.generate_joint(prompts, 2, max_new_tokens=10, seeds=seeds)
    assert torch.equal(before["helper"].response_ids, after["helper"].response_ids)
    torch.testing.assert_close(before["helper"].logprobs, after["helper"].logprobs)
    assert not torch.equal(before["main"].logprobs, after["main"].logprobs)
    # An agent's rows in a mixed batch are what that agent alone would produce.
    alone = policy.generate_joint({"main": (ids, mask)}, 2, max_new_tokens=10, seeds=seeds)
    assert torch.equal(alone["main"].response_ids, after["main"].response_ids[:, : alone["main"].response_ids.shape[1]])


def test_seeded_rows_do_not_depend_on_the_batch(tokenizer):
    policy = make_policy(tokenizer)
    ids, mask = batch(tokenizer, 6)
    state = torch.get_rng_state()
    # top-k 10: a row's logits may round differently in a batch of another size (docs/agents.md), which a
    # draw over thousands of near-equal tokens can turn into another token; over 10 it does not.
    settings = dict(max_new_tokens=10, temperature=0.9, top_p=0.95, top_k=10)
    full = policy.generate_joint({a: (ids, mask) for a in AGENTS}, 2, seeds=[11, 22, 33, 44, 55, 66], **settings)
    assert torch.equal(torch.get_rng_state(), state)  # the global stream is untouched
    part = policy.generate_joint({a: (ids[2:4], mask[2:4]) for a in AGENTS}, 2, seeds=[33, 44], **settings)
    for agent in AGENTS:
        t = part[agent].response_ids.shape[1]
        assert torch.equal(full[agent].response_ids[4:8, :t], part[agent].response_ids)
        assert not full[agent].response_mask[4:8, t:].any()
        torch.testing.assert_close(full[agent].logprobs[4:8, :t], part[agent].logprobs, atol=1e-5, rtol=0)
    again = policy.generate_joint({a: (ids, mask) for a in AGENTS}, 2, seeds=[11, 22, 33, 44, 55, 66], **settings)
    assert torch.equal(again["main"].response_ids, full["main"].response_ids)
    with pytest.raises(ValueError, match="one int per prompt row"):
        policy.generate_joint({a: (ids, mask) for a in AGENTS}, 2, seeds=[1, 2], **settings)


def test_eos_rows_are_padded_and_masked(tokenizer):
    policy = make_policy(tokenizer)
    ids, mask = batch(tokenizer, 6)
    torch.manual_seed(3)
    gens = policy.generate_joint({a: (ids, mask) for a in AGENTS}, 4, max_new_tokens=24)
    eos = torch.tensor(policy.eos_token_ids, device=gens["main"].response_ids.device)
    ended = 0
    for gen in gens.values():
        for row, row_mask, row_lp in zip(gen.response_ids, gen.response_mask, gen.logprobs):
            hits = torch.isin(row, eos).nonzero()
            if len(hits):
                first = int(hits[0])
                ended += first < len(row) - 1
                assert row_mask[: first + 1].all() and not row_mask[first + 1 :].any()
                assert (row[first + 1 :] == policy.pad_token_id).all()
                assert (row_lp[first + 1 :] == 0).all() and (row_lp[: first + 1] < 0).all()
            else:
                assert row_mask.all()
    assert ended > 0  # the band of extra EOS ids ends some rows early


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    [(1.0, 0, 1.0), (0.7, 50, 0.9), (1.0, 0, 0.8), (2.0, 0, 0.99), (0.5, 3, 1.0), (1.0, 7, 0.5)],
)
def test_sampling_distribution_matches_transformers_warpers(temperature, top_k, top_p):
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    torch.manual_seed(0)
    vocab = 3000
    logits = torch.randn(4, vocab) * 3
    logits[1] = torch.randn(vocab) * 0.01  # nearly flat: the top-p set exceeds the candidate window
    logits[2, :10] = 5.0  # ties at the top-k boundary
    if top_p == 1.0:  # (top-p over tied tokens keeps an implementation's order of them: not compared)
        logits[3, 100:140] = 20.0  # more ties with the k-th than top-k's window holds: the vocabulary is read
    expected = logits.clone()
    for warper in (
        TemperatureLogitsWarper(temperature) if temperature != 1.0 else None,
        TopKLogitsWarper(top_k) if top_k > 0 else None,
        TopPLogitsWarper(top_p) if top_p < 1.0 else None,
    ):
        if warper is not None:
            expected = warper(None, expected)
    expected = expected.softmax(-1)
    probs, indices = sampling_distribution(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    full = probs if indices is None else torch.zeros(4, vocab).scatter(1, indices, probs)
    full = full / full.sum(-1, keepdim=True)
    torch.testing.assert_close(full, expected, atol=1e-6, rtol=1e-4)
    assert TOP_P_CANDIDATES < vocab


def test_bf16_path_shapes_masks_and_finite_values(tokenizer):
    policy = make_policy(tokenizer, dtype=torch.bfloat16)
    assert policy.backend == "engine"
    assert all(p.dtype == torch.float32 for a in AGENTS for p in policy.parameters(a))  # adapters stay fp32
    ids, mask = batch(tokenizer, 3)
    torch.manual_seed(0)
    gens = policy.generate_joint({a: (ids, mask) for a in AGENTS}, 2, max_new_tokens=12, temperature=0.7, top_p=0.9)
    for agent, gen in gens.items():
        assert gen.response_ids.shape == gen.response_mask.shape == gen.logprobs.shape
        assert gen.logprobs.dtype == torch.float32 and torch.isfinite(gen.logprobs).all()
        assert (gen.logprobs <= 0).all() and ((gen.logprobs < 0) == gen.response_mask.bool()).all()
        again = policy.logprobs(agent, gen.prompt_ids, gen.prompt_mask, gen.response_ids, gen.response_mask)
        assert torch.isfinite(again).all()
        # bf16 rounding only (the engine's LoRA runs in bf16, PEFT's in fp32): close on average.
        diff = (again.detach() - gen.logprobs)[gen.response_mask.bool()].abs()
        assert diff.mean() < 0.02 and diff.max() < 1.0


def test_other_architectures_fall_back_to_generate(tokenizer):
    from transformers import AutoModelForCausalLM, GPT2Config

    config = GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=len(tokenizer), n_positions=128)
    gpt2 = AutoModelForCausalLM.from_config(config)
    assert "gpt2" in engine_support(gpt2)
    policy = MultiAgentPolicy(gpt2, tokenizer, ["agent"], lora=LoraSettings(rank=4))
    assert policy.backend == "generate" and "gpt2" in policy.backend_reason
    ids, mask = batch(tokenizer, 2)
    gen = policy.generate("agent", ids, mask, 2, max_new_tokens=4, seeds=[1, 2])
    assert gen.response_ids.shape[0] == 4
    with pytest.raises(ValueError, match="backend='engine' cannot decode this model: model_type 'gpt2'"):
        MultiAgentPolicy(AutoModelForCausalLM.from_config(config), tokenizer, ["agent"], backend="engine")
    with pytest.raises(ValueError, match="backend must be one of"):
        MultiAgentPolicy(AutoModelForCausalLM.from_config(config), tokenizer, ["agent"], backend="vllm")


@pytest.mark.slow
def test_default_model_greedy_equals_generate():
    """The embedded SmolLM2-135M in fp32: 48 greedy tokens of chat prompts, token for token."""
    from agents import load_model

    tok = load_tokenizer(None)
    model = load_model(None, dtype="float32")
    policy = MultiAgentPolicy(model, tok, AGENTS, lora=LoraSettings())
    texts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in ("Why is the sky blue?", "Write a haiku about rain.", "What is 12 times 7?")
    ]
    enc = tok(texts, padding=True, return_tensors="pt")
    prompts = {a: (enc.input_ids, enc.attention_mask) for a in AGENTS}
    with with_backend(policy, "engine"):
        ours = policy.generate_joint(prompts, 1, max_new_tokens=48, greedy=True)
    with with_backend(policy, "generate"):
        theirs = policy.generate_joint(prompts, 1, max_new_tokens=48, greedy=True)
    for agent in AGENTS:
        assert torch.equal(ours[agent].response_ids, theirs[agent].response_ids)
        torch.testing.assert_close(ours[agent].logprobs, theirs[agent].logprobs, atol=1e-4, rtol=0)


@pytest.mark.parametrize("backend", ["engine", "generate"])
def test_tempered_logprobs_recompute(tokenizer, backend):
    """``logprob_temperature`` (TRL's scoring): recorded log-probs of softmax(logits / T) recompute at T."""
    policy = make_policy(tokenizer)
    ids, mask = batch(tokenizer, 3)
    torch.manual_seed(0)
    with with_backend(policy, backend):
        gen = policy.generate("helper", ids, mask, 2, max_new_tokens=10, temperature=0.7, logprob_temperature=0.7)
    tempered = policy.logprobs("helper", gen.prompt_ids, gen.prompt_mask, gen.response_ids, gen.response_mask,
                               temperature=0.7)
    raw = policy.logprobs("helper", gen.prompt_ids, gen.prompt_mask, gen.response_ids, gen.response_mask)
    torch.testing.assert_close(tempered, gen.logprobs, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(raw, gen.logprobs, atol=1e-3)
    with pytest.raises(ValueError, match="temperature must be a number > 0, got 0"):
        policy.logprobs("helper", gen.prompt_ids, gen.prompt_mask, gen.response_ids, gen.response_mask, temperature=0)


def test_the_dynamic_loop_on_the_cpu_keeps_keys_transposed(tokenizer, monkeypatch, count_calls):
    """On the CPU the dynamic loop's decode steps attend over transposed keys (one call a layer and step
    after the first token); the static step keeps SDPA's layout. Both give transformers' greedy tokens."""
    from agents import engine as engine_module

    policy = make_policy(tokenizer)
    ids, mask = batch(tokenizer, 3)
    prompts = {a: (ids, mask) for a in AGENTS}
    with with_backend(policy, "generate"):
        theirs = policy.generate_joint(prompts, 2, max_new_tokens=6, greedy=True)
    calls = count_calls(engine_module, "transposed_key_attention")
    for mode in ("dynamic", "static"):
        calls.clear()
        monkeypatch.setattr(policy.engine, "decode", mode)
        ours = policy.generate_joint(prompts, 2, max_new_tokens=6, greedy=True)
        steps = ours[AGENTS[0]].response_ids.shape[1]
        cpu = ids.device.type == "cpu"
        layers = len(policy.engine.causal_lm.model.layers)
        assert len(calls) == (layers * (steps - 1) if mode == "dynamic" and cpu else 0), mode
        for agent in AGENTS:
            assert torch.equal(ours[agent].response_ids, theirs[agent].response_ids), (mode, agent)
            torch.testing.assert_close(ours[agent].logprobs, theirs[agent].logprobs, atol=1e-5, rtol=0)
    calls.clear()
    monkeypatch.setattr(policy.engine, "decode", "dynamic")
    monkeypatch.setattr(policy.engine, "transposed_keys", False)  # SDPA's layout, the folded kernel
    ours = policy.generate_joint(prompts, 2, max_new_tokens=6, greedy=True)
    assert not calls and torch.equal(ours[AGENTS[0]].response_ids, theirs[AGENTS[0]].response_ids)


@pytest.mark.parametrize("native", [True, False])
def test_bfloat16_keeps_keys_transposed_only_on_bf16_instructions(tokenizer, monkeypatch, count_calls, native):
    """Emulated (AVX2 kernels), bfloat16 products of the written-out decode step cost 3-4.3x the folded SDPA
    (bench/measured/attention_avx2.json): there the dynamic loop keeps SDPA's layout."""
    from agents import engine as engine_module

    policy = make_policy(tokenizer, dtype=torch.bfloat16)
    monkeypatch.setattr(engine_module, "cpu_has_native_bf16", lambda: native)
    monkeypatch.setattr(policy.engine, "decode", "dynamic")
    calls = count_calls(engine_module, "transposed_key_attention")
    ids, mask = batch(tokenizer, 3)
    out = policy.generate_joint({a: (ids, mask) for a in AGENTS}, 2, max_new_tokens=4, greedy=True)
    assert bool(calls) == native and out[AGENTS[0]].response_ids.shape[0] == 6


def test_a_prefill_of_one_span_a_row_attends_span_by_span(tokenizer, monkeypatch, count_calls):
    """Past ``SPAN_ATTENTION_MIN_LENGTH_NO_GRAD`` (here 0) a CPU prefill of left-padded prompts attends span by
    span: the same greedy tokens and log-probs as transformers' ``generate`` (sampled: the same as the
    masked prefill's, to float32 rounding)."""
    from agents import decoder as decoder_module
    from agents import engine as engine_module

    policy = make_policy(tokenizer)
    ids, mask = batch(tokenizer, 5)
    prompts = {"helper": (ids, mask), "main": (ids[:3], mask[:3])}
    both = {"helper": (ids, mask), "main": (ids, mask)}  # seeded rows: every agent the same rows
    sampled = dict(max_new_tokens=12, temperature=0.9, seeds=list(range(5)))
    with with_backend(policy, "engine"):
        masked = policy.generate_joint(both, 2, **sampled)
    with with_backend(policy, "generate"):
        theirs = policy.generate_joint(prompts, 2, max_new_tokens=12, greedy=True)
    monkeypatch.setattr(decoder_module, "SPAN_ATTENTION_MIN_LENGTH_NO_GRAD", 0)
    calls = count_calls(engine_module, "span_attention")
    with with_backend(policy, "engine"):
        greedy = policy.generate_joint(prompts, 2, max_new_tokens=12, greedy=True)
        spanned = policy.generate_joint(both, 2, **sampled)
    assert calls
    for agent in AGENTS:
        assert torch.equal(greedy[agent].response_ids, theirs[agent].response_ids), agent
        torch.testing.assert_close(greedy[agent].logprobs, theirs[agent].logprobs, atol=1e-5, rtol=0)
        assert torch.equal(spanned[agent].response_ids, masked[agent].response_ids), agent
        torch.testing.assert_close(spanned[agent].logprobs, masked[agent].logprobs, atol=1e-5, rtol=0)
