"""Argument checks shared by the public entry points: counts, token-id tensors, vocabulary widths.

Every check raises a :class:`ctrlg.errors.CtrlgError` subclass (a ``ValueError``) whose message
names the argument, what was given, and what is expected — never a bare ``TypeError`` /
``IndexError`` from deep inside numpy or torch, and never a silent coercion (a float id is not
truncated, a count of 0 is not turned into 1).

**Vocabulary widths (the one rule).** A constraint (DFA) and an HMM cover token ids ``[0, V)``.
An LM's logits may be *wider* than V only by padding: columns past the tokenizer's vocabulary that
no text ever maps to (many LMs round their output layer up, e.g. to a multiple of 64). So with a
tokenizer of ``T`` tokens (``len(tokenizer)``, added tokens included) and ``W`` logits::

    T ≤ V ≤ W          (padding columns [V, W) get probability 0)

A V below T would silently forbid every real token ≥ V; a V above W names tokens the LM cannot
produce. Without a tokenizer, only ``V ≤ W`` can be checked, and the padding ``W − V`` must stay
below :data:`MAX_PADDING` columns.
"""

from __future__ import annotations

import operator

import torch

from ctrlg.errors import ConstraintError, VocabularyMismatchError

__all__ = ["MAX_PADDING", "check_count", "check_vocab_width", "as_token_ids", "check_float_scores"]

# Largest padding of an LM's output layer past the constraint's vocabulary when no tokenizer says
# where the real vocabulary ends (Qwen2 pads 151,665 tokens to 151,936: 271 columns).
MAX_PADDING = 1024


def check_count(name: str, value, *, minimum: int = 0, error=ConstraintError) -> int:
    """``value`` as an int ≥ ``minimum`` (bools, floats and strings are rejected)."""
    try:
        if isinstance(value, (bool, float)):
            raise TypeError
        value = operator.index(value)          # ints, numpy and 0-d torch integer scalars
    except TypeError:
        raise error(f"{name} must be an int ≥ {minimum}, got {value!r}") from None
    if value < minimum:
        raise error(f"{name} must be an int ≥ {minimum}, got {value}")
    return int(value)


def check_vocab_width(vocab_size: int, lm_width: int, *, tokenizer_size: int | None = None,
                      what: str = "constraint") -> None:
    """Raise VocabularyMismatchError unless a ``what`` over ``vocab_size`` tokens fits an LM with
    ``lm_width`` logits and a tokenizer of ``tokenizer_size`` tokens (module docstring)."""
    V, W = int(vocab_size), int(lm_width)
    if V > W:
        raise VocabularyMismatchError(
            f"the {what} has vocabulary size {V} but the LM outputs only {W} logits; build it "
            f"with vocab_size={W} or a matching tokenizer")
    if tokenizer_size is not None and V < int(tokenizer_size):
        raise VocabularyMismatchError(
            f"the {what} has vocabulary size {V} but the tokenizer has {int(tokenizer_size)} "
            f"tokens, so every token id ≥ {V} would be silently forbidden; build it with "
            f"vocab_size={int(tokenizer_size)} (or the LM's {W})")
    if tokenizer_size is None and W - V > MAX_PADDING:
        raise VocabularyMismatchError(
            f"the {what} has vocabulary size {V} but the LM outputs {W} logits: {W - V} columns "
            f"is more than output-layer padding (≤ {MAX_PADDING}); build it with the LM's "
            f"vocabulary size")


def as_token_ids(ids, name: str = "ids", *, vocab_size: int | None = None,
                 device=None) -> torch.Tensor:
    """``ids`` (tensor, array or nested lists of ints) as an int64 tensor; floats, bools and
    out-of-range ids are rejected with a message naming ``name``."""
    try:
        tensor = torch.as_tensor(ids, device=device)
    except (TypeError, ValueError, RuntimeError) as err:
        raise ConstraintError(f"{name} must be integer token ids (a tensor or nested lists of "
                              f"ints of equal length), got {type(ids).__name__} ({err})") from None
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        raise ConstraintError(f"{name} must hold integer token ids, got dtype {tensor.dtype}; "
                              "convert with .long() only if the values are ids")
    tensor = tensor.long()
    if vocab_size is not None and tensor.numel() and \
            (int(tensor.min()) < 0 or int(tensor.max()) >= vocab_size):
        raise VocabularyMismatchError(
            f"{name} must lie in [0, {vocab_size}); got range [{int(tensor.min())}, "
            f"{int(tensor.max())}]")
    return tensor


def check_float_scores(scores, name: str = "scores") -> None:
    """Logits must be a floating-point tensor (integer "log-probabilities" would be truncated)."""
    if not isinstance(scores, torch.Tensor):
        raise ConstraintError(f"{name} must be a torch.Tensor of logits, got {type(scores).__name__}")
    if not scores.is_floating_point():
        raise ConstraintError(f"{name} must be floating-point logits, got dtype {scores.dtype}; "
                              "pass scores.float()")
