"""MARLHF's reward model: the split by prompt, the epoch chosen on validation pairs, the mean-pooled score."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from baselines.learners import marlhf
from baselines.rl import reward_model
from baselines.rl.preference import Pair


def pair(prompt: int, winner: int = 1, loser: int = 2) -> Pair:
    t = torch.tensor
    return Pair({"a": t([prompt, prompt]), "b": t([prompt + 100])}, {"a": t([winner]), "b": t([winner])},
                {"a": t([loser]), "b": t([loser])}, 0, 1.0)


# ----------------------------------------------------------------------------------------- the split
def test_split_by_prompt_keeps_each_prompts_pairs_in_one_part():
    pairs = [pair(p, w) for p in range(10) for w in range(3)]  # 10 prompts x 3 pairs
    test, val, train = reward_model.split_by_prompt(pairs, [0.2, 0.3], np.random.default_rng(1))
    prompts = [{int(p.prompts["a"][0]) for p in part} for part in (test, val, train)]
    assert [len(s) for s in prompts] == [2, 3, 5]  # round(0.2 * 10), round(0.3 * 10), the rest
    assert [len(part) for part in (test, val, train)] == [6, 9, 15]  # all 3 pairs of each prompt
    assert prompts[0].isdisjoint(prompts[1]) and prompts[0].isdisjoint(prompts[2]) and prompts[1].isdisjoint(prompts[2])
    # Every pair lands in exactly one part, in the order given.
    assert sorted(id(p) for part in (test, val, train) for p in part) == sorted(id(p) for p in pairs)
    position = {id(p): i for i, p in enumerate(pairs)}
    assert [position[id(p)] for p in train] == sorted(position[id(p)] for p in train)


def test_split_by_prompt_tells_prompts_apart_by_every_agents_prompt():
    t = torch.tensor
    same_a = [Pair({"a": t([1]), "b": t([b])}, {"a": t([5]), "b": t([5])}, {"a": t([6]), "b": t([6])}, 0, 1.0)
              for b in (2, 3)]  # the same first prompt, different second prompts: two prompts
    held, rest = reward_model.split_by_prompt(same_a, [0.5], np.random.default_rng(0))
    assert len(held) == 1 and len(rest) == 1


# ----------------------------------------------------------------------------------------- the epoch
def test_best_epoch_takes_the_highest_accuracy_and_the_earliest_of_ties():
    assert reward_model.best_epoch([0.5, 0.8, 0.6]) == 1
    assert reward_model.best_epoch([0.7, 0.6, 0.7]) == 0
    assert reward_model.best_epoch([0.2]) == 0


class _OneWeight:
    """A stand-in policy whose reward model is one weight."""

    def __init__(self) -> None:
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def parameters(self, agent: str) -> list[torch.nn.Parameter]:
        assert agent == reward_model.REWARD_MODEL
        return [self.weight]


def test_training_keeps_the_weights_of_the_best_validation_epoch(monkeypatch):
    """Every step adds 1 to the weight; the validation accuracies of the 4 epochs are scripted: the
    weights after the second epoch (the best, 0.8) are the ones kept, not the last epoch's."""
    policy = _OneWeight()
    steps_per_epoch = 2  # 3 pairs in batches of 2

    def step(policy_, optimizer, batch, agents, max_grad_norm, pooling, micro_pairs):
        with torch.no_grad():
            policy_.weight += 1
        return {"loss": 0.5, "accuracy": 1.0}

    scripted = iter([0.5, 0.8, 0.6, 0.8])
    seen: list[float] = []

    def accuracy(policy_, pairs, agents, batch, pooling):
        assert len(pairs) == 1  # the validation pairs, never the training ones
        seen.append(float(policy_.weight.detach()))
        return next(scripted)

    monkeypatch.setattr(reward_model, "reward_model_step", step)
    monkeypatch.setattr(reward_model, "rm_accuracy", accuracy)
    config = marlhf.Config(rm_batch_pairs=2)
    stats = reward_model.train_reward_model(policy, None, [pair(1), pair(2), pair(3)], ["a", "b"], config,
                                            np.random.default_rng(0), epochs=4, validation=[pair(9)])
    assert seen == [2.0, 4.0, 6.0, 8.0]
    assert float(policy.weight.detach()) == 2 * steps_per_epoch
    assert stats["pref/rm_epoch"] == 2.0 and stats["pref/rm_validation_accuracy"] == 0.8


