"""The learners, one file each, read top to bottom as CleanRL's ``ppo.py`` reads: the paper, a short
summary and the command that runs it; a config dataclass; one ``main()`` loop from seeding to logging.
The math they share is in :mod:`baselines.rl`, the run around the loop in :mod:`baselines.infra`.

=========  ====================================================================================
magrpo     multi-agent group-relative policy optimisation (linear or tree rollouts)
ppo        one independent PPO learner per agent (IAC with ``--critic central``)
cory       two PPO agents that co-evolve as pioneer and observer and swap roles
maac       multi-agent actor-critic with one centralised critic
madpo      multi-agent direct preference optimisation, offline or iterative
marlhf     a joint reward model learned from preference pairs, then multi-agent RL on it
=========  ====================================================================================
"""
