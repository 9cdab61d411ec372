"""Moved to :mod:`baselines.learners.magrpo` (the learners): this path works, with a
DeprecationWarning, for one release."""

from baselines._moved import moved

__getattr__ = moved(__name__, "baselines.learners.magrpo")
