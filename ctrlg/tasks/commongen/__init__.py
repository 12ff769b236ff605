"""CommonGen with Ctrl-G: from a concept set to a scored table.

* :mod:`~ctrlg.tasks.commongen.adaptation` — the LoRA adaptation recipe (unsupervised / supervised);
* :mod:`~ctrlg.tasks.commongen.methods` — the configured methods (guide, prior, beams, K) and
  config checks;
* :mod:`~ctrlg.tasks.commongen.decoding` — prompts, constraints and decoding of one batch with each
  method;
* :mod:`~ctrlg.tasks.commongen.rerank` — picking one output among the K candidates (LM
  log-likelihood with a length penalty, MBR, a judge LM) and re-picking recorded runs offline;
* :mod:`~ctrlg.tasks.commongen.scoring` — metrics, bootstrap intervals and the printed tables.

May import every library package below :mod:`ctrlg.tasks` (lm, data, dfa, hmm, guide, sampler,
metrics, validation, vocab, errors); never ``experiments``.
"""
