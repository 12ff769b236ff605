"""Beam-search pieces for guided decoding with transformers: cheaper equivalents of transformers'
own per-step work, and diverse beams.

* :class:`InPlaceBans` — transformers' ``NoRepeatNGramLogitsProcessor`` and
  ``MinNewTokensLengthLogitsProcessor`` in one pass that writes −inf only at the banned entries
  of ``scores`` (in place) instead of building a [B, V] mask and a new [B, V] tensor per
  processor per step. Same entries banned, same values elsewhere: identical outputs. Pass it in
  ``logits_processor`` *before* the guidance processor, in place of ``no_repeat_ngram_size`` /
  ``min_new_tokens`` (transformers runs its own processors before the user's, so the order of
  operations is unchanged).
* :func:`two_stage_topk` — transformers' beam search picks, per input, the top 2·B of the
  B·V accumulated scores with one ``torch.topk`` over B·V entries (single-threaded, it dominates
  the search's own cost at 128 beams: ~50 ms per step over 6.3 M entries). The same top set is
  the top 2·B of the B per-beam top-(2·B) lists (each beam contributes at most 2·B), which costs
  B small top-k's over V plus one over 2·B². Same values selected; only the order among exactly
  equal scores (ties, e.g. −inf) may differ from one ``torch.topk``. When the last processor
  published the entries outside of which its scores are −inf
  (:func:`ctrlg.lm.beam_scores.publish_support`, the guide's kept path), the top 2·B is taken
  among those entries alone (:func:`sparse_topk_values`: a gather of a few thousand entries
  and one small top-k instead of a pass over B·V), provided every input has at least 2·B finite
  ones; otherwise over all entries as above.
* :class:`SiblingRankPenalty` — diverse beams (Li, Monroe & Jurafsky 2016, "A simple, fast
  diverse decoding algorithm for neural generation"): the k-th best continuation of each beam
  (k = 0, 1, …, by its score after the other processors) loses γ·k, so the search prefers
  continuations of different parents over many siblings of one. transformers' group beam search
  (Vijayakumar et al. 2018) left the library for a Hub repository in 5.x and cannot run offline.
"""

from __future__ import annotations

import contextlib
import inspect
import math
from typing import Sequence

import numpy as np
import torch
from transformers import LogitsProcessor

from ctrlg.errors import ConstraintError
from ctrlg.lm.beam_scores import take_support

__all__ = ["InPlaceBans", "two_stage_topk", "two_stage_topk_values", "sparse_topk_values",
           "SiblingRankPenalty"]


class InPlaceBans(LogitsProcessor):
    """No repeated n-gram and no EOS before ``min_new_tokens``, as −inf written in place.

    Args:
        no_repeat_ngram_size: n (0: off). Like transformers, n-grams are read over the whole
            ``input_ids`` row (prompt included): a token v is banned when the row's last n − 1
            tokens followed by v already occur as an n-gram in the row.
        min_new_tokens: EOS is banned while fewer tokens than this follow the prompt.
        prompt_length: width of the (left-padded) prompt in ``input_ids``.
        eos_token_id: id or ids of EOS.
    """

    def __init__(self, no_repeat_ngram_size: int = 0, min_new_tokens: int = 0,
                 prompt_length: int = 0, eos_token_id: int | Sequence[int] | None = None):
        for name, value in (("no_repeat_ngram_size", no_repeat_ngram_size),
                            ("min_new_tokens", min_new_tokens), ("prompt_length", prompt_length)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConstraintError(f"{name} must be an integer ≥ 0, got {value!r}")
        self.n = no_repeat_ngram_size
        self.min_new_tokens = min_new_tokens
        self.prompt_length = prompt_length
        eos = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) \
            else list(eos_token_id)
        if min_new_tokens and not eos:
            raise ConstraintError("min_new_tokens needs eos_token_id")
        self.eos_ids = [int(e) for e in eos]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        V = scores.shape[-1]
        if self.min_new_tokens and input_ids.shape[-1] - self.prompt_length < self.min_new_tokens:
            eos = [e for e in self.eos_ids if 0 <= e < V]
            scores[:, eos] = -math.inf
        T = input_ids.shape[-1]
        if self.n and T >= self.n:
            prefix = input_ids[:, T + 1 - self.n:]
            windows = input_ids.unfold(1, self.n, 1)                 # [B, T − n + 1, n]
            rows, cols = (windows[..., :-1] == prefix[:, None]).all(-1).nonzero(as_tuple=True)
            tokens = windows[rows, cols, -1]
            inside = tokens < V            # ids past the scores' width cannot be generated
            scores[rows[inside], tokens[inside]] = -math.inf
        return scores


def two_stage_topk_values(scores: torch.Tensor, k: int, groups: int):
    """(values, indices) of the top ``k`` of each row of ``scores`` [N, groups·V], best first, as
    ``torch.topk`` gives them, computed as the top ``k`` among the per-group top-``k`` lists (a
    group's entries outside its own top ``k`` cannot be among the row's top ``k``)."""
    N, width = scores.shape
    V = width // groups
    kk = min(k, V)
    values, index = torch.topk(scores.reshape(N * groups, V), kk)            # [N·G, kk]
    index = index + (torch.arange(groups, device=scores.device) * V).repeat(N)[:, None]
    values, index = values.view(N, groups * kk), index.view(N, groups * kk)
    top, where = torch.topk(values, k)
    return top, index.gather(1, where)


