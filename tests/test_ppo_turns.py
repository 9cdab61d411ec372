"""PPO and CORY on multi-turn episodes: each turn's reward on its last token, GAE across the turns of an
agent's episode (checked by hand on a tiny 2-turn example), each turn scored on its own prompt, rewards
credited to the turns that earned them, the observer seeing the pioneer's response of the same turn,
and 2-turn smoke runs (PPO on a coding env, CORY on a sequential writing env) that train and log finite
metrics."""

from __future__ import annotations

import dataclasses
import math
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pytest
import torch
from test_magrpo import adapter_state
from test_ppo import tiny_ppo, value_heads

import llm_envs
from agents.generation import Generation
from baselines.infra.metrics import read_metrics
from baselines.infra.play import episode_turns, play_episodes
from baselines.infra.samples import read_samples
from baselines.learners import cory, ppo
from baselines.rl.experience import gae, make_experience, token_rewards, turn_ends


def generation(prompt: list[int], response: list[int], mask: list[int]) -> Generation:
    return Generation(
        agent="agent", num_samples=1, prompt_ids=torch.tensor([prompt]), prompt_mask=torch.ones(1, len(prompt)),
        response_ids=torch.tensor([response]), response_mask=torch.tensor([mask]),
        logprobs=torch.zeros(1, len(response)),
    )


class ScriptedPolicy:
    """Log-probs, values and reference log-probs per turn (told apart by the prompt's first id), and a
    record of the prompts each forward saw."""

    def __init__(self, per_turn: dict[int, tuple[list[float], list[float], list[float]]]) -> None:
        self.per_turn = per_turn
        self.prompts: list[list[int]] = []

    def forward(self, model, prompt_ids, prompt_mask, response_ids, response_mask, with_values, temperature):
        self.prompts.append(prompt_ids[0].tolist())
        logprobs, values, _ = self.per_turn[int(prompt_ids[0, 0])]
        return torch.tensor([logprobs]), torch.tensor([values])

    def ref_logprobs(self, model, prompt_ids, prompt_mask, response_ids, response_mask, temperature):
        return torch.tensor([self.per_turn[int(prompt_ids[0, 0])][2]])

    def score(self, model, prompt_ids, prompt_mask, response_ids, response_mask, *, with_values, with_reference,
              temperature):
        """MultiAgentPolicy.score: the policy's log-probs and values and the reference's, in one call."""
        args = (model, prompt_ids, prompt_mask, response_ids, response_mask)
        logprobs, values = self.forward(*args, with_values=with_values, temperature=temperature)
        return logprobs, values, self.ref_logprobs(*args, temperature=temperature) if with_reference else None


def test_two_turn_advantages_by_hand():
    """Turn 0: 2 response tokens (padded to 3), turn 1: 1 token (padded to 2); laid end to end the mask is
    [1, 1, 0, 1, 0]. kl_coef 0.5, log pi - log ref = 0.2, 0.4 | 0.2; rewards 1.0 (turn 0) and 2.0 (turn 1);
    values 0.5, 0.6 | 0.7 (the 9s sit on pads); gamma 0.9, lambda 0.8.

    Token rewards: -0.5 * kl, plus each turn's reward on its last token: [-0.1, -0.2 + 1, 0, -0.1 + 2, 0].
    GAE backwards over the real tokens (the pad between the turns is skipped):
      t3: 1.9 + 0.9 * 0 - 0.7 = 1.2 -> A3 = 1.2
      t1: 0.8 + 0.9 * 0.7 - 0.6 = 0.83 -> A1 = 0.83 + 0.9 * 0.8 * 1.2 = 1.694 (turn 0 bootstraps from turn 1)
      t0: -0.1 + 0.9 * 0.6 - 0.5 = -0.06 -> A0 = -0.06 + 0.72 * 1.694 = 1.15968
    Returns A + V: 1.65968, 2.294, 1.9."""
    turns = [generation([7, 8], [11, 12, 0], [1, 1, 0]), generation([9, 8, 5, 6], [13, 0], [1, 0])]
    policy = ScriptedPolicy({
        7: ([-1.0, -1.0, 0.0], [0.5, 0.6, 9.0], [-1.2, -1.4, 0.0]),
        9: ([-1.0, 0.0], [0.7, 9.0], [-1.2, 0.0]),
    })
    config = ppo.Config(gamma=0.9, lam=0.8, whiten_advantages=False)
    exp = make_experience(policy, "agent", turns, torch.tensor([[1.0, 2.0]]), 0.5, config)
    mask = torch.tensor([[1, 1, 0, 1, 0]])
    assert torch.equal(exp.response_mask, mask) and exp.scores.tolist() == [[1.0, 2.0]]
    torch.testing.assert_close(exp.kl, torch.tensor([[0.2, 0.4, 0.0, 0.2, 0.0]]))
    torch.testing.assert_close(exp.advantages, torch.tensor([[1.15968, 1.694, 0.0, 1.2, 0.0]]))
    torch.testing.assert_close(exp.returns, torch.tensor([[1.65968, 2.294, 0.0, 1.9, 0.0]]))
    torch.testing.assert_close(exp.old_values, torch.tensor([[0.5, 0.6, 9.0, 0.7, 9.0]]))
    # Each turn was scored on its own prompt (the value head reads the turn's prompt with its feedback).
    assert policy.prompts == [[7, 8], [9, 8, 5, 6]]
    # The same numbers from the pure functions.
    rewards, _ = token_rewards(torch.tensor([[1.0, 2.0]]), exp.old_logprobs, torch.tensor([[-1.2, -1.4, 0, -1.2, 0]]),
                               mask, 0.5, turn_ends([t.response_mask for t in turns]))
    torch.testing.assert_close(rewards, torch.tensor([[-0.1, 0.8, 0.0, 1.9, 0.0]]))
    adv, _ = gae(rewards, exp.old_values, mask, 0.9, 0.8)
    torch.testing.assert_close(adv, exp.advantages)


