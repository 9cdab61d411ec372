"""llm_envs.serve.trl: one seat of a served env trained by TRL 1.16's real ``GRPOTrainer(environment_factory=...)``
on a tiny model, against a real ``llm-envs serve`` process (tests/serving.py); the adapter's episode logic under
both protocols against the same env run locally; the partners and their errors.

The tiny model is random but for one thing: its tokenizer (SmolLM2's, with a ChatML template that renders tool calls,
``trl.chat_template_utils.qwen2_5_chat_template``) holds the tool call's fixed text as two added tokens, and a few
Adam steps teach it ``<call prefix> <one of ANSWERS> <call suffix> <|im_end|>``: so it calls the tool on most
rollouts, with answers the env scores differently, and GRPO has something to learn from. Everything between the
model and the server (TRL's prompt rendering, tool-call parsing, tool loop, reward, the wire) is the real code.
"""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("trl")
pytest.importorskip("websockets")
pytest.importorskip("openenv")

from serving import running

import llm_envs
from llm_envs.serve.trl import REFERENCE, reference_answer, seat_dataset, served_seat

pytestmark = pytest.mark.usefixtures("one_thread")

MAKE_KWARGS = {"max_new_tokens": 48, "max_source_words": 12}
PARTNER_TEXT = ("However, the long article explains that the city council voted for the new bridge, moreover residents "
                "celebrated, and additionally the mayor spoke about the future plans for transport in the region.")
ANSWERS = (
    "Short.",  # under 8 words: reward 0
    "The council approved the bridge today after a long debate.",
    "The council approved the new bridge; residents celebrated the decision and the mayor spoke.",
    "The city council approved a bridge, and people were happy about the decision made by them.",
)
CALL_PREFIX = '<tool_call>\n{"name": "submit", "arguments": {"answer": "'
CALL_SUFFIX = '"}}\n</tool_call>'


def partner(agent: str, prompt_text: str) -> str:
    assert agent == "detailed" and "Create a detailed summary" in prompt_text
    return PARTNER_TEXT


def local_reward(env_id: str, seat: str, seed: int, task_index: int, actions: list[str]) -> float:
    """The seat's reward of a one-turn episode of the same parallel env run here (actions in seat order)."""
    env = llm_envs.make(env_id, **MAKE_KWARGS)
    env.reset(seed=seed, options={"task_index": task_index})
    _, rewards, *_ = env.step(dict(zip(env.possible_agents, actions, strict=True)))
    return rewards[seat]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with running("writing/xsum-v0", log_dir=tmp_path_factory.mktemp("server"), make_kwargs=MAKE_KWARGS) as s:
        yield s


