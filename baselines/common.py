"""Infrastructure shared by the learners (MAGRPO, PPO, CORY): logging, checkpoints, plots, RNG state,
rollout helpers and evaluation on the eval split.

=========================  ==========================================================================
``MetricLogger``           one JSONL line per step (always), TensorBoard (optional), W&B (optional,
                           imported only when asked); ``--resume`` truncates lines past the checkpoint
``save_checkpoint``        policy adapters, optimizers, RNG states, step and config, written to a
                           temporary directory and moved into place with ``os.replace``; ``latest``
                           names the newest complete one
``load_checkpoint``        reads and checks everything (format, config, files) before changing state
``resume_checkpoint``      ``--resume``: the newest checkpoint that loads (a damaged one is skipped with
                           a warning)
``plot_metrics``           PNG learning curves per reward component from a metrics JSONL
``strip_left_padding``     drops the columns that are padding in every row (prompts are left-padded
                           to the env's L = 2048 but are ~450 tokens: a big saving on CPU)
``make_vector_env``        a batch of envs: ``VectorEnv`` (parallel ids) or ``SequentialVectorEnv`` (AEC
                           ids such as CORY's), both with one reset/step contract
``play_episodes``          one batch of episodes through that contract, roles sampling from adapters
``evaluate``               mean joint reward and components on the eval split (pass@k on coding and
                           math envs)
=========================  ==========================================================================

Checkpoint layout (``<run_dir>/checkpoints/``)::

    latest                      text file: name of the newest complete checkpoint
    step_000010/
        trainer.json            format, step, learner name, config, numpy RNG state, extra state
        policy/                 MultiAgentPolicy.save (one adapter per agent + policy.json)
        optimizers.pt           {agent: optimizer.state_dict()}
        rng.pt                  torch CPU (and CUDA) RNG states
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import random
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINT_FORMAT = "llm-envs-trainer-v1"
TRAINER_FILE = "trainer.json"
LATEST_FILE = "latest"
METRICS_FILE = "metrics.jsonl"
METRIC_PREFIXES = ("charts/", "losses/", "reward/", "eval/", "agent_")
"""Every logged metric name starts with one of these."""


# ----------------------------------------------------------------------------------------- tensors
def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1: over everything (``dim=None``) or along ``dim``.
    Rows with no unmasked entry give 0 (not NaN).

    >>> masked_mean(torch.tensor([[1.0, 2.0, 9.0]]), torch.tensor([[1, 1, 0]]))
    tensor(1.5000)
    """
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1.0)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1.0)


def strip_left_padding(ids: np.ndarray | torch.Tensor, mask: np.ndarray | torch.Tensor) -> tuple[Any, Any]:
    """Drop leading columns that are padding in every row: (N, L) -> (N, P), P = longest prompt.

    The boundary comes from the mask, never from pad ids (SmolLM2's pad is its end-of-turn token,
    which also occurs inside chat prompts)."""
    if ids.shape != mask.shape or len(ids.shape) != 2:
        raise ValueError(f"ids and mask must be equal (N, L) arrays, got {tuple(ids.shape)} and {tuple(mask.shape)}")
    longest = int(mask.sum(1).max()) if mask.shape[0] else 0
    if longest == 0:
        raise ValueError("every row of the attention mask is empty: there is no prompt to keep")
    start = ids.shape[1] - longest
    return ids[:, start:], mask[:, start:]


def pad_actions(response_ids: torch.Tensor, length: int, pad_id: int) -> np.ndarray:
    """(N, T) responses (T <= length) -> (N, length) int64 env actions, padded with the pad id."""
    if response_ids.shape[1] > length:
        raise ValueError(f"responses have {response_ids.shape[1]} tokens, more than the env's action length {length}")
    out = np.full((response_ids.shape[0], length), pad_id, dtype=np.int64)
    out[:, : response_ids.shape[1]] = response_ids.cpu().numpy()
    return out


# ----------------------------------------------------------------------------------------- seeding
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
    torch.set_rng_state(state["torch"])
    rng.bit_generator.state = state["numpy_generator"]
    np.random.set_state(state["numpy_global"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ----------------------------------------------------------------------------------------- logging
def check_metric_names(metrics: Mapping[str, Any]) -> None:
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
            _atomic_write_text(self.path, "".join(json.dumps(line) + "\n" for line in kept))
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
                config=_jsonable(config) if config is not None else None,
                resume="allow",
            )

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        check_metric_names(metrics)
        values = {k: float(v) for k, v in metrics.items()}
        self._file.write(json.dumps({"step": int(step), **values}) + "\n")
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


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, float]]:
    """The lines of a metrics JSONL. A torn last line (a killed run) is skipped; any other bad line
    raises with its line number."""
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
        rows.append(row)
    return rows