def test_one_turn_is_the_single_turn_computation():
    """Laying out one turn changes nothing: the (N,) scores of a single Generation give what (N, 1) give."""
    turn = generation([7, 8], [11, 12, 0], [1, 1, 0])
    policy = ScriptedPolicy({7: ([-1.0, -1.0, 0.0], [0.5, 0.6, 9.0], [-1.2, -1.4, 0.0])})
    config = ppo.Config(gamma=0.9, lam=0.8)
    single = make_experience(policy, "agent", turn, torch.tensor([1.0]), 0.5, config)
    listed = make_experience(policy, "agent", [turn], torch.tensor([[1.0]]), 0.5, config)
    assert torch.equal(single.advantages, listed.advantages) and torch.equal(single.returns, listed.returns)
    with pytest.raises(ValueError, match="scores of 2 turn"):
        make_experience(policy, "agent", turn, torch.tensor([[1.0, 2.0]]), 0.5, config)
    with pytest.raises(ValueError, match="rows \\[0\\] of turn 1 are empty"):
        turn_ends([torch.tensor([[1]]), torch.tensor([[0, 0]])])


def test_episode_turns_credit_each_turns_reward():
    # Parallel protocol: every role acts and is rewarded at each step (turn).
    steps = [{"a": "a0", "b": "b0"}, {"a": "a1", "b": "b1"}]
    rewards = [{"a": np.array([1.0, 2.0]), "b": np.array([1.0, 2.0])},
               {"a": np.array([3.0, 4.0]), "b": np.array([5.0, 6.0])}]
    turns = episode_turns(steps, rewards)
    assert [g for g, _ in turns["a"]] == ["a0", "a1"]
    assert [r.tolist() for _, r in turns["b"]] == [[1.0, 2.0], [5.0, 6.0]]
    # A reward that arrives before a role has acted goes to its first turn.
    turns = episode_turns([{"a": "a0"}, {"b": "b0"}], [{"a": np.zeros(1), "b": np.ones(1)},
                                                        {"a": np.ones(1), "b": np.ones(1)}])
    assert [float(r[0]) for _, r in turns["b"]] == [2.0] and [float(r[0]) for _, r in turns["a"]] == [1.0]
    with pytest.raises(ValueError, match="1 steps' rewards for 2 steps"):
        episode_turns(steps, rewards[:1])


def test_observer_sees_the_pioneers_response_of_the_same_turn(tiny_model_dir):
    """Two turns under the sequential protocol: at each turn the second role's prompt holds the first
    role's response of that turn, token for token, and the second turn's prompts hold the feedback."""
    from agents import LoraSettings, MultiAgentPolicy

    torch.manual_seed(0)
    policy = MultiAgentPolicy.from_pretrained(["brief", "detailed"], tiny_model_dir, lora=LoraSettings(rank=4),
                                              mixed_batches=False)
    venv = llm_envs.make_vec("writing/xsum-v0", 2, protocol="sequential", num_turns=2, max_new_tokens=6,
                             tokenizer=tiny_model_dir, max_source_words=20, stop_token_ids=list(policy.eos_token_ids))
    step_rewards: list = []
    steps, returns, _ = play_episodes(policy, venv, seeds=0, options=[{"task_index": 1}] * 2, action_length=6,
                                      max_new_tokens=6, step_rewards=step_rewards)
    turns = episode_turns(steps, step_rewards)
    assert [len(turns[r]) for r in ("brief", "detailed")] == [2, 2]
    for k in range(2):
        pioneer, observer = turns["brief"][k][0], turns["detailed"][k][0]
        for row in range(2):
            said = pioneer.response_ids[row][pioneer.response_mask[row].bool()].tolist()
            if said and said[-1] in policy.eos_token_ids:
                said = said[:-1]  # the env ends the response at the stop token and keeps it out
            prompt = observer.prompt_ids[row][observer.prompt_mask[row].bool()].tolist()
            assert said and any(prompt[i : i + len(said)] == said for i in range(len(prompt))), (k, row)
    # Turn rewards add up to the returns; the second turn's prompt is longer: it holds the feedback.
    for role in ("brief", "detailed"):
        np.testing.assert_allclose(sum(r for _, r in turns[role]), returns[role])
        assert turns[role][1][0].prompt_ids.shape[1] > turns[role][0][0].prompt_ids.shape[1]
    text = venv.envs[0].transcript_turns()[1]["prompts"]["brief"]
    assert "feedback" in text.lower() or "previous" in text.lower()


