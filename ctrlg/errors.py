"""Exceptions raised by ctrlg. All are ``ValueError`` subclasses whose message names the
offending input, so callers can catch ``ValueError`` or the specific class."""

__all__ = [
    "CtrlgError",
    "ConstraintError",
    "UnsatisfiableConstraintError",
    "VocabularyMismatchError",
    "ContextLengthError",
    "HMMParameterError",
    "CheckpointError",
    "CheckpointWriteError",
    "RegexError",
    "UnsupportedRegexError",
    "SchemaError",
    "UnsupportedSchemaError",
    "GrammarError",
    "UnsupportedGrammarError",
    "ExperimentConfigError",
    "InsufficientMemoryError",
]


class CtrlgError(ValueError):
    """Base class of every error ctrlg raises on bad input."""


class ConstraintError(CtrlgError):
    """A malformed automaton or builder argument (empty phrase, token out of range, ...)."""


class UnsatisfiableConstraintError(ConstraintError):
    """The constraint's language is empty, or cannot be met within the token budget."""


class VocabularyMismatchError(CtrlgError):
    """Two objects (DFA, HMM, LM, tokenizer) disagree on the vocabulary."""


class ContextLengthError(ConstraintError):
    """A prompt (with the new tokens and any suffix) longer than the LM's maximum positions."""


class HMMParameterError(CtrlgError):
    """HMM parameters that are not probability distributions (NaN, negative, rows not summing to 1)."""


class CheckpointError(CtrlgError):
    """A checkpoint that is truncated, corrupt, or made for another tokenizer."""


class CheckpointWriteError(CheckpointError, OSError):
    """A checkpoint that cannot be written where the caller asked (an unwritable or missing folder,
    a full disk); the message names that path, never an internal staging folder. Also an
    ``OSError``, so ``except OSError`` keeps working."""


class RegexError(CtrlgError):
    """An empty or syntactically invalid regular expression."""


class UnsupportedRegexError(RegexError):
    """A regex construct that is not regular (backreferences, lookaround, ...)."""


class SchemaError(CtrlgError):
    """A JSON Schema that is malformed or contradictory (the message names its JSON path)."""


class UnsupportedSchemaError(SchemaError):
    """A JSON Schema keyword outside the supported subset (the message names it and its path)."""


class GrammarError(ConstraintError):
    """A context-free grammar that is malformed or generates nothing (the message names the rule
    or terminal and its line)."""


class UnsupportedGrammarError(GrammarError):
    """A grammar construct outside the supported subset (the message names it and its line)."""


class ExperimentConfigError(CtrlgError):
    """An experiment or task configuration that cannot run (a size of 0, an unknown method, a
    resume folder that does not match); raised before the LM or HMM is loaded where possible."""


class InsufficientMemoryError(CtrlgError, MemoryError):
    """A request whose estimated working set (LM decoding, rescoring, guide tables: see
    :mod:`ctrlg.memory`) exceeds the memory available, refused before any of that work; the
    message gives the estimate, its parts, the memory available and what to lower. Also a
    ``MemoryError``, so ``except MemoryError`` keeps working."""
