"""A team of bases (docs/teams.md): agents on different base models with different tokenizers.

The team: a tiny Llama over SmolLM2's default tokenizer (49152 ids) and a tiny Qwen2 over a byte-level
BPE tokenizer trained here (300 ids; its model directory loads it as Qwen2's tokenizer, one id more),
both built from config in the test. The policy groups agents by base (agents/team.py); per-agent
sampling reaches the engine; checkpoints record each agent's base and tokenizer; every learner trains
such a team, CORY's two models swapping roles between the two tokenizers, MAAC's critic reading the
agent of the other tokenizer as text, and PPO's and CORY's --critic central too, each response token valued
at its aligned position in the critic's tokens.
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import tiny_models
import torch
from tiny_models import tiny_model

from agents import LoraSettings, MultiAgentPolicy, Sampling
from llm_envs.tokenizers import load_tokenizer

CORPUS = [
    "The council met on Tuesday to discuss the budget for the coming year.",
    "Summarize the article in one sentence. The cast was great and the plot was fun.",
    "Write a short, detailed summary with several sentences about the news.",
]


def byte_bpe(vocab_size: int = 300):
    return tiny_models.byte_bpe(vocab_size, CORPUS)


def tiny_qwen(tokenizer, seed: int = 1, hidden: int = 48, extra_rows: int = 20):
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    config = Qwen2Config(hidden_size=hidden, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=96, vocab_size=len(tokenizer) + extra_rows,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         max_position_embeddings=2048)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: the tiny models gain nothing from more, and on a machine shared with other
    jobs oversubscribed OpenMP threads spin (measured 20x slower passes on 2 busy cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def toks():
    return load_tokenizer(None), byte_bpe()


def save_model_dir(path, build, tokenizer) -> str:
    """A local model directory read back as any process reads it: the tokenizer and the model's config
    are written first, then the tokenizer is loaded from the directory and the weights are built for
    it. The order matters: ``AutoTokenizer`` picks the tokenizer's class from the config's model type
    (a Qwen2 config loads the BPE tokenizer as ``Qwen2Tokenizer``, which adds ``<|endoftext|>``: one id
    more), so a tokenizer loaded before the config exists differs from the one every later load gets."""
    tokenizer.save_pretrained(path)
    build(tokenizer).config.save_pretrained(path)
    # Loaded once the config is there, as every later load (in this process or another) loads it; the
    # process cache keeps it for the learners and envs of the tests.
    reloaded = load_tokenizer(str(path))
    model = build(reloaded)
    model.save_pretrained(path)
    # The embedding as large as the tokenizer the envs load (the envs refuse ids beyond it).
    assert model.config.vocab_size == len(reloaded), path
    return str(path)


@pytest.fixture(scope="module")
def model_dirs(toks, tmp_path_factory):
    """``llama`` (SmolLM2's tokenizer), ``qwen`` (the BPE tokenizer), ``qwen-smol`` (Qwen2 over SmolLM2's
    tokenizer, hidden 48: another width than the Llama's 32) as local model directories."""
    smol, bpe = toks
    root = tmp_path_factory.mktemp("team")
    return {
        "llama": save_model_dir(root / "llama", lambda t: tiny_model(t, 0, extra_eos=range(1000, 2500)), smol),
        "qwen": save_model_dir(root / "qwen", lambda t: tiny_qwen(t, extra_rows=0), bpe),
        "qwen-smol": save_model_dir(root / "qwen-smol", lambda t: tiny_qwen(t, seed=2, extra_rows=0), smol),
    }


def team(toks, **kwargs):
    smol, bpe = toks
    kwargs.setdefault("lora", LoraSettings(rank=4, alpha=8))
    policy = MultiAgentPolicy({"brief": tiny_model(smol, 0), "detailed": tiny_qwen(bpe)},
                              {"brief": smol, "detailed": bpe}, ["brief", "detailed"], **kwargs)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for agent in policy.agents:
            for param in policy.parameters(agent, value_head=False):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    return policy


def prompts(toks):
    smol, bpe = toks
    out = {}
    for agent, tok in (("brief", smol), ("detailed", bpe)):
        enc = tok(["The council met on Tuesday.", "Summarize the news"], padding=True, return_tensors="pt")
        out[agent] = (enc.input_ids, enc.attention_mask)
    return out


def test_a_team_groups_agents_by_base(toks):
    policy = team(toks)
    assert [g.agents for g in policy.groups] == [("brief",), ("detailed",)]
    assert policy.group("brief").backend == policy.group("detailed").backend == "engine"
    assert policy.group("detailed").vocab_size == 320 and policy.pad_token_id_of("detailed") == 0
    with pytest.raises(AttributeError, match="use policy.group"):
        _ = policy.model
    gens = policy.generate_joint(prompts(toks), 2, max_new_tokens=5, seeds=[1, 2])
    assert set(gens) == {"brief", "detailed"}
    assert int(gens["detailed"].response_ids.max()) < 300  # the head's 20 extra rows are masked
    again = policy.generate_joint(prompts(toks), 2, max_new_tokens=5, seeds=[1, 2])
    for agent in gens:  # seeds repeat
        assert torch.equal(gens[agent].response_ids, again[agent].response_ids)
        lp = policy.logprobs(agent, gens[agent].prompt_ids, gens[agent].prompt_mask, gens[agent].response_ids,
                             gens[agent].response_mask)
        assert torch.allclose(lp, gens[agent].logprobs, atol=1e-3)


def test_greedy_agent_beside_sampling_agent_in_one_decode(toks):
    smol = toks[0]
    model = tiny_model(smol, 0)
    policy = MultiAgentPolicy(model, smol, ["cold", "hot"], lora=LoraSettings(rank=4, alpha=8))
    enc = smol(["The council met on Tuesday."] * 3, return_tensors="pt")
    rows = (enc.input_ids, enc.attention_mask)
    calls = []
    real = policy.engine.generate

    def spy(*args, **kwargs):
        calls.append(kwargs.get("block_settings"))
        return real(*args, **kwargs)

    policy.engine.generate = spy
    settings = {"cold": Sampling(max_new_tokens=6, greedy=True), "hot": Sampling(max_new_tokens=3, temperature=5.0)}
    torch.manual_seed(0)
    gens = policy.generate_joint({"cold": rows, "hot": rows}, 2, sampling=settings)
    assert len(calls) == 1 and calls[0] is not None  # one decode loop, settings per block
    greedy = gens["cold"].response_ids
    assert all(torch.equal(greedy[0], row) for row in greedy)  # greedy: every sample the same
    assert gens["hot"].response_ids.shape[1] <= 3 and greedy.shape[1] <= 6
    sampled = {tuple(r.tolist()) for r in gens["hot"].response_ids}
    assert len(sampled) > 1  # hot sampling differs between samples
    alone = policy.generate("cold", *rows, 2, max_new_tokens=6, greedy=True)
    assert torch.equal(alone.response_ids, greedy)


def test_an_adapter_changes_only_its_own_rows(toks):
    policy = team(toks)
    p = prompts(toks)
    before = policy.generate_joint(p, 1, max_new_tokens=4, greedy=True)
    scores = {a: policy.logprobs(a, before[a].prompt_ids, before[a].prompt_mask, before[a].response_ids,
                                 before[a].response_mask).detach() for a in before}
    with torch.no_grad():
        for param in policy.parameters("brief", value_head=False):
            param.add_(0.5)
    after = {a: policy.logprobs(a, before[a].prompt_ids, before[a].prompt_mask, before[a].response_ids,
                                before[a].response_mask).detach() for a in before}
    assert not torch.allclose(after["brief"], scores["brief"])
    assert torch.equal(after["detailed"], scores["detailed"])


def test_full_fine_tuning_beside_lora(toks):
    smol = toks[0]
    model = tiny_model(smol, 0)
    policy = MultiAgentPolicy(model, smol, ["full", "adapted"], lora={"full": None, "adapted": LoraSettings(rank=2)})
    assert len(policy.groups) == 2 and policy.group("full").full and not policy.group("adapted").full
    full = policy.parameters("full")
    assert all(p.requires_grad for p in full)
    assert sum(p.numel() for p in full) > sum(p.numel() for p in policy.parameters("adapted"))
    assert {id(p) for p in full}.isdisjoint({id(p) for p in policy.parameters("adapted")})  # its own copy


def full_beside_lora(toks):
    smol = toks[0]
    policy = MultiAgentPolicy(tiny_model(smol, 0), smol, ["brief", "detailed"],
                              lora={"brief": None, "detailed": LoraSettings(rank=2)})
    gen = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for param in policy.parameters("detailed"):
            param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    return policy


@pytest.mark.parametrize("kind", ["two LoRA bases", "full beside LoRA"])
def test_each_agent_changes_only_through_its_own_optimizer(toks, kind):
    policy = team(toks) if kind == "two LoRA bases" else full_beside_lora(toks)
    optimizers = {a: policy.optimizer(a, lr=1e-2) for a in policy.agents}
    held = {a: [p for group in opt.param_groups for p in group["params"]] for a, opt in optimizers.items()}
    for agent in policy.agents:  # exactly its own trainable parameters
        assert [id(p) for p in held[agent]] == [id(p) for p in policy.parameters(agent)]
        assert len({id(p) for p in held[agent]}) == len(held[agent]) > 0
    assert {id(p) for p in held["brief"]}.isdisjoint({id(p) for p in held["detailed"]})
    trainable = {id(p) for g in policy.groups for m in (g.model, g.reference) if m is not None
                 for p in m.parameters() if p.requires_grad}
    assert trainable == {id(p) for a in policy.agents for p in held[a]}  # nothing trainable left out
    p = prompts(toks) if kind == "two LoRA bases" else {a: prompts(toks)["brief"] for a in policy.agents}
    gens = policy.generate_joint(p, 2, max_new_tokens=4, seeds=[1, 2])
    policy.train()
    for stepped, other in (("brief", "detailed"), ("detailed", "brief")):
        for opt in optimizers.values():
            opt.zero_grad()
        loss = sum(policy.logprobs(a, g.prompt_ids, g.prompt_mask, g.response_ids, g.response_mask).sum()
                   for a, g in gens.items())
        loss.backward()  # both agents get gradients
        assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in held[other][:1] + held[stepped][:1])
        before = {a: [p.detach().clone() for p in held[a]] for a in policy.agents}
        optimizers[stepped].step()
        assert any(not torch.equal(p, q) for p, q in zip(held[stepped], before[stepped])), stepped
        assert all(torch.equal(p, q) for p, q in zip(held[other], before[other])), other  # bit-identical
    policy.eval()