# ----------------------------------------------------------------------------------------- checkpoints
class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt or does not fit the run that tries to load it."""


class CheckpointMismatchError(CheckpointError):
    """An intact checkpoint of another learner or config: no older checkpoint of the run would fit either."""


class CheckpointFallbackWarning(UserWarning):
    """``--resume`` skipped a damaged checkpoint and continues from an older one."""


def _jsonable(config: Any) -> Any:
    return asdict(config) if is_dataclass(config) else dict(config)


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


@dataclass
class TrainerState:
    """Everything a checkpoint holds, copied at one moment (an iteration boundary): later updates,
    sampling or evaluation do not change it. :func:`save_checkpoint` writes one.

    Learners take one at every iteration boundary; Ctrl-C in the middle of an iteration then saves
    the last boundary's state, never the half-updated live weights (a resumed run is then exactly
    the uninterrupted run)."""

    step: int
    policy: dict[str, dict[str, torch.Tensor]]
    optimizers: dict[str, dict[str, Any]]
    rng: dict[str, Any]
    extra: dict[str, Any]

    @classmethod
    def capture(
        cls,
        *,
        step: int,
        policy: Any,
        optimizers: Mapping[str, torch.optim.Optimizer],
        rng: np.random.Generator,
        extra: Mapping[str, Any] | None = None,
    ) -> TrainerState:
        return cls(
            step=int(step),
            policy=policy.state(),
            optimizers={agent: copy.deepcopy(opt.state_dict()) for agent, opt in optimizers.items()},
            rng=copy.deepcopy(rng_state(rng)),
            extra=copy.deepcopy(dict(extra or {})),
        )


def save_checkpoint(
    run_dir: str | os.PathLike[str],
    state: TrainerState,
    *,
    learner: str,
    config: Any,
    policy: Any,
    keep: int = 2,
) -> Path:
    """Write ``state`` as checkpoint ``state.step`` under ``run_dir/checkpoints`` atomically (a
    temporary directory moved into place) and keep the newest ``keep``. ``policy`` writes the files
    (its manifest names agents and settings)."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step_{state.step:06d}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        policy.save(tmp / "policy", state.policy)
        torch.save(state.optimizers, tmp / "optimizers.pt")
        rng = state.rng
        torch.save({k: v for k, v in rng.items() if k in ("torch", "cuda")}, tmp / "rng.pt")
        trainer = {
            "format": CHECKPOINT_FORMAT,
            "learner": learner,
            "step": state.step,
            "config": _jsonable(config),
            "numpy_generator": rng["numpy_generator"],
            "numpy_global": _numpy_global_to_json(rng["numpy_global"]),
            "python": [rng["python"][0], list(rng["python"][1]), rng["python"][2]],
            "extra": dict(state.extra),
        }
        (tmp / TRAINER_FILE).write_text(json.dumps(trainer, indent=1), encoding="utf-8")
        if final.exists():  # re-saving the same step (e.g. a resumed run that ends where it started)
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _atomic_write_text(root / LATEST_FILE, final.name + "\n")
    old = sorted(p for p in root.glob("step_*") if p.is_dir() and p != final)
    for path in old[: max(0, len(old) - (keep - 1))]:
        shutil.rmtree(path, ignore_errors=True)
    return final


def interrupted(
    state: TrainerState | None,
    run_dir: str | os.PathLike[str],
    checkpoint: Any,
    *,
    wait: bool,
) -> None:
    """What a learner does on Ctrl-C: write ``state`` (the last iteration boundary's) with
    ``checkpoint(state, step, wait=...)`` unless a checkpoint of that step exists already (the same
    state, written at that boundary), and say where to resume from. ``state`` is ``None`` on ranks
    other than 0, which save nothing (with several processes the others may be gone already)."""
    if state is None:
        return
    if state.step in saved_steps(run_dir):
        path = Path(run_dir) / "checkpoints" / f"step_{state.step:06d}"
        print(f"\nInterrupted after iteration {state.step}: its checkpoint {path} is in place; continue with --resume")
        return
    path = checkpoint(state, state.step, wait=wait)
    print(
        f"\nInterrupted after iteration {state.step}: checkpoint saved to {path} (the unfinished iteration "
        "was dropped); continue with --resume"
    )