def test_two_turn_ppo_smoke_on_a_coding_env(tiny_model_dir, tmp_path, env_kwargs_for):
    """PPO on 2-turn episodes of a HumanEval-style coding env (the hub fixture of coophumaneval): both
    agents' adapters and value heads train, every metric is finite, each episode has two turns and the
    second turn's prompts hold the env's feedback on the first."""
    config = tiny_ppo(tiny_model_dir, tmp_path, env="coding/coophumaneval-v0", num_turns=2, num_iterations=2,
                      batch_size=2, minibatch_size=1, min_new_tokens=6, max_new_tokens=6, num_eval_problems=1,
                      samples_every=1, **env_kwargs_for("coding/coophumaneval-v0"))
    result = ppo.main(config)
    rows = read_metrics(config.run_dir() / "metrics.jsonl")
    train_rows = [r for r in rows if "charts/iteration" in r]
    assert [r["step"] for r in train_rows] == [1, 2]
    for row in rows:
        assert all(math.isfinite(v) for v in row.values()), row
    adapters, heads = adapter_state(config.run_dir()), value_heads(config.run_dir())
    assert sorted(adapters) == sorted(heads) == ["helper", "main"]
    for agent in ("helper", "main"):
        assert any(t.abs().sum() > 0 for k, t in adapters[agent].items() if "lora_B" in k)
        # Tokens of both turns are trained: more than one turn's worth of response tokens per episode.
        assert train_rows[0][f"agent_{agent}/response_tokens"] > 6
    episodes = [r for r in read_samples(config.run_dir() / "samples.jsonl") if r["kind"] == "train"]
    assert episodes and all(len(r["turns"]) == 2 for r in episodes)
    assert all("Score:" in r["turns"][1]["prompts"]["main"] for r in episodes)
    assert "eval/total" in result and "eval_before/total" in result


@pytest.fixture
def sequential_writing_id(monkeypatch):
    """A sequential two-role, multi-turn id for CORY (registered for this test only)."""
    from llm_envs.core import registry
    from llm_envs.tasks.writing import WritingTask

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    env_id = "writing/xsum-sequential-v0"
    llm_envs.register(env_id, WritingTask, protocol="sequential", description="test only", source="xsum")
    return env_id


def test_two_turn_cory_smoke(tiny_model_dir, tmp_path, sequential_writing_id):
    """CORY on 2-turn episodes: both models train (one swap), metrics are finite, and in the transcripts
    the observer's prompt of each turn holds the pioneer's response of that turn."""
    settings = dataclasses.asdict(tiny_ppo(tiny_model_dir, tmp_path, run_name="cory2"))
    settings.update(env=sequential_writing_id, num_turns=2, max_source_words=20, num_iterations=2, batch_size=2,
                    minibatch_size=2, num_eval_problems=1, samples_every=1)
    config = cory.Config(**settings, swap_every=1)
    cory.main(config)
    rows = [r for r in read_metrics(config.run_dir() / "metrics.jsonl") if "charts/iteration" in r]
    assert [r["agent_model_0/role"] for r in rows] == [0.0, 1.0]
    for row in rows:
        assert all(math.isfinite(v) for v in row.values()), row
    for model in cory.MODELS:
        assert any(t.abs().sum() > 0 for k, t in adapter_state(config.run_dir())[model].items() if "lora_B" in k)
    episodes = [r for r in read_samples(config.run_dir() / "samples.jsonl") if r["kind"] == "train"]
    assert episodes
    for record in episodes:
        assert len(record["turns"]) == 2
        for turn in record["turns"]:
            said = turn["responses"]["brief"].strip()
            assert said and said in turn["prompts"]["detailed"]
