"""Hidden Markov models: the model, EM (Baum-Welch), latent-variable-distillation init, and LM
sampling for distillation."""

from ctrlg.hmm.model import HMM, tokenizer_fingerprint

__all__ = ["HMM", "tokenizer_fingerprint"]
