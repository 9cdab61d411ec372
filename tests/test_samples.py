"""Transcripts (``<run>/samples.jsonl``): what evaluations and logged training batches write, that it
agrees with the env and the metrics, its TensorBoard text and W&B table, CORY's role map, and resume."""

from __future__ import annotations

import json
import sys
import types

import numpy as np
import pytest
from test_magrpo import tiny_config

import llm_envs
from baselines.infra.metrics import read_metrics
from baselines.infra.samples import SAMPLES_FILE, TRAIN_EPISODES, SampleWriter, markdown, read_samples, table
from baselines.learners import cory, magrpo


class FakeWandb(types.ModuleType):
    """Stands in for ``wandb`` (not a dependency): records what MetricLogger sends."""

    def __init__(self) -> None:
        super().__init__("wandb")
        self.logged: list[tuple[dict, int]] = []

    def init(self, **kwargs):
        run = types.SimpleNamespace(log=lambda values, step: self.logged.append((values, step)), finish=lambda: None)
        return run

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = columns, data


def test_magrpo_run_writes_eval_and_train_transcripts(tiny_model_dir, tmp_path, monkeypatch, varied_writing_reward):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    config = tiny_config(tiny_model_dir, tmp_path, num_eval_problems=2, eval_every=1, samples_every=2,
                         tensorboard=True, wandb_project="test")
    magrpo.main(config)
    run_dir = config.run_dir()
    records = read_samples(run_dir / SAMPLES_FILE)
    evals = [r for r in records if r["kind"] == "eval"]
    assert [(r["iteration"], r["phase"], r["task_index"]) for r in evals] == [
        (0, "before", 0), (0, "before", 1), (1, "during", 0), (1, "during", 1), (2, "after", 0), (2, "after", 1)
    ]
    train = [r for r in records if r["kind"] == "train"]
    assert [r["iteration"] for r in train] == [2] * min(TRAIN_EPISODES, config.num_problems * config.num_generations)

    metrics: dict[int, dict] = {}
    for row in read_metrics(run_dir / "metrics.jsonl"):  # step 2 has a training line and the final eval's
        metrics.setdefault(row["step"], {}).update(row)
    for step in (0, 1, 2):
        these = [r for r in evals if r["iteration"] == step]
        assert np.mean([r["reward"] for r in these]) == pytest.approx(metrics[step]["eval/total"])
        for name in these[0]["components"]:
            assert np.mean([r["components"][name] for r in these]) == pytest.approx(metrics[step][f"eval/{name}"])
    # Every episode of the 2 x 2 batch was written: their mean is the batch's logged reward.
    assert np.mean([r["reward"] for r in train]) == pytest.approx(metrics[2]["reward/total"])

    env = llm_envs.make(config.env, **config.env_kwargs())
    for r in evals[:2] + train[:1]:
        (turn,) = r["turns"]
        env.reset(seed=r["seed"], options={"task_index": r["task_index"], "split": r["split"]})
        assert turn["prompts"] == {a: env.text(a) for a in env.possible_agents}
        assert set(turn["responses"]) == {"brief", "detailed"} and r["models"] == {"brief": "brief",
                                                                                   "detailed": "detailed"}
        assert r["reward"] == turn["reward"] == r["return"] and r["split"] in ("eval", "train")
    # Greedy evaluation is deterministic: the same problem gives the same responses before and during
    # training only if the adapters did not change; they did (learning_rate 1e-2), at least somewhere.
    assert any(a["turns"][0]["responses"] != b["turns"][0]["responses"] for a, b in zip(evals[:2], evals[4:]))

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"))
    acc.Reload()
    tags = acc.Tags()["tensors"]
    assert "samples/eval/text_summary" in tags and "samples/train/text_summary" in tags
    text = acc.Tensors("samples/eval/text_summary")[-1].tensor_proto.string_val[0].decode()
    # The summary holds every eval response of the step; a sampled response may be empty (EOS first).
    lines = [r.splitlines()[0][:20] for r in evals[-1]["turns"][0]["responses"].values() if r.strip()]
    assert all(line in text for line in lines) and "brief" in text and "detailed" in text

    tables = [(values, step) for values, step in fake.logged if any(k.startswith("samples/") for k in values)]
    assert [(next(iter(v)), s) for v, s in tables] == [
        ("samples/eval", 0), ("samples/eval", 1), ("samples/train", 2), ("samples/eval", 2)
    ]
    final = tables[-1][0]["samples/eval"]
    assert "response/brief" in final.columns and len(final.data) == 2
    row = dict(zip(final.columns, final.data[1]))
    assert row["response/detailed"] == evals[-1]["turns"][0]["responses"]["detailed"]