def saved_steps(run_dir: str | os.PathLike[str]) -> list[int]:
    """Steps of the complete checkpoints under ``run_dir/checkpoints``, ascending."""
    root = Path(run_dir) / "checkpoints"
    steps = []
    for path in root.glob("step_*"):
        if (path / TRAINER_FILE).is_file() and path.name[len("step_") :].isdigit():
            steps.append(int(path.name[len("step_") :]))
    return sorted(steps)


def _numpy_global_to_json(state: Mapping[str, Any]) -> dict[str, Any]:
    inner = dict(state["state"])
    inner["key"] = [int(x) for x in inner["key"]]
    return {**state, "state": inner}


def _numpy_global_from_json(state: Mapping[str, Any]) -> dict[str, Any]:
    inner = dict(state["state"])
    inner["key"] = np.asarray(inner["key"], dtype=np.uint32)
    return {**state, "state": inner}


def find_checkpoint(path: str | os.PathLike[str]) -> Path:
    """A checkpoint directory from a run dir (its latest), a ``checkpoints`` dir, or the dir itself."""
    path = Path(path)
    if (path / TRAINER_FILE).is_file():
        return path
    for root in (path / "checkpoints", path):
        latest = root / LATEST_FILE
        if latest.is_file():
            target = root / latest.read_text(encoding="utf-8").strip()
            if not (target / TRAINER_FILE).is_file():
                raise CheckpointError(f"{latest} names {target.name!r}, which is not a complete checkpoint")
            return target
    raise CheckpointError(
        f"no checkpoint found at {str(path)!r}: pass a run directory, its checkpoints/ directory or a step_* directory"
    )


