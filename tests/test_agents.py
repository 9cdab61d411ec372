"""Tests of agents/: a tiny Llama built in-process over the real default tokenizer (49k vocab, still tiny)."""

from __future__ import annotations

import os
import time
from typing import ClassVar

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gymnasium
import numpy as np
import pytest
import torch
from tiny_models import testing_device
from tiny_models import tiny_model as build_tiny_model

import agents.models
from agents import Generation, LoraSettings, MultiAgentPolicy, Sampling
from agents.models import load_model, resolve_device, resolve_dtype
from llm_envs.tokenizers import load_tokenizer

AGENTS = ("helper", "main")
MAX_NEW_TOKENS = 12


@pytest.fixture(scope="session")
def tokenizer():
    return load_tokenizer(None)


def tiny_model(tokenizer, seed: int = 0):
    return build_tiny_model(tokenizer, seed, extra_eos=range(1000, 6000))


def make_policy(tokenizer, seed: int = 0, adapter_seed: int | None = None, **kwargs) -> MultiAgentPolicy:
    kwargs.setdefault("lora", LoraSettings(rank=4, alpha=8))
    policy = MultiAgentPolicy(tiny_model(tokenizer, seed), tokenizer, kwargs.pop("agents", AGENTS), **kwargs)
    # LoRA B starts at zero (adapter = no-op); random adapters make every agent a different policy.
    gen = torch.Generator().manual_seed(seed + 1 if adapter_seed is None else adapter_seed)
    with torch.no_grad():
        for agent in policy.agents:
            for param in policy.parameters(agent, value_head=False):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    return policy


@pytest.fixture(scope="module")
def policy(tokenizer):
    """Read-only policy shared by the tests that do not train."""
    return make_policy(tokenizer, value_head=True)


def batch(tokenizer):
    """Left-padded prompts of different lengths, one containing the pad (= end-of-turn) id as a real token,
    and right-padded responses: one ends at EOS mid-row, one fills the row, one is a single token."""
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False),  # holds <|im_end|>
        "A longer prompt, with several more tokens than the first.",
        "Short",
    ]
    enc = tokenizer(prompts, padding=True, return_tensors="pt")
    assert (enc.input_ids[0] == tokenizer.pad_token_id)[enc.attention_mask[0].bool()].any()
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    response_ids = torch.tensor(
        [
            [500, 501, 502, eos, pad, pad],
            [600, 601, 602, 603, 604, 605],
            [700, pad, pad, pad, pad, pad],
        ]
    )
    response_mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]])
    return tuple(t.to(testing_device()) for t in (enc.input_ids, enc.attention_mask, response_ids, response_mask))


def naive_logprobs(model, prompt_ids, prompt_mask, response_ids, response_mask, adapter=None):
    """Row by row, no padding anywhere: full logits, log_softmax, read each response token."""
    rows, hidden_rows = [], []
    device = next(model.parameters()).device
    tensors = [t.to(device) for t in (prompt_ids, prompt_mask, response_ids, response_mask)]
    for p_ids, p_mask, r_ids, r_mask in zip(*tensors, strict=True):
        prompt = p_ids[p_mask.bool()]
        response = r_ids[r_mask.bool()]
        ids = torch.cat([prompt, response]).unsqueeze(0)
        out = model(input_ids=ids)
        logp = torch.log_softmax(out.logits[0].float(), -1)
        positions = torch.arange(len(prompt) - 1, len(prompt) + len(response) - 1, device=device)
        row = torch.zeros(len(r_ids), device=device)
        row[: len(response)] = logp[positions, response]
        rows.append(row)
        # The final hidden state as the LM head reads it (after the final norm): what a value head reads.
        # The decoder stack's last_hidden_state is that in every transformers version; ``hidden_states[-1]``
        # of the causal LM is not (some 5.x versions record it before the norm).
        stack = model.get_base_model().model if hasattr(model, "get_base_model") else model.model
        final = stack(input_ids=ids).last_hidden_state
        hidden = torch.zeros(len(r_ids), final.shape[-1], device=device)
        hidden[: len(response)] = final[0, positions]
        hidden_rows.append(hidden)
    return torch.stack(rows), torch.stack(hidden_rows)


# ---------------------------------------------------------------- log-probs and values


