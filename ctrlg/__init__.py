"""ctrlg: probabilistic control of language models.

Constraints are token-level DFAs (:mod:`ctrlg.dfa`); an HMM distilled from the LM
(:class:`ctrlg.HMM`) estimates how likely each next token makes the constraint satisfiable
(:mod:`ctrlg.guide`), and :mod:`ctrlg.sampler` plugs that into ``transformers.generate``.
Heavy dependencies (transformers) are imported lazily.
"""

from ctrlg import dfa
from ctrlg.errors import (
    CheckpointError,
    ConstraintError,
    CtrlgError,
    HMMParameterError,
    RegexError,
    UnsatisfiableConstraintError,
    UnsupportedRegexError,
    VocabularyMismatchError,
)
from ctrlg.hmm.model import HMM

__version__ = "0.1.0"

__all__ = [
    "HMM",
    "dfa",
    "generate",
    "CheckpointError",
    "ConstraintError",
    "CtrlgError",
    "HMMParameterError",
    "RegexError",
    "UnsatisfiableConstraintError",
    "UnsupportedRegexError",
    "VocabularyMismatchError",
]


def __getattr__(name):
    if name == "generate":
        from ctrlg.sampler import generate

        return generate
    raise AttributeError(f"module 'ctrlg' has no attribute {name!r}")
