"""Every pass sees the same policy: no dropout in the frozen base (KL to the reference exactly 0 and
ratios 1 before any update), evaluation leaves every torch generator (CUDA's too) as it found it, and
the env ends a response exactly where the policy stopped generating it.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch

import llm_envs
from agents import LoraSettings, MultiAgentPolicy
from llm_envs.tokenizers import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(None)


def tiny_gpt2(tokenizer, dropout: float = 0.1):
    """A 2-layer GPT-2 with its default dropouts (embeddings, attention, residual) on."""
    from transformers import AutoModelForCausalLM, GPT2Config

    torch.manual_seed(0)
    config = GPT2Config(
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=256,
        vocab_size=len(tokenizer),
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return AutoModelForCausalLM.from_config(config)


def prompts(tokenizer, n: int = 4):
    rows = [tokenizer.encode(f"Review number {i}: the film was") for i in range(n)]
    width = max(map(len, rows))
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


def test_base_dropout_is_off_in_train_mode(tokenizer):
    policy = MultiAgentPolicy(tiny_gpt2(tokenizer), tokenizer, ["agent"], lora=LoraSettings(rank=4), value_head=True)
    ids, mask = prompts(tokenizer)
    torch.manual_seed(1)
    gen = policy.generate("agent", ids, mask, 2, max_new_tokens=8)
    args = (gen.prompt_ids, gen.prompt_mask, gen.response_ids, gen.response_mask)
    policy.train()
    assert policy.training
    first = policy.logprobs("agent", *args)
    second = policy.logprobs("agent", *args)
    assert first.requires_grad
    assert torch.equal(first, second)  # no dropout mask: the same input scores the same
    # LoRA B starts at 0: the policy is the reference, so the per-token KL is exactly 0 ...
    assert torch.equal(first.detach(), policy.ref_logprobs("agent", *args))
    with torch.no_grad():
        old, values = policy.forward("agent", *args, with_values=True)
    assert torch.equal(old, first.detach())
    assert torch.equal(values, policy.values("agent", *args).detach())
    # ... and MAGRPO's / PPO's ratio to the sampling-time log-probs is 1 (cached vs full forward: float
    # error only; with the base's dropout on it was 0.89-1.11).
    ratio = torch.exp(first.detach() - gen.logprobs)[gen.response_mask.bool()]
    torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=1e-5, rtol=0)
    # The base's dropout modules never left eval mode; the policy's mode switches back and forth.
    assert not any(m.training for m in policy.model.modules() if isinstance(m, torch.nn.Dropout))
    policy.eval()
    assert not policy.training


def test_ppo_kl_is_zero_before_the_first_update(tokenizer):
    from baselines.learners.ppo import Config, make_experience

    policy = MultiAgentPolicy(tiny_gpt2(tokenizer), tokenizer, ["agent"], lora=LoraSettings(rank=4), value_head=True)
    ids, mask = prompts(tokenizer)
    gen = policy.generate("agent", ids, mask, 2, max_new_tokens=8)
    policy.train()
    exp = make_experience(policy, "agent", gen, torch.ones(len(gen.response_ids)), 0.3, Config())
    assert torch.equal(exp.kl, torch.zeros_like(exp.kl))


def test_lora_dropout_follows_train_mode(tokenizer):
    lora = LoraSettings(rank=4, dropout=0.5)
    policy = MultiAgentPolicy(tiny_gpt2(tokenizer, dropout=0.0), tokenizer, ["agent"], lora=lora)
    dropouts = [m for m in policy.model.modules() if isinstance(m, torch.nn.Dropout) and m.p == 0.5]
    assert dropouts
    policy.train()
    assert all(m.training for m in dropouts)
    policy.eval()
    assert not any(m.training for m in dropouts)


def test_evaluate_restores_every_generator(monkeypatch, tiny_model_dir):
    """``torch.manual_seed`` reseeds every CUDA generator; evaluation must fork them all (faked: no GPU)."""
    from baselines.infra.evaluation import evaluate

    policy = MultiAgentPolicy.from_pretrained(["brief", "detailed"], tiny_model_dir, lora=LoraSettings(rank=4))
    states = {0: torch.tensor([1]), 1: torch.tensor([2])}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device=0: states[int(device)].clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device=0: states.__setitem__(int(device), state))
    reseed = lambda seed: states.update({d: torch.tensor([seed]) for d in states})  # noqa: E731
    monkeypatch.setattr(torch.cuda, "manual_seed_all", reseed)
    monkeypatch.setattr(torch.cuda, "manual_seed", lambda seed: states.__setitem__(0, torch.tensor([seed])))
    cpu = torch.get_rng_state()
    evaluate(policy, "writing/xsum-v0", num_problems=1, max_new_tokens=4, seed=1234,
             env_kwargs={"tokenizer": tiny_model_dir, "max_source_words": 20})
    assert torch.equal(torch.get_rng_state(), cpu)
    assert {d: int(s) for d, s in states.items()} == {0: 1, 1: 2}


def test_env_ends_responses_where_the_policy_stopped(tiny_model_dir):
    """The tiny model's generation config lists extra EOS ids (1000-2499) besides the tokenizer's."""
    policy = MultiAgentPolicy.from_pretrained(["brief", "detailed"], tiny_model_dir, lora=LoraSettings(rank=4))
    assert len(policy.eos_token_ids) > 1
    tok = policy.tokenizer
    env = llm_envs.make(
        "writing/xsum-v0", tokenizer=tiny_model_dir, max_new_tokens=24, max_source_words=20,
        stop_token_ids=policy.eos_token_ids,
    )
    obs, _ = env.reset(seed=0)
    ended_early = 0
    for seed in range(6):
        obs, _ = env.reset(seed=seed)
        torch.manual_seed(seed)
        actions = policy.act(obs, max_new_tokens=24)
        _, _, _, _, infos = env.step(actions)
        record = env.history[-1]
        for agent, action in actions.items():
            ids = action.tolist()
            stop = next((i for i, t in enumerate(ids) if t in policy.eos_token_ids), len(ids))
            ended_early += stop < len(ids) and ids[stop] not in (tok.eos_token_id, tok.pad_token_id)
            assert list(record.outputs[agent].ids) == ids[:stop]
            assert record.outputs[agent].text == tok.decode(ids[:stop], skip_special_tokens=True)
            assert infos[agent]["response_tokens"] == stop
    assert ended_early  # some responses ended at a model-only EOS id, which the env now honours


def test_bad_stop_token_ids():
    with pytest.raises(ValueError, match=r"stop_token_ids must hold token ids in \[0, 49151\], got -1"):
        llm_envs.make("writing/xsum-v0", stop_token_ids=[2, -1])
    with pytest.raises(ValueError, match="must be a sequence"):
        llm_envs.make("writing/xsum-v0", stop_token_ids="2")
    env = llm_envs.make("writing/xsum-v0", stop_token_ids=np.array([7, 8]))
    assert {7, 8} <= env.stop_token_ids