def test_batched_logprobs_equal_naive_per_sample(policy, tokenizer):
    p_ids, p_mask, r_ids, r_mask = batch(tokenizer)
    for agent in AGENTS:
        with torch.no_grad():
            batched = policy.logprobs(agent, p_ids, p_mask, r_ids, r_mask)
            policy._set_agent(agent)
            naive, _ = naive_logprobs(policy.model, p_ids, p_mask, r_ids, r_mask)
        torch.testing.assert_close(batched, naive, rtol=1e-4, atol=1e-4)
        # Last response token included (the EOS of row 0, the final column of row 1, the only token of row 2).
        assert (batched[0, :4] != 0).all() and (batched[1] != 0).all() and batched[2, 0] != 0
        assert (batched[0, 4:] == 0).all() and (batched[2, 1:] == 0).all()
    # The two adapters really are different policies.
    with torch.no_grad():
        a = policy.logprobs("helper", p_ids, p_mask, r_ids, r_mask)
        b = policy.logprobs("main", p_ids, p_mask, r_ids, r_mask)
    assert (a - b).abs().max() > 1e-3


def test_pads_do_not_matter(policy, tokenizer):
    p_ids, p_mask, r_ids, r_mask = batch(tokenizer)
    with torch.no_grad():
        before = policy.logprobs("helper", p_ids, p_mask, r_ids, r_mask)
        p_junk = p_ids.masked_fill(p_mask == 0, 1234)
        r_junk = r_ids.masked_fill(r_mask == 0, 4321)
        after = policy.logprobs("helper", p_junk, p_mask, r_junk, r_mask)
        # Extra left padding of the prompts changes nothing either.
        pad = torch.full((3, 5), tokenizer.pad_token_id, device=p_ids.device)
        wider = policy.logprobs(
            "helper", torch.cat([pad, p_ids], 1), torch.cat([torch.zeros_like(pad), p_mask], 1), r_ids, r_mask
        )
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(wider, before, rtol=1e-5, atol=1e-5)


def test_values_read_last_hidden_state_per_response_token(policy, tokenizer):
    p_ids, p_mask, r_ids, r_mask = batch(tokenizer)
    logprobs, values = policy.forward("main", p_ids, p_mask, r_ids, r_mask, with_values=True)
    assert values.shape == r_ids.shape and values.requires_grad
    with torch.no_grad():
        _, hidden = naive_logprobs(policy.model, p_ids, p_mask, r_ids, r_mask)
        expected = policy.value_heads["main"](hidden).squeeze(-1) * r_mask
    torch.testing.assert_close(values.detach(), expected, rtol=1e-4, atol=1e-4)
    assert (values[r_mask == 0] == 0).all()
    torch.testing.assert_close(logprobs, policy.logprobs("main", p_ids, p_mask, r_ids, r_mask))
    values.sum().backward()
    assert policy.value_heads["main"].weight.grad is not None
    assert policy.value_heads["helper"].weight.grad is None
    policy.value_heads.zero_grad(set_to_none=True)
    for agent in AGENTS:
        for param in policy.parameters(agent):
            param.grad = None


def test_ref_logprobs_are_the_base_model(policy, tokenizer):
    p_ids, p_mask, r_ids, r_mask = batch(tokenizer)
    ref = policy.ref_logprobs("helper", p_ids, p_mask, r_ids, r_mask)
    assert not ref.requires_grad
    with torch.no_grad(), policy.model.disable_adapter():
        naive, _ = naive_logprobs(policy.model, p_ids, p_mask, r_ids, r_mask)
    torch.testing.assert_close(ref, naive, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ref, policy.ref_logprobs("main", p_ids, p_mask, r_ids, r_mask))
    with torch.no_grad():
        assert (ref - policy.logprobs("helper", p_ids, p_mask, r_ids, r_mask)).abs().max() > 1e-3


# ---------------------------------------------------------------- training


def snapshot(policy):
    base = {n: p.detach().clone() for n, p in policy.model.named_parameters() if "lora_" not in n}
    adapters = {a: [p.detach().clone() for p in policy.parameters(a, value_head=False)] for a in policy.agents}
    return base, adapters


