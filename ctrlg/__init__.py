"""ctrlg: probabilistic control of language models.

Constraints are token-level DFAs (:mod:`ctrlg.dfa`); an HMM distilled from the LM
(:class:`ctrlg.HMM`) estimates how likely each next token makes the constraint satisfiable
(:mod:`ctrlg.guide`), and :mod:`ctrlg.sampler` plugs that into ``transformers.generate``.
Heavy dependencies (transformers) are imported lazily: ``ctrlg.ConstraintLogitsProcessor``,
``ctrlg.Generation`` and ``ctrlg.generate`` load :mod:`ctrlg.sampler` on first access.

The packages, the data flow between them and what each may import: docs/architecture.md. This
module may import :mod:`ctrlg.errors`, :mod:`ctrlg.vocab`, :mod:`ctrlg.dfa`, :mod:`ctrlg.hmm` and
:mod:`ctrlg.sampler`.
"""

from ctrlg import dfa
from ctrlg.errors import (
    CheckpointError,
    CheckpointWriteError,
    ConstraintError,
    ContextLengthError,
    CtrlgError,
    HMMParameterError,
    RegexError,
    UnsatisfiableConstraintError,
    UnsupportedRegexError,
    VocabularyMismatchError,
)
from ctrlg.hmm.model import HMM
from ctrlg.vocab import Vocabulary

__version__ = "0.1.0"

__all__ = [
    "ConstraintLogitsProcessor",
    "HMM",
    "Vocabulary",
    "dfa",
    "generate",
    "CheckpointError",
    "CheckpointWriteError",
    "ConstraintError",
    "ContextLengthError",
    "CtrlgError",
    "HMMParameterError",
    "RegexError",
    "UnsatisfiableConstraintError",
    "UnsupportedRegexError",
    "VocabularyMismatchError",
]


_FROM_SAMPLER = ("ConstraintLogitsProcessor", "Generation", "generate")


def __getattr__(name):
    if name in _FROM_SAMPLER:
        from ctrlg import sampler  # imports transformers (seconds): only when generating

        return getattr(sampler, name)
    raise AttributeError(f"module 'ctrlg' has no attribute {name!r}")
