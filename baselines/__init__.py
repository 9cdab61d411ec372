"""The baseline learners and what they share, in three folders:

* :mod:`baselines.learners`: one file per algorithm (MAGRPO, PPO, CORY, MAAC, MADPO, MARLHF);
* :mod:`baselines.rl`: the RL math they share (policy gradient, advantages, critic, KL, preferences);
* :mod:`baselines.infra`: the machinery of a run (command line, config, checkpoints, data parallelism,
  playing episodes, evaluation, metrics, report).

The modules' paths before 0.2.0 (``baselines.magrpo``, ``baselines.cli``, ...) are gone: CHANGELOG.md
lists where each went.
"""