def load_checkpoint(
    path: str | os.PathLike[str],
    *,
    learner: str,
    config: Any,
    policy: Any,
    optimizers: Mapping[str, torch.optim.Optimizer],
    rng: np.random.Generator,
    ignore: Iterable[str] = (),
) -> dict[str, Any]:
    """Restore a :func:`save_checkpoint` into live objects; returns the trainer record (``step``,
    ``extra``). Config fields other than ``ignore`` must equal the checkpoint's. Everything is read and
    checked before any state changes; problems raise :class:`CheckpointError` naming the file."""
    directory = find_checkpoint(path)
    trainer_path = directory / TRAINER_FILE
    try:
        trainer = json.loads(trainer_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CheckpointError(f"corrupt checkpoint file {trainer_path}: {err}") from err
    if not isinstance(trainer, dict) or trainer.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{trainer_path} is not a {CHECKPOINT_FORMAT} checkpoint: {str(trainer)[:200]!r}")
    if trainer.get("learner") != learner:
        raise CheckpointMismatchError(
            f"checkpoint {str(directory)!r} was written by {trainer.get('learner')!r}, not {learner!r}"
        )
    ours, theirs = _jsonable(config), trainer.get("config", {})
    skip = set(ignore)
    diff = {
        k: (theirs.get(k, "<missing>"), ours[k])
        for k in ours
        if k not in skip and json.loads(json.dumps(theirs.get(k, "<missing>"))) != json.loads(json.dumps(ours[k]))
    }
    if diff:
        listed = ", ".join(f"{k}: checkpoint {a!r}, now {b!r}" for k, (a, b) in sorted(diff.items()))
        raise CheckpointMismatchError(f"checkpoint {str(directory)!r} was made with a different config ({listed})")
    tensors = {}
    for name in ("optimizers.pt", "rng.pt"):
        file = directory / name
        try:
            tensors[name] = torch.load(file, map_location="cpu", weights_only=True)
        except FileNotFoundError as err:
            raise CheckpointError(f"checkpoint file {file} is missing") from err
        except Exception as err:  # torch.load raises many types for a damaged zip/pickle
            # The message of torch's unpickling errors is a page of advice; the cause stays chained.
            raise CheckpointError(f"corrupt checkpoint file {file}: torch.load raised {type(err).__name__}") from err
    saved_opts = tensors["optimizers.pt"]
    if not isinstance(saved_opts, dict) or set(saved_opts) != set(optimizers):
        held = sorted(saved_opts) if isinstance(saved_opts, dict) else type(saved_opts).__name__
        raise CheckpointError(
            f"{directory / 'optimizers.pt'} holds optimizers for {held}, this run has {sorted(optimizers)}"
        )
    try:
        policy.load(directory / "policy")
    except (ValueError, FileNotFoundError) as err:
        raise CheckpointError(f"cannot load the policy of checkpoint {str(directory)!r}: {err}") from err
    for agent, opt in optimizers.items():
        try:
            opt.load_state_dict(saved_opts[agent])
        except (ValueError, KeyError) as err:
            raise CheckpointError(f"optimizer state of agent {agent!r} in {directory} does not fit: {err}") from err
    python = trainer["python"]
    set_rng_state(
        {
            **tensors["rng.pt"],
            "numpy_generator": trainer["numpy_generator"],
            "numpy_global": _numpy_global_from_json(trainer["numpy_global"]),
            "python": (python[0], tuple(python[1]), python[2]),
        },
        rng,
    )
    return trainer


def resume_candidates(run_dir: str | os.PathLike[str]) -> list[Path]:
    """The checkpoint directories ``--resume`` may continue from, newest step first (at least one, or
    :class:`CheckpointError`)."""
    root = Path(run_dir) / "checkpoints"
    found = []
    for path in root.glob("step_*") if root.is_dir() else ():
        step = path.name[len("step_") :]
        if path.is_dir() and step.isdigit():
            found.append((int(step), path))
    if not found:
        raise CheckpointError(
            f"no checkpoint found in {str(root)!r}: nothing to resume (leave out --resume to start a new run)"
        )
    return [path for _, path in sorted(found, reverse=True)]


def resume_checkpoint(run_dir: str | os.PathLike[str], **load_kwargs: Any) -> dict[str, Any]:
    """``--resume``: :func:`load_checkpoint` from the newest checkpoint of ``run_dir`` that loads. A
    damaged one (missing or corrupt files) is skipped with a :class:`CheckpointFallbackWarning` naming
    it and the one used instead; a checkpoint of another learner or config stops the run
    (:class:`CheckpointMismatchError`), as does having no checkpoint that loads."""
    candidates = resume_candidates(run_dir)
    failures: list[tuple[Path, CheckpointError]] = []
    for directory in candidates:
        try:
            trainer = load_checkpoint(directory, **load_kwargs)
        except CheckpointMismatchError:
            raise
        except CheckpointError as err:
            failures.append((directory, err))
            continue
        if failures:
            import warnings

            skipped = "; ".join(f"{path.name}: {err}" for path, err in failures)
            warnings.warn(
                f"resuming from {directory.name} (step {trainer['step']}), the newest checkpoint that loads; "
                f"skipped damaged {skipped}",
                CheckpointFallbackWarning,
                stacklevel=2,
            )
        return trainer
    if len(failures) == 1:
        raise failures[0][1]
    listed = "; ".join(f"{path.name}: {err}" for path, err in failures)
    raise CheckpointError(f"no checkpoint of {str(Path(run_dir))!r} loads: {listed}")


def check_run_dir(run_dir: Path, *, resume: bool, overwrite: bool | None = None) -> None:
    """Before loading a model: a resumed run needs a checkpoint; a new run must not write over one
    (unless ``overwrite`` is True; ``None``: the learner has no --overwrite option)."""
    if resume:
        resume_candidates(run_dir)
    elif (run_dir / "checkpoints").exists() and not overwrite:
        hint = ", or --overwrite to start afresh" if overwrite is not None else ""
        raise FileExistsError(
            f"run directory {str(run_dir)!r} already holds checkpoints: pass --resume to continue it, or another "
            f"--run-name / --output-dir{hint}"
        )


def eval_table(result: Mapping[str, Any]) -> list[str]:
    """Lines comparing ``eval_before/<name>`` and ``eval/<name>`` of a run's result (total first)."""
    before = {k.split("/", 1)[1]: v for k, v in result.items() if k.startswith("eval_before/")}
    after = {k.split("/", 1)[1]: v for k, v in result.items() if k.startswith("eval/")}
    if not (before and after):
        return []
    width = max(12, *(len(n) for n in after))
    lines = [f"{'eval':<{width}} {'before':>8} {'after':>8}"]
    for name in sorted(set(before) & set(after), key=lambda n: (n != "total", n)):
        lines.append(f"{name:<{width}} {before[name]:8.3f} {after[name]:8.3f}")
    return lines


# ----------------------------------------------------------------------------------------- plots
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


# ----------------------------------------------------------------------------------------- rollouts
class SequentialVectorEnv:
    """N copies of a sequential (AEC) env stepped together, one role at a time, with the reset/step
    contract of :class:`llm_envs.core.vector.VectorEnv`: ``agents`` holds the one role that acts next
    (``[]`` once the episodes are over), observations are stacked for that role only, ``step`` takes
    its (N, T) actions and returns every role's rewards (0 until the turn resolves) and infos.

    CORY's envs (pioneer -> observer) run only under this protocol: the observer's prompt holds the
    pioneer's answer of the same turn. Every env of a batch runs the same roles in the same order, so
    they stay in step."""

    def __init__(self, env_id: str, num_envs: int, **kwargs: Any) -> None:
        import copy

        from llm_envs.core.registry import make

        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise ValueError(f"num_envs must be a positive int, got {num_envs!r}")
        first = make(env_id, protocol="sequential", **kwargs)
        self.envs = [first] + [copy.deepcopy(first) for _ in range(num_envs - 1)]
        self.num_envs = num_envs
        self.possible_agents = list(first.possible_agents)
        self.agents: list[str] = []

    @property
    def tokenizer(self) -> Any:
        """The tokenizer of the batch's envs (read-only; every copy shares the first env's)."""
        return self.envs[0].tokenizer

    def split_flat(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """``obs_format="flat"``: cut stacked flat observations (N, D) into their parts."""
        return self.envs[0].split_flat(flat)

    def reset(
        self, seed: int | Sequence[int] | None = None, options: Mapping[str, Any] | Sequence[Any] | None = None
    ) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, dict[str, np.ndarray]]]:
        """``seed``: one int (env i gets ``seed + i``) or N seeds; ``options``: one dict or N dicts."""
        n = self.num_envs
        seeds = list(seed) if isinstance(seed, Sequence) else [None if seed is None else seed + i for i in range(n)]
        opts = list(options) if isinstance(options, Sequence) else [options] * self.num_envs
        if len(seeds) != self.num_envs or len(opts) != self.num_envs:
            raise ValueError(f"got {len(seeds)} seeds and {len(opts)} options for num_envs={self.num_envs}")
        for env, s, o in zip(self.envs, seeds, opts):
            env.reset(seed=s, options=o)
        self.agents = [self.envs[0].agent_selection]
        return self._observe(), self._infos()

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        if not self.agents:
            raise RuntimeError("Call reset() before step() (the batch is over or was never started).")
        agent = self.agents[0]
        if not isinstance(actions, Mapping) or set(actions) != {agent}:
            got = sorted(actions) if isinstance(actions, Mapping) else type(actions).__name__
            raise KeyError(f"it is {agent!r}'s turn: actions must be {{{agent!r}: (N, T) array}}, got {got}")
        rows = actions[agent]
        if len(rows) != self.num_envs:
            raise ValueError(f"actions[{agent!r}] has {len(rows)} rows, expected num_envs={self.num_envs}")
        for env, row in zip(self.envs, rows):  # validate every row before stepping any env
            env.check_action(agent, row)
        for env, row in zip(self.envs, rows):
            env.step(row)
        every = self.possible_agents
        rewards = {a: np.array([env.rewards[a] for env in self.envs], dtype=np.float64) for a in every}
        terms = {a: np.array([env.terminations[a] for env in self.envs], dtype=bool) for a in every}
        truncs = {a: np.array([env.truncations[a] for env in self.envs], dtype=bool) for a in every}
        over = [all(env.terminations[a] or env.truncations[a] for a in every) for env in self.envs]
        if all(over):
            self.agents = []
        elif any(over):
            raise RuntimeError("Envs of one batch finished at different turns; give them the same num_turns.")
        else:
            self.agents = [self.envs[0].agent_selection]
        return self._observe(), rewards, terms, truncs, self._infos()

    def _observe(self) -> dict[str, dict[str, np.ndarray]]:
        if not self.agents:
            return {}
        agent = self.agents[0]
        per_env = [env.observe(agent) for env in self.envs]
        return {agent: {k: np.stack([o[k] for o in per_env]) for k in ("observation", "attention_mask")}}

    def _infos(self) -> dict[str, dict[str, np.ndarray]]:
        return {
            a: {k: np.array([env.infos[a][k] for env in self.envs]) for k in self.envs[0].infos[a]}
            for a in self.possible_agents
        }

    def close(self) -> None:
        for env in self.envs:
            env.close()


