"""Each beam's LM log-likelihood recorded while beam search runs, so that reranking every beam by
the LM (GeLaTo / Ctrl-G: keep argmax over beams of Σ_t log p_lm(x_t | x<t)) needs no second pass.

transformers' beam search hands its logits processors ``log_softmax(logits)`` of the LM for every
running row, before any guidance. :class:`BeamLogLikelihoods` is a pass-through processor placed
*before* the guidance processor. At step t it finds each row's parent among the previous call's
rows (by its generated prefix) and keeps

    L(x≤t) = L(x<t) + log p_lm(x_t | x<t),   L(∅) = 0,

reading log p_lm(x_t | x<t) from the parent's scores of the previous call. A hypothesis that ended
with EOS at step t is scored L(x<t) + log p_lm(EOS | x<t) (recorded at that call for every row); one
that ran to the token budget is scored from the last call's scores. Cost per step: one copy of the
[B, V] scores (into the same buffer while B stays) and O(B·T) to key the rows — against a full
second forward pass over every beam.

The recorded values equal the LM's own log-probabilities only when nothing rescaled the scores
before this processor: transformers' built-in processors that merely set entries to −inf
(``no_repeat_ngram_size``, ``min_new_tokens``, bad words) are fine, since a chosen token is never
−inf; rescaling ones (``repetition_penalty``, ``sequence_bias``, ...) are not —
:func:`records_lm_log_probs` says which decoding options allow it. A hypothesis the recorder cannot
score (a −inf step, an unknown prefix) gets ``None``; callers fall back to
:func:`ctrlg.sampler.lm_log_likelihood` for it.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from transformers import LogitsProcessor

__all__ = ["BeamLogLikelihoods", "records_lm_log_probs", "RESCALING_OPTIONS"]

# generate() options (and their neutral values) under which beam-search scores are no longer the
# LM's log-probabilities when a user logits processor sees them
RESCALING_OPTIONS = {"repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0,
                     "sequence_bias": None, "exponential_decay_length_penalty": None,
                     "renormalize_logits": False, "do_sample": False}


def records_lm_log_probs(generation_config, options: dict) -> bool:
    """True when beam search with ``options`` (``generate`` keywords; unset ones from
    ``generation_config``) hands processors the LM's log-probabilities unchanged."""
    for name, neutral in RESCALING_OPTIONS.items():
        value = options.get(name, getattr(generation_config, name, neutral))
        if value is not None and value != neutral:
            return False
    return int(options.get("num_beams", getattr(generation_config, "num_beams", 1)) or 1) > 1


class BeamLogLikelihoods(LogitsProcessor):
    """Records log p_lm(generated | prompt) of every beam (module docstring).

    Args:
        prompt_width: columns of ``input_ids`` before the first generated token (left-padded
            prompts included).
        num_items: input rows of the ``generate`` call; transformers expands item j into rows
            ``j·R … (j+1)·R − 1`` with R = rows / num_items.
        eos_token_id: the ids that end a hypothesis.
    """

    def __init__(self, prompt_width: int, num_items: int, eos_token_id: Sequence[int] | int):
        self.prompt_width = int(prompt_width)
        self.num_items = int(num_items)
        eos = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id or [])
        self.eos_ids = [int(e) for e in eos]
        self.reset()

    def reset(self) -> None:
        self._totals: dict[tuple, float] = {}      # (item, prefix) -> L(prefix)
        self._ended: dict[tuple, float] = {}       # (item, prefix + EOS) -> L
        self._rows: dict[tuple, int] = {}          # previous call: (item, prefix) -> row
        self._scores: torch.Tensor | None = None   # previous call's scores [B, V]
        self._width = -1

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[1] <= self._width:
            self.reset()                                 # a new generate call
        self._width = input_ids.shape[1]
        generated = input_ids[:, self.prompt_width:].tolist()
        per_item = max(1, len(generated) // self.num_items)
        scores_now = scores.detach().float()
        eos_now = scores_now[:, self.eos_ids].tolist() if self.eos_ids else None
        rows: dict[tuple, int] = {}
        for r, prefix in enumerate(generated):
            key = (r // per_item, tuple(prefix))
            total = self._extend(key)
            self._totals[key] = total
            rows.setdefault(key, r)
            if eos_now is not None:
                for e, logp in zip(self.eos_ids, eos_now[r]):
                    self._ended[(key[0], key[1] + (e,))] = total + logp
        self._rows = rows
        if self._scores is not None and self._scores.shape == scores_now.shape:
            self._scores.copy_(scores_now)    # the previous ones were read above: reuse the memory
        else:
            self._scores = scores_now.clone()
        return scores

    def _extend(self, key: tuple) -> float:
        """L(prefix) from the parent's total and the previous call's scores."""
        item, prefix = key
        if not prefix:
            return 0.0
        if key in self._totals:
            return self._totals[key]
        parent = (item, prefix[:-1])
        row = self._rows.get(parent)
        if row is None or parent not in self._totals:
            return -math.inf
        return self._totals[parent] + float(self._scores[row, prefix[-1]])

    def ended_hypotheses(self, item: int) -> list[tuple[list[int], float]]:
        """Every hypothesis of input row ``item`` that the search scored ending with EOS — each
        running beam's prefix at each step followed by an EOS token — with its finite
        log p_lm(hypothesis | prompt), in the order met. The search keeps only the best of them
        (transformers: ``num_beams`` finished hypotheses); a reranker may choose among all."""
        return [(list(key[1]), value) for key, value in self._ended.items()
                if key[0] == int(item) and math.isfinite(value)]

    def log_likelihood(self, item: int, token_ids: Sequence[int]) -> float | None:
        """log p_lm(token_ids | prompt of ``item``) for a finished hypothesis (EOS included when
        it ended it), or ``None`` when it cannot be read from the recorded scores."""
        key = (int(item), tuple(int(t) for t in token_ids))
        value = self._ended.get(key)
        if value is None:
            value = self._totals.get(key)
        if value is None and key[1] and self._scores is not None:
            value = self._extend(key)                     # its last token chosen at the last call
        return value if value is not None and math.isfinite(value) else None
