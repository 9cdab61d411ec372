"""Checkpoints of a run and ``--resume``.

=========================  ==========================================================================
``TrainerState``           everything a checkpoint holds, copied at an iteration boundary
``BoundaryState``          the same, copied on write: an agent's tensors only before its optimizer steps
``save_checkpoint``        policy adapters, optimizers, RNG states, step and config, written to a
                           temporary directory and moved into place with ``os.replace``; ``latest``
                           names the newest complete one
``load_checkpoint``        reads and checks everything (format, config, files) before changing state
``resume_checkpoint``      ``--resume``: the newest checkpoint that loads (a damaged one is skipped with
                           a warning)
``check_run_dir``          before loading a model: a resumed run has a checkpoint, a new run writes
                           over none
``interrupted``            Ctrl-C: save the last boundary's state and say how to resume
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

import copy
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from baselines.infra.metrics import atomic_write_text, config_dict
from baselines.infra.rng import rng_state, set_rng_state

CHECKPOINT_FORMAT = "llm-envs-trainer-v1"
TRAINER_FILE = "trainer.json"
LATEST_FILE = "latest"


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt or does not fit the run that tries to load it."""


class CheckpointMismatchError(CheckpointError):
    """An intact checkpoint of another learner or config: no older checkpoint of the run would fit either."""


class CheckpointFallbackWarning(UserWarning):
    """``--resume`` skipped a damaged checkpoint and continues from an older one."""

@dataclass
class TrainerState:
    """Everything a checkpoint holds, copied at one moment (an iteration boundary): later updates,
    sampling or evaluation do not change it. :func:`save_checkpoint` writes one.

    Learners mark a :class:`BoundaryState` at every iteration boundary and resolve it into this when a
    checkpoint is written; Ctrl-C in the middle of an iteration then saves the last boundary's state,
    never the half-updated live weights (a resumed run is then exactly the uninterrupted run)."""

    step: int
    policy: dict[str, dict[str, torch.Tensor]]
    optimizers: dict[str, dict[str, Any]]
    rng: dict[str, Any]
    extra: dict[str, Any]


class BoundaryState:
    """The state at an iteration boundary, copied on write: what :class:`TrainerState` holds, but an
    agent's adapter, value head and optimizer state are copied only when its optimizer is about to
    step (:meth:`freeze`, which :class:`~baselines.infra.run.Run` calls from a step pre-hook on every
    optimizer), not at the boundary itself.

    Until then the live tensors *are* the boundary's (rollouts, scoring and evaluations do not change
    them), so nothing is held twice through the rollout and the first agent's forward and backward;
    an agent's copy appears only once its gradients are computed and its activations freed. On the
    MAGRPO bench (two SmolLM2-135M adapters, rank 16) the eager copy held 117 MB through every update.
    The RNG states and the learner's extra state are copied at the boundary, as before (they are small
    and change during rollouts). :meth:`resolve` gives the :class:`TrainerState` a checkpoint writes.
    """

    def __init__(
        self,
        *,
        step: int,
        policy: Any,
        optimizers: Mapping[str, torch.optim.Optimizer],
        rng: np.random.Generator,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        self.step = int(step)
        self.rng = copy.deepcopy(rng_state(rng))
        self.extra = copy.deepcopy(dict(extra or {}))
        self._policy = policy
        self._optimizers = dict(optimizers)
        self._files: dict[str, dict[str, torch.Tensor]] = {}
        self._frozen: dict[str, dict[str, Any]] = {}  # agent -> its optimizer's state_dict, once copied

    @property
    def frozen(self) -> tuple[str, ...]:
        """The agents whose boundary state has been copied (their live tensors may have moved on)."""
        return tuple(self._frozen)

    def freeze(self, agent: str) -> None:
        """Copy ``agent``'s boundary state before its weights or optimizer state change (idempotent).
        The agent counts as frozen only once both copies are complete, so an interrupt in the middle
        leaves the live, still unchanged, tensors in charge."""
        if agent in self._frozen:
            return
        files = self._policy.state(agents=[agent])
        optimizer = copy.deepcopy(self._optimizers[agent].state_dict())
        self._files.update(files)
        self._frozen[agent] = optimizer

    def resolve(self) -> TrainerState:
        """The boundary's :class:`TrainerState`: the frozen copies, and copies of the live tensors of
        the agents that have not stepped since the boundary."""
        live = [a for a in self._policy.agents if a not in self._frozen]
        files = self._policy.state(agents=live) if live else {}
        files.update(self._files)
        optimizers = {
            agent: self._frozen[agent] if agent in self._frozen else copy.deepcopy(opt.state_dict())
            for agent, opt in self._optimizers.items()
        }
        return TrainerState(self.step, files, optimizers, self.rng, self.extra)


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
        trainer = {
            "format": CHECKPOINT_FORMAT,
            "learner": learner,
            "step": state.step,
            "config": config_dict(config),
            **write_rng(state.rng, tmp / "rng.pt"),
            "extra": dict(state.extra),
        }
        (tmp / TRAINER_FILE).write_text(json.dumps(trainer, indent=1), encoding="utf-8")
        if final.exists():  # re-saving the same step (e.g. a resumed run that ends where it started)
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    atomic_write_text(root / LATEST_FILE, final.name + "\n")
    old = sorted(p for p in root.glob("step_*") if p.is_dir() and p != final)
    for path in old[: max(0, len(old) - (keep - 1))]:
        shutil.rmtree(path, ignore_errors=True)
    return final


def interrupted(
    state: TrainerState | BoundaryState | None,
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


def write_rng(rng: Mapping[str, Any], path: Path) -> dict[str, Any]:
    """Write the tensor part of an :func:`baselines.infra.rng.rng_state` to ``path`` (``torch.save``);
    returns the rest as JSON (numpy's and python's generators), for :func:`rng_from`."""
    torch.save({k: v for k, v in rng.items() if k in ("torch", "cuda")}, path)
    return {
        "numpy_generator": rng["numpy_generator"],
        "numpy_global": _numpy_global_to_json(rng["numpy_global"]),
        "python": [rng["python"][0], list(rng["python"][1]), rng["python"][2]],
    }


def rng_from(tensors: Mapping[str, Any], record: Mapping[str, Any]) -> dict[str, Any]:
    """The :func:`baselines.infra.rng.rng_state` that :func:`write_rng` wrote: its file's ``tensors``
    (``torch.load``) and its JSON ``record``."""
    python = record["python"]
    return {
        **tensors,
        "numpy_generator": record["numpy_generator"],
        "numpy_global": _numpy_global_from_json(record["numpy_global"]),
        "python": (python[0], tuple(python[1]), python[2]),
    }


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
    ours, theirs = config_dict(config), trainer.get("config", {})
    # A setting added after the checkpoint was written counts as unchanged at its default (the default is
    # what the code computed before the setting existed).
    skip = set(ignore) | {k for k, v in field_defaults(config).items() if k not in theirs and ours.get(k) == v}
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
    set_rng_state(rng_from(tensors["rng.pt"], trainer), rng)
    return trainer


def field_defaults(config: Any) -> dict[str, Any]:
    """The defaults of a dataclass config's fields (those with one).

    >>> from baselines.learners.magrpo import Config
    >>> field_defaults(Config())["kl_in"]
    'loss'
    """
    import dataclasses

    if not dataclasses.is_dataclass(config):
        return {}
    return {f.name: f.default for f in dataclasses.fields(config) if f.default is not dataclasses.MISSING}


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
