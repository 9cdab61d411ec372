"""The names that lived here before the run machinery was split by concept, re-exported so that
``from baselines.common import X`` keeps working. New code imports them from their modules:

========================  ===================================================================
:mod:`baselines.tensors`  ``masked_mean``, ``strip_left_padding``, ``pad_actions``
:mod:`baselines.rng`      ``seed_everything``, ``seeded``, ``rng_state``, ``set_rng_state``
:mod:`baselines.metrics`  ``MetricLogger``, ``read_metrics``, ``METRICS_FILE``, ``METRIC_PREFIXES``
:mod:`baselines.checkpoints`  ``TrainerState``, ``save_checkpoint``, ``load_checkpoint``,
                          ``resume_checkpoint``, ``find_checkpoint``, ``check_run_dir``,
                          ``interrupted``, ``CheckpointError`` and its kin
:mod:`baselines.plots`    ``plot_metrics``, ``smooth``
:mod:`baselines.play`     ``play_episodes``, ``probe_env``
:mod:`baselines.evaluation`  ``evaluate``, ``pass_metrics``, ``eval_table``
:mod:`llm_envs.core.vector`  ``SequentialVectorEnv``, ``make_vec`` (``make_vector_env`` here)
========================  ===================================================================

Replacing a name here (``monkeypatch.setattr(baselines.common, ...)``) changes nothing: the learners
read the modules above.
"""

from baselines.checkpoints import (
    CHECKPOINT_FORMAT,
    LATEST_FILE,
    TRAINER_FILE,
    CheckpointError,
    CheckpointFallbackWarning,
    CheckpointMismatchError,
    TrainerState,
    check_run_dir,
    find_checkpoint,
    interrupted,
    load_checkpoint,
    resume_candidates,
    resume_checkpoint,
    save_checkpoint,
    saved_steps,
)
from baselines.evaluation import PASS_COMPONENTS, eval_table, evaluate, pass_metrics
from baselines.metrics import METRIC_PREFIXES, METRICS_FILE, MetricLogger, check_metric_names, read_metrics
from baselines.play import play_episodes, probe_env
from baselines.plots import plot_metrics, smooth
from baselines.rng import rng_state, seed_everything, seeded, set_rng_state
from baselines.tensors import masked_mean, pad_actions, strip_left_padding
from llm_envs.core.vector import SequentialVectorEnv
from llm_envs.core.vector import make_vec as make_vector_env

__all__ = [
    "CHECKPOINT_FORMAT",
    "LATEST_FILE",
    "METRICS_FILE",
    "METRIC_PREFIXES",
    "PASS_COMPONENTS",
    "TRAINER_FILE",
    "CheckpointError",
    "CheckpointFallbackWarning",
    "CheckpointMismatchError",
    "MetricLogger",
    "SequentialVectorEnv",
    "TrainerState",
    "check_metric_names",
    "check_run_dir",
    "eval_table",
    "evaluate",
    "find_checkpoint",
    "interrupted",
    "load_checkpoint",
    "make_vector_env",
    "masked_mean",
    "pad_actions",
    "pass_metrics",
    "play_episodes",
    "plot_metrics",
    "probe_env",
    "read_metrics",
    "resume_candidates",
    "resume_checkpoint",
    "rng_state",
    "save_checkpoint",
    "saved_steps",
    "seed_everything",
    "seeded",
    "set_rng_state",
    "smooth",
    "strip_left_padding",
]
