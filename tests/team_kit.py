"""What the team tests share (tests/test_teams.py, tests/test_team_critics.py): the tokenizers, the tiny
models built for them, their model directories, and the learner runs' settings and checks.

The team: a tiny Llama over SmolLM2's default tokenizer (49152 ids) and a tiny Qwen2 over a byte-level
BPE tokenizer trained here (300 ids; its model directory loads it as Qwen2's tokenizer, one id more),
both built from config. The fixtures on them are in tests/conftest.py: ``team_toks`` (the two
tokenizers), ``team_dirs`` (their models' directories, built once a session) and ``one_thread``.
"""

from __future__ import annotations

import math

import tiny_models
import torch

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


def cory_of_two_tokenizers(model_dirs, tmp_path, name: str, **overrides):
    """CORY with ``model_0`` a Llama over SmolLM2's tokenizer and ``model_1`` a Qwen2 over the BPE one,
    swapping roles every iteration."""
    from baselines.learners import cory

    settings = dict(model=model_dirs["llama"], agent_models=(f"model_1={model_dirs['qwen']}",),
                    agent_settings=("model_1.temperature=0.7",), batch_size=2, minibatch_size=2, num_ppo_epochs=1,
                    min_new_tokens=3, max_new_tokens=6, swap_every=1)
    return cory.Config(**learner_settings(tmp_path, name, **{**settings, **overrides}))


def contains(row: list[int], part: list[int]) -> bool:
    return any(row[i : i + len(part)] == part for i in range(len(row) - len(part) + 1))
