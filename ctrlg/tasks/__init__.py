"""One package per task: the task's constraint, adaptation recipe and decoding pipeline, built from
the library below it. Experiments (``experiments/*.py``) are thin entry points that call these.

* :mod:`ctrlg.tasks.commongen` — CommonGen (Lin et al. 2020): keyword constraints, LoRA
  adaptation, decoding with ctrlg / logical masking, reranking, judges, scoring and tables.

May import every other ctrlg package (lm, dfa, hmm, guide, sampler, data, metrics, ...); no
library package imports a task.
"""