def test_without_validation_pairs_the_last_epoch_is_kept(monkeypatch):
    policy = _OneWeight()

    def step(policy_, optimizer, batch, agents, max_grad_norm, pooling, micro_pairs):
        with torch.no_grad():
            policy_.weight += 1
        return {"loss": 0.5, "accuracy": 1.0}

    monkeypatch.setattr(reward_model, "reward_model_step", step)
    stats = reward_model.train_reward_model(policy, None, [pair(1), pair(2)], ["a", "b"],
                                            marlhf.Config(rm_batch_pairs=2), np.random.default_rng(0), epochs=3)
    assert float(policy.weight.detach()) == 3.0 and "pref/rm_epoch" not in stats


def test_config_refuses_splits_that_leave_nothing_to_train_on():
    with pytest.raises(ValueError, match="rm_holdout \\+ rm_validation"):
        marlhf.Config(rm_holdout=0.5, rm_validation=0.5)
    with pytest.raises(ValueError, match="rm_pooling"):
        marlhf.Config(rm_pooling="max")


# ----------------------------------------------------------------------------------------- the score
@pytest.mark.parametrize("share_prompts", [True, False])
def test_mean_pooled_score_is_the_mean_of_the_last_token_scores_of_every_prefix(tiny_model_dir, share_prompts):
    """The mean-pooled score of a row is the average of the head's value after each of its tokens:
    the last-token score of each of its prefixes, computed one prefix at a time."""
    from agents import LoraSettings, MultiAgentPolicy

    torch.manual_seed(0)
    policy = MultiAgentPolicy.from_pretrained(["writer", reward_model.REWARD_MODEL], tiny_model_dir, value_head=True,
                                              lora=LoraSettings(rank=4, alpha=8.0), mixed_batches=False,
                                              share_prompts=share_prompts)
    with torch.no_grad():  # an adapter and a head that are not the identity / zero
        for p in policy.parameters(reward_model.REWARD_MODEL):
            p.normal_(0, 0.05)
    pad = policy.pad_token_id_of(reward_model.REWARD_MODEL)
    rows = [torch.tensor([501, 502, 503, 504, 505]), torch.tensor([601, 602, 603]), torch.tensor([501, 700])]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):], mask[i, width - len(r):] = r, 1
    with torch.no_grad():
        pooled = reward_model.reward_scores(policy, ids, mask, "mean")
        expected = []
        for r in rows:
            prefixes = [reward_model.reward_scores(policy, r[None, :k], torch.ones(1, k, dtype=torch.long), "last")
                        for k in range(1, len(r) + 1)]
            expected.append(torch.cat(prefixes).mean())
    assert torch.allclose(pooled, torch.stack(expected), atol=2e-2), (pooled, expected)
    # Not the last token's score alone (the rows' prefixes score differently).
    last = reward_model.reward_scores(policy, ids, mask, "last")
    assert not torch.allclose(pooled, last, atol=1e-3)


def test_a_step_in_micro_batches_equals_the_whole_batch(tiny_model_dir):
    """``rm_micro_pairs``: the step's gradient accumulated over passes of 1 pair equals one pass of all 3
    pairs (float32: the same sums in another order, far below the step), so the memory peak shrinks and
    the step does not change."""
    from agents import LoraSettings, MultiAgentPolicy
    from baselines.rl.preference import Pair

    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(500, 900, (n,), generator=g) for n in (3, 5, 2, 4, 6, 3, 2, 5, 4)]
    pairs = [Pair({"writer": rows[i]}, {"writer": rows[i + 1]}, {"writer": rows[i + 2]}, 0, 1.0) for i in (0, 3, 6)]
    after = []
    for micro in (1, 3):
        torch.manual_seed(0)
        policy = MultiAgentPolicy.from_pretrained(["writer", reward_model.REWARD_MODEL], tiny_model_dir,
                                                  value_head=True, lora=LoraSettings(rank=4, alpha=8.0),
                                                  mixed_batches=False,
                                                  dtype=torch.float32)  # bf16 rounds each pass's widths apart
        with torch.no_grad():
            for p in policy.parameters(reward_model.REWARD_MODEL):
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(p.numel()))
        start = [p.detach().clone() for p in policy.parameters(reward_model.REWARD_MODEL)]
        optimizer = torch.optim.SGD(policy.parameters(reward_model.REWARD_MODEL), lr=1.0)
        stats = reward_model.reward_model_step(policy, optimizer, pairs, ["writer"], 0.0, "mean", micro_pairs=micro)
        after.append(([p.detach().clone() for p in policy.parameters(reward_model.REWARD_MODEL)], stats))
    (one, one_stats), (whole, whole_stats) = after
    assert one_stats["accuracy"] == whole_stats["accuracy"]
    assert one_stats["loss"] == pytest.approx(whole_stats["loss"], rel=1e-5)
    moved = max(float((w - p0).abs().max()) for w, p0 in zip(whole, start))
    assert moved > 1e-3  # the step moved the weights; both ways moved them alike
    for a, b in zip(one, whole):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)  # float32 sums reordered: ~1e-7 x |grad|


