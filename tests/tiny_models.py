"""Tiny causal LMs built in-process over the real default tokenizer (49k vocab: still a few MB)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def tiny_model(tokenizer: Any, seed: int = 0, extra_eos: Iterable[int] = ()) -> Any:
    """A 2-layer Llama with random weights, in eval mode, on :func:`testing_device` (the CPU unless the
    suite runs with ``--device``).

    A random model emits EOS about once in 49k tokens; ``extra_eos`` declares a band of ids as EOS for
    generation, so responses end at different lengths (the masks matter) and rewards differ within a group.
    """
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    model = AutoModelForCausalLM.from_config(config)
    extra = list(extra_eos)
    if extra:
        model.generation_config.eos_token_id = [tokenizer.eos_token_id, *extra]
    return model.to(testing_device()).eval()


def byte_bpe(vocab_size: int, corpus: Iterable[str], chat_template: str | None = None) -> Any:
    """A byte-level BPE tokenizer of ``vocab_size`` ids trained in process on ``corpus`` (pad ``<pad>``,
    EOS ``<eos>``, left padding): another vocabulary than SmolLM2's for teams of tokenizers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    raw.train_from_iterator(list(corpus), trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<eos>")
    tok.padding_side = "left"
    if chat_template is not None:
        tok.chat_template = chat_template
    return tok


def testing_device() -> Any:
    """The torch device of the device-sensitive tests: ``pytest --device cuda`` (or ``LLM_ENVS_TEST_DEVICE``);
    the CPU by default. Tiny models are built there, and the tests compare on it."""
    import os

    import torch

    return torch.device(os.environ.get("LLM_ENVS_TEST_DEVICE") or "cpu")


testing_device.__test__ = False  # not a test, though the test files that import it would collect it as one


def teach_completions(model: Any, tokenizer: Any, prompts: Iterable[str], completions: Iterable[str], *,
                      steps: int = 60, lr: float = 1e-2, seed: int = 0) -> float:
    """Teacher-force ``model`` (in place, then back in eval mode) to answer each prompt text with its completion
    text: Adam on the completion tokens' cross-entropy, every pair in each step (logits of the completions only).
    What a random tiny model needs to emit a fixed format (a tool call) for a test; returns the last step's loss."""
    import torch

    torch.manual_seed(seed)
    pairs = [(tokenizer(p, add_special_tokens=False)["input_ids"], tokenizer(c, add_special_tokens=False)["input_ids"])
             for p, c in zip(prompts, completions, strict=True)]
    width = max(len(p) + len(c) for p, c in pairs)
    tail = max(len(c) for _, c in pairs)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = next(model.parameters()).device
    ids = torch.full((len(pairs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    labels = torch.full((len(pairs), tail), -100, dtype=torch.long)
    for row, (p, c) in enumerate(pairs):  # left padding, as generation sees the prompts
        ids[row, width - len(p) - len(c):] = torch.tensor(p + c)
        mask[row, width - len(p) - len(c):] = 1
        labels[row, tail - len(c):] = torch.tensor(c)
    ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # as generate() numbers left-padded rows
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    loss = torch.zeros(())
    for _ in range(steps):
        optimizer.zero_grad()
        # The logits that predict the last ``tail`` tokens: positions width-tail-1 .. width-2.
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=tail + 1).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels.reshape(-1))
        loss.backward()
        optimizer.step()
    model.eval()
    return float(loss.detach())