def probe_env(env_id: str, **kwargs: Any) -> tuple[list[str], int]:
    """The agents and turns per episode of ``env_id`` built with ``kwargs`` (one env, closed again):
    what a learner checks and builds its policy from before the envs (which take the policy's stop
    ids) exist. Bad env arguments fail here, before a model is loaded."""
    import llm_envs

    env = llm_envs.make(env_id, **kwargs)
    try:
        return list(env.possible_agents), int(env.num_turns)
    finally:
        env.close()


def make_vector_env(env_id: str, num_envs: int, **kwargs: Any) -> Any:
    """A batch of ``num_envs`` envs: :class:`~llm_envs.core.vector.VectorEnv` for ids registered as
    parallel, :class:`SequentialVectorEnv` for sequential-only ids (CORY's); ``protocol=`` in
    ``kwargs`` overrides the id's registered protocol."""
    from llm_envs.core.registry import spec
    from llm_envs.core.vector import VectorEnv

    if (kwargs.pop("protocol", None) or spec(env_id).protocol) == "sequential":
        return SequentialVectorEnv(env_id, num_envs, **kwargs)
    return VectorEnv(env_id, num_envs, **kwargs)


def play_episodes(
    policy: Any,
    venv: Any,
    *,
    seeds: Sequence[int] | int,
    options: Sequence[Mapping[str, Any]],
    action_length: int,
    adapters: Mapping[str, str] | None = None,
    sample_seeds: Sequence[int] | None = None,
    **sampling: Any,
) -> tuple[list[dict[str, Any]], dict[str, np.ndarray], dict[str, dict[str, np.ndarray]]]:
    """Play one batch of episodes on ``venv`` (parallel or sequential): whenever roles must act, each
    samples from its adapter (``adapters[role]``, default the role's own name) in one batched
    generate; responses go to the env padded to ``action_length`` (the env's action length).
    ``sampling`` goes to ``policy.generate_joint`` (``max_new_tokens`` may be below ``action_length``).

    ``sample_seeds`` (one int >= 0 per episode): sample each episode on its own, at step k under the
    seed ``distributed.group_seed(sample_seeds[i], 0, k, 0)`` in a forked RNG, so that an episode's
    samples depend neither on the rest of the batch nor on the process playing it (data-parallel
    runs). Unset: one batched generate per step from torch's global RNG.

    Returns the generations step by step (``[{role: Generation}]``), each role's summed reward (N,)
    and the infos of the last step."""
    names = {a: a for a in venv.possible_agents} if adapters is None else dict(adapters)
    missing = [a for a in venv.possible_agents if a not in names]
    if missing:
        raise ValueError(f"adapters maps {sorted(names)} but the env's agents include {missing}")
    if sample_seeds is not None and len(sample_seeds) != venv.num_envs:
        raise ValueError(f"got {len(sample_seeds)} sample_seeds for {venv.num_envs} episodes")
    obs, infos = venv.reset(seed=seeds if isinstance(seeds, int) else list(seeds), options=list(options))
    steps: list[dict[str, Any]] = []
    returns = {a: np.zeros(venv.num_envs) for a in venv.possible_agents}
    while venv.agents:
        if sample_seeds is None:
            prompts = {}
            for a in venv.agents:
                ids, mask = strip_left_padding(obs[a]["observation"], obs[a]["attention_mask"])
                prompts[names[a]] = (torch.as_tensor(ids), torch.as_tensor(mask))
            out = policy.generate_joint(prompts, 1, **sampling)
        else:
            from baselines.distributed import generate_per_group, group_seed

            step_seeds = [group_seed(int(s), 0, len(steps), 0) for s in sample_seeds]
            raw = {names[a]: (obs[a]["observation"], obs[a]["attention_mask"]) for a in venv.agents}
            out = generate_per_group(policy, raw, 1, step_seeds, **sampling)
        gens = {a: out[names[a]] for a in venv.agents}
        actions = {a: pad_actions(g.response_ids, action_length, policy.pad_token_id) for a, g in gens.items()}
        obs, rewards, _, _, infos = venv.step(actions)
        for a in rewards:
            returns[a] += rewards[a]
        steps.append(gens)
    return steps, returns, infos


