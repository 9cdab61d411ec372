"""A team of bases (docs/teams.md): agents on different base models with different tokenizers.

The team (tests/team_kit.py): a tiny Llama over SmolLM2's default tokenizer and a tiny Qwen2 over a
byte-level BPE tokenizer. The policy groups agents by base (agents/team.py); per-agent sampling reaches
the engine; checkpoints record each agent's base and tokenizer; every learner trains such a team, CORY's
two models swapping roles between the two tokenizers, MAAC's critic reading the agent of the other
tokenizer as text. What reads one agent in another's tokens (critics, reward models, comparators):
tests/test_team_critics.py.
"""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from team_kit import (
    assert_trained,
    byte_bpe,
    contains,
    cory_of_two_tokenizers,
    learner_settings,
    tiny_qwen,
)
from tiny_models import tiny_model

from agents import LoraSettings, MultiAgentPolicy, Sampling
from llm_envs.tokenizers import load_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def team(team_toks, **kwargs):
    smol, bpe = team_toks
    kwargs.setdefault("lora", LoraSettings(rank=4, alpha=8))
    policy = MultiAgentPolicy({"brief": tiny_model(smol, 0), "detailed": tiny_qwen(bpe)},
                              {"brief": smol, "detailed": bpe}, ["brief", "detailed"], **kwargs)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for agent in policy.agents:
            for param in policy.parameters(agent, value_head=False):
                param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    return policy


def prompts(team_toks):
    smol, bpe = team_toks
    out = {}
    for agent, tok in (("brief", smol), ("detailed", bpe)):
        enc = tok(["The council met on Tuesday.", "Summarize the news"], padding=True, return_tensors="pt")
        out[agent] = (enc.input_ids, enc.attention_mask)
    return out


def test_a_team_groups_agents_by_base(team_toks):
    policy = team(team_toks)
    assert [g.agents for g in policy.groups] == [("brief",), ("detailed",)]
    assert policy.group("brief").backend == policy.group("detailed").backend == "engine"
    assert policy.group("detailed").vocab_size == 320 and policy.pad_token_id_of("detailed") == 0
    with pytest.raises(AttributeError, match="use policy.group"):
        _ = policy.model
    gens = policy.generate_joint(prompts(team_toks), 2, max_new_tokens=5, seeds=[1, 2])
    assert set(gens) == {"brief", "detailed"}
    assert int(gens["detailed"].response_ids.max()) < 300  # the head's 20 extra rows are masked
    again = policy.generate_joint(prompts(team_toks), 2, max_new_tokens=5, seeds=[1, 2])
    for agent in gens:  # seeds repeat
        assert torch.equal(gens[agent].response_ids, again[agent].response_ids)
        lp = policy.logprobs(agent, gens[agent].prompt_ids, gens[agent].prompt_mask, gens[agent].response_ids,
                             gens[agent].response_mask)
        assert torch.allclose(lp, gens[agent].logprobs, atol=1e-3)


def test_greedy_agent_beside_sampling_agent_in_one_decode(team_toks):
    smol = team_toks[0]
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


def test_an_adapter_changes_only_its_own_rows(team_toks):
    policy = team(team_toks)
    p = prompts(team_toks)
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


def test_full_fine_tuning_beside_lora(team_toks):
    smol = team_toks[0]
    model = tiny_model(smol, 0)
    policy = MultiAgentPolicy(model, smol, ["full", "adapted"], lora={"full": None, "adapted": LoraSettings(rank=2)})
    assert len(policy.groups) == 2 and policy.group("full").full and not policy.group("adapted").full
    full = policy.parameters("full")
    assert all(p.requires_grad for p in full)
    assert sum(p.numel() for p in full) > sum(p.numel() for p in policy.parameters("adapted"))
    assert {id(p) for p in full}.isdisjoint({id(p) for p in policy.parameters("adapted")})  # its own copy


def full_beside_lora(team_toks):
    smol = team_toks[0]
    policy = MultiAgentPolicy(tiny_model(smol, 0), smol, ["brief", "detailed"],
                              lora={"brief": None, "detailed": LoraSettings(rank=2)})
    gen = torch.Generator().manual_seed(6)
    with torch.no_grad():
        for param in policy.parameters("detailed"):
            param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    return policy


