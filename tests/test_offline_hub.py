"""Offline (HF_HUB_OFFLINE=1, as tests/conftest.py sets), a hub model that is not in the local cache fails at once
through every loader of the project, with one message naming HF_HUB_OFFLINE and the model, and without a
network call (no retries)."""

from __future__ import annotations

import socket
import time

import pytest

from llm_envs.tokenizers import hub_load_error, hub_offline, load_tokenizer, looks_like_hub_id

MISSING = "llm-envs-tests/no-such-model"
"""A hub id in no cache."""


@pytest.fixture
def no_network(monkeypatch):
    """Offline mode on; any connection attempt is recorded and refused."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise OSError("tests/test_offline_hub.py: no network")

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    return attempts


def fails_fast(load, no_network, what: str) -> str:
    start = time.perf_counter()
    with pytest.raises(OSError) as info:
        load(MISSING)
    elapsed = time.perf_counter() - start
    message = str(info.value)
    assert f"Could not load {what} {MISSING!r}" in message and "HF_HUB_OFFLINE=1" in message, message
    assert "hf download" in message and "\n" not in message, message
    assert no_network == [], "a network call was attempted"
    assert elapsed < 10, f"{elapsed:.1f} s: a retry loop?"
    return message


def test_a_missing_hub_tokenizer_fails_at_once(no_network):
    fails_fast(load_tokenizer, no_network, "tokenizer")


def test_a_missing_hub_model_fails_at_once(no_network):
    from agents.models import load_model

    message = fails_fast(lambda name: load_model(name, device="cpu"), no_network, "model")
    assert "embedded default ('smollm2-135m-instruct')" in message


def test_a_missing_sentiment_classifier_fails_at_once(no_network):
    from llm_envs.rewards.sentiment import _load_classifier

    fails_fast(lambda name: _load_classifier(name, "cpu"), no_network, "the sentiment classifier")


def test_the_command_line_says_it_in_one_line(no_network, capsys):
    from baselines.infra.cli import main

    start = time.perf_counter()
    assert main(["eval", "--model", MISSING, "--num-problems", "1", "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("llm-envs eval: error: Could not load ") and "HF_HUB_OFFLINE=1" in err and MISSING in err
    assert len(err.splitlines()) == 1, err
    assert no_network == [] and time.perf_counter() - start < 30


def test_a_local_path_or_online_keeps_the_libraries_message(monkeypatch, tmp_path):
    err = OSError("the library's reason")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for path in (str(tmp_path / "missing"), "./model", "~/model", "a/b/c"):
        assert not looks_like_hub_id(path)
        assert "HF_HUB_OFFLINE" not in str(hub_load_error("model", path, err, "Hint."))
    assert looks_like_hub_id("Qwen/Qwen2.5-0.5B-Instruct") and looks_like_hub_id("gpt2")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    assert hub_offline() == "TRANSFORMERS_OFFLINE=1"
    assert "(as HF_HUB_OFFLINE=1 does)" in str(hub_load_error("model", "gpt2", err, "Hint."))
    monkeypatch.delenv("TRANSFORMERS_OFFLINE")
    assert hub_offline() is None
    assert str(hub_load_error("model", "gpt2", err, "Hint.")) == ("Could not load model 'gpt2': the library's "
                                                                   "reason\nHint.")
