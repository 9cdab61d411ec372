"""Preference learners (MADPO, MARLHF): the losses, pairs, selection rules and replay weights against
hand-computed values; the reward model learning a synthetic preference; smoke runs of both learners in
both forms on a tiny in-process model; Ctrl-C resume of an iterative run equals the uninterrupted run.
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

from baselines.infra.checkpoints import find_checkpoint
from baselines.infra.metrics import read_metrics
from baselines.learners import madpo, marlhf
from baselines.rl import reward_model
from baselines.rl.preference import (
    Pair,
    PairBuffer,
    bradley_terry_loss,
    joint_dpo_loss,
    matched_pairs,
    pair_rows,
    ranked_pairs,
    replay_weights,
    select_pairs,
)


# ----------------------------------------------------------------------------------------- losses
def test_joint_dpo_loss_by_hand_without_reference():
    deltas = {"a": torch.tensor([1.0], requires_grad=True), "b": torch.tensor([-0.5], requires_grad=True)}
    losses, margin = joint_dpo_loss(deltas, beta=0.1)
    # joint margin 1.0 - 0.5 = 0.5; every agent's loss -log sigmoid(0.1 * 0.5) = log(1 + e^-0.05)
    assert float(margin[0]) == pytest.approx(0.5)
    for agent in ("a", "b"):
        assert float(losses[agent].detach()[0]) == pytest.approx(math.log1p(math.exp(-0.05)), abs=1e-6)
    # Agent a's loss moves only delta_a: d/d delta_a = -beta * sigmoid(-beta * margin); delta_b is a constant.
    losses["a"].sum().backward()
    assert float(deltas["a"].grad[0]) == pytest.approx(-0.1 / (1 + math.exp(0.05)), abs=1e-6)
    assert deltas["b"].grad is None


def test_joint_dpo_loss_by_hand_with_reference_term():
    deltas = {"a": torch.tensor([1.0, 0.0]), "b": torch.tensor([-0.5, 2.0])}
    ref = {"a": torch.tensor([0.2, 0.0]), "b": torch.tensor([0.3, -1.0])}
    losses, margin = joint_dpo_loss(deltas, beta=0.5, ref_deltas=ref)
    # row 0: (1.0 - 0.2) + (-0.5 - 0.3) = 0 -> log 2; row 1: 0 + 3.0 = 3 -> log(1 + e^-1.5)
    torch.testing.assert_close(margin, torch.tensor([0.0, 3.0]))
    torch.testing.assert_close(losses["b"], torch.tensor([math.log(2.0), math.log1p(math.exp(-1.5))]))
    with pytest.raises(ValueError, match="beta"):
        joint_dpo_loss(deltas, beta=0.0)


def test_bradley_terry_loss_by_hand():
    loss = bradley_terry_loss(torch.tensor([2.0, 0.0]), torch.tensor([0.5, 0.0]))
    torch.testing.assert_close(loss, torch.tensor([math.log1p(math.exp(-1.5)), math.log(2.0)]))


# ----------------------------------------------------------------------------------------- pairs
TABLE = [0.2, 0.9, 0.2, 0.5]  # candidates 0 and 2 tie


def test_ranked_pairs_drop_ties_and_keep_every_ordered_pair():
    got = [(c.winner, c.loser, round(c.gap, 6)) for c in ranked_pairs(TABLE)]
    assert got == [(1, 0, 0.7), (1, 2, 0.7), (1, 3, 0.4), (3, 0, 0.3), (3, 2, 0.3)]


def test_selection_rules_on_a_fixed_table():
    rng = np.random.default_rng(0)
    choices = ranked_pairs(TABLE)
    assert [(c.winner, c.loser) for c in select_pairs(choices, "reward_gap", 3, rng)] == [(1, 0), (1, 2), (1, 3)]
    assert select_pairs(choices, "all", 1, rng) == choices
    drawn = select_pairs(choices, "random", 2, np.random.default_rng(1))
    assert len(drawn) == 2 and all(c in choices for c in drawn) and drawn[0] != drawn[1]
    assert drawn == select_pairs(choices, "random", 2, np.random.default_rng(1))  # seeded
    assert select_pairs(choices, "random", 9, rng) == choices  # fewer than k: all
    with pytest.raises(ValueError, match="pair selection"):
        select_pairs(choices, "best", 1, rng)  # type: ignore[arg-type]


def test_matched_pairs_and_comparator_reward_selection():
    team, comparator = [1.0, 0.0, 2.0, 1.0], [0.5, 0.0, 3.0, 2.0]
    got = [(c.winner, c.team_won, c.gap, c.comparator_reward) for c in matched_pairs(team, comparator)]
    assert got == [(0, True, 0.5, 0.5), (2, False, 1.0, 3.0), (3, False, 1.0, 2.0)]  # slot 1 tied: dropped
    picked = select_pairs(matched_pairs(team, comparator), "comparator_reward", 2, np.random.default_rng(0))
    assert [c.winner for c in picked] == [2, 3]  # the strongest comparator samples first
    assert [c.winner for c in select_pairs(matched_pairs(team, comparator), "reward_gap", 2,
                                           np.random.default_rng(0))] == [2, 3]
    with pytest.raises(ValueError, match="3 team candidates against 2"):
        matched_pairs([1, 2, 3], [1, 2])


@pytest.mark.parametrize(
    ("mode", "kwargs", "expected"),
    [
        ("current", {}, [0.0, 0.0, 0.0, 1.0]),
        ("nearest_k", {"k": 2}, [0.0, 0.0, 0.5, 0.5]),
        ("nearest_k", {"k": 9}, [0.25, 0.25, 0.25, 0.25]),
        ("all_history", {}, [0.25, 0.25, 0.25, 0.25]),
        # (1 - l) l^age for ages 3, 2, 1, 0 with l = 0.5: 1/16, 1/8, 1/4, 1/2, normalised by 15/16
        ("lambda_decay", {"lam": 0.5}, [1 / 15, 2 / 15, 4 / 15, 8 / 15]),
    ],
)
def test_replay_weights(mode, kwargs, expected):
    np.testing.assert_allclose(replay_weights(mode, 4, **kwargs), expected)


def test_replay_weights_bad_values():
    with pytest.raises(ValueError, match="replay_lambda"):
        replay_weights("lambda_decay", 3, lam=1.0)
    with pytest.raises(ValueError, match="replay must be"):
        replay_weights("newest", 3)  # type: ignore[arg-type]


def _pair(iteration: int, tag: int = 0) -> Pair:
    t = torch.tensor([tag])
    return Pair({"a": t}, {"a": t}, {"a": t}, iteration, 1.0)


def test_buffer_draws_follow_the_replay_weights():
    buffer = PairBuffer()
    for it in range(3):
        buffer.add(it, [_pair(it, k) for k in range(4)])
    rng = np.random.default_rng(0)
    assert {p.iteration for p in buffer.draw(4, "current", rng)} == {2}
    assert {p.iteration for p in buffer.draw(8, "nearest_k", rng, k=2)} == {1, 2}
    counts = np.bincount([buffer.draw(1, "lambda_decay", rng, lam=0.5)[0].iteration for _ in range(3000)], minlength=3)
    np.testing.assert_allclose(counts / 3000, [1 / 7, 2 / 7, 4 / 7], atol=0.03)
    assert len(buffer.draw(50, "all_history", rng)) == 12  # without replacement: at most every pair


def test_buffer_files_round_trip_and_drop_later_iterations(tmp_path):
    buffer = PairBuffer()
    for it in range(3):
        buffer.add(it, [_pair(it, it)])
        buffer.save_iteration(tmp_path, it)
    loaded = PairBuffer.load(tmp_path, before=2)
    assert loaded.iterations() == [0, 1] and not (tmp_path / "pairs_000002.pt").exists()
    assert loaded.by_iteration[1][0].winners["a"].tolist() == [1]
    (tmp_path / "pairs_000001.pt").write_bytes(b"not a torch file")
    with pytest.raises(ValueError, match="corrupt preference pairs file"):
        PairBuffer.load(tmp_path, before=2)


def test_pair_rows_pad_and_mask():
    empty = torch.tensor([], dtype=torch.long)
    pair = Pair({"a": torch.tensor([5, 6])}, {"a": torch.tensor([7])}, {"a": empty}, 0, 1.0)
    p_ids, p_mask, r_ids, r_mask = pair_rows([pair], "a", pad_id=0)
    assert p_ids.tolist() == [[5, 6], [5, 6]] and r_ids.tolist() == [[7], [0]] and r_mask.tolist() == [[1], [0]]


# ----------------------------------------------------------------------------------------- the reward model
def test_reward_model_learns_a_synthetic_preference(tiny_model_dir):
    """Winners end their responses with one token, losers with another: the Bradley-Terry reward model
    learns to tell them apart on held-out prompts it never saw."""
    from agents import LoraSettings, MultiAgentPolicy

    torch.manual_seed(0)
    policy = MultiAgentPolicy.from_pretrained(["writer", reward_model.REWARD_MODEL], tiny_model_dir, value_head=True,
                                              lora=LoraSettings(rank=4, alpha=8.0), mixed_batches=False)
    policy.train()
    rng = np.random.default_rng(0)
    good, bad = 300, 400

    def pair(i: int) -> Pair:
        prompt = torch.as_tensor(rng.integers(500, 900, size=6))
        body = torch.as_tensor(rng.integers(500, 900, size=4))
        return Pair({"writer": prompt}, {"writer": torch.cat([body, torch.tensor([good])])},
                    {"writer": torch.cat([body, torch.tensor([bad])])}, 0, 1.0)

    train, test = [pair(i) for i in range(48)], [pair(i) for i in range(48, 80)]
    config = marlhf.Config(rm_batch_pairs=8, max_grad_norm=1.0)
    optimizer = policy.optimizer(reward_model.REWARD_MODEL, lr=3e-3)
    before = reward_model.rm_accuracy(policy, test, ["writer"], 16)
    stats = reward_model.train_reward_model(policy, optimizer, train, ["writer"], config, rng, epochs=4)
    after = reward_model.rm_accuracy(policy, test, ["writer"], 16)
    assert math.isfinite(stats["losses/reward_model"])
    assert after >= 0.9 and after > before, (before, after)


# ----------------------------------------------------------------------------------------- runs
def tiny(learner, model_dir: str, tmp_path, **overrides):
    settings = dict(
        model=model_dir, max_source_words=20, num_iterations=2, num_problems=2, num_candidates=3, num_prompts=2,
        max_new_tokens=12, temperature=1.0, top_p=1.0, top_k=0, learning_rate=1e-2, lora_rank=4, lora_alpha=8.0,
        num_eval_problems=1, output_dir=str(tmp_path), run_name="run", checkpoint_every=0, tensorboard=False,
        progress=False,
    )
    settings.update(overrides)
    return learner.Config(**settings)


def adapters(run_dir) -> dict[str, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    root = find_checkpoint(run_dir) / "policy"
    return {p.name.split(".")[0]: load_file(str(p)) for p in root.glob("*.adapter.safetensors")}


def assert_trained(result, run_dir, names):
    state = adapters(run_dir)
    for name in names:
        # LoRA starts with B = 0: a nonzero B means the agent's own optimizer moved it.
        assert any(float(v.abs().sum()) > 0 for k, v in state[name].items() if "lora_B" in k), name
    finite = [v for k, v in result.items() if isinstance(v, float)]
    assert finite and all(math.isfinite(v) for v in finite), result


def test_madpo_offline_smoke(tiny_model_dir, tmp_path):
    config = tiny(madpo, tiny_model_dir, tmp_path, kl_coef=0.1, kl_in="loss")
    result = madpo.main(config)
    assert_trained(result, config.run_dir(), ["brief", "detailed"])
    assert result["pref/pairs"] >= 1 and "losses/kl" in result
    assert "eval/total" in result and "eval_before/total" in result
    assert (config.run_dir() / "preference" / "pairs_000000.pt").is_file()


@pytest.mark.parametrize(("comparator", "extra"), [
    ("history", {"replay": "lambda_decay", "kl_coef": 0.1, "kl_in": "reward", "pair_selection": "comparator_reward"}),
    ("initial", {"replay": "nearest_k", "no_ref": True}),
    ("model", {"replay": "all_history", "pair_selection": "random"}),
])
def test_madpo_iterative_smoke(tiny_model_dir, tmp_path, comparator, extra):
    extra = dict(extra)
    if extra.pop("no_ref", False):
        extra["reference_term"] = False
    if comparator == "model":
        extra["comparator_model"] = tiny_model_dir
    config = tiny(madpo, tiny_model_dir, tmp_path, iterative=True, comparator=comparator, num_eval_problems=0,
                  **extra)
    result = madpo.main(config)
    assert_trained(result, config.run_dir(), ["brief", "detailed"])
    assert 0 <= result["pref/win_rate"] <= 1 and "reward/total" in result
    assert sorted(p.name for p in (config.run_dir() / "preference").glob("pairs_*")) == ["pairs_000000.pt",
                                                                                          "pairs_000001.pt"]


@pytest.mark.parametrize(("iterative", "rl"), [(False, "magrpo"), (True, "magrpo"), (False, "ppo"), (False, "maac")])
def test_marlhf_smoke(tiny_model_dir, tmp_path, iterative, rl, varied_writing_reward):
    extra = {"comparator": "history"} if iterative else {}
    if rl == "ppo":
        extra["rl_args"] = ("batch_size=4", "minibatch_size=4", "num_ppo_epochs=1")
    if rl == "maac":
        extra["rl_args"] = ("num_generations=2", "num_epochs=1")
    config = tiny(marlhf, tiny_model_dir, tmp_path, iterative=iterative, num_prompts=3, num_eval_problems=0,
                  rl_learner=rl, **extra)
    result = marlhf.main(config)
    if rl == "magrpo":
        assert_trained(result, config.run_dir(), ["brief", "detailed", reward_model.REWARD_MODEL])
        assert "pref/learned_reward" in result and "reward/total" in result and "losses/reward_model" in result
        return
    # PPO / MAAC: the reward model is trained first (<run>/reward_model), the learner's run is <run>/rl.
    assert_trained(result, config.run_dir() / "rl", ["brief", "detailed"])
    assert "losses/reward_model" in result and 0 <= result["pref/rm_heldout_accuracy"] <= 1
    assert (config.run_dir() / "reward_model" / "reward_model.adapter.safetensors").is_file()
    with pytest.raises(FileExistsError, match="--resume"):
        marlhf.main(config)


def test_learned_reward_vec_replaces_the_rewards_and_keeps_the_task_infos():
    import llm_envs

    venv = llm_envs.make_vec("writing/xsum-v0", 2, max_source_words=20)
    seen = {}

    def scorer(prompts, responses):
        seen.update(responses)
        return np.array([0.25, -1.0])

    wrapped = reward_model.LearnedRewardVec(venv, scorer, {a: 0 for a in venv.possible_agents},
                                      {a: [0] for a in venv.possible_agents})
    wrapped.reset(seed=[0, 1])
    actions = {a: ["A short summary.", "Another one, a bit longer."] for a in venv.possible_agents}
    _, rewards, terms, _, infos = wrapped.step(actions)
    for a in venv.possible_agents:
        np.testing.assert_allclose(rewards[a], [0.25, -1.0])
        assert "reward_total" in infos[a] and bool(terms[a].all())  # the task's reward stays in the infos
    assert set(seen) == set(venv.possible_agents) and wrapped.num_envs == 2


def test_rl_args_errors():
    with pytest.raises(ValueError, match="rl_args sets a PPO or MAAC"):
        marlhf.Config(rl_args=("batch_size=4",))
    with pytest.raises(ValueError, match="use rl_learner='magrpo'"):
        marlhf.Config(rl_learner="ppo", iterative=True)
    with pytest.raises(ValueError, match="rl_args entry 'lr=1'"):
        marlhf.rl_config(marlhf.Config(rl_learner="ppo", rl_args=("lr=1",)))
    with pytest.raises(ValueError, match="batch_size must be an int"):
        marlhf.rl_config(marlhf.Config(rl_learner="ppo", rl_args=("batch_size=many",)))


@pytest.mark.parametrize(("learner", "iterations"), [(madpo, 3), (marlhf, 2)], ids=["madpo", "marlhf"])
def test_interrupted_iterative_run_resumes_exactly(tiny_model_dir, tmp_path, monkeypatch, learner, iterations):
    """Ctrl-C in the last iteration of an iterative run, then --resume: the same weights, pairs and
    metrics as the uninterrupted run. MADPO plays comparator history: its third iteration plays the
    weights after the first, read back from the run's files; MARLHF's reward model and its optimizer
    come back from the checkpoint. Replay draws from every iteration."""
    config = tiny(learner, tiny_model_dir, tmp_path, iterative=True, comparator="history", replay="all_history",
                  num_iterations=iterations, num_eval_problems=0)
    learner.main(dataclasses.replace(config, run_name="straight"))
    calls = {"n": 0}
    target = "dpo_update" if learner is madpo else "update_agent"
    per_iteration = 1 if learner is madpo else 2  # MARLHF: one update per agent
    real = getattr(learner, target)

    def interrupt(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == (iterations - 1) * per_iteration + 1:  # the first update of the last iteration
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(learner, target, interrupt)
    with pytest.raises(KeyboardInterrupt):
        learner.main(config)
    assert json.loads((find_checkpoint(config.run_dir()) / "trainer.json").read_text())["step"] == iterations - 1
    monkeypatch.setattr(learner, target, real)
    learner.main(dataclasses.replace(config, resume=True))
    straight, resumed = adapters(tmp_path / "straight"), adapters(config.run_dir())
    for name, tensors in straight.items():
        for key, value in tensors.items():
            torch.testing.assert_close(resumed[name][key], value, rtol=0, atol=0)
    keys = ("losses/", "pref/", "reward/")
    a, b = read_metrics(tmp_path / "straight" / "metrics.jsonl"), read_metrics(config.run_dir() / "metrics.jsonl")
    assert [r["step"] for r in b] == list(range(1, iterations + 1))
    for x, y in zip(a, b):
        assert {k: v for k, v in x.items() if k.startswith(keys)} == {k: v for k, v in y.items() if k.startswith(keys)}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"comparator": "initial"}, "add --iterative"),
        ({"pair_selection": "comparator_reward"}, "needs --iterative"),
        ({"iterative": True, "comparator": "model"}, "needs --comparator-model"),
        ({"num_turns": 2}, "num_turns=1"),
        ({"replay_lambda": 1.5}, "replay_lambda must be in"),
        ({"kl_in": "advantage"}, "kl_in must be"),
        ({"beta": 0.0}, "beta must be > 0"),
        ({"num_candidates": 1}, "num_candidates must be >= 2"),
    ],
)
def test_bad_settings_get_one_line_errors(overrides, message):
    with pytest.raises(ValueError, match=message):
        madpo.Config(**overrides)


def test_cli_lists_and_checks_the_preference_learners(capsys):
    from baselines.infra.cli import main

    for argv, message in (
        (["train", "madpo", "--iterative", "--comparator", "oracle"], "invalid choice 'oracle'"),
        (["train", "marlhf", "--rm-holdout", "1.0"], "rm_holdout must be in [0, 1)"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_madpo_trains_a_centralised_env(tiny_model_dir, tmp_path, monkeypatch, varied_writing_reward):
    """``--centralized``: one agent (``central``) writes every role; MADPO's joint loss is then plain DPO.
    A random tiny model writes no section tags (every reward would tie at 0), so here an untagged
    response counts as the first role's section."""
    from llm_envs.core import centralized

    real = centralized.parse_sections

    def lenient(text, roles):
        texts, found = real(text, roles)
        if not found:
            texts = {**texts, roles[0]: text}
        return texts, found

    monkeypatch.setattr(centralized, "parse_sections", lenient)
    config = tiny(madpo, tiny_model_dir, tmp_path, centralized=True, max_new_tokens=24, num_eval_problems=0,
                  num_prompts=3, num_candidates=4)
    result = madpo.main(config)
    assert_trained(result, config.run_dir(), ["central"])
    with pytest.raises(ValueError, match="--centralized"):
        madpo.Config(centralized=True, env="writing/xsum-sequential-v0")
