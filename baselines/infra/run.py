"""One training run: everything around a learner's algorithm, the same for MAGRPO, PPO and CORY (their
configs are :class:`~baselines.infra.config.LearnerConfig`). A learner reads::

    run = Run.begin(config)                       # threads, processes, run directory, seeds (run.rng)
    ...                                           # the policy, the envs, one optimizer per agent
    run.resume(policy, optimizers)                # --resume: the newest checkpoint that loads
    run.start(policy, optimizers, env_kwargs=...) # metrics and transcripts files, the progress bar
    with run.interruptible():                     # Ctrl-C: save the last iteration boundary, then stop
        run.evaluate_before()
        for iteration in run.iterations():
            ...                                   # rollout, rewards, advantages, update -> metrics
            run.write_samples(iteration + 1, ...) # transcripts of every --samples-every-th batch
            run.end_iteration(iteration + 1, metrics, ...)  # eval, log, boundary, checkpoint
        run.evaluate_after()
    result = run.finish(metrics)                  # the last checkpoint, the plot; the result dict

The state a checkpoint holds is taken at every iteration boundary (:meth:`Run.boundary`; an agent's
tensors are copied only when its optimizer is about to step): Ctrl-C in the middle of an iteration
saves the last boundary, never half-updated weights, so a resumed run is exactly the uninterrupted one.
Under torchrun or accelerate launch only rank 0 evaluates, logs, plots and writes checkpoints; the other
ranks wait for it at the same points (baselines/infra/distributed.py).
"""

from __future__ import annotations

import contextlib
import functools
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agents.memory import release_memory
from baselines.infra import distributed, evaluation
from baselines.infra.checkpoints import (
    BoundaryState,
    TrainerState,
    check_run_dir,
    interrupted,
    resume_checkpoint,
    save_checkpoint,
)
from baselines.infra.metrics import METRICS_FILE, MetricLogger
from baselines.infra.plots import plot_metrics
from baselines.infra.rng import seed_everything
from baselines.infra.samples import SampleWriter