@pytest.mark.parametrize("kind", ["two LoRA bases", "full beside LoRA"])
def test_each_agent_changes_only_through_its_own_optimizer(team_toks, kind):
    policy = team(team_toks) if kind == "two LoRA bases" else full_beside_lora(team_toks)
    optimizers = {a: policy.optimizer(a, lr=1e-2) for a in policy.agents}
    held = {a: [p for group in opt.param_groups for p in group["params"]] for a, opt in optimizers.items()}
    for agent in policy.agents:  # exactly its own trainable parameters
        assert [id(p) for p in held[agent]] == [id(p) for p in policy.parameters(agent)]
        assert len({id(p) for p in held[agent]}) == len(held[agent]) > 0
    assert {id(p) for p in held["brief"]}.isdisjoint({id(p) for p in held["detailed"]})
    trainable = {id(p) for g in policy.groups for m in (g.model, g.reference) if m is not None
                 for p in m.parameters() if p.requires_grad}
    assert trainable == {id(p) for a in policy.agents for p in held[a]}  # nothing trainable left out
    p = prompts(team_toks) if kind == "two LoRA bases" else {a: prompts(team_toks)["brief"] for a in policy.agents}
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


def test_checkpoint_round_trip_and_mismatch_named(team_toks, tmp_path):
    policy = team(team_toks, value_head=True)
    policy.save(tmp_path / "ckpt")
    manifest = json.loads((tmp_path / "ckpt" / "policy.json").read_text())
    assert manifest["team"]["detailed"]["tokenizer"]["size"] == 300
    assert manifest["team"]["brief"]["base"]["model_type"] == "llama"
    fresh = team(team_toks, value_head=True)
    with torch.no_grad():
        for p in fresh.parameters("detailed"):
            p.zero_()
    fresh.load(tmp_path / "ckpt")
    for agent in policy.agents:
        for a, b in zip(policy.parameters(agent), fresh.parameters(agent)):
            assert torch.equal(a, b)
    smol, bpe = team_toks
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
def test_ids_beyond_the_tokenizer_never_sampled_and_scored_alike(team_toks, arch, backend):
    from numerics import assert_f32_close

    bpe = team_toks[1]
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


def test_mismatched_tokenizer_and_model_refused(team_toks):
    smol, bpe = team_toks
    with pytest.raises(ValueError, match=r"agent 'detailed': the tokenizer has 49152 tokens but the model's "
                                         r"embedding has 320 rows"):
        MultiAgentPolicy({"brief": tiny_model(smol, 0), "detailed": tiny_qwen(bpe)},
                         {"brief": smol, "detailed": smol}, ["brief", "detailed"])
    with pytest.raises(ValueError, match="gives no value for agents"):
        MultiAgentPolicy({"brief": tiny_model(smol, 0)}, smol, ["brief", "detailed"])


# ----------------------------------------------------------------------------------------- learners


