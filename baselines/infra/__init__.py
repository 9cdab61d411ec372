"""The machinery of a run, the same for every learner: the command line, the shared config, the run
directory and its logs, checkpoints, data parallelism, playing episodes, evaluation and the report.

===========  ==================================================================================
cli          the ``llm-envs`` command line (``list``, ``demo``, ``train``, ``eval``, ``plot``, ``report``)
config       the settings the learners share (their ``--flags``), each defined once
run          one training run around a learner's loop: directory, logs, evaluations, Ctrl-C
checkpoints  checkpoints of a run and ``--resume``
distributed  data-parallel training across processes (``torchrun`` / ``accelerate launch``)
play         playing episodes through the env API, every role sampling from its adapter
evaluation   mean reward, returns over turns and pass@k on the eval split
metrics      ``metrics.jsonl``, TensorBoard and W&B
samples      transcripts of what the agents wrote (``samples.jsonl``)
plots        learning curves (``llm-envs plot``)
report       one self-contained HTML page per run (``llm-envs report``)
rng          seeding and the state of every generator
===========  ==================================================================================
"""
