"""Moved to :mod:`baselines.learners.maac` (the learners): this path works, with a
DeprecationWarning, for one release."""

from baselines._moved import moved

__getattr__ = moved(__name__, "baselines.learners.maac")