def test_gradient_step_changes_one_adapter_only(tokenizer):
    policy = make_policy(tokenizer)
    p_ids, p_mask, r_ids, r_mask = batch(tokenizer)
    optimizers = {a: policy.optimizer(a, lr=1e-2) for a in AGENTS}
    on_cuda = policy.parameters("helper")[0].is_cuda  # fused AdamW there, torch's default on the CPU
    assert all(o.defaults["fused"] is (True if on_cuda else None) for o in optimizers.values())
    assert policy.optimizer("main", lr=1e-2, foreach=False).defaults["fused"] is None  # the caller's choice wins
    base_before, adapters_before = snapshot(policy)
    ref_before = policy.ref_logprobs("helper", p_ids, p_mask, r_ids, r_mask)
    with torch.no_grad():
        main_before = policy.logprobs("main", p_ids, p_mask, r_ids, r_mask)
        helper_before = policy.logprobs("helper", p_ids, p_mask, r_ids, r_mask)

    loss = -policy.logprobs("helper", p_ids, p_mask, r_ids, r_mask).sum()
    loss.backward()
    assert all(p.grad is None for p in policy.parameters("main"))
    assert all(p.grad is not None for p in policy.parameters("helper"))
    for optimizer in optimizers.values():
        optimizer.step()

    base_after, adapters_after = snapshot(policy)
    for name, tensor in base_before.items():
        assert torch.equal(tensor, base_after[name]), name
    assert all(torch.equal(x, y) for x, y in zip(adapters_before["main"], adapters_after["main"], strict=True))
    assert any(not torch.equal(x, y) for x, y in zip(adapters_before["helper"], adapters_after["helper"], strict=True))
    torch.testing.assert_close(policy.ref_logprobs("helper", p_ids, p_mask, r_ids, r_mask), ref_before)
    with torch.no_grad():
        torch.testing.assert_close(policy.logprobs("main", p_ids, p_mask, r_ids, r_mask), main_before)
        helper_after = policy.logprobs("helper", p_ids, p_mask, r_ids, r_mask)
    # The step raised the log-likelihood of the trained responses.
    assert helper_after.sum() > helper_before.sum()


def test_full_finetuning_single_agent(tokenizer):
    with pytest.raises(ValueError, match="exactly one agent"):
        MultiAgentPolicy(tiny_model(tokenizer), tokenizer, AGENTS, lora=None)
    policy = MultiAgentPolicy(tiny_model(tokenizer), tokenizer, ["solo"], lora=None)
    p_ids, p_mask, r_ids, r_mask = batch(tokenizer)
    ref_before = policy.ref_logprobs("solo", p_ids, p_mask, r_ids, r_mask)
    optimizer = policy.optimizer("solo", lr=1e-2)
    assert len(policy.parameters("solo")) == len(list(policy.model.parameters()))
    (-policy.logprobs("solo", p_ids, p_mask, r_ids, r_mask).sum()).backward()
    optimizer.step()
    with torch.no_grad():
        after = policy.logprobs("solo", p_ids, p_mask, r_ids, r_mask)
    torch.testing.assert_close(policy.ref_logprobs("solo", p_ids, p_mask, r_ids, r_mask), ref_before)
    assert (after - ref_before).abs().max() > 1e-3


# ---------------------------------------------------------------- checkpoints


def test_save_load_round_trip(tokenizer, tmp_path):
    policy = make_policy(tokenizer, value_head=True)
    p_ids, p_mask, r_ids, r_mask = batch(tokenizer)
    for agent in AGENTS:
        optimizer = policy.optimizer(agent, lr=1e-2)
        lp, values = policy.forward(agent, p_ids, p_mask, r_ids, r_mask, with_values=True)
        (-lp.sum() + values.pow(2).sum()).backward()
        optimizer.step()
    policy.save(tmp_path / "ckpt")

    # Same base model (checkpoints hold adapters only), different adapters and value heads.
    fresh = make_policy(tokenizer, adapter_seed=7, value_head=True)
    with torch.no_grad():
        before_load = fresh.logprobs("main", p_ids, p_mask, r_ids, r_mask)
        assert (before_load - policy.logprobs("main", p_ids, p_mask, r_ids, r_mask)).abs().max() > 1e-3
    optimizer = fresh.optimizer("main", lr=1e-2)
    fresh.load(tmp_path / "ckpt")
    # The optimizer built before loading still holds the live parameters.
    assert all(p is q for p, q in zip(optimizer.param_groups[0]["params"], fresh.parameters("main"), strict=True))
    with torch.no_grad():
        for agent in AGENTS:
            for method in ("logprobs", "values"):
                expected = getattr(policy, method)(agent, p_ids, p_mask, r_ids, r_mask)
                torch.testing.assert_close(getattr(fresh, method)(agent, p_ids, p_mask, r_ids, r_mask), expected)