def test_cory_samples_say_which_model_played_each_role(tiny_model_dir, tmp_path):
    config = cory.Config(model=tiny_model_dir, batch_size=2, minibatch_size=2, num_ppo_epochs=1, min_new_tokens=3,
                         max_new_tokens=3, num_iterations=2, swap_every=1, num_eval_problems=1, samples_every=1,
                         lora_rank=4, output_dir=str(tmp_path), run_name="cory", tensorboard=False, progress=False)
    cory.main(config)
    records = read_samples(config.run_dir())
    models = [(r["kind"], r["iteration"], r["models"]["pioneer"]) for r in records]
    assert models == [
        ("eval", 0, "model_0"),
        ("train", 1, "model_0"), ("train", 1, "model_0"),
        ("train", 2, "model_1"), ("train", 2, "model_1"),
        ("eval", 2, "model_1"),  # the roles of the last trained iteration
    ]
    for r in records:
        (turn,) = r["turns"]
        assert r["models"]["observer"] != r["models"]["pioneer"]
        assert turn["responses"]["pioneer"] in turn["prompts"]["observer"]  # the observer read the pioneer
        assert set(turn["agent_rewards"]) == {"pioneer", "observer"}


def record(iteration: int, kind: str = "eval") -> dict:
    turn = {"prompts": {"a": "p"}, "responses": {"a": f"r{iteration}"}, "reward": 1.0, "components": {"x": 1.0},
            "agent_rewards": {"a": 1.0}, "feedback": {}}
    return {"split": "eval", "seed": 0, "task_index": 0, "episode": 0, "env": "e", "models": {"a": "a"},
            "turns": [turn], "reward": 1.0, "components": {"x": 1.0}, "return": 1.0}


def test_writer_phases_resume_and_bad_files(tmp_path):
    writer = SampleWriter(tmp_path, num_iterations=4, train_every=2)
    assert [writer.phase(i) for i in (0, 1, 3, 4)] == ["before", "during", "during", "after"]
    assert [writer.wants_train(i) for i in (1, 2, 3, 4)] == [False, True, False, True]
    for i in range(4):
        writer.write_eval(i, [record(i)])
    assert [r["iteration"] for r in read_samples(tmp_path)] == [0, 1, 2, 3]
    SampleWriter(tmp_path, num_iterations=4, resume_step=2)  # a resumed run drops what came after its checkpoint
    assert [r["iteration"] for r in read_samples(tmp_path)] == [0, 1, 2]
    SampleWriter(tmp_path, num_iterations=4)  # a new run starts afresh
    assert not (tmp_path / SAMPLES_FILE).exists()
    with pytest.raises(ValueError, match="train_every must be an int >= 0, got -1"):
        SampleWriter(tmp_path, num_iterations=4, train_every=-1)
    path = tmp_path / SAMPLES_FILE
    path.write_text(json.dumps({"iteration": 0, "turns": []}) + "\n" + '{"iteration": 1, "tu')
    assert len(read_samples(path)) == 1  # a torn last line (killed run) is skipped
    path.write_text('{"iteration": 0}\n{"iteration": 1, "turns": []}\n')
    with pytest.raises(ValueError, match="samples.jsonl:1 is not a sample record"):
        read_samples(path)
    with pytest.raises(FileNotFoundError, match="samples file"):
        read_samples(tmp_path / "nope")


def test_markdown_and_table_of_records():
    lines = [{"kind": "eval", "phase": "after", "iteration": 3, **record(3)}]
    lines[0]["models"] = {"a": "model_1"}
    text = markdown(lines)
    assert "### eval (after) · task 0 · episode 0 · seed 0 · reward 1.000" in text
    assert "**a (model_1)**:\n\n    r3" in text and "x 1.000" in text
    columns, rows = table(lines)
    assert dict(zip(columns, rows[0])) == {
        "iteration": 3, "kind": "eval", "phase": "after", "task_index": 0, "seed": 0, "episode": 0, "reward": 1.0,
        "components": '{"x": 1.0}', "model/a": "model_1", "prompt/a": "p", "response/a": "r3",
    }