def test_checkpoint_round_trip_and_mismatch_named(toks, tmp_path):
    policy = team(toks, value_head=True)
    policy.save(tmp_path / "ckpt")
    manifest = json.loads((tmp_path / "ckpt" / "policy.json").read_text())
    assert manifest["team"]["detailed"]["tokenizer"]["size"] == 300
    assert manifest["team"]["brief"]["base"]["model_type"] == "llama"
    fresh = team(toks, value_head=True)
    with torch.no_grad():
        for p in fresh.parameters("detailed"):
            p.zero_()
    fresh.load(tmp_path / "ckpt")
    for agent in policy.agents:
        for a, b in zip(policy.parameters(agent), fresh.parameters(agent)):
            assert torch.equal(a, b)
    smol, bpe = toks
    swapped = MultiAgentPolicy({"brief": tiny_model(smol, 0), "detailed": tiny_qwen(byte_bpe(280))},
                               {"brief": smol, "detailed": byte_bpe(280)}, ["brief", "detailed"],
                               lora=LoraSettings(rank=4, alpha=8), value_head=True)
    with pytest.raises(ValueError, match="agent 'detailed' was trained with base model"):
        swapped.load(tmp_path / "ckpt")


def tiny_llama(tokenizer, seed: int = 3, extra_rows: int = 0):
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=64, vocab_size=len(tokenizer) + extra_rows,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    return AutoModelForCausalLM.from_config(config).eval()