# ----------------------------------------------------------------------------------------- evaluation
PASS_COMPONENTS = ("tests", "correct")
"""Reward components that mean "this sample solved the problem" (1.0): coding tests, math answers.
``correct_<role>`` components (CORY's GSM8K env) count per role."""


def evaluate(
    policy: Any,
    env_id: str,
    *,
    num_problems: int,
    num_samples: int = 1,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    greedy: bool = True,
    ks: Sequence[int] = (1,),
    seed: int = 0,
    split: str = "eval",
    env_kwargs: Mapping[str, Any] | None = None,
    adapters: Mapping[str, str] | None = None,
    episodes: list[dict[str, Any]] | None = None,
) -> dict[str, float]:
    """Roll the policy on the first ``num_problems`` problems of ``split``, ``num_samples`` episodes
    each, through the env (one batch of problems x samples; sequential envs role by role). Returns
    ``eval/total``, ``eval/<component>`` (means of the last turn's values), ``eval/return`` (sum over
    turns) and, when a component says whether a sample solved its problem (``tests`` on coding envs,
    ``correct`` on math envs), ``eval/pass@k`` for each k <= num_samples (``eval/pass@k_<role>`` for
    ``correct_<role>``). ``adapters`` maps env roles to the policy's adapters (default: same names).
    Torch's RNG is forked so that evaluating never changes what training samples next.

    ``episodes``: a list to extend with one transcript record per episode (prompts, responses,
    reward and components; :func:`baselines.samples.episode_records`)."""
    kwargs = dict(env_kwargs or {})
    kwargs["max_new_tokens"] = max_new_tokens
    # The env ends a response where the policy stopped generating it (every EOS id of the model).
    kwargs.setdefault("stop_token_ids", list(policy.eos_token_ids))
    venv = make_vector_env(env_id, num_problems * num_samples, **kwargs)
    total_problems = len(venv.envs[0].task.problems(split))
    if not 1 <= num_problems <= total_problems:
        raise ValueError(
            f"num_problems must be in [1, {total_problems}] for split {split!r} of {env_id}, got {num_problems!r}"
        )
    components = list(venv.envs[0].task.reward_components)
    options = [{"task_index": i, "split": split} for i in range(num_problems) for _ in range(num_samples)]
    was_training = policy.training
    policy.eval()
    with seeded(seed), torch.no_grad():
        _, returns, infos = play_episodes(
            policy,
            venv,
            seeds=seed,
            options=options,
            action_length=max_new_tokens,
            adapters=adapters,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            greedy=greedy,
        )
    policy.train(was_training)
    first = venv.possible_agents[0]
    info = infos[first]
    out = {"eval/total": float(np.mean(info["reward_total"])), "eval/return": float(returns[first].mean())}
    for c in components:
        out[f"eval/{c}"] = float(np.mean(info[f"reward_{c}"]))
    out.update(pass_metrics(info, components, num_problems, num_samples, ks))
    if episodes is not None:
        from baselines.samples import episode_records

        seeds = [seed + i for i in range(len(options))]
        episodes.extend(episode_records(venv.envs, seeds=seeds, options=options, models=adapters))
    venv.close()
    return out