def test_loading_some_agents_changes_only_theirs(tokenizer, tmp_path):
    policy = make_policy(tokenizer, value_head=True)
    one, other = AGENTS[0], AGENTS[1]
    policy.save(tmp_path / "one", policy.state([one]))  # a file for `one` only; the manifest names everyone
    fresh = make_policy(tokenizer, adapter_seed=7, value_head=True)
    kept = {k: v.clone() for k, v in fresh.state([other])[f"{other}.adapter.safetensors"].items()}
    fresh.load(tmp_path / "one", agents=[one])
    p_ids, p_mask, r_ids, r_mask = batch(tokenizer)
    with torch.no_grad():
        for method in ("logprobs", "values"):
            expected = getattr(policy, method)(one, p_ids, p_mask, r_ids, r_mask)
            torch.testing.assert_close(getattr(fresh, method)(one, p_ids, p_mask, r_ids, r_mask), expected)
    for k, v in fresh.state([other])[f"{other}.adapter.safetensors"].items():
        assert torch.equal(v, kept[k]), k  # the other agent keeps its weights
    with pytest.raises(FileNotFoundError, match="is missing"):  # loading it whole needs every agent's file
        fresh.load(tmp_path / "one")
    with pytest.raises(KeyError, match="unknown agent"):
        fresh.load(tmp_path / "one", agents=["nobody"])
    with pytest.raises(ValueError, match="value_head"):
        make_policy(tokenizer).load(tmp_path / "one", agents=[one])
    solo = make_policy(tokenizer, agents=[one], value_head=True)  # fewer agents than the file: fine for a subset
    solo.load(tmp_path / "one", agents=[one])
    assert policy.describe_agents([one]) == solo.describe_agents()


def test_full_finetuning_save_load(tokenizer, tmp_path):
    policy = MultiAgentPolicy(tiny_model(tokenizer, 1), tokenizer, ["solo"], lora=None)
    policy.save(tmp_path)
    fresh = MultiAgentPolicy(tiny_model(tokenizer, 2), tokenizer, ["solo"], lora=None)
    fresh.load(tmp_path)
    p_ids, p_mask, r_ids, r_mask = batch(tokenizer)
    with torch.no_grad():
        torch.testing.assert_close(
            fresh.logprobs("solo", p_ids, p_mask, r_ids, r_mask), policy.logprobs("solo", p_ids, p_mask, r_ids, r_mask)
        )


def test_load_rejects_mismatched_or_corrupt_checkpoints(tokenizer, tmp_path):
    make_policy(tokenizer).save(tmp_path / "ok")
    p_ids, p_mask, r_ids, r_mask = batch(tokenizer)

    other_names = make_policy(tokenizer, agents=("pioneer", "observer"))
    with pytest.raises(ValueError, match=r"holds agents \['helper', 'main'\].*\['pioneer', 'observer'\]"):
        other_names.load(tmp_path / "ok")
    other_rank = make_policy(tokenizer, lora=LoraSettings(rank=8, alpha=8))
    with pytest.raises(ValueError, match="'rank': 4.*'rank': 8"):
        other_rank.load(tmp_path / "ok")
    with pytest.raises(ValueError, match="value_head=False"):
        make_policy(tokenizer, value_head=True).load(tmp_path / "ok")
    with pytest.raises(FileNotFoundError, match="not a saved policy"):
        other_rank.load(tmp_path / "nothing-here")

    target = make_policy(tokenizer, adapter_seed=3)
    with torch.no_grad():
        before = target.logprobs("helper", p_ids, p_mask, r_ids, r_mask)
    corrupt = tmp_path / "corrupt"
    make_policy(tokenizer).save(corrupt)
    data = (corrupt / "main.adapter.safetensors").read_bytes()
    (corrupt / "main.adapter.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="corrupt checkpoint file .*main.adapter.safetensors"):
        target.load(corrupt)
    # helper's file came first and was fine, yet nothing was applied.
    with torch.no_grad():
        torch.testing.assert_close(target.logprobs("helper", p_ids, p_mask, r_ids, r_mask), before)

    (corrupt / "policy.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupt checkpoint manifest"):
        target.load(corrupt)

    # A file whose tensors have the wrong shape (edited manifest, same names).
    from safetensors.torch import load_file, save_file

    reshaped = tmp_path / "reshaped"
    make_policy(tokenizer).save(reshaped)
    state = load_file(str(reshaped / "main.adapter.safetensors"))
    key = next(iter(state))
    state[key] = torch.zeros(3, 3)
    save_file(state, str(reshaped / "main.adapter.safetensors"))
    with pytest.raises(ValueError, match=r"wrong shapes .*\(3, 3\) in the file"):
        target.load(reshaped)


# ---------------------------------------------------------------- generation


def check_generation(gen: Generation, policy: MultiAgentPolicy, rows: int, max_new_tokens: int):
    assert gen.response_ids.shape == gen.response_mask.shape == gen.logprobs.shape
    assert gen.response_ids.shape[0] == rows and 1 <= gen.response_ids.shape[1] <= max_new_tokens
    mask = gen.response_mask
    assert (mask.diff(dim=1) <= 0).all(), "response masks must be 1s then 0s"
    eos = torch.isin(gen.response_ids, torch.tensor(policy.eos_token_ids, device=gen.response_ids.device))
    lengths = mask.sum(-1)
    for row in range(rows):
        n = int(lengths[row])
        assert n >= 1
        # Ends with EOS (included) unless it ran to max_new_tokens; no EOS before the end.
        assert not eos[row, : n - 1].any()
        assert eos[row, n - 1] or n == max_new_tokens
        assert (gen.response_ids[row, n:] == policy.pad_token_id).all()
    assert (gen.logprobs[mask == 0] == 0).all() and (gen.logprobs[mask == 1] < 0).all()
    with torch.no_grad():
        recomputed = policy.logprobs(gen.agent, gen.prompt_ids, gen.prompt_mask, gen.response_ids, gen.response_mask)
    torch.testing.assert_close(gen.logprobs, recomputed, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "sampling",
    [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9, top_k=50), dict(greedy=True, repetition_penalty=1.1)],
    ids=["plain", "warped", "greedy-penalty"],
)
def test_generate_shapes_masks_and_logprobs(policy, tokenizer, sampling):
    p_ids, p_mask, _, _ = batch(tokenizer)
    torch.manual_seed(0)
    gen = policy.generate("helper", p_ids, p_mask, num_samples=4, max_new_tokens=MAX_NEW_TOKENS, **sampling)
    check_generation(gen, policy, rows=12, max_new_tokens=MAX_NEW_TOKENS)
    assert torch.equal(gen.prompt_ids.view(3, 4, -1)[:, 1], p_ids) and gen.num_samples == 4
    if "greedy" not in sampling:
        # Some responses stop at EOS early, so the masks are exercised.
        assert (gen.response_lengths < MAX_NEW_TOKENS).any()


