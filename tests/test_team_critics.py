"""A team of tokenizers read in one another's tokens (docs/teams.md): the critic's reader of foreign
agents (MAAC, PPO's and CORY's --critic central, each response token valued at its aligned position in
the critic's tokens), MARLHF's reward model and MADPO's comparator of another tokenizer. The team:
tests/team_kit.py.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from team_kit import (
    CORPUS,
    assert_trained,
    cory_of_two_tokenizers,
    learner_settings,
)
from tiny_models import tiny_model

from agents import LoraSettings, MultiAgentPolicy
from llm_envs.tokenizers import load_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def test_critic_reader_encodes_foreign_agents_and_names_text_it_cannot_encode(team_toks):
    """A critic whose tokenizer is neither agent's reads both as text; a tokenizer without byte fallback
    (a BPE over the corpus' characters, with an unknown token) refuses a character it has never seen,
    naming the agent, the characters and the fix."""
    from types import SimpleNamespace

    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from baselines.rl.critic import CriticReader, check_context

    smol, bpe = team_toks
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


def test_central_view_aligns_each_foreign_token_with_the_critics_state_of_the_same_text(team_toks, monkeypatch):
    """PPO's and CORY's ``--critic central`` over two tokenizers: the critic (SmolLM2's tokenizer) reads the
    BPE role's response as text in its own tokens, and each BPE token takes the critic's value of the
    longest prefix of the text that the state before it holds, hand-checked on two rows; the other
    role's prompt and response and the scored role's prompt are text in the critic's tokens too."""
    from types import SimpleNamespace

    from baselines.rl import critic
    from baselines.rl.critic import CentralView, CriticReader, central_context, central_view, token_starts

    smol, bpe = team_toks
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


def test_central_values_through_an_identity_alignment_equal_the_direct_values(team_toks):
    """A role forced through the text path with the critic's own tokenizer: re-encoding gives back its ids,
    every token aligns with itself, and the critic's values (gathered from the re-encoded response and
    its probe) equal the values read directly from the response's ids. The passes differ by one column
    (the probe) and right-padding, which a causal model's earlier positions do not see: equal up to the
    float32 rounding of kernels blocked over another length."""
    from baselines.infra.config import CRITIC
    from baselines.rl.critic import CentralView, CriticReader, central_values

    smol, _ = team_toks
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


def test_ppo_and_cory_central_critics_over_two_tokenizers(team_dirs, tmp_path, monkeypatch, capsys):
    """``--critic central`` with a team of two tokenizers: PPO's two agents and CORY's two models swapping
    roles across the tokenizers train with the critic on the Llama's base; metrics are finite and the
    time spent re-encoding is logged."""
    from baselines.infra.cli import main as cli
    from baselines.infra.metrics import read_metrics
    from baselines.learners import cory, ppo

    result = ppo.main(ppo.Config(**learner_settings(
        tmp_path, "ppo-central", model=team_dirs["llama"], env="writing/xsum-v0", critic="central",
        max_source_words=20, agent_models=(f"detailed={team_dirs['qwen']}",), batch_size=2, minibatch_size=2,
        num_ppo_epochs=1, min_new_tokens=3, max_new_tokens=6)))
    assert_trained(result, tmp_path / "ppo-central", ["brief", "detailed", "critic"])
    # --critic-model: the critic on the Qwen2's base (the BPE tokenizer), reading the Llama as text; the
    # checkpoint evaluates from the command line (the critic rebuilt on the base the run recorded).
    on_qwen = ppo.Config(**learner_settings(
        tmp_path, "ppo-central-qwen", model=team_dirs["llama"], env="writing/xsum-v0", critic="central",
        critic_model=team_dirs["qwen"], max_source_words=20, agent_models=(f"detailed={team_dirs['qwen']}",),
        batch_size=2, minibatch_size=2, num_ppo_epochs=1, min_new_tokens=3, max_new_tokens=6))
    result = ppo.main(on_qwen)
    assert_trained(result, tmp_path / "ppo-central-qwen", ["brief", "detailed", "critic"])
    manifest = json.loads((tmp_path / "ppo-central-qwen" / "checkpoints" / "step_000002" / "policy"
                           / "policy.json").read_text())
    assert manifest["team"]["critic"]["tokenizer"]["size"] == len(load_tokenizer(team_dirs["qwen"]))
    capsys.readouterr()
    assert cli(["eval", "--checkpoint", str(tmp_path / "ppo-central-qwen"), "--num-problems", "1"]) == 0
    assert math.isfinite(json.loads(capsys.readouterr().out)["eval/total"])
    with pytest.raises(ValueError, match="critic_model=.* --critic central"):
        ppo.Config(critic_model=team_dirs["qwen"])
    env_kwargs = cory.Config.env_kwargs  # room for the pioneer's text in the BPE's tokens (as above)
    monkeypatch.setattr(cory.Config, "env_kwargs", lambda self: {**env_kwargs(self), "max_prompt_tokens": 256})
    result = cory.main(cory_of_two_tokenizers(team_dirs, tmp_path, "cory-central", critic="central", num_iterations=3))
    assert_trained(result, tmp_path / "cory-central", ["model_0", "model_1", "critic"], steps=(2, 3))
    for name in ("ppo-central", "cory-central"):
        rows = [r for r in read_metrics(tmp_path / name / "metrics.jsonl") if "charts/iteration" in r]
        assert rows
        for row in rows:
            assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
            assert 0 < row["charts/critic_reencode_fraction"] < 1


def test_marlhf_reward_model_reads_a_team_of_two_tokenizers(team_dirs, tmp_path, team_toks, varied_writing_reward):
    """MARLHF's reward model (on the Llama's base) reads the Qwen2 agent's prompts and responses as their
    text in SmolLM2's tokens: its preference pairs (``read_pairs``) and the candidates it scores. Offline
    with MAGRPO, iterative with MAGRPO, and offline with PPO's RL stage all train the team."""
    from types import SimpleNamespace

    from baselines.learners import marlhf
    from baselines.rl.critic import CriticReader
    from baselines.rl.preference import Pair
    from baselines.rl.reward_model import REWARD_MODEL, read_pairs

    smol, bpe = team_toks
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

    settings = dict(model=team_dirs["llama"], agent_models=(f"detailed={team_dirs['qwen']}",), max_source_words=20,
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


def test_madpo_comparator_model_of_another_tokenizer(team_dirs, tmp_path, team_toks, monkeypatch,
                                                     varied_writing_reward):
    """MADPO's ``--comparator model`` with a comparator of another tokenizer than the team's: it plays
    through envs of its own tokenizer, and its responses join the pairs as their text in the agents'
    tokens, ending with the agent's EOS where its own ended with its EOS (hand-checked on two responses,
    then a run that trains)."""
    from types import SimpleNamespace

    from baselines.learners import madpo
    from baselines.rl.preference import PromptCandidates
    from baselines.rl.preference_team import Team

    smol, bpe = team_toks
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
        tmp_path, "madpo-comparator", model=team_dirs["llama"], comparator_model=team_dirs["qwen"], iterative=True,
        comparator="model", max_source_words=20, num_problems=2, num_candidates=3, max_new_tokens=8, temperature=1.0,
        top_p=1.0, top_k=0, num_eval_problems=0))
    result = madpo.main(config)
    assert_trained(result, config.run_dir(), ["brief", "detailed"])
    assert 0 <= result["pref/win_rate"] <= 1
    assert len(seen) == 2
    qwen_tok = load_tokenizer(team_dirs["qwen"])
    eos = set(load_tokenizer(team_dirs["qwen"]).convert_tokens_to_ids([qwen_tok.eos_token]))
    for before, after in seen:  # every comparator response: its text in SmolLM2's tokens (random weights write
        for b, a in zip(before, after):  # control bytes SmolLM2's vocabulary has no token for: dropped)
            for agent in ("brief", "detailed"):
                for old, new in zip(b.responses[agent], a.responses[agent]):
                    text = qwen_tok.decode(old.tolist(), skip_special_tokens=True, clean_up_tokenization_spaces=False)
                    expected = smol(text, add_special_tokens=False).input_ids
                    expected += [smol.eos_token_id] if old.tolist()[-1:] and old.tolist()[-1] in eos else []
                    assert new.tolist() == expected
