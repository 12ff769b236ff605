"""transformers' running beam scores, recorded during a beam search for the logits processors
that run inside it.

transformers hands a logits processor the rows' token ids and next-token scores, but not the
beams' running scores (the sums of the processed scores so far) nor how many continuations the
search keeps per input. A processor that knows both can leave out every token that cannot be
picked (:mod:`ctrlg.guide.beam_candidates`). Within :func:`record_beam_scores`, the model's beam
search publishes, after each step's pick, the running scores of the rows it will score next
(``running_beam_scores`` [inputs, beams], flattened in the order of the next call's rows), those
rows' token ids and the number of continuations it keeps per input (``beams_to_keep``);
:func:`latest_beam_scores` returns the newest record of the innermost active block, and
:meth:`BeamScores.describes` tells a processor whether a record is about the rows it was handed
(the same token ids), so a record left from an earlier ``generate`` call is never read.

It wraps ``_get_running_beams_for_next_iteration`` of transformers' ``GenerationMixin`` (5.x) on
the model instance, for the block only; a transformers version whose method has another
signature is left alone and nothing is recorded (processors then work without beam scores).

The other direction: a processor whose output is −inf outside a known set of entries (the kept
path of :class:`ctrlg.ConstraintLogitsProcessor`) publishes that set for the step
(:func:`publish_support`), and the search's top-k (:func:`ctrlg.lm.beam_search.two_stage_topk`)
takes it (:func:`take_support`) to select among those entries alone instead of reading all
B · V scores of each input.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["BeamScores", "EntrySupport", "record_beam_scores", "latest_beam_scores",
           "publish_support", "take_support"]

_EXPECTED = ["self", "topk_log_probs", "topk_running_sequences", "topk_running_beam_indices",
             "next_token_hits_stopping_criteria", "num_beams"]


@dataclass(frozen=True)
class EntrySupport:
    """The entries outside of which a processor's output at one step is −inf: ``keys`` sorted
    row · ``width`` + column over the step's ``rows`` × ``width`` scores, after ``steps`` tokens."""

    steps: int
    rows: int
    width: int
    keys: np.ndarray


@dataclass
class BeamScores:
    """The search's state after its ``steps``-th pick (steps = tokens generated so far)."""

    running: torch.Tensor | None = None   # float32 [inputs · beams], the next call's row order
    sequences: torch.Tensor | None = None  # int64 [inputs · beams, max length]: those rows' ids
    beams: int = 0                        # rows per input
    keep: int = 0                         # continuations kept per input (2 · beams for one EOS)
    steps: int = 0
    support: EntrySupport | None = None   # published by the last processor of the current step

    def describes(self, input_ids: torch.Tensor) -> bool:
        """Whether this record is about the rows ``input_ids`` [R, T] a processor was handed: the
        same number of rows and the same token ids (the search's next call)."""
        R, T = input_ids.shape
        if self.sequences is None or self.sequences.shape[0] != R or self.sequences.shape[1] < T:
            return False
        return bool(torch.equal(self.sequences[:, :T].to(input_ids.device), input_ids))


_ACTIVE: contextvars.ContextVar[BeamScores | None] = contextvars.ContextVar("beam_scores", default=None)


@contextlib.contextmanager
def record_beam_scores(model):
    """Within the block, ``model``'s beam searches record their running scores (module
    docstring). Records restart at every ``generate`` call's first pick."""
    method = getattr(type(model), "_get_running_beams_for_next_iteration", None)
    if method is None or list(inspect.signature(method).parameters) != _EXPECTED:
        yield None
        return
    record = BeamScores()

    def running_beams(topk_log_probs, topk_running_sequences, topk_running_beam_indices,
                      next_token_hits_stopping_criteria, num_beams):
        out = method(model, topk_log_probs, topk_running_sequences, topk_running_beam_indices,
                     next_token_hits_stopping_criteria, num_beams)
        steps = int((topk_running_beam_indices[0, 0] >= 0).sum())    # tokens picked so far
        record.running = out[1].reshape(-1).detach().float()
        record.sequences = out[0].reshape(-1, out[0].shape[-1])
        record.beams, record.keep, record.steps = int(num_beams), int(topk_log_probs.shape[1]), steps
        return out

    token = _ACTIVE.set(record)
    model._get_running_beams_for_next_iteration = running_beams
    try:
        yield record
    finally:
        del model._get_running_beams_for_next_iteration
        _ACTIVE.reset(token)


def latest_beam_scores() -> BeamScores | None:
    """The record of the innermost :func:`record_beam_scores` block (None outside any, or
    before its first pick)."""
    record = _ACTIVE.get()
    return record if record is not None and record.running is not None else None


def publish_support(support: EntrySupport | None) -> None:
    """Within :func:`record_beam_scores`, tell the search's top-k that this step's scores are
    −inf outside ``support`` (None: no such set; the top-k reads every score). The caller must be
    the last processor: a later one that made an entry outside the set finite would go unseen.
    Outside any block, nothing happens."""
    record = _ACTIVE.get()
    if record is not None:
        record.support = support


def take_support(steps: int, rows: int, width: int) -> np.ndarray | None:
    """The keys of the support published for this very step (``steps`` tokens generated,
    ``rows`` × ``width`` scores), or None; the support is consumed either way, so a stale one is
    never read at a later step."""
    record = _ACTIVE.get()
    if record is None or record.support is None:
        return None
    support, record.support = record.support, None
    if (support.steps, support.rows, support.width) != (steps, rows, width):
        return None
    return support.keys
