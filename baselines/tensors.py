"""Moved to :mod:`baselines.rl.tensors` (the RL math the learners share): this path works, with a
DeprecationWarning, for one release."""

from baselines._moved import moved

__getattr__ = moved(__name__, "baselines.rl.tensors")