def loud_extra_rows(model, token_count: int, scale: float = 100.0):
    """Head rows beyond the tokenizer set to +-``scale`` times random unit directions: whatever the
    hidden state, one of them has the largest logit by far, so an unmasked sampler picks them."""
    head = model.get_output_embeddings().weight
    extra = head.shape[0] - token_count
    gen = torch.Generator().manual_seed(11)
    directions = torch.nn.functional.normalize(torch.randn(extra // 2, head.shape[1], generator=gen), dim=-1)
    with torch.no_grad():
        head[token_count:] = scale * torch.cat([directions, -directions])
    return model


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("backend", ["engine", "generate"])
def test_ids_beyond_the_tokenizer_never_sampled_and_scored_alike(toks, arch, backend):
    from numerics import assert_f32_close

    bpe = toks[1]
    count = len(bpe)
    build = tiny_llama if arch == "llama" else tiny_qwen
    model = loud_extra_rows(build(bpe, extra_rows=20), count)
    enc = bpe(["The council met on Tuesday.", "Summarize the news"], padding=True, return_tensors="pt")
    with torch.no_grad():  # unmasked, the head's extra rows win: the test can fail
        assert bool((model(**enc).logits[:, -1].argmax(-1) >= count).all())
    policy = MultiAgentPolicy(model, bpe, ["cold", "hot"], lora=LoraSettings(rank=2, alpha=4), backend=backend)
    assert policy.group("cold").vocab_size == count + 20 and policy.group("cold").token_count == count
    rows = (enc.input_ids, enc.attention_mask)
    settings = {"cold": Sampling(max_new_tokens=5, greedy=True), "hot": Sampling(max_new_tokens=5, temperature=1.5)}
    for seeds in (None, [3, 4]):
        torch.manual_seed(0)
        gens = policy.generate_joint({"cold": rows, "hot": rows}, 3, sampling=settings, seeds=seeds)
        for agent, gen in gens.items():
            assert gen.response_ids.shape[1] > 0 and int(gen.response_ids.max()) < count, (agent, seeds)
            # The recorded log-probs are of the masked distribution, the one scoring recomputes.
            scored = policy.logprobs(agent, gen.prompt_ids, gen.prompt_mask, gen.response_ids,
                                     gen.response_mask).detach()
            assert_f32_close(gen.logprobs, scored)
    with pytest.raises(ValueError, match=f"below the tokenizer's size {count}"):
        policy.logprobs("cold", gen.prompt_ids, gen.prompt_mask, torch.full_like(gen.response_ids, count),
                        torch.ones_like(gen.response_mask))


def test_mismatched_tokenizer_and_model_refused(toks):
    smol, bpe = toks
    with pytest.raises(ValueError, match=r"agent 'detailed': the tokenizer has 49152 tokens but the model's "
                                         r"embedding has 320 rows"):
        MultiAgentPolicy({"brief": tiny_model(smol, 0), "detailed": tiny_qwen(bpe)},
                         {"brief": smol, "detailed": smol}, ["brief", "detailed"])
    with pytest.raises(ValueError, match="gives no value for agents"):
        MultiAgentPolicy({"brief": tiny_model(smol, 0)}, smol, ["brief", "detailed"])


# ----------------------------------------------------------------------------------------- learners
def snapshot(run_dir) -> dict[str, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    from baselines.infra.checkpoints import find_checkpoint

    policy_dir = find_checkpoint(run_dir) / "policy"
    return {p.name: load_file(str(p)) for p in sorted(policy_dir.glob("*.adapter.safetensors"))}


def learner_settings(tmp_path, name: str, **overrides):
    settings = dict(num_iterations=2, learning_rate=1e-2, lora_rank=4, lora_alpha=8.0, num_eval_problems=0,
                    output_dir=str(tmp_path), run_name=name, checkpoint_every=1, tensorboard=False, progress=False)
    settings.update(overrides)
    return settings


def assert_trained(result, run_dir, agents, steps=(1, 2)):
    from safetensors.torch import load_file

    for key, value in result.items():
        if isinstance(value, float):
            assert math.isfinite(value), key
    files = {s: {a: load_file(str(run_dir / "checkpoints" / f"step_{s:06d}" / "policy" / f"{a}.adapter.safetensors"))
                 for a in agents} for s in steps}
    for agent in agents:  # every agent's weights moved between the two checkpoints
        a, b = files[steps[0]][agent], files[steps[1]][agent]
        assert any(not torch.equal(a[k], b[k]) for k in a), agent


def test_magrpo_team_of_two_tokenizers_with_per_agent_settings(model_dirs, tmp_path, varied_writing_reward,
                                                                monkeypatch):
    from baselines.infra import play
    from baselines.learners import magrpo

    evaluations = []
    real_play = play.play_episodes

    def spy(*args, **kwargs):  # the evaluations' episodes (training rolls out through play.rollout)
        steps, returns, infos = real_play(*args, **kwargs)
        evaluations.append((kwargs, steps))
        return steps, returns, infos

    monkeypatch.setattr(play, "play_episodes", spy)
    config = magrpo.Config(**learner_settings(
        tmp_path, "magrpo", model=model_dirs["llama"], agent_models=(f"detailed={model_dirs['qwen']}",),
        agent_settings=("brief.temperature=0.5", "detailed.max_new_tokens=3", "detailed.learning_rate=5e-3",
                        "detailed.lora_rank=2"),
        max_source_words=20, num_problems=2, num_generations=2, max_new_tokens=12, temperature=1.0, top_p=1.0,
        top_k=0, baseline="none", num_eval_problems=2))
    result = magrpo.main(config)
    run_dir = tmp_path / "magrpo"
    # Evaluations (before and after training) use each agent's own settings, greedy as --eval-greedy says.
    assert len(evaluations) == 2
    for kwargs, steps in evaluations:
        assert kwargs["greedy"] and all(s.greedy for s in kwargs["sampling"].values())
        lengths = {a: max(int(step[a].response_lengths.max()) for step in steps) for a in ("brief", "detailed")}
        assert lengths["detailed"] <= 3 < lengths["brief"], lengths
    assert_trained(result, run_dir, ["brief", "detailed"])
    trainer = torch.load(run_dir / "checkpoints" / "step_000002" / "optimizers.pt", weights_only=False)
    assert trainer["detailed"]["param_groups"][0]["lr"] == 5e-3 and trainer["brief"]["param_groups"][0]["lr"] == 1e-2
    manifest = json.loads((run_dir / "checkpoints" / "step_000002" / "policy" / "policy.json").read_text())
    detailed = manifest["team"]["detailed"]
    assert detailed["tokenizer"]["size"] == len(load_tokenizer(model_dirs["qwen"])) and detailed["lora"]["rank"] == 2
    assert result["agent_detailed/response_tokens"] <= 3
    # --resume continues the run; a resumed run with another model for an agent is refused, naming it.
    resumed = magrpo.main(dataclasses.replace(config, num_iterations=3, resume=True))
    assert resumed["charts/iteration"] == 3
    with pytest.raises(ValueError, match="agent_models|detailed"):
        magrpo.main(dataclasses.replace(config, num_iterations=4, resume=True, agent_models=()))


def test_ppo_team_of_two_tokenizers(model_dirs, tmp_path):
    from baselines.learners import ppo

    config = ppo.Config(**learner_settings(
        tmp_path, "ppo", model=model_dirs["llama"], env="writing/xsum-v0", max_source_words=20,
        agent_models=(f"detailed={model_dirs['qwen']}",), agent_settings=("brief.top_k=5",),
        batch_size=2, minibatch_size=2, num_ppo_epochs=1, min_new_tokens=3, max_new_tokens=6))
    result = ppo.main(config)
    assert_trained(result, tmp_path / "ppo", ["brief", "detailed"])


def test_role_envs_follow_the_players_tokenizers(toks):
    """One vector env per role assignment where the models' tokenizers differ, one in all where they
    agree; each role's spaces and stop ids are its player's."""
    from types import SimpleNamespace

    from baselines.infra.play import RoleEnvs

    smol, bpe = toks

    def policy(tokenizers):
        return SimpleNamespace(tokenizer_of=tokenizers.get, eos_token_ids_of=lambda m: (tokenizers[m].eos_token_id,))

    normal, swapped = {"pioneer": "model_0", "observer": "model_1"}, {"pioneer": "model_1", "observer": "model_0"}
    mixed = RoleEnvs("sentiment/imdb-cory-v0", 1, policy({"model_0": smol, "model_1": bpe}), {}, max_new_tokens=4)
    first, second = mixed.vector(normal), mixed.vector(swapped)
    assert first is not second and mixed.vector(normal) is first
    for venv, players in ((first, normal), (second, swapped)):
        for role, model in players.items():
            tok = {"model_0": smol, "model_1": bpe}[model]
            assert venv.tokenizer_of(role) is tok
            assert venv.observation_space(role)["observation"].high.max() == len(tok) - 1
            assert tok.eos_token_id in venv.envs[0].stop_token_ids_of(role)
    assert mixed.kwargs(swapped)["stop_token_ids"] == {"pioneer": [bpe.eos_token_id], "observer": [smol.eos_token_id]}
    shared = RoleEnvs("sentiment/imdb-cory-v0", 1, policy({"model_0": smol, "model_1": smol}), {}, max_new_tokens=4)
    assert shared.vector(normal) is shared.vector(swapped)
    mixed.close()
    shared.close()


def cory_of_two_tokenizers(model_dirs, tmp_path, name: str, **overrides):
    """CORY with ``model_0`` a Llama over SmolLM2's tokenizer and ``model_1`` a Qwen2 over the BPE one,
    swapping roles every iteration."""
    from baselines.learners import cory

    settings = dict(model=model_dirs["llama"], agent_models=(f"model_1={model_dirs['qwen']}",),
                    agent_settings=("model_1.temperature=0.7",), batch_size=2, minibatch_size=2, num_ppo_epochs=1,
                    min_new_tokens=3, max_new_tokens=6, swap_every=1)
    return cory.Config(**learner_settings(tmp_path, name, **{**settings, **overrides}))


def test_cory_swaps_roles_between_two_tokenizers(model_dirs, tmp_path, monkeypatch, capsys):
    """Each role's env speaks the tokenizer of the model playing it, in training and evaluation, across
    swaps; both models train; the samples and ``llm-envs eval --checkpoint`` work."""
    from baselines.infra import play
    from baselines.infra.cli import main as cli
    from baselines.infra.samples import read_samples
    from baselines.learners import cory

    sizes = {"model_0": len(load_tokenizer(model_dirs["llama"])), "model_1": len(load_tokenizer(model_dirs["qwen"]))}
    assert sizes["model_0"] != sizes["model_1"]
    calls = []
    real_play = play.play_episodes

    def spy(policy, venv, **kwargs):  # every batch played: training and evaluations
        steps, returns, infos = real_play(policy, venv, **kwargs)
        calls.append((dict(kwargs["adapters"]), venv, "greedy" in kwargs))
        for role, model in kwargs["adapters"].items():
            assert venv.observation_space(role)["observation"].high.max() + 1 == sizes[model], (role, model)
            assert venv.action_space(role).high.max() + 1 == sizes[model], (role, model)
            assert set(venv.envs[0].stop_token_ids_of(role)) >= set(policy.eos_token_ids_of(model))
            for gens in steps:
                if role in gens:  # the prompts the model read and the ids it wrote are its tokenizer's
                    assert int(gens[role].prompt_ids.max()) < sizes[model], (role, model)
                    assert int(gens[role].response_ids.max()) < sizes[model], (role, model)
        return steps, returns, infos

    monkeypatch.setattr(play, "play_episodes", spy)
    # The observer reads the pioneer's 6 tokens re-encoded by the other tokenizer (a byte-level BPE of few
    # merges: up to ~20 tokens a word); which words were drawn decides whether a prompt passes 128 tokens
    # (it did on a GPU, whose draws differ by rounding), so the prompts get room.
    env_kwargs = cory.Config.env_kwargs
    monkeypatch.setattr(cory.Config, "env_kwargs", lambda self: {**env_kwargs(self), "max_prompt_tokens": 256})
    config = cory_of_two_tokenizers(model_dirs, tmp_path, "cory-mixed", num_iterations=3, num_eval_problems=1,
                                    samples_every=1)
    result = cory.main(config)
    run_dir = tmp_path / "cory-mixed"
    assert_trained(result, run_dir, ["model_0", "model_1"], steps=(2, 3))
    normal, swapped = {"pioneer": "model_0", "observer": "model_1"}, {"pioneer": "model_1", "observer": "model_0"}
    # Eval before, iterations 1-3 (swapping every iteration), eval after (the roles of iteration 3).
    assert [(players, evaluation) for players, _, evaluation in calls] == [
        (normal, True), (normal, False), (swapped, False), (normal, False), (normal, True)]
    venvs = [venv for _, venv, evaluation in calls if not evaluation]
    assert venvs[0] is venvs[2] is not venvs[1]  # one vector env per assignment, kept across swaps
    for key in ("agent_model_0/role", "agent_model_1/role"):
        assert math.isfinite(result[key])
    assert (result["agent_model_0/role"], result["agent_model_1/role"]) == (0.0, 1.0)
    # Transcripts: which model played each role, the observer reading the pioneer's answer as text.
    train = [r for r in read_samples(run_dir) if r["kind"] == "train"]
    assert [r["models"] for r in train if r["episode"] == 0] == [normal, swapped, normal]
    for record in train:
        turn = record["turns"][0]
        assert turn["responses"]["pioneer"] in turn["prompts"]["observer"]
    # The checkpoint evaluates from the command line, each model in the role it played last.
    assert cli(["eval", "--checkpoint", str(run_dir), "--num-problems", "1"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert math.isfinite(evaluated["eval/total"])
    assert dict(calls[-1][0]) == normal and len(calls) == 6


def test_cory_of_two_tokenizers_repeats_and_resumes_across_a_swap(model_dirs, tmp_path, monkeypatch):
    """The same seed gives the same run, and Ctrl-C in the first swapped iteration then ``--resume`` ends
    exactly as the uninterrupted run (tests/test_interrupt.py)."""
    from test_interrupt import assert_same_run, patch_to_interrupt, run_state

    from baselines.infra.checkpoints import find_checkpoint
    from baselines.learners import cory

    def config(name: str):  # iteration 1 in the first roles, iteration 2 swapped; evaluations after both
        return cory_of_two_tokenizers(model_dirs, tmp_path, name, num_eval_problems=1, eval_every=1)

    straight = config("straight")
    cory.main(straight)
    expected = run_state(straight.run_dir())
    again = config("again")
    cory.main(again)
    assert_same_run(run_state(again.run_dir()), expected)

    interrupted = config("interrupted")
    with monkeypatch.context() as patch:  # right after iteration 2's first optimizer step (roles swapped)
        patch_to_interrupt(patch, cory, "ppo_update", "step", 1)
        with pytest.raises(KeyboardInterrupt):
            cory.main(interrupted)
    assert json.loads((find_checkpoint(interrupted.run_dir()) / "trainer.json").read_text())["step"] == 1
    cory.main(dataclasses.replace(interrupted, resume=True))
    assert_same_run(run_state(interrupted.run_dir()), expected)


def test_cory_and_maac_teams_share_a_tokenizer(model_dirs, tmp_path, varied_writing_reward, monkeypatch):
    """Two bases of one tokenizer: CORY and MAAC train them; MAAC's critic reads every agent's ids
    exactly as before teams of tokenizers (``critic_inputs`` of the turns' ids: the same inputs, the same
    values, bit for bit)."""
    from baselines.learners import cory, maac

    result = cory.main(cory.Config(**learner_settings(
        tmp_path, "cory", model=model_dirs["llama"], agent_models=(f"model_1={model_dirs['qwen-smol']}",),
        agent_settings=("model_1.temperature=0.7",), batch_size=2, minibatch_size=2, num_ppo_epochs=1,
        min_new_tokens=3, max_new_tokens=6)))
    assert_trained(result, tmp_path / "cory", ["model_0", "model_1"])
    seen = spy_maac_critic(monkeypatch, pin=True)
    result = maac.main(maac.Config(**learner_settings(
        tmp_path, "maac", model=model_dirs["llama"], agent_models=(f"detailed={model_dirs['qwen-smol']}",),
        max_source_words=20, num_problems=1, num_generations=2, max_new_tokens=8, num_epochs=1)))
    assert_trained(result, tmp_path / "maac", ["brief", "detailed", "critic"])
    assert "charts/critic_reencode_fraction" not in result  # nothing re-encoded
    assert len(seen) == 2
    for policy, turns, inputs, values, (old, old_values) in seen:  # each iteration: as the code before #52
        assert len(policy.groups) == 2 and len(inputs) == len(turns) == 1
        assert torch.equal(inputs[0][0], old[0]) and torch.equal(inputs[0][1], old[1])
        assert torch.equal(values[:, 0], old_values)


def spy_maac_critic(monkeypatch, pin: bool = False) -> list:
    """Record, per MAAC iteration, [policy, turns, the critic's inputs, its old values]; ``pin``: and the
    inputs and values of the code before teams of tokenizers (``critic_inputs`` of the turns' ids with the
    policy's one pad id, then the critic's values of them, at the same weights) for a team of one
    tokenizer."""
    from agents import MultiAgentPolicy
    from baselines.learners import maac
    from baselines.rl.critic import critic_inputs

    seen: list = []
    built: list = []
    real_build, real_rollout, real_values = MultiAgentPolicy.from_pretrained, maac.rollout, maac.old_critic_values

    def build(*args, **kwargs):
        built.append(real_build(*args, **kwargs))
        return built[-1]

    def rollout(*args, **kwargs):
        seen.append([built[-1], real_rollout(*args, **kwargs)])
        return seen[-1][1]

    def values(policy, inputs, budget):
        out = real_values(policy, inputs, budget)
        seen[-1] += [inputs, out]
        if pin:
            turn = seen[-1][1][0]
            responses = {a: (g.response_ids, g.response_mask) for a, g in turn.responses.items()}
            old = critic_inputs(turn.prompts, responses, list(turn.prompts), policy.pad_token_id)
            seen[-1].append((old, real_values(policy, [old], budget)[:, 0]))  # the same passes, as before
        return out

    monkeypatch.setattr(MultiAgentPolicy, "from_pretrained", build)
    monkeypatch.setattr(maac, "rollout", rollout)
    monkeypatch.setattr(maac, "old_critic_values", values)
    return seen


def maac_of_two_tokenizers(model_dirs, tmp_path, name: str, **overrides):
    """MAAC with ``brief`` a Llama over SmolLM2's tokenizer and ``detailed`` a Qwen2 over the BPE one; the
    critic on the Llama's base."""
    from baselines.learners import maac

    settings = dict(model=model_dirs["llama"], agent_models=(f"detailed={model_dirs['qwen']}",), max_source_words=20,
                    num_problems=2, num_generations=2, max_new_tokens=8, num_epochs=1, critic_learning_rate=1e-2)
    return maac.Config(**learner_settings(tmp_path, name, **{**settings, **overrides}))


def test_maac_of_two_tokenizers_from_the_command_line(model_dirs, tmp_path, varied_writing_reward, monkeypatch,
                                                     capsys):
    """``llm-envs train maac`` with a Llama and a Qwen2 of different tokenizers: the critic (on the
    Llama's base) reads the Qwen2's prompt and response as their text in SmolLM2's tokens, the Llama's
    as its ids; both actors and the critic train, metrics are finite; an interrupted and resumed run
    ends as the uninterrupted one; the checkpoint evaluates from the command line."""
    from test_interrupt import assert_same_run, patch_to_interrupt, run_state

    from baselines.infra.checkpoints import find_checkpoint
    from baselines.infra.cli import main as cli
    from baselines.learners import maac

    config = maac_of_two_tokenizers(model_dirs, tmp_path, "maac-mixed")
    flags = ["train", "maac", "--model", config.model, "--agent-models", *config.agent_models, "--max-source-words",
             "20", "--num-problems", "2", "--num-generations", "2", "--max-new-tokens", "8", "--num-epochs", "1",
             "--critic-learning-rate", "1e-2", "--num-iterations", "2", "--learning-rate", "1e-2", "--lora-rank", "4",
             "--lora-alpha", "8", "--num-eval-problems", "0", "--output-dir", str(tmp_path), "--run-name",
             "maac-mixed", "--checkpoint-every", "1", "--no-tensorboard", "--no-progress"]
    seen = spy_maac_critic(monkeypatch)
    assert cli(flags) == 0
    capsys.readouterr()
    run_dir = tmp_path / "maac-mixed"
    from baselines.infra.metrics import read_metrics

    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if "losses/value_loss" in r]
    assert len(rows) == 2
    for row in rows:
        assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
        assert 0 < row["charts/critic_reencode_fraction"] < 1
    assert_trained({}, run_dir, ["brief", "detailed", "critic"])
    smol, bpe = load_tokenizer(model_dirs["llama"]), load_tokenizer(model_dirs["qwen"])
    policy, turns, inputs, _ = seen[0]
    assert policy.tokenizer_of("critic") is policy.tokenizer_of("brief") is not policy.tokenizer_of("detailed")
    ids, mask = inputs[0]
    assert int(ids.max()) < len(smol)
    for row in range(len(ids)):
        kept = ids[row][mask[row].bool()].tolist()
        gens = turns[0].responses
        brief = gens["brief"].response_ids[row][gens["brief"].response_mask[row].bool()].tolist()
        text = bpe.decode(gens["detailed"].response_ids[row][gens["detailed"].response_mask[row].bool()].tolist(),
                          skip_special_tokens=True)
        prompt_ids, prompt_mask = turns[0].prompts["detailed"]
        prompt = bpe.decode(prompt_ids[row][prompt_mask[row].bool()].tolist(), skip_special_tokens=True)
        # Brief's tokens as they are; detailed's prompt then response, each its text in SmolLM2's tokens.
        detailed = smol(prompt, add_special_tokens=False).input_ids + smol(text, add_special_tokens=False).input_ids
        assert kept[-len(detailed):] == detailed
        assert contains(kept, brief)

    # Ctrl-C between the actors' steps of iteration 2, then --resume: the run ends as the uninterrupted one.
    interrupted = maac_of_two_tokenizers(model_dirs, tmp_path, "interrupted")
    with monkeypatch.context() as patch:
        patch_to_interrupt(patch, maac, "update_agent", "step", 2)
        with pytest.raises(KeyboardInterrupt):
            maac.main(interrupted)
    assert json.loads((find_checkpoint(interrupted.run_dir()) / "trainer.json").read_text())["step"] == 1
    maac.main(dataclasses.replace(interrupted, resume=True))
    assert_same_run(run_state(interrupted.run_dir()), run_state(run_dir))
    # Resuming with the critic on another base is refused, naming the critic.
    with pytest.raises(ValueError, match="critic"):
        maac.main(dataclasses.replace(interrupted, num_iterations=3, resume=True, critic_model=model_dirs["qwen"]))
    # The checkpoint evaluates from the command line (the critic rebuilt on its base).
    capsys.readouterr()
    assert cli(["eval", "--checkpoint", str(run_dir), "--num-problems", "1"]) == 0
    assert math.isfinite(json.loads(capsys.readouterr().out)["eval/total"])


def test_critic_reader_encodes_foreign_agents_and_names_text_it_cannot_encode(toks):
    """A critic whose tokenizer is neither agent's reads both as text; a tokenizer without byte fallback
    (a BPE over the corpus' characters, with an unknown token) refuses a character it has never seen,
    naming the agent, the characters and the fix."""
    from types import SimpleNamespace

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from baselines.rl.critic import CriticReader, check_context

    smol, bpe = toks
    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=200, special_tokens=["<pad>", "<eos>", "<unk>"]))
    closed = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")
    tokenizers = {"brief": smol, "detailed": bpe, "critic": closed}
    policy = SimpleNamespace(tokenizer_of=tokenizers.get, pad_token_id_of=lambda agent: tokenizers[agent].pad_token_id)
    read = CriticReader(policy, ["brief", "detailed"])
    assert sorted(read.foreign) == ["brief", "detailed"]

    def encoded(texts: dict[str, list[str]]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        out = {}
        for agent, rows in texts.items():
            enc = tokenizers[agent](rows, padding=True, return_tensors="pt")
            out[agent] = (enc.input_ids, enc.attention_mask)
        return out

    prompts = encoded({"brief": ["The council met", "Summarize the article"],
                       "detailed": ["Write a short summary"] * 2})
    responses = encoded({"brief": ["the budget", "The cast was great"], "detailed": ["several sentences", ""]})
    ids, mask = read(prompts, responses)
    words = [["The council met", "the budget", "Write a short summary", "several sentences"],
             ["Summarize the article", "The cast was great", "Write a short summary", ""]]
    for row, parts in enumerate(words):  # each piece's text in the critic's tokens, agents in env order
        expected = [i for part in parts for i in closed(part, add_special_tokens=False).input_ids]
        assert ids[row][mask[row].bool()].tolist() == expected
    assert read.seconds > 0
    responses = encoded({"brief": ["the budget", "café au lait"], "detailed": ["several sentences", ""]})
    with pytest.raises(ValueError, match=r"cannot encode agent 'brief'.*\['é'\].*--critic-model"):
        read(prompts, responses)
    # A joint turn longer than the critic's model has positions (the probe takes one more) is refused.
    config = SimpleNamespace(max_position_embeddings=len(ids[0]) + 1, _name_or_path="tiny")
    critic = SimpleNamespace(group=lambda agent: SimpleNamespace(causal_lm=SimpleNamespace(config=config)))
    check_context(critic, [(ids, mask)])
    config.max_position_embeddings -= 1
    with pytest.raises(ValueError, match=rf"up to {len(ids[0])} tokens .* \(tiny\) has {len(ids[0])} positions"):
        check_context(critic, [(ids, mask)])


def generation(tok, prompts: list[str], responses: list[str], eos: bool = True):
    """An ``agents.Generation``-like batch: prompts left-padded, responses right-padded (each ending in
    the tokenizer's EOS when ``eos``), in ``tok``'s ids."""
    from types import SimpleNamespace

    from agents.rows import right_padded

    prompt = tok(prompts, padding=True, return_tensors="pt")
    rows = [tok(r, add_special_tokens=False).input_ids + ([tok.eos_token_id] if eos else []) for r in responses]
    response_ids, response_mask = right_padded(rows, tok.pad_token_id)
    return SimpleNamespace(prompt_ids=prompt.input_ids, prompt_mask=prompt.attention_mask, response_ids=response_ids,
                           response_mask=response_mask)


def test_central_view_aligns_each_foreign_token_with_the_critics_state_of_the_same_text(toks, monkeypatch):
    """PPO's and CORY's ``--critic central`` over two tokenizers: the critic (SmolLM2's tokenizer) reads the
    BPE role's response as text in its own tokens, and each BPE token takes the critic's value of the
    longest prefix of the text that the state before it holds, hand-checked on two rows; the other
    role's prompt and response and the scored role's prompt are text in the critic's tokens too."""
    from types import SimpleNamespace

    from baselines.rl import critic
    from baselines.rl.critic import CentralView, CriticReader, central_context, central_view, token_starts

    smol, bpe = toks
    tokenizers = {"pioneer": smol, "observer": bpe, "critic": smol}
    policy = SimpleNamespace(tokenizer_of=tokenizers.get, pad_token_id_of=lambda a: tokenizers[a].pad_token_id)
    read = CriticReader(policy, ["pioneer", "observer"])
    assert list(read.foreign) == ["observer"]
    words = ["The council met", "café"]
    gens = {"pioneer": generation(smol, ["Review:", "Review: good"], ["A fine film", "Bad"]),
            "observer": generation(bpe, ["Improve it", "Improve it"], words)}
    # The premise: how each tokenizer cuts the two texts.
    assert [bpe.convert_ids_to_tokens(bpe(w, add_special_tokens=False).input_ids) for w in words] == [
        ["The", "Ġc", "ou", "n", "cil", "Ġ", "m", "et"], ["c", "a", "f", "Ã", "©"]]
    assert [smol.convert_ids_to_tokens(smol(w, add_special_tokens=False).input_ids) for w in words] == [
        ["The", "Ġcouncil", "Ġmet"], ["c", "af", "Ã©"]]
    # Where tokens start: "é" is two bytes, two BPE tokens; the prefix that ends between them decodes to
    # "caf" and a replacement character, so the second starts where the first does.
    rows = [bpe(w, add_special_tokens=False).input_ids for w in words]
    starts = [[0, 3, 5, 7, 8, 11, 12, 13, 15], [0, 1, 2, 3, 3, 4]]
    assert token_starts(bpe, rows, words) == starts  # streamed through the fast tokenizer's decoder
    with monkeypatch.context() as patch:  # a slow tokenizer's way: every prefix decoded
        patch.setattr(critic, "streamed_starts", lambda *args: None)
        assert token_starts(bpe, rows, words) == starts
    view = central_view(gens, ["pioneer", "observer"], "observer", {"pioneer": "pioneer", "observer": "observer"},
                        read)
    # Each BPE token (then its EOS) -> the critic's position: 0 "The", 1 " council", 2 " met", 3 the probe
    # after the whole text.
    assert view.positions is not None and view.response is not None
    mask = gens["observer"].response_mask.bool()
    assert view.positions[0][mask[0]].tolist() == [0, 1, 1, 1, 1, 2, 2, 2, 3]
    assert view.positions[1][mask[1]].tolist() == [0, 1, 1, 2, 2, 3]
    response_ids, response_mask = view.response
    for row, word in enumerate(words):  # the text in the critic's tokens, then the probe, right-padded
        expected = smol(word, add_special_tokens=False).input_ids + [smol.pad_token_id]
        assert response_ids[row][: len(expected)].tolist() == expected
        assert response_mask[row].tolist() == [1] * len(expected) + [0] * (response_mask.shape[1] - len(expected))
    # The context: the pioneer's prompt and response as its ids, then the observer's prompt as text in the
    # critic's tokens.
    for row in range(2):
        kept = view.ids[row][view.mask[row].bool()].tolist()
        pioneer = gens["pioneer"]
        own = [*pioneer.prompt_ids[row][pioneer.prompt_mask[row].bool()].tolist(),
               *pioneer.response_ids[row][pioneer.response_mask[row].bool()].tolist()]
        assert kept == own + smol("Improve it", add_special_tokens=False).input_ids
    assert read.seconds > 0
    # A character the critic's vocabulary has no token for (SmolLM2 drops the control byte 0x14): the
    # critic reads "The council", and every token before the end takes a state of the text before it, not
    # the probe's (which holds the whole response): The|Ĕ|Ġc|ou|n|cil|<eos> -> The|Ġcouncil|probe.
    hostile = generation(bpe, ["Improve it"], ["The\x14 council"])
    assert bpe.convert_ids_to_tokens(hostile.response_ids[0, :-1].tolist()) == ["The", "Ĕ", "Ġc", "ou", "n", "cil"]
    assert smol.convert_ids_to_tokens(smol("The\x14 council", add_special_tokens=False).input_ids) == ["The",
                                                                                                      "Ġcouncil"]
    _, hostile_positions = read.align("observer", hostile.response_ids, hostile.response_mask)
    assert hostile_positions[0].tolist() == [0, 1, 1, 1, 1, 1, 2]
    # The other way round: a critic of the BPE splits "é" over two tokens (Ã, ©); SmolLM2's token Ã© takes
    # the state before Ã ("caf"), not the one before © (which has read the first byte of é):
    # c|af|Ã©|<eos> -> c|a|f|Ã|©|probe at 0 1 3 5.
    bpe_critic = CriticReader(SimpleNamespace(tokenizer_of={"pioneer": smol, "critic": bpe}.get,
                                              pad_token_id_of=lambda a: bpe.pad_token_id), ["pioneer"])
    smol_cafe = generation(smol, ["Improve it"], ["café"])
    assert smol.convert_ids_to_tokens(smol_cafe.response_ids[0, :-1].tolist()) == ["c", "af", "Ã©"]
    _, cafe_positions = bpe_critic.align("pioneer", smol_cafe.response_ids, smol_cafe.response_mask)
    assert cafe_positions[0].tolist() == [0, 1, 3, 5]
    # Scoring the pioneer: the observer's prompt and response are read as text; the pioneer's response as
    # its own ids (no alignment).
    players = {"pioneer": "pioneer", "observer": "observer"}
    pioneer_view = central_view(gens, ["pioneer", "observer"], "pioneer", players, read)
    assert pioneer_view.response is None and pioneer_view.positions is None
    kept = pioneer_view.ids[0][pioneer_view.mask[0].bool()].tolist()
    pioneer = gens["pioneer"]
    assert kept == [*smol("Improve it", add_special_tokens=False).input_ids,
                    *smol("The council met", add_special_tokens=False).input_ids,
                    *pioneer.prompt_ids[0][pioneer.prompt_mask[0].bool()].tolist()]
    # One tokenizer (the players swapped onto SmolLM2's tokenizer alone): exactly central_context's ids.
    same = {"pioneer": generation(smol, ["a", "b c"], ["d", "e f"]),
            "observer": generation(smol, ["g", "h"], ["i", "j"])}
    one = CriticReader(SimpleNamespace(tokenizer_of=lambda a: smol, pad_token_id_of=lambda a: smol.pad_token_id),
                       ["pioneer", "observer"])
    plain = central_view(same, ["pioneer", "observer"], "observer", {"pioneer": "pioneer", "observer": "observer"}, one)
    ids, mask = central_context(same, ["pioneer", "observer"], "observer", smol.pad_token_id)
    assert plain == CentralView(plain.ids, plain.mask) and torch.equal(plain.ids, ids) and torch.equal(plain.mask, mask)


def test_central_values_through_an_identity_alignment_equal_the_direct_values(toks):
    """A role forced through the text path with the critic's own tokenizer: re-encoding gives back its ids,
    every token aligns with itself, and the critic's values (gathered from the re-encoded response and
    its probe) equal the values read directly from the response's ids. The passes differ by one column
    (the probe) and right-padding, which a causal model's earlier positions do not see: equal up to the
    float32 rounding of kernels blocked over another length."""
    from baselines.infra.config import CRITIC
    from baselines.rl.critic import CentralView, CriticReader, central_values

    smol, _ = toks
    policy = MultiAgentPolicy({"actor": tiny_model(smol, 0), CRITIC: tiny_model(smol, 0)}, smol, ["actor", CRITIC],
                              lora=LoraSettings(rank=4, alpha=8), value_head=True)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for param in policy.parameters(CRITIC):
            param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    read = CriticReader(policy, ["actor"])
    read.foreign = {"actor": smol}  # the text path, with the critic's own tokenizer
    batch = generation(smol, ["The council met on Tuesday.", "Summarize"], ["the budget for the year", "fun"])
    response, positions = read.align("actor", batch.response_ids, batch.response_mask)
    for row in range(2):
        kept = batch.response_mask[row].bool()
        assert positions[row][kept].tolist() == list(range(int(kept.sum())))
    context = CentralView(batch.prompt_ids, batch.prompt_mask)
    direct = central_values(policy, context, batch.response_ids, batch.response_mask)
    aligned = central_values(policy, CentralView(batch.prompt_ids, batch.prompt_mask, response, positions),
                             batch.response_ids, batch.response_mask)
    torch.testing.assert_close(aligned, direct, rtol=1e-5, atol=1e-6)
    assert bool((aligned[~batch.response_mask.bool()] == 0).all())
    aligned.sum().backward()  # differentiable: the critic's adapter and value head get gradients
    assert all(p.grad is not None for p in policy.parameters(CRITIC))


def test_ppo_and_cory_central_critics_over_two_tokenizers(model_dirs, tmp_path, monkeypatch, capsys):
    """``--critic central`` with a team of two tokenizers: PPO's two agents and CORY's two models swapping
    roles across the tokenizers train with the critic on the Llama's base; metrics are finite and the
    time spent re-encoding is logged."""
    from baselines.infra.cli import main as cli
    from baselines.infra.metrics import read_metrics
    from baselines.learners import cory, ppo

    result = ppo.main(ppo.Config(**learner_settings(
        tmp_path, "ppo-central", model=model_dirs["llama"], env="writing/xsum-v0", critic="central",
        max_source_words=20, agent_models=(f"detailed={model_dirs['qwen']}",), batch_size=2, minibatch_size=2,
        num_ppo_epochs=1, min_new_tokens=3, max_new_tokens=6)))
    assert_trained(result, tmp_path / "ppo-central", ["brief", "detailed", "critic"])
    # --critic-model: the critic on the Qwen2's base (the BPE tokenizer), reading the Llama as text; the
    # checkpoint evaluates from the command line (the critic rebuilt on the base the run recorded).
    on_qwen = ppo.Config(**learner_settings(
        tmp_path, "ppo-central-qwen", model=model_dirs["llama"], env="writing/xsum-v0", critic="central",
        critic_model=model_dirs["qwen"], max_source_words=20, agent_models=(f"detailed={model_dirs['qwen']}",),
        batch_size=2, minibatch_size=2, num_ppo_epochs=1, min_new_tokens=3, max_new_tokens=6))
    result = ppo.main(on_qwen)
    assert_trained(result, tmp_path / "ppo-central-qwen", ["brief", "detailed", "critic"])
    manifest = json.loads((tmp_path / "ppo-central-qwen" / "checkpoints" / "step_000002" / "policy"
                           / "policy.json").read_text())
    assert manifest["team"]["critic"]["tokenizer"]["size"] == len(load_tokenizer(model_dirs["qwen"]))
    capsys.readouterr()
    assert cli(["eval", "--checkpoint", str(tmp_path / "ppo-central-qwen"), "--num-problems", "1"]) == 0
    assert math.isfinite(json.loads(capsys.readouterr().out)["eval/total"])
    with pytest.raises(ValueError, match="critic_model=.* --critic central"):
        ppo.Config(critic_model=model_dirs["qwen"])
    env_kwargs = cory.Config.env_kwargs  # room for the pioneer's text in the BPE's tokens (as above)
    monkeypatch.setattr(cory.Config, "env_kwargs", lambda self: {**env_kwargs(self), "max_prompt_tokens": 256})
    result = cory.main(cory_of_two_tokenizers(model_dirs, tmp_path, "cory-central", critic="central", num_iterations=3))
    assert_trained(result, tmp_path / "cory-central", ["model_0", "model_1", "critic"], steps=(2, 3))
    for name in ("ppo-central", "cory-central"):
        rows = [r for r in read_metrics(tmp_path / name / "metrics.jsonl") if "charts/iteration" in r]
        assert rows
        for row in rows:
            assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
            assert 0 < row["charts/critic_reencode_fraction"] < 1


def test_marlhf_reward_model_reads_a_team_of_two_tokenizers(model_dirs, tmp_path, toks, varied_writing_reward):
    """MARLHF's reward model (on the Llama's base) reads the Qwen2 agent's prompts and responses as their
    text in SmolLM2's tokens: its preference pairs (``read_pairs``) and the candidates it scores. Offline
    with MAGRPO, iterative with MAGRPO, and offline with PPO's RL stage all train the team."""
    from types import SimpleNamespace

    from baselines.learners import marlhf
    from baselines.rl.critic import CriticReader
    from baselines.rl.preference import Pair
    from baselines.rl.reward_model import REWARD_MODEL, read_pairs

    smol, bpe = toks
    tokenizers = {"brief": smol, "detailed": bpe, REWARD_MODEL: smol}
    read = CriticReader(SimpleNamespace(tokenizer_of=tokenizers.get, pad_token_id_of=lambda a: 0),
                        ["brief", "detailed"], critic=REWARD_MODEL)

    def ids(tok, text: str, eos: bool = False) -> torch.Tensor:
        return torch.tensor(tok(text, add_special_tokens=False).input_ids + ([tok.eos_token_id] if eos else []))

    pair = Pair({"brief": ids(smol, "Summarize:"), "detailed": ids(bpe, "Write a summary")},
                {"brief": ids(smol, "The council met"), "detailed": ids(bpe, "The budget was set", eos=True)},
                {"brief": ids(smol, "Nothing"), "detailed": ids(bpe, "café", eos=True)}, 3, 0.5)
    (read_pair,) = read_pairs(read, [pair])
    for side, texts in (("prompts", ("Summarize:", "Write a summary")),
                        ("winners", ("The council met", "The budget was set")), ("losers", ("Nothing", "café"))):
        got = getattr(read_pair, side)
        assert torch.equal(got["brief"], getattr(pair, side)["brief"])  # the reward model's tokenizer: unchanged
        assert got["detailed"].tolist() == smol(texts[1], add_special_tokens=False).input_ids  # text, EOS dropped
    assert (read_pair.iteration, read_pair.gap) == (3, 0.5)
    same = CriticReader(SimpleNamespace(tokenizer_of=lambda a: smol, pad_token_id_of=lambda a: 0),
                        ["brief", "detailed"], critic=REWARD_MODEL)
    assert read_pairs(same, [pair])[0] is pair  # one tokenizer: the pairs themselves

    settings = dict(model=model_dirs["llama"], agent_models=(f"detailed={model_dirs['qwen']}",), max_source_words=20,
                    num_problems=2, num_candidates=3, num_prompts=3, max_new_tokens=8, temperature=1.0, top_p=1.0,
                    top_k=0, num_eval_problems=0)
    for name, extra in (("offline", {}), ("iterative", {"iterative": True, "comparator": "history"})):
        config = marlhf.Config(**learner_settings(tmp_path, f"marlhf-{name}", **settings, **extra))
        result = marlhf.main(config)
        # Offline, the reward model is fitted before the first iteration; iterative, at every iteration.
        assert_trained(result, config.run_dir(), ["brief", "detailed", *([REWARD_MODEL] if extra else [])])
        assert math.isfinite(result["pref/learned_reward"]) and math.isfinite(result["losses/reward_model"])
    config = marlhf.Config(**learner_settings(tmp_path, "marlhf-ppo", **settings, rl_learner="ppo",
                                              rl_args=("batch_size=2", "minibatch_size=2", "num_ppo_epochs=1")))
    result = marlhf.main(config)
    assert_trained(result, config.run_dir() / "rl", ["brief", "detailed"])
    assert 0 <= result["pref/rm_heldout_accuracy"] <= 1


def test_madpo_comparator_model_of_another_tokenizer(model_dirs, tmp_path, toks, monkeypatch, varied_writing_reward):
    """MADPO's ``--comparator model`` with a comparator of another tokenizer than the team's: it plays
    through envs of its own tokenizer, and its responses join the pairs as their text in the agents'
    tokens, ending with the agent's EOS where its own ended with its EOS (hand-checked on two responses,
    then a run that trains)."""
    from types import SimpleNamespace

    from baselines.learners import madpo
    from baselines.rl.preference import PromptCandidates
    from baselines.rl.preference_team import Team

    smol, bpe = toks
    fake = SimpleNamespace(comparator_foreign={"brief": (bpe, smol, {bpe.eos_token_id}, smol.eos_token_id)})
    ended = bpe("The council met", add_special_tokens=False).input_ids + [bpe.eos_token_id]
    cut = bpe("café au", add_special_tokens=False).input_ids  # stopped by the length budget: no EOS
    other = [1, 2, 3]
    pc = PromptCandidates({"brief": torch.tensor([7]), "detailed": torch.tensor([8])},
                          {"brief": [torch.tensor(ended), torch.tensor(cut)], "detailed": [torch.tensor(other)] * 2},
                          np.array([1.0, 0.0]))
    (got,) = Team.in_agents_tokens(fake, [pc])
    assert got.responses["brief"][0].tolist() == smol("The council met", add_special_tokens=False).input_ids + [
        smol.eos_token_id]
    assert got.responses["brief"][1].tolist() == smol("café au", add_special_tokens=False).input_ids
    assert got.responses["detailed"][0].tolist() == other and got.prompts is pc.prompts  # the comparator's tokenizer

    seen = []
    real = Team.in_agents_tokens

    def spy(self, prompts):
        out = real(self, prompts)
        seen.append((prompts, out))
        return out

    monkeypatch.setattr(Team, "in_agents_tokens", spy)
    config = madpo.Config(**learner_settings(
        tmp_path, "madpo-comparator", model=model_dirs["llama"], comparator_model=model_dirs["qwen"], iterative=True,
        comparator="model", max_source_words=20, num_problems=2, num_candidates=3, max_new_tokens=8, temperature=1.0,
        top_p=1.0, top_k=0, num_eval_problems=0))
    result = madpo.main(config)
    assert_trained(result, config.run_dir(), ["brief", "detailed"])
    assert 0 <= result["pref/win_rate"] <= 1
    assert len(seen) == 2
    qwen_tok = load_tokenizer(model_dirs["qwen"])
    eos = set(load_tokenizer(model_dirs["qwen"]).convert_tokens_to_ids([qwen_tok.eos_token]))
    for before, after in seen:  # every comparator response: its text in SmolLM2's tokens (random weights write
        for b, a in zip(before, after):  # control bytes SmolLM2's vocabulary has no token for: dropped)
            for agent in ("brief", "detailed"):
                for old, new in zip(b.responses[agent], a.responses[agent]):
                    text = qwen_tok.decode(old.tolist(), skip_special_tokens=True, clean_up_tokenization_spaces=False)
                    expected = smol(text, add_special_tokens=False).input_ids
                    expected += [smol.eos_token_id] if old.tolist()[-1:] and old.tolist()[-1] in eos else []
                    assert new.tolist() == expected


def contains(row: list[int], part: list[int]) -> bool:
    return any(row[i : i + len(part)] == part for i in range(len(row) - len(part) + 1))


def test_agent_settings_errors_list_the_valid_names():
    from baselines.learners import magrpo

    with pytest.raises(ValueError, match="unknown field 'temp' .*valid fields: temperature, top_p"):
        magrpo.Config(agent_settings=("brief.temp=1",))
    with pytest.raises(ValueError, match=r"brief.top_p must be in \(0, 1\]"):
        magrpo.Config(agent_settings=("brief.top_p=2",))
    with pytest.raises(ValueError, match="agent_models entries are agent=MODEL"):
        magrpo.Config(agent_models=("brief",))
    with pytest.raises(ValueError, match="unknown agents \\['breif'\\]; valid agents: brief, detailed"):
        magrpo.Config(agent_settings=("breif.temperature=1",)).check_agents(["brief", "detailed"])