def test_mixed_adapter_batch_equals_one_call_per_agent(policy, tokenizer):
    p_ids, p_mask, _, _ = batch(tokenizer)
    prompts = {"helper": (p_ids, p_mask), "main": (p_ids[1:], p_mask[1:, :])}
    mixed = policy.generate_joint(prompts, 2, max_new_tokens=8, greedy=True)
    policy.mixed_batches = False
    try:
        separate = policy.generate_joint(prompts, 2, max_new_tokens=8, greedy=True)
    finally:
        policy.mixed_batches = True
    for agent in prompts:
        check_generation(mixed[agent], policy, rows=len(prompts[agent][0]) * 2, max_new_tokens=8)
        n = min(mixed[agent].response_ids.shape[1], separate[agent].response_ids.shape[1])
        assert torch.equal(mixed[agent].response_ids[:, :n], separate[agent].response_ids[:, :n])
        torch.testing.assert_close(mixed[agent].logprobs[:, :n], separate[agent].logprobs[:, :n], rtol=1e-4, atol=1e-4)
    assert not torch.equal(mixed["helper"].response_ids[2:4], mixed["main"].response_ids[:2])


def test_generate_rejects_bad_input(policy, tokenizer):
    p_ids, p_mask, _, _ = batch(tokenizer)
    with pytest.raises(KeyError, match="unknown agent 'nobody'.*'helper', 'main'"):
        policy.generate("nobody", p_ids, p_mask)
    with pytest.raises(ValueError, match="not a non-empty left-padded prompt"):
        policy.generate("helper", p_ids.flip(1), p_mask.flip(1))
    with pytest.raises(ValueError, match="top_p must be in"):
        policy.generate("helper", p_ids, p_mask, top_p=0.0)
    with pytest.raises(ValueError, match="num_samples must be a positive int, got 0"):
        policy.generate("helper", p_ids, p_mask, 0)
    with pytest.raises(TypeError, match="must hold integers"):
        policy.generate("helper", p_ids.float(), p_mask)
    with pytest.raises(ValueError, match=r"must lie in \[0, 49151\].*max 49152"):
        policy.generate("helper", p_ids.masked_fill(p_ids == p_ids[0, -1], 49152), p_mask)
    _, _, r_ids, r_mask = batch(tokenizer)
    with pytest.raises(ValueError, match="not right-padded"):
        policy.logprobs("helper", p_ids, p_mask, r_ids, r_mask.flip(1))
    with pytest.raises(ValueError, match="3 prompts but 2 responses"):
        policy.logprobs("helper", p_ids, p_mask, r_ids[:2], r_mask[:2])
    for bad in ("", "a.b", "__base__", "lora"):
        with pytest.raises(ValueError, match="not usable as an adapter name"):
            MultiAgentPolicy(tiny_model(tokenizer), tokenizer, [bad])
    with pytest.raises(ValueError, match="distinct"):
        MultiAgentPolicy(tiny_model(tokenizer), tokenizer, ["x", "x"])
    with pytest.raises(ValueError, match="rank must be a positive int, got 0"):
        LoraSettings(rank=0)