def test_each_candidate_is_scored_once_and_the_step_equals_scoring_every_pair(tiny_model_dir, monkeypatch):
    """A prompt's 3 candidates make 3 pairs (6 rows, 3 distinct): the step scores each distinct row once,
    in one pass or (more rows than a pass holds) scores first and then each part with its gradient, and
    moves the weights as the loss summed over every pair's own two rows does (float32: sums reordered)."""
    from agents import LoraSettings, MultiAgentPolicy
    from baselines.rl.preference import Pair, bradley_terry_loss

    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(500, 900, (n,), generator=g) for n in (4, 3)]
    cands = [[torch.randint(500, 900, (n,), generator=g) for n in (2, 5, 3)], [torch.randint(500, 900, (4,),
                                                                                            generator=g)] * 2]
    cands[1][1] = torch.randint(500, 900, (6,), generator=g)
    pairs = [Pair({"writer": prompts[0]}, {"writer": cands[0][w]}, {"writer": cands[0][v]}, 0, 1.0)
             for w, v in ((0, 1), (0, 2), (1, 2))]
    pairs.append(Pair({"writer": prompts[1]}, {"writer": cands[1][0]}, {"writer": cands[1][1]}, 0, 1.0))

    def fresh():
        torch.manual_seed(0)
        policy = MultiAgentPolicy.from_pretrained(["writer", reward_model.REWARD_MODEL], tiny_model_dir,
                                                  value_head=True, lora=LoraSettings(rank=4, alpha=8.0),
                                                  mixed_batches=False,
                                                  dtype=torch.float32)
        with torch.no_grad():
            for p in policy.parameters(reward_model.REWARD_MODEL):
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(p.numel()))
        return policy, torch.optim.SGD(policy.parameters(reward_model.REWARD_MODEL), lr=1.0)

    # The reference: every pair's own two rows in one pass, the loss summed over the pairs.
    policy, optimizer = fresh()
    start = [p.detach().clone() for p in policy.parameters(reward_model.REWARD_MODEL)]
    s = reward_model.reward_scores(policy, *reward_model.pair_inputs(pairs, ["writer"], policy.pad_token_id_of(
        reward_model.REWARD_MODEL)))
    loss = bradley_terry_loss(s[:4], s[4:]).sum() / 4
    loss.backward()
    policy.value_heads[reward_model.REWARD_MODEL].bias.grad = None
    optimizer.step()
    expected = [p.detach().clone() for p in policy.parameters(reward_model.REWARD_MODEL)]
    assert max(float((e - p0).abs().max()) for e, p0 in zip(expected, start)) > 1e-3

    calls = []
    real = reward_model.reward_scores
    for micro in (1, 2):  # a pass of 2 rows: the first prompt's 3 rows in two parts; of 4: one pass each
        policy, optimizer = fresh()
        calls.clear()

        def counted(policy, ids, mask, pooling="mean"):
            calls.append(len(ids))
            return real(policy, ids, mask, pooling)

        monkeypatch.setattr(reward_model, "reward_scores", counted)
        stats = reward_model.reward_model_step(policy, optimizer, pairs, ["writer"], 0.0, "mean", micro_pairs=micro)
        monkeypatch.setattr(reward_model, "reward_scores", real)
        assert stats["loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
        assert stats["accuracy"] == float((s[:4] > s[4:]).float().mean())
        assert calls == ([2, 1, 2, 1, 2] if micro == 1 else [3, 2]), calls  # 5 distinct rows, never 8
        for a, b in zip(policy.parameters(reward_model.REWARD_MODEL), expected):
            torch.testing.assert_close(a.detach(), b, rtol=1e-4, atol=1e-6)
    # The accuracy scores the 5 distinct rows, 2 a pass, and compares each pair's two.
    policy, _ = fresh()
    with torch.no_grad():
        s0 = reward_model.reward_scores(policy, *reward_model.pair_inputs(pairs, ["writer"], policy.pad_token_id_of(
            reward_model.REWARD_MODEL)))
    assert reward_model.rm_accuracy(policy, pairs, ["writer"], batch=1) == float((s0[:4] > s0[4:]).float().mean())
