"""MARLHF's shared offline fits (``rm_cache``): a run that finds its fit's entry loads the pairs, the
reward model, the fit's metrics and the random state, and then runs exactly as the run that wrote the
entry; runs that differ only in the RL stage share an entry, any other setting makes a new one; a
damaged or foreign entry is an error, never a silent refit."""

from __future__ import annotations

import dataclasses
import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from baselines.infra.checkpoints import find_checkpoint
from baselines.infra.metrics import read_metrics
from baselines.learners import marlhf
from baselines.rl import reward_model
from baselines.rl import reward_model_cache as rm_cache

TIMINGS = ("charts/s_per_iteration", "charts/rollout_fraction")


def config(model_dir: str, tmp_path, name: str, **overrides) -> marlhf.Config:
    settings = dict(
        model=model_dir, max_source_words=20, num_iterations=2, num_problems=2, num_candidates=3, num_prompts=3,
        max_new_tokens=12, temperature=1.0, top_p=1.0, top_k=0, learning_rate=1e-2, lora_rank=4, lora_alpha=8.0,
        num_eval_problems=0, output_dir=str(tmp_path), run_name=name, checkpoint_every=0, tensorboard=False,
        progress=False, rm_cache=str(tmp_path / "cache"), rm_holdout=0.34, rm_validation=0.0,
    )
    settings.update(overrides)
    return marlhf.Config(**settings)


def metrics(run_dir) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMINGS} for row in read_metrics(run_dir / "metrics.jsonl")]


def weights(run_dir) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    root = find_checkpoint(run_dir) / "policy"
    return {f"{p.name}/{k}": v for p in sorted(root.glob("*.safetensors")) for k, v in load_file(str(p)).items()}


def entries(tmp_path) -> list:
    return sorted(p for p in (tmp_path / "cache").iterdir() if not p.name.startswith("."))


def test_a_run_that_finds_its_fit_runs_exactly_as_the_run_that_wrote_it(tiny_model_dir, tmp_path, monkeypatch,
                                                                        varied_writing_reward):
    first = config(tiny_model_dir, tmp_path, "first")
    marlhf.main(first)
    (entry,) = entries(tmp_path)
    assert {p.name for p in entry.iterdir()} == {"fit.json", "pairs_000000.pt", "policy", "rng.pt"}
    record = json.loads((entry / "fit.json").read_text())
    assert 0 <= record["stats"]["pref/rm_heldout_accuracy"] <= 1

    def no_collection(*args, **kwargs):
        raise AssertionError("a cached fit collects nothing")

    monkeypatch.setattr(marlhf, "collect_offline", no_collection)
    again = config(tiny_model_dir, tmp_path, "again")
    marlhf.main(again)
    assert metrics(again.run_dir()) == metrics(first.run_dir())
    theirs, ours = weights(first.run_dir()), weights(again.run_dir())
    assert theirs.keys() == ours.keys() and all(torch.equal(theirs[k], ours[k]) for k in theirs)
    pairs = again.run_dir() / "preference" / "pairs_000000.pt"
    assert pairs.read_bytes() == (first.run_dir() / "preference" / "pairs_000000.pt").read_bytes()

    # Another RL learning rate: the same entry (nothing collected), other agent weights, the same reward model.
    faster = config(tiny_model_dir, tmp_path, "faster", learning_rate=3e-2)
    result = marlhf.main(faster)
    assert entries(tmp_path) == [entry]
    assert result["pref/rm_heldout_accuracy"] == record["stats"]["pref/rm_heldout_accuracy"]
    moved = weights(faster.run_dir())
    rm = [k for k in moved if k.startswith(f"{reward_model.REWARD_MODEL}.")]
    assert rm and all(torch.equal(moved[k], theirs[k]) for k in rm)
    assert any(not torch.equal(moved[k], theirs[k]) for k in moved if k.startswith("brief."))


def test_the_key_holds_every_setting_of_the_fit_and_none_of_the_rl_stage(tiny_model_dir, tmp_path):
    from agents import MultiAgentPolicy

    policy = MultiAgentPolicy.from_pretrained(["brief", "detailed", reward_model.REWARD_MODEL], tiny_model_dir,
                                              value_head=True)
    base = config(tiny_model_dir, tmp_path, "run")
    key = rm_cache.fit_key(base, policy)
    assert key["settings"]["seed"] == 0 and "learning_rate" not in key["settings"] and key["code"]
    for field in sorted(rm_cache.RL_STAGE_FIELDS):  # every RL-stage setting is a real field
        assert field in {f.name for f in dataclasses.fields(marlhf.Config)}, field
    same = {"learning_rate": 1.0, "num_iterations": 7, "baseline": "rloo", "run_name": "x", "num_eval_problems": 3}
    assert rm_cache.fit_key(dataclasses.replace(base, **same), policy) == key
    for field, value in {"seed": 1, "rm_epochs": 2, "rm_learning_rate": 1e-2, "num_prompts": 4,
                         "rm_pooling": "last", "temperature": 0.5, "max_source_words": 30}.items():
        assert rm_cache.fit_key(dataclasses.replace(base, **{field: value}), policy) != key, field


def test_a_damaged_or_foreign_entry_is_an_error_naming_it(tiny_model_dir, tmp_path, varied_writing_reward):
    first = config(tiny_model_dir, tmp_path, "first", num_iterations=1)
    marlhf.main(first)
    (entry,) = entries(tmp_path)
    record = json.loads((entry / "fit.json").read_text())
    record["key"]["settings"]["seed"] = 99
    (entry / "fit.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="written for another fit"):
        marlhf.main(dataclasses.replace(first, run_name="foreign"))
    (entry / "fit.json").write_text("{not json")
    with pytest.raises(ValueError, match=f"corrupt reward-model cache entry {entry}"):
        marlhf.main(dataclasses.replace(first, run_name="corrupt"))
    with pytest.raises(ValueError, match="rm_cache shares an offline fit"):
        config(tiny_model_dir, tmp_path, "x", iterative=True)