# ---------------------------------------------------------------- act


def observations(tokenizer, texts, length=24):
    enc = tokenizer(texts, padding="max_length", max_length=length, return_tensors="np")
    return enc["input_ids"].astype(np.int64), enc["attention_mask"].astype(np.int8)


def test_act_parallel_aec_and_vector_observations(policy, tokenizer):
    vocab = len(tokenizer)
    space = gymnasium.spaces.Box(0, vocab - 1, (MAX_NEW_TOKENS,), np.int64)
    ids, mask = observations(tokenizer, ["Write a haiku.", "Summarise: the cat sat on the mat."])
    parallel = {
        "helper": {"observation": ids[0], "attention_mask": mask[0]},
        "main": {"observation": ids[1], "attention_mask": mask[1]},
    }
    actions = policy.act(parallel, max_new_tokens=MAX_NEW_TOKENS)
    assert set(actions) == set(AGENTS)
    for action in actions.values():
        assert action.dtype == np.int64 and space.contains(action)

    single = policy.act(parallel["main"], agent="main", max_new_tokens=MAX_NEW_TOKENS)
    assert space.contains(single)

    batched_space = gymnasium.spaces.Box(0, vocab - 1, (2, MAX_NEW_TOKENS), np.int64)
    vector = policy.act({"helper": {"observation": ids, "attention_mask": mask}}, max_new_tokens=MAX_NEW_TOKENS)
    assert batched_space.contains(vector["helper"])

    default_length = policy.act(parallel["helper"], agent="helper")
    assert default_length.shape == (Sampling().max_new_tokens,)

    # Greedy actions are the greedy generations, padded with the pad id.
    greedy = policy.act(parallel, max_new_tokens=6, sampling=Sampling(greedy=True))
    gen = policy.generate("helper", ids[:1], mask[:1], max_new_tokens=6, greedy=True)
    n = gen.response_ids.shape[1]
    assert np.array_equal(greedy["helper"][:n], gen.response_ids[0].cpu().numpy())
    assert (greedy["helper"][n:] == policy.pad_token_id).all()


def test_act_rejects_bad_observations(policy, tokenizer):
    ids, mask = observations(tokenizer, ["Hello"])
    with pytest.raises(ValueError, match="pass agent=<name>"):
        policy.act({"observation": ids[0], "attention_mask": mask[0]})
    with pytest.raises(KeyError, match="unknown agent 'player_0'"):
        policy.act({"player_0": {"observation": ids[0], "attention_mask": mask[0]}})
    with pytest.raises(ValueError, match="'observation' and 'attention_mask'"):
        policy.act({"helper": {"observation": ids[0]}})
    with pytest.raises(TypeError, match="must hold integers, got dtype torch.float"):
        policy.act({"helper": {"observation": ids[0].astype(np.float32), "attention_mask": mask[0]}})
    with pytest.raises(ValueError, match="shape"):
        policy.act({"helper": {"observation": ids[0], "attention_mask": mask[0, 1:]}})
    with pytest.raises(ValueError, match="not a non-empty left-padded prompt"):
        policy.act({"helper": {"observation": ids[0], "attention_mask": np.zeros_like(mask[0])}})