def sparse_topk_values(scores: torch.Tensor, k: int, keys: np.ndarray):
    """(values, indices) of the top ``k`` of each row of ``scores`` [N, W], best first, when
    every entry outside ``keys`` (sorted flat indices row · W + column, each at most once) is
    −inf: the top ``k`` among the ``keys`` entries of each row, the same values ``torch.topk``
    selects (the order among exactly equal scores aside). None when a row has fewer than ``k``
    finite entries among its keys: the row's pick then includes −inf entries, whose columns only
    a pass over the whole row reproduces."""
    N, W = scores.shape
    keys_t = torch.as_tensor(keys, dtype=torch.int64, device=scores.device)
    values = scores.reshape(-1)[keys_t]
    row = keys_t // W
    finite = torch.bincount(row[torch.isfinite(values)], minlength=N)
    if len(keys) == 0 or bool((finite < k).any()):
        return None
    counts = torch.bincount(row, minlength=N)
    start = torch.cumsum(counts, 0) - counts
    slot = torch.arange(len(keys), device=scores.device) - start[row]
    padded = torch.full((N, int(counts.max())), -math.inf, dtype=scores.dtype, device=scores.device)
    padded[row, slot] = values
    columns = torch.zeros(padded.shape, dtype=torch.int64, device=scores.device)
    columns[row, slot] = keys_t - row * W
    top, where = torch.topk(padded, k)
    return top, columns.gather(1, where)


@contextlib.contextmanager
def two_stage_topk(model):
    """Within the block, ``model``'s beam search (``do_sample=False``) selects its top-2B
    continuations with :func:`two_stage_topk_values` (module docstring). Everything else of
    transformers' ``_get_top_k_continuations`` is unchanged. A transformers version whose
    method has another signature is left alone."""
    original = type(model)._get_top_k_continuations
    expected = ["self", "accumulated_log_probs", "running_sequences", "running_beam_indices",
                "cur_len", "decoder_prompt_len", "do_sample", "beams_to_keep", "num_beams",
                "batch_size", "kwargs"]
    if list(inspect.signature(original).parameters) != expected:
        yield
        return

    def continuations(accumulated_log_probs, running_sequences, running_beam_indices, cur_len,
                      decoder_prompt_len, do_sample, beams_to_keep, num_beams, batch_size, **kwargs):
        if do_sample or num_beams == 1:
            return original(model, accumulated_log_probs, running_sequences, running_beam_indices,
                            cur_len, decoder_prompt_len, do_sample, beams_to_keep, num_beams,
                            batch_size, **kwargs)
        # transformers' own body, with the top-k replaced
        vocab_size = accumulated_log_probs.shape[-1] // num_beams
        keys = take_support(cur_len - decoder_prompt_len, batch_size * num_beams, vocab_size)
        picked = None if keys is None else sparse_topk_values(accumulated_log_probs, beams_to_keep, keys)
        topk_log_probs, topk_indices = picked if picked is not None else \
            two_stage_topk_values(accumulated_log_probs, beams_to_keep, num_beams)
        topk_current_beam_indices = topk_indices // vocab_size
        topk_running_beam_indices = model._gather_beams(running_beam_indices, topk_current_beam_indices)
        topk_running_sequences = model._gather_beams(running_sequences, topk_current_beam_indices)
        topk_ids = topk_indices % vocab_size
        topk_running_sequences[:, :, cur_len] = topk_ids
        batch_offset = torch.arange(batch_size, device=topk_ids.device).view(-1, 1) * num_beams
        topk_running_beam_indices[:, :, cur_len - decoder_prompt_len] = topk_current_beam_indices + batch_offset
        return topk_log_probs, topk_running_sequences, topk_running_beam_indices

    model._get_top_k_continuations = continuations
    try:
        yield
    finally:
        del model._get_top_k_continuations


class SiblingRankPenalty(LogitsProcessor):
    """Diverse beams by intra-sibling rank (Li et al. 2016): each row's scores minus γ·k for its
    k-th best token (k = 0 for the best; ties ranked by ``torch.topk``).

    Only a row's top ``top`` tokens can be chosen by a beam search keeping ``top`` continuations
    per input (transformers keeps 2·B: pass ``top=2 * num_beams``); the rest get γ·top, which
    keeps every row's order and so changes no selection against the full ranking. Place it last
    (after the guidance), so the ranks are those of the guided scores. Cost: one top-``top``
    per row and a [B, V] subtraction.

    Args:
        penalty: γ ≥ 0 (0: plain beam search).
        top: how many ranks get their own penalty (≥ 1).
    """

    def __init__(self, penalty: float, top: int):
        if not (isinstance(penalty, (int, float)) and math.isfinite(penalty) and penalty >= 0):
            raise ConstraintError(f"the sibling rank penalty must be a finite number ≥ 0, got {penalty!r}")
        if not isinstance(top, int) or top < 1:
            raise ConstraintError(f"top must be a positive integer, got {top!r}")
        self.penalty, self.top = float(penalty), top

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.penalty == 0:
            return scores
        top = min(self.top, scores.shape[-1])
        _, index = torch.topk(scores, top, dim=-1)
        ranks = torch.full_like(scores, float(top))
        ranks.scatter_(1, index, torch.arange(top, dtype=scores.dtype, device=scores.device)
                       .expand(scores.shape[0], -1).contiguous())
        return scores - self.penalty * ranks
