"""Learning curves: one PNG panel per reward series of a run's ``metrics.jsonl``, training values
(raw and smoothed) with the evaluations as markers (``llm-envs plot``)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from baselines.infra.metrics import read_metrics


def smooth(values: Sequence[float], window: int) -> np.ndarray:
    """Trailing moving average (window clipped at the start), the curves' smoothing."""
    arr = np.asarray(values, dtype=float)
    if window <= 1 or len(arr) == 0:
        return arr
    cumsum = np.cumsum(np.insert(arr, 0, 0.0))
    idx = np.arange(1, len(arr) + 1)
    lo = np.maximum(0, idx - window)
    return (cumsum[idx] - cumsum[lo]) / (idx - lo)


def plot_metrics(
    metrics_path: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    smoothing: int = 5,
    title: str | None = None,
) -> Path:
    """One panel per reward series (``reward/total`` first, then each ``reward/<component>``): the raw
    training values (faint), their moving average, and the eval points (``eval/...``) as markers.
    Returns the PNG path (default: next to the JSONL, ``learning_curves.png``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    names = sorted({k for row in rows for k in row if k.startswith("reward/")})
    if not names:
        raise ValueError(f"{metrics_path} has no reward/<component> metrics to plot")
    names.sort(key=lambda n: (n != "reward/total", n))
    cols = min(3, len(names))
    nrows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.2 * nrows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        points = [(row["step"], row[name]) for row in rows if name in row and math.isfinite(row[name])]
        steps = [p[0] for p in points]
        values = [p[1] for p in points]
        ax.plot(steps, values, color="tab:blue", alpha=0.3, linewidth=1)
        ax.plot(steps, smooth(values, smoothing), color="tab:blue", linewidth=2, label="train")
        eval_name = "eval/" + name.split("/", 1)[1]
        evals = [(row["step"], row[eval_name]) for row in rows if eval_name in row]
        if evals:
            ax.plot(*zip(*evals), "o--", color="tab:orange", label="eval")
        ax.set_title(name.split("/", 1)[1])
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    axes.flat[0].legend(loc="best", fontsize=8)
    fig.suptitle(title or Path(metrics_path).parent.name)
    fig.tight_layout()
    out = Path(output) if output is not None else Path(metrics_path).with_name("learning_curves.png")
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
