"""The weight of PPO's per-token KL penalty to the reference policy: Ziegler et al.'s adaptive
controller (TRL's former ``AdaptiveKLController``), which steers the measured KL towards a target, or a
fixed coefficient. Each PPO model (CORY: each of the two) keeps its own controller whichever role it
plays; its value is saved with the checkpoints.
"""

from __future__ import annotations

import math
from typing import Any


class AdaptiveKLController:
    """Ziegler et al.'s adaptive KL coefficient (TRL's ``AdaptiveKLController``):
    ``e = clip(KL / target - 1, -0.2, 0.2)``; ``coef *= 1 + e * n_steps / horizon``.

    >>> ctl = AdaptiveKLController(0.3, target=6.0, horizon=10000)
    >>> ctl.update(12.0, n_steps=256); round(ctl.value, 6)
    0.301536
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: int) -> None:
        if not init_kl_coef >= 0 or not target > 0 or not horizon >= 1:
            raise ValueError(
                f"need init_kl_coef >= 0, target > 0, horizon >= 1; got {init_kl_coef!r}, {target!r}, {horizon!r}"
            )
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Adapt to the KL measured over ``n_steps`` episodes (a non-finite KL raises)."""
        if not math.isfinite(current_kl):
            raise FloatingPointError(f"the measured KL is {current_kl!r}; the KL controller cannot adapt to it")
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


class FixedKLController:
    """A constant KL coefficient with the adaptive controller's interface."""

    def __init__(self, kl_coef: float) -> None:
        if not kl_coef >= 0:
            raise ValueError(f"kl_coef must be >= 0, got {kl_coef!r}")
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Nothing adapts."""


def kl_controller(config: Any) -> AdaptiveKLController | FixedKLController:
    """The controller a PPO config asks for (``adaptive_kl``, ``init_kl_coef``, ``kl_target``, ``kl_horizon``)."""
    if config.adaptive_kl:
        return AdaptiveKLController(config.init_kl_coef, config.kl_target, config.kl_horizon)
    return FixedKLController(config.init_kl_coef)
