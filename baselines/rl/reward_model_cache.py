"""Shared offline fits of MARLHF's reward model (``llm-envs train marlhf --rm-cache DIR``).

Runs that differ only in the RL stage's settings (:data:`RL_STAGE_FIELDS`: the learning rate of a sweep,
the number of iterations, evaluation, bookkeeping) collect the same candidates and fit the same reward model.
The first such run writes its pairs, reward model, fit metrics and random state as an entry of ``DIR``; the
others load it and then run exactly as the run that wrote it. The entry's name is a hash of :func:`fit_key`:
every other setting, the models, dtypes, device, CPU kernels, library versions and a hash of the suite's
source, so any change that could change the fit refits. Docs: docs/marlhf.md ("Shared fits").
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from baselines.rl.preference import PairBuffer

RM_CACHE_FORMAT = "llm-envs-reward-model-fit-v1"
RL_STAGE_FIELDS = frozenset({
    "num_iterations", "learning_rate", "clip_eps", "num_eval_problems", "eval_every", "eval_greedy",
    "output_dir", "run_name", "overwrite", "tensorboard", "progress", "samples_every", "checkpoint_every",
    "resume", "wandb_project", "batch_pairs", "updates_per_iteration", "micro_batch_pairs", "micro_batch_size",
    "micro_batch_tokens", "rl_learner", "rl_args", "baseline", "normalize_std", "loss_aggregation", "num_epochs",
    "rm_cache",
})
"""The settings an offline fit never reads (the RL stage's, evaluation's, which is seeded apart, and the
run's bookkeeping): runs that differ only in these share one ``rm_cache`` entry."""


def code_fingerprint() -> str:
    """sha256 of every source file of the ``agents``, ``baselines`` and ``llm_envs`` packages: a cached
    fit is reused only by the code that made it."""
    import hashlib

    import agents
    import baselines
    import llm_envs

    digest = hashlib.sha256()
    for package in (agents, baselines, llm_envs):
        root = Path(package.__file__).parent
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root.parent)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def fit_key(config: Any, policy: Any) -> dict[str, Any]:
    """What decides an offline fit, as JSON: every setting outside :data:`RL_STAGE_FIELDS`, each agent's
    and the reward model's base, tokenizer and adapter, the bases' dtypes and device, the CPU's kernels and
    threads, the library versions and :func:`code_fingerprint`."""
    import peft
    import transformers

    from agents.models import device_description, machine_description
    from baselines.infra.metrics import config_dict

    settings = {k: v for k, v in config_dict(config).items() if k not in RL_STAGE_FIELDS}
    machine = {k: v for k, v in machine_description().items() if k != "dtype"}
    return json.loads(json.dumps({
        "format": RM_CACHE_FORMAT,
        "settings": settings,
        "team": policy.describe_agents(),
        "dtypes": sorted({str(g.dtype) for g in policy.groups}),
        "device": str(policy.groups[0].device), "gpu": device_description(policy.groups[0].device),
        "machine": machine,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__},
        "code": code_fingerprint(),
    }, sort_keys=True, default=str))


def cache_entry(config: Any, key: Mapping[str, Any]) -> Path:
    """The directory of the fit ``key`` under ``config.rm_cache``."""
    import hashlib

    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return Path(str(config.rm_cache)) / name


def load_cached_fit(policy: Any, entry: Path, key: Mapping[str, Any], rng: np.random.Generator,
                    adapter: str) -> tuple[PairBuffer, dict[str, float]] | None:
    """The pairs and fit metrics of ``entry``, its reward model (the ``adapter``) loaded into ``policy`` and its random
    state into every generator; ``None`` without an entry. An entry that cannot be read whole, or whose
    key differs (a hash collision), is an error naming it, never a silent refit."""
    from baselines.infra.checkpoints import rng_from
    from baselines.infra.rng import set_rng_state

    record_path = entry / "fit.json"
    if not record_path.is_file():
        return None
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        tensors = torch.load(entry / "rng.pt", map_location="cpu", weights_only=True)
        buffer = PairBuffer.load(entry, before=1, prune=False)
    except (OSError, ValueError, RuntimeError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"corrupt reward-model cache entry {entry}: {err}; remove it to fit afresh") from err
    if record.get("key") != key:
        raise ValueError(f"reward-model cache entry {entry} was written for another fit; remove it to fit afresh")
    policy.load(entry / "policy", agents=[adapter])
    set_rng_state(rng_from(tensors, record["rng"]), rng)
    return buffer, {k: float(v) for k, v in record["stats"].items()}


def save_cached_fit(policy: Any, entry: Path, key: Mapping[str, Any], buffer: PairBuffer,
                    stats: Mapping[str, float], rng: np.random.Generator, adapter: str) -> None:
    """Write the fit's pairs, reward model (the ``adapter``), metrics and random state as ``entry`` (a temporary
    directory moved into place: a reader sees a whole entry or none)."""
    import shutil
    import tempfile

    from baselines.infra.checkpoints import write_rng
    from baselines.infra.rng import rng_state

    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=entry.parent))
    try:
        buffer.save_iteration(tmp, 0)
        policy.save(tmp / "policy", policy.state([adapter]))
        record = {"key": key, "stats": dict(stats), "rng": write_rng(rng_state(rng), tmp / "rng.pt")}
        (tmp / "fit.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
        if entry.exists():  # another run wrote the same fit meanwhile: the same content
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
