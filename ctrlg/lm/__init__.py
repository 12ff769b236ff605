"""Language models as ctrlg uses them: loading, adapters, and scoring of finished candidates.

* :mod:`ctrlg.lm.models` — :func:`load_model` from a hub id, a local folder or an embedded GGUF
  file, with an optional peft adapter merged in;
* :mod:`ctrlg.lm.adapters` — adapters saved with the name of their base LM; loading checks it;
* :mod:`ctrlg.lm.adaptation` — LoRA fine-tuning on a list of texts (the generic recipe);
* :mod:`ctrlg.lm.hmm_lm` — an HMM wrapped as a causal LM (the exactness tests' LM);
* :mod:`ctrlg.lm.beam_likelihood` — log p_lm of each beam, summed during beam search;
* :mod:`ctrlg.lm.judge` — a second LM scoring candidates under its own prompt;
* :mod:`ctrlg.lm.mbr` — minimum Bayes risk selection among candidates;
* :mod:`ctrlg.lm.shared_context` — a prompt encoded once, its key/value cache shared by the rows
  that sample or score after it.

May import: :mod:`ctrlg.checkpoint`, :mod:`ctrlg.vocab`, :mod:`ctrlg.validation`,
:mod:`ctrlg.errors` and third-party packages. Nothing that knows about constraints (dfa, guide,
HMM, sampler) or tasks: the layers above call into this one.
"""
