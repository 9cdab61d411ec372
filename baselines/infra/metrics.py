"""A run's metrics: one JSON line per step in ``<run>/metrics.jsonl`` (always), TensorBoard (optional),
W&B (optional, imported only when asked); ``--resume`` truncates the lines logged after the checkpoint.

Every metric name starts with one of :data:`METRIC_PREFIXES`: ``charts/`` (timing, sizes),
``losses/``, ``reward/<component>`` (the env's), ``eval/``, ``val/`` (the held-out train problems,
``--num-validation-problems``), ``agent_<name>/`` (per agent or model) and ``pref/`` (the preference
learners' pairs, margins and accuracies).

The JSONL is strict JSON: a value that is not finite (a diverged loss) is written as ``null``, never as
``NaN`` or ``Infinity``, which strict readers refuse; :func:`read_metrics` gives it back as ``nan``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

METRICS_FILE = "metrics.jsonl"
METRIC_PREFIXES = ("charts/", "losses/", "reward/", "eval/", "val/", "agent_", "pref/")
"""Every logged metric name starts with one of these."""


def config_dict(config: Any) -> dict[str, Any]:
    """A config (dataclass or mapping) as a plain dict, for JSON files and W&B."""
    return asdict(config) if is_dataclass(config) else dict(config)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` and move it into place: readers never see
    half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def check_metric_names(metrics: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the metrics whose names start with none of :data:`METRIC_PREFIXES`."""
    bad = [k for k in metrics if not k.startswith(METRIC_PREFIXES)]
    if bad:
        raise ValueError(f"metric names must start with one of {METRIC_PREFIXES}, got {bad}")


class MetricLogger:
    """Writes ``{"step": s, name: value, ...}`` lines to ``run_dir/metrics.jsonl`` and, when switched
    on, to TensorBoard (``run_dir/tb``) and W&B.

    ``resume_step``: lines with a step above it (logged after the checkpoint a run resumes from) are
    dropped, so the file reads as one uninterrupted run.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        tensorboard: bool = False,
        wandb_project: str | None = None,
        config: Any = None,
        resume_step: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / METRICS_FILE
        if resume_step is not None and self.path.exists():
            kept = [line for line in read_metrics(self.path) if line["step"] <= resume_step]
            atomic_write_text(self.path, "".join(json.dumps(line) + "\n" for line in kept))
        elif resume_step is None and self.path.exists():
            self.path.unlink()
        self._file = open(self.path, "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(
                str(self.run_dir / "tb"), purge_step=None if resume_step is None else resume_step + 1
            )
        self._wandb = None
        if wandb_project:
            import wandb  # optional dependency: imported only when asked for

            self._wandb = wandb.init(
                project=wandb_project,
                name=self.run_dir.name,
                dir=str(self.run_dir),
                config=config_dict(config) if config is not None else None,
                resume="allow",
            )

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        check_metric_names(metrics)
        values = {k: float(v) for k, v in metrics.items()}
        strict = {k: v if math.isfinite(v) else None for k, v in values.items()}
        self._file.write(json.dumps({"step": int(step), **strict}, allow_nan=False) + "\n")
        self._file.flush()
        if self._tb is not None:
            for name, value in values.items():
                self._tb.add_scalar(name, value, step)
        if self._wandb is not None:
            self._wandb.log(values, step=step)

    def log_text(self, step: int, tag: str, text: str) -> None:
        """Markdown text to TensorBoard's text plugin (when TensorBoard is on); the JSONL holds numbers only."""
        if self._tb is not None:
            self._tb.add_text(tag, text, step)
            self._tb.flush()

    def log_table(self, step: int, key: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """A table to W&B (when W&B is on)."""
        if self._wandb is not None:
            import wandb

            self._wandb.log({key: wandb.Table(columns=list(columns), data=[list(r) for r in rows])}, step=step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def reward_metrics(info: Mapping[str, Any]) -> dict[str, float]:
    """``reward/total`` and ``reward/<component>``: the batch means of an agent's stacked env infos
    (``reward_total``, ``reward_<component>``).

    >>> reward_metrics({"reward_total": [1.0, 2.0], "reward_tests": [0.0, 1.0], "turn": [1, 1]})
    {'reward/total': 1.5, 'reward/tests': 0.5}
    """
    out = {"reward/total": float(np.mean(info["reward_total"]))}
    for key, value in info.items():
        if key.startswith("reward_") and key != "reward_total":
            out[f"reward/{key[len('reward_') :]}"] = float(np.mean(value))
    return out


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, float]]:
    """The lines of a metrics JSONL (``null``, a value that was not finite, read as ``nan``). A torn last
    line (a killed run) is skipped; any other bad line raises with its line number."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"metrics file {str(path)!r} not found")
    lines = path.read_text(encoding="utf-8").splitlines()
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):
                break
            raise ValueError(f"{path}:{number} is not valid JSON: {err}") from err
        if not isinstance(row, dict) or not isinstance(row.get("step"), int):
            raise ValueError(f"{path}:{number} must be an object with an integer 'step', got {line[:120]!r}")
        rows.append({k: math.nan if v is None else v for k, v in row.items()})
    return rows
