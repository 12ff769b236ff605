"""Hidden Markov models: the model, EM (Baum-Welch), latent-variable-distillation init, LM
sampling for distillation, and the embedded default HMM."""

from pathlib import Path

from ctrlg.hmm.model import HMM, tokenizer_fingerprint
from ctrlg.hmm.prior_head import PriorHead

__all__ = ["HMM", "PriorHead", "tokenizer_fingerprint", "default_hmm_path", "load_default_hmm"]

DEFAULT_HMM_NAME = "hmm_smollm2_commongen"


def default_hmm_path() -> Path:
    """Directory of the embedded HMM checkpoint and its prior head (h = 256, distilled from
    SmolLM2-135M-Instruct on CommonGen-style prompts; see docs/hmm.md for how it was made)."""
    return Path(__file__).resolve().parent.parent / "assets" / DEFAULT_HMM_NAME


def load_default_hmm(*, tokenizer=None, device="cpu") -> HMM:
    """The embedded HMM (:func:`default_hmm_path`) with its LM-conditioned prior head as
    ``hmm.prior_head`` (None if the asset has none); with ``tokenizer``, checks both match."""
    return HMM.load(default_hmm_path(), tokenizer=tokenizer, device=device)