def pass_metrics(
    info: Mapping[str, Any], components: Sequence[str], num_problems: int, num_samples: int, ks: Sequence[int]
) -> dict[str, float]:
    """``eval/pass@k`` from stacked infos whose rows are problem-major (problem i's samples are rows
    ``i*num_samples ... (i+1)*num_samples - 1``): a sample passes when its ``tests``/``correct``
    component is 1 (``eval/pass@k_<role>`` for ``correct_<role>``). Unbiased estimator, mean over problems.

    >>> pass_metrics({"reward_correct": [1.0, 0.0, 0.0, 0.0]}, ["correct"], 2, 2, [1, 2])
    {'eval/pass@1': 0.25, 'eval/pass@2': 0.5}
    """
    from llm_envs.evaluation import mean_pass_at_k

    out: dict[str, float] = {}
    for c in components:
        base, _, role = c.partition("_")
        if base not in PASS_COMPONENTS:
            continue
        passed = (np.asarray(info[f"reward_{c}"]) >= 1.0).reshape(num_problems, num_samples)
        for k in ks:
            if k <= num_samples:
                out[f"eval/pass@{k}" + (f"_{role}" if role else "")] = float(mean_pass_at_k(passed.tolist(), k))
    return out


def config_fields(config: Any) -> list[str]:
    return [f.name for f in fields(config)]