def test_act_drives_a_parallel_env_episode(policy, tokenizer):
    """A minimal two-turn env with the contract's spaces (the registered envs live in llm_envs.core)."""
    from pettingzoo import ParallelEnv

    vocab, length = len(tokenizer), 24

    class EchoEnv(ParallelEnv):
        metadata: ClassVar[dict] = {"name": "echo_v0"}

        def __init__(self):
            self.possible_agents = list(AGENTS)
            self._obs_space = gymnasium.spaces.Dict(
                observation=gymnasium.spaces.Box(0, vocab - 1, (length,), np.int64),
                attention_mask=gymnasium.spaces.Box(0, 1, (length,), np.int8),
            )
            self._act_space = gymnasium.spaces.Box(0, vocab - 1, (MAX_NEW_TOKENS,), np.int64)

        def observation_space(self, agent):
            return self._obs_space

        def action_space(self, agent):
            return self._act_space

        def _obs(self, texts):
            ids, mask = observations(tokenizer, texts, length)
            return {a: {"observation": ids[i], "attention_mask": mask[i]} for i, a in enumerate(self.agents)}

        def reset(self, seed=None, options=None):
            self.agents, self.turn = list(self.possible_agents), 0
            return self._obs(["Say hi.", "Say bye."]), {a: {} for a in self.agents}

        def step(self, actions):
            assert all(self._act_space.contains(actions[a]) for a in self.agents)
            self.turn += 1
            texts = [tokenizer.decode(actions[a], skip_special_tokens=True)[-20:] or "." for a in self.agents]
            done = self.turn == 2
            obs = self._obs(texts)
            if done:
                self.agents = []
            flags = dict.fromkeys(AGENTS, done)
            return obs, dict.fromkeys(AGENTS, 0.0), flags, dict.fromkeys(AGENTS, False), {a: {} for a in AGENTS}

    env = EchoEnv()
    obs, _ = env.reset(seed=0)
    steps = 0
    while env.agents:
        obs, *_ = env.step(policy.act(obs, max_new_tokens=MAX_NEW_TOKENS))
        steps += 1
    assert steps == 2


# ---------------------------------------------------------------- models


def test_model_loading_options(tokenizer, tmp_path):
    tiny_model(tokenizer).save_pretrained(tmp_path / "tiny")
    model = load_model(tmp_path / "tiny", dtype="bfloat16", device="cpu")
    assert model.dtype == torch.bfloat16 and not model.training
    policy = MultiAgentPolicy(model, tokenizer, ["solo"])
    p_ids, p_mask, r_ids, r_mask = batch(tokenizer)
    with torch.no_grad():
        lp = policy.logprobs("solo", p_ids, p_mask, r_ids, r_mask)
    assert lp.dtype == torch.float32 and torch.isfinite(lp).all()
    with pytest.raises(OSError, match="Could not load model '.*missing'"):
        load_model(tmp_path / "missing")
    with pytest.raises(ValueError, match="dtype must be .* got 'float8'"):
        resolve_dtype("float8", torch.device("cpu"))
    with pytest.raises(ValueError, match="dtype must be a floating-point"):
        resolve_dtype(torch.int64, torch.device("cpu"))
    with pytest.raises(ValueError, match="got 'gpu0'"):
        resolve_device("gpu0")
    # Unset: bfloat16 where the CPU multiplies it natively (avx512_bf16 / AMX), else float32.
    native = agents.models.cpu_has_native_bf16()
    assert resolve_dtype(None, torch.device("cpu")) == (torch.bfloat16 if native else torch.float32)
    assert resolve_dtype("auto", torch.device("cpu")) == resolve_dtype(None, torch.device("cpu"))


@pytest.mark.parametrize(
    ("flags", "env", "expected"),
    [
        ({"avx2"}, {}, torch.float32),  # AVX2-only EPYC: bf16 is emulated
        ({"avx2", "avx512f", "avx512_bf16"}, {}, torch.bfloat16),  # Zen 4 / Cooper Lake
        ({"avx2", "avx512f", "amx_bf16"}, {}, torch.bfloat16),  # Sapphire Rapids
        ({"avx2", "avx512f", "amx_bf16"}, {"ONEDNN_MAX_CPU_ISA": "AVX2"}, torch.float32),  # the CI restriction
        ({"avx512_bf16"}, {"ONEDNN_MAX_CPU_ISA": "avx512_core"}, torch.float32),
        ({"avx512_bf16"}, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, torch.bfloat16),
        ({"amx_bf16"}, {"ATEN_CPU_CAPABILITY": "avx2"}, torch.float32),
        ({"amx_bf16"}, {"LLM_ENVS_DTYPE": "float32"}, torch.float32),  # forced
        ({"avx2"}, {"LLM_ENVS_DTYPE": "bfloat16"}, torch.bfloat16),
        ({"avx2"}, {"LLM_ENVS_DTYPE": "auto"}, torch.float32),
    ],
)
def test_auto_dtype_follows_the_cpu_the_kernel_restriction_and_the_override(monkeypatch, flags, env, expected):
    for name in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
                 "LLM_ENVS_DTYPE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(agents.models, "cpu_flags", lambda: frozenset(flags))
    assert resolve_dtype(None, torch.device("cpu")) == expected
    assert resolve_dtype("float32", torch.device("cpu")) == torch.float32  # an explicit dtype always wins


