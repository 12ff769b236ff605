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

**Context length.** An LM reads at most ``P`` positions (``config.max_position_embeddings``,
``n_positions``, ...: :func:`lm_max_positions`). A generation needs
``prompt + max_new_tokens (+ suffix, which the LM scores when reranking) ≤ P``; past it the LM
sees positions it was never trained on and returns garbage after a long run, so
:func:`check_context_length` refuses it before any work, naming both numbers.

**Decoding options** (:func:`check_decoding_options`): the ``model.generate`` keywords that
:func:`ctrlg.generate` passes on (temperature, top-k, top-p, ...) are checked before any table is
built, and the ones ctrlg sets itself (the budget, the number of sequences, the processors) are
refused with the ctrlg argument to use instead.
"""

from __future__ import annotations

import math
import operator

import torch

from ctrlg.errors import ConstraintError, ContextLengthError, VocabularyMismatchError
from ctrlg.vocab import lm_vocab_size

__all__ = ["MAX_PADDING", "MAX_SEED", "config_value", "check_count", "check_seed", "check_vocab_width", "as_token_ids", "check_float_scores",
           "lm_max_positions", "check_context_length", "check_decoding_options",
           "check_generation"]

# Largest padding of an LM's output layer past the constraint's vocabulary when no tokenizer says
# where the real vocabulary ends (Qwen2 pads 151,665 tokens to 151,936: 271 columns).
MAX_PADDING = 1024


def config_value(cfg, dotted: str, default=None):
    """``cfg["a"]["b"]…`` for ``dotted = "a.b…"`` in a plain or OmegaConf mapping, or ``default``
    where a part is missing or a node is None (the pipelines' configs)."""
    node = cfg
    for part in dotted.split("."):
        if node is None or part not in node:
            return default
        node = node[part]
    return node


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


#: seeds are 64-bit: torch's generators take [0, 2**64) (a larger int overflowed inside torch)
MAX_SEED = 2**64 - 1


def check_seed(value, name: str = "seed", *, error=ConstraintError) -> int:
    """``value`` as an int in [0, :data:`MAX_SEED`] (what torch's and numpy's generators
    take), or ``error`` naming it: a bool, float or string, a negative seed or one of more
    than 64 bits is refused here, not as torch's ``RuntimeError: Overflow``."""
    seed = check_count(name, value, error=error)
    if seed > MAX_SEED:
        raise error(f"{name} must be an int in [0, 2**64), got {seed} (a {seed.bit_length()}-bit "
                    f"number); reduce it, e.g. {name} % 2**64")
    return seed


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


# config attributes that hold an LM's maximum number of positions, in transformers' spellings
_POSITION_ATTRIBUTES = ("max_position_embeddings", "n_positions", "max_sequence_length",
                        "seq_length", "n_ctx")


def lm_max_positions(model) -> tuple[int, str] | None:
    """``(P, attribute)``: the most positions the LM reads and the config attribute that says so
    (of the text config for multimodal models); None when the config names none."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    for name in _POSITION_ATTRIBUTES:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, name
    return None


def check_context_length(model, prompt_tokens: int, max_new_tokens: int, *,
                         suffix_tokens: int = 0, what: str = "the prompt") -> None:
    """ContextLengthError unless ``prompt_tokens + max_new_tokens + suffix_tokens`` fits the LM's
    maximum positions (module docstring); nothing is checked for an LM whose config names none."""
    found = lm_max_positions(model)
    if found is None:
        return
    limit, attribute = found
    total = int(prompt_tokens) + int(max_new_tokens) + int(suffix_tokens)
    if total <= limit:
        return
    suffix = f" + a {suffix_tokens:,}-token suffix" if suffix_tokens else ""
    room = limit - int(max_new_tokens) - int(suffix_tokens)
    fix = (f"shorten it to at most {room:,} tokens or lower max_new_tokens" if room > 0
           else "lower max_new_tokens")
    raise ContextLengthError(
        f"{what} has {int(prompt_tokens):,} tokens; with max_new_tokens={int(max_new_tokens):,}"
        f"{suffix} the generation needs {total:,} positions, but the LM reads at most {limit:,} "
        f"(config.{attribute}); {fix}")


# model.generate keywords that ctrlg.generate sets from its own arguments
_SET_BY_CTRLG = {"max_new_tokens": "max_new_tokens", "max_length": "max_new_tokens",
                 "min_new_tokens": "min_new_tokens", "min_length": "min_new_tokens",
                 "num_return_sequences": "num_samples", "logits_processor": "constraint",
                 "eos_token_id": "eos_token_id", "input_ids": "prompt",
                 "attention_mask": "prompt"}


def _number(name: str, value, low: float, high: float, *, low_open: bool, integer=False) -> None:
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
    ok = ok and (value > low if low_open else value >= low) and value <= high
    if integer:
        ok = ok and float(value).is_integer()
    if not ok:
        bound = "(" if low_open else "["
        kind = "an int" if integer else "a number"
        raise ConstraintError(f"{name} must be {kind} in {bound}{low:g}, {high:g}], got {value!r}")


def check_decoding_options(options: dict, *, do_sample: bool, num_beams: int,
                           num_samples: int) -> None:
    """ConstraintError for a ``model.generate`` keyword of :func:`ctrlg.generate` that is out of
    range (temperature, top_k, top_p, min_p, typical_p, repetition_penalty, length_penalty,
    no_repeat_ngram_size), one that ctrlg sets from its own arguments, or greedy decoding asked
    for several samples."""
    for key in options:
        if key in _SET_BY_CTRLG:
            raise ConstraintError(f"{key} is set by ctrlg.generate; give its own argument "
                                  f"{_SET_BY_CTRLG[key]}= instead")
    inf = math.inf
    ranges = {"temperature": (0, inf, True, False), "top_p": (0, 1, True, False),
              "min_p": (0, 1, False, False), "typical_p": (0, 1, True, False),
              "top_k": (0, inf, False, True), "repetition_penalty": (0, inf, True, False),
              "length_penalty": (-inf, inf, False, False),
              "no_repeat_ngram_size": (0, inf, False, True)}
    for key, (low, high, low_open, integer) in ranges.items():
        if options.get(key) is not None:
            _number(key, options[key], low, high, low_open=low_open, integer=integer)
    if not do_sample and num_beams == 1 and num_samples > 1:
        raise ConstraintError(f"greedy decoding (do_sample=False, num_beams=1) gives one output, "
                              f"but num_samples={num_samples}; sample (do_sample=True) or use "
                              f"num_beams ≥ num_samples")


def check_generation(model, prompt_ids, suffix_ids, max_new_tokens: int, decoding: dict, *,
                     do_sample: bool, num_beams: int, num_samples: int) -> None:
    """Everything :func:`ctrlg.generate` can check against the model and the budget before any
    table is built: the decoding options, the prompt ids within the LM's logits and the context
    length (prompt + ``max_new_tokens`` + suffix). (The suffix and EOS ids are checked against
    the constraint's vocabulary by the processor, before its tables.)"""
    check_decoding_options(decoding, do_sample=do_sample, num_beams=num_beams,
                           num_samples=num_samples)
    as_token_ids(prompt_ids, "the prompt's token ids", vocab_size=lm_vocab_size(model))
    check_context_length(model, len(prompt_ids), max_new_tokens,
                         suffix_tokens=len(suffix_ids or []))