class Run:
    """A run of ``config.learner`` in ``config.run_dir()``; build it with :meth:`begin`."""

    def __init__(self, config: Any, info: distributed.DistInfo, run_dir: Path, rng: Any) -> None:
        self.config = config
        self.info = info
        self.main = info.is_main
        """Rank 0 (or the only process): the one that logs, evaluates and writes checkpoints."""
        self.run_dir = run_dir
        self.rng = rng
        """The learner's numpy generator (problem sampling); saved and restored with the checkpoints."""
        self.start_step = 0
        self.step = 0
        """The last finished iteration (``start_step`` until one finishes)."""
        self.extra: dict[str, Any] = {}
        """Learner state saved with the checkpoints besides weights and RNGs (``eval_before``, ...)."""
        self.state: BoundaryState | None = None
        self.final_eval: dict[str, float] = {}
        self.logger: MetricLogger | None = None
        self.samples: SampleWriter | None = None

    @classmethod
    def begin(cls, config: Any) -> Run:
        """Before any model is loaded: torch threads, the process group (when launched with several),
        the settings checked against the number of processes, the run directory checked (a resumed
        run has a checkpoint; ``--overwrite`` deletes the old ones), every RNG seeded."""
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        info = distributed.init_from_env(device=config.device)
        config.check_processes(info.world_size)
        run_dir = config.run_dir()
        check_run_dir(run_dir, resume=config.resume, overwrite=config.overwrite)
        distributed.barrier()  # every rank has checked the directory before rank 0 changes it
        if not config.resume and config.overwrite and info.is_main and (run_dir / "checkpoints").exists():
            shutil.rmtree(run_dir / "checkpoints")
        return cls(config, info, run_dir, seed_everything(config.seed))

    def resume(self, policy: Any, optimizers: Mapping[str, torch.optim.Optimizer]) -> dict[str, Any]:
        """``--resume``: load weights, optimizer states and RNGs from the newest checkpoint that loads
        and continue after its step. Returns the learner's extra state (``{}`` for a new run)."""
        config = self.config
        if config.resume:
            trainer = resume_checkpoint(
                self.run_dir,
                learner=config.learner,
                config=config,
                policy=policy,
                optimizers=optimizers,
                rng=self.rng,
                ignore=config.resumable_fields,
            )
            self.start_step = self.step = int(trainer["step"])
            self.extra = dict(trainer["extra"])
        return self.extra

    def start(
        self,
        policy: Any,
        optimizers: Mapping[str, torch.optim.Optimizer],
        *,
        env_kwargs: Mapping[str, Any] | Callable[[Mapping[str, str]], Mapping[str, Any]],
        adapters: Callable[[int], Mapping[str, str]] | None = None,
        extra_state: Callable[[], Mapping[str, Any]] | None = None,
        weights: str = "adapter weights",
    ) -> None:
        """Make the replicas identical, open the metrics and transcripts files (rank 0) and the
        progress bar, and take the first boundary. ``env_kwargs``: the envs' arguments, for the
        evaluations; ``adapters(iteration)``: which adapter plays which role in an iteration (the
        evaluations use the last trained iteration's), and then ``env_kwargs`` may be a function of that
        assignment (role -> adapter) giving the envs' arguments for it (CORY's models of different
        tokenizers: each role's env speaks its player's tokenizer); ``extra_state()``: learner state to
        checkpoint at each boundary (PPO's KL coefficients); ``weights`` names them in the sync check's error."""
        from tqdm.auto import tqdm

        if callable(env_kwargs) and adapters is None:
            raise ValueError("env_kwargs is a function of the roles' adapters, so Run.start needs adapters= too")
        config = self.config
        self.policy, self.optimizers = policy, optimizers
        self.env_kwargs, self.adapters, self.extra_state, self.weights = env_kwargs, adapters, extra_state, weights
        self.params = [p for agent in optimizers for p in policy.parameters(agent)]
        for agent, optimizer in optimizers.items():
            # Copy on write: an agent's boundary state is copied just before its optimizer changes it.
            optimizer.register_step_pre_hook(functools.partial(self._before_step, agent))
        distributed.broadcast_params(self.params)  # identical replicas whatever each rank's RNG did
        if self.main:
            resume_step = self.start_step if config.resume else None
            self.logger = MetricLogger(
                self.run_dir,
                tensorboard=config.tensorboard,
                wandb_project=config.wandb_project,
                config=config,
                resume_step=resume_step,
            )
            self.samples = SampleWriter(self.run_dir, logger=self.logger, resume_step=resume_step,
                                        train_every=config.samples_every, num_iterations=config.num_iterations)
        self.bar = tqdm(
            range(self.start_step, config.num_iterations),
            initial=self.start_step,
            total=config.num_iterations,
            disable=not (config.progress and self.main),
            desc=config.learner,
            dynamic_ncols=True,
        )
        self.state = self.boundary(self.start_step)
        policy.train()

    def iterations(self) -> Iterator[int]:
        """The iterations still to run (0-based), with a progress bar."""
        return iter(self.bar)

    # ------------------------------------------------------------------------------ each iteration
    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if self.logger is not None:
            self.logger.log(step, metrics)

    def evaluate(self, step: int, *, validation: bool = False) -> dict[str, float]:
        """Evaluate on the eval split (rank 0 only: the replicas are identical; the others wait) with
        the roles of the last trained iteration (``step - 1``; the first before training), and write
        the episodes' transcripts. ``validation``: on the train split's held-out problems instead
        (``--num-validation-problems``; ``val/*`` metrics, no transcripts)."""
        config = self.config
        count = config.num_validation_problems if validation else config.num_eval_problems
        if count == 0:
            return {}
        if not self.main:
            distributed.barrier()
            return {}
        episodes: list[dict[str, Any]] = []
        adapters = None if self.adapters is None else self.adapters(max(step - 1, 0))
        env_kwargs = self.env_kwargs(adapters) if callable(self.env_kwargs) else self.env_kwargs
        where = {"split": "train", "first": -count, "prefix": "val"} if validation else {}
        result = evaluation.evaluate(
            self.policy,
            config.env,
            num_problems=count,
            max_new_tokens=config.max_new_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            greedy=config.eval_greedy,
            sampling=config.eval_sampling(list(self.policy.agents)),
            seed=config.seed,
            env_kwargs=env_kwargs,
            adapters=adapters,
            episodes=None if validation else episodes,
            **where,
        )
        if not validation:
            assert self.samples is not None
            self.samples.write_eval(step, episodes)
        distributed.barrier()
        return result

    def draw_problems(self, n_train: int, size: int) -> np.ndarray:
        """``size`` train-split problem indices for a batch, drawn with the run's RNG from the first
        ``n_train - num_validation_problems`` (the rest are held out for validation), with replacement only
        when there are fewer than ``size``. ``n_train``: the train split's length."""
        held = self.config.num_validation_problems
        if held >= n_train:
            raise ValueError(
                f"num_validation_problems ({held}) must leave training problems: the train split of "
                f"{self.config.env} has {n_train}"
            )
        n = n_train - held
        return self.rng.choice(n, size=size, replace=n < size)

    def evaluate_before(self) -> None:
        """The evaluation before training (not again when a resumed run has one)."""
        if "eval_before" not in self.extra:
            before = self.evaluate(self.start_step)
            if self.main:
                self.extra["eval_before"] = before
            if before:
                self.log(0, before)
            self.state = self.boundary(self.start_step)

    def write_samples(
        self,
        step: int,
        envs: Sequence[Any],
        seeds: Sequence[int | None],
        options: Sequence[Mapping[str, Any]],
        models: Mapping[str, str] | None = None,
    ) -> None:
        """The first episodes of a training batch to ``samples.jsonl`` (every ``--samples-every``-th)."""
        if self.samples is not None:
            self.samples.write_train(step, envs, seeds=seeds, options=options, models=models)

    def end_iteration(self, step: int, metrics: dict[str, float], **postfix: str) -> None:
        """After iteration ``step`` (1-based): the evaluation every ``--eval-every`` iterations (added to
        ``metrics``), the metrics line, the progress bar's ``postfix``, the boundary state and the
        checkpoint every ``--checkpoint-every`` iterations (the last one comes from :meth:`finish`)."""
        config = self.config
        if config.eval_every and step % config.eval_every == 0 and step < config.num_iterations:
            metrics.update(self.evaluate(step))
        self.log(step, metrics)
        self.bar.set_postfix(**postfix)
        self.step = step
        self.state = self.boundary(step)
        if config.checkpoint_every and step % config.checkpoint_every == 0 and step < config.num_iterations:
            self.checkpoint(self.state, step)

    def evaluate_after(self) -> None:
        """The evaluation after the last iteration."""
        self.bar.close()
        self.final_eval = self.evaluate(self.step)
        if self.config.num_validation_problems:
            self.final_eval.update(self.evaluate(self.step, validation=True))

    # ------------------------------------------------------------------------------ state
    def boundary(self, step: int) -> BoundaryState | None:
        """The state after iteration ``step``, copied on write (rank 0 only: it alone writes checkpoints)."""
        if not self.main:
            return None
        if self.extra_state is not None:
            self.extra.update(self.extra_state())
        if self.adapters is not None:  # who played which role last (CORY swaps them): what `llm-envs eval` loads
            players = self.adapters(max(step - 1, 0))
            self.extra["adapters"] = dict(players)
            self.extra["models"] = [m for m in self.policy.agents if m in players.values()]
        return BoundaryState(step=step, policy=self.policy, optimizers=self.optimizers, rng=self.rng, extra=self.extra)

    def _before_step(self, agent: str, _optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if self.state is not None:
            self.state.freeze(agent)

    def checkpoint(self, state: BoundaryState | TrainerState | None, step: int, wait: bool = True) -> Path:
        """Write ``state`` (rank 0); with ``wait`` the ranks first check that their weights agree and
        afterwards wait until the checkpoint is complete."""
        path = self.run_dir / "checkpoints" / f"step_{step:06d}"
        if wait:
            distributed.check_in_sync(self.params, self.weights)
        if state is not None:
            if isinstance(state, BoundaryState):
                state = state.resolve()
            path = save_checkpoint(self.run_dir, state, learner=self.config.learner, config=self.config,
                                   policy=self.policy)
        if wait:
            distributed.barrier()  # nobody reads or resumes from a half-written checkpoint
        return path

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """Ctrl-C inside the block saves the last boundary's state (unless its checkpoint exists),
        says how to resume, closes the logs and re-raises."""
        try:
            yield
        except KeyboardInterrupt:
            self.bar.close()
            interrupted(self.state, self.run_dir, self.checkpoint, wait=not self.info.distributed)
            if self.logger is not None:
                self.logger.close()
            raise

    def finish(self, metrics: Mapping[str, float]) -> dict[str, Any]:
        """Log the final evaluation, write the last checkpoint, close the logs and plot the curves.
        Returns the last iteration's ``metrics`` with ``eval/*`` (after), ``eval_before/*``, ``plot``
        (rank 0) and ``run_dir``."""
        if self.final_eval:
            self.log(self.step, self.final_eval)
        self.checkpoint(self.state, self.step)
        if self.logger is not None:
            self.logger.close()
        result: dict[str, Any] = dict(metrics)
        result.update(self.final_eval)
        result.update({f"eval_before/{k.split('/', 1)[1]}": v for k, v in self.extra.get("eval_before", {}).items()})
        if self.main:
            # The last update's freed working set goes back to the OS first: drawing the curves
            # (matplotlib) would otherwise be the run's peak.
            release_memory()
            try:
                result["plot"] = str(plot_metrics(self.run_dir / METRICS_FILE))
            except ValueError:
                pass  # nothing to plot yet (no iteration ran)
        result["run_dir"] = str(self.run_dir)
        return result


def mean_over_agents(metrics: Mapping[str, float], names: Sequence[str], agents: Sequence[str]) -> dict[str, float]:
    """``losses/<name>``: the mean of ``agent_<a>/<name>`` over the agents that logged it.

    >>> mean_over_agents({"agent_a/loss": 1.0, "agent_b/loss": 3.0}, ["loss", "kl"], ["a", "b"])
    {'losses/loss': 2.0}
    """
    out = {}
    for name in names:
        values = [metrics[f"agent_{a}/{name}"] for a in agents if f"agent_{a}/{name}" in metrics]
        if values:
            out[f"losses/{name}"] = float(np.mean(values))
    return out