@pytest.fixture(scope="module")
def tool_model_dir(served, tmp_path_factory):
    """A tiny Llama that calls ``submit`` with one of ANSWERS (the module docstring), saved with its tokenizer."""
    from tiny_models import teach_completions, tiny_model
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    from llm_envs.tokenizers import load_tokenizer

    path = tmp_path_factory.mktemp("tool-model")
    load_tokenizer(None).save_pretrained(path)  # a copy: the shared tokenizer stays as it is
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = qwen2_5_chat_template
    tok.add_tokens([CALL_PREFIX, CALL_SUFFIX, *ANSWERS])
    seat = served_seat(served.url, "brief", partner)()
    prompts = []
    for i in range(2):
        text = seat.reset(seed=i, task_index=i)
        prompts.append(tok.apply_chat_template([{"role": "user", "content": "Summarise.\n\n" + text}],
                                               tools=[seat.submit], tokenize=False, add_generation_prompt=True))
    calls = [CALL_PREFIX + answer + CALL_SUFFIX + "<|im_end|>" for answer in ANSWERS]
    model = tiny_model(tok, seed=0)
    loss = teach_completions(model, tok, [p for p in prompts for _ in calls], calls * len(prompts), steps=40,
                             lr=1e-2)
    assert loss < 0.45, loss  # the floor is log(4) / 4 = 0.35: the choice of answer, over the call's 4 tokens
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_grpo_trainer_trains_a_seat_of_a_served_env(served, tool_model_dir, tmp_path, monkeypatch):
    """Three GRPO steps of TRL's own trainer: the weights move, every reward TRL used is the served env's reward of
    the seat (recomputed here with the same env), and the server holds the episodes."""
    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    Seat = served_seat(served.url, "brief", partner, class_name="BriefSeat")
    episodes: list[dict] = []
    holder: dict = {}

    class RecordingSeat(Seat):  # TRL calls get_reward once per rollout: keep what it returned
        def get_reward(self) -> float:
            reward = super().get_reward()
            state = self.env._remote_state()
            episodes.append({"reward": reward, "answers": list(self.answers), "episode_id": self.episode_id,
                             "task_index": state["task_index"], "seed": self._seed, "session": self.env.session_id,
                             "partner": list(self.partner_answers["detailed"]),
                             "step": holder["trainer"].state.global_step})
            return reward

        def reset(self, seed=None, task_index=None, **columns):
            self._seed = seed
            return super().reset(seed=seed, task_index=task_index, **columns)

    args = GRPOConfig(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=48, max_tool_calling_iterations=1, learning_rate=1e-4, beta=0.0,
                      logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, seed=0)
    trainer = GRPOTrainer(model=tool_model_dir, args=args, environment_factory=RecordingSeat,
                          train_dataset=Dataset.from_list(seat_dataset(6, instruction="Summarise.\n\n")))
    holder["trainer"] = trainer
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()

    moved = [k for k, v in trainer.model.named_parameters() if not torch.equal(v.detach(), before[k])]
    assert moved, "no parameter changed"
    assert [e["step"] for e in episodes] == [0] * 4 + [1] * 4 + [2] * 4  # 3 steps x 4 rollouts
    answered = [e for e in episodes if e["answers"]]
    assert len(answered) >= 6, episodes
    for e in answered:
        assert e["answers"][0] in ANSWERS and e["partner"] == [PARTNER_TEXT]
        expected = local_reward("writing/xsum-v0", "brief", e["seed"], e["task_index"],
                                [e["answers"][0], PARTNER_TEXT])
        assert e["reward"] == pytest.approx(expected), e
    rewards = [e["reward"] for e in episodes]
    assert all(math.isfinite(r) for r in rewards) and len(set(rewards)) > 1, rewards
    # TRL's logged env reward of each step is the mean of that step's four get_reward() values.
    logged = [row["rewards/RecordingSeat/mean"] for row in trainer.state.log_history
              if "rewards/RecordingSeat/mean" in row]
    assert logged == pytest.approx([sum(rewards[i:i + 4]) / 4 for i in range(0, 12, 4)])
    # The server holds each pooled instance's last episode: its id, problem and (answered) the seat's reward.
    pool = trainer._environment_pool[None]
    last = {e["session"]: e for e in episodes}
    assert len(pool) == 4  # TRL's probe instance and three more, each reused every step: four sessions
    for instance in pool:
        state = served.get(f"/state?session_id={instance.env.session_id}")
        e = last[instance.env.session_id]
        assert state["episode_id"] == e["episode_id"] and state["task_index"] == e["task_index"]
        if e["answers"]:
            assert state["history"][-1]["agent_rewards"]["brief"] == pytest.approx(e["reward"])
            assert state["history"][-1]["outputs"]["brief"]["text"] == e["answers"][0]
        else:
            assert state["history"] == []
    assert len({e["episode_id"] for e in episodes}) == 12


