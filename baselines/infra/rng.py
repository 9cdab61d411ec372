"""Random number generators of a run: seeding, a seeded block that leaves training's streams alone, and
the state of every generator for checkpoints (:mod:`baselines.infra.checkpoints`).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> np.random.Generator:
    """Seed python, numpy and torch; returns the learner's own numpy generator (problem sampling)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    return np.random.default_rng(seed)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Run the block under ``torch.manual_seed(seed)`` and restore every torch generator afterwards.

    ``torch.manual_seed`` reseeds the CPU generator *and every CUDA generator*, so the CUDA
    generators are forked too (``fork_rng(devices=[])`` would restore the CPU one only, and each
    evaluation would reset the GPU's sampling stream to the same state)."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def rng_state(rng: np.random.Generator) -> dict[str, Any]:
    """Every RNG a run draws from, in a form :func:`set_rng_state` restores exactly."""
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy_generator": rng.bit_generator.state,
        "numpy_global": np.random.get_state(legacy=False),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any], rng: np.random.Generator) -> None:
    """Restore what :func:`rng_state` returned (CUDA states only where CUDA is available)."""
    torch.set_rng_state(state["torch"])
    rng.bit_generator.state = state["numpy_generator"]
    np.random.set_state(state["numpy_global"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
