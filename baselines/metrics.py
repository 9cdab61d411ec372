"""Moved to :mod:`baselines.infra.metrics` (the machinery of a run): this path works, with a
DeprecationWarning, for one release."""

from baselines._moved import moved

__getattr__ = moved(__name__, "baselines.infra.metrics")