def test_the_seat_under_both_protocols_matches_the_env_run_here(tmp_path):
    """Sequential: the seat after the partner sees the partner's answer; a two-turn episode's reward is the sum of
    its turns; the tool refuses a third answer. Parallel: the prompt has no chat template; no answer, no reward."""
    kwargs = {**MAKE_KWARGS, "num_turns": 2}
    with running("writing/xsum-sequential-v0", log_dir=tmp_path, make_kwargs=kwargs) as s:
        seat = served_seat(s.url, "detailed", partner=lambda agent, text: ANSWERS[1])()
        prompt = seat.reset(seed=4, task_index=3, prompt=[{"role": "user", "content": "ignored"}])
        assert prompt.startswith("Create a detailed summary") and ANSWERS[1] in prompt and "<|im_start|>" not in prompt
        reply = seat.submit(PARTNER_TEXT)
        assert "Your next prompt:" in reply and not seat.done
        assert "Submitted. The episode is over" in seat.submit(PARTNER_TEXT + " Moreover, it rained.")
        assert seat.done and seat.partner_answers == {"brief": [ANSWERS[1], ANSWERS[1]]}
        env = llm_envs.make("writing/xsum-sequential-v0", **kwargs)
        env.reset(seed=4, options={"task_index": 3})
        total = 0.0
        for action in (ANSWERS[1], PARTNER_TEXT, ANSWERS[1], PARTNER_TEXT + " Moreover, it rained."):
            env.step(action)
            total += env.rewards["detailed"]
        assert total > 0 and seat.get_reward() == pytest.approx(total)
        with pytest.raises(RuntimeError, match="episode is over"):
            seat.submit("again")
        # The same instance, reused for the next episode (as TRL's pool does): the same session.
        session = seat.env.session_id
        seat.reset(seed=5, task_index=0)
        assert seat.env.session_id == session and seat.answers == [] and seat.get_reward() == 0.0
        assert s.get(f"/state?session_id={session}")["task_index"] == 0


def test_partners_and_their_errors(served):
    with pytest.raises(ValueError, match=r"carry no reference answer.*\['index', 'source'\]"):
        served_seat(served.url, "brief", REFERENCE)().reset(seed=0)
    with pytest.raises(ValueError, match="pass partner="):
        served_seat(served.url, "brief")().reset(seed=0)
    with pytest.raises(ValueError, match="has no seat 'writer'"):
        served_seat(served.url, "writer", partner)().reset(seed=0)
    with pytest.raises(ValueError, match="tool_name"):
        served_seat(served.url, "brief", partner, tool_name="get_reward")
    with pytest.raises(TypeError, match="returned int"):
        seat = served_seat(served.url, "brief", {"detailed": lambda agent, text: 3})()
        seat.reset(seed=0)
        seat.submit(ANSWERS[1])
    humaneval = {"prompt": "def f():\n", "canonical_solution": "    return 1\n"}
    assert reference_answer(humaneval) == "def f():\n    return 1\n"
    assert reference_answer({"question": "q", "answer": "2 + 2 = 4\n#### 4"}).endswith("#### 4")
    # A renamed tool with its own description: the only public method TRL turns into a tool.
    Seat = served_seat(served.url, "brief", partner, tool_name="answer_as_brief", tool_description="Answer, {seat}.")
    import inspect

    public = [n for n, _ in inspect.getmembers(Seat, inspect.isfunction) if not n.startswith("_")]
    assert sorted(public) == ["answer_as_brief", "get_reward", "reset"]
    assert Seat.answer_as_brief.__doc__.startswith("Answer, brief.")
    from transformers.utils import get_json_schema

    schema = get_json_schema(Seat().answer_as_brief)
    assert schema["function"]["name"] == "answer_as_brief"
    assert json.dumps(schema["function"]["parameters"]["required"]) == '["answer"]'
    # A very long answer is cut to max_new_tokens ids (the env would refuse the text).
    seat = Seat()
    seat.reset(seed=1, task_index=1)
    seat.answer_as_brief("word " * 400)
    assert len(seat.env.history[0].outputs["brief"].ids) == MAKE_KWARGS["max_new_tokens"]
