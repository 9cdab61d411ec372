"""The baseline learners and what they share, in three folders:

* :mod:`baselines.learners`: one file per algorithm (MAGRPO, PPO, CORY, MAAC, MADPO, MARLHF);
* :mod:`baselines.rl`: the RL math they share (policy gradient, advantages, critic, KL, preferences);
* :mod:`baselines.infra`: the machinery of a run (command line, config, checkpoints, data parallelism,
  playing episodes, evaluation, metrics, report).

The modules' former paths (``baselines.magrpo``, ``baselines.cli``, ...) still import, with a
DeprecationWarning, for one release.
"""