def test_magrpo_team_of_two_tokenizers_with_per_agent_settings(team_dirs, tmp_path, varied_writing_reward,
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
        tmp_path, "magrpo", model=team_dirs["llama"], agent_models=(f"detailed={team_dirs['qwen']}",),
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
    assert detailed["tokenizer"]["size"] == len(load_tokenizer(team_dirs["qwen"])) and detailed["lora"]["rank"] == 2
    assert result["agent_detailed/response_tokens"] <= 3
    # --resume continues the run; a resumed run with another model for an agent is refused, naming it.
    resumed = magrpo.main(dataclasses.replace(config, num_iterations=3, resume=True))
    assert resumed["charts/iteration"] == 3
    with pytest.raises(ValueError, match="agent_models|detailed"):
        magrpo.main(dataclasses.replace(config, num_iterations=4, resume=True, agent_models=()))


def test_ppo_team_of_two_tokenizers(team_dirs, tmp_path):
    from baselines.learners import ppo

    config = ppo.Config(**learner_settings(
        tmp_path, "ppo", model=team_dirs["llama"], env="writing/xsum-v0", max_source_words=20,
        agent_models=(f"detailed={team_dirs['qwen']}",), agent_settings=("brief.top_k=5",),
        batch_size=2, minibatch_size=2, num_ppo_epochs=1, min_new_tokens=3, max_new_tokens=6))
    result = ppo.main(config)
    assert_trained(result, tmp_path / "ppo", ["brief", "detailed"])


def test_role_envs_follow_the_players_tokenizers(team_toks):
    """One vector env per role assignment where the models' tokenizers differ, one in all where they
    agree; each role's spaces and stop ids are its player's."""
    from types import SimpleNamespace

    from baselines.infra.play import RoleEnvs

    smol, bpe = team_toks

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


def test_cory_swaps_roles_between_two_tokenizers(team_dirs, tmp_path, monkeypatch, capsys):
    """Each role's env speaks the tokenizer of the model playing it, in training and evaluation, across
    swaps; both models train; the samples and ``llm-envs eval --checkpoint`` work."""
    from baselines.infra import play
    from baselines.infra.cli import main as cli
    from baselines.infra.samples import read_samples
    from baselines.learners import cory

    sizes = {"model_0": len(load_tokenizer(team_dirs["llama"])), "model_1": len(load_tokenizer(team_dirs["qwen"]))}
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
    config = cory_of_two_tokenizers(team_dirs, tmp_path, "cory-mixed", num_iterations=3, num_eval_problems=1,
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


def test_cory_of_two_tokenizers_repeats_and_resumes_across_a_swap(team_dirs, tmp_path, monkeypatch):
    """The same seed gives the same run, and Ctrl-C in the first swapped iteration then ``--resume`` ends
    exactly as the uninterrupted run (tests/test_interrupt.py)."""
    from test_interrupt import assert_same_run, patch_to_interrupt, run_state

    from baselines.infra.checkpoints import find_checkpoint
    from baselines.learners import cory

    def config(name: str):  # iteration 1 in the first roles, iteration 2 swapped; evaluations after both
        return cory_of_two_tokenizers(team_dirs, tmp_path, name, num_eval_problems=1, eval_every=1)

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


def test_cory_and_maac_teams_share_a_tokenizer(team_dirs, tmp_path, varied_writing_reward, monkeypatch):
    """Two bases of one tokenizer: CORY and MAAC train them; MAAC's critic reads every agent's ids
    exactly as before teams of tokenizers (``critic_inputs`` of the turns' ids: the same inputs, the same
    values, bit for bit)."""
    from baselines.learners import cory, maac

    result = cory.main(cory.Config(**learner_settings(
        tmp_path, "cory", model=team_dirs["llama"], agent_models=(f"model_1={team_dirs['qwen-smol']}",),
        agent_settings=("model_1.temperature=0.7",), batch_size=2, minibatch_size=2, num_ppo_epochs=1,
        min_new_tokens=3, max_new_tokens=6)))
    assert_trained(result, tmp_path / "cory", ["model_0", "model_1"])
    seen = spy_maac_critic(monkeypatch, pin=True)
    result = maac.main(maac.Config(**learner_settings(
        tmp_path, "maac", model=team_dirs["llama"], agent_models=(f"detailed={team_dirs['qwen-smol']}",),
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


def maac_of_two_tokenizers(team_dirs, tmp_path, name: str, **overrides):
    """MAAC with ``brief`` a Llama over SmolLM2's tokenizer and ``detailed`` a Qwen2 over the BPE one; the
    critic on the Llama's base."""
    from baselines.learners import maac

    settings = dict(model=team_dirs["llama"], agent_models=(f"detailed={team_dirs['qwen']}",), max_source_words=20,
                    num_problems=2, num_generations=2, max_new_tokens=8, num_epochs=1, critic_learning_rate=1e-2)
    return maac.Config(**learner_settings(tmp_path, name, **{**settings, **overrides}))


def test_maac_of_two_tokenizers_from_the_command_line(team_dirs, tmp_path, varied_writing_reward, monkeypatch,
                                                     capsys):
    """``llm-envs train maac`` with a Llama and a Qwen2 of different tokenizers: the critic (on the
    Llama's base) reads the Qwen2's prompt and response as their text in SmolLM2's tokens, the Llama's
    as its ids; both actors and the critic train, metrics are finite; an interrupted and resumed run
    ends as the uninterrupted one; the checkpoint evaluates from the command line."""
    from test_interrupt import assert_same_run, patch_to_interrupt, run_state

    from baselines.infra.checkpoints import find_checkpoint
    from baselines.infra.cli import main as cli
    from baselines.learners import maac

    config = maac_of_two_tokenizers(team_dirs, tmp_path, "maac-mixed")
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
    smol, bpe = load_tokenizer(team_dirs["llama"]), load_tokenizer(team_dirs["qwen"])
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
    interrupted = maac_of_two_tokenizers(team_dirs, tmp_path, "interrupted")
    with monkeypatch.context() as patch:
        patch_to_interrupt(patch, maac, "update_agent", "step", 2)
        with pytest.raises(KeyboardInterrupt):
            maac.main(interrupted)
    assert json.loads((find_checkpoint(interrupted.run_dir()) / "trainer.json").read_text())["step"] == 1
    maac.main(dataclasses.replace(interrupted, resume=True))
    assert_same_run(run_state(interrupted.run_dir()), run_state(run_dir))
    # Resuming with the critic on another base is refused, naming the critic.
    with pytest.raises(ValueError, match="critic"):
        maac.main(dataclasses.replace(interrupted, num_iterations=3, resume=True, critic_model=team_dirs["qwen"]))
    # The checkpoint evaluates from the command line (the critic rebuilt on its base).
    capsys.readouterr()
    assert cli(["eval", "--checkpoint", str(run_dir), "--num-problems", "1"]) == 0
    assert math.isfinite(json.loads(capsys.readouterr().out)["eval/total"])


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