def test_a_bad_forced_dtype_names_the_variable(monkeypatch):
    monkeypatch.setenv("LLM_ENVS_DTYPE", "fp8")
    with pytest.raises(ValueError, match=r"\$LLM_ENVS_DTYPE must be 'auto' or one of .* got 'fp8'"):
        resolve_dtype(None, torch.device("cpu"))


def test_vocabulary_mismatch_is_an_error(tokenizer):
    from transformers import AutoModelForCausalLM, LlamaConfig

    small = AutoModelForCausalLM.from_config(
        LlamaConfig(
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=32,
            vocab_size=1000,
        )
    )
    with pytest.raises(ValueError, match="tokenizer has 49152 tokens but the model's embedding has 1000 rows"):
        MultiAgentPolicy(small, tokenizer, ["solo"])


# ---------------------------------------------------------------- the embedded default (slow)


@pytest.mark.slow
def test_default_model_loads_offline_and_generates(tokenizer):
    from agents.models import default_model_weights_dir

    cold = not (default_model_weights_dir() / "config.json").is_file()
    start = time.perf_counter()
    # float32: the conversion's fidelity is what is checked (bf16 greedy text differs by rounding).
    policy = MultiAgentPolicy.from_pretrained(AGENTS, dtype="float32")
    load_s = time.perf_counter() - start
    print(f"default model {'cold (GGUF conversion)' if cold else 'warm'} load + policy build: {load_s:.1f} s")
    assert policy.tokenizer is tokenizer  # the very object the envs use
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, tokenize=False
    )
    enc = tokenizer([prompt], return_tensors="pt")
    gen = policy.generate("helper", enc.input_ids, enc.attention_mask, max_new_tokens=16, greedy=True)
    text = tokenizer.decode(gen.response_ids[0][gen.response_mask[0].bool()], skip_special_tokens=True)
    print(f"response: {text!r}")
    assert "Paris" in text
    # Adapters start as no-ops: the policy is the base model.
    torch.testing.assert_close(
        gen.logprobs,
        policy.ref_logprobs("helper", gen.prompt_ids, gen.prompt_mask, gen.response_ids, gen.response_mask),
        rtol=1e-4,
        atol=1e-4,
    )


@pytest.mark.slow
def test_converted_default_matches_the_gguf_model(tokenizer):
    from transformers import AutoModelForCausalLM

    from llm_envs.tokenizers import find_default_gguf

    converted = load_model(device="cpu", dtype="float32")
    gguf = find_default_gguf()
    original = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    ids = tokenizer(["The quick brown fox"], return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, original(ids).logits)


def test_building_a_policy_warns_about_nothing_the_user_cannot_act_on(tokenizer):
    """PEFT's read of transformers' deprecated ``is_gradient_checkpointing`` printed a FutureWarning on
    every run; the policy silences that one, and only that one."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        policy = make_policy(tokenizer)
    assert len(policy.agents) == len(AGENTS)


AVX2_RESTRICTION = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def test_the_avx2_restriction_takes_effect_and_auto_picks_float32():
    """What .ci/run's second pass relies on: in a process started with the restriction, ATen runs its
    AVX2 kernels (whatever the CPU has) and "auto" resolves to float32, as on an AVX2-only CPU."""
    import json
    import subprocess
    import sys

    code = ("import json, torch; from agents.models import resolve_dtype, machine_description; "
            "print(json.dumps({'kernels': torch.backends.cpu.get_cpu_capability(), "
            "'dtype': str(resolve_dtype(None, torch.device('cpu'))), 'machine': machine_description('auto')}))")
    env = {k: v for k, v in os.environ.items() if k != "LLM_ENVS_DTYPE"}
    out = subprocess.run([sys.executable, "-c", code], env={**env, **AVX2_RESTRICTION}, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    got = json.loads(out.splitlines()[-1])
    assert got["kernels"] in ("AVX2", "DEFAULT") and got["dtype"] == "torch.float32"
    assert got["machine"]["restriction"] == AVX2_RESTRICTION and got["machine"]["dtype"] == "float32"
